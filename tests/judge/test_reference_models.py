"""The models on the workers against the reference implementations, on the real architectures:
tests/reference_models/ holds a GPT-2, a RoBERTa, a BERT with detoxify's six labels, a
DistilBERT bias classifier and HHEM-2.1's T5 token classifier, tiny and with random weights,
exported to ONNX as pipelines/tasks/text.md tells users to export the real models (optimum-cli, or
torch.onnx.export for HHEM), and expected.json with what transformers, the bert-score package and
HHEM's own computation give on them, and lmppl (H2O Sonar's Perplexity package)
(make_reference_models.py, which needs torch; these tests do
not). evalbeam's per-datum scores must agree: Perplexity to 1e-5 relative (ONNX Runtime's float32
log-softmax against torch's loss), the rest to 5e-6."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from helpers import MULTIPROCESS, write_jsonl

MODELS = Path(__file__).resolve().parents[1] / "reference_models"
pytestmark = pytest.mark.skipif(not (MODELS / "expected.json").exists(),
                                reason="tests/reference_models/expected.json is missing")


@pytest.fixture(scope="module")
def expected():
    return json.loads((MODELS / "expected.json").read_text(encoding="utf-8"))


def inputs(folder: Path, expected: dict) -> tuple[Path, Path]:
    n = len(expected["responses"])
    gt = write_jsonl(folder / "gt.jsonl", [{"datum_uid": f"d{i:02d}", "query": "q",
                                             "references": expected["references"][i]} for i in range(n)])
    pred = write_jsonl(folder / "pred.jsonl", [{"datum_uid": f"d{i:02d}", "response": expected["responses"][i],
                                                "contexts": [expected["contexts"][i]]} for i in range(n)])
    return gt, pred


def scores(out: Path, metric: str, parameter: str | None = None, value: str | None = None) -> list:
    """The per-datum values of one metric (and parameter value) in datum order."""
    rows = [json.loads(line) for line in open(out / "scores.jsonl", encoding="utf-8")]
    chosen = {r["datum_uid"]: r for r in rows
              if r["metric"] == metric and (parameter is None or r["parameters"].get(parameter) == value)}
    assert all(r["status"] == "ok" for r in chosen.values()), chosen
    return [chosen[uid]["value"] for uid in sorted(chosen)]


def close(got: list, want: list, rel: float = 0.0, abs_: float = 5e-6) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert math.isclose(g, w, rel_tol=rel, abs_tol=abs_), (got, want)


def test_every_model_agrees_with_its_reference(tmp_path, expected):
    """Perplexity (GPT-2 through optimum's text-generation export; transformers' loss and
    lmppl's value), BERTScore (RoBERTa cut to the layer bert-score reads, feature-extraction
    export; the package's P, R, F1 of the pair), ToxicityClassifier (multi-label BERT: each
    label's sigmoid), FairnessBias (DistilBERT: the softmax's "Biased"), HHEM (T5 over HHEM's
    prompt: the first token's softmax). Then each text alone (--lm_batch_size 1) on two worker
    processes with --bertscore_idf: bert-score's idf=True values, and every other score the same
    bytes as batched in one process (these exports give a text the same output in any batch)."""
    pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")
    gt, pred = inputs(tmp_path, expected)
    out, alone = tmp_path / "out", tmp_path / "alone"
    command = ["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}", "--quiet",
               "--metrics", "Perplexity,BERTScore,ToxicityClassifier,FairnessBias,HHEM",
               "--lm_uri", MODELS / "gpt2", "--model_uri", f"BERTScore={MODELS / 'roberta'}",
               "--model_uri", f"ToxicityClassifier={MODELS / 'toxic_bert'}",
               "--model_uri", f"FairnessBias={MODELS / 'bias'}", "--model_uri", f"HHEM={MODELS / 'hhem'}"]
    done = subprocess.run(command + ["--output", out], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    close(scores(out, "Perplexity"), expected["Perplexity"], rel=1e-5, abs_=0.0)
    close(scores(out, "Perplexity"), expected["Perplexity_lmppl"], rel=1e-5, abs_=0.0)   # H2O's package
    for component, values in expected["BERTScore"].items():
        close(scores(out, "BERTScore", "component", component), values)
    for label, values in expected["ToxicityClassifier"].items():
        close(scores(out, "ToxicityClassifier", "label", label), values)
    close(scores(out, "FairnessBias", "label", "Biased"), expected["FairnessBias"])
    close(scores(out, "HHEM"), expected["HHEM"])

    done = subprocess.run(command + ["--output", alone, "--lm_batch_size", "1", "--bertscore_idf", *MULTIPROCESS],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for component, values in expected["BERTScore_idf"].items():
        close(scores(alone, "BERTScore", "component", component), values)
    # the weights matter here: the plain means are not the idf ones
    assert max(abs(a - b) for a, b in zip(expected["BERTScore_idf"]["f1"], expected["BERTScore"]["f1"])) > 1e-3

    def others(folder):
        return [line for line in open(folder / "scores.jsonl", encoding="utf-8") if '"BERTScore"' not in line]

    assert others(alone) == others(out) and len(others(out)) == 12 * (1 + 6 + 1 + 1)
