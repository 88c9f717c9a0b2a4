"""COCO segmentations as compressed RLE, the form pycocotools' mask API compares.

Polygons (lists of [x1, y1, x2, y2, ...]) and uncompressed RLEs (crowd regions) are converted
with the image's height and width, as pycocotools' annToRLE does; compressed RLEs pass through.
How COCO files are read and validated is in schemas/coco_rows.py; the loadRes rules (box area
when the first result has a bbox, else mask area) in transforms/detection.shard_state.
"""

from __future__ import annotations


def to_rle(segmentation, height: int, width: int):
    """A compressed RLE (pycocotools' dict) from a polygon list, uncompressed or compressed RLE."""
    from pycocotools import mask as mask_utils

    if isinstance(segmentation, list):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    if isinstance(segmentation.get("counts"), list):
        return mask_utils.frPyObjects(segmentation, height, width)
    return segmentation


def rle_runs(counts: str) -> list[int] | None:
    """Run lengths of a compressed COCO RLE string, or None when the string is malformed.

    The format: each run is a little-endian sequence of 6-bit characters (value c - 48) of which
    5 bits carry data and bit 0x20 says "more follows"; the last chunk's bit 0x10 is a sign bit;
    from the fourth run on, the value is a delta from the run two places back."""
    runs: list[int] = []
    p, n = 0, len(counts)
    while p < n:
        x, k, more = 0, 0, True
        while more:
            if p >= n:
                return None
            c = ord(counts[p]) - 48
            if not 0 <= c < 64:
                return None
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p, k = p + 1, k + 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
    return runs


def rle_problem(rle) -> str | None:
    """Why an RLE object ({"size": [h, w], "counts": str | [int, ...]}) cannot be used, or None.

    Run lengths must be non-negative and add up to h * w: pycocotools' C code trusts them (a
    longer mask would write past its buffer), so they are checked before it sees them."""
    if not isinstance(rle, dict):
        return "RLE must be an object with \"size\" and \"counts\""
    size, counts = rle.get("size"), rle.get("counts")
    if not (isinstance(size, list) and len(size) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in size)):
        return "RLE needs \"size\": [height, width] (non-negative integers)"
    if isinstance(counts, str):
        runs = rle_runs(counts)
        if runs is None:
            return "RLE \"counts\" is not a valid compressed COCO RLE string"
    elif isinstance(counts, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
        runs = counts
    else:
        return "RLE needs \"counts\" (a compressed string or a list of run lengths)"
    if any(v < 0 for v in runs) or sum(runs) != size[0] * size[1]:
        return f"RLE run lengths must be non-negative and add up to height * width = {size[0] * size[1]}"
    return None
