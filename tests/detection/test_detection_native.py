"""Native detection rows (JSONL/Parquet, boxes): same numbers as the COCO files they mirror,
bad rows rejected with their line, Parquet equal to JSONL."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalbeam.pipelines.launch.common import local_pipeline
from helpers import MULTIPROCESS, read_jsonl, write_jsonl


def run_detection(*args) -> int:
    from evalbeam.pipelines.tasks.detection import run

    return run([str(a) for a in args])


def make_dataset(seed: int):
    """COCO dicts with integer boxes (exact xyxy <-> xywh) and distinct scores (no ties, so
    the order of datums cannot matter), plus the same data as native rows."""
    rng = np.random.default_rng(seed)
    labels = ["cat", "dog", "bird", "fish", "cow"]
    images, anns, results, gt_rows, pred_rows = [], [], [], [], []
    scores = iter(rng.permutation(10_000)[:5000] / 10_000 + 1e-5)
    for image_id in range(1, 31):
        images.append({"id": image_id, "height": 200, "width": 200})
        gt_row = {"datum_uid": f"img-{image_id:03d}", "metadata": {"site": "ab"[image_id % 2]},
                  "annotations": []}
        pred_row = {"datum_uid": gt_row["datum_uid"], "annotations": []}
        for _ in range(int(rng.integers(0, 6))):
            x, y = (int(v) for v in rng.integers(0, 150, 2))
            w, h = (int(v) for v in rng.integers(4, 50, 2))
            label = int(rng.integers(0, 4))           # "cow" is never ground truth
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": label + 1,
                         "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
            gt_row["annotations"].append({"label": labels[label], "bbox": [x, y, x + w, y + h]})
            for _ in range(int(rng.integers(0, 3))):   # jittered detections of this object
                dx, dy = (int(v) for v in rng.integers(-6, 7, 2))
                guess = label if rng.random() < 0.8 else int(rng.integers(0, 5))
                score = float(next(scores))
                box = [x + dx, y + dy, w, h]
                results.append({"image_id": image_id, "category_id": guess + 1, "bbox": box, "score": score})
                pred_row["annotations"].append({"label": labels[guess], "score": score,
                                                "bbox": [box[0], box[1], box[0] + w, box[1] + h]})
        for _ in range(int(rng.integers(0, 4))):       # random false positives
            x, y = (int(v) for v in rng.integers(0, 150, 2))
            guess, score = int(rng.integers(0, 5)), float(next(scores))
            results.append({"image_id": image_id, "category_id": guess + 1, "bbox": [x, y, 20, 20],
                            "score": score})
            pred_row["annotations"].append({"label": labels[guess], "score": score,
                                            "bbox": [x, y, x + 20, y + 20]})
        gt_rows.append(gt_row)
        pred_rows.append(pred_row)
    coco = {"images": images, "annotations": anns,
            "categories": [{"id": i + 1, "name": n} for i, n in enumerate(labels)]}
    return coco, results, gt_rows, pred_rows


def strip_examples(value):
    """The detailed curve without its examples (COCO images are named by id, native datums by uid)."""
    if isinstance(value, dict):
        return {k: strip_examples(v) for k, v in value.items() if k != "examples"}
    return value


def by_key(records):
    return {(r["type"], json.dumps(r["parameters"], sort_keys=True), json.dumps(r["slice"])): r["value"]
            for r in records}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_rows_give_the_numbers_of_the_same_coco_files(tmp_path, seed):
    coco, results, gt_rows, pred_rows = make_dataset(seed)
    (tmp_path / "gt.json").write_text(json.dumps(coco))
    (tmp_path / "dt.json").write_text(json.dumps(results))
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "m.jsonl", pred_rows)
    common = ["--quiet", "--iou_thresholds", "0.5,0.75", "--score_thresholds", "0.3,0.6"]
    assert run_detection("--groundtruths", tmp_path / "gt.json", "--predictions", f"m={tmp_path / 'dt.json'}",
                         "--output", tmp_path / "coco", "--protocol", "valor", *common) == 0
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                         "--output", tmp_path / "native", *common) == 0   # valor is the default
    coco_records = by_key(read_jsonl(tmp_path / "coco" / "metrics.jsonl"))
    native_records = by_key(read_jsonl(tmp_path / "native" / "metrics.jsonl"))
    assert set(coco_records) == set(native_records)
    for key, value in coco_records.items():
        if key[0] in ("DetailedPrecisionRecallCurve", "ConfusionMatrix"):  # examples name datums differently
            assert strip_examples(native_records[key]) == strip_examples(value)
        elif isinstance(value, dict):
            assert native_records[key] == value, key
        else:  # means over labels may add in another order
            assert native_records[key] == pytest.approx(value, abs=1e-12), key
    ap = {k: v for k, v in native_records.items() if k[0] == "AP"}
    assert any(v > 0 for v in ap.values())
    assert native_records[("AP", json.dumps({"iou_threshold": 0.5, "label": "cow"}, sort_keys=True), "{}")] == 0.0


def test_native_parquet_slices_and_multiprocess(tmp_path):
    _, _, gt_rows, pred_rows = make_dataset(3)
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "m.jsonl", pred_rows)
    pq.write_table(pa.Table.from_pylist(gt_rows), tmp_path / "gt.parquet")
    pq.write_table(pa.Table.from_pylist(pred_rows), tmp_path / "m.parquet")
    write_jsonl(tmp_path / "gt_shuffled.jsonl", gt_rows[::-1])
    write_jsonl(tmp_path / "m_shuffled.jsonl", pred_rows[1::2] + pred_rows[::2])
    outputs = []
    for name, gt, pred, extra in [("a", "gt.jsonl", "m.jsonl", ["--num_shards", "1"]),
                                  ("b", "gt.parquet", "m.parquet", ["--num_shards", "5"]),
                                  ("c", "gt.jsonl", "m.jsonl", ["--num_shards", "3", *MULTIPROCESS]),
                                  ("d", "gt_shuffled.jsonl", "m_shuffled.jsonl", ["--num_shards", "2"])]:
        assert run_detection("--groundtruths", tmp_path / gt, "--predictions", f"m={tmp_path / pred}",
                             "--output", tmp_path / name, "--quiet", "--slice", "site",
                             "--iou_thresholds", "0.5", *extra) == 0
        outputs.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3]
    slices = {json.dumps(r["slice"]) for r in read_jsonl(tmp_path / "a" / "metrics.jsonl")}
    assert slices == {"{}", '{"site": "a"}', '{"site": "b"}'}


def test_bad_native_rows(tmp_path):
    gt = [
        {"datum_uid": "a", "annotations": [{"label": "cat", "bbox": [0, 0, 10, 10]}]},
        "{broken",
        {"datum_uid": "", "annotations": []},
        {"datum_uid": "b", "annotations": [{"label": "cat", "bbox": [10, 0, 5, 10]}]},
        {"datum_uid": "c", "annotations": [{"label": "cat", "raster": {"size": [2, 2], "counts": "03"}}]},
        {"datum_uid": "d", "annotations": [{"bbox": [0, 0, 1, 1]}]},
        {"datum_uid": "e", "annotations": [{"label": "cat", "bbox": [0, 0, 10, 10]}]},
        {"datum_uid": "e", "annotations": []},
        {"datum_uid": "f"},
    ]
    preds = [
        {"datum_uid": "a", "annotations": [{"label": "cat", "score": 0.9, "bbox": [0, 0, 10, 10]}]},
        {"datum_uid": "a2", "annotations": [{"label": "cat", "score": 0.9, "bbox": [0, 0, 10, 10]}]},
        {"datum_uid": "a", "annotations": [{"label": "cat", "score": 1.2, "bbox": [0, 0, 10, 10]}]},
        {"datum_uid": "e", "annotations": []},
    ]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    code = run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                         "--output", tmp_path / "out", "--quiet")
    assert code == 1
    found = sorted((r["source"], r["line"], r["reason"]) for r in read_jsonl(tmp_path / "out" / "rejected.jsonl"))
    assert found == [
        ("groundtruths", 2, "malformed JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("groundtruths", 3, "missing or empty datum_uid"),
        ("groundtruths", 4, "annotation 0: bbox has xmax < xmin or ymax < ymin"),
        ("groundtruths", 5, "annotation 0: raster: RLE run lengths must be non-negative and add up to height * width = 4"),
        ("groundtruths", 6, "annotation 0: no label (a non-empty string)"),
        ("groundtruths", 7, "datum_uid appears 2 times in groundtruths"),
        ("groundtruths", 8, "datum_uid appears 2 times in groundtruths"),
        ("groundtruths", 9, "missing annotations"),
        ("m", 2, "no valid ground truth for this datum_uid"),
        ("m", 3, "annotation 0: score 1.2 is not a number in [0, 1]"),
        ("m", 4, "no valid ground truth for this datum_uid"),
    ]
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"] == {"groundtruths": {"rows_read": 9, "rows_evaluated": 1, "rows_rejected": 8},
                              "m": {"rows_read": 4, "rows_evaluated": 1, "rows_rejected": 3}}
    ap = [r for r in read_jsonl(tmp_path / "out" / "metrics.jsonl") if r["type"] == "AP"]
    # the one valid detection is exact: AP is 1 up to the eps of pycocotools' precision formula
    assert ap and all(r["value"] == pytest.approx(1.0, abs=1e-12) for r in ap)


def test_native_globs_and_rejects_name_their_file(tmp_path):
    _, _, gt_rows, pred_rows = make_dataset(4)
    write_jsonl(tmp_path / "one" / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "one" / "m.jsonl", pred_rows)
    assert run_detection("--groundtruths", tmp_path / "one" / "gt.jsonl", "--predictions",
                         tmp_path / "one" / "m.jsonl", "--output", tmp_path / "a", "--quiet",
                         "--iou_thresholds", "0.5") == 0
    # the same rows over two files each, plus a repeated datum and an orphan prediction in file 2
    write_jsonl(tmp_path / "two" / "gt-1.jsonl", gt_rows[:12])
    write_jsonl(tmp_path / "two" / "gt-2.jsonl", gt_rows[12:] + [{"datum_uid": "dup", "annotations": []},
                                                                 {"datum_uid": "dup", "annotations": []}])
    write_jsonl(tmp_path / "two" / "m-1.jsonl", pred_rows[:20])
    write_jsonl(tmp_path / "two" / "m-2.jsonl", pred_rows[20:] + [{"datum_uid": "nowhere", "annotations": []}])
    code = run_detection("--groundtruths", tmp_path / "two" / "gt-*.jsonl", "--predictions",
                         f"m={tmp_path / 'two' / 'm-*.jsonl'}", "--output", tmp_path / "b", "--quiet",
                         "--iou_thresholds", "0.5", "--max_rejected_fraction", "0.1")
    assert code == 0
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (tmp_path / "b" / "metrics.jsonl").read_bytes()
    found = sorted((r["file"].rsplit("/", 1)[-1], r["line"], r["reason"])
                   for r in read_jsonl(tmp_path / "b" / "rejected.jsonl"))
    assert found == [("gt-2.jsonl", 19, "datum_uid appears 2 times in groundtruths"),
                     ("gt-2.jsonl", 20, "datum_uid appears 2 times in groundtruths"),
                     ("m-2.jsonl", 11, "no valid ground truth for this datum_uid")]


def rectangles_as_polygons(rows):
    out = json.loads(json.dumps(rows))
    for row in out:
        for ann in row["annotations"]:
            x1, y1, x2, y2 = ann.pop("bbox")
            ann["polygon"] = [[x1, y1], [x2, y1], [x2, y2], [x1, y2]]
    return out


def test_rectangle_polygons_give_the_box_numbers(tmp_path):
    """Polygons are compared by exact area (shapely): rectangles must give the boxes' numbers."""
    _, _, gt_rows, pred_rows = make_dataset(5)
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "m.jsonl", pred_rows)
    write_jsonl(tmp_path / "gt-poly.jsonl", rectangles_as_polygons(gt_rows))
    write_jsonl(tmp_path / "m-poly.jsonl", rectangles_as_polygons(pred_rows))
    common = ["--quiet", "--iou_thresholds", "0.5,0.75", "--score_thresholds", "0.2"]
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", f"m={tmp_path / 'm.jsonl'}",
                         "--output", tmp_path / "box", *common) == 0
    assert run_detection("--groundtruths", tmp_path / "gt-poly.jsonl", "--predictions",
                         f"m={tmp_path / 'm-poly.jsonl'}", "--output", tmp_path / "poly",
                         "--iou_type", "segm", *common) == 0
    assert by_key(read_jsonl(tmp_path / "box" / "metrics.jsonl")) == by_key(
        read_jsonl(tmp_path / "poly" / "metrics.jsonl"))


def test_polygon_iou_by_hand_and_bad_polygons(tmp_path):
    """Ground truth: the square (0,0)-(4,4); prediction: the triangle (0,0),(4,0),(0,4), area 8,
    inside it: IoU = 8 / 16 = 0.5, a true positive at IoU 0.5 and a miss at 0.55."""
    gt = [{"datum_uid": "a", "annotations": [{"label": "x", "polygon": [[0, 0], [4, 0], [4, 4], [0, 4]]}]},
          {"datum_uid": "b", "annotations": [{"label": "x", "polygon": [[0, 0], [4, 4], [4, 0], [0, 4]]}]},
          {"datum_uid": "c", "annotations": [{"label": "x", "polygon": [[0, 0], [1, 1]]}]},
          {"datum_uid": "d", "annotations": [{"label": "x", "raster": {"size": [2, 2], "counts": "0~"}}]}]
    preds = [{"datum_uid": "a", "annotations": [{"label": "x", "score": 0.9,
                                                 "polygon": [[0, 0], [4, 0], [0, 4]]}]}]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    code = run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                         "--output", tmp_path / "out", "--quiet", "--iou_type", "segm",
                         "--iou_thresholds", "0.5,0.55", "--max_rejected_fraction", "0.8")
    assert code == 0
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    ap = {r["parameters"]["iou_threshold"]: r["value"] for r in records if r["type"] == "AP"}
    assert ap[0.5] == pytest.approx(1.0, abs=1e-12) and ap[0.55] == 0.0
    reasons = sorted((r["line"], r["reason"]) for r in read_jsonl(tmp_path / "out" / "rejected.jsonl"))
    assert reasons == [
        (2, "annotation 0: polygon is not valid (it crosses itself or its rings overlap)"),
        (3, "annotation 0: polygon must be [[x, y], ...] with at least 3 finite points (or rings / polygons)"),
        (4, "annotation 0: raster: RLE \"counts\" is not a valid compressed COCO RLE string"),
    ]


def test_evaluate_detection_ptransform_matches_the_cli(tmp_path):
    """EvaluateDetection on PCollections of native rows gives the CLI's records; a bad row comes
    back as a reject without file position."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from evalbeam.transforms.detection import EvaluateDetection
    from evalbeam.transforms.kernels.detection import DetectionConfig, Protocol

    _, _, gt_rows, pred_rows = make_dataset(6)
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "m.jsonl", pred_rows)
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", f"m={tmp_path / 'm.jsonl'}",
                         "--output", tmp_path / "out", "--quiet", "--iou_thresholds", "0.5,0.75") == 0
    expected = sorted(json.dumps(r, sort_keys=True) for r in read_jsonl(tmp_path / "out" / "metrics.jsonl"))
    protocol = Protocol("valor", iou_thresholds=(0.5, 0.75))

    with local_pipeline() as p:
        records, rejected, _, _ = ({"groundtruths": p | "G" >> beam.Create(gt_rows),
                                    "m": p | "M" >> beam.Create(pred_rows + [{"datum_uid": "x"}])}
                                   | EvaluateDetection(DetectionConfig(protocol=protocol),
                                                       with_diagnostics=True))

        def same_records(found):
            assert sorted(json.dumps(r, sort_keys=True) for r in found) == expected

        def one_reject(found):
            assert [(r["source"], r["row"], r["reason"]) for r in found] == [("m", None, "missing annotations")]

        assert_that(records, same_records, label="records")
        assert_that(rejected, one_reject, label="rejects")
