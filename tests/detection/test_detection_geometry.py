"""Native geometries: raster (RLE) IoU against brute-force pixel counts, raster against polygon
(Valor's conversion) against shapely, geometry conversions per IoU type, and native raster rows
giving the numbers of the same masks in COCO files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import shapely
from pycocotools import mask as mask_utils

from helpers import read_jsonl, write_jsonl
from evalbeam.schemas.coco import rle_problem, rle_runs
from evalbeam.schemas.detection_rows import Raster, geometry_area, geometry_of
from evalbeam.transforms.kernels.masks import as_polygon, pair_geometry_iou


def raster(mask: np.ndarray) -> Raster:
    return Raster(mask_utils.encode(np.asfortranarray(mask.astype(np.uint8))))


def random_mask(rng, h, w) -> np.ndarray:
    """A blob (rectangle with holes punched at random) or pure noise."""
    mask = np.zeros((h, w), dtype=bool)
    if rng.random() < 0.3:
        return rng.random((h, w)) < rng.random()
    y0, x0 = rng.integers(0, h), rng.integers(0, w)
    mask[y0:y0 + rng.integers(1, h), x0:x0 + rng.integers(1, w)] = True
    mask &= rng.random((h, w)) < 0.9
    return mask


def brute_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 0.0


@pytest.mark.parametrize("seed", range(4))
def test_raster_iou_equals_pixel_counts(seed):
    rng = np.random.default_rng(seed)
    h, w = (int(v) for v in rng.integers(5, 40, 2))
    dts = [random_mask(rng, h, w) for _ in range(6)] + [np.zeros((h, w), bool)]
    gts = [random_mask(rng, h, w) for _ in range(5)] + [np.zeros((h, w), bool)]
    d, g = (a.ravel() for a in np.meshgrid(np.arange(len(dts)), np.arange(len(gts)), indexing="ij"))
    iou = pair_geometry_iou([raster(m) for m in dts], [raster(m) for m in gts])(d, g)
    expected = [brute_iou(dts[i], gts[j]) for i, j in zip(d, g)]
    np.testing.assert_allclose(iou, expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(geometry_area([raster(m) for m in dts]), [m.sum() for m in dts])


@pytest.mark.parametrize("seed", range(4))
def test_raster_against_polygon_is_a_polygon_iou(seed):
    """A raster against a polygon is compared as the union of its pixel squares (Valor converts
    the raster); rasters of different sizes too. Checked against shapely on pixel squares built
    independently, and against pixel counts where the polygon is a pixel-aligned rectangle."""
    rng = np.random.default_rng(seed)
    h, w = 30, 40
    masks = [random_mask(rng, h, w) for _ in range(4)]

    def squares(mask):
        ys, xs = np.nonzero(mask)
        return shapely.union_all(shapely.box(xs, ys, xs + 1, ys + 1))

    polygons = [shapely.Polygon(rng.uniform(0, 35, (3, 2))).buffer(0) for _ in range(3)]
    polygons.append(shapely.box(5, 4, 21, 17))                     # pixel-aligned
    d, g = (a.ravel() for a in np.meshgrid(np.arange(4), np.arange(4), indexing="ij"))
    iou = pair_geometry_iou([raster(m) for m in masks], polygons)(d, g)
    for value, i, j in zip(iou, d, g):
        a, b = squares(masks[i]), polygons[j]
        union = shapely.area(shapely.union(a, b))
        assert value == pytest.approx(shapely.area(shapely.intersection(a, b)) / union if union else 0, abs=1e-12)
    aligned = np.zeros((h, w), bool)
    aligned[4:17, 5:21] = True
    for i in range(4):
        assert iou[i * 4 + 3] == pytest.approx(brute_iou(masks[i], aligned), abs=1e-12)
    # different sizes: compared as pixel squares in one coordinate frame
    small = masks[0][:20, :25]
    value = pair_geometry_iou([raster(small)], [raster(masks[1])])(np.array([0]), np.array([0]))[0]
    padded = np.zeros((h, w), bool)
    padded[:20, :25] = small
    assert value == pytest.approx(brute_iou(padded, masks[1]), abs=1e-12)


def test_as_polygon_covers_exactly_the_set_pixels():
    rng = np.random.default_rng(7)
    for _ in range(20):
        mask = random_mask(rng, 25, 33)
        polygon = as_polygon(raster(mask))
        assert polygon.area == pytest.approx(mask.sum(), abs=1e-9)
        ys, xs = np.nonzero(mask)
        assert shapely.contains_xy(polygon, xs + 0.5, ys + 0.5).all()
        ys, xs = np.nonzero(~mask)
        assert not shapely.contains_xy(polygon, xs + 0.5, ys + 0.5).any()
    assert as_polygon(raster(np.zeros((3, 3), bool))).is_empty


def test_rle_runs_and_problems():
    rng = np.random.default_rng(3)
    for _ in range(100):
        mask = random_mask(rng, int(rng.integers(2, 30)), int(rng.integers(2, 30)))
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        flat = mask.ravel(order="F").astype(int)
        change = np.flatnonzero(np.diff(np.r_[0, flat, 1 - flat[-1]]))
        assert rle_runs(rle["counts"].decode()) == np.diff(np.r_[0, change]).tolist()
        assert rle_problem({"size": list(mask.shape), "counts": rle["counts"].decode()}) is None
    assert rle_problem({"size": [2, 2], "counts": [1, 2]}) is not None            # sums to 3
    assert rle_problem({"size": [2, 2], "counts": [1, -1, 4]}) is not None
    assert rle_problem({"size": [2, 2], "counts": "0~"}) is not None              # not a code
    assert rle_problem({"size": [2], "counts": "04"}) is not None
    assert rle_problem({"size": [2, 2], "counts": [0, 4]}) is None


def test_geometries_are_converted_for_the_iou_type():
    rle = mask_utils.encode(np.asfortranarray(np.pad(np.ones((2, 3), np.uint8), ((1, 0), (2, 0)))))
    ann = {"raster": {"size": [3, 5], "counts": rle["counts"].decode()}}
    assert geometry_of(ann, "bbox") == (2.0, 1.0, 5.0, 3.0)
    assert isinstance(geometry_of(ann, "polygon"), Raster)
    assert geometry_of({"polygon": [[0, 0], [4, 0], [0, 2]]}, "bbox") == (0.0, 0.0, 4.0, 2.0)
    box = geometry_of({"bbox": [1, 2, 4, 6]}, "polygon")
    assert box.area == 12 and box.bounds == (1.0, 2.0, 4.0, 6.0)
    # the bbox wins in bbox mode, the polygon/raster in segm mode
    both = {"bbox": [0, 0, 1, 1], "polygon": [[0, 0], [4, 0], [0, 4]]}
    assert geometry_of(both, "bbox") == (0.0, 0.0, 1.0, 1.0)
    assert geometry_of(both, "polygon").area == 8
    assert "no bbox, polygon or raster" in geometry_of({"label": "x"}, "bbox")
    uncompressed = geometry_of({"raster": {"size": [2, 2], "counts": [1, 3]}}, "polygon")
    assert uncompressed.area == 3


def test_native_rasters_give_the_numbers_of_the_same_coco_masks(tmp_path):
    """The same masks as a COCO instances/results pair (RLE segmentations, pycocotools' mask IoU)
    and as native raster rows, both under the valor protocol: identical records."""
    from evalbeam.pipelines.tasks.detection import run

    rng = np.random.default_rng(11)
    h, w = 48, 64
    labels = ["a", "b", "c"]
    images, anns, results, gt_rows, pred_rows = [], [], [], [], []
    scores = iter(rng.permutation(1000)[:500] / 1000 + 1e-3)
    for image_id in range(1, 13):
        images.append({"id": image_id, "height": h, "width": w})
        gt_row = {"datum_uid": f"img-{image_id}", "annotations": []}
        pred_row = {"datum_uid": f"img-{image_id}", "annotations": []}
        for _ in range(int(rng.integers(0, 4))):
            mask = random_mask(rng, h, w)
            if not mask.any():
                continue
            label = int(rng.integers(0, 3))
            rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
            counts = rle["counts"].decode()
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": label + 1,
                         "segmentation": {"size": [h, w], "counts": counts}, "area": float(mask.sum()),
                         "bbox": [float(v) for v in mask_utils.toBbox(rle)], "iscrowd": 0})
            gt_row["annotations"].append({"label": labels[label], "raster": {"size": [h, w], "counts": counts}})
            for _ in range(int(rng.integers(1, 3))):
                noisy = mask ^ (rng.random((h, w)) < 0.05)
                guess = label if rng.random() < 0.8 else int(rng.integers(0, 3))
                score = float(next(scores))
                counts = mask_utils.encode(np.asfortranarray(noisy.astype(np.uint8)))["counts"].decode()
                results.append({"image_id": image_id, "category_id": guess + 1, "score": score,
                                "segmentation": {"size": [h, w], "counts": counts}})
                pred_row["annotations"].append({"label": labels[guess], "score": score,
                                                "raster": {"size": [h, w], "counts": counts}})
        gt_rows.append(gt_row)
        pred_rows.append(pred_row)
    coco = {"images": images, "annotations": anns,
            "categories": [{"id": i + 1, "name": n} for i, n in enumerate(labels)]}
    (tmp_path / "gt.json").write_text(json.dumps(coco))
    (tmp_path / "dt.json").write_text(json.dumps(results))
    write_jsonl(tmp_path / "gt.jsonl", gt_rows)
    write_jsonl(tmp_path / "m.jsonl", pred_rows)
    common = ["--quiet", "--iou_type", "segm", "--protocol", "valor", "--iou_thresholds", "0.5,0.75",
              "--score_thresholds", "0.3,0.6", "--max_examples", "0"]
    assert run(["--groundtruths", str(tmp_path / "gt.json"), "--predictions", f"m={tmp_path / 'dt.json'}",
                "--output", str(tmp_path / "coco"), *common]) == 0
    assert run(["--groundtruths", str(tmp_path / "gt.jsonl"), "--predictions", f"m={tmp_path / 'm.jsonl'}",
                "--output", str(tmp_path / "native"), *common]) == 0

    def by_key(path):
        return {(r["type"], json.dumps(r["parameters"], sort_keys=True)): r["value"]
                for r in read_jsonl(path / "metrics.jsonl") if r["type"] != "DetailedPrecisionRecallCurve"}

    coco_records, native_records = by_key(tmp_path / "coco"), by_key(tmp_path / "native")
    assert coco_records.keys() == native_records.keys()
    for key, value in coco_records.items():
        if isinstance(value, float):
            assert native_records[key] == pytest.approx(value, abs=1e-12), key
        else:
            assert native_records[key] == value, key
    assert any(v > 0 for k, v in native_records.items() if k[0] == "AP")
