"""What one input row may cost: the bounds that keep a hostile or mistaken row from taking a
worker's memory, and the messages that name the option raising each bound.

A row beyond a bound is rejected with a reason (never allocated, never a crash); the tasks'
options (`--max_image_pixels`, ...) raise the bounds for inputs that really are that large.
"""

from __future__ import annotations

# 100 megapixels: a 10,000 x 10,000 image. One such mask costs 100 MB as bytes and about 0.5 GB
# while its pixel pairs are counted; a 13,000 x 13,000 label map (169 megapixels) needs
# --max_image_pixels 169000000 and about 1 GB per worker at a time.
MAX_IMAGE_PIXELS = 100_000_000


def image_size_problem(height, width, limit: int = MAX_IMAGE_PIXELS, what: str = "image") -> str | None:
    """Why an image (mask, raster, label map) of this size is not evaluated, or None: the
    dimensions must be non-negative integers and height x width at most `limit` pixels."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (height, width)):
        return f"{what} size must be two non-negative integers, got {[height, width]}"
    if height * width > limit:
        return (f"{what} of {height} x {width} = {height * width:,} pixels exceeds the limit of "
                f"{limit:,} pixels per row (--max_image_pixels raises it)")
    return None
