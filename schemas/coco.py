"""COCO files: an instances JSON (ground truth) and a results JSON (detections), as columns.

Follows what pycocotools does when it loads them:
- images are ordered by id (pycocotools sorts image ids); categories by id;
- ground-truth "area" is taken from the file (not recomputed), "iscrowd" marks crowd regions;
- results: for bbox results (the first result has a non-empty "bbox"), area = w * h; otherwise
  the area of the segmentation mask; a missing bbox of a segm result comes from the mask;
- segmentation polygons (lists of [x1, y1, x2, y2, ...]) and uncompressed RLEs are converted to
  compressed RLE with the image's height and width, as pycocotools' annToRLE does.
"""

from __future__ import annotations


def is_instances(obj) -> bool:
    return isinstance(obj, dict) and "annotations" in obj and "images" in obj


def is_results(obj) -> bool:
    return isinstance(obj, list) and (not obj or (isinstance(obj[0], dict) and "image_id" in obj[0]
                                                  and "score" in obj[0]))


def to_rle(segmentation, height: int, width: int):
    """A compressed RLE (pycocotools' dict) from a polygon list, uncompressed or compressed RLE."""
    from pycocotools import mask as mask_utils

    if isinstance(segmentation, list):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    if isinstance(segmentation.get("counts"), list):
        return mask_utils.frPyObjects(segmentation, height, width)
    return segmentation
