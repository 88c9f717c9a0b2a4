"""COCO files: an instances JSON (ground truth) and a results JSON (detections), as columns.

Follows what pycocotools does when it loads them:
- images are ordered by id (pycocotools sorts image ids); categories by id;
- ground-truth "area" is taken from the file (not recomputed), "iscrowd" marks crowd regions;
- results: for bbox results (the first result has a non-empty "bbox"), area = w * h; otherwise
  the area of the segmentation mask; a missing bbox of a segm result comes from the mask;
- segmentation polygons (lists of [x1, y1, x2, y2, ...]) and uncompressed RLEs are converted to
  compressed RLE with the image's height and width, as pycocotools' annToRLE does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class CocoGroundTruth:
    """image_id int64[I] (sorted), height, width int64[I]; categories: id int64[K] (sorted) and
    names; annotations in file order: image int64[M] (index into image_id), category int64[M]
    (index into category_id), bbox float64[M, 4] (x, y, w, h), area float64[M], crowd bool[M],
    segmentation (list of M raw objects, or None when not needed)."""

    image_id: np.ndarray
    height: np.ndarray
    width: np.ndarray
    category_id: np.ndarray
    category_name: list
    image: np.ndarray
    category: np.ndarray
    bbox: np.ndarray
    area: np.ndarray
    crowd: np.ndarray
    segmentation: list | None


@dataclass
class CocoResults:
    """Detections in file order: image_id int64[N], category_id int64[N], score float64[N],
    bbox float64[N, 4] (NaN when absent), segmentation (list of N raw objects or None)."""

    image_id: np.ndarray
    category_id: np.ndarray
    score: np.ndarray
    bbox: np.ndarray
    segmentation: list | None


def is_instances(obj) -> bool:
    return isinstance(obj, dict) and "annotations" in obj and "images" in obj


def is_results(obj) -> bool:
    return isinstance(obj, list) and (not obj or (isinstance(obj[0], dict) and "image_id" in obj[0]
                                                  and "score" in obj[0]))


def groundtruth_columns(obj: dict, with_segmentation: bool) -> CocoGroundTruth:
    images = sorted(obj["images"], key=lambda im: im["id"])
    image_id = np.array([im["id"] for im in images], dtype=np.int64)
    categories = sorted(obj.get("categories", []), key=lambda c: c["id"])
    category_id = np.array([c["id"] for c in categories], dtype=np.int64)
    anns = obj["annotations"]
    return CocoGroundTruth(
        image_id=image_id,
        height=np.array([im.get("height", 0) for im in images], dtype=np.int64),
        width=np.array([im.get("width", 0) for im in images], dtype=np.int64),
        category_id=category_id,
        category_name=[c.get("name", str(c["id"])) for c in categories],
        image=np.searchsorted(image_id, np.array([a["image_id"] for a in anns], dtype=np.int64)),
        category=np.searchsorted(category_id, np.array([a["category_id"] for a in anns], dtype=np.int64)),
        bbox=np.array([a.get("bbox") or [0, 0, 0, 0] for a in anns], dtype=np.float64).reshape(-1, 4),
        area=np.array([a.get("area", 0.0) for a in anns], dtype=np.float64),
        crowd=np.array([bool(a.get("iscrowd", 0)) for a in anns], dtype=bool),
        segmentation=[a.get("segmentation") for a in anns] if with_segmentation else None,
    )


def results_columns(obj: list, with_segmentation: bool) -> CocoResults:
    def box(r):
        b = r.get("bbox")
        return b if b else [np.nan] * 4

    return CocoResults(
        image_id=np.array([r["image_id"] for r in obj], dtype=np.int64),
        category_id=np.array([r["category_id"] for r in obj], dtype=np.int64),
        score=np.array([r["score"] for r in obj], dtype=np.float64),
        bbox=np.array([box(r) for r in obj], dtype=np.float64).reshape(-1, 4),
        segmentation=[r.get("segmentation") for r in obj] if with_segmentation else None,
    )


def to_rle(segmentation, height: int, width: int):
    """A compressed RLE (pycocotools' dict) from a polygon list, uncompressed or compressed RLE."""
    from pycocotools import mask as mask_utils

    if isinstance(segmentation, list):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    if isinstance(segmentation.get("counts"), list):
        return mask_utils.frPyObjects(segmentation, height, width)
    return segmentation
