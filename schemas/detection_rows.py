"""Native detection rows (JSONL or Parquet), validated into the columns the COCO path uses.

Row: {"datum_uid": str, "metadata"?: {str: scalar}, "annotations": [{"label": str,
"score": float (predictions), "bbox": [xmin, ymin, xmax, ymax] | "polygon": [[x, y], ...] (or
rings, or polygons), "iscrowd"?: bool}]}.
A datum is an image whose id is the FNV-1a hash of its datum_uid (as int64); a label is a
category whose id is the hash of the label. Boxes become COCO's [x, y, w, h]; a ground truth's
area is its box area. With --iou_type segm, "polygon" geometries are read instead of boxes
(shapely; exact polygon IoU); raster annotations are rejected with a reason that says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from schemas.coco_rows import BoxRows, ImageRows
from schemas.rows import canonical_json
from transforms.kernels.hashing import fnv1a_64


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


def stable_id(texts: list[str]) -> np.ndarray:
    """int64 ids from strings (FNV-1a 64, reinterpreted as signed)."""
    return fnv1a_64(pa.array(texts, pa.string())).view(np.int64)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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


def _geometry_problem(ann, geometry: str) -> str | None:
    if geometry == "polygon":
        if "raster" in ann:
            return "raster annotations are not supported in native rows yet"
        shape = polygon_of(ann.get("polygon"))
        if shape is None:
            return "polygon must be [[x, y], ...] with at least 3 finite points (or rings / polygons)"
        if not shape.is_valid:
            return "polygon is not valid (it crosses itself or its rings overlap)"
        return None
    if "bbox" not in ann and ("polygon" in ann or "raster" in ann):
        return "this annotation has no bbox: evaluate polygons with --iou_type segm"
    box = ann.get("bbox")
    if not isinstance(box, list) or len(box) != 4 or not all(_finite(v) for v in box):
        return "bbox must be [xmin, ymin, xmax, ymax] with 4 finite numbers"
    if box[2] < box[0] or box[3] < box[1]:
        return "bbox has xmax < xmin or ymax < ymin"
    return None


def _annotation_problem(ann, scored: bool, geometry: str = "bbox") -> str | None:
    if not isinstance(ann, dict):
        return "each annotation must be an object"
    label = ann.get("label")
    if not isinstance(label, str) or not label:
        return "annotation without label"
    if scored:
        score = ann.get("score")
        if not _finite(score) or not 0.0 <= score <= 1.0:
            return f"score {score!r} is not a number in [0, 1]"
    return _geometry_problem(ann, geometry)


def native_rows(rows: list, positions: list, scored: bool, slice_keys: list[str], file_id: int = 0,
                geometry: str = "bbox"):
    """(ImageRows or RowIndex, BoxRows, [(position, uid, reason)]) from parsed rows.

    Ground truth (scored=False) gives ImageRows (one image per datum, slice values from
    metadata); predictions give a RowIndex. A row is rejected as a whole when it is not an
    object, its datum_uid is missing or empty, its annotations are missing or not a list, or one
    annotation is invalid. geometry "polygon" reads the "polygon" of each annotation (shapely
    geometries in BoxRows.segmentation; bbox = bounds, ground-truth area = polygon area)."""
    good, bad = [], []
    for row, position in zip(rows, positions):
        uid = row.get("datum_uid") if isinstance(row, dict) else None
        if not isinstance(row, dict):
            problem = "row must be a JSON object"
        elif not isinstance(uid, str) or not uid:
            problem = "missing or empty datum_uid"
        elif not isinstance(row.get("annotations"), list):
            problem = "missing annotations"
        else:
            problem = next((p for p in (_annotation_problem(a, scored, geometry)
                                        for a in row["annotations"]) if p), None)
        if problem:
            bad.append((position, uid if isinstance(uid, str) else None, problem))
        else:
            good.append((row, position))
    uids = [row["datum_uid"] for row, _ in good]
    image_id = stable_id(uids) if uids else np.zeros(0, np.int64)
    position = np.array([p for _, p in good], dtype=np.int64)
    anns = [(i, a) for i, (row, _) in enumerate(good) for a in row["annotations"]]
    shapes = [polygon_of(a["polygon"]) for _, a in anns] if geometry == "polygon" else None
    if shapes is not None:
        boxes = np.array([s.bounds for s in shapes], dtype=np.float64).reshape(-1, 4)
    else:
        boxes = np.array([a["bbox"] for _, a in anns], dtype=np.float64).reshape(-1, 4)
    xywh = np.column_stack([boxes[:, 0], boxes[:, 1], boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]])
    owner = np.array([i for i, _ in anns], dtype=np.int64)
    labels = [a["label"] for _, a in anns]
    box_rows = BoxRows(
        image_id=image_id[owner] if owner.size else np.zeros(0, np.int64),
        category_id=stable_id(labels) if labels else np.zeros(0, np.int64),
        bbox=xywh.reshape(-1, 4),
        value=(np.array([a["score"] for _, a in anns], dtype=np.float64) if scored
               else np.array([s.area for s in shapes]) if shapes is not None
               else xywh[:, 2] * xywh[:, 3]),
        crowd=np.array([bool(a.get("iscrowd", False)) for _, a in anns], dtype=bool),
        segmentation=shapes,
        position=position[owner] if owner.size else np.zeros(0, np.int64),
    )
    if scored:
        return RowIndex(image_id, uids, position, np.full(len(good), file_id, np.int32)), box_rows, bad

    def meta(row, key):
        m = row.get("metadata")
        return m.get(key) if isinstance(m, dict) else None

    images = ImageRows(image_id=image_id, height=np.zeros(len(good), np.int64),
                       width=np.zeros(len(good), np.int64),
                       slices={k: [canonical_json(meta(row, k)) for row, _ in good] for k in slice_keys},
                       position=position, file_id=np.full(len(good), file_id, np.int32), uid=uids)
    return images, box_rows, bad


def labels_of(rows: list) -> set[str]:
    """Labels used by the valid-looking annotations of parsed rows."""
    out = set()
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get("annotations"), list):
            for a in row["annotations"]:
                if isinstance(a, dict) and isinstance(a.get("label"), str) and a["label"]:
                    out.add(a["label"])
    return out
