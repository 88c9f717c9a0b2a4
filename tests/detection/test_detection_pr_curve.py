"""InterpolatedPrecisionRecallCurve: the 101-point interpolated precision AP integrates, with the
score at each recall point, per IoU threshold and label.

Oracles: pycocotools' COCOeval.accumulate() arrays `precision` and `scores` [T, R, K, A, M]
(compared exactly, np.array_equal: the kernel repeats pycocotools' float operations, and a score
is copied, never computed), for the coco protocol and for the valor protocol (pycocotools with
maxDets, area ranges and crowds switched off); and valor-lite's object-detection
PrecisionRecallCurve for the valor protocol. The random data have tied scores (1-2 decimals),
a category without ground truth (with detections), a category with ground truth but without
detections, images without annotations or detections, crowd regions and more than 100
detections of a category in an image. Through the CLI: the records are in metrics.jsonl, the
same bytes with 1 and 3 shards and the multi-process runner, and carry no interval under
--bootstrap.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from pycocotools import mask as mask_utils
from pycocotools.cocoeval import COCOeval
from test_detection_oracle import (
    _cli, _gt_only, _quiet, _rle_str, _write, bbox_results, coco_from, first_has_bbox, make_case,
    make_detections, make_groundtruth, product_state,
)
from test_detection_valor import switched_off_eval, valor_state

from evalbeam.schemas.coco_rows import box_rows, image_rows
from evalbeam.transforms.detection import shard_state
from evalbeam.transforms.kernels.detection import (
    COCO, IOU_THRESHOLDS, MAX_DETS, RECALL_THRESHOLDS, DetectionConfig, DetectionState, Protocol,
    accumulate, state_records,
)

CURVE = "InterpolatedPrecisionRecallCurve"
SEEDS = [0, 1, 2, 3, 4]


def without_category_predictions(dataset: dict, results: list[dict]) -> tuple[list[dict], int]:
    """results without any detection of one category that has ground truth (the first such one
    in id order that has detections), and that category's id."""
    with_gt = {a["category_id"] for a in dataset["annotations"] if not a["iscrowd"]}
    detected = {r["category_id"] for r in results}
    dropped = min(with_gt & detected)
    return [r for r in results if r["category_id"] != dropped], dropped


def pycocotools_arrays(dataset: dict, results: list[dict], iou_type: str) -> tuple[np.ndarray, np.ndarray]:
    gt = coco_from(dataset)
    with _quiet():
        evaluation = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), iou_type)
        evaluation.evaluate()
        evaluation.accumulate()
    return evaluation.eval["precision"], evaluation.eval["scores"]


def switched_off_scores(dataset: dict, results: list[dict], iou_type: str):
    """switched_off_oracle's precision and pycocotools' scores of the same run."""
    evaluated = switched_off_eval(dataset, results, iou_type)
    return evaluated["precision"], evaluated["scores"]


def assert_equal(mine, theirs, what):
    mine, theirs = np.asarray(mine), np.asarray(theirs)
    assert mine.shape == theirs.shape, (what, mine.shape, theirs.shape)
    if not np.array_equal(mine, theirs):
        diff = np.argwhere(mine != theirs)
        raise AssertionError(f"{what}: differs at {len(diff)} entries, first {diff[:5].tolist()}: "
                             f"{mine[tuple(diff[0])]} != {theirs[tuple(diff[0])]}")


# ----------------------------------------------------------------------------------------------
# the kernel: accumulate(with_scores=True) against pycocotools' arrays

@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", SEEDS)
def test_scores_array_equals_pycocotools(seed, iou_type):
    """The full precision and scores arrays [T, R, K, A, M] (every area range and maxDets), and
    precision/recall unchanged by with_scores."""
    dataset, results = make_case(seed, iou_type)
    results, dropped = without_category_predictions(dataset, results)
    precision_ref, scores_ref = pycocotools_arrays(dataset, results, iou_type)
    state = product_state(dataset, results, iou_type, first_has_bbox(results))
    precision, recall, scores = accumulate(state, with_scores=True)
    assert_equal(precision, precision_ref, f"precision seed {seed} {iou_type}")
    assert_equal(scores, scores_ref, f"scores seed {seed} {iou_type}")
    plain = accumulate(state)
    assert len(plain) == 2
    assert_equal(plain[0], precision, "precision with and without scores")
    assert_equal(plain[1], recall, "recall with and without scores")
    # the cases the test is about are there
    cat_ids = sorted(c["id"] for c in dataset["categories"])
    k_dropped = cat_ids.index(dropped)
    assert (scores[:, :, k_dropped, 0, -1] == 0).all() and (precision[:, :, k_dropped, 0, -1] == 0).all()
    assert (scores == -1).any() and ((scores > 0) & (scores < 1)).any()
    assert (scores[:, 1:] == 0).any()        # some curve stops before recall 1
    assert len({r["score"] for r in results}) < len(results) / 3     # ties


def test_hand_computed_curve():
    """One image, category "a" with two ground truths; detections 0.9 (misses), 0.8 (hits the
    first), 0.7 (hits the second): precision 0, 1/2, 2/3 at recall 0, 1/2, 1. The envelope is 2/3
    everywhere; recall 0 is read at the first detection (score 0.9, a false positive), recall
    0.01-0.5 at the first true positive (0.8), 0.51-1 at the second (0.7). Category "b" has ground
    truth and no detection: 0 throughout; category "c" no ground truth: -1 throughout."""
    dataset = {"images": [{"id": 1, "height": 100, "width": 100}],
               "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}],
               "annotations": [
                   {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": 0},
                   {"id": 2, "image_id": 1, "category_id": 1, "bbox": [50, 50, 10, 10], "area": 100, "iscrowd": 0},
                   {"id": 3, "image_id": 1, "category_id": 2, "bbox": [20, 20, 10, 10], "area": 100, "iscrowd": 0}]}
    results = [{"image_id": 1, "category_id": 1, "bbox": [80, 80, 5, 5], "score": 0.9},
               {"image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.8},
               {"image_id": 1, "category_id": 1, "bbox": [50, 50, 10, 10], "score": 0.7},
               {"image_id": 1, "category_id": 3, "bbox": [0, 0, 10, 10], "score": 0.6}]
    state = product_state(dataset, results, "bbox", True)
    categories = {"id": [1, 2, 3], "name": ["a", "b", "c"]}
    found = curves(state_records(DetectionState(state), DetectionConfig(), categories))
    a = found[0.5, "a"]["value"]
    assert a["precisions"] == [2 / (1 + 2 + np.spacing(1))] * 101
    assert a["scores"] == [0.9] + [0.8] * 50 + [0.7] * 50
    assert found[0.5, "b"]["value"] == {"precisions": [0.0] * 101, "scores": [0.0] * 101}
    assert found[0.5, "c"]["value"] == {"precisions": [-1.0] * 101, "scores": [-1.0] * 101}
    precision_ref, scores_ref = pycocotools_arrays(dataset, results, "bbox")
    for t, iou in enumerate(COCO.iou_thresholds):
        for k, name in enumerate("abc"):
            assert_equal(found[iou, name]["value"]["precisions"], precision_ref[t, :, k, 0, -1], (iou, name))
            assert_equal(found[iou, name]["value"]["scores"], scores_ref[t, :, k, 0, -1], (iou, name))


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_first_detection_is_read_at_recall_zero(iou_type):
    """pycocotools reads recall threshold 0 at the first detection in score order even when it is
    a false positive (or ignored) or the category has no true positive: every detection made a
    false positive by moving it off its object still leaves the top score at recall 0."""
    dataset, results = make_case(5, iou_type)
    if iou_type == "bbox":
        far = [dict(r, bbox=[0.0, 0.0, 1.0, 1.0]) for r in results]
    else:                    # a 1-pixel mask in the image's corner
        far = []
        for r in results:
            h, w = r["segmentation"]["size"]
            corner = np.zeros((h, w), dtype=np.uint8, order="F")
            corner[0, 0] = 1
            far.append(dict(r, segmentation=_rle_str(mask_utils.encode(corner))))
    precision_ref, scores_ref = pycocotools_arrays(dataset, far, iou_type)
    state = product_state(dataset, far, iou_type, first_has_bbox(far))
    precision, _, scores = accumulate(state, with_scores=True)
    assert_equal(precision, precision_ref, "precision")
    assert_equal(scores, scores_ref, "scores")
    # no true positive anywhere, yet a score at recall 0 for the categories with ground truth
    # and detections
    assert precision.max() <= 0
    assert (scores[:, 0] > 0).any() and (scores[:, 1:] <= 0).all()


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_valor_protocol_arrays_equal_pycocotools_switched_off(seed, iou_type):
    dataset, results = make_case(seed, iou_type)
    results, _ = without_category_predictions(dataset, results)
    state = valor_state(dataset, results, iou_type)
    ious = np.array(Protocol("valor").iou_thresholds)
    precision, _, scores = accumulate(state, ious, max_dets=(None,), with_scores=True)
    precision_ref, scores_ref = switched_off_scores(dataset, results, iou_type)
    assert_equal(precision, precision_ref, "precision")
    assert_equal(scores, scores_ref, "scores")


# ----------------------------------------------------------------------------------------------
# the records, in process

def curves(records) -> dict:
    return {(r["parameters"]["iou_threshold"], r["parameters"]["label"]): r
            for r in records if r["type"] == CURVE}


@pytest.mark.parametrize("seed", SEEDS)
def test_coco_records_equal_pycocotools(seed):
    """One record per IoU threshold and category: precision[t, :, k, area all, maxDets 100] and
    scores[...] as lists of the same floats; -1 throughout for the category without ground
    truth, as in pycocotools' arrays (and its COCOClassSummary AP of -1); the mean of the
    precisions is the COCOClassSummary's AP at that threshold (AP50, AP75)."""
    dataset, results = make_case(seed, "bbox")
    results, _ = without_category_predictions(dataset, results)
    precision_ref, scores_ref = pycocotools_arrays(dataset, results, "bbox")
    state = product_state(dataset, results, "bbox", first_has_bbox(results))
    cats = sorted(dataset["categories"], key=lambda c: c["id"])
    categories = {"id": [c["id"] for c in cats], "name": [c["name"] for c in cats]}
    records = list(state_records(DetectionState(state), DetectionConfig(), categories))
    found = curves(records)
    assert len(found) == len([r for r in records if r["type"] == CURVE]) == IOU_THRESHOLDS.size * len(cats)
    m = MAX_DETS.index(100)
    assert m == precision_ref.shape[-1] - 1
    summaries = {r["parameters"]["category_id"]: r["value"] for r in records if r["type"] == "COCOClassSummary"}
    for t, iou in enumerate(COCO.iou_thresholds):
        for k, c in enumerate(cats):
            record = found[iou, c["name"]]
            assert record["parameters"] == {"iou_threshold": iou, "label": c["name"], "category_id": c["id"]}
            assert set(record["value"]) == {"precisions", "scores"}
            assert all(type(v) is float for v in record["value"]["precisions"] + record["value"]["scores"])
            assert_equal(record["value"]["precisions"], precision_ref[t, :, k, 0, m], (iou, c["name"]))
            assert_equal(record["value"]["scores"], scores_ref[t, :, k, 0, m], (iou, c["name"]))
            ap = summaries[c["id"]]
            if iou in (0.5, 0.75):
                expected = ap["AP50" if iou == 0.5 else "AP75"]
                if expected == -1:
                    assert set(record["value"]["precisions"]) == set(record["value"]["scores"]) == {-1.0}
                else:
                    assert np.mean(record["value"]["precisions"]) == pytest.approx(expected, abs=1e-15)
    assert any(set(r["value"]["precisions"]) == {-1.0} for r in found.values())


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_valor_records_equal_pycocotools_and_ap(seed):
    """Per metric IoU threshold (not the PR curve's extra one) and label present: pycocotools'
    switched-off arrays; a label only predicted: precision 0 (its AP) and its top score at
    recall 0. AP is the mean of the precisions (up to the order of the sum)."""
    dataset, results = make_case(seed, "bbox")
    results, dropped = without_category_predictions(dataset, results)
    protocol = Protocol("valor", (0.5, 0.75, 0.9), (0.5,), pr_curve_iou_threshold=0.6)
    parts = full_valor_state(dataset, results, protocol)
    state = parts[0]
    cats = sorted(dataset["categories"], key=lambda c: c["id"])
    categories = {"id": [c["id"] for c in cats], "name": [c["name"] for c in cats]}
    records = list(state_records(DetectionState(*parts), DetectionConfig(protocol=protocol), categories))
    found = curves(records)
    aps = {(r["parameters"]["iou_threshold"], r["parameters"]["label"]): r["value"]
           for r in records if r["type"] == "AP"}
    assert set(found) == set(aps)
    assert {iou for iou, _ in found} == {0.5, 0.75, 0.9}
    precision_ref, scores_ref = switched_off_scores(dataset, results, "bbox")
    all_ious = list(Protocol("valor").iou_thresholds)
    n_gt = state.n_gt[:, 0]
    only_predicted = 0
    for (iou, name), record in found.items():
        k = categories["name"].index(name)
        t = [round(v, 10) for v in all_ious].index(round(iou, 10))
        assert record["parameters"] == {"iou_threshold": iou, "label": name}
        value = record["value"]
        if n_gt[k]:
            assert_equal(value["precisions"], precision_ref[t, :, k, 0, 0], (iou, name))
            assert_equal(value["scores"], scores_ref[t, :, k, 0, 0], (iou, name))
        else:
            only_predicted += 1
            top = max(r["score"] for r in results if r["category_id"] == categories["id"][k])
            assert value["precisions"] == [0.0] * 101
            assert value["scores"] == [top] + [0.0] * 100
        # the same numbers summed in another order (a mean over an axis of [T, R])
        assert aps[iou, name] == pytest.approx(np.mean(value["precisions"]), rel=0, abs=1e-15)
    assert only_predicted
    k_dropped = categories["id"].index(dropped)
    for iou in (0.5, 0.75, 0.9):
        assert found[iou, categories["name"][k_dropped]]["value"] == {"precisions": [0.0] * 101,
                                                                      "scores": [0.0] * 101}


def full_valor_state(dataset, results, protocol):
    """shard_state's (CocoState, DetailedState, ConfusionState) of the valor protocol."""
    images, _ = image_rows(dataset["images"], [])
    gts, _ = box_rows(dataset["annotations"], detections=False, need_segmentation=False)
    dts, _ = box_rows(results, detections=True, need_segmentation=False)
    category_id = np.array(sorted(c["id"] for c in dataset["categories"]), dtype=np.int64)
    return shard_state(images, gts, dts, category_id, "bbox", first_has_bbox(results), protocol)


# ----------------------------------------------------------------------------------------------
# the valor protocol against valor-lite

def recall_edges(n_gt: int) -> set[int]:
    """Recall points r where valor-lite's binning (floor(recall * 100) >= r) and pycocotools'
    reading (recall >= np.linspace(0, 1, 101)[r]) disagree for some recall k / n_gt: there the
    two curves may legitimately differ (pipelines/tasks/detection.md)."""
    out = set()
    for k in range(1, n_gt + 1):
        recall = k / n_gt
        out |= {r for r in range(101) if (recall >= RECALL_THRESHOLDS[r]) != (math.floor(recall * 100) >= r)}
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_valor_protocol_equals_valor_lite(tmp_path, seed):
    """Distinct scores (valor-lite orders ties differently): every label's precisions (to 1e-12:
    valor-lite divides tp / (tp + fp), pycocotools adds eps to the denominator) and scores
    (exactly: both pick the score of the first detection reaching the recall point, valor-lite as
    a running maximum over descending scores), away from recall-binning edges."""
    from test_detection_valor_lite import random_rows, run_detection, valor_lite_evaluator

    ious = [0.3, 0.5, 0.75]
    gt_rows, pred_rows = random_rows(seed, tied=False)
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "pd.jsonl", pred_rows)
    out = tmp_path / "out"
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                         "--output", out, "--quiet", "--iou_thresholds", ",".join(map(str, ious)),
                         "--max_examples", "0") == 0
    ours = {key: r["value"] for key, r in curves(read_jsonl(out / "metrics.jsonl")).items()}
    theirs = {}
    for metrics in valor_lite_evaluator(gt_rows, pred_rows).compute_precision_recall(ious, [0.5]).values():
        for m in metrics:
            d = m.to_dict()
            if d["type"] == "PrecisionRecallCurve":
                assert set(d["parameters"]) == {"iou_threshold", "label"}
                assert set(d["value"]) == {"precisions", "scores"}
                theirs[d["parameters"]["iou_threshold"], d["parameters"]["label"]] = d["value"]
    assert set(ours) == set(theirs) and len(ours) == 3 * 5      # "cow" only predicted
    n_gt = {}
    for row in gt_rows:
        for a in row["annotations"]:
            n_gt[a["label"]] = n_gt.get(a["label"], 0) + 1
    for (iou, label), value in theirs.items():
        keep = [r for r in range(101) if r not in recall_edges(n_gt.get(label, 0))]
        mine = ours[iou, label]
        np.testing.assert_allclose(np.array(mine["precisions"])[keep], np.array(value["precisions"])[keep],
                                   rtol=0, atol=1e-12, err_msg=f"{iou} {label}")
        assert_equal(np.array(mine["scores"])[keep], np.array(value["scores"])[keep], (iou, label))


# ----------------------------------------------------------------------------------------------
# through the CLI

@pytest.fixture(scope="module")
def cli_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("pr_curve_cli")
    raw = make_groundtruth(404, n_images=30)
    dataset = _gt_only(raw)
    results = bbox_results(make_detections(raw, 404))
    gt_path = _write(root / "instances.json", dataset)
    args = ["--groundtruths", gt_path, "--slice", "split",
            "--predictions", f"m={_write(root / 'm.json', results)}"]
    return {"root": root, "dataset": dataset, "results": results, "args": args}


def _one_shard(case):
    out = case["root"] / "one"
    if not (out / "metrics.jsonl").exists():
        _cli(case["args"] + ["--output", out, "--num_shards", "1"])
    return out


def test_cli_writes_the_curves(cli_case):
    out = _one_shard(cli_case)
    records = read_jsonl(out / "metrics.jsonl")
    dataset = cli_case["dataset"]
    precision_ref, scores_ref = pycocotools_arrays(dataset, cli_case["results"], "bbox")
    n_cat = len(dataset["categories"])
    slices = {json.dumps(r["slice"], sort_keys=True) for r in records}
    assert len(slices) > 1
    assert sum(r["type"] == CURVE for r in records) == len(slices) * IOU_THRESHOLDS.size * n_cat
    found = curves(r for r in records if r["slice"] == {})
    cats = sorted(dataset["categories"], key=lambda c: c["id"])
    for t, iou in enumerate(COCO.iou_thresholds):
        for k, c in enumerate(cats):
            value = found[iou, c["name"]]["value"]
            assert_equal(value["precisions"], precision_ref[t, :, k, 0, -1], (iou, c["name"]))
            assert_equal(value["scores"], scores_ref[t, :, k, 0, -1], (iou, c["name"]))
    # the curves follow the COCO summaries, by IoU threshold, then category id
    types = [r["type"] for r in records if r["slice"] == {}]
    assert types.index(CURVE) > max(i for i, kind in enumerate(types) if kind == "COCOClassSummary")
    keys = [(r["parameters"]["iou_threshold"], r["parameters"]["category_id"])
            for r in records if r["slice"] == {} and r["type"] == CURVE]
    assert keys == sorted(keys)


def test_cli_seven_shards_byte_identical(cli_case):
    one, seven = _one_shard(cli_case), cli_case["root"] / "seven"
    _cli(cli_case["args"] + ["--output", seven, "--num_shards", "7"])
    data = (seven / "metrics.jsonl").read_bytes()
    assert CURVE.encode() in data and data == (one / "metrics.jsonl").read_bytes()


@pytest.mark.multiprocess
def test_cli_multiprocess_byte_identical(cli_case):
    one, multi = _one_shard(cli_case), cli_case["root"] / "multi"
    _cli(cli_case["args"] + ["--output", multi, "--num_shards", "3", *MULTIPROCESS])
    data = (multi / "metrics.jsonl").read_bytes()
    assert CURVE.encode() in data and data == (one / "metrics.jsonl").read_bytes()


def test_cli_bootstrap_leaves_the_curves_without_interval(cli_case):
    one, boot = _one_shard(cli_case), cli_case["root"] / "boot"
    _cli(cli_case["args"] + ["--output", boot, "--bootstrap", "5"])
    plain = [r for r in read_jsonl(one / "metrics.jsonl") if r["type"] == CURVE]
    booted = [r for r in read_jsonl(boot / "metrics.jsonl") if r["type"] == CURVE]
    assert booted == plain and all("interval" not in r for r in booted)
    summaries = [r for r in read_jsonl(boot / "metrics.jsonl") if r["type"] == "COCOSummary"]
    assert summaries and all("interval" in r for r in summaries)
