"""The classification job end to end: bad input, outputs, determinism, formats, the PTransform."""

from __future__ import annotations

import json
import random
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalbeam.pipelines.launch.common import local_pipeline
from helpers import (MULTIPROCESS, read_jsonl, run_classification, run_cli_here, run_cli_subprocess,
                      write_jsonl)
from evalbeam.pipelines.demo.synthetic import write_classification_dataset


def gt_row(uid, value, region="north", key="class"):
    return {"datum_uid": uid, "metadata": {"region": region}, "labels": [{"key": key, "value": value}]}


def pred_row(uid, scores, key="class"):
    return {"datum_uid": uid, "labels": [{"key": key, "value": v, "score": s} for v, s in scores.items()]}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """2,000 datums, 4 classes, two models, region metadata (scores have 6 decimals)."""
    folder = tmp_path_factory.mktemp("data")
    return write_classification_dataset(str(folder), n_datums=2000, n_classes=4, seed=7)


def evaluate(paths, out, *extra) -> tuple[int, bytes]:
    args = ["--groundtruths", paths["groundtruths"], "--output", out, "--quiet",
            "--slice", "region", "--max_examples", "2", "--score_thresholds", "0.0,0.5", *extra]
    for name, path in paths.items():
        if name != "groundtruths":
            args += ["--predictions", f"{name}={path}"]
    code = run_classification(args)
    return code, Path(out, "metrics.jsonl").read_bytes()


# ----------------------------------------------------------------------------- bad input

BAD_GROUNDTRUTHS = [
    gt_row("g1", "cat"),
    "",                                                                    # blank: skipped, not a row
    "{not json",                                                           # line 3
    {"labels": [{"key": "class", "value": "cat"}]},                        # 4 no uid
    {"datum_uid": "", "labels": [{"key": "class", "value": "cat"}]},       # 5 empty uid
    {"datum_uid": "g6", "labels": [{"value": "cat"}]},                     # 6 label without key
    {"datum_uid": "g7", "labels": [{"key": "class", "value": ""}]},        # 7 label without value
    {"datum_uid": "g8", "labels": [{"key": "class", "value": "cat"},
                                   {"key": "class", "value": "dog"}]},     # 8 two values for a key
    gt_row("dup", "cat"),                                                  # 9 duplicate uid
    gt_row("dup", "dog"),                                                  # 10 duplicate uid
    {"datum_uid": 11, "labels": []},                                       # 11 uid not a string
    {"datum_uid": "g12"},                                                  # 12 labels missing
    gt_row("g13", "dog"),
    gt_row("g14", "cat"),
]
BAD_PREDICTIONS = [
    pred_row("g1", {"cat": 0.9, "dog": 0.1}),
    '{"datum_uid": "g13", "labels": [{"key": "class", "value": "dog", "score": NaN}]}',  # 2
    '{"datum_uid": "g13", "labels": [{"key": "class", "value": "dog", "score": 1e999}]}',  # 3 inf
    pred_row("g13", {"dog": 1.5}),                                         # 4 above 1
    pred_row("g13", {"dog": -0.1}),                                        # 5 below 0
    {"datum_uid": "g13", "labels": [{"key": "class", "value": "dog"}]},    # 6 no score
    {"datum_uid": "g13", "labels": [{"key": "class", "value": "dog", "score": "0.5"}]},  # 7 string
    {"datum_uid": "g13", "labels": [{"key": "class", "value": "dog", "score": 0.5},
                                    {"key": "class", "value": "dog", "score": 0.4}]},  # 8 twice
    pred_row("nowhere", {"cat": 0.5}),                                     # 9 no ground truth
    pred_row("dup", {"cat": 0.5}),                                         # 10 its ground truth was rejected
    pred_row("g14", {"cat": 0.7}),                                         # 11 duplicate uid
    pred_row("g14", {"cat": 0.6}),                                         # 12 duplicate uid
    "[1, 2]",                                                              # 13 not an object
]
EXPECTED_REJECTS = {
    ("groundtruths", 3): "malformed JSON",
    ("groundtruths", 4): "missing or empty datum_uid",
    ("groundtruths", 5): "missing or empty datum_uid",
    ("groundtruths", 6): "label without key",
    ("groundtruths", 7): "label without value",
    ("groundtruths", 8): "key 'class' has more than one ground-truth value",
    ("groundtruths", 9): "datum_uid appears 2 times in groundtruths",
    ("groundtruths", 10): "datum_uid appears 2 times in groundtruths",
    ("groundtruths", 11): "datum_uid must be a string",
    ("groundtruths", 12): "missing labels",
    ("model", 2): "score nan is not a number in [0, 1]",
    ("model", 3): "score inf is not a number in [0, 1]",
    ("model", 4): "score 1.5 is not a number in [0, 1]",
    ("model", 5): "score -0.1 is not a number in [0, 1]",
    ("model", 6): "label without score",
    ("model", 7): "label score must be a number",
    ("model", 8): "value 'dog' is scored twice for key 'class'",
    ("model", 9): "no valid ground truth for this datum_uid",
    ("model", 10): "no valid ground truth for this datum_uid",
    ("model", 11): "datum_uid appears 2 times in the predictions of model",
    ("model", 12): "datum_uid appears 2 times in the predictions of model",
    ("model", 13): "row must be a JSON object",
}


def test_every_bad_row_is_rejected_with_source_line_and_reason(tmp_path):
    gt = write_jsonl(tmp_path / "gt.jsonl", BAD_GROUNDTRUTHS)
    pred = write_jsonl(tmp_path / "model.jsonl", BAD_PREDICTIONS)
    out = tmp_path / "out"
    code = run_classification(["--groundtruths", gt, "--predictions", pred, "--output", out, "--quiet"])
    assert code == 1  # strict by default: outputs written, exit non-zero

    rejects = read_jsonl(out / "rejected.jsonl")
    found = {(r["source"], r["line"]): r for r in rejects}
    assert set(found) == set(EXPECTED_REJECTS)
    for where, reason in EXPECTED_REJECTS.items():
        assert reason in found[where]["reason"], (where, found[where])
        assert found[where]["file"].endswith(("gt.jsonl", "model.jsonl"))

    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete_with_rejections"
    assert info["counts"] == {
        "groundtruths": {"rows_read": 13, "rows_evaluated": 3, "rows_rejected": 10},
        "model": {"rows_read": 13, "rows_evaluated": 1, "rows_rejected": 12},
    }
    assert info["rows_rejected"] == len(rejects)

    # What survived is evaluated exactly as a clean input made of the same rows would be.
    clean = tmp_path / "clean"
    write_jsonl(clean / "gt.jsonl", [BAD_GROUNDTRUTHS[0], BAD_GROUNDTRUTHS[12], BAD_GROUNDTRUTHS[13]])
    write_jsonl(clean / "model.jsonl", [BAD_PREDICTIONS[0]])
    assert run_classification(["--groundtruths", clean / "gt.jsonl", "--predictions",
                               clean / "model.jsonl", "--output", clean / "out", "--quiet"]) == 0
    assert (out / "metrics.jsonl").read_bytes() == (clean / "out" / "metrics.jsonl").read_bytes()


def test_max_rejected_fraction_tolerates_bad_rows(tmp_path):
    gt = write_jsonl(tmp_path / "gt.jsonl", BAD_GROUNDTRUTHS)
    pred = write_jsonl(tmp_path / "model.jsonl", BAD_PREDICTIONS)
    base = ["--groundtruths", gt, "--predictions", pred, "--quiet"]
    # 22 of 26 rows are bad
    assert run_classification(base + ["--output", tmp_path / "a", "--max_rejected_fraction", "0.8"]) == 1
    assert run_classification(base + ["--output", tmp_path / "b", "--max_rejected_fraction", "0.9"]) == 0
    assert json.loads((tmp_path / "b" / "run.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("case", ["missing", "empty", "blank_lines", "unusable", "extension",
                                  "parquet_schema", "glob_nothing", "folder"])
def test_unusable_input_stops_at_once_with_one_paragraph(tmp_path, case, capsys):
    good = write_jsonl(tmp_path / "good.jsonl", [gt_row("a", "cat")])
    bad = {
        "missing": tmp_path / "absent.jsonl",
        "empty": tmp_path / "empty.jsonl",
        "blank_lines": tmp_path / "blank.jsonl",
        "unusable": tmp_path / "coco.jsonl",
        "extension": tmp_path / "data.csv",
        "parquet_schema": tmp_path / "wrong.parquet",
        "glob_nothing": tmp_path / "nothing-*.jsonl",
        "folder": tmp_path / "a_folder",
    }[case]
    if case == "folder":
        bad.mkdir()
    if case == "empty":
        bad.write_text("")
    if case == "blank_lines":
        bad.write_text("\n  \n\n")
    if case == "unusable":
        write_jsonl(bad, [{"images": [], "annotations": []}])
    if case == "extension":
        bad.write_text("datum_uid,label\n")
    if case == "parquet_schema":
        pq.write_table(pa.table({"id": ["a"], "label": ["cat"]}), bad)
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("stale output of an earlier run\n")
    result = run_cli_here(["classification", "--groundtruths", bad, "--predictions",
                           f"m={good}", "--output", out], capsys)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = [line for line in result.stderr.splitlines() if line.startswith("evalbeam: error:")]
    assert len(message) == 1 and str(bad.name).split("*")[0] in message[0]
    assert result.stdout == ""
    # a run that stops before any work changes nothing on disk
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
    assert (out / "metrics.jsonl").read_text() == "stale output of an earlier run\n"


def test_usage_errors_are_one_line(tmp_path, capsys):
    good = write_jsonl(tmp_path / "g.jsonl", [gt_row("a", "cat")])
    for args, text in [
        (["--score_thresholds", "0.5,x"], "comma-separated numbers"),
        (["--score_thresholds", "1.5"], "must lie in [0, 1]"),
        (["--metrics", "Precision,Nope"], "--metrics takes names"),
        (["--max_examples", "-1"], "--max_examples"),
        (["--score_threshold", "0.5"], "unknown option"),
    ]:
        result = run_cli_here(["classification", "--groundtruths", good, "--predictions",
                               f"m={good}", "--output", tmp_path / "o", *args], capsys)
        assert result.returncode == 2, args
        assert text in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_failed_pipeline_leaves_no_metrics(tmp_path, dataset, monkeypatch):
    out = tmp_path / "out"
    assert evaluate(dataset, str(out))[0] == 0
    assert (out / "metrics.jsonl").exists()

    import evalbeam.transforms.classification as plumbing

    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(plumbing, "match_key", broken)
    code = run_classification(["--groundtruths", dataset["groundtruths"], "--predictions",
                               f"model_a={dataset['model_a']}", "--output", out, "--quiet"])
    assert code == 3
    assert not (out / "metrics.jsonl").exists()  # neither a new nor the earlier run's
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and "kernel exploded" in info["error"]
    assert not [p for p in out.iterdir() if p.name.startswith(".evalbeam-tmp")]


# ----------------------------------------------------------------------------- determinism

def test_metrics_identical_for_shards_order_files_and_runner(tmp_path, dataset):
    reference_code, reference = evaluate(dataset, str(tmp_path / "ref"), "--num_shards", "1")
    assert reference_code == 0
    records = [json.loads(line) for line in reference.splitlines()]
    assert {r["slice"].get("region") for r in records} == {None, "north", "south", "east", "west"}
    for shards in ("7", "64"):
        assert evaluate(dataset, str(tmp_path / f"s{shards}"), "--num_shards", shards)[1] == reference

    # shuffled rows, ground truth split over two files read through a glob, Parquet for one model
    rng = random.Random(3)
    shuffled = {}
    lines = Path(dataset["groundtruths"]).read_text().splitlines()
    rng.shuffle(lines)
    write_jsonl(tmp_path / "shuf" / "gt-1.jsonl", lines[:700])
    write_jsonl(tmp_path / "shuf" / "gt-2.jsonl", lines[700:])
    shuffled["groundtruths"] = str(tmp_path / "shuf" / "gt-*.jsonl")
    for model in ("model_a", "model_b"):
        rows = read_jsonl(dataset[model])
        rng.shuffle(rows)
        if model == "model_a":
            shuffled[model] = str(tmp_path / "shuf" / "a.parquet")
            pq.write_table(pa.Table.from_pylist(rows), shuffled[model])
        else:
            shuffled[model] = write_jsonl(tmp_path / "shuf" / "b.jsonl", rows)
    assert evaluate(shuffled, str(tmp_path / "shuf-out"), "--num_shards", "5")[1] == reference


@pytest.mark.multiprocess
def test_multiprocess_runner_gives_identical_metrics(tmp_path, dataset):
    reference = evaluate(dataset, str(tmp_path / "ref"), "--num_shards", "3")[1]
    code, metrics = evaluate(dataset, str(tmp_path / "mp"), "--num_shards", "3", *MULTIPROCESS)
    assert code == 0 and metrics == reference


# ----------------------------------------------------------------------------- options and outputs

def test_metrics_subset_names_and_outputs(tmp_path, dataset):
    out = tmp_path / "out"
    code = run_classification(["--groundtruths", dataset["groundtruths"], "--predictions",
                               dataset["model_a"], "--output", out, "--quiet",
                               "--metrics", "Accuracy,ROCAUC"])
    assert code == 0
    records = read_jsonl(out / "metrics.jsonl")
    assert {r["type"] for r in records} == {"Accuracy", "ROCAUC"}
    assert {r["model"] for r in records} == {"model_a"}  # named after the file's stem
    assert all(set(r) == {"type", "value", "parameters", "model", "slice"} for r in records)
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and info["models"] == ["model_a"]
    assert info["versions"]["apache-beam"] and info["options"]["metrics"] == ["Accuracy", "ROCAUC"]
    assert (out / "rejected.jsonl").read_text() == ""  # always present


def test_quiet_prints_nothing_and_default_prints_progress_and_summary(tmp_path, dataset):
    common = ["classification", "--groundtruths", dataset["groundtruths"], "--predictions",
              f"model_b={dataset['model_b']}", "--output"]
    quiet = run_cli_subprocess(common + [tmp_path / "q", "--quiet"])
    assert quiet.returncode == 0 and quiet.stdout == ""
    assert [l for l in quiet.stderr.splitlines() if l.startswith("evalbeam")] == []
    loud = run_cli_subprocess(common + [tmp_path / "l"])
    assert loud.returncode == 0
    assert "read 2,000 rows" in loud.stderr and "matched shard" in loud.stderr
    assert "Classification summary" in loud.stdout and "model_b" in loud.stdout


def test_demo_runs_end_to_end(tmp_path):
    result = run_cli_subprocess(["demo", "--folder", tmp_path / "demo", "--n_datums", "600"])
    assert result.returncode == 0, result.stderr
    assert "Classification summary" in result.stdout and "region=north" in result.stdout
    records = read_jsonl(tmp_path / "demo" / "output" / "metrics.jsonl")
    assert {r["model"] for r in records} == {"model_a", "model_b"}


def test_ptransform_matches_the_command_line(tmp_path, dataset):
    code, expected = evaluate(dataset, str(tmp_path / "cli"))
    assert code == 0
    from evalbeam.transforms.classification import EvaluateClassification
    from evalbeam.transforms.kernels.classification import ClassificationConfig

    config = ClassificationConfig(score_thresholds=(0.0, 0.5), max_examples=2)
    out = tmp_path / "ptransform.jsonl"
    with local_pipeline() as pipeline:
        inputs = {name: pipeline | f"Read {name}" >> beam.Create(read_jsonl(path))
                  for name, path in dataset.items()}
        records = inputs | EvaluateClassification(config, slices=[("region",)], num_shards=3)
        _ = (records | beam.combiners.ToList()
             | beam.Map(lambda rs: out.write_text("\n".join(json.dumps(r, sort_keys=True) for r in rs))))
    got = sorted(out.read_text().splitlines())
    want = sorted(json.dumps(json.loads(line), sort_keys=True) for line in expected.splitlines())
    assert got == want


def test_summary_escapes_control_characters(tmp_path):
    gt = write_jsonl(tmp_path / "gt.jsonl", [gt_row("a", "cat", region="\x1b[31mred"),
                                            gt_row("b", "dog", region="\x1b[31mred")])
    pred = write_jsonl(tmp_path / "m.jsonl", [pred_row("a", {"cat": 0.9}), pred_row("b", {"cat": 0.6})])
    result = run_cli_subprocess(["classification", "--groundtruths", gt, "--predictions", pred,
                                 "--output", tmp_path / "o", "--slice", "region"])
    assert result.returncode == 0
    assert "\x1b" not in result.stdout and "\\x1b[31mred" in result.stdout
