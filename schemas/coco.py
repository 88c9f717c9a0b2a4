"""COCO segmentations as compressed RLE, the form pycocotools' mask API compares.

Polygons (lists of [x1, y1, x2, y2, ...]) and uncompressed RLEs (crowd regions) are converted
with the image's height and width, as pycocotools' annToRLE does; compressed RLEs pass through.
How COCO files are read and validated is in schemas/coco_rows.py; the loadRes rules (box area
when the first result has a bbox, else mask area) in transforms/detection.shard_state.
"""

from __future__ import annotations

from evalbeam.schemas.limits import MAX_IMAGE_PIXELS, image_size_problem


def to_rle(segmentation, height: int, width: int):
    """A compressed RLE (pycocotools' dict) from a polygon list, uncompressed or compressed RLE."""
    from pycocotools import mask as mask_utils

    if isinstance(segmentation, list):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    if isinstance(segmentation.get("counts"), list):
        return mask_utils.frPyObjects(segmentation, height, width)
    return segmentation


# A run length is a 32-bit count in pycocotools, and a delta between two of them needs at most 33
# bits with its sign: 7 characters of 5 bits. A longer chunk is malformed (and decoding one would
# cost time quadratic in its length).
MAX_CHUNK_CHARS = 7


def iter_rle_runs(counts: str):
    """Run lengths of a compressed COCO RLE string, one at a time (no list of them is held);
    raises ValueError when the string is malformed.

    The format: each run is a little-endian sequence of 6-bit characters (value c - 48) of which
    5 bits carry data and bit 0x20 says "more follows"; the last chunk's bit 0x10 is a sign bit;
    from the fourth run on, the value is a delta from the run two places back."""
    before_last, last, n_runs = 0, 0, 0
    p, n = 0, len(counts)
    while p < n:
        x, k, more = 0, 0, True
        while more:
            if p >= n or k >= MAX_CHUNK_CHARS:
                raise ValueError("malformed compressed RLE")
            c = ord(counts[p]) - 48
            if not 0 <= c < 64:
                raise ValueError("malformed compressed RLE")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p, k = p + 1, k + 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if n_runs > 2:
            x += before_last
        before_last, last, n_runs = last, x, n_runs + 1
        yield x


def rle_runs(counts: str) -> list[int] | None:
    """Run lengths of a compressed COCO RLE string (iter_rle_runs), or None when the string is
    malformed."""
    try:
        return list(iter_rle_runs(counts))
    except ValueError:
        return None


def rle_problem(rle, max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    """Why an RLE object ({"size": [h, w], "counts": str | [int, ...]}) cannot be used, or None.

    h * w must be at most max_pixels (checked first: a 130-byte RLE can claim 50,000 x 50,000
    pixels, and decoding it would allocate them). Run lengths must be non-negative and add up
    to h * w: pycocotools' C code trusts them (a longer mask would write past its buffer), so
    they are checked before it sees them, one at a time and stopping at the first that breaks
    the rule (a long hostile string costs neither a list of its runs nor a full pass)."""
    if not isinstance(rle, dict):
        return "RLE must be an object with \"size\" and \"counts\""
    size, counts = rle.get("size"), rle.get("counts")
    if not (isinstance(size, list) and len(size) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in size)):
        return "RLE needs \"size\": [height, width] (non-negative integers)"
    too_large = image_size_problem(size[0], size[1], max_pixels, "RLE")
    if too_large:
        return too_large
    if isinstance(counts, str):
        runs = iter_rle_runs(counts)
    elif isinstance(counts, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
        runs = iter(counts)
    else:
        return "RLE needs \"counts\" (a compressed string or a list of run lengths)"
    pixels, total = size[0] * size[1], 0
    wrong = f"RLE run lengths must be non-negative and add up to height * width = {pixels}"
    try:
        for run in runs:
            total += run
            if run < 0 or total > pixels:
                return wrong
    except ValueError:
        return "RLE \"counts\" is not a valid compressed COCO RLE string"
    return None if total == pixels else wrong
