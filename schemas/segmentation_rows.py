"""Semantic segmentation rows (JSONL or Parquet), checked when read; masks are decoded later.

Two row forms, for ground truth and predictions alike:
  {"datum_uid": str, "metadata"?: {...}, "shape": [h, w],
   "segments": [{"label": str, "rle": COCO RLE} | {"label": str, "mask_uri": str}, ...]}
  {"datum_uid": str, "metadata"?: {...}, "shape"?: [h, w], "label_map_uri": str}
A segment's mask is a COCO RLE ({"size": [h, w], "counts": str | [int, ...]}) or a PNG / .npy
bitmask (non-zero = inside) named by URI; a label map is a single-channel PNG / .npy of class ids
(named by --label_names). Relative URIs are relative to the folder of the file holding the row.
What can only be checked on the pixels (mask sizes, overlapping ground truth, unknown ids,
unreadable files) is checked by the matching step, which decodes them.

Bounds (schemas/limits.py): a row's shape and every RLE size are at most `max_pixels`
(--max_image_pixels), checked here before anything is decoded; a row holds at most
MAX_SEGMENTS_PER_ROW segments, and mask files of at most MASK_FILE_IMAGES_PER_ROW x max_pixels
pixels in all (each file is decoded whole; RLE segments cost one pass over the image whatever
their number); a datum_uid is at most MAX_UID_CHARS characters; a segment label is at most
MAX_LABEL_CHARS characters; a --slice metadata value must be JSON-writable (no NaN or Infinity)
and at most MAX_SLICE_CHARS characters as JSON.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from evalbeam.schemas.coco import rle_problem
from evalbeam.schemas.limits import (MAX_IMAGE_PIXELS, MAX_SEGMENTS_PER_ROW, image_size_problem,
                                     label_problem, mask_files_problem, row_uid_problem)
from evalbeam.schemas.safe_json import metadata_problem
from evalbeam.schemas.slices import canonical_json


@dataclass
class SegmentRow:
    """A checked row: segments are (label, "rle" | "uri", RLE dict or URI); label_map is a URI
    (then segments is empty); shape is (h, w) or None (label maps may omit it)."""

    uid: str
    position: int
    file_id: int
    shape: tuple | None
    segments: list = field(default_factory=list)
    label_map: str | None = None
    slices: dict = field(default_factory=dict)

    @property
    def labels(self) -> list[str]:
        return [label for label, _, _ in self.segments]


def resolve_uri(uri: str, row_file: str) -> str:
    """uri as is when absolute or with a scheme (gs://...), else relative to row_file's folder."""
    if "://" in uri or uri.startswith("/"):
        return uri
    if "://" in row_file:
        return posixpath.join(posixpath.dirname(row_file), uri)
    import os

    return os.path.join(os.path.dirname(row_file), uri)


def _shape_problem(shape, max_pixels: int) -> str | None:
    if not (isinstance(shape, list) and len(shape) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
        return "shape must be [height, width] with positive integers"
    return image_size_problem(shape[0], shape[1], max_pixels, "shape")


def _segments_problem(segments: list, shape, max_pixels: int) -> str | None:
    if len(segments) > MAX_SEGMENTS_PER_ROW:
        return (f"a row holds at most {MAX_SEGMENTS_PER_ROW:,} segments (one per label); this one "
                f"has {len(segments):,}")
    problem = next((p for p in (_segment_problem(s, shape, max_pixels) for s in segments) if p), None)
    if problem:
        return problem
    n_files = sum(1 for s in segments if "mask_uri" in s)
    return mask_files_problem(n_files, shape[0], shape[1], max_pixels) if n_files else None


def _segment_problem(segment, shape, max_pixels: int) -> str | None:
    if not isinstance(segment, dict):
        return "each segment must be an object"
    problem = label_problem(segment.get("label"), "segment label", "segment without label")
    if problem:
        return problem
    has_rle, has_uri = "rle" in segment, "mask_uri" in segment
    if has_rle == has_uri:
        return "a segment needs exactly one of \"rle\" or \"mask_uri\""
    if has_uri:
        uri = segment["mask_uri"]
        return None if isinstance(uri, str) and uri else "mask_uri must be a non-empty string"
    problem = rle_problem(segment["rle"], max_pixels)
    if problem:
        return f"rle: {problem}"
    if list(segment["rle"]["size"]) != list(shape):
        return f"rle size {segment['rle']['size']} differs from the row's shape {list(shape)}"
    return None


def _content_problem(row: dict, max_pixels: int) -> str | None:
    """Why a row's segments or label map are not evaluated, or None (the checks that need no
    pixels: the module docstring)."""
    if row.get("segments") is not None and row.get("label_map_uri") is not None:
        return "a row has either \"segments\" or \"label_map_uri\", not both"
    if row.get("label_map_uri") is not None:
        uri = row["label_map_uri"]
        if not isinstance(uri, str) or not uri:
            return "label_map_uri must be a non-empty string"
        return _shape_problem(row["shape"], max_pixels) if row.get("shape") is not None else None
    if not isinstance(row.get("segments"), list):
        return "missing segments (or label_map_uri)"
    return (_shape_problem(row.get("shape"), max_pixels)
            or _segments_problem(row["segments"], row["shape"], max_pixels))


def segment_rows(rows: list, positions: list, file_path: str, file_id: int, slice_keys: list[str],
                 max_pixels: int = MAX_IMAGE_PIXELS):
    """([SegmentRow], [(position, uid or None, reason)]) from parsed rows of one file; max_pixels
    bounds the row's shape and its RLE sizes (--max_image_pixels). A datum_uid longer than
    MAX_UID_CHARS characters rejects its row (reject() leaves it out of the record)."""
    good, bad = [], []
    for row, position in zip(rows, positions):
        uid = row.get("datum_uid") if isinstance(row, dict) else None
        problem = (row_uid_problem(row) or _content_problem(row, max_pixels)
                   or metadata_problem(row.get("metadata"), slice_keys))
        if problem:
            bad.append((position, uid if isinstance(uid, str) else None, problem))
            continue
        metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        shape = tuple(row["shape"]) if row.get("shape") is not None else None
        if row.get("label_map_uri") is not None:
            segments, label_map = [], resolve_uri(row["label_map_uri"], file_path)
        else:
            segments = [(s["label"], "rle", s["rle"]) if "rle" in s
                        else (s["label"], "uri", resolve_uri(s["mask_uri"], file_path))
                        for s in row["segments"]]
            label_map = None
        good.append(SegmentRow(uid, int(position), file_id, shape, segments, label_map,
                               {k: canonical_json(metadata.get(k)) for k in slice_keys}))
    return good, bad


# Field sets that mark a row (column names or JSON keys) as this task's: a file given to another
# task's command is named by the command it belongs to (transforms.preflight.task_of_fields).
IDENTIFYING_FIELDS = (("segments",), ("label_map_uri",))
