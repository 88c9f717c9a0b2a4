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
