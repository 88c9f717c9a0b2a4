"""The valor detection protocol: every detection, one area range, no crowd rule.

Checked against pycocotools with maxDets, area ranges and the crowd rule switched off, and on a
case small enough to compute by hand."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from pycocotools.cocoeval import COCOeval

from helpers import read_jsonl
from test_detection_oracle import _quiet, coco_from, first_has_bbox, make_case
from evalbeam.schemas.coco_rows import box_rows, image_rows
from evalbeam.transforms.detection import shard_state
from evalbeam.transforms.kernels.detection import Protocol, accumulate, valor_metrics

VALOR = Protocol("valor")
IOUS = np.array(VALOR.iou_thresholds)


def valor_state(dataset, results, iou_type, protocol=VALOR):
    segm = iou_type == "segm"
    images, _ = image_rows(dataset["images"], [])
    gts, _ = box_rows(dataset["annotations"], detections=False, need_segmentation=segm)
    dts, _ = box_rows(results, detections=True, need_segmentation=segm)
    category_id = np.array(sorted(c["id"] for c in dataset["categories"]), dtype=np.int64)
    state = shard_state(images, gts, dts, category_id, iou_type, first_has_bbox(results), protocol)
    return state[0] if isinstance(state, tuple) else state  # (CocoState, DetailedState, ConfusionState)


def switched_off_oracle(dataset, results, iou_type):
    """pycocotools' precision/recall with every detection kept, one area range, no crowds."""
    evaluated = switched_off_eval(dataset, results, iou_type)
    return evaluated["precision"], evaluated["recall"]


def switched_off_eval(dataset, results, iou_type) -> dict:
    """pycocotools' accumulated `eval` dict (precision, recall, scores) with every detection
    kept, one area range, no crowds."""
    plain = copy.deepcopy(dataset)
    for ann in plain["annotations"]:
        ann["iscrowd"] = 0
    with _quiet():
        gt = coco_from(plain)
        evaluation = COCOeval(gt, gt.loadRes(copy.deepcopy(results)), iou_type)
        evaluation.params.maxDets = [10 ** 9]
        evaluation.params.areaRng = [[0, 1e10]]
        evaluation.params.areaRngLbl = ["all"]
        evaluation.evaluate()
        evaluation.accumulate()
    return evaluation.eval


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_valor_matching_equals_pycocotools_switched_off(seed, iou_type):
    dataset, results = make_case(seed, iou_type)
    state = valor_state(dataset, results, iou_type)
    precision, recall = accumulate(state, IOUS, max_dets=(None,))
    expected_precision, expected_recall = switched_off_oracle(dataset, results, iou_type)
    assert np.array_equal(precision, expected_precision)
    assert np.array_equal(recall, expected_recall)

    m = valor_metrics(state, IOUS, np.array([0.0]))
    n_gt = state.n_gt[:, 0]
    # AR never counts a score of 0 as a detection; zero scores rank last, so dropping them
    # changes no other match and pycocotools' recall without them is the expected AR
    _, positive_recall = switched_off_oracle(dataset, [r for r in results if r["score"] > 0], iou_type)
    for k in np.flatnonzero(m["present"]):
        expected_ap = expected_precision[:, :, k, 0, 0].mean(axis=1) if n_gt[k] else np.zeros(IOUS.size)
        np.testing.assert_allclose(m["AP"][:, k], expected_ap, rtol=0, atol=1e-12)
        if n_gt[k]:
            assert m["AR"][0, k] == pytest.approx(positive_recall[:, k, 0, 0].mean(), abs=1e-12)
    assert m["mAP"] == pytest.approx(m["AP"][:, m["present"]].mean(axis=1), abs=1e-15)


def test_hand_computed_case():
    """One image, one class, two ground truths, three detections (scores 0.9, 0.8, 0.7):
    0.9 hits gt A (IoU 1), 0.8 misses (IoU 0), 0.7 hits gt B with IoU 0.6 -> at IoU 0.5 the
    ranked list is TP, FP, TP: precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1; the envelope gives
    precision 1 up to recall 0.5 (51 points) and 2/3 above (50 points): AP = (51 + 50 * 2/3) / 101.
    At IoU 0.75 only the first is a TP: AP = 51 / 101. A second label only predicted gets AP 0."""
    dataset = {"images": [{"id": 1, "height": 100, "width": 100}],
               "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "ghost"}],
               "annotations": [
                   {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": 1},
                   {"id": 2, "image_id": 1, "category_id": 1, "bbox": [50, 50, 10, 10], "area": 100}]}
    results = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.9},
               {"image_id": 1, "category_id": 1, "bbox": [80, 80, 5, 5], "score": 0.8},
               {"image_id": 1, "category_id": 1, "bbox": [50, 50, 10, 6], "score": 0.7},
               {"image_id": 1, "category_id": 2, "bbox": [0, 0, 10, 10], "score": 0.6}]
    # detection 3 covers 60 of gt B's 100 pixels and lies inside it: IoU = 60 / 100 = 0.6
    ious = np.array([0.5, 0.75])
    protocol = Protocol("valor", (0.5, 0.75), (0.0, 0.75))
    m = valor_metrics(valor_state(dataset, results, "bbox", protocol), ious, np.array([0.0, 0.75]))
    assert m["AP"][0, 0] == pytest.approx((51 + 50 * 2 / 3) / 101, abs=1e-12)
    assert m["AP"][1, 0] == pytest.approx(51 / 101, abs=1e-12)
    assert m["AP"][:, 1].tolist() == [0.0, 0.0] and m["present"].tolist() == [True, True]
    assert m["mAP"].tolist() == pytest.approx([((51 + 50 * 2 / 3) / 101) / 2, (51 / 101) / 2])
    # AR: recall 1 at IoU .5 and 1/2 at .75 -> 0.75; with score >= 0.75 only the first counts
    assert m["AR"][:, 0].tolist() == pytest.approx([0.75, 0.5])
    # Counts (tp, fp, fn): IoU .5 / score >= 0: 2, 1, 0; IoU .5 / score >= .75: 1, 1, 1;
    # IoU .75 / score >= 0: 1, 2, 1
    assert m["counts"][0, 0, 0].tolist() == [2, 1, 0]
    assert m["counts"][0, 1, 0].tolist() == [1, 1, 1]
    assert m["counts"][1, 0, 0].tolist() == [1, 2, 1]
    assert m["counts"][0, 0, 1].tolist() == [0, 1, 0]   # the ghost label: one false positive
    # the crowd flag of gt A plays no part: the same numbers without it
    plain = copy.deepcopy(dataset)
    plain["annotations"][0]["iscrowd"] = 0
    again = valor_metrics(valor_state(plain, results, "bbox", protocol), ious, np.array([0.0, 0.75]))
    assert np.array_equal(again["AP"], m["AP"])


def test_valor_protocol_through_the_cli(tmp_path, shared_reference):
    from evalbeam.pipelines.tasks.detection import run

    base = shared_reference / "detection" / "coco_val2014_100"
    out = tmp_path / "out"
    code = run([str(a) for a in ["--groundtruths", base / "instances_val2014_100.json",
                                 "--predictions", f"fake={base / 'instances_val2014_fakebbox100_results.json'}",
                                 "--output", out, "--quiet", "--protocol", "valor",
                                 "--iou_thresholds", "0.5,0.75", "--score_thresholds", "0,0.5"]])
    assert code == 0
    records = read_jsonl(out / "metrics.jsonl")
    dataset = json.loads((base / "instances_val2014_100.json").read_text())
    results = json.loads((base / "instances_val2014_fakebbox100_results.json").read_text())
    precision, _ = switched_off_oracle(dataset, results, "bbox")
    names = {c["id"]: c["name"] for c in dataset["categories"]}
    cat_ids = sorted(names)
    aps = {(r["parameters"]["iou_threshold"], r["parameters"]["label"]): r["value"]
           for r in records if r["type"] == "AP"}
    for t, iou in ((0, 0.5), (5, 0.75)):
        for k, cid in enumerate(cat_ids):
            if (iou, names[cid]) in aps and precision[t, 0, k, 0, 0] > -1:
                assert aps[iou, names[cid]] == pytest.approx(precision[t, :, k, 0, 0].mean(), abs=1e-12)
    kinds = {r["type"] for r in records}
    assert kinds == {"AP", "mAP", "APAveragedOverIOUs", "mAPAveragedOverIOUs", "AR", "mAR",
                     "ARAveragedOverScores", "mARAveragedOverScores", "Counts", "Precision",
                     "Recall", "F1", "PrecisionRecallCurve", "InterpolatedPrecisionRecallCurve",
                     "DetailedPrecisionRecallCurve", "ConfusionMatrix"}
    # Counts at score threshold 0 and IoU 0.5: tp is pycocotools' final recall times the gts
    counts = {(r["parameters"]["iou_threshold"], r["parameters"]["score_threshold"],
               r["parameters"]["label"]): r["value"] for r in records if r["type"] == "Counts"}
    _, recall = switched_off_oracle(dataset, [r for r in results if r["score"] > 0], "bbox")
    for k, cid in enumerate(cat_ids):
        key = (0.5, 0.0, names[cid])
        if key in counts and recall[0, k, 0, 0] > -1:
            n_gt = counts[key]["tp"] + counts[key]["fn"]
            assert counts[key]["tp"] == round(recall[0, k, 0, 0] * n_gt)
    curve = next(r for r in records if r["type"] == "PrecisionRecallCurve")
    assert curve["parameters"] == {"pr_curve_iou_threshold": 0.5}
    person = curve["value"]["person"]
    assert person["0.5"]["tp"] == counts[0.5, 0.5, "person"]["tp"]
    assert [person[k]["tp"] for k in sorted(person, key=float)] == sorted(
        (person[k]["tp"] for k in person), reverse=True)
    info = json.loads((out / "run.json").read_text())
    assert info["options"]["protocol"] == "valor" and info["options"]["iou_thresholds"] == [0.5, 0.75]


def test_detailed_curve_by_hand_and_against_the_pr_curve(tmp_path):
    """The hand-computed case again, through the CLI: label a has detections 0.9 (takes gt A),
    0.8 (overlaps nothing: a hallucination) and 0.7 (takes gt B at IoU 0.6); the "ghost" detection
    0.6 lies on gt A (another label): a misclassification, and gt A's misclassification once its
    own detection falls below the threshold while the ghost still counts."""
    from evalbeam.pipelines.tasks.detection import run

    dataset = {"images": [{"id": 1, "height": 100, "width": 100}],
               "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "ghost"}],
               "annotations": [
                   {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "area": 100},
                   {"id": 2, "image_id": 1, "category_id": 1, "bbox": [50, 50, 10, 10], "area": 100}]}
    results = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.9},
               {"image_id": 1, "category_id": 1, "bbox": [80, 80, 5, 5], "score": 0.8},
               {"image_id": 1, "category_id": 1, "bbox": [50, 50, 10, 6], "score": 0.7},
               {"image_id": 1, "category_id": 2, "bbox": [0, 0, 10, 10], "score": 0.6}]
    (tmp_path / "gt.json").write_text(json.dumps(dataset))
    (tmp_path / "dt.json").write_text(json.dumps(results))
    assert run([str(a) for a in ["--groundtruths", tmp_path / "gt.json", "--predictions",
                                 f"m={tmp_path / 'dt.json'}", "--output", tmp_path / "out", "--quiet",
                                 "--protocol", "valor", "--iou_thresholds", "0.5",
                                 "--pr_curve_thresholds", "0.55,0.65,0.75,0.85,0.95",
                                 "--max_examples", "3"]]) == 0
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    detailed = next(r for r in records if r["type"] == "DetailedPrecisionRecallCurve")["value"]
    curve = next(r for r in records if r["type"] == "PrecisionRecallCurve")["value"]

    def counts(label, threshold):
        point = detailed[label][threshold]
        fp, fn = point["fp"]["observations"], point["fn"]["observations"]
        return (point["tp"]["total"], fp["misclassifications"]["count"], fp["hallucinations"]["count"],
                fn["misclassifications"]["count"], fn["missed_detections"]["count"])

    assert counts("a", "0.55") == (2, 0, 1, 0, 0)
    assert counts("ghost", "0.55") == (0, 1, 0, 0, 0)
    assert counts("a", "0.65") == (2, 0, 1, 0, 0) and counts("ghost", "0.65") == (0, 0, 0, 0, 0)
    assert counts("a", "0.75") == (1, 0, 1, 0, 1)
    assert counts("a", "0.95") == (0, 0, 0, 0, 2)
    # totals agree with the PR curve at the same IoU threshold
    for label in ("a", "ghost"):
        for threshold, point in detailed[label].items():
            assert (point["tp"]["total"], point["fp"]["total"], point["fn"]["total"]) == (
                curve[label][threshold]["tp"], curve[label][threshold]["fp"], curve[label][threshold]["fn"])
    hallucination = detailed["a"]["0.55"]["fp"]["observations"]["hallucinations"]["examples"]
    assert hallucination == [{"datum_uid": "1", "score": 0.8, "geometry": {
        "type": "Polygon", "coordinates": [[[80.0, 80.0], [85.0, 80.0], [85.0, 85.0], [80.0, 85.0], [80.0, 80.0]]]}}]
    missed = detailed["a"]["0.95"]["fn"]["observations"]["missed_detections"]["examples"]
    assert len(missed) == 2 and all(set(e) == {"datum_uid", "geometry"} for e in missed)
