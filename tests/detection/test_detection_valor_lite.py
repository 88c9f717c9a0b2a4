"""The valor protocol against valor-lite (the reference implementation of Valor's metrics) on
random native box datasets: every scalar metric, Counts and the ConfusionMatrix; plus the
ConfusionMatrix's one-to-one rule and its examples by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import MULTIPROCESS, read_jsonl, write_jsonl

valor_lite = pytest.importorskip("valor_lite.object_detection",
                                 reason="valor-lite (a test extra) is the oracle of these tests")

LABELS = ["cat", "dog", "bird", "fish", "cow"]
IOUS = [0.3, 0.5, 0.75]
SCORES = [0.0, 0.25, 0.5, 0.8]


def run_detection(*args) -> int:
    from evalbeam.pipelines.tasks.detection import run

    return run([str(a) for a in args])


def random_rows(seed: int, tied: bool):
    """Native rows: jittered detections of each object (sometimes with another label), random
    false positives, datums without ground truth or without predictions. Scores are distinct
    unless tied (then two decimals, many ties)."""
    rng = np.random.default_rng(seed)
    gt_rows, pred_rows = [], []
    for i in range(40):
        uid = f"img-{i:03d}"
        gts, preds = [], []
        for _ in range(int(rng.integers(0, 6))):
            x, y = (float(v) for v in rng.uniform(0, 150, 2))
            w, h = (float(v) for v in rng.uniform(4, 50, 2))
            label = LABELS[int(rng.integers(0, 4))]          # "cow" is never ground truth
            gts.append({"label": label, "bbox": [x, y, x + w, y + h]})
            for _ in range(int(rng.integers(0, 3))):
                dx, dy = (float(v) for v in rng.uniform(-8, 8, 2))
                guess = label if rng.random() < 0.7 else LABELS[int(rng.integers(0, 5))]
                preds.append({"label": guess, "bbox": [x + dx, y + dy, x + dx + w, y + dy + h]})
        for _ in range(int(rng.integers(0, 4))):
            x, y = (float(v) for v in rng.uniform(0, 150, 2))
            preds.append({"label": LABELS[int(rng.integers(0, 5))], "bbox": [x, y, x + 25, y + 25]})
        for p in preds:
            score = float(rng.uniform(0.001, 1))
            p["score"] = round(score, 1) if tied else score
        if i % 13 == 5:
            preds = []                                       # no predictions at all
        gt_rows.append({"datum_uid": uid, "annotations": gts})
        if i % 11 != 7:                                      # and no prediction row at all
            pred_rows.append({"datum_uid": uid, "annotations": preds})
    return gt_rows, pred_rows


def valor_lite_evaluator(gt_rows, pred_rows):
    from valor_lite.object_detection import BoundingBox, Detection

    def box(uid, a, scored):
        xmin, ymin, xmax, ymax = a["bbox"]
        return BoundingBox(uid=uid, xmin=xmin, xmax=xmax, ymin=ymin, ymax=ymax, labels=[a["label"]],
                           scores=[a["score"]] if scored else [])

    predictions = {r["datum_uid"]: r["annotations"] for r in pred_rows}
    detections = []
    for row in gt_rows:
        uid = row["datum_uid"]
        detections.append(Detection(
            uid=uid,
            groundtruths=[box(f"{uid}/g{i}", a, False) for i, a in enumerate(row["annotations"])],
            predictions=[box(f"{uid}/p{i}", a, True) for i, a in enumerate(predictions.get(uid, []))]))
    loader = valor_lite.Loader.in_memory()
    loader.add_bounding_boxes(detections)
    return loader.finalize()


def comparable(record: dict):
    """(type, parameters as a hashable key) of a metric record."""
    params = {k: v for k, v in record["parameters"].items() if k != "max_examples"}
    return record["type"], json.dumps(params, sort_keys=True)


SCALARS = {"AP", "mAP", "APAveragedOverIOUs", "mAPAveragedOverIOUs", "AR", "mAR",
           "ARAveragedOverScores", "mARAveragedOverScores", "Counts", "Precision", "Recall", "F1",
           "ConfusionMatrix"}


@pytest.mark.parametrize("seed,tied", [(0, False), (1, False), (2, False), (3, True), (4, True)])
def test_valor_records_equal_valor_lite(tmp_path, seed, tied):
    gt_rows, pred_rows = random_rows(seed, tied)
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "pd.jsonl", pred_rows)
    out = tmp_path / "out"
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                         "--output", out, "--quiet", "--iou_thresholds", ",".join(map(str, IOUS)),
                         "--score_thresholds", ",".join(map(str, SCORES)), "--max_examples", "0") == 0
    ours = {comparable(r): r["value"] for r in read_jsonl(out / "metrics.jsonl") if r["type"] in SCALARS}

    evaluator = valor_lite_evaluator(gt_rows, pred_rows)
    expected = {}
    for metrics in evaluator.compute_precision_recall(IOUS, SCORES).values():
        for m in metrics:
            d = m.to_dict()
            if d["type"] in SCALARS:
                expected[comparable(d)] = d["value"]
    for m in evaluator.compute_confusion_matrix(IOUS, SCORES):
        d = m.to_dict()
        expected[comparable(d)] = d["value"]

    assert set(ours) == set(expected)
    for key, value in expected.items():
        if isinstance(value, float):
            # AP under tied scores: valor-lite breaks ties by IoU, the coco order by input order
            if tied and key[0] in ("AP", "mAP", "APAveragedOverIOUs", "mAPAveragedOverIOUs"):
                continue
            assert ours[key] == pytest.approx(value, abs=1e-12), key
        else:
            assert ours[key] == value, key


def square(x, y, size=10.0):
    return [x, y, x + size, y + size]


def test_confusion_matrix_by_hand(tmp_path):
    """Datum d1: gt A (cat) at (0,0); gt B (dog) at (20,0).
    p1 dog 0.9 on A (IoU 1)   -> takes A: a cat->dog misclassification
    p2 cat 0.8 on A (IoU 1)   -> A is taken; overlaps nothing else: an unmatched prediction
    p3 dog 0.7 on B shifted 4 (IoU 6/14 = 0.43) -> takes B: dog->dog at IoU 0.3, but at 0.5 the
       pair does not count: B is an unmatched ground truth and p3 an unmatched prediction.
    Datum d2: gt C (cat), no predictions -> unmatched ground truth.
    At score threshold 0.75, p3 does not count at all (B unmatched, p3 not a prediction)."""
    gt_rows = [{"datum_uid": "d1", "annotations": [{"label": "cat", "bbox": square(0, 0)},
                                                   {"label": "dog", "bbox": square(20, 0)}]},
               {"datum_uid": "d2", "annotations": [{"label": "cat", "bbox": square(0, 0)}]}]
    pred_rows = [{"datum_uid": "d1", "annotations": [
        {"label": "dog", "score": 0.9, "bbox": square(0, 0)},
        {"label": "cat", "score": 0.8, "bbox": square(0, 0)},
        {"label": "dog", "score": 0.7, "bbox": square(24, 0)}]}]
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "pd.jsonl", pred_rows)
    out = tmp_path / "out"
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                         "--output", out, "--quiet", "--iou_thresholds", "0.3,0.5",
                         "--score_thresholds", "0.5,0.75", "--max_examples", "2", *MULTIPROCESS) == 0
    cms = {(r["parameters"]["iou_threshold"], r["parameters"]["score_threshold"]): r["value"]
           for r in read_jsonl(out / "metrics.jsonl") if r["type"] == "ConfusionMatrix"}

    def counts(value):
        return ({g: {p: c["count"] for p, c in row.items()} for g, row in value["confusion_matrix"].items()},
                {k: c["count"] for k, c in value["unmatched_ground_truths"].items()},
                {k: c["count"] for k, c in value["unmatched_predictions"].items()})

    assert counts(cms[0.3, 0.5]) == ({"cat": {"cat": 0, "dog": 1}, "dog": {"cat": 0, "dog": 1}},
                                     {"cat": 1, "dog": 0}, {"cat": 1, "dog": 0})
    assert counts(cms[0.5, 0.5]) == ({"cat": {"cat": 0, "dog": 1}, "dog": {"cat": 0, "dog": 0}},
                                     {"cat": 1, "dog": 1}, {"cat": 1, "dog": 1})
    assert counts(cms[0.3, 0.75]) == ({"cat": {"cat": 0, "dog": 1}, "dog": {"cat": 0, "dog": 0}},
                                      {"cat": 1, "dog": 1}, {"cat": 1, "dog": 0})
    value = cms[0.5, 0.5]
    box = {"type": "Polygon", "coordinates": [[[0.0, 0.0], [10.0, 0.0], [10.0, 10.0], [0.0, 10.0], [0.0, 0.0]]]}
    assert value["confusion_matrix"]["cat"]["dog"]["examples"] == [
        {"datum_uid": "d1", "score": 0.9, "groundtruth": box, "prediction": box}]
    assert value["unmatched_predictions"]["cat"]["examples"] == [
        {"datum_uid": "d1", "score": 0.8, "geometry": box}]
    assert sorted(e["datum_uid"] for e in value["unmatched_ground_truths"]["cat"]["examples"]) == ["d2"]
    assert [e["datum_uid"] for e in value["unmatched_ground_truths"]["dog"]["examples"]] == ["d1"]
    assert value["confusion_matrix"]["dog"]["dog"] == {"count": 0, "examples": []}


def test_one_to_one_rule():
    """Score first, then IoU, then ground-truth and prediction positions; labels ignored."""
    from evalbeam.transforms.kernels.detection_confusion import one_to_one

    score = np.array([0.9, 0.9, 0.5])
    # pairs: (d0,g0,.6) (d0,g1,.7) (d1,g0,.8) (d2,g1,.9) (d1,g1,1e-12: never)
    d = np.array([0, 0, 1, 2, 1])
    g = np.array([0, 1, 0, 1, 1])
    iou = np.array([0.6, 0.7, 0.8, 0.9, 1e-12])
    # ranked: (d1,g0,.8) taken; (d0,g1,.7) taken; (d0,g0) no; (d2,g1) no (g1 used)
    assert one_to_one(d, g, iou, score).tolist() == [1, 2]
    # ties in score and IoU: the smaller ground-truth position, then prediction position first
    assert one_to_one(np.array([0, 0]), np.array([1, 0]), np.array([0.5, 0.5]),
                      np.array([0.7])).tolist() == [1]
    assert one_to_one(np.array([1, 0]), np.array([0, 0]), np.array([0.5, 0.5]),
                      np.array([0.7, 0.7])).tolist() == [1]
    assert one_to_one(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), score).tolist() == []
