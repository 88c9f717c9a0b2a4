"""What one input row may cost: the bounds that keep a hostile or mistaken row from taking a
worker's memory, and the messages that name the option raising each bound.

A row beyond a bound is rejected with a reason (never allocated, never a crash); the tasks'
options (`--max_image_pixels`, ...) raise the bounds for inputs that really are that large.
"""

from __future__ import annotations

from dataclasses import dataclass

# 100 megapixels: a 10,000 x 10,000 image. A datum of that size takes, while it is matched,
# about 4 bytes a pixel (8-bit label maps: 0.4 GB) to 8 bytes a pixel (segment rows, 16-bit label
# maps: 0.8 GB) on top of the worker's own ~0.2 GB (measured on the DirectRunner); a 13,000 x
# 13,000 label map (169 megapixels) needs --max_image_pixels 169000000 and 0.7 to 1.4 GB per
# worker at a time.
MAX_IMAGE_PIXELS = 100_000_000
# pycocotools keeps RLE run lengths in 32-bit unsigned integers: no image can be larger.
MAX_RLE_PIXELS = 2**32 - 1
# The bytes read from one mask or label-map file (PNG, .npy): a 100-megapixel 8- or 16-bit
# image fits with room; reading stops at the bound, so /dev/zero-like inputs cost nothing more.
MAX_MASK_BYTES = 256 << 20
# Segments of one row: their numbers are stored as uint16 pixel ids (0 = no segment).
MAX_SEGMENTS_PER_ROW = 65_535
# Distinct labels of a segmentation run: each (model, slice) keeps a dense (K + 1)^2 int64 pixel
# matrix, 32 MB at 2,000 labels (LVIS has 1,203 classes, ADE20K-847 has 847), 32 GiB at 65,536.
MAX_LABELS = 2_000


@dataclass(frozen=True)
class ImageLimits:
    """The per-row bounds of image inputs: max_pixels (height x width of an RLE, a mask, a label
    map or a row's shape) and max_mask_bytes (bytes read from one mask or label-map file)."""

    max_pixels: int = MAX_IMAGE_PIXELS
    max_mask_bytes: int = MAX_MASK_BYTES


def image_size_problem(height, width, limit: int = MAX_IMAGE_PIXELS, what: str = "image") -> str | None:
    """Why an image (mask, raster, label map) of this size is not evaluated, or None: the
    dimensions must be non-negative integers and height x width at most `limit` pixels."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (height, width)):
        return f"{what} size must be two non-negative integers, got {[height, width]}"
    if height * width > limit:
        return (f"{what} of {height} x {width} = {height * width:,} pixels exceeds the limit of "
                f"{limit:,} pixels per row (--max_image_pixels raises it)")
    return None


def file_size_problem(n_bytes: int, limit: int, what: str) -> str | None:
    """Why a file of n_bytes (or more: readers stop at limit + 1) is not read, or None."""
    if n_bytes > limit:
        return (f"{what} holds more than {limit:,} bytes, the limit per mask or label-map file "
                "(--max_mask_bytes raises it)")
    return None
