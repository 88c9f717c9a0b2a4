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


# Characters of a compressed RLE string that iter_rle_run_arrays parses at a time: its arrays take
# some 40 bytes a character, so a chunk costs ~40 MB however long the string is.
RUN_CHUNK_CHARS = 1 << 20


def iter_rle_run_arrays(counts: str, chunk: int = RUN_CHUNK_CHARS):
    """The run lengths of iter_rle_runs as int64 arrays of consecutive runs, parsed with numpy
    about `chunk` characters at a time: a few array operations a character instead of a Python
    loop's step, and memory bounded by the chunk, not by the string.

    A malformed string yields the runs before its first bad one, then raises ValueError, as
    iter_rle_runs does: a caller that checks runs in order finds the same first problem."""
    import numpy as np

    chunk = max(chunk, MAX_CHUNK_CHARS + 1)   # a chunk then always holds a whole valid run
    carry = [0, 0]     # per parity, the last run from index 1 on: what the next delta adds to
    n_runs, p, n = 0, 0, len(counts)
    while p < n:
        # code points (UTF-32 keeps any character, lone surrogates too), minus 48: one array
        # of uint32, in which characters below "0" wrap to large values
        piece = np.frombuffer(counts[p:p + chunk].encode("utf-32-le", "surrogatepass"),
                              dtype="<u4") - np.uint32(48)
        bad = np.flatnonzero(piece >= 64)
        stop = int(bad[0]) if bad.size else piece.size     # characters before the first invalid
        last = np.flatnonzero((piece[:stop] & 0x20) == 0)   # each complete run's last character
        first = np.concatenate(([0], last[:-1] + 1))[:last.size]
        lengths = last - first + 1
        too_long = np.flatnonzero(lengths > MAX_CHUNK_CHARS)
        unfinished = stop - (int(last[-1]) + 1 if last.size else 0)
        at_end = p + piece.size >= n
        if too_long.size:
            last, first, lengths = (a[:too_long[0]] for a in (last, first, lengths))
        malformed = (too_long.size > 0 or stop < piece.size or unfinished > MAX_CHUNK_CHARS
                     or (at_end and unfinished > 0))
        # 5 data bits a character, little-endian; most runs have one or two characters
        values = (piece[first] & 0x1F).astype(np.int64)
        for k in range(1, MAX_CHUNK_CHARS):
            runs = np.flatnonzero(lengths > k)
            if not runs.size:
                break
            values[runs] |= (piece[first[runs] + k] & 0x1F).astype(np.int64) << (5 * k)
        negative = (piece[last] & 0x10) != 0   # the sign bit of a run's last character
        values[negative] -= np.left_shift(1, 5 * lengths[negative])
        # run i > 2 is a delta from run i - 2: per parity a running sum, run 0 left out
        skip = 1 if n_runs == 0 else 0
        for parity in (0, 1):
            start = skip + (parity - n_runs - skip) % 2
            stream = values[start::2]
            if stream.size:
                np.cumsum(stream, out=stream)
                stream += carry[parity]
                carry[parity] = int(stream[-1])
        n_runs += values.size
        if values.size:
            yield values
        if malformed:
            raise ValueError("malformed compressed RLE")
        p += int(last[-1]) + 1 if not at_end else piece.size


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
    they are checked before it sees them, in order and stopping at the first that breaks the
    rule. A compressed string is parsed with numpy a chunk at a time (iter_rle_run_arrays): a
    long hostile string costs neither a list of its runs nor a full pass, and a long valid one
    a few array operations a character."""
    if not isinstance(rle, dict):
        return "RLE must be an object with \"size\" and \"counts\""
    size, counts = rle.get("size"), rle.get("counts")
    if not (isinstance(size, list) and len(size) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in size)):
        return "RLE needs \"size\": [height, width] (non-negative integers)"
    too_large = image_size_problem(size[0], size[1], max_pixels, "RLE")
    if too_large:
        return too_large
    pixels, total = size[0] * size[1], 0
    wrong = f"RLE run lengths must be non-negative and add up to height * width = {pixels}"
    if isinstance(counts, str):
        try:
            for runs in iter_rle_run_arrays(counts):
                # each run within [0, pixels] first: then the running total cannot overflow
                if int(runs.min()) < 0 or int(runs.max()) > pixels:
                    return wrong
                total += int(runs.sum())
                if total > pixels:
                    return wrong
        except ValueError:
            return "RLE \"counts\" is not a valid compressed COCO RLE string"
        return None if total == pixels else wrong
    if not (isinstance(counts, list)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in counts)):
        return "RLE needs \"counts\" (a compressed string or a list of run lengths)"
    for run in counts:
        total += run
        if run < 0 or total > pixels:
            return wrong
    return None if total == pixels else wrong
