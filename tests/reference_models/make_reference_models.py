"""Build the reference-model fixtures: the real Hugging Face architectures (GPT-2, RoBERTa, BERT,
DistilBERT, T5 as HHEM-2.1 wraps it), tiny and with random weights, exported to ONNX the way
pipelines/tasks/text.md tells users to export the real models (`optimum-cli export onnx`, or
torch.onnx.export for HHEM), with the values the reference implementations compute on them:
transformers' own loss and lmppl (H2O Sonar's package) for Perplexity, the bert-score package
for BERTScore, the models' own sigmoid / softmax for the classifiers, HHEM's first-token softmax.

tests/judge/test_reference_models.py runs evalbeam on these folders and checks its scores against
expected.json. That test needs only evalbeam's test extras; this script needs torch,
transformers, optimum-onnx, bert-score and lmppl, which the tests do not install (several GB):

    python -m venv /tmp/refenv && /tmp/refenv/bin/pip install torch transformers optimum-onnx \
        bert-score lmppl onnxruntime && /tmp/refenv/bin/pip install "protobuf>=6.31"
        # (lmppl pins an old protobuf that onnx cannot use; it runs with the new one)
    /tmp/refenv/bin/python tests/reference_models/make_reference_models.py

The weights are seeded, but the exporters' output bytes are not promised stable across
versions; expected.json records the versions used.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = ("the a cat dog sat ran on under mat rug red blue quick slow fox jumps over lazy river "
         "bank money paid loan city rain falls every day night sun shines bright cold warm people "
         "said that this is not true was were it they we you he she and or but if then when "
         "paris france capital berlin germany london england tower bridge old new").split()


def sentences(seed: int, n: int, low: int = 3, high: int = 12) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
        out.append(" ".join(words).capitalize() + ".")
    return out


def corpus() -> list[str]:
    return sentences(0, 400, 2, 16) + [" ".join(WORDS), " ".join(w.capitalize() for w in WORDS)]


# ---------------------------------------------------------------- tokenizers
def byte_level_bpe(specials: list[str], vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return tok


def wordpiece(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok


def unigram(vocab_size: int = 300):
    """A SentencePiece-like Unigram tokenizer with T5's special tokens (pad 0, </s> 1, unk 2)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>")
    tok.train_from_iterator(corpus() + ["Determine if the hypothesis is true given the premise? Premise: "
                                        "Hypothesis:"] * 20, trainer)
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    return tok


# ---------------------------------------------------------------- exports
def optimum_export(model_dir: Path, task: str, out: Path) -> None:
    cli = Path(sys.executable).with_name("optimum-cli")
    subprocess.run([str(cli), "export", "onnx", "--model", str(model_dir), "--task", task, str(out)],
                   check=True, stdout=subprocess.DEVNULL)


def export(model, tokenizer, work: Path, name: str, task: str) -> None:
    """Save the Hugging Face model and tokenizer, export them with optimum-cli for `task`, and
    keep what evalbeam reads as the fixture folder `name`."""
    src = work / name
    model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    optimum_export(src, task, work / f"{name}-onnx")
    keep(work / f"{name}-onnx", HERE / name)


def keep(src: Path, dst: Path, names=("model.onnx", "tokenizer.json", "config.json")) -> None:
    """Copy what evalbeam reads of an export folder into the fixture folder."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name in names:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


# ---------------------------------------------------------------- models
def gpt2(work: Path, texts: list[str]) -> dict:
    """Perplexity: exp of transformers' mean token loss of each text (labels = input ids)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    torch.manual_seed(1)
    tokenizer = GPT2TokenizerFast(tokenizer_object=byte_level_bpe(["<|endoftext|>"]),
                                  bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  unk_token="<|endoftext|>")
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                        initializer_range=0.2,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config).eval()
    export(model, tokenizer, work, "gpt2", "text-generation")
    values = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            values.append(float(torch.exp(model(ids, labels=ids).loss)) if ids.shape[1] > 1 else None)
    # lmppl, the package H2O Sonar's Perplexity runs distilgpt2 with (padded batches, its own pad
    # token): the same definition, checked here rather than assumed
    import lmppl

    by_lmppl = lmppl.LM(str(work / "gpt2")).get_perplexity(texts, batch_size=4)
    assert all(abs(a - b) <= 1e-4 * b for a, b in zip(by_lmppl, values)), (by_lmppl, values)
    return {"Perplexity": values, "Perplexity_lmppl": by_lmppl}


def roberta(work: Path, pairs: list[tuple[str, list[str]]]) -> dict:
    """BERTScore: the bert-score package on a 3-layer RoBERTa at its layer 2 (the model cut to
    two layers before the export, as the package cuts it), with and without idf."""
    import bert_score
    import torch
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    torch.manual_seed(2)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer = RobertaTokenizerFast(tokenizer_object=byte_level_bpe(specials), bos_token="<s>",
                                     eos_token="</s>", sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                     pad_token="<pad>", mask_token="<mask>", model_max_length=126)
    from tokenizers import processors
    tokenizer.backend_tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.eos_token_id), ("<s>", tokenizer.bos_token_id), add_prefix_space=False)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = RobertaModel(config).eval()
    full = work / "roberta-full"
    model.save_pretrained(full)
    tokenizer.save_pretrained(full)
    # the recipe of pipelines/tasks/text.md: keep the layers bert-score reads, then export
    model.encoder.layer = model.encoder.layer[:2]
    model.config.num_hidden_layers = 2
    export(model, tokenizer, work, "roberta", "feature-extraction")
    cands = [c for c, _ in pairs]
    refs = [r for _, r in pairs]
    out = {}
    for idf in (False, True):
        # batch_size 1: bert-score pads a batch's embeddings with zeros, and a padded zero can
        # win a max over cosines that are all negative (random weights); one pair per batch
        # has no padding
        p, r, f = bert_score.score(cands, refs, model_type=str(full), num_layers=2, idf=idf,
                                   batch_size=1, nthreads=0, lang="en")
        suffix = "_idf" if idf else ""
        out[f"BERTScore{suffix}"] = {"precision": p.tolist(), "recall": r.tolist(), "f1": f.tolist()}
    return out


def toxic_bert(work: Path, texts: list[str]) -> dict:
    """ToxicityClassifier: a BERT sequence classifier with detoxify's six labels, multi-label:
    each label's sigmoid (one sentence per text, so the max over sentences is the text's)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(3)
    tokenizer = BertTokenizerFast(tokenizer_object=wordpiece(), unk_token="[UNK]", sep_token="[SEP]",
                                  pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    labels = ["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=6,
                        initializer_range=0.5,      # wide weights: probabilities far from 0.5
                        problem_type="multi_label_classification",
                        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    model = BertForSequenceClassification(config).eval()
    export(model, tokenizer, work, "toxic_bert", "text-classification")
    with torch.no_grad():
        probabilities = torch.sigmoid(model(**tokenizer(texts, return_tensors="pt", padding=True)).logits)
    return {"ToxicityClassifier": {label: probabilities[:, i].tolist() for i, label in enumerate(labels)}}


def bias(work: Path, texts: list[str]) -> dict:
    """FairnessBias: a DistilBERT classifier with labels Non-biased / Biased (as
    d4data/bias-detection-model names them): the softmax's Biased entry."""
    import torch
    from transformers import BertTokenizerFast, DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(4)
    tokenizer = BertTokenizerFast(tokenizer_object=wordpiece(), unk_token="[UNK]", sep_token="[SEP]",
                                  pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    config = DistilBertConfig(vocab_size=len(tokenizer), dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                              max_position_embeddings=128, num_labels=2, initializer_range=0.1,
                              id2label={0: "Non-biased", 1: "Biased"}, label2id={"Non-biased": 0, "Biased": 1})
    model = DistilBertForSequenceClassification(config).eval()
    export(model, tokenizer, work, "bias", "text-classification")
    with torch.no_grad():
        encoded = tokenizer(texts, return_tensors="pt", padding=True)
        encoded.pop("token_type_ids", None)
        probabilities = torch.softmax(model(**encoded).logits, dim=-1)
    return {"FairnessBias": probabilities[:, 1].tolist()}


HHEM_PROMPT = "<pad> Determine if the hypothesis is true given the premise?\n\nPremise: {text1}\n\nHypothesis: {text2}"


def hhem(work: Path, pairs: list[tuple[str, str]]) -> dict:
    """HHEM: HHEM-2.1-Open's computation (a T5 token classifier over its prompt, the softmax of
    the first token's two logits, label 1 "consistent"), exported with the torch.onnx.export
    call of pipelines/tasks/text.md."""
    import torch
    from transformers import T5Config, T5ForTokenClassification, T5TokenizerFast

    torch.manual_seed(5)
    tokenizer = T5TokenizerFast(tokenizer_object=unigram(), eos_token="</s>", unk_token="<unk>",
                                pad_token="<pad>", extra_ids=0)
    config = T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                      num_labels=2, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    t5 = T5ForTokenClassification(config).eval()
    out = HERE / "hhem"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    sample = tokenizer("<pad> a", return_tensors="pt")
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(t5, (sample["input_ids"], sample["attention_mask"]), str(out / "model.onnx"),
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "logits": axes},
                      opset_version=17, dynamo=False)
    tokenizer.save_pretrained(work / "hhem-tokenizer")
    shutil.copy(work / "hhem-tokenizer" / "tokenizer.json", out / "tokenizer.json")
    (out / "config.json").write_text(json.dumps({"id2label": {"0": "hallucinated", "1": "consistent"},
                                                 "prompt": HHEM_PROMPT}))
    prompts = [HHEM_PROMPT.format(text1=premise, text2=hypothesis) for premise, hypothesis in pairs]
    with torch.no_grad():
        logits = t5(**tokenizer(prompts, return_tensors="pt", padding=True)).logits[:, 0, :]
    return {"HHEM": torch.softmax(logits, dim=-1)[:, 1].tolist()}


def main() -> int:
    from importlib import metadata

    import torch
    import transformers

    responses = sentences(10, 12)
    references = [sentences(20 + i, 1 + i % 3) for i in range(12)]
    contexts = sentences(40, 12, 6, 20)
    responses[3] = responses[5]             # a repeated response
    references[7] = [responses[7]]          # a response equal to its reference
    responses[9] = "Paris."                 # a short one
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        expected = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                 "optimum": metadata.version("optimum"),
                                 "bert_score": metadata.version("bert-score"),
                                 "lmppl": metadata.version("lmppl")},
                    "responses": responses, "references": references, "contexts": contexts}
        expected.update(gpt2(work, responses))
        expected.update(roberta(work, list(zip(responses, references))))
        expected.update(toxic_bert(work, responses))
        expected.update(bias(work, responses))
        expected.update(hhem(work, list(zip(contexts, responses))))
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    for name in sorted(os.listdir(HERE)):
        if (HERE / name).is_dir():
            size = sum(f.stat().st_size for f in (HERE / name).iterdir())
            print(f"{name}: {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
