"""`evalbeam text` end to end: means of rouge-score / nltk per datum and sacreBLEU's corpus score,
missing predictions and references, bad rows, scores.jsonl, determinism, the PTransform."""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest

from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from evalbeam.pipelines.launch.common import local_pipeline

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "café", "naïve", "東京",
         "revenue", "was", "15,969", "million", "$100", "3.14", "don't"]


def run_text(*args) -> int:
    from evalbeam.pipelines.tasks.text import run

    return run([str(a) for a in args])


def make_rows(seed: int, n: int = 60):
    rng = random.Random(seed)
    gt, good, bad = [], [], []
    for i in range(n):
        refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20)))
                for _ in range(rng.choice([0, 1, 1, 2, 3]))]
        if i % 17 == 3:
            refs[-1:] = [refs[-1] + "\nsecond line of it" if refs else "line one\nline two"]
        gt.append({"datum_uid": f"q{i:03d}", "metadata": {"topic": "xy"[i % 2]}, "references": refs})
        base = (rng.choice(refs) if refs else "nothing to see").split(" ")
        if i % 9 != 4:                                       # some datums lack a prediction
            good.append({"datum_uid": f"q{i:03d}", "response": " ".join(w for w in base if rng.random() < 0.85)})
        bad.append({"datum_uid": f"q{i:03d}", "response": " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12)))})
    return gt, {"good": good, "bad": bad}


def expected_means(gt, predictions, topic=None):
    """Means over datums with references of rouge-score's score_multi F, nltk's BLEU (Valor's way)
    and sacreBLEU's corpus score; a missing prediction is an empty response."""
    import sacrebleu
    from nltk.translate import bleu_score
    from rouge_score.rouge_scorer import RougeScorer

    from evalbeam.transforms.kernels.text_overlap import valor_tokens

    scorer = RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"])
    by_uid = {r["datum_uid"]: r["response"] for r in predictions}
    rouge, bleu, hyps, refs = {t: [] for t in scorer.rouge_types}, [], [], []
    for row in gt:
        if not row["references"] or (topic and row["metadata"]["topic"] != topic):
            continue
        response = by_uid.get(row["datum_uid"], "")
        for t, s in scorer.score_multi(row["references"], response).items():
            rouge[t].append(s.fmeasure)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b = bleu_score.sentence_bleu([valor_tokens(r) for r in row["references"]], valor_tokens(response))
        bleu.append(b if b >= 1e-9 else 0.0)
        hyps.append(response)
        refs.append(row["references"])
    width = max(len(r) for r in refs)
    corpus = sacrebleu.corpus_bleu(hyps, [[r[i] if i < len(r) else None for r in refs] for i in range(width)])
    return {t: np.mean(v) for t, v in rouge.items()}, np.mean(bleu), corpus.score


def test_text_metrics_equal_the_reference_packages(tmp_path):
    gt, predictions = make_rows(1)
    write_jsonl(tmp_path / "gt.jsonl", gt)
    for name, rows in predictions.items():
        write_jsonl(tmp_path / f"{name}.jsonl", rows)
    assert run_text("--groundtruths", tmp_path / "gt.jsonl", "--predictions", f"good={tmp_path / 'good.jsonl'}",
                    "--predictions", f"bad={tmp_path / 'bad.jsonl'}", "--output", tmp_path / "out",
                    "--metrics", "ROUGE,BLEU,CorpusBLEU", "--slice", "topic", "--quiet") == 0
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    for model, rows in predictions.items():
        for topic, slice_value in ((None, {}), ("x", {"topic": "x"}), ("y", {"topic": "y"})):
            rouge, bleu, corpus = expected_means(gt, rows, topic)
            mine = [r for r in records if r["model"] == model and r["slice"] == slice_value]
            for r in mine:
                if r["type"] == "ROUGE":
                    assert r["value"]["fmeasure"] == pytest.approx(rouge[r["parameters"]["rouge_type"]], abs=1e-12)
                elif r["type"] == "BLEU":
                    assert r["value"] == pytest.approx(bleu, abs=1e-12)
                elif r["type"] == "CorpusBLEU":
                    assert r["value"]["score"] == pytest.approx(corpus, abs=1e-9)
            assert len(mine) == 6
    scores = read_jsonl(tmp_path / "out" / "scores.jsonl")
    keys = [(s["datum_uid"], s["model"], s["metric"], json.dumps(s["parameters"], sort_keys=True)) for s in scores]
    assert keys == sorted(keys)
    statuses = {s["status"] for s in scores}
    assert statuses == {"ok", "missing_prediction", "no_references"}
    missing = [s for s in scores if s["status"] == "missing_prediction"]
    assert missing and all(s["value"] == 0.0 and s["model"] == "good" for s in missing)
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["scores_written"] == len(scores)
    assert info["counts"]["good"] == {"rows_read": 53, "rows_evaluated": 53, "rows_rejected": 0}


def test_same_bytes_for_any_shards_order_and_runner(tmp_path):
    gt, predictions = make_rows(2)
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "gt_reversed.jsonl", gt[::-1])
    write_jsonl(tmp_path / "good.jsonl", predictions["good"])
    outputs = []
    for name, gt_file, extra in (("a", "gt.jsonl", ["--num_shards", "1"]),
                                 ("b", "gt_reversed.jsonl", ["--num_shards", "7"]),
                                 ("c", "gt.jsonl", ["--num_shards", "3", *MULTIPROCESS])):
        assert run_text("--groundtruths", tmp_path / gt_file, "--predictions", tmp_path / "good.jsonl",
                        "--output", tmp_path / name, "--metrics", "ROUGE,BLEU,CorpusBLEU", "--quiet",
                        "--slice", "topic", *extra) == 0
        outputs.append(((tmp_path / name / "metrics.jsonl").read_bytes(),
                        (tmp_path / name / "scores.jsonl").read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]


def test_bad_rows_and_usage_errors(tmp_path):
    gt = [{"datum_uid": "a", "references": ["x y"]},
          {"datum_uid": "b", "references": "x y"},
          {"datum_uid": "c", "references": ["x", 3]},
          {"datum_uid": "", "references": ["x"]},
          "{oops",
          {"datum_uid": "d", "references": ["x"]},
          {"datum_uid": "d", "references": ["y"]}]
    preds = [{"datum_uid": "a", "response": "x y"},
             {"datum_uid": "a2", "response": "x"},
             {"datum_uid": "d", "response": "x"},
             {"datum_uid": "a", "response": 5},
             {"datum_uid": "a", "response": "x", "contexts": [1]}]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    assert run_text("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                    "--output", tmp_path / "out", "--metrics", "ROUGE", "--quiet") == 1
    found = {(r["source"], r["line"]): r["reason"] for r in read_jsonl(tmp_path / "out" / "rejected.jsonl")}
    assert found == {
        ("groundtruths", 2): "references must be a list of strings",
        ("groundtruths", 3): "references must be a list of strings",
        ("groundtruths", 4): "missing or empty datum_uid",
        ("groundtruths", 5): found[("groundtruths", 5)],
        ("groundtruths", 6): "datum_uid appears 2 times in groundtruths",
        ("groundtruths", 7): "datum_uid appears 2 times in groundtruths",
        ("m", 2): "no valid ground truth for this datum_uid",
        ("m", 3): "no valid ground truth for this datum_uid",
        ("m", 4): "missing response (a string)",
        ("m", 5): "contexts must be a list of strings",
    }
    assert found[("groundtruths", 5)].startswith("malformed JSON")
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"] == {"groundtruths": {"rows_read": 7, "rows_evaluated": 1, "rows_rejected": 6},
                              "m": {"rows_read": 5, "rows_evaluated": 1, "rows_rejected": 4}}
    rouge1 = next(r for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")
                  if r["type"] == "ROUGE" and r["parameters"]["rouge_type"] == "rouge1")
    assert rouge1["value"]["fmeasure"] == 1.0
    for bad in (["--metrics", "ROUGE,Nope"], ["--rouge_types", "rougeW"], ["--bleu_weights", ""],
                ["--bleu_weights", "-1"]):
        assert run_text("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                        "--output", tmp_path / "o2", *bad) == 2, bad


def test_ptransform_in_a_users_pipeline():
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from evalbeam.transforms.kernels.text import TextConfig
    from evalbeam.transforms.text import EvaluateText

    gt, predictions = make_rows(3, 20)
    rouge, bleu, _ = expected_means(gt, predictions["good"])
    config = TextConfig(metrics=frozenset({"ROUGE", "BLEU"}))
    with local_pipeline() as p:
        records, rejected, _, extra = ({"groundtruths": p | "G" >> beam.Create(gt),
                                        "good": p | "M" >> beam.Create(predictions["good"])}
                                       | EvaluateText(config, with_diagnostics=True))
        scores = extra["scores"]

        def check(found):
            values = {(r["type"], r["parameters"].get("rouge_type")): r["value"] for r in found}
            assert values[("BLEU", None)] == pytest.approx(bleu, abs=1e-12)
            assert values[("ROUGE", "rougeL")]["fmeasure"] == pytest.approx(rouge["rougeL"], abs=1e-12)

        def count_scores(found):
            assert len(found) == 20 * 5

        assert_that(records, check, label="records")
        assert_that(scores, count_scores, label="scores")


def test_rule_evaluators_through_the_cli(tmp_path):
    """Text matching with conditions, PII and sensitive data leakage, the encoding guardrail and
    looping detection on hand-made responses; a condition that does not parse is rejected with
    its column."""
    import base64

    gt = [
        {"datum_uid": "a", "condition": '("Brazil" OR "brazil") AND regexp("15,?969")'},
        {"datum_uid": "b", "condition": '"15,969" AND NOT "Real"'},
        {"datum_uid": "c"},
        {"datum_uid": "d", "condition": '"x" AND AND "y"'},
        {"datum_uid": "e"},
    ]
    secret = "card 4111 1111 1111 1111"
    preds = [
        {"datum_uid": "a", "response": "Brazil revenue was 15969 million.", "contexts": ["brazil: 15,969"]},
        {"datum_uid": "b", "response": "Revenue was 15,969 million Real. Contact me at jo@example.org",
         "contexts": ["nothing here"]},
        {"datum_uid": "c", "response": "The key is sk-proj-" + "a1B2" * 12 + " and "
                                       + base64.b64encode(secret.encode()).decode()},
        {"datum_uid": "e", "response": "I am stuck in a loop here. " * 30},
    ]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    metrics = "TextMatching,PIILeakage,SensitiveDataLeakage,EncodingGuardrail,LoopingDetection"
    assert run_text("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                    "--output", tmp_path / "out", "--metrics", metrics, "--quiet",
                    "--max_rejected_fraction", "0.5") == 0
    rejected = read_jsonl(tmp_path / "out" / "rejected.jsonl")
    assert [(r["line"], r["reason"].split(":")[0]) for r in rejected] == [(4, "condition")]
    assert "column 9" in rejected[0]["reason"]
    scores = {(s["datum_uid"], s["metric"]): s for s in read_jsonl(tmp_path / "out" / "scores.jsonl")}
    assert scores[("a", "TextMatching")]["value"] == 1.0
    assert scores[("b", "TextMatching")]["value"] == 0.0                  # "Real" is there
    assert scores[("c", "TextMatching")]["status"] == "no_condition"
    assert scores[("b", "PIILeakage")]["value"] == 0.0 and scores[("a", "PIILeakage")]["value"] == 1.0
    assert scores[("c", "SensitiveDataLeakage")]["value"] == 0.0
    assert scores[("c", "EncodingGuardrail")]["value"] == 0.0             # the decoded card number
    assert scores[("a", "EncodingGuardrail")]["value"] == 1.0
    assert scores[("e", "LoopingDetection")]["value"] == 0.0
    assert scores[("a", "LoopingDetection")]["value"] == 1.0
    assert scores[("e", "LoopingDetection")]["details"]["unique_sentences"] < 0.75
    assert "a1B2a1B2" not in json.dumps(list(scores.values()))            # no secret in the output
    records = {r["type"]: r["value"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")}
    assert records["TextMatching"]["pass"] == 0.5 and records["TextMatching"]["datums"] == 2
    assert records["PIILeakage"]["fail"] == 0.25 and records["PIILeakage"]["datums"] == 4
    assert records["LoopingDetection"]["pass"] == 0.75
    assert 0 < records["LoopingDetection"]["unique_sentences"] < 1
