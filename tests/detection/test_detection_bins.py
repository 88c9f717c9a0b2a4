"""--score_bins: constant-memory COCO state whose bounds contain pycocotools' exact numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import read_jsonl
from test_detection_oracle import first_has_bbox, make_case, product_state
from evalbeam.transforms.kernels.detection import (IOU_THRESHOLDS, MAX_DETS, BinnedState, accumulate,
                                          accumulate_binned, summarize)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n_bins", [3, 20, 1000])
def test_bounds_contain_the_exact_statistics(seed, n_bins):
    dataset, results = make_case(seed, "bbox")
    state = product_state(dataset, results, "bbox", first_has_bbox(results))
    exact_precision, exact_recall = accumulate(state)
    binned = BinnedState.from_state(state, n_bins, IOU_THRESHOLDS, MAX_DETS)
    low_precision, low_recall = accumulate_binned(binned)
    high_precision, high_recall = accumulate_binned(binned, upper=True)
    # every interpolated precision value is bracketed, and recall is exact
    assert np.all(low_precision <= exact_precision + 1e-12)
    assert np.all(exact_precision <= high_precision + 1e-12)
    assert np.array_equal(low_recall, exact_recall) and np.array_equal(high_recall, exact_recall)
    exact = summarize(exact_precision, exact_recall)
    low, high = summarize(low_precision, low_recall), summarize(high_precision, high_recall)
    for name in exact:
        assert low[name] - 1e-12 <= exact[name] <= high[name] + 1e-12, name


def test_one_score_per_bin_without_ties_is_exact():
    """With at most one detection per bin (distinct scores, fine bins) both bounds are exact."""
    dataset, results = make_case(1, "bbox")
    for i, r in enumerate(results):
        r["score"] = round((i + 1) / (len(results) + 1), 9)
    state = product_state(dataset, results, "bbox", True)
    exact = summarize(*accumulate(state))
    binned = BinnedState.from_state(state, 10 ** 7, IOU_THRESHOLDS, MAX_DETS)
    assert summarize(*accumulate_binned(binned)) == pytest.approx(exact, abs=1e-12)
    assert summarize(*accumulate_binned(binned, upper=True)) == pytest.approx(exact, abs=1e-12)


def test_merged_binned_states_equal_one(tmp_path):
    dataset, results = make_case(2, "bbox")
    ids = [im["id"] for im in dataset["images"]]
    whole = BinnedState.from_state(product_state(dataset, results, "bbox", True), 50,
                                   IOU_THRESHOLDS, MAX_DETS)
    parts = [BinnedState.from_state(product_state(dataset, results, "bbox", True, ids[i::3]), 50,
                                    IOU_THRESHOLDS, MAX_DETS) for i in range(3)]
    merged = parts[2].copy().merge(parts[0]).merge(parts[1])
    assert np.array_equal(merged.key, whole.key) and np.array_equal(merged.counts, whole.counts)
    assert np.array_equal(merged.n_gt, whole.n_gt)


def test_score_bins_through_the_cli(tmp_path, shared_reference):
    from evalbeam.pipelines.tasks.detection import run

    base = shared_reference / "detection" / "coco_val2014_100"
    outputs = []
    for shards in ("1", "4"):
        out = tmp_path / shards
        assert run([str(a) for a in ["--groundtruths", base / "instances_val2014_100.json",
                                     "--predictions", f"f={base / 'instances_val2014_fakebbox100_results.json'}",
                                     "--output", out, "--quiet", "--score_bins", "100",
                                     "--num_shards", shards]]) == 0
        outputs.append((out / "metrics.jsonl").read_bytes())
    assert outputs[0] == outputs[1]
    summaries = {r["parameters"]["bound"]: r["value"] for r in read_jsonl(tmp_path / "1" / "metrics.jsonl")
                 if r["type"] == "COCOSummary"}
    exact_ap = 0.5045806987249628  # the official number for this case
    assert summaries["lower"]["AP"] <= exact_ap <= summaries["upper"]["AP"]
    assert summaries["upper"]["AP"] - summaries["lower"]["AP"] < 0.02
    info = json.loads((tmp_path / "1" / "run.json").read_text())
    assert info["options"]["score_bins"] == 100


@pytest.mark.parametrize("seed", [0, 3])
def test_valor_score_bins_bound_ap_and_keep_the_rest_exact(tmp_path, seed):
    """--score_bins under the valor protocol: the AP family comes as bounds containing the exact
    values; AR, Counts, P/R/F1, the curves and the confusion matrices are those of the exact run;
    the output does not depend on the shard count."""
    from evalbeam.pipelines.tasks.detection import run
    from helpers import write_jsonl
    from test_detection_native import make_dataset

    _, _, gt_rows, pred_rows = make_dataset(seed)
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "m.jsonl", pred_rows)
    common = ["--groundtruths", str(tmp_path / "gt.jsonl"), "--predictions", str(tmp_path / "m.jsonl"),
              "--quiet", "--iou_thresholds", "0.5,0.75", "--score_thresholds", "0.3,0.6"]
    assert run(common + ["--output", str(tmp_path / "exact")]) == 0
    for name, extra in (("b1", ["--num_shards", "1"]), ("b4", ["--num_shards", "4"])):
        assert run(common + ["--output", str(tmp_path / name), "--score_bins", "8", *extra]) == 0
    assert (tmp_path / "b1" / "metrics.jsonl").read_bytes() == (tmp_path / "b4" / "metrics.jsonl").read_bytes()

    def key(r):
        params = {k: v for k, v in r["parameters"].items() if k not in ("bound", "score_bins")}
        return r["type"], json.dumps(params, sort_keys=True)

    exact = {key(r): r["value"] for r in read_jsonl(tmp_path / "exact" / "metrics.jsonl")}
    binned = read_jsonl(tmp_path / "b1" / "metrics.jsonl")
    ap_kinds = {"AP", "mAP", "APAveragedOverIOUs", "mAPAveragedOverIOUs"}
    bounds: dict = {}
    for r in binned:
        if r["type"] in ap_kinds:
            assert r["parameters"]["score_bins"] == 8
            bounds.setdefault(key(r), {})[r["parameters"]["bound"]] = r["value"]
        else:
            assert "bound" not in r["parameters"]
            assert r["value"] == exact[key(r)], key(r)
    # the InterpolatedPrecisionRecallCurve needs every detection's score: none under --score_bins
    curves = {k for k in exact if k[0] == "InterpolatedPrecisionRecallCurve"}
    assert curves and set(bounds) | {key(r) for r in binned} == set(exact) - curves
    loose = 0
    for k, b in bounds.items():
        assert b["lower"] - 1e-12 <= exact[k] <= b["upper"] + 1e-12, k
        loose += b["upper"] - b["lower"] > 1e-9
    assert loose  # 8 bins are coarse: some bounds must be apart, or the test shows nothing
    # one score per bin (distinct scores, fine bins): both bounds are the exact value
    assert run(common + ["--output", str(tmp_path / "fine"), "--score_bins", "100000000"]) == 0
    for r in read_jsonl(tmp_path / "fine" / "metrics.jsonl"):
        if isinstance(r["value"], float):
            assert r["value"] == pytest.approx(exact[key(r)], abs=1e-12), key(r)
        else:
            assert r["value"] == exact[key(r)], key(r)
