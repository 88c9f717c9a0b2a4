"""Validation of COCO annotations and results into columns, with a reason per bad row.

Positions are 0-based indices in the file's "annotations" array (ground truth) or in the results
array (detections), reported as "row" in rejected.jsonl.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from schemas.coco import rle_problem

from schemas.rows import canonical_json


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _box_problem(box) -> str | None:
    if not isinstance(box, list) or len(box) != 4 or not all(_number(v) for v in box):
        return "bbox must be [x, y, width, height] with 4 finite numbers"
    if box[2] < 0 or box[3] < 0:
        return "bbox width and height must not be negative"
    return None


def _segmentation_problem(seg) -> str | None:
    if isinstance(seg, list):
        if not seg or not all(isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0
                              and all(_number(v) for v in p) for p in seg):
            return "polygon segmentation must be lists of at least 3 (x, y) points"
        return None
    if isinstance(seg, dict):
        problem = rle_problem(seg)
        return f"segmentation: {problem}" if problem else None
    return "segmentation must be polygons or an RLE object"


@dataclass
class ImageRows:
    """Images of a ground-truth file: id int64[I], height and width int64[I], slice values
    {key: list of canonical JSON str}, position int64[I] (index in "images", or line/row of a
    native row), file_id int32[I] (index in the source's files)."""

    image_id: np.ndarray
    height: np.ndarray
    width: np.ndarray
    slices: dict
    position: np.ndarray
    file_id: np.ndarray | None = None
    uid: list | None = None     # datum_uid of native rows; COCO images are named by their id

    def __post_init__(self):
        if self.file_id is None:
            self.file_id = np.zeros(self.image_id.size, dtype=np.int32)
        if self.uid is None:
            self.uid = [str(i) for i in self.image_id.tolist()]


@dataclass
class BoxRows:
    """Annotations or detections in file order: image_id int64[n], category_id int64[n],
    bbox float64[n, 4] (NaN when absent), score float64[n] (detections) or area float64[n] and
    crowd bool[n] (ground truth), segmentation list or None, position int64[n]."""

    image_id: np.ndarray
    category_id: np.ndarray
    bbox: np.ndarray
    value: np.ndarray          # score for detections, area for ground truths
    crowd: np.ndarray
    segmentation: list | None
    position: np.ndarray

    def take(self, index: np.ndarray) -> "BoxRows":
        index = np.asarray(index, dtype=np.int64)
        return BoxRows(self.image_id[index], self.category_id[index], self.bbox[index],
                       self.value[index], self.crowd[index],
                       None if self.segmentation is None else [self.segmentation[i] for i in index],
                       self.position[index])


def image_rows(images: list, slice_keys: list[str]) -> tuple[ImageRows, list[tuple[int, str]]]:
    """Valid images and [(position, reason)]: an image needs an integer id (unique) and, for
    masks, integer height and width. Slice values come from image["metadata"][key], else
    image[key]."""
    good, bad = [], []
    for i, im in enumerate(images):
        if not isinstance(im, dict) or not isinstance(im.get("id"), int) or isinstance(im.get("id"), bool):
            bad.append((i, "image must be an object with an integer id"))
        else:
            good.append(i)
    ids = np.array([images[i]["id"] for i in good], dtype=np.int64)
    unique, counts = np.unique(ids, return_counts=True)
    repeated = set(unique[counts > 1].tolist())
    kept = []
    for i in good:
        if images[i]["id"] in repeated:
            bad.append((i, f"image id {images[i]['id']} appears more than once"))
        else:
            kept.append(i)
    chosen = [images[i] for i in kept]

    def meta(im, key):
        m = im.get("metadata")
        return m[key] if isinstance(m, dict) and key in m else im.get(key)

    rows = ImageRows(
        image_id=np.array([im["id"] for im in chosen], dtype=np.int64),
        height=np.array([im.get("height") if isinstance(im.get("height"), int) else 0 for im in chosen], dtype=np.int64),
        width=np.array([im.get("width") if isinstance(im.get("width"), int) else 0 for im in chosen], dtype=np.int64),
        slices={key: [canonical_json(meta(im, key)) for im in chosen] for key in slice_keys},
        position=np.array(kept, dtype=np.int64),
    )
    return rows, sorted(bad)


def box_rows(items: list, detections: bool, need_segmentation: bool,
             ) -> tuple[BoxRows, list[tuple[int, str]]]:
    """Valid annotations (detections=False) or results (True) and [(position, reason)].

    Every row needs integer image_id and category_id; ground truth needs a bbox (bbox IoU), a
    finite non-negative "area"; detections a score in [0, 1] and a bbox or a segmentation;
    with need_segmentation a valid segmentation. Clean files take a column-wise fast path; when
    it finds anything wrong, every row is checked one by one to give each bad row its reason."""
    fast = _fast_columns(items, detections, need_segmentation)
    if fast is not None:
        return fast, []
    good, bad = [], []
    for i, row in enumerate(items):
        problem = _row_problem(row, detections, need_segmentation)
        if problem:
            bad.append((i, problem))
        else:
            good.append(i)
    rows = [items[i] for i in good]
    value_key = "score" if detections else "area"
    return BoxRows(
        image_id=np.array([r["image_id"] for r in rows], dtype=np.int64),
        category_id=np.array([r["category_id"] for r in rows], dtype=np.int64),
        bbox=np.array([r.get("bbox") or _NO_BOX for r in rows], dtype=np.float64).reshape(-1, 4),
        value=np.array([r.get(value_key, 0.0) for r in rows], dtype=np.float64),
        crowd=np.array([bool(r.get("iscrowd", 0)) for r in rows], dtype=bool),
        segmentation=[r.get("segmentation") for r in rows] if need_segmentation else None,
        position=np.array(good, dtype=np.int64),
    ), bad


_NO_BOX = [float("nan")] * 4


def _fast_columns(items: list, detections: bool, need_segmentation: bool) -> BoxRows | None:
    """The columns of a file in which every row is valid, or None (then check row by row)."""
    value_key = "score" if detections else "area"
    try:
        image_id = [r["image_id"] for r in items]
        category_id = [r["category_id"] for r in items]
        value = [r[value_key] for r in items]
        boxes = ([r.get("bbox") or _NO_BOX for r in items] if need_segmentation
                 else [r["bbox"] for r in items])
    except (KeyError, TypeError, IndexError):
        return None
    if set(map(type, image_id)) - {int} or set(map(type, category_id)) - {int}:
        return None
    if set(map(type, value)) - {int, float}:
        return None
    try:
        bbox = np.array(boxes, dtype=np.float64).reshape(len(items), 4)
    except (ValueError, TypeError):
        return None
    if set(map(type, itertools.chain.from_iterable(boxes))) - {int, float}:
        return None
    numbers = np.array(value, dtype=np.float64)
    has_box = ~np.isnan(bbox).all(axis=1) if need_segmentation else np.ones(len(items), bool)
    if not (np.isfinite(numbers).all() and np.isfinite(bbox[has_box]).all()
            and (bbox[has_box][:, 2:] >= 0).all()):
        return None
    if (detections and ((numbers < 0) | (numbers > 1)).any()) or (not detections and (numbers < 0).any()):
        return None
    if need_segmentation and any(_segmentation_problem(r.get("segmentation")) for r in items):
        return None
    return BoxRows(
        image_id=np.array(image_id, dtype=np.int64), category_id=np.array(category_id, dtype=np.int64),
        bbox=bbox, value=numbers,
        crowd=(np.zeros(len(items), bool) if detections
               else np.array([bool(r.get("iscrowd", 0)) for r in items], dtype=bool)),
        segmentation=[r.get("segmentation") for r in items] if need_segmentation else None,
        position=np.arange(len(items), dtype=np.int64),
    )


def _row_problem(row, detections: bool, need_segmentation: bool) -> str | None:
    if not isinstance(row, dict):
        return "row must be a JSON object"
    for field in ("image_id", "category_id"):
        v = row.get(field)
        if not isinstance(v, int) or isinstance(v, bool):
            return f"{field} must be an integer"
    if detections:
        score = row.get("score")
        if not _number(score) or not 0.0 <= score <= 1.0:
            return f"score {score!r} is not a number in [0, 1]"
    else:
        area = row.get("area")
        if not _number(area) or area < 0:
            return f"area {area!r} is not a finite number >= 0"
    box = row.get("bbox")
    if need_segmentation:
        problem = _segmentation_problem(row.get("segmentation"))
        if problem:
            return problem
        if box:
            return _box_problem(box)
        return None
    return _box_problem(box)
