"""Validation of COCO annotations and results into columns, with a reason per bad row.

Positions are 0-based indices in the file's "annotations" array (ground truth) or in the results
array (detections), reported as "row" in rejected.jsonl. A COCO file is one JSON document, read
whole by coco_document, or a results file in pieces (schemas/json_pieces.py) by coco_piece.

Bounds on geometry, so that no row computes garbage or costs unbounded memory:
- every box and polygon number lies within +-MAX_COORDINATE (1e150). Areas are then at most
  (2e150)**2 = 4e300, so an area, the sum of two areas (an IoU's denominator) and an
  intersection are finite float64 numbers; a 1e300 box would overflow to inf and two identical
  ones would score IoU nan (no match, AP 0).
- a COCO polygon that pycocotools rasterises (--iou_type segm) lies within +-MAX_POLYGON_COORDINATE
  (1e8) and its boundary is at most MAX_POLYGON_BOUNDARY (1,000,000) pixels long: pycocotools
  converts the points, times 5, to 32-bit integers (larger ones crash it) and walks the boundary
  in steps of 1/5 pixel, about 40 bytes per pixel of boundary, before clipping to the image.
"""

from __future__ import annotations

import gc
import itertools
import json
import sys
from dataclasses import dataclass

import numpy as np

from evalbeam.schemas.coco import rle_problem
from evalbeam.schemas.json_pieces import ESCAPE, depth_steps, piece_text
from evalbeam.schemas.limits import MAX_IMAGE_PIXELS, image_size_problem
from evalbeam.schemas.safe_json import (BOM, MAX_NESTING, json_value, slice_value_problem,
                                        surrogate_in)
from evalbeam.schemas.slices import canonical_json

_FLOAT_MAX = sys.float_info.max
MAX_COORDINATE = 1e150
MAX_POLYGON_COORDINATE = 1e8
MAX_POLYGON_BOUNDARY = 1_000_000
# A COCO file holds its rows two levels down ({"annotations": [row]}); rows nest at most
# MAX_NESTING levels, as in every other input.
MAX_DOCUMENT_NESTING = MAX_NESTING + 2
INT64 = (-(1 << 63), (1 << 63) - 1)    # ids are kept in int64 columns


def _number(x) -> bool:
    """A finite int or float. Compared, not converted: an int beyond float range (JSON integers
    are unbounded) is not finite, where math.isfinite would raise OverflowError."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and -_FLOAT_MAX <= x <= _FLOAT_MAX


def _int64(x) -> bool:
    """An integer id that fits the int64 columns ids are kept in (JSON integers are unbounded)."""
    return isinstance(x, int) and not isinstance(x, bool) and INT64[0] <= x <= INT64[1]


def coordinate_problem(what: str, values) -> str | None:
    """Why a geometry with these coordinates (finite numbers) is not evaluated, or None."""
    largest = max((abs(v) for v in values), default=0.0)
    if largest > MAX_COORDINATE:
        return (f"{what} has a coordinate of magnitude {largest:g}, beyond {MAX_COORDINATE:g}: its "
                "area (or its IoU with another geometry) would overflow 64-bit floats")
    return None


def _box_problem(box) -> str | None:
    if not isinstance(box, list) or len(box) != 4 or not all(_number(v) for v in box):
        return "bbox must be [x, y, width, height] with 4 finite numbers"
    if box[2] < 0 or box[3] < 0:
        return "bbox width and height must not be negative"
    return coordinate_problem("bbox", box)


def polygon_cost_problem(polygon: list) -> str | None:
    """Why pycocotools cannot rasterise a COCO polygon [x1, y1, x2, y2, ...] (finite numbers)
    at a bounded cost, or None: points beyond +-MAX_POLYGON_COORDINATE, or a boundary longer
    than MAX_POLYGON_BOUNDARY pixels, measured as pycocotools walks it (per edge, the larger of
    |dx| and |dy|)."""
    largest = max(abs(v) for v in polygon)
    if largest > MAX_POLYGON_COORDINATE:
        return (f"polygon has a coordinate of magnitude {largest:g}, beyond "
                f"{MAX_POLYGON_COORDINATE:g}, which pycocotools cannot rasterise")
    xs, ys = polygon[0::2], polygon[1::2]
    length = sum(max(abs(x1 - x0), abs(y1 - y0))
                 for x0, y0, x1, y1 in zip(xs, ys, xs[1:] + xs[:1], ys[1:] + ys[:1]))
    if length > MAX_POLYGON_BOUNDARY:
        return (f"polygon boundary is {length:,.0f} pixels long, beyond the limit of "
                f"{MAX_POLYGON_BOUNDARY:,} (rasterising it would take about 40 bytes per pixel)")
    return None


def polygons_valid(segmentations: list) -> bool:
    """Whether every number of every polygon of these segmentations is an int or float that
    passes polygon_cost_problem (RLEs are skipped): the per-value checks of
    _segmentation_problem, vectorised over all polygons of a file at once (the fast path)."""
    polygons = [p for seg in segmentations if isinstance(seg, list) for p in seg]
    if not polygons:
        return True
    if set(map(type, itertools.chain.from_iterable(polygons))) - {int, float}:
        return False
    sizes = np.fromiter(map(len, polygons), dtype=np.int64, count=len(polygons))
    try:
        flat = np.fromiter(itertools.chain.from_iterable(polygons), dtype=np.float64,
                           count=int(sizes.sum()))
    except OverflowError:   # an int beyond float range
        return False
    if not (np.abs(flat) <= MAX_POLYGON_COORDINATE).all():     # NaN fails too
        return False
    points = flat.reshape(-1, 2)                  # every polygon has an even number of values
    first = np.r_[0, np.cumsum(sizes // 2)[:-1]]
    following = np.arange(1, len(points) + 1)
    following[first + sizes // 2 - 1] = first     # each polygon's last point closes on its first
    steps = np.abs(points[following] - points).max(axis=1)
    return bool((np.add.reduceat(steps, first) <= MAX_POLYGON_BOUNDARY).all())


def _segmentation_problem(seg, max_pixels: int = MAX_IMAGE_PIXELS, values: bool = True) -> str | None:
    """Why a COCO segmentation cannot be used, or None. values=False checks only the shape of
    polygons, not their numbers: the fast path checks those vectorised (polygons_valid)."""
    if isinstance(seg, list):
        if not seg or not all(isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0
                              and (not values or all(_number(v) for v in p)) for p in seg):
            return "polygon segmentation must be lists of at least 3 (x, y) points"
        for polygon in seg if values else ():
            problem = polygon_cost_problem(polygon)
            if problem:
                return f"segmentation: {problem}"
        return None
    if isinstance(seg, dict):
        problem = rle_problem(seg, max_pixels)
        return f"segmentation: {problem}" if problem else None
    return "segmentation must be polygons or an RLE object"


_KEEP = b'[]{}"'
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _KEEP)


def document_depth(raw: bytes) -> int:
    """Deepest nesting of objects and arrays in a JSON document of any size, brackets inside
    strings not counted. Escapes (a backslash and the character after it) are removed first, so
    every quote left delimits a string; then only brackets and quotes are kept (a C-speed
    translate: a COCO file shrinks to a small part of its bytes) and the depth is a running sum
    over them."""
    if b"\\" in raw:
        raw = ESCAPE.sub(b"", raw)
    kept = np.frombuffer(raw.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    # In pieces of 4 Mi structure bytes, carrying the string parity and the depth across:
    # arrays the size of a whole results file would each be fresh memory, and int8 steps
    # summed as int32 move a fraction of the bytes that int64 ones would.
    deepest = depth = parity = 0
    for start in range(0, kept.size, _DEPTH_PIECE):
        inside, step = depth_steps(kept[start:start + _DEPTH_PIECE], parity)
        parity = int(inside[-1])
        running = np.cumsum(step, dtype=np.int32)
        deepest = max(deepest, depth + int(running.max()))
        depth += int(running[-1])
    return deepest


_DEPTH_PIECE = 1 << 22


def _parse(raw: bytes):
    """json.loads(raw)'s value (safe_json.json_value: by orjson when it gives the same), with
    the cyclic garbage collector paused."""
    # A parse builds one tree of fresh objects and no reference cycle: the cyclic collector,
    # run again and again as the tree grows, would walk it for nothing
    enabled = gc.isenabled()
    gc.disable()
    try:
        return json_value(raw)
    finally:
        if enabled:
            gc.enable()


def coco_document(raw: bytes):
    """(value, None) of a COCO file's bytes, or (None, reason) when it is not one usable JSON
    document: nested deeper than MAX_DOCUMENT_NESTING (checked before parsing, so the result
    does not depend on a worker's recursion limit), cut short, not JSON, several JSON documents
    (JSON lines), or holding a lone UTF-16 surrogate (not text: outputs could not be written).
    A UTF-8 byte order mark is skipped."""
    if raw.startswith(BOM):
        raw = raw[len(BOM):]
    if document_depth(raw) > MAX_DOCUMENT_NESTING:
        return None, (f"nests JSON deeper than {MAX_DOCUMENT_NESTING} levels (a COCO file needs "
                      "fewer than 10)")
    try:
        value = _parse(raw)
    except RecursionError:   # unreachable after the depth check; no parse may crash a worker
        return None, f"nests JSON deeper than {MAX_DOCUMENT_NESTING} levels"
    except json.JSONDecodeError as error:
        if error.pos >= len(raw.rstrip()):
            return None, (f"ends in the middle of its JSON document ({error.msg} at byte "
                          f"{error.pos:,}): it was probably cut short while being written, "
                          "copied or downloaded")
        if error.msg == "Extra data":
            return None, ("holds more than one JSON document (JSON lines?); a COCO file is one "
                          "JSON document")
        return None, f"is not valid JSON ({error})"
    except ValueError as error:   # not UTF-8 text
        return None, f"is not valid JSON text ({error})"
    where = surrogate_in(raw, value)
    if where is not None:
        return None, (f"holds a lone UTF-16 surrogate (an escape such as \\ud800 without its "
                      f"pair) in {where}: not valid Unicode text")
    return value, None


def coco_piece(raw: bytes, first: bool, last: bool) -> list | None:
    """The elements of one piece of an array cut by schemas.json_pieces.array_pieces (a results
    file's, an instances file's annotations), in order; None when the piece does not parse to a
    non-empty JSON array: the document is then not valid JSON, or holds a lone surrogate, and
    parsing it whole (coco_document) names the reason. The cut has checked the depth
    (array_pieces' max_depth) and dropped no byte order mark but the first piece's."""
    try:
        value = _parse(piece_text(raw, first, last))
    except (ValueError, RecursionError):    # JSONDecodeError and UnicodeDecodeError too
        return None
    if not isinstance(value, list) or not value:
        return None
    if surrogate_in(raw, value) is not None:
        return None
    return value

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


def _size_problem(height, width, max_pixels: int) -> str | None:
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (height, width)):
        return ("--iou_type segm needs the image's height and width (non-negative integers; masks "
                f"are drawn at that size), got {[height, width]}")
    return image_size_problem(height, width, max_pixels, "image")


def image_rows(images: list, slice_keys: list[str], need_size: bool = False,
               max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[ImageRows, list[tuple[int, str]]]:
    """Valid images and [(position, reason)]: an image needs an integer id (unique); with
    need_size (masks are rasterised at the image's size), integer height and width of at most
    max_pixels pixels (pycocotools would fail on negative sizes, and polygons of an image without
    a size would be empty masks). Slice values come from image["metadata"][key], else
    image[key], and must be finite and at most MAX_SLICE_CHARS characters as JSON
    (schemas.safe_json.slice_value_problem)."""

    def meta(im, key):
        m = im.get("metadata")
        return m[key] if isinstance(m, dict) and key in m else im.get(key)

    good, bad = [], []
    for i, im in enumerate(images):
        if not isinstance(im, dict) or not isinstance(im.get("id"), int) or isinstance(im.get("id"), bool):
            bad.append((i, "image must be an object with an integer id"))
        elif not _int64(im["id"]):
            bad.append((i, f"image id {im['id']} does not fit a 64-bit integer"))
        else:
            good.append(i)
    ids = np.array([images[i]["id"] for i in good], dtype=np.int64)
    unique, counts = np.unique(ids, return_counts=True)
    repeated = set(unique[counts > 1].tolist())
    kept = []
    for i in good:
        im = images[i]
        problem = next(filter(None, (slice_value_problem(k, meta(im, k)) for k in slice_keys)), None)
        if im["id"] in repeated:
            problem = f"image id {im['id']} appears more than once"
        elif problem is None and need_size:
            problem = _size_problem(im.get("height"), im.get("width"), max_pixels)
        if problem:
            bad.append((i, problem))
        else:
            kept.append(i)
    chosen = [images[i] for i in kept]
    rows = ImageRows(
        image_id=np.array([im["id"] for im in chosen], dtype=np.int64),
        height=np.array([im.get("height") if isinstance(im.get("height"), int) else 0 for im in chosen], dtype=np.int64),
        width=np.array([im.get("width") if isinstance(im.get("width"), int) else 0 for im in chosen], dtype=np.int64),
        slices={key: [canonical_json(meta(im, key)) for im in chosen] for key in slice_keys},
        position=np.array(kept, dtype=np.int64),
    )
    return rows, sorted(bad)


def box_rows(items: list, detections: bool, need_segmentation: bool,
             max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[BoxRows, list[tuple[int, str]]]:
    """Valid annotations (detections=False) or results (True) and [(position, reason)].

    Every row needs integer image_id and category_id; ground truth needs a bbox (bbox IoU), a
    finite non-negative "area"; detections a score in [0, 1] and a bbox or a segmentation;
    with need_segmentation a valid segmentation (an RLE of at most max_pixels pixels). Boxes and
    polygons must lie within the coordinate bounds of the module docstring. Clean files take a
    column-wise fast path; when it finds anything wrong, every row is checked one by one to give
    each bad row its reason."""
    fast = _fast_columns(items, detections, need_segmentation, max_pixels)
    if fast is not None:
        return fast, []
    good, bad = [], []
    for i, row in enumerate(items):
        problem = _row_problem(row, detections, need_segmentation, max_pixels)
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


def _fast_columns(items: list, detections: bool, need_segmentation: bool,
                  max_pixels: int = MAX_IMAGE_PIXELS) -> BoxRows | None:
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
    try:   # OverflowError: an id beyond int64, or an int beyond float range
        image_ids = np.array(image_id, dtype=np.int64)
        category_ids = np.array(category_id, dtype=np.int64)
        bbox = np.array(boxes, dtype=np.float64).reshape(len(items), 4)
        numbers = np.array(value, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        return None
    if set(map(type, itertools.chain.from_iterable(boxes))) - {int, float}:
        return None
    has_box = ~np.isnan(bbox).all(axis=1) if need_segmentation else np.ones(len(items), bool)
    if not (np.isfinite(numbers).all() and np.isfinite(bbox[has_box]).all()
            and (bbox[has_box][:, 2:] >= 0).all()
            and (np.abs(bbox[has_box]) <= MAX_COORDINATE).all()):
        return None
    if (detections and ((numbers < 0) | (numbers > 1)).any()) or (not detections and (numbers < 0).any()):
        return None
    if need_segmentation and (
            any(_segmentation_problem(r.get("segmentation"), max_pixels, values=False) for r in items)
            or not polygons_valid([r.get("segmentation") for r in items])):
        return None
    return BoxRows(
        image_id=image_ids, category_id=category_ids, bbox=bbox, value=numbers,
        crowd=(np.zeros(len(items), bool) if detections
               else np.array([bool(r.get("iscrowd", 0)) for r in items], dtype=bool)),
        segmentation=[r.get("segmentation") for r in items] if need_segmentation else None,
        position=np.arange(len(items), dtype=np.int64),
    )


def _row_problem(row, detections: bool, need_segmentation: bool,
                 max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    if not isinstance(row, dict):
        return "row must be a JSON object"
    for field in ("image_id", "category_id"):
        v = row.get(field)
        if not isinstance(v, int) or isinstance(v, bool):
            return f"{field} must be an integer"
        if not _int64(v):
            return f"{field} {v} does not fit a 64-bit integer"
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
        problem = _segmentation_problem(row.get("segmentation"), max_pixels)
        if problem:
            return problem
        if box:
            return _box_problem(box)
        return None
    return _box_problem(box)
