"""Native detection rows (JSONL or Parquet), validated into the columns the COCO path uses.

Row: {"datum_uid": str, "metadata"?: {str: scalar}, "annotations": [{"label": str,
"score": float (predictions), "bbox": [xmin, ymin, xmax, ymax] | "polygon": [[x, y], ...] (or
rings, or polygons) | "raster": COCO RLE {"size": [h, w], "counts": str | [int, ...]},
"iscrowd"?: bool}]}.
A datum is an image whose id is the FNV-1a hash of its datum_uid (as int64); a label is a
category whose id is the hash of the label. Boxes become COCO's [x, y, w, h]; a ground truth's
area is the area of its geometry. Geometries are converted as Valor does (geometry_of): with
--iou_type bbox a polygon or raster stands for its bounding box; with --iou_type segm polygons
(shapely) and rasters (Raster) are compared exactly and a bbox stands for its rectangle.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from evalbeam.schemas.coco import rle_problem
from evalbeam.schemas.coco_rows import MAX_COORDINATE, BoxRows, ImageRows, coordinate_problem
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.schemas.limits import MAX_IMAGE_PIXELS, MAX_LABEL_CHARS, label_problem, row_uid_problem
from evalbeam.schemas.safe_json import metadata_problem
from evalbeam.schemas.slices import canonical_json

_FLOAT_MAX = sys.float_info.max


@dataclass
class RowIndex:
    """The rows of a prediction file: image_id int64[n] (hash of datum_uid), uid list,
    position int64[n] (line or row number), file_id int32[n] (index in the source's files)."""

    image_id: np.ndarray
    uid: list
    position: np.ndarray
    file_id: np.ndarray

    def take(self, index) -> "RowIndex":
        index = np.asarray(index, dtype=np.int64)
        return RowIndex(self.image_id[index], [self.uid[i] for i in index], self.position[index],
                        self.file_id[index])


class Raster:
    """A native raster annotation: a compressed COCO RLE ({"size": [h, w], "counts": bytes}).
    Pixel (row y, column x) is the unit square [x, x + 1] x [y, y + 1], so its polygon form
    (transforms.kernels.masks.as_polygon) has exactly the mask's area and a raster's IoU is the same in either form."""

    __slots__ = ("rle",)

    def __init__(self, rle: dict):
        self.rle = rle

    def __reduce__(self):
        return Raster, (self.rle,)

    @property
    def size(self) -> tuple[int, int]:
        return tuple(self.rle["size"])

    @property
    def area(self) -> float:
        from pycocotools import mask as mask_utils

        return float(mask_utils.area(self.rle))

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """(xmin, ymin, xmax, ymax) of the set pixels (zeros for an empty mask)."""
        from pycocotools import mask as mask_utils

        x, y, w, h = (float(v) for v in mask_utils.toBbox(self.rle))
        return x, y, x + w, y + h


def geometry_area(geometries: list) -> np.ndarray:
    """float64 areas of shapely geometries and Rasters (pixel counts)."""
    import shapely

    return np.array([g.area if isinstance(g, Raster) else shapely.area(g) for g in geometries],
                    dtype=np.float64)


def stable_id(texts: list[str]) -> np.ndarray:
    """int64 ids from strings (FNV-1a 64, reinterpreted as signed)."""
    return fnv1a_64(pa.array(texts, pa.string())).view(np.int64)


def _finite(x) -> bool:
    """A finite int or float (compared, not converted: an int beyond float range is not)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and -_FLOAT_MAX <= x <= _FLOAT_MAX


def polygon_of(value):
    """A shapely geometry from [[x, y], ...] (one ring), a list of rings (exterior, then holes)
    or a list of such polygons (a multipolygon); None when the value has none of these shapes."""
    import shapely

    def ring(points):
        if (isinstance(points, list) and len(points) >= 3 and all(
                isinstance(p, list) and len(p) == 2 and all(_finite(v) for v in p) for p in points)):
            return points
        return None

    def polygon(rings):
        if not isinstance(rings, list) or not rings:
            return None
        parts = [ring(r) for r in rings]
        return shapely.Polygon(parts[0], parts[1:]) if all(p is not None for p in parts) else None

    if not isinstance(value, list) or not value:
        return None
    if ring(value) is not None:
        return shapely.Polygon(value)
    if polygon(value) is not None:
        return polygon(value)
    parts = [polygon(p) for p in value]
    return shapely.MultiPolygon(parts) if all(p is not None for p in parts) else None


def raster_of(value, max_pixels: int = MAX_IMAGE_PIXELS):
    """A Raster from a COCO RLE object (compressed string or list of run lengths) of at most
    max_pixels pixels, or the reason it cannot be one (a str)."""
    problem = rle_problem(value, max_pixels)
    if problem:
        return f"raster: {problem}"
    rle = {"size": list(value["size"]), "counts": value["counts"]}
    if isinstance(rle["counts"], list):
        from pycocotools import mask as mask_utils

        rle = mask_utils.frPyObjects(rle, *rle["size"])
    elif isinstance(rle["counts"], str):
        rle["counts"] = rle["counts"].encode("ascii")
    return Raster(rle)


def _bounded(x) -> bool:
    """A number within +-MAX_COORDINATE (so finite): one comparison chain, as cheap as isfinite."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and -MAX_COORDINATE <= x <= MAX_COORDINATE


def _box_problem(box) -> str | None:
    if not isinstance(box, list) or len(box) != 4 or not all(_bounded(v) for v in box):
        if isinstance(box, list) and len(box) == 4 and all(_finite(v) for v in box):
            return coordinate_problem("bbox", box)
        return "bbox must be [xmin, ymin, xmax, ymax] with 4 finite numbers"
    if box[2] < box[0] or box[3] < box[1]:
        return "bbox has xmax < xmin or ymax < ymin"
    return None


def geometry_of(ann: dict, geometry: str, max_pixels: int = MAX_IMAGE_PIXELS):
    """The annotation's geometry for the IoU type, or the reason it has none (a str).

    "bbox": the bbox, else the bounds of its polygon or raster (a tuple). "polygon" (segm): the
    polygon (shapely) or raster (Raster), else its bbox as a rectangle. Keys are tried in that
    order; the first one present decides. Boxes and polygons must lie within +-MAX_COORDINATE
    (their areas and IoUs stay finite), rasters within max_pixels pixels."""
    kinds = ("bbox", "polygon", "raster") if geometry == "bbox" else ("polygon", "raster", "bbox")
    key = next((k for k in kinds if k in ann), None)
    if key is None:
        return "annotation has no bbox, polygon or raster"
    if key == "bbox":
        problem = _box_problem(ann["bbox"])
        if problem:
            return problem
        if geometry == "bbox":
            return tuple(float(v) for v in ann["bbox"])
        import shapely

        return shapely.box(*ann["bbox"])
    if key == "polygon":
        shape = polygon_of(ann["polygon"])
        if shape is None:
            return "polygon must be [[x, y], ...] with at least 3 finite points (or rings / polygons)"
        if max(map(abs, shape.bounds)) > MAX_COORDINATE:   # bounds hold the extreme coordinates
            return coordinate_problem("polygon", shape.bounds)
        if not shape.is_valid:
            return "polygon is not valid (it crosses itself or its rings overlap)"
    else:
        shape = raster_of(ann["raster"], max_pixels)
        if isinstance(shape, str):
            return shape
    return shape.bounds if geometry == "bbox" else shape


def _annotation_problem(ann, scored: bool) -> str | None:
    if not isinstance(ann, dict):
        return "not an object"
    problem = label_problem(ann.get("label"), "label", "no label (a non-empty string)")
    if problem:
        return problem
    if scored:
        score = ann.get("score")
        if not _finite(score) or not 0.0 <= score <= 1.0:
            return f"score {score!r} is not a number in [0, 1]"
    return None


def _metadata(row: dict, key: str):
    m = row.get("metadata")
    return m.get(key) if isinstance(m, dict) else None


def _geometries(row: dict, scored: bool, slice_keys: list[str], geometry: str,
                max_pixels: int) -> tuple[str | None, list]:
    """(None, the geometry of each annotation, geometry_of), or (why the row is rejected, []):
    its annotations are missing, a slice value is not JSON-writable, or an annotation is
    invalid (named by its 0-based index), checked in that order."""
    if not isinstance(row.get("annotations"), list):
        return "missing annotations", []
    problem = metadata_problem(row.get("metadata"), slice_keys)
    if problem:
        return problem, []
    geometries = []
    for i, a in enumerate(row["annotations"]):
        found = _annotation_problem(a, scored) or geometry_of(a, geometry, max_pixels)
        if isinstance(found, str):
            return f"annotation {i}: {found}", []
        geometries.append(found)
    return None, geometries


def native_rows(rows: list, positions: list, scored: bool, slice_keys: list[str], file_id: int = 0,
                geometry: str = "bbox", max_pixels: int = MAX_IMAGE_PIXELS):
    """(ImageRows or RowIndex, BoxRows, [(position, uid, reason)]) from parsed rows.

    Ground truth (scored=False) gives ImageRows (one image per datum, slice values from
    metadata); predictions give a RowIndex. A row is rejected as a whole when it is not an
    object, its datum_uid is missing, empty or longer than MAX_UID_CHARS characters (then left
    out of the reject: reject() drops it), its annotations are missing or not a list, one
    annotation is invalid (the reason names it by its 0-based index: "annotation 2: ..."; a label
    longer than MAX_LABEL_CHARS characters is invalid), or a slice value is not finite or longer
    than MAX_SLICE_CHARS characters as JSON. geometry "polygon" reads the "polygon" of each
    annotation (shapely geometries in BoxRows.segmentation; bbox = bounds, ground-truth area =
    polygon area)."""
    good, bad = [], []
    for row, position in zip(rows, positions):
        uid = row.get("datum_uid") if isinstance(row, dict) else None
        problem, geometries = row_uid_problem(row), []
        if problem is None:
            problem, geometries = _geometries(row, scored, slice_keys, geometry, max_pixels)
        if problem:
            bad.append((position, uid if isinstance(uid, str) else None, problem))
        else:
            good.append((row, position, geometries))
    uids = [row["datum_uid"] for row, _, _ in good]
    image_id = stable_id(uids) if uids else np.zeros(0, np.int64)
    position = np.array([p for _, p, _ in good], dtype=np.int64)
    anns = [(i, a) for i, (row, _, _) in enumerate(good) for a in row["annotations"]]
    found = [g for _, _, geometries in good for g in geometries]
    shapes = found if geometry == "polygon" else None
    boxes = np.array([s.bounds for s in shapes] if shapes is not None else found,
                     dtype=np.float64).reshape(-1, 4)
    xywh = np.column_stack([boxes[:, 0], boxes[:, 1], boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]])
    owner = np.array([i for i, _ in anns], dtype=np.int64)
    labels = [a["label"] for _, a in anns]
    box_rows = BoxRows(
        image_id=image_id[owner] if owner.size else np.zeros(0, np.int64),
        category_id=stable_id(labels) if labels else np.zeros(0, np.int64),
        bbox=xywh.reshape(-1, 4),
        value=(np.array([a["score"] for _, a in anns], dtype=np.float64) if scored
               else geometry_area(shapes) if shapes is not None
               else xywh[:, 2] * xywh[:, 3]),
        crowd=np.array([bool(a.get("iscrowd", False)) for _, a in anns], dtype=bool),
        segmentation=shapes,
        position=position[owner] if owner.size else np.zeros(0, np.int64),
    )
    if scored:
        return RowIndex(image_id, uids, position, np.full(len(good), file_id, np.int32)), box_rows, bad

    images = ImageRows(image_id=image_id, height=np.zeros(len(good), np.int64),
                       width=np.zeros(len(good), np.int64),
                       slices={k: [canonical_json(_metadata(row, k)) for row, _, _ in good]
                               for k in slice_keys},
                       position=position, file_id=np.full(len(good), file_id, np.int32), uid=uids)
    return images, box_rows, bad


def labels_of(rows: list) -> set[str]:
    """Labels used by the valid-looking annotations of parsed rows: non-empty strings of at most
    MAX_LABEL_CHARS characters. The rows may include rejected ones, so a label beyond the bound
    is left out here too: it would name a category of every record otherwise."""
    out = set()
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("annotations"), list):
            for a in row["annotations"]:
                label = a.get("label") if isinstance(a, dict) else None
                if isinstance(label, str) and 0 < len(label) <= MAX_LABEL_CHARS:
                    out.add(label)
    return out


# Field sets that mark a row (column names or JSON keys) as this task's: a file given to another
# task's command is named by the command it belongs to (transforms.preflight.task_of_fields).
IDENTIFYING_FIELDS = (("annotations",), ("image_id", "category_id"), ("images",))
