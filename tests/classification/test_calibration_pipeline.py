"""Calibration metrics through `evalbeam classification` (the kernel is tested in
test_calibration_kernel.py): asked for only, checked against a brute force on the files, with
bootstrap intervals that do not depend on shards, input order or runner."""

from __future__ import annotations

import json
import random
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from helpers import MULTIPROCESS, read_jsonl, run_classification, write_jsonl
from test_classification_bootstrap import CLASSES, MODELS, _dataset, _truth_and_scores

from evalbeam.pipelines.launch.common import local_pipeline
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.transforms.kernels.bootstrap import Bootstrap
from evalbeam.transforms.kernels.calibration import CALIBRATION_TYPES
from evalbeam.transforms.kernels.classification import DEFAULT_METRIC_TYPES, ClassificationConfig

TOL = 1e-12
BINS = 10
BOOT = ("--bootstrap", "20", "--bootstrap_seed", "3")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("calib"))


def _run(paths: dict, out: Path, *extra) -> bytes:
    args = ["--groundtruths", paths["groundtruths"], "--output", out, "--quiet", "--slice", "region",
            *extra]
    for name in MODELS:
        args += ["--predictions", f"{name}={paths[name]}"]
    assert run_classification(args) == 0
    return (out / "metrics.jsonl").read_bytes()


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    return _run(data, tmp_path_factory.mktemp("cref") / "out", "--calibration_bins", str(BINS),
                *BOOT, "--num_shards", "1")


def _records(text: bytes) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_calibration_is_computed_only_when_asked(data, reference, tmp_path):
    plain = {r["type"] for r in _records(_run(data, tmp_path / "plain"))}
    assert plain == set(DEFAULT_METRIC_TYPES)
    asked = {r["type"] for r in _records(reference)}
    assert asked == set(DEFAULT_METRIC_TYPES) | set(CALIBRATION_TYPES)
    only = _records(_run(data, tmp_path / "only", "--metrics", "ECE,BrierScore"))
    assert {r["type"] for r in only} == {"ECE", "BrierScore"}
    assert {r["parameters"].get("bins") for r in only if r["type"] == "ECE"} == {15}  # default B
    info = json.loads((tmp_path / "only" / "run.json").read_text())
    assert info["options"]["calibration_bins"] == 15 and info["options"]["metrics"] == ["ECE", "BrierScore"]


def test_calibration_records_do_not_depend_on_shards_order_or_runner(data, reference, tmp_path):
    common = ("--calibration_bins", str(BINS), *BOOT)
    assert _run(data, tmp_path / "s5", *common, "--num_shards", "5") == reference
    rng = random.Random(4)
    shuffled = {}
    for name, path in data.items():
        lines = Path(path).read_text().splitlines()
        rng.shuffle(lines)
        shuffled[name] = write_jsonl(tmp_path / "shuf" / Path(path).name, lines)
    assert _run(shuffled, tmp_path / "shuf-out", *common, "--num_shards", "3") == reference


@pytest.mark.multiprocess
def test_calibration_on_the_multiprocess_runner(data, reference, tmp_path):
    common = ("--calibration_bins", str(BINS), *BOOT)
    assert _run(data, tmp_path / "mp", *common, "--num_shards", "3", *MULTIPROCESS) == reference


def _brute(gt, S, E, w=None):
    """(ECE, MCE, Brier) with equal-width bins over the datums with a ground truth, datum i
    counted w[i] times; the top value's ties go to the smallest index, a score of 0 is never
    correct."""
    w = np.ones(gt.size, dtype=np.int64) if w is None else w.astype(np.int64)
    top = np.argmax(S, axis=1)
    confidence = S[np.arange(gt.size), top]
    correct = (top == gt) & (confidence > 0)
    Y = np.arange(S.shape[1])[None, :] == gt[:, None]
    brier = ((S - Y) ** 2).sum(axis=1)
    edges = np.linspace(0, 1, BINS + 1)
    b = np.searchsorted(edges[1:-1], confidence, side="left")
    n = np.bincount(b, weights=w, minlength=BINS)
    k = np.bincount(b, weights=w * correct, minlength=BINS)
    s = np.bincount(b, weights=w * confidence, minlength=BINS)
    N = w.sum()
    if N == 0:
        return None, None, None
    gap = np.abs(k - s)
    return gap.sum() / N, max(gap[i] / n[i] for i in range(BINS) if n[i]), (w * brier).sum() / N


def test_values_and_intervals_against_a_brute_force(data, reference):
    uids, gt, region, dense = _truth_and_scores(data)
    weights = Bootstrap(20, 0.95, 3).weights(fnv1a_64(pa.array(uids)))
    records = _records(reference)
    checked = 0
    for model in MODELS:
        S, _ = dense[model]
        for slice_value, rows in (({}, np.arange(gt.size)),
                                  ({"region": "north"}, np.flatnonzero(region == "north"))):
            expected = dict(zip(("ECE", "MCE", "BrierScore"), _brute(gt[rows], S[rows], None)))
            replicates = [_brute(gt[rows], S[rows], None, weights[r, rows]) for r in range(20)]
            for record in records:
                if record["model"] != model or record["slice"] != slice_value:
                    continue
                if record["type"] not in expected or record["parameters"].get("binning", "equal_width") != "equal_width":
                    continue
                assert abs(record["value"] - expected[record["type"]]) <= TOL, record
                index = ("ECE", "MCE", "BrierScore").index(record["type"])
                values = [rep[index] for rep in replicates]
                low, high = np.percentile(values, [2.5, 97.5])
                assert abs(record["interval"]["low"] - low) <= TOL
                assert abs(record["interval"]["high"] - high) <= TOL
                checked += 1
            diagram = next(r for r in records if r["type"] == "ReliabilityDiagram" and r["model"] == model
                           and r["slice"] == slice_value and r["parameters"]["binning"] == "equal_width")
            assert sum(b["count"] for b in diagram["value"]["bins"]) == rows.size
            assert "interval" not in diagram
    assert checked == 2 * 2 * 3
    # equal-mass ECE and MCE get intervals too; the diagrams never do
    for record in records:
        if record["type"] in ("ECE", "MCE", "BrierScore"):
            assert record["interval"]["replicates"] == 20
        elif record["type"] in ("ReliabilityDiagram", "ClasswiseReliabilityDiagram"):
            assert "interval" not in record and record["parameters"]["bins"] == BINS


def test_rows_api_computes_calibration_like_the_command_line(data, reference, tmp_path):
    from evalbeam.transforms.classification import EvaluateClassification

    config = ClassificationConfig(metrics=frozenset(DEFAULT_METRIC_TYPES) | frozenset(CALIBRATION_TYPES),
                                  calibration_bins=BINS)
    out = tmp_path / "rows.jsonl"
    with local_pipeline() as pipeline:
        inputs = {name: pipeline | f"Read {name}" >> beam.Create(read_jsonl(path))
                  for name, path in data.items()}
        records = inputs | EvaluateClassification(config, slices=[("region",)], num_shards=2,
                                                  bootstrap=Bootstrap(20, 0.95, 3))
        _ = (records | beam.combiners.ToList()
             | beam.Map(lambda rs: out.write_text("\n".join(json.dumps(r, sort_keys=True) for r in rs))))
    got = sorted(out.read_text().splitlines())
    want = sorted(json.dumps(json.loads(line), sort_keys=True) for line in reference.splitlines())
    assert got == want


def test_calibration_bins_must_be_positive(tmp_path):
    from helpers import run_cli_subprocess

    gt = write_jsonl(tmp_path / "g.jsonl", [{"datum_uid": "a", "labels": [{"key": "k", "value": CLASSES[0]}]}])
    result = run_cli_subprocess(["classification", "--groundtruths", gt, "--predictions", f"m={gt}",
                                 "--output", tmp_path / "o", "--calibration_bins", "0"])
    assert result.returncode == 2 and "--calibration_bins" in result.stderr
