"""Synthetic COCO-style detection data for the detection benchmark: like COCO val, reproducible.

    from detection_data import write_coco_dataset
    paths = write_coco_dataset("/tmp/coco_5k", n_images=5000, seed=0)
    # {"groundtruths": ".../instances.json", "predictions": ".../results_bbox.json",
    #  "predictions_segm": ".../results_segm.json" or None}

or from the command line (prints the statistics of the data):

    python tests/benchmarks/detection_data.py /tmp/coco_5k --n_images 5000 [--segm | --no_segm]

What is generated (everything is drawn with numpy at once; only the rasterisation of polygons,
which needs pycocotools, runs once per image):

* images: COCO val's mix of sizes: the long side is 640 for ~90% of the images (else 400..639),
  the short side 480 or 427 for most, else 240..639; ~70% landscape. Image ids are sparse
  (sorted random ints, as in COCO), file names 000000xxxxxx.jpg.
* categories: the 80 COCO categories with their ids (1..90 with COCO's gaps), names and
  supercategories; "person" draws ~30% of the objects, the others follow a Zipf-like law.
* ground truths: per image a gamma-Poisson number with mean ~7.3 (~5% of the images have none,
  ~0.5% have 30 or more, up to ~50); an image has a few categories (1 + Poisson(1.9)) and its
  objects take them. Mask sizes are log-normal: ~42% small < 32^2, ~37% medium, ~21% large
  > 96^2 by mask area (COCO val: 41/34/24). Each non-crowd object is a jittered ellipse polygon of
  8..20 points inside its box; "bbox" is the polygon's extent and "area" the area of the rasterised
  polygon (pycocotools.mask.area of frPyObjects), as COCO's area is a mask area. ~1% of the objects
  are crowd regions (iscrowd=1, larger, mostly "person"), stored as COCO stores them: an uncompressed
  RLE {"size": [h, w], "counts": [ints]} with "area" = mask area and "bbox" = mask extent.
* bbox results (~56 per image, ~9% of the images with more than 100, so maxDets matters):
  jittered copies of the ground truths (recall ~85%, plus duplicates: true and false positives of
  every IoU), copies with a wrong category, small detections inside crowd regions (ignored
  matches), and random false positives (gamma-Poisson, mean ~46 per image, half of them in the
  image's categories). Scores are in (0, 1) rounded to 3 decimals, so there are many ties; boxes
  are clipped to the image and rounded to 2 decimals; the file lists the detections grouped by
  image, in random order within an image.
* segm results (only when asked: `with_segm`, by default for n_images <= 1000): the same
  detections with a jittered polygon in each box (a copy of a ground truth keeps that object's
  outline), rasterised and stored as compressed RLE {"size": [h, w], "counts": str}.
  pycocotools.mask.frPyObjects of a polygon gives exactly mask.encode of the rasterised polygon
  (without materialising the mask), ~12 us per mask.

Generation time on a 2-CPU machine: 5,000 images (bbox) ~3 s; 50,000 images ~30 s and ~1.7 GB of
memory (instances.json 125 MB, results_bbox.json 240 MB); 500 images with segm ~1 s.

A stats.json next to the files records the statistics of what was written (see `describe`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

GENERATOR_VERSION = 1

COCO_CATEGORIES = [
    (1, "person", "person"), (2, "bicycle", "vehicle"), (3, "car", "vehicle"),
    (4, "motorcycle", "vehicle"), (5, "airplane", "vehicle"), (6, "bus", "vehicle"),
    (7, "train", "vehicle"), (8, "truck", "vehicle"), (9, "boat", "vehicle"),
    (10, "traffic light", "outdoor"), (11, "fire hydrant", "outdoor"), (13, "stop sign", "outdoor"),
    (14, "parking meter", "outdoor"), (15, "bench", "outdoor"), (16, "bird", "animal"),
    (17, "cat", "animal"), (18, "dog", "animal"), (19, "horse", "animal"), (20, "sheep", "animal"),
    (21, "cow", "animal"), (22, "elephant", "animal"), (23, "bear", "animal"),
    (24, "zebra", "animal"), (25, "giraffe", "animal"), (27, "backpack", "accessory"),
    (28, "umbrella", "accessory"), (31, "handbag", "accessory"), (32, "tie", "accessory"),
    (33, "suitcase", "accessory"), (34, "frisbee", "sports"), (35, "skis", "sports"),
    (36, "snowboard", "sports"), (37, "sports ball", "sports"), (38, "kite", "sports"),
    (39, "baseball bat", "sports"), (40, "baseball glove", "sports"), (41, "skateboard", "sports"),
    (42, "surfboard", "sports"), (43, "tennis racket", "sports"), (44, "bottle", "kitchen"),
    (46, "wine glass", "kitchen"), (47, "cup", "kitchen"), (48, "fork", "kitchen"),
    (49, "knife", "kitchen"), (50, "spoon", "kitchen"), (51, "bowl", "kitchen"),
    (52, "banana", "food"), (53, "apple", "food"), (54, "sandwich", "food"),
    (55, "orange", "food"), (56, "broccoli", "food"), (57, "carrot", "food"),
    (58, "hot dog", "food"), (59, "pizza", "food"), (60, "donut", "food"), (61, "cake", "food"),
    (62, "chair", "furniture"), (63, "couch", "furniture"), (64, "potted plant", "furniture"),
    (65, "bed", "furniture"), (67, "dining table", "furniture"), (70, "toilet", "furniture"),
    (72, "tv", "electronic"), (73, "laptop", "electronic"), (74, "mouse", "electronic"),
    (75, "remote", "electronic"), (76, "keyboard", "electronic"), (77, "cell phone", "electronic"),
    (78, "microwave", "appliance"), (79, "oven", "appliance"), (80, "toaster", "appliance"),
    (81, "sink", "appliance"), (82, "refrigerator", "appliance"), (84, "book", "indoor"),
    (85, "clock", "indoor"), (86, "vase", "indoor"), (87, "scissors", "indoor"),
    (88, "teddy bear", "indoor"), (89, "hair drier", "indoor"), (90, "toothbrush", "indoor"),
]
N_CATS = len(COCO_CATEGORIES)
CAT_IDS = np.array([c[0] for c in COCO_CATEGORIES])
MAX_POINTS = 20
SEGM_DEFAULT_MAX_IMAGES = 1000
SMALL, LARGE = 32 ** 2, 96 ** 2


def category_weights() -> np.ndarray:
    """person ~30% of the objects; the other 79 Zipf-like in a fixed (seed-independent) order."""
    order = np.random.default_rng(12345).permutation(N_CATS - 1)
    rest = 1.0 / (order + 2.0) ** 0.9
    weights = np.concatenate([[0.0], rest / rest.sum() * 0.7])
    weights[0] = 0.3
    return weights / weights.sum()


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _scores(rng, logit_mean, n, spread=1.0):
    """Scores in (0, 1), 3 decimals (ties), from a logistic model of confidence."""
    return np.clip(np.round(_sigmoid(logit_mean + rng.normal(0.0, spread, n)), 3), 0.001, 0.999)


def _unit_polygons(rng, n):
    """n star-shaped polygons around (0, 0) in the unit disc: (angles, radii, n_points), padded
    to MAX_POINTS; the angles increase, so the outline never crosses itself."""
    n_points = rng.integers(8, MAX_POINTS + 1, n)
    k = np.arange(MAX_POINTS)
    step = 2 * np.pi / n_points[:, None]
    theta = rng.uniform(0, 2 * np.pi, (n, 1)) + step * (k + rng.uniform(-0.35, 0.35, (n, MAX_POINTS)))
    radius = rng.uniform(0.78, 1.0, (n, MAX_POINTS))
    return theta, radius, n_points


def _place(theta, radius, n_points, box, width, height):
    """Polygon coordinates (n, MAX_POINTS, 2) of unit polygons scaled into boxes [x, y, w, h]
    (the ellipse inscribed in the box), clipped to the image and rounded to 2 decimals, and the
    extents [x, y, w, h] of the first n_points points."""
    cx = box[:, 0] + box[:, 2] / 2
    cy = box[:, 1] + box[:, 3] / 2
    xs = np.clip(cx[:, None] + box[:, 2, None] / 2 * radius * np.cos(theta), 0, width[:, None])
    ys = np.clip(cy[:, None] + box[:, 3, None] / 2 * radius * np.sin(theta), 0, height[:, None])
    xs, ys = np.round(xs, 2), np.round(ys, 2)
    valid = np.arange(MAX_POINTS) < n_points[:, None]
    x0 = np.where(valid, xs, np.inf).min(1)
    y0 = np.where(valid, ys, np.inf).min(1)
    x1 = np.where(valid, xs, -np.inf).max(1)
    y1 = np.where(valid, ys, -np.inf).max(1)
    extent = np.round(np.stack([x0, y0, x1 - x0, y1 - y0], 1), 2)
    return np.stack([xs, ys], 2), extent


def _polygon_lists(coords, n_points) -> list[list[float]]:
    rows = coords.reshape(len(coords), -1).tolist()
    return [row[:2 * n] for row, n in zip(rows, n_points.tolist())]


def _uncompressed_rle(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE counts of a binary mask (column-major runs, starting with 0s)."""
    flat = np.asarray(mask, dtype=np.uint8).ravel(order="F")
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    counts = np.diff(np.concatenate([[0], change, [flat.size]]))
    if flat.size and flat[0]:
        counts = np.concatenate([[0], counts])
    return counts.tolist()


def _offsets(owner, n_owners):
    """start offsets of each owner's rows in an array sorted by owner"""
    return np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_owners))])


# ------------------------------------------------------------------------------ ground truths

def _images(rng, n_images):
    long_side = np.where(rng.random(n_images) < 0.9, 640, rng.integers(400, 640, n_images))
    u = rng.random(n_images)
    short_side = np.where(u < 0.45, 480, np.where(u < 0.75, 427, rng.integers(240, 640, n_images)))
    short_side = np.minimum(short_side, long_side)
    landscape = rng.random(n_images) < 0.7
    width = np.where(landscape, long_side, short_side)
    height = np.where(landscape, short_side, long_side)
    id_space = max(600_000, 12 * n_images)
    image_ids = np.sort(rng.choice(id_space, n_images, replace=False) + 1)
    return image_ids, width, height


def _boxes(rng, side, aspect, fill, width, height):
    """Boxes [x, y, w, h] whose inscribed shape has ~side^2 px: clipped to the image, placed
    uniformly."""
    w = np.clip(side * np.sqrt(aspect / fill), 4.0, width)
    h = np.clip(side / np.sqrt(aspect * fill), 4.0, height)
    x = rng.random(side.size) * (width - w)
    y = rng.random(side.size) * (height - h)
    return np.stack([x, y, w, h], 1)


def _groundtruths(rng, width, height, cat_p):
    n_images = width.size
    n_gt = rng.poisson(rng.gamma(2.0, 7.3 / 2.0, n_images))
    img_cats = rng.choice(N_CATS, size=(n_images, 8), p=cat_p)
    n_img_cats = np.clip(1 + rng.poisson(1.9, n_images), 1, 8)
    img = np.repeat(np.arange(n_images), n_gt)
    n = img.size
    cat = img_cats[img, (rng.random(n) * n_img_cats[img]).astype(np.int64)]
    crowd = rng.random(n) < 0.01
    cat = np.where(crowd & (rng.random(n) < 0.6), 0, cat)  # crowd regions: mostly people
    side = np.where(crowd, np.exp(rng.normal(np.log(150), 0.45, n)),
                    np.exp(rng.normal(np.log(44), 1.1, n)))
    aspect = np.exp(rng.normal(0.0, 0.45, n))
    box = _boxes(rng, side, aspect, 0.72, width[img], height[img])
    theta, radius, n_points = _unit_polygons(rng, n)
    coords, extent = _place(theta, radius, n_points, box, width[img], height[img])
    return {"img": img, "cat": cat, "crowd": crowd, "box": box, "theta": theta, "radius": radius,
            "n_points": n_points, "coords": coords, "bbox": extent, "img_cats": img_cats,
            "n_img_cats": n_img_cats}


def _rasterise_groundtruths(gt, width, height):
    """area (and for crowd regions: uncompressed RLE and bbox) from the rasterised polygons."""
    from pycocotools import mask as mask_utils

    n_images = width.size
    polygons = _polygon_lists(gt["coords"], gt["n_points"])
    area = np.zeros(len(polygons))
    crowd_rle: dict[int, dict] = {}
    bbox = gt["bbox"].copy()
    offsets = _offsets(gt["img"], n_images)
    crowd = gt["crowd"]
    for i in range(n_images):
        lo, hi = offsets[i], offsets[i + 1]
        if lo == hi:
            continue
        h, w = int(height[i]), int(width[i])
        rles = mask_utils.frPyObjects(polygons[lo:hi], h, w)
        area[lo:hi] = mask_utils.area(rles)
        for j in np.flatnonzero(crowd[lo:hi]):
            rle = rles[j]
            crowd_rle[lo + j] = {"size": [h, w], "counts": _uncompressed_rle(mask_utils.decode(rle))}
            bbox[lo + j] = mask_utils.toBbox(rle)
    return polygons, area, crowd_rle, bbox


# --------------------------------------------------------------------------------- detections

def _jitter(rng, box, sigma):
    """Move and resize boxes [x, y, w, h] by relative noise of scale sigma (per box)."""
    n = len(box)
    cx = box[:, 0] + box[:, 2] / 2 + rng.normal(0, 1, n) * sigma * box[:, 2]
    cy = box[:, 1] + box[:, 3] / 2 + rng.normal(0, 1, n) * sigma * box[:, 3]
    w = box[:, 2] * np.exp(rng.normal(0, 1, n) * sigma)
    h = box[:, 3] * np.exp(rng.normal(0, 1, n) * sigma)
    return np.stack([cx - w / 2, cy - h / 2, w, h], 1)


def _detections(rng, gt, width, height, cat_p):
    """All detections as arrays (not yet clipped, ordered or rounded)."""
    n_images = width.size
    n_gt = gt["img"].size
    parts = []

    def add(src, img, cat, box, ellipse, sigma, score, kind):
        parts.append({"src": src, "img": img, "cat": cat, "box": box, "ellipse": ellipse,
                      "sigma": sigma, "score": score,
                      "kind": np.full(img.size, kind, dtype=np.int8)})

    # copies of each object: a first hit (recall ~85%) and duplicates with lower scores
    copies = ((rng.random(n_gt) < 0.85).astype(np.int64) + (rng.random(n_gt) < 0.3)
              + (rng.random(n_gt) < 0.1))
    src = np.repeat(np.arange(n_gt), copies)
    first = np.ones(src.size, dtype=bool)
    first[1:] = src[1:] != src[:-1]
    quality = rng.random(src.size)  # 0: tight box, 1: loose box
    sigma = 0.015 + 0.3 * quality ** 2
    score = _scores(rng, np.where(first, 2.2, 0.0) - 3.0 * quality, src.size)
    add(src, gt["img"][src], gt["cat"][src], _jitter(rng, gt["bbox"][src], sigma),
        _jitter(rng, gt["box"][src], sigma), sigma, score, 0)

    # right place, wrong category
    src = np.flatnonzero(rng.random(n_gt) < 0.15)
    sigma = np.full(src.size, 0.05)
    cat = (gt["cat"][src] + 1 + rng.integers(0, N_CATS - 1, src.size)) % N_CATS
    add(src, gt["img"][src], cat, _jitter(rng, gt["bbox"][src], sigma),
        _jitter(rng, gt["box"][src], sigma), sigma, _scores(rng, -1.0, src.size), 1)

    # individuals inside crowd regions (a match to the crowd region is ignored)
    crowds = np.flatnonzero(gt["crowd"])
    owner = np.repeat(crowds, rng.poisson(6, crowds.size))
    cbox = gt["bbox"][owner]
    h = cbox[:, 3] * rng.uniform(0.15, 0.5, owner.size)
    w = np.minimum(h * rng.uniform(0.3, 0.6, owner.size), cbox[:, 2])
    x = cbox[:, 0] + rng.random(owner.size) * (cbox[:, 2] - w)
    y = cbox[:, 1] + rng.random(owner.size) * (cbox[:, 3] - h)
    box = np.stack([x, y, w, h], 1)
    add(np.full(owner.size, -1), gt["img"][owner], gt["cat"][owner], box, box,
        np.zeros(owner.size), _scores(rng, 0.0, owner.size), 2)

    # random false positives, half of them in the image's own categories
    n_fp = rng.poisson(rng.gamma(2.5, 46.0 / 2.5, n_images))
    img = np.repeat(np.arange(n_images), n_fp)
    own = gt["img_cats"][img, (rng.random(img.size) * gt["n_img_cats"][img]).astype(np.int64)]
    cat = np.where(rng.random(img.size) < 0.5, own, rng.choice(N_CATS, img.size, p=cat_p))
    side = np.exp(rng.normal(np.log(30), 1.1, img.size))
    box = _boxes(rng, side, np.exp(rng.normal(0.0, 0.5, img.size)), 0.72, width[img], height[img])
    add(np.full(img.size, -1), img, cat, box, box, np.zeros(img.size),
        _scores(rng, -2.2, img.size, 1.3), 3)

    dt = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    # the file lists detections grouped by image, in random order within an image
    order = np.lexsort((rng.random(dt["img"].size), dt["img"]))
    dt = {key: value[order] for key, value in dt.items()}
    # clip to the image, at least 1 px, 2 decimals
    W, H = width[dt["img"]].astype(float), height[dt["img"]].astype(float)
    box = dt["box"]
    x0 = np.clip(box[:, 0], 0, W - 1)
    y0 = np.clip(box[:, 1], 0, H - 1)
    x1 = np.clip(box[:, 0] + box[:, 2], x0 + 1, W)
    y1 = np.clip(box[:, 1] + box[:, 3], y0 + 1, H)
    dt["box"] = np.round(np.stack([x0, y0, x1 - x0, y1 - y0], 1), 2)
    return dt


def _segm_results(rng, gt, dt, width, height) -> list[dict]:
    """Compressed-RLE results: a copy of an object keeps its outline (radii a little jittered),
    placed in the detection's jittered ellipse box; other detections get a fresh polygon."""
    from pycocotools import mask as mask_utils

    n = dt["img"].size
    theta, radius, n_points = _unit_polygons(rng, n)
    copy = dt["src"] >= 0
    src = dt["src"][copy]
    theta[copy], n_points[copy] = gt["theta"][src], gt["n_points"][src]
    noise = rng.normal(0, 1, (src.size, MAX_POINTS)) * (0.02 + dt["sigma"][copy, None] / 2)
    radius[copy] = np.clip(gt["radius"][src] + noise, 0.6, 1.0)
    coords, _ = _place(theta, radius, n_points, dt["ellipse"], width[dt["img"]], height[dt["img"]])
    polygons = _polygon_lists(coords, n_points)
    offsets = _offsets(dt["img"], width.size)
    segmentations: list = []
    for i in range(width.size):
        lo, hi = offsets[i], offsets[i + 1]
        if lo < hi:
            h, w = int(height[i]), int(width[i])
            segmentations += [{"size": [h, w], "counts": rle["counts"].decode("ascii")}
                              for rle in mask_utils.frPyObjects(polygons[lo:hi], h, w)]
    return segmentations


# -------------------------------------------------------------------------------------- write

def _dump(obj, path: str) -> None:
    # json.dumps runs the C encoder; json.dump(obj, file) would run the pure-Python one
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, separators=(",", ":")))


def _dump_rows(path: str, n: int, make_rows, chunk: int = 200_000) -> None:
    """Write a JSON list of n rows, built and encoded chunk by chunk (bounded memory)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("[")
        for start in range(0, n, chunk):
            rows = make_rows(start, min(start + chunk, n))
            f.write(("," if start else "") + json.dumps(rows, separators=(",", ":"))[1:-1])
        f.write("]")


def write_coco_dataset(folder: str, n_images: int, seed: int = 0,
                       with_segm: bool | None = None) -> dict[str, str | None]:
    """Write instances.json (COCO ground truths), results_bbox.json and, when with_segm (default:
    n_images <= 1000), results_segm.json into folder, plus stats.json (see `describe`).

    Returns {"groundtruths": path, "predictions": path, "predictions_segm": path or None}.
    Deterministic for (n_images, seed): the segm file does not change the other two.
    """
    if with_segm is None:
        with_segm = n_images <= SEGM_DEFAULT_MAX_IMAGES
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    cat_p = category_weights()
    image_ids, width, height = _images(rng, n_images)
    gt = _groundtruths(rng, width, height, cat_p)
    dt = _detections(rng, gt, width, height, cat_p)
    segm_rng = np.random.default_rng([seed, 1])  # its own stream: bbox data is the same either way
    polygons, area, crowd_rle, gt_bbox = _rasterise_groundtruths(gt, width, height)

    paths = {"groundtruths": os.path.join(folder, "instances.json"),
             "predictions": os.path.join(folder, "results_bbox.json"),
             "predictions_segm": os.path.join(folder, "results_segm.json") if with_segm else None}

    images = [{"id": i, "file_name": f"{i:012d}.jpg", "height": h, "width": w, "license": 1}
              for i, w, h in zip(image_ids.tolist(), width.tolist(), height.tolist())]
    gt_image = image_ids[gt["img"]].tolist()
    gt_cat = CAT_IDS[gt["cat"]].tolist()
    crowd = gt["crowd"].tolist()
    bbox_list = np.round(gt_bbox, 2).tolist()
    annotations = [
        {"id": k + 1, "image_id": gt_image[k], "category_id": gt_cat[k],
         "segmentation": crowd_rle[k] if crowd[k] else [polygons[k]],
         "area": float(area[k]), "bbox": bbox_list[k], "iscrowd": int(crowd[k])}
        for k in range(len(gt_image))
    ]
    _dump({"info": {"description": f"evalbeam synthetic COCO-style data, seed {seed}",
                    "version": str(GENERATOR_VERSION), "year": 2024},
           "licenses": [{"id": 1, "name": "synthetic", "url": ""}],
           "images": images, "annotations": annotations,
           "categories": [{"id": c, "name": name, "supercategory": sup}
                          for c, name, sup in COCO_CATEGORIES]}, paths["groundtruths"])
    del annotations, images, polygons

    n_dt = dt["img"].size
    dt_image = image_ids[dt["img"]]
    dt_cat = CAT_IDS[dt["cat"]]

    def bbox_rows(lo, hi):
        return [{"image_id": i, "category_id": c, "bbox": b, "score": s}
                for i, c, b, s in zip(dt_image[lo:hi].tolist(), dt_cat[lo:hi].tolist(),
                                      dt["box"][lo:hi].tolist(), dt["score"][lo:hi].tolist())]
    _dump_rows(paths["predictions"], n_dt, bbox_rows)
    if with_segm:
        segmentations = _segm_results(segm_rng, gt, dt, width, height)

        def segm_rows(lo, hi):
            return [{"image_id": i, "category_id": c, "segmentation": m, "score": s}
                    for i, c, m, s in zip(dt_image[lo:hi].tolist(), dt_cat[lo:hi].tolist(),
                                          segmentations[lo:hi], dt["score"][lo:hi].tolist())]
        _dump_rows(paths["predictions_segm"], n_dt, segm_rows)

    stats = describe(gt, dt, area, n_images)
    stats.update(n_images=n_images, seed=seed, with_segm=bool(with_segm),
                 generator_version=GENERATOR_VERSION)
    _dump(stats, os.path.join(folder, "stats.json"))
    return paths


def describe(gt, dt, area, n_images) -> dict:
    """Statistics of the generated data."""
    n_gt = np.bincount(gt["img"], minlength=n_images)
    n_dt = np.bincount(dt["img"], minlength=n_images)
    plain = ~gt["crowd"]
    a = area[plain]
    kinds = np.bincount(dt["kind"], minlength=4)
    _, tie_counts = np.unique(dt["score"], return_counts=True)
    return {
        "groundtruths": int(gt["img"].size),
        "groundtruths_per_image": round(float(n_gt.mean()), 3),
        "images_without_groundtruths": int((n_gt == 0).sum()),
        "images_with_30_or_more_groundtruths": int((n_gt >= 30).sum()),
        "max_groundtruths_per_image": int(n_gt.max(initial=0)),
        "crowd": int(gt["crowd"].sum()),
        "size_mix_non_crowd_by_area": {
            "small": round(float((a < SMALL).mean()), 4) if a.size else 0.0,
            "medium": round(float(((a >= SMALL) & (a <= LARGE)).mean()), 4) if a.size else 0.0,
            "large": round(float((a > LARGE).mean()), 4) if a.size else 0.0},
        "categories_with_groundtruths": int(np.unique(gt["cat"]).size),
        "detections": int(dt["img"].size),
        "detections_per_image": round(float(n_dt.mean()), 3),
        "images_with_more_than_100_detections": int((n_dt > 100).sum()),
        "max_detections_per_image": int(n_dt.max(initial=0)),
        "detection_kinds": {"copies_of_objects": int(kinds[0]), "wrong_category": int(kinds[1]),
                            "inside_crowd_regions": int(kinds[2]), "random": int(kinds[3])},
        "distinct_scores": int(tie_counts.size),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Write synthetic COCO-style detection data.")
    parser.add_argument("folder")
    parser.add_argument("--n_images", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--segm", dest="with_segm", action="store_const", const=True, default=None)
    group.add_argument("--no_segm", dest="with_segm", action="store_const", const=False)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    paths = write_coco_dataset(args.folder, args.n_images, args.seed, args.with_segm)
    print(f"written in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(json.dumps(paths, indent=1))
    with open(os.path.join(args.folder, "stats.json"), encoding="utf-8") as f:
        print(json.dumps(json.load(f), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
