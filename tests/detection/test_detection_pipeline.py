"""`evalbeam detection` end to end: the shared conformance cases, bad input, outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import read_jsonl, run_cli_subprocess

STAT_NAMES = ("AP", "AP50", "AP75", "APsmall", "APmedium", "APlarge",
              "AR1", "AR10", "AR100", "ARsmall", "ARmedium", "ARlarge")


def detection(tmp_path, gt, predictions: dict, *extra) -> tuple[int, list[dict]]:
    from evalbeam.pipelines.tasks.detection import run

    out = tmp_path / "out"
    args = ["--groundtruths", gt, "--output", out, "--quiet", *extra]
    for name, path in predictions.items():
        args += ["--predictions", f"{name}={path}"]
    code = run([str(a) for a in args])
    records = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    return code, records


def summary(records, model, slice_value=None) -> list[float]:
    for r in records:
        if r["type"] == "COCOSummary" and r["model"] == model and r["slice"] == (slice_value or {}):
            return [r["value"][n] for n in STAT_NAMES]
    raise AssertionError(f"no COCOSummary for {model}")


# ----------------------------------------------------------------------------- conformance

VAL2014_BBOX = [0.5045806987249628, 0.6969727247299577, 0.5729816669904824, 0.5856257209410443,
                0.5193996948036719, 0.5013978986347466, 0.38681277964578054, 0.5936795762842003,
                0.595352982877607, 0.6398109626113442, 0.5664205978994309, 0.5642905982905982]
VAL2014_SEGM = [0.3195452758576433, 0.5622883972521636, 0.29892653412086784, 0.3873740315997838,
                0.31018272403369485, 0.3269339071005138, 0.2682297225711534, 0.41544868114906375,
                0.4168394992198818, 0.4694498622754236, 0.37675922666197265, 0.3814715099715099]


@pytest.mark.parametrize("iou_type, results, expected", [
    ("bbox", "instances_val2014_fakebbox100_results.json", VAL2014_BBOX),
    ("segm", "instances_val2014_fakesegm100_results.json", VAL2014_SEGM),
])
def test_val2014_subset_matches_the_official_numbers(tmp_path, shared_reference, iou_type, results,
                                                      expected):
    base = shared_reference / "detection" / "coco_val2014_100"
    code, records = detection(tmp_path, base / "instances_val2014_100.json",
                              {"fake": base / results}, "--iou_type", iou_type)
    assert code == 0
    np.testing.assert_allclose(summary(records, "fake"), expected, rtol=0, atol=1e-12)
    per_class = [r for r in records if r["type"] == "COCOClassSummary"]
    assert len(per_class) == 80 and {r["parameters"]["label"] for r in per_class} >= {"person", "dog"}


def test_faster_coco_eval_toy_segm(tmp_path, shared_reference):
    from pycocotools import mask as mask_utils

    base = shared_reference / "detection" / "faster_coco_eval_toy"
    gt = json.loads((base / "gt_dataset.json").read_text())
    sizes = {im["id"]: (im["height"], im["width"]) for im in gt["images"]}
    results = []
    for d in json.loads((base / "dt_dataset.json").read_text()):  # rasterised, bbox dropped
        h, w = sizes[d["image_id"]]
        rle = mask_utils.merge(mask_utils.frPyObjects(d["segmentation"], h, w))
        rle["counts"] = rle["counts"].decode("ascii")
        results.append({"image_id": d["image_id"], "category_id": d["category_id"],
                        "segmentation": rle, "score": d["score"]})
    (tmp_path / "dt.json").write_text(json.dumps(results))
    code, records = detection(tmp_path, base / "gt_dataset.json", {"toy": tmp_path / "dt.json"},
                              "--iou_type", "segm")
    assert code == 0
    expected = [0.6947194719471946, 0.6947194719471946, 0.6947194719471946, -1, 0.7367986798679867,
                0.0, 0.6666666666666666, 0.75, 0.75, -1, 0.7916666666666666, 0.0]
    np.testing.assert_allclose(summary(records, "toy"), expected, rtol=0, atol=1e-12)


def torchmetrics_as_coco(case: dict) -> tuple[dict, list]:
    """The torchmetrics case in COCO form: xyxy -> xywh, area = w * h, detections in listed order."""
    image_ids = [42, 73, 74, 987]
    labels = sorted({l for im in case["images"] for part in ("pred", "target") for l in im[part]["labels"]})
    gt = {"images": [{"id": i, "height": 1000, "width": 1000} for i in image_ids],
          "categories": [{"id": l, "name": str(l)} for l in labels], "annotations": []}
    results = []
    for image_id, im in zip(image_ids, case["images"]):
        for box, label in zip(im["target"]["boxes"], im["target"]["labels"]):
            x1, y1, x2, y2 = box
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": image_id,
                                      "category_id": label, "bbox": [x1, y1, x2 - x1, y2 - y1],
                                      "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
        for box, label, score in zip(im["pred"]["boxes"], im["pred"]["labels"], im["pred"]["scores"]):
            x1, y1, x2, y2 = box
            results.append({"image_id": image_id, "category_id": label,
                            "bbox": [x1, y1, x2 - x1, y2 - y1], "score": score})
    return gt, results


def test_torchmetrics_case_and_its_tie(tmp_path, shared_reference):
    case = json.loads((shared_reference / "detection" / "torchmetrics_inputs_bbox.json").read_text())
    gt, results = torchmetrics_as_coco(case)
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "dt.json").write_text(json.dumps(results))
    code, records = detection(tmp_path, tmp_path / "gt.json", {"tm": tmp_path / "dt.json"})
    assert code == 0
    verified = case["verified_here_pycocotools_2_0_11"]
    np.testing.assert_allclose(summary(records, "tm"), verified["stats"], rtol=0, atol=1e-12)
    published = case["expected_pycocotools"]
    keys = ["map", "map_50", "map_75", "map_small", "map_medium", "map_large",
            "mar_1", "mar_10", "mar_100", "mar_small", "mar_medium", "mar_large"]
    np.testing.assert_allclose(summary(records, "tm"), [published[k] for k in keys], atol=5e-4)
    per_class = {r["parameters"]["label"]: r["value"]["AP"] for r in records
                 if r["type"] == "COCOClassSummary"}
    for label, value in verified["map_per_class"].items():
        assert per_class[label] == pytest.approx(value, abs=5e-4 if label in ("0", "1", "2") else 1e-12)


# ----------------------------------------------------------------------------- bad input

def test_bad_coco_rows_are_rejected_with_their_position(tmp_path):
    gt = {"images": [{"id": 1, "height": 100, "width": 100}, {"id": 2, "height": 100, "width": 100},
                     {"id": "three"}],
          "categories": [{"id": 1, "name": "cat"}],
          "annotations": [
              {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400, "iscrowd": 0},
              {"id": 2, "image_id": 9, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400},
              {"id": 3, "image_id": 2, "category_id": 5, "bbox": [10, 10, 20, 20], "area": 400},
              {"id": 4, "image_id": 2, "category_id": 1, "bbox": [10, 10, 20], "area": 400},
              {"id": 5, "image_id": 2, "category_id": 1, "bbox": [10, 10, 20, 20]},
              {"id": 6, "image_id": 2, "category_id": 1, "bbox": [50, 50, 20, 20], "area": 400},
          ]}
    results = [
        {"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "score": 0.9},
        {"image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "score": 1.5},
        {"image_id": 1, "category_id": 1, "score": 0.5},
        {"image_id": 7, "category_id": 1, "bbox": [10, 10, 20, 20], "score": 0.5},
        {"image_id": 2, "category_id": 3, "bbox": [10, 10, 20, 20], "score": 0.5},
        {"image_id": 2, "category_id": 1, "bbox": [50, 50, 20, 20], "score": 0.8},
    ]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    (tmp_path / "dt.json").write_text(json.dumps(results))
    code, records = detection(tmp_path, tmp_path / "gt.json", {"m": tmp_path / "dt.json"})
    assert code == 1
    found = sorted((r["source"], r["row"], r["reason"])
                   for r in read_jsonl(tmp_path / "out" / "rejected.jsonl"))
    assert found == [
        ("groundtruths", 1, "image_id has no entry in \"images\""),
        ("groundtruths", 2, "category_id has no entry in \"categories\""),
        ("groundtruths", 2, "image: image must be an object with an integer id"),
        ("groundtruths", 3, "bbox must be [x, y, width, height] with 4 finite numbers"),
        ("groundtruths", 4, "area None is not a finite number >= 0"),
        ("m", 1, "score 1.5 is not a number in [0, 1]"),
        ("m", 2, "bbox must be [x, y, width, height] with 4 finite numbers"),
        ("m", 3, "no ground-truth image with this image_id"),
        ("m", 4, "category_id is not a ground-truth category"),
    ]
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"]["m"] == {"rows_read": 6, "rows_evaluated": 2, "rows_rejected": 4}
    # the two valid detections each match their valid ground truth exactly
    assert summary(records, "m")[1] == 1.0


def test_coco_input_errors_stop_at_once(tmp_path):
    (tmp_path / "gt.json").write_text(json.dumps([{"image_id": 1}]))
    (tmp_path / "dt.json").write_text("[]")
    result = run_cli_subprocess(["detection", "--groundtruths", tmp_path / "gt.json",
                                 "--predictions", f"m={tmp_path / 'dt.json'}", "--output", tmp_path / "o"])
    assert result.returncode == 2 and "is not an instances file" in result.stderr
    assert "Traceback" not in result.stderr


def test_image_shards_hash_each_decimal_id():
    """image_shards (each distinct id hashed once, its text from Arrow's cast) is FNV-1a 64 of
    str(image id) mod num_shards, row by row: ids at both ends of int64, repeated, unsorted,
    negative and none."""
    import pyarrow as pa

    from evalbeam.schemas.hashing import fnv1a_64
    from evalbeam.transforms.detection_reading import image_shards

    rng = np.random.default_rng(7)
    cases = [np.zeros(0, np.int64), np.array([139]),
             np.array([-2**63, 2**63 - 1, 0, -1, 2**63 - 1]),
             rng.integers(-2**63, 2**63 - 1, 500, dtype=np.int64), rng.integers(0, 40, 3000)]
    for ids in cases:
        for num_shards in (1, 3, 256):
            text = pa.array([str(i) for i in ids.tolist()], pa.string())
            expected = (fnv1a_64(text) % np.uint64(num_shards)).astype(np.int64)
            got = image_shards(ids, num_shards)
            assert got.dtype == np.int64 and got.tolist() == expected.tolist()
