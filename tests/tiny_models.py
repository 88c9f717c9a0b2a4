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
    from onnx import helper, numpy_helper
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
    return save_causal_lm(nodes, weights, "tiny_causal_lm", size, folder)


def write_transformer_lm(folder, dim: int = 64, layers: int = 2, heads: int = 4, positions: int = 256,
                         seed: int = 0, words=WORDS) -> Path:
    """A causal transformer LM of GPT-2's shape with random weights: token plus learned position
    embeddings, `layers` pre-LayerNorm blocks (multi-head self-attention under a causal mask,
    then a GELU MLP of width 4 x dim, each added back to the residual), a final LayerNorm and
    the token embedding as output projection; the word-level tokenizer of write_tiny_causal_lm
    ([BOS] first). Right padding changes no real token's logits (the causal mask keeps padding
    out of their attention), so the attention_mask input is declared and unused, as a
    causal LM's can be. Texts are at most `positions` tokens. Returns the folder."""
    from onnx import helper, numpy_helper

    folder = write_tiny_causal_lm(folder, dim=dim, seed=seed, words=words)
    size = len(vocabulary(folder))
    rng = np.random.default_rng(seed)
    head = dim // heads

    def weight(name, shape, scale):
        weights.append(numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name))
        return name

    def const(name, value, dtype=np.int64):
        weights.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    weights: list = []
    nodes: list = []

    def node(op, inputs, output, **attributes):
        nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    def norm(x, name):
        return node("LayerNormalization", [x, const(f"{name}_g", np.ones(dim), np.float32),
                                           const(f"{name}_b", np.zeros(dim), np.float32)],
                    f"{name}_out", axis=-1, epsilon=1e-5)

    def dense(x, name, width_in, width_out):
        product = node("MatMul", [x, weight(f"{name}_w", (width_in, width_out), width_in ** -0.5)],
                       f"{name}_mm")
        return node("Add", [product, weight(f"{name}_bias", width_out, 0.02)], f"{name}_out")

    embedding = weight("wte", (size, dim), 0.2)
    # positions 0..T-1 of the batch's width, and the causal mask's additive bias [T, T]
    shape = node("Shape", ["input_ids"], "ids_shape")
    width = node("Gather", [shape, const("one", 1)], "width")
    steps = node("Range", [const("zero", 0), width, const("step", 1)], "steps")
    hidden = node("Add", [node("Gather", [embedding, "input_ids"], "tokens"),
                          node("Gather", [weight("wpe", (positions, dim), 0.1), steps], "places")], "h0")
    square = node("Concat", [node("Unsqueeze", [width, const("axis0", [0])], "width1"),
                             "width1"], "square", axis=0)
    ones = node("ConstantOfShape", [square], "ones",
                value=numpy_helper.from_array(np.array([1.0], np.float32)))
    future = node("Sub", [ones, node("Trilu", [ones], "lower", upper=0)], "future")
    bias = node("Mul", [future, const("minus", -1e9, np.float32)], "causal")
    for layer in range(layers):
        name = f"l{layer}"
        x = norm(hidden, f"{name}_ln1")
        qkv = dense(x, f"{name}_qkv", dim, 3 * dim)
        parts = []
        for index, part in enumerate(("q", "k", "v")):
            sliced = node("Slice", [qkv, const(f"{name}_{part}_start", [index * dim]),
                                    const(f"{name}_{part}_end", [(index + 1) * dim]),
                                    const(f"{name}_{part}_axis", [2])], f"{name}_{part}")
            split = node("Reshape", [sliced, const(f"{name}_{part}_shape", [0, 0, heads, head])],
                         f"{name}_{part}_heads")
            parts.append(node("Transpose", [split], f"{name}_{part}_t", perm=[0, 2, 1, 3]))
        q, k, v = parts
        scores = node("MatMul", [q, node("Transpose", [k], f"{name}_kt", perm=[0, 1, 3, 2])],
                      f"{name}_scores")
        scaled = node("Mul", [scores, const(f"{name}_scale", head ** -0.5, np.float32)], f"{name}_scaled")
        attention = node("Softmax", [node("Add", [scaled, bias], f"{name}_masked")], f"{name}_att",
                         axis=-1)
        mixed = node("Transpose", [node("MatMul", [attention, v], f"{name}_mixed")],
                     f"{name}_mixed_t", perm=[0, 2, 1, 3])
        joined = node("Reshape", [mixed, const(f"{name}_join", [0, 0, dim])], f"{name}_joined")
        hidden = node("Add", [hidden, dense(joined, f"{name}_proj", dim, dim)], f"{name}_h1")
        x = norm(hidden, f"{name}_ln2")
        up = dense(x, f"{name}_fc", dim, 4 * dim)
        # GELU, tanh form (GPT-2's gelu_new): 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))
        cubed = node("Mul", [node("Mul", [up, up], f"{name}_u2"), up], f"{name}_u3")
        inner = node("Add", [up, node("Mul", [cubed, const(f"{name}_gelu_c", 0.044715, np.float32)],
                                      f"{name}_cu3")], f"{name}_inner")
        gate = node("Tanh", [node("Mul", [inner, const(f"{name}_gelu_k", math.sqrt(2 / math.pi), np.float32)],
                                  f"{name}_scaled_inner")], f"{name}_tanh")
        gelu = node("Mul", [node("Mul", [up, const(f"{name}_half", 0.5, np.float32)], f"{name}_half_u"),
                            node("Add", [gate, const(f"{name}_one", 1.0, np.float32)], f"{name}_gate1")],
                    f"{name}_gelu")
        hidden = node("Add", [hidden, dense(gelu, f"{name}_out", 4 * dim, dim)], f"h{layer + 1}")
    final = norm(hidden, "ln_f")
    node("MatMul", [final, node("Transpose", [embedding], "wte_t", perm=[1, 0])], "logits")
    return save_causal_lm(nodes, weights, "transformer_lm", size, folder)


def save_causal_lm(nodes: list, weights: list, name: str, vocabulary_size: int, folder: Path) -> Path:
    """A causal LM's graph (inputs input_ids and attention_mask, output logits [batch,
    sequence, vocabulary_size]) saved as folder/model.onnx."""
    from onnx import TensorProto, helper

    tokens = ["batch", "sequence"]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, tokens),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, tokens)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, tokens + [vocabulary_size])],
        initializer=weights)
    return save(graph, folder)


def save(graph, folder: Path) -> Path:
    """The graph as folder/model.onnx (opset 17, an IR version every ONNX Runtime reads)."""
    import onnx
    from onnx import helper

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


def write_tiny_classifier(folder, labels, multi_label: bool = False, dim: int = 8, seed: int = 1,
                          words=WORDS, token_logits: bool = False, prompt: str | None = None) -> Path:
    """A sequence classifier (masked mean of word + segment embeddings, then a dense layer to
    len(labels) logits) with a BERT-style tokenizer ([CLS] text, or [CLS] text [SEP] pair with
    segment ids 0 / 1) and config.json (id2label; problem_type multi_label_classification when
    multi_label; prompt when given). token_logits: logits [batch, tokens, labels] of each
    token's embedding plus the masked mean, as HHEM-2.1-Open's token-classification head gives
    them. Returns the folder."""
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.normalizers import Lowercase
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = Lowercase()
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(single="[CLS] $A", pair="[CLS] $A [SEP] $B:1",
                                                  special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"id2label": {str(i): name for i, name in enumerate(labels)}}
    if multi_label:
        config["problem_type"] = "multi_label_classification"
    if prompt is not None:
        config["prompt"] = prompt
    (folder / "config.json").write_text(json.dumps(config))

    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(rng.normal(0, 1, (len(vocab), dim)).astype(np.float32), "embedding"),
               numpy_helper.from_array(rng.normal(0, 1, (2, dim)).astype(np.float32), "segments"),
               numpy_helper.from_array(rng.normal(0, 1, (dim, len(labels))).astype(np.float32), "dense"),
               numpy_helper.from_array(rng.normal(0, 0.5, len(labels)).astype(np.float32), "bias"),
               numpy_helper.from_array(np.array([1], np.int64), "axis1"),
               numpy_helper.from_array(np.array([2], np.int64), "axis2")]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["words"]),
             helper.make_node("Gather", ["segments", "token_type_ids"], ["segment"]),
             helper.make_node("Add", ["words", "segment"], ["hidden"]),
             helper.make_node("Unsqueeze", ["attention_mask", "axis2"], ["mask3"]),
             helper.make_node("Cast", ["mask3"], ["maskf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["hidden", "maskf"], ["masked"]),
             helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
             helper.make_node("ReduceSum", ["maskf", "axis1"], ["count"], keepdims=0),
             helper.make_node("Div", ["summed", "count"], ["pooled"])]
    shape = ["batch", len(labels)]
    if token_logits:
        nodes += [helper.make_node("Unsqueeze", ["pooled", "axis1"], ["context"]),
                  helper.make_node("Add", ["hidden", "context"], ["tokens"]),
                  helper.make_node("MatMul", ["tokens", "dense"], ["scores"])]
        shape = ["batch", "sequence", len(labels)]
    else:
        nodes.append(helper.make_node("MatMul", ["pooled", "dense"], ["scores"]))
    nodes.append(helper.make_node("Add", ["scores", "bias"], ["logits"]))
    ints = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
            for name in ("input_ids", "attention_mask", "token_type_ids")]
    graph = helper.make_graph(nodes, "tiny_classifier", ints,
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, shape)],
                              initializer=weights)
    return save(graph, folder)


def direct_probabilities(folder, text: str, pair: str | None = None) -> dict:
    """{label: probability} of one text (or pair) with ONNX Runtime alone, as config.json says:
    sigmoid per label for multi-label models, else softmax; first 512 tokens; a pair through
    the config's prompt when it has one; a token head's first token."""
    import onnxruntime
    from tokenizers import Tokenizer

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(512)
    if pair is not None and "prompt" in config:
        text, pair = config["prompt"].replace("{text1}", text).replace("{text2}", pair), None
    encoding = tokenizer.encode(text, pair) if pair is not None else tokenizer.encode(text)
    ids = np.array([encoding.ids], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "token_type_ids": np.array([encoding.type_ids], np.int64)}
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], feeds)[0][0].astype(np.float64)
    if logits.ndim == 2:
        logits = logits[0]
    if config.get("problem_type") == "multi_label_classification" or logits.size == 1:
        values = 1 / (1 + np.exp(-logits))
    else:
        values = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    return {config["id2label"][str(i)]: float(v) for i, v in enumerate(values)}


def write_tiny_encoder(folder, dim: int = 8, seed: int = 4, words=WORDS) -> Path:
    """A contextual encoder for BERTScore: each token's word + segment embedding plus the
    masked mean of the whole text's (so a token's vector depends on its context, and padding
    changes nothing); output last_hidden_state [batch, tokens, dim]; the BERT-style tokenizer of
    write_tiny_classifier. Returns the folder."""
    import onnx
    from onnx import TensorProto, helper

    folder = write_tiny_classifier(folder, ["unused"], dim=dim, seed=seed, words=words)
    model = onnx.load(str(folder / "model.onnx"))
    graph = model.graph
    keep = [n for n in graph.node if n.output[0] not in ("scores", "logits")]
    del graph.node[:]
    graph.node.extend(keep + [
        helper.make_node("Unsqueeze", ["pooled", "axis1"], ["context"]),
        helper.make_node("Add", ["hidden", "context"], ["last_hidden_state"])])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                                      ["batch", "sequence", dim]))
    for name in ("dense", "bias"):
        graph.initializer.remove(next(i for i in graph.initializer if i.name == name))
    onnx.checker.check_model(model)
    onnx.save(model, str(folder / "model.onnx"))
    (folder / "config.json").unlink()
    return folder


def direct_token_vectors(folder, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(float64[n, dim] hidden states of one text's tokens, bool[n] which are special), ONNX
    Runtime alone."""
    import onnxruntime
    from tokenizers import Tokenizer

    folder = Path(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(512)
    encoding = tokenizer.encode(text)
    ids = np.array([encoding.ids], np.int64)
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    hidden = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                 "token_type_ids": np.zeros_like(ids)})[0][0]
    return hidden.astype(np.float64), np.array(encoding.special_tokens_mask, bool)
