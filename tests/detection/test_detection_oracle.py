"""`evalbeam detection` (COCO protocol) against pycocotools' COCOeval, on random COCO datasets.

A small generator makes COCO instances + results with the cases where COCOeval's rules matter:
non-contiguous category ids (one without ground truth, one with only crowd regions), images
without annotations or without detections, ground truths of every area range including areas of
exactly 32**2 and 96**2 (in two ranges), crowd regions as uncompressed RLE, polygons for the
rest with "area" = the rasterised polygon's area, detections of every IoU, wrong classes, random
boxes, more than 100 detections of one category in an image, scores with 1-2 decimals (ties within
and across images), exact duplicate boxes, and segm results as compressed RLE with, without or
partly with a "bbox" (pycocotools takes the area from the box only when the first result has
one).

In-process: image_rows/box_rows -> shard_state -> accumulate/summarize must reproduce the 12
stats, the full precision/recall arrays and per-category statistics; states of random image
groups merged in any order must give the same arrays (what sharding does). Through the CLI: two
models, shard counts 1 and 7 and the multi-process runner give byte-identical metrics.jsonl equal
to pycocotools per model and slice; one segm run likewise.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json

import numpy as np
import pytest
from helpers import MULTIPROCESS, read_jsonl, run_cli_subprocess
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from evalbeam.schemas.coco_rows import box_rows, image_rows
from evalbeam.transforms.detection import shard_state
from evalbeam.transforms.kernels.detection import (COCO as COCO_PROTOCOL, VALOR as VALOR_PROTOCOL,
                                                   SUMMARY_NAMES, CocoState,
                                                   DetectionConfig, DetectionState, accumulate,
                                                   category_parts, category_records,
                                                   category_result, label_spans, span_part,
                                                   state_records, summarize)

SEEDS = list(range(9))
SPLITS = ["day", "night", "dusk"]
EXACT_SIZES = {32 ** 2: [(32, 32), (16, 64), (64, 16)], 96 ** 2: [(96, 96), (48, 192), (192, 48)]}


# ----------------------------------------------------------------------------------------------
# random COCO data

def _rle_str(rle: dict) -> dict:
    return {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}


def _raster(polygons: list, height: int, width: int) -> dict:
    """Compressed RLE of polygons, as pycocotools' annToRLE rasterises them."""
    return mask_utils.merge(mask_utils.frPyObjects(polygons, height, width))


def _uncompressed_rle(mask: np.ndarray) -> dict:
    """{"size": [h, w], "counts": [run lengths]} (column-major, first run of zeros), as COCO
    stores crowd regions."""
    flat = mask.flatten(order="F").astype(np.uint8)
    bounds = np.r_[0, np.flatnonzero(np.diff(flat)) + 1, flat.size]
    runs = np.diff(bounds).tolist()
    if flat.size and flat[0] == 1:
        runs = [0] + runs
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": [int(r) for r in runs]}


def _ellipse(rng, x, y, w, h) -> list:
    """A jittered ellipse polygon inside the box [x, y, w, h], coordinates with 2 decimals."""
    n = int(rng.integers(6, 13))
    angle = np.sort(rng.uniform(0, 2 * np.pi, n))
    radius = rng.uniform(0.6, 1.0, n)
    px = np.clip(x + w / 2 + (w / 2) * radius * np.cos(angle), x, x + w)
    py = np.clip(y + h / 2 + (h / 2) * radius * np.sin(angle), y, y + h)
    return np.round(np.stack([px, py], axis=1).reshape(-1), 2).tolist()


def _rectangle(x, y, w, h) -> list:
    return [x, y, x + w, y, x + w, y + h, x, y + h]


def _random_box(rng, height, width, area) -> list:
    ratio = np.exp(rng.uniform(-0.7, 0.7))
    w = float(np.clip(np.sqrt(area * ratio), 2, width - 1))
    h = float(np.clip(area / w, 2, height - 1))
    x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
    return [round(float(x), 2), round(float(y), 2), round(w, 2), round(h, 2)]


def _clip_box(box, height, width) -> list:
    x = float(np.clip(box[0], 0, width - 2))
    y = float(np.clip(box[1], 0, height - 2))
    w = float(np.clip(box[2], 1, width - x))
    h = float(np.clip(box[3], 1, height - y))
    return [round(x, 2), round(y, 2), round(w, 2), round(h, 2)]


def make_groundtruth(seed: int, n_images: int | None = None) -> dict:
    """A COCO instances dict (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n_images = n_images or int(rng.integers(20, 45))
    n_cat = int(rng.integers(5, 13))
    cat_ids = sorted(int(c) for c in rng.choice(np.arange(1, 400), n_cat, replace=False))
    empty_cat, crowd_cat = (int(c) for c in rng.choice(cat_ids, 2, replace=False))
    regular_cats = [c for c in cat_ids if c not in (empty_cat, crowd_cat)]
    image_ids = sorted(int(i) for i in rng.choice(np.arange(1, 10 ** 6), n_images, replace=False))
    images, annotations = [], []
    crowd_made = False
    for n, image_id in enumerate(image_ids):
        height, width = int(rng.integers(110, 400)), int(rng.integers(110, 400))
        image = {"id": image_id, "height": height, "width": width,
                 "file_name": f"{image_id:012d}.jpg"}
        split = SPLITS[int(rng.integers(len(SPLITS)))]
        if rng.random() < 0.5:
            image["metadata"] = {"split": split}
        else:
            image["split"] = split
        images.append(image)
        if n > 0 and rng.random() < 0.15:
            continue                                              # no annotations at all
        for _ in range(1 + int(rng.poisson(4))):
            crowd = rng.random() < 0.05 or (not crowd_made and n == 0)
            if crowd:
                category = crowd_cat if not crowd_made or rng.random() < 0.6 else int(rng.choice(regular_cats))
                crowd_made = True
                bw = int(rng.integers(20, width // 2))
                bh = int(rng.integers(20, height // 2))
                x0, y0 = int(rng.integers(0, width - bw)), int(rng.integers(0, height - bh))
                mask = np.zeros((height, width), dtype=np.uint8)
                mask[y0:y0 + bh, x0:x0 + bw] = 1
                segmentation = _uncompressed_rle(mask)
                bbox = [x0, y0, bw, bh]
            else:
                category = int(rng.choice(regular_cats))
                kind = rng.choice(["small", "medium", "large", "exact"], p=[.35, .3, .2, .15])
                if kind == "exact":
                    sizes = [s for s in EXACT_SIZES[int(rng.choice([32 ** 2, 96 ** 2]))]
                             if s[0] < width and s[1] < height] or EXACT_SIZES[32 ** 2][:1]
                    bw, bh = sizes[int(rng.integers(len(sizes)))]
                    x0, y0 = int(rng.integers(0, width - bw)), int(rng.integers(0, height - bh))
                    bbox = [x0, y0, bw, bh]
                    polygon = _rectangle(x0, y0, bw, bh)            # area exactly bw * bh
                else:
                    low, high = {"small": (9, 1000), "medium": (1100, 9000),
                                 "large": (9500, 0.8 * height * width)}[kind]
                    bbox = _random_box(rng, height, width, np.exp(rng.uniform(np.log(low), np.log(high))))
                    polygon = _ellipse(rng, *bbox)
                segmentation = [polygon]
            rle = _raster([segmentation] if crowd else segmentation, height, width)
            annotations.append({"image_id": image_id, "category_id": category, "bbox": bbox,
                                "segmentation": segmentation, "iscrowd": int(crowd),
                                "area": float(mask_utils.area(rle))})
    order = rng.permutation(len(annotations))                   # file order is not image order
    annotations = [annotations[i] for i in order]
    ann_ids = rng.choice(np.arange(1, 10 ** 6), len(annotations), replace=False)
    for ann, ann_id in zip(annotations, ann_ids):
        ann["id"] = int(ann_id)                                   # never 0 (see COCOeval)
    images = [images[i] for i in rng.permutation(len(images))]
    categories = [{"id": c, "name": f"cat{c}", "supercategory": "thing"} for c in cat_ids]
    return {"images": images, "annotations": annotations, "categories": categories,
            "info": {"seed": seed}, "_empty_cat": empty_cat, "_crowd_cat": crowd_cat}


def _gt_only(dataset: dict) -> dict:
    return {k: v for k, v in dataset.items() if not k.startswith("_")}


def make_detections(dataset: dict, seed: int) -> list[dict]:
    """Detections with their geometry: dicts with image_id, category_id, score, bbox and
    polygon (for the segm variant)."""
    rng = np.random.default_rng(seed + 1000)
    cat_ids = [c["id"] for c in dataset["categories"]]
    by_image: dict = {}
    for ann in dataset["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    sized = {im["id"]: (im["height"], im["width"]) for im in dataset["images"]}
    image_ids = sorted(sized)
    crowded = [i for i in image_ids if by_image.get(i)]
    crowded = set(rng.choice(crowded, min(2, len(crowded)), replace=False).tolist())
    dets = []

    def score(quality):
        decimals = 1 if rng.random() < 0.5 else 2
        return float(np.round(np.clip(quality + rng.normal(0, 0.2), 0, 1), decimals))

    def copy_of(ann, height, width, spread):
        gx, gy, gw, gh = ann["bbox"]
        if spread == 0:
            box = list(ann["bbox"])
        else:
            box = _clip_box([gx + rng.normal(0, spread * gw), gy + rng.normal(0, spread * gh),
                             gw * np.exp(rng.normal(0, spread)), gh * np.exp(rng.normal(0, spread))],
                            height, width)
        if ann["iscrowd"] or spread == 0 and len(ann["segmentation"][0]) == 8:
            polygon = _rectangle(*box)
        else:      # the ground truth's outline, moved and scaled like the box
            p = np.array(ann["segmentation"][0]).reshape(-1, 2)
            p = (p - [gx, gy]) * [box[2] / max(gw, 1e-9), box[3] / max(gh, 1e-9)] + box[:2]
            polygon = np.round(p.reshape(-1), 2).tolist()
        return box, polygon

    for image_id in image_ids:
        height, width = sized[image_id]
        if image_id != image_ids[0] and rng.random() < 0.15:
            continue                                              # an image without detections
        anns = by_image.get(image_id, [])
        for ann in anns:
            if rng.random() < 0.15:
                continue                                          # missed
            for _ in range(1 + int(rng.random() < 0.3)):
                spread = float(rng.choice([0.0, 0.02, 0.08, 0.2, 0.4]))
                box, polygon = copy_of(ann, height, width, spread)
                category = ann["category_id"]
                if rng.random() < 0.1:
                    category = int(rng.choice([c for c in cat_ids if c != category]))
                dets.append({"image_id": image_id, "category_id": category, "bbox": box,
                             "polygon": polygon, "score": score(0.8 - spread)})
            if ann["iscrowd"]:                                    # pieces inside the crowd region
                x, y, w, h = ann["bbox"]
                for _ in range(int(rng.integers(1, 4))):
                    bw, bh = rng.uniform(4, w / 2), rng.uniform(4, h / 2)
                    box = _clip_box([x + rng.uniform(0, w - bw), y + rng.uniform(0, h - bh), bw, bh],
                                    height, width)
                    dets.append({"image_id": image_id, "category_id": ann["category_id"],
                                 "bbox": box, "polygon": _ellipse(rng, *box), "score": score(0.5)})
        for _ in range(int(rng.poisson(3))):                      # random false positives
            box = _random_box(rng, height, width, np.exp(rng.uniform(np.log(16), np.log(0.5 * height * width))))
            dets.append({"image_id": image_id, "category_id": int(rng.choice(cat_ids)), "bbox": box,
                         "polygon": _ellipse(rng, *box), "score": score(0.3)})
        if image_id in crowded:                                   # > 100 detections of a category
            category = int(rng.choice([a["category_id"] for a in anns]))
            own = [a for a in anns if a["category_id"] == category]
            for _ in range(int(rng.integers(101, 140))):
                if rng.random() < 0.5:
                    box, polygon = copy_of(own[int(rng.integers(len(own)))], height, width,
                                           float(rng.choice([0.05, 0.15, 0.3])))
                else:
                    box = _random_box(rng, height, width, np.exp(rng.uniform(np.log(16), np.log(8000))))
                    polygon = _ellipse(rng, *box)
                dets.append({"image_id": image_id, "category_id": category, "bbox": box,
                             "polygon": polygon, "score": score(0.5)})
    for det in list(dets):                                        # exact duplicate boxes
        if rng.random() < 0.05:
            twin = dict(det)
            if rng.random() < 0.5:
                twin["score"] = score(0.5)
            dets.append(twin)
    return [dets[i] for i in rng.permutation(len(dets))]


def bbox_results(dets: list[dict]) -> list[dict]:
    return [{"image_id": d["image_id"], "category_id": d["category_id"], "bbox": d["bbox"],
             "score": d["score"]} for d in dets]


def segm_results(dataset: dict, dets: list[dict], boxes: str) -> list[dict]:
    """Compressed RLE results; boxes: "all" (every result has a bbox: pycocotools takes areas
    from boxes), "none" (mask areas) or "mixed" (the first has none, then some have: mask
    areas)."""
    sized = {im["id"]: (im["height"], im["width"]) for im in dataset["images"]}
    rng = np.random.default_rng(len(dets))
    out = []
    for i, d in enumerate(dets):
        height, width = sized[d["image_id"]]
        row = {"image_id": d["image_id"], "category_id": d["category_id"],
               "segmentation": _rle_str(_raster([d["polygon"]], height, width)), "score": d["score"]}
        if boxes == "all" or (boxes == "mixed" and i > 0 and rng.random() < 0.5):
            row["bbox"] = d["bbox"]
        out.append(row)
    return out


def make_case(seed: int, iou_type: str, n_images: int | None = None):
    dataset = make_groundtruth(seed, n_images)
    dets = make_detections(dataset, seed)
    if iou_type == "bbox":
        return _gt_only(dataset), bbox_results(dets)
    return _gt_only(dataset), segm_results(dataset, dets, ("all", "none", "mixed")[seed % 3])


# ----------------------------------------------------------------------------------------------
# pycocotools, the oracle

def _quiet():
    return contextlib.redirect_stdout(io.StringIO())


def coco_from(dataset: dict) -> COCO:
    coco = COCO()
    coco.dataset = copy.deepcopy(dataset)
    with _quiet():
        coco.createIndex()
    return coco


def oracle(dataset: dict, results: list[dict], iou_type: str, image_ids=None) -> dict:
    """COCOeval's stats, precision, recall and the 12 stats of each category (summarize() on
    the arrays restricted to that category)."""
    gt = coco_from(dataset)
    with _quiet():
        if results:
            dt = gt.loadRes(copy.deepcopy(results))
        else:     # loadRes cannot take an empty list: an empty results COCO
            dt = coco_from({"images": dataset["images"], "categories": dataset["categories"],
                            "annotations": []})
        evaluation = COCOeval(gt, dt, iou_type)
        if image_ids is not None:
            evaluation.params.imgIds = sorted(image_ids)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
        per_class = []
        for k in range(len(evaluation.params.catIds)):
            one = copy.copy(evaluation)
            one.eval = dict(evaluation.eval,
                            precision=evaluation.eval["precision"][:, :, k:k + 1],
                            recall=evaluation.eval["recall"][:, k:k + 1])
            one.summarize()
            per_class.append(dict(zip(SUMMARY_NAMES, map(float, one.stats))))
    return {"stats": dict(zip(SUMMARY_NAMES, map(float, evaluation.stats))),
            "precision": evaluation.eval["precision"], "recall": evaluation.eval["recall"],
            "per_class": per_class, "cat_ids": list(evaluation.params.catIds)}


# ----------------------------------------------------------------------------------------------
# the product, in process

def first_has_bbox(results: list[dict]) -> bool:
    return bool(results) and bool(results[0].get("bbox"))


def product_state(dataset: dict, results: list[dict], iou_type: str, area_from_bbox: bool,
                  image_ids=None) -> CocoState:
    """shard_state of the images image_ids (all by default) and their annotations/results."""
    segm = iou_type == "segm"
    images = dataset["images"]
    anns, dts = dataset["annotations"], results
    if image_ids is not None:
        chosen = set(image_ids)
        images = [im for im in images if im["id"] in chosen]
        anns = [a for a in anns if a["image_id"] in chosen]
        dts = [d for d in dts if d["image_id"] in chosen]
    image_cols, bad_images = image_rows(images, [])
    gts, bad_gts = box_rows(anns, detections=False, need_segmentation=segm)
    dt_cols, bad_dts = box_rows(dts, detections=True, need_segmentation=segm)
    assert bad_images == [] and bad_gts == [] and bad_dts == []
    category_id = np.array(sorted(c["id"] for c in dataset["categories"]), dtype=np.int64)
    return shard_state(image_cols, gts, dt_cols, category_id, iou_type, area_from_bbox)


def assert_stats(actual: dict, expected: dict, what: str, tol: float = 1e-12):
    assert list(actual) == list(SUMMARY_NAMES), what
    for name in SUMMARY_NAMES:
        assert abs(actual[name] - expected[name]) <= tol, (what, name, actual[name], expected[name])


def assert_arrays(precision, recall, reference: dict, what: str):
    """Exactly equal (the kernel claims pycocotools' arithmetic, not an approximation)."""
    for name, mine in (("precision", precision), ("recall", recall)):
        theirs = reference[name]
        assert mine.shape == theirs.shape, (what, name, mine.shape, theirs.shape)
        if not np.array_equal(mine, theirs):
            diff = np.argwhere(mine != theirs)
            raise AssertionError(f"{what}: {name} differs at {len(diff)} entries, first "
                                 f"{diff[:5].tolist()}: {mine[tuple(diff[0])]} != "
                                 f"{theirs[tuple(diff[0])]}")


def compare_in_process(dataset, results, iou_type, what):
    reference = oracle(dataset, results, iou_type)
    state = product_state(dataset, results, iou_type, first_has_bbox(results))
    precision, recall = accumulate(state)
    assert_arrays(precision, recall, reference, what)
    assert_stats(summarize(precision, recall), reference["stats"], what)
    for k, expected in enumerate(reference["per_class"]):
        assert_stats(summarize(precision, recall, category=k), expected,
                     f"{what} category {reference['cat_ids'][k]}")
    return reference, state, precision, recall


# ----------------------------------------------------------------------------------------------
# in-process tests

@pytest.fixture(scope="module")
def cases():
    cache: dict = {}

    def get(seed, iou_type):
        if (seed, iou_type) not in cache:
            cache[seed, iou_type] = make_case(seed, iou_type)
        return cache[seed, iou_type]
    return get


def test_generator_covers_the_edge_cases():
    """The random data do contain what the comparisons are meant to cover."""
    for seed in SEEDS:
        raw = make_groundtruth(seed)
        dataset = _gt_only(raw)
        anns, images = dataset["annotations"], dataset["images"]
        cat_ids = [c["id"] for c in dataset["categories"]]
        assert 5 <= len(cat_ids) <= 12 and cat_ids != list(range(cat_ids[0], cat_ids[0] + len(cat_ids)))
        assert raw["_empty_cat"] not in {a["category_id"] for a in anns}
        crowd_cat = [a for a in anns if a["category_id"] == raw["_crowd_cat"]]
        assert crowd_cat and all(a["iscrowd"] for a in crowd_cat)
        crowd = [a for a in anns if a["iscrowd"]]
        assert crowd and all(isinstance(a["segmentation"]["counts"], list) for a in crowd)
        for a in anns[:40]:  # "area" is the rasterised segmentation's area
            height, width = next((im["height"], im["width"]) for im in images if im["id"] == a["image_id"])
            seg = [a["segmentation"]] if a["iscrowd"] else a["segmentation"]
            assert mask_utils.area(_raster(seg, height, width)).sum() == a["area"]
        assert {a["image_id"] for a in anns} < {im["id"] for im in images}
        dets = make_detections(raw, seed)
        assert {d["image_id"] for d in dets} < {im["id"] for im in images}
        per = {}
        for d in dets:
            per[d["image_id"], d["category_id"]] = per.get((d["image_id"], d["category_id"]), 0) + 1
        assert max(per.values()) > 100
    # over all seeds: every area range, both boundaries, ties, duplicates, ignored-area detections
    areas = np.array([a["area"] for s in SEEDS for a in make_groundtruth(s)["annotations"]])
    assert (areas < 32 ** 2).sum() > 50 and (areas > 96 ** 2).sum() > 50
    assert ((areas > 32 ** 2) & (areas < 96 ** 2)).sum() > 50
    assert (areas == 32 ** 2).sum() >= 3 and (areas == 96 ** 2).sum() >= 3
    dets = make_detections(make_groundtruth(0), 0)
    scores = [d["score"] for d in dets]
    assert len(set(scores)) < len(scores) / 3
    keys = [(d["image_id"], d["category_id"], tuple(d["bbox"])) for d in dets]
    assert len(set(keys)) < len(keys)


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", SEEDS)
def test_matches_pycocotools(cases, seed, iou_type):
    """12 stats, full precision [T, R, K, A, M] and recall [T, K, A, M], per-category stats."""
    dataset, results = cases(seed, iou_type)
    reference, *_ = compare_in_process(dataset, results, iou_type, f"seed {seed} {iou_type}")
    # the data are not trivial: some AP is between 0 and 1, some category undefined
    assert 0 < reference["stats"]["AP"] < 1
    assert (reference["recall"] == -1).any() and (reference["recall"] > 0).any()


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", SEEDS[:5])
def test_merged_shard_states_equal_one_state(cases, seed, iou_type):
    """States of random image groups, merged in varying orders, give the same arrays."""
    dataset, results = cases(seed, iou_type)
    area_from_bbox = first_has_bbox(results)
    whole = accumulate(product_state(dataset, results, iou_type, area_from_bbox))
    rng = np.random.default_rng(seed + 77)
    image_ids = [im["id"] for im in dataset["images"]]
    for n_groups in (2, 5, len(image_ids)):
        group = rng.permutation(np.arange(len(image_ids)) % n_groups)
        states = [product_state(dataset, results, iou_type, area_from_bbox,
                                [i for i, g in zip(image_ids, group) if g == k])
                  for k in range(n_groups)]
        for _ in range(3):
            order = rng.permutation(n_groups)
            if rng.random() < 0.5:     # left fold
                merged = states[order[0]].copy()
                for k in order[1:]:
                    merged = merged.merge(states[k].copy())
            else:                      # pairwise tree
                parts = [states[k].copy() for k in order]
                while len(parts) > 1:
                    parts = [parts[i].merge(parts[i + 1]) if i + 1 < len(parts) else parts[i]
                             for i in range(0, len(parts), 2)]
                merged = parts[0]
            precision, recall = accumulate(merged)
            assert np.array_equal(precision, whole[0]), (seed, iou_type, n_groups)
            assert np.array_equal(recall, whole[1]), (seed, iou_type, n_groups)


def assert_same_records(got: list, expected: list, case) -> None:
    """The same records in the same order, as JSON text; on a difference, the first differing
    record only (pytest's own diff of two long texts takes minutes)."""
    same = json.dumps(got) == json.dumps(expected)
    if not same:
        first = next((i for i, (a, b) in enumerate(zip(got, expected))
                      if json.dumps(a) != json.dumps(b)), min(len(got), len(expected)))
        pytest.fail(f"{case}: {len(got)} records against {len(expected)}; first difference at "
                    f"{first}: {json.dumps(got[first:first + 1])[:500]} against "
                    f"{json.dumps(expected[first:first + 1])[:500]}")


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", SEEDS[:4])
def _random_spans(rng, T: int) -> list[tuple[int, int]]:
    """A random tiling of 0 .. T into 1 .. T spans."""
    cuts = sorted(rng.choice(np.arange(1, T), size=int(rng.integers(0, T)), replace=False).tolist())
    bounds = [0] + cuts + [T]
    return list(zip(bounds[:-1], bounds[1:]))


def _merged_by_key(rng, shard_states, T: int, split: bool) -> dict:
    """The pipeline's per-category merge, in process: every shard's category_parts, each label
    cut into the same random spans of IoU thresholds on every shard (span_part) when split,
    the parts of a (label, span) merged in any order -> {(k, t0, t1): merged part}."""
    spans: dict = {}
    merged: dict = {}
    for state in shard_states:
        for label, part in category_parts(state):
            if label not in spans:
                spans[label] = _random_spans(rng, T) if split and label >= 0 else [(0, T)]
            for t0, t1 in spans[label]:
                piece = span_part(part, t0, t1, T)
                held = merged.get((label, t0, t1))
                merged[(label, t0, t1)] = piece.copy() if held is None else held.merge(piece)
    return merged


def _records_of_keys(rng, merged: dict, categories, config) -> list:
    keys = list(merged)
    rng.shuffle(keys)
    return list(category_records([(key, category_result(key[0], merged[key], config, key[1:]))
                                  for key in keys], config, categories))


def test_label_spans_split_the_largest_labels_evenly():
    """label_spans: one span below the minimum or at a small share; ceil(4 x share) spans of
    near-equal sizes tiling 0 .. T; never more spans than thresholds."""
    assert label_spans(99_999, 100_000, 10) == [(0, 10)]
    assert label_spans(10, 1_000_000, 10, min_detections=0) == [(0, 10)]
    assert label_spans(300_000, 1_000_000, 10) == [(0, 5), (5, 10)]             # 30%: 2 spans
    assert label_spans(250_000, 1_000_000, 10) == [(0, 10)]                      # 1/4 exactly
    assert label_spans(500_001, 1_000_000, 10) == [(0, 3), (3, 6), (6, 10)]
    assert label_spans(1_000_000, 1_000_000, 10) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert label_spans(1_000_000, 1_000_000, 2) == [(0, 1), (1, 2)]
    assert label_spans(5, 0, 10, min_detections=0) == [(0, 10)]


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", SEEDS[:4])
def test_per_category_merge_gives_the_whole_state_s_records(cases, seed, iou_type):
    """The pipeline merges and accumulates the coco protocol's states per category (category_parts
    on every shard's state, the parts of a label merged in any order, category_result, then
    category_records): the records equal state_records of the whole merged state, value for
    value, with categories lacking ground truth or detections and shards lacking some labels;
    and so with each label cut into random spans of IoU thresholds (span_part), accumulated
    apart."""
    dataset, results = cases(seed, iou_type)
    area_from_bbox = first_has_bbox(results)
    categories = {"id": sorted(c["id"] for c in dataset["categories"])}
    categories["name"] = [f"c{i}" for i in categories["id"]]
    config = DetectionConfig(iou_type, COCO_PROTOCOL)
    whole = list(state_records(DetectionState(product_state(dataset, results, iou_type,
                                                            area_from_bbox)), config, categories))
    rng = np.random.default_rng(seed + 5)
    image_ids = [im["id"] for im in dataset["images"]]
    for n_groups in (1, 3, len(image_ids)):
        group = rng.permutation(np.arange(len(image_ids)) % n_groups)
        states = [DetectionState(product_state(dataset, results, iou_type, area_from_bbox,
                                               [i for i, g in zip(image_ids, group) if g == k]))
                  for k in rng.permutation(n_groups)]
        for split in (False, True):
            merged = _merged_by_key(rng, states, 10, split)
            assert split or all(key[1:] == (0, 10) for key in merged)
            got = _records_of_keys(rng, merged, categories, config)
            assert_same_records(got, whole, (seed, iou_type, n_groups, split))


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_per_category_merge_gives_the_whole_state_s_records_under_valor(cases, seed):
    """The same under the valor protocol (every detection, Valor's records, the
    DetailedPrecisionRecallCurve and ConfusionMatrix merged on their own key): the records
    equal state_records of the whole merged state."""
    dataset, results = cases(seed, "bbox")
    category_id = np.array(sorted(c["id"] for c in dataset["categories"]), dtype=np.int64)
    categories = {"id": category_id.tolist(), "name": [f"c{i}" for i in category_id.tolist()]}
    config = DetectionConfig("bbox", VALOR_PROTOCOL)

    def state_of(image_ids):
        chosen = set(image_ids)
        images, _ = image_rows([im for im in dataset["images"] if im["id"] in chosen], [])
        gts, _ = box_rows([a for a in dataset["annotations"] if a["image_id"] in chosen],
                          detections=False, need_segmentation=False)
        dts, _ = box_rows([d for d in results if d["image_id"] in chosen], detections=True,
                          need_segmentation=False)
        return DetectionState(*shard_state(images, gts, dts, category_id, "bbox", True,
                                           VALOR_PROTOCOL))

    image_ids = [im["id"] for im in dataset["images"]]
    whole = list(state_records(state_of(image_ids), config, categories))
    assert any(r["type"] == "ConfusionMatrix" for r in whole)
    rng = np.random.default_rng(seed + 9)
    T = len(VALOR_PROTOCOL.matching_thresholds)
    for n_groups in (1, 4):
        group = rng.permutation(np.arange(len(image_ids)) % n_groups)
        states = [state_of([i for i, g in zip(image_ids, group) if g == k])
                  for k in rng.permutation(n_groups)]
        for split in (False, True):
            got = _records_of_keys(rng, _merged_by_key(rng, states, T, split), categories, config)
            assert_same_records(got, whole, (seed, n_groups, split))


def test_per_category_parts_of_an_empty_state_keep_the_key():
    """A (model, slice) without ground truth or detections still gets its records (all -1)."""
    empty = DetectionState(CocoState(3, np.zeros((3, 4), np.int64)))
    assert [k for k, _ in category_parts(empty)] == [-1]
    categories = {"id": [1, 2, 3], "name": ["a", "b", "c"]}
    config = DetectionConfig("bbox", COCO_PROTOCOL)
    got = list(category_records([((-1, 0, 10), category_result(-1, empty, config))], config, categories))
    assert json.dumps(got) == json.dumps(list(state_records(empty, config, categories)))
    assert got[0]["value"]["AP"] == -1.0


# ----------------------------------------------------------------------------------------------
# degenerate cases, in process

@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_no_detections_at_all(iou_type):
    dataset, _ = make_case(11, iou_type, n_images=12)
    reference, *_ = compare_in_process(dataset, [], iou_type, f"no detections {iou_type}")
    assert set(reference["stats"].values()) <= {0.0, -1.0}


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
def test_detections_only_on_images_without_groundtruth(iou_type):
    dataset, results = make_case(12, iou_type, n_images=20)
    with_gt = {a["image_id"] for a in dataset["annotations"]}
    empty = [im for im in dataset["images"] if im["id"] not in with_gt]
    assert empty
    moved = []               # every detection moved onto images without ground truth
    for i, r in enumerate(results):
        r = dict(r)
        r["image_id"] = empty[i % len(empty)]["id"]
        if iou_type == "segm":   # an RLE has its image's size
            target = empty[i % len(empty)]
            h, w = target["height"], target["width"]
            r["segmentation"] = _rle_str(_raster([_rectangle(1, 1, min(w, h) / 3, min(w, h) / 4)], h, w))
        moved.append(r)
    reference, *_ = compare_in_process(dataset, moved, iou_type, f"dets on empty images {iou_type}")
    assert set(reference["stats"].values()) <= {0.0, -1.0}
    # and only images without ground truth in the dataset at all: everything undefined
    bare = dict(dataset, annotations=[])
    reference, *_ = compare_in_process(bare, moved, iou_type, f"no ground truth {iou_type}")
    assert set(reference["stats"].values()) == {-1.0}


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_single_image(iou_type, seed):
    dataset, results = make_case(seed, iou_type, n_images=1)
    compare_in_process(dataset, results, iou_type, f"single image {seed} {iou_type}")


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", [31, 32])
def test_all_scores_equal(iou_type, seed):
    """Every score tied: the order is the file's within an image, image ids across images."""
    dataset, results = make_case(seed, iou_type, n_images=15)
    tied = [dict(r, score=0.5) for r in results]
    compare_in_process(dataset, tied, iou_type, f"tied scores {seed} {iou_type}")


def make_grid_case(seed: int) -> tuple[dict, list[dict]]:
    """Tiny 64x64 images crowded with integer boxes (0..16 px, some of zero width or height,
    some starting outside the image): IoUs exactly at the thresholds (.5, .75, ...), equal IoUs
    with several ground truths, up to ~40 ground truths and ~130 detections per image, "area"
    fields on the range boundaries (0, 1024, 9216, 1024.5) independent of the box, 4 scores."""
    rng = np.random.default_rng(seed)
    cats = [3, 8, 20]
    images, anns, dets = [], [], []
    for i in range(int(rng.integers(1, 6))):
        image_id = 10 + 7 * i
        images.append({"id": image_id, "height": 64, "width": 64})
        for _ in range(int(rng.integers(0, 40))):
            x, y = (int(v) for v in rng.integers(0, 48, 2))
            w, h = (int(v) for v in rng.integers(0, 17, 2))
            crowd = bool(rng.random() < 0.15)
            if crowd:
                mask = np.zeros((64, 64), np.uint8)
                mask[y:y + h, x:x + w] = 1
                segmentation = _uncompressed_rle(mask)
            else:
                segmentation = [_rectangle(x, y, w, h)]
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": int(rng.choice(cats)),
                         "bbox": [x, y, w, h], "iscrowd": int(crowd), "segmentation": segmentation,
                         "area": float(rng.choice([w * h, 1024, 9216, 0, 1024.5]))})
        for _ in range(int(rng.integers(0, 130))):
            x, y = (int(v) for v in rng.integers(-4, 50, 2))
            w, h = (int(v) for v in rng.integers(0, 20, 2))
            dets.append({"image_id": image_id, "category_id": int(rng.choice(cats)),
                         "bbox": [x, y, w, h], "score": float(rng.choice([0.1, 0.5, 0.9, 1.0])),
                         "polygon": _rectangle(max(x, 0), max(y, 0), max(w, 1), max(h, 1))})
    dataset = {"images": images, "annotations": anns,
               "categories": [{"id": c, "name": str(c)} for c in cats]}
    return dataset, dets


@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", range(8))
def test_integer_grid_boxes(iou_type, seed):
    dataset, dets = make_grid_case(seed)
    results = (bbox_results(dets) if iou_type == "bbox"
               else segm_results(dataset, dets, ("all", "none", "mixed")[seed % 3]))
    compare_in_process(dataset, results, iou_type, f"grid {seed} {iou_type}")


def test_crowd_region_absorbs_and_exact_boundaries():
    """A hand-made image: boxes of area exactly 32**2 and 96**2 (in two ranges each), a crowd
    region absorbing several detections, duplicate boxes with equal scores."""
    crowd_mask = np.zeros((200, 300), dtype=np.uint8)
    crowd_mask[100:180, 150:290] = 1
    dataset = {
        "images": [{"id": 7, "height": 200, "width": 300}, {"id": 3, "height": 200, "width": 300}],
        "categories": [{"id": 4, "name": "a"}, {"id": 9, "name": "b"}],
        "annotations": [
            {"id": 1, "image_id": 7, "category_id": 4, "bbox": [10, 10, 32, 32], "area": 1024.0,
             "iscrowd": 0, "segmentation": [_rectangle(10, 10, 32, 32)]},
            {"id": 2, "image_id": 7, "category_id": 4, "bbox": [50, 5, 96, 96], "area": 9216.0,
             "iscrowd": 0, "segmentation": [_rectangle(50, 5, 96, 96)]},
            {"id": 3, "image_id": 7, "category_id": 4, "bbox": [150, 100, 140, 80], "area": 11200.0,
             "iscrowd": 1, "segmentation": _uncompressed_rle(crowd_mask)},
            {"id": 4, "image_id": 3, "category_id": 9, "bbox": [0, 0, 16, 64], "area": 1024.0,
             "iscrowd": 0, "segmentation": [_rectangle(0, 0, 16, 64)]},
        ]}
    boxes = [([10, 10, 32, 32], 4, 7, .9), ([10, 10, 32, 32], 4, 7, .9), ([50, 5, 96, 96], 4, 7, .8),
             ([160, 110, 20, 20], 4, 7, .95), ([200, 120, 30, 30], 4, 7, .7),
             ([170, 130, 64, 64], 4, 7, .9), ([1, 1, 16, 62], 9, 3, .9), ([1, 1, 16, 62], 4, 3, .9)]
    for iou_type in ("bbox", "segm"):
        results = []
        for box, cat, image, s in boxes:
            row = {"image_id": image, "category_id": cat, "score": s, "bbox": box}
            if iou_type == "segm":
                row["segmentation"] = _rle_str(_raster([_rectangle(*box)], 200, 300))
            results.append(row)
        compare_in_process(dataset, results, iou_type, f"hand-made {iou_type}")


def test_annotation_id_zero_is_matched_unlike_pycocotools():
    """A documented deviation: pycocotools stores the matched annotation's id with 0 meaning
    "unmatched", so a detection matched to an annotation whose id is 0 counts as a false positive
    (cocodataset/cocoapi#664). evalbeam does not use annotation ids, so the match counts."""
    dataset = {"images": [{"id": 1, "height": 100, "width": 100}],
               "categories": [{"id": 1, "name": "a"}],
               "annotations": [{"id": 0, "image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40],
                                "area": 1600.0, "iscrowd": 0}]}
    results = [{"image_id": 1, "category_id": 1, "bbox": [10, 10, 40, 40], "score": 0.9}]
    assert oracle(dataset, results, "bbox")["stats"]["AP"] == 0.0
    precision, recall = accumulate(product_state(dataset, results, "bbox", True))
    renumbered = json.loads(json.dumps(dataset))
    renumbered["annotations"][0]["id"] = 1
    assert summarize(precision, recall)["AP"] == oracle(renumbered, results, "bbox")["stats"]["AP"] > 0.99


# ----------------------------------------------------------------------------------------------
# through the CLI

def _write(path, obj) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def _cli(args: list) -> None:
    result = run_cli_subprocess(["detection", *args, "--quiet"])
    assert result.returncode == 0, result.stderr[-3000:]


def _slice_images(dataset: dict) -> dict:
    out: dict = {}
    for im in dataset["images"]:
        split = im["metadata"]["split"] if "metadata" in im else im["split"]
        out.setdefault(split, []).append(im["id"])
    return out


def _check_cli_metrics(records: list[dict], dataset: dict, models: dict, iou_type: str,
                       sliced: bool):
    cat = {c["id"]: c["name"] for c in dataset["categories"]}
    groups = [({}, None)]
    if sliced:
        groups += [({"split": s}, ids) for s, ids in sorted(_slice_images(dataset).items())]
    curves = [r for r in records if r["type"] == "InterpolatedPrecisionRecallCurve"]
    assert len(curves) == len(models) * len(groups) * len(cat) * 10   # tests/detection/test_detection_pr_curve.py
    records = [r for r in records if r["type"] != "InterpolatedPrecisionRecallCurve"]
    assert len(records) == len(models) * len(groups) * (1 + len(cat))
    for model, results in models.items():
        for slice_value, image_ids in groups:
            mine = [r for r in records if r["model"] == model and r["slice"] == slice_value]
            summary = [r for r in mine if r["type"] == "COCOSummary"]
            classes = [r for r in mine if r["type"] == "COCOClassSummary"]
            assert len(summary) == 1 and len(classes) == len(cat), (model, slice_value)
            reference = oracle(dataset, results, iou_type, image_ids)
            what = f"CLI {iou_type} {model} {slice_value}"
            assert summary[0]["parameters"]["iou_type"] == iou_type
            assert_stats(summary[0]["value"], reference["stats"], what)
            by_id = {r["parameters"]["category_id"]: r for r in classes}
            assert sorted(by_id) == reference["cat_ids"]
            for k, cid in enumerate(reference["cat_ids"]):
                assert by_id[cid]["parameters"]["label"] == cat[cid]
                assert_stats(by_id[cid]["value"], reference["per_class"][k], f"{what} category {cid}")


@pytest.fixture(scope="module")
def cli_bbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("detection_cli_bbox")
    raw = make_groundtruth(101, n_images=40)
    dataset = _gt_only(raw)
    models = {"alpha": bbox_results(make_detections(raw, 101)),
              "beta": bbox_results(make_detections(raw, 202)),
              "silent": []}                                    # a model without detections
    gt_path = _write(root / "instances.json", dataset)
    args = ["--groundtruths", gt_path, "--iou_type", "bbox", "--slice", "split"]
    for name, results in models.items():
        args += ["--predictions", f"{name}={_write(root / f'{name}.json', results)}"]
    return {"root": root, "dataset": dataset, "models": models, "args": args}


def test_cli_bbox_one_shard_matches_pycocotools(cli_bbox):
    out = cli_bbox["root"] / "one"
    _cli(cli_bbox["args"] + ["--output", out, "--num_shards", "1"])
    assert read_jsonl(out / "rejected.jsonl") == []
    _check_cli_metrics(read_jsonl(out / "metrics.jsonl"), cli_bbox["dataset"], cli_bbox["models"],
                       "bbox", sliced=True)


def test_cli_bbox_seven_shards_byte_identical(cli_bbox):
    one, seven = cli_bbox["root"] / "one", cli_bbox["root"] / "seven"
    if not (one / "metrics.jsonl").exists():
        _cli(cli_bbox["args"] + ["--output", one, "--num_shards", "1"])
    _cli(cli_bbox["args"] + ["--output", seven, "--num_shards", "7"])
    data = (seven / "metrics.jsonl").read_bytes()
    assert data and data == (one / "metrics.jsonl").read_bytes()


@pytest.mark.multiprocess
def test_cli_bbox_multiprocess_byte_identical(cli_bbox, monkeypatch):
    """Two worker processes, three shards, and every label holding more than an eighth of a
    model's detections accumulated in spans of IoU thresholds (EVALBEAM_SPLIT_DETECTIONS=0:
    at any size): the bytes of one shard in one process, whose numbers are pycocotools'."""
    one, multi = cli_bbox["root"] / "one", cli_bbox["root"] / "multi"
    if not (one / "metrics.jsonl").exists():
        _cli(cli_bbox["args"] + ["--output", one, "--num_shards", "1"])
    whole = cli_bbox["root"] / "three"
    _cli(cli_bbox["args"] + ["--output", whole, "--num_shards", "3"])
    monkeypatch.setenv("EVALBEAM_SPLIT_DETECTIONS", "0")
    _cli(cli_bbox["args"] + ["--output", multi, "--num_shards", "3", *MULTIPROCESS])
    data = (multi / "metrics.jsonl").read_bytes()
    assert data and data == (one / "metrics.jsonl").read_bytes()
    merged = [json.loads((out / "run.json").read_text())["shuffles"]["MergeStates"]["elements"]
              for out in (whole, multi)]
    assert merged[1] > merged[0], f"no label was split: {merged}"


def test_cli_segm_matches_pycocotools(tmp_path):
    """Two segm models: every result with a bbox (box areas), and the first without (mask
    areas for all, even those with a bbox)."""
    raw = make_groundtruth(303, n_images=25)
    dataset = _gt_only(raw)
    dets = make_detections(raw, 303)
    models = {"boxed": segm_results(raw, dets, "all"), "mixed": segm_results(raw, dets, "mixed")}
    assert first_has_bbox(models["boxed"]) and not first_has_bbox(models["mixed"])
    args = ["--groundtruths", _write(tmp_path / "instances.json", dataset), "--iou_type", "segm",
            "--output", tmp_path / "out", "--num_shards", "3"]
    for name, results in models.items():
        args += ["--predictions", f"{name}={_write(tmp_path / f'{name}.json', results)}"]
    _cli(args)
    assert read_jsonl(tmp_path / "out" / "rejected.jsonl") == []
    _check_cli_metrics(read_jsonl(tmp_path / "out" / "metrics.jsonl"), dataset, models, "segm",
                       sliced=False)
    # the two area rules do give different numbers here
    assert oracle(dataset, models["boxed"], "segm")["stats"] != oracle(dataset, models["mixed"], "segm")["stats"]


def test_label_spans_that_do_not_tile_the_thresholds_are_refused():
    """category_records refuses a label whose spans leave a gap or overlap (a pipeline error)."""
    empty = DetectionState(CocoState(1, np.zeros((1, 4), np.int64)))
    config = DetectionConfig("bbox", COCO_PROTOCOL)
    categories = {"id": [1], "name": ["a"]}
    for spans in ([(0, 3), (4, 10)], [(0, 5), (4, 10)], [(0, 9)], [(1, 10)]):
        results = [((0, t0, t1), category_result(0, span_part(empty, t0, t1, 10), config, (t0, t1)))
                   for t0, t1 in spans]
        with pytest.raises(ValueError, match="do not tile"):
            list(category_records(results, config, categories))


def _same_state(a, b) -> bool:
    """Every array and number of two CocoStates (or DetectionStates) equal, dtypes included."""
    if isinstance(a, DetectionState):
        return (_same_state(a.matches, b.matches)
                and all(_same_state(getattr(a, n), getattr(b, n)) for n in ("detailed", "confusion")))
    if a is None or b is None:
        return a is None and b is None
    for name, value in vars(a).items():
        other = vars(b)[name]
        if isinstance(value, np.ndarray):
            if value.dtype != other.dtype or not np.array_equal(value, other):
                return False
        elif hasattr(value, "__dict__") and not isinstance(value, (int, float)):
            if not _same_state(value, other):
                return False
        elif value != other:
            return False
    return True


def _concatenated(states: list) -> CocoState:
    """The definition of merging CocoStates, written out: rows concatenated, counts added."""
    rows = ("category", "score", "image_key", "rank", "tp", "fp")
    merged = CocoState(states[0].n_categories, np.sum([s.n_gt for s in states], axis=0),
                       *(np.concatenate([getattr(s, name) for s in states]) for name in rows))
    if states[0].image_hash is not None:
        merged.image_hash = np.concatenate([s.image_hash for s in states])
        merged.n_gt_replicates = np.sum([s.n_gt_replicates for s in states], axis=0)
    return merged


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_merge_all_is_the_pairwise_merge(cases, seed):
    """merge_all (what the pipeline's merge steps use: each row column concatenated once)
    gives the state pairwise merges give, changes none of its inputs, and refuses what merge
    refuses; for the coco and valor protocols' states, and CocoStates with bootstrap parts."""
    from evalbeam.transforms.merge import merge_states

    dataset, results = cases(seed, "bbox")
    category_id = np.array(sorted(c["id"] for c in dataset["categories"]), dtype=np.int64)
    image_ids = [im["id"] for im in dataset["images"]]
    rng = np.random.default_rng(seed)
    group = rng.permutation(np.arange(len(image_ids)) % 5)
    for protocol in (COCO_PROTOCOL, VALOR_PROTOCOL):
        states = []
        for g in range(5):
            chosen = {i for i, k in zip(image_ids, group) if k == g}
            images, _ = image_rows([im for im in dataset["images"] if im["id"] in chosen], [])
            gts, _ = box_rows([a for a in dataset["annotations"] if a["image_id"] in chosen],
                              detections=False, need_segmentation=False)
            dts, _ = box_rows([d for d in results if d["image_id"] in chosen], detections=True,
                              need_segmentation=False)
            state = shard_state(images, gts, dts, category_id, "bbox", True, protocol)
            states.append(DetectionState(*state) if isinstance(state, tuple) else DetectionState(state))
        before = [s.copy() for s in states]
        pairwise = states[0].copy()
        for other in states[1:]:
            pairwise = pairwise.merge(other)
        assert _same_state(pairwise.matches, _concatenated([s.matches for s in states]))
        assert _same_state(DetectionState.merge_all(states), pairwise)
        assert _same_state(merge_states(states, owned=False), pairwise)
        assert all(_same_state(s, b) for s, b in zip(states, before)), "an input was changed"
        assert (protocol is VALOR_PROTOCOL) == (pairwise.detailed is not None)
    n = [3, 0, 5]
    parts = [CocoState(2, np.full((2, 4), i, np.int64), np.zeros(k, np.int32), rng.random(k),
                       np.arange(k, dtype=np.int64), np.zeros(k, np.int32), np.ones((k, 4), np.uint16),
                       np.zeros((k, 4), np.uint16), rng.integers(0, 2**63, k).astype(np.uint64),
                       np.full((7, 2, 4), i, np.int64)) for i, k in enumerate(n)]
    pairwise = parts[0].copy()
    for other in parts[1:]:
        pairwise = pairwise.merge(other)
    assert _same_state(CocoState.merge_all(parts), _concatenated(parts))
    assert _same_state(pairwise, _concatenated(parts))
    assert CocoState.merge_all(parts).n_gt_replicates[0, 0, 0] == 0 + 1 + 2
    with pytest.raises(ValueError, match="bootstrapped"):
        CocoState.merge_all([parts[0], CocoState(2, np.zeros((2, 4), np.int64))])
    with pytest.raises(ValueError, match="category lists"):
        CocoState.merge_all([parts[0], CocoState(3, np.zeros((3, 4), np.int64))])
