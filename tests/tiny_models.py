"""Tiny models built at test time, saved in the formats users bring (tests cannot download
weights): a causal LM as an ONNX graph (model.onnx: input_ids, attention_mask -> logits, the
names an optimum export uses) with a Hugging Face `tokenizers` tokenizer (tokenizer.json), and
the direct computation the tests compare evalbeam with (ONNX Runtime on one text at a time)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

WORDS = ("the a tower bridge river city is in on stands was built by old stone paris france "
         "red blue colour name where how many people live known for of and it . , ? !").split()


def write_tiny_causal_lm(folder, dim: int = 8, seed: int = 0, words=WORDS, layers: int = 0) -> Path:
    """A bigram LM (logits of token t from token t alone: embedding, `layers` residual blocks
    h + tanh(h W + b) of width dim, then a dense layer) over [UNK], [BOS] and `words`; the
    tokenizer lower-cases, splits on words and punctuation and starts every text with [BOS].
    Returns the folder."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.normalizers import Lowercase
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0, "[BOS]": 1}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = Lowercase()
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    tokenizer.save(str(folder / "tokenizer.json"))

    rng = np.random.default_rng(seed)
    size = len(vocab)
    weights = [numpy_helper.from_array(rng.normal(0, 1, (size, dim)).astype(np.float32), "embedding"),
               numpy_helper.from_array(rng.normal(0, 1, (dim, size)).astype(np.float32), "dense"),
               numpy_helper.from_array(rng.normal(0, 0.5, size).astype(np.float32), "bias")]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["hidden0"])]
    for layer in range(layers):
        weights += [numpy_helper.from_array(rng.normal(0, dim ** -0.5, (dim, dim)).astype(np.float32), f"w{layer}"),
                    numpy_helper.from_array(rng.normal(0, 0.1, dim).astype(np.float32), f"b{layer}")]
        nodes += [helper.make_node("MatMul", [f"hidden{layer}", f"w{layer}"], [f"m{layer}"]),
                  helper.make_node("Add", [f"m{layer}", f"b{layer}"], [f"a{layer}"]),
                  helper.make_node("Tanh", [f"a{layer}"], [f"t{layer}"]),
                  helper.make_node("Add", [f"hidden{layer}", f"t{layer}"], [f"hidden{layer + 1}"])]
    nodes += [helper.make_node("MatMul", [f"hidden{layers}", "dense"], ["scores"]),
              helper.make_node("Add", ["scores", "bias"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tiny_causal_lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", size])],
        initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(folder / "model.onnx"))
    return folder


def direct_logprobs(folder, text: str) -> tuple[list, list]:
    """(token log-probabilities, token start offsets) of one text with ONNX Runtime alone: the
    logits of the text by itself, log-softmax in float64; None for the first token."""
    import onnxruntime
    from tokenizers import Tokenizer

    folder = Path(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    encoding = tokenizer.encode(text)
    ids = np.array([encoding.ids], np.int64)
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]
    logits = logits.astype(np.float64)
    values = [None]
    for t in range(1, ids.shape[1]):
        row = logits[t - 1]
        values.append(float(row[ids[0, t]] - (row.max() + math.log(np.exp(row - row.max()).sum()))))
    starts, end = [], 0
    for (start, stop), special in zip(encoding.offsets, encoding.special_tokens_mask):
        starts.append(end if special else start)
        if not special:
            end = max(end, stop)
    return values, starts


def vocabulary(folder) -> dict:
    return json.loads((Path(folder) / "tokenizer.json").read_text())["model"]["vocab"]
