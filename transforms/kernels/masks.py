"""Mask IoU through pycocotools' C mask API (run-length encoded masks, no decoding)."""

from __future__ import annotations

import numpy as np


def pair_mask_iou(dt_rles: list, gt_rles: list, gt_crowd: np.ndarray):
    """pair_iou for compressed RLEs: one pycocotools mask.iou call per (detection, gt image
    category group) block of pairs, crowd IoU as pycocotools computes it."""
    from pycocotools import mask as mask_utils

    def iou(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        out = np.zeros(dt_index.size)
        if not dt_index.size:
            return out
        # Pairs arrive grouped by detection, and the detections of one (image, category) group
        # are consecutive with the same ground-truth list: one C call per group.
        starts = np.flatnonzero(np.r_[True, dt_index[1:] != dt_index[:-1]])
        ends = np.r_[starts[1:], dt_index.size]
        block_start = 0
        for b in range(starts.size):
            s, e = starts[b], ends[b]
            last = b + 1 == starts.size
            if not last:
                ns, ne = starts[b + 1], ends[b + 1]
                if ne - ns == e - s and np.array_equal(gt_index[ns:ne], gt_index[s:e]):
                    continue  # the next detection shares this ground-truth list
            gts = gt_index[s:e]
            dts = dt_index[starts[block_start]:e:(e - s)]
            values = mask_utils.iou([dt_rles[d] for d in dts], [gt_rles[g] for g in gts],
                                    [int(c) for c in gt_crowd[gts]])
            out[starts[block_start]:e] = np.asarray(values, dtype=np.float64).reshape(-1)
            block_start = b + 1
        return out
    return iou


def pair_polygon_iou(dt_shapes: list, gt_shapes: list):
    """pair_iou for shapely polygons: exact areas, intersection / union (0 for empty unions)."""
    import shapely

    dt = np.array(dt_shapes, dtype=object)
    gt = np.array(gt_shapes, dtype=object)

    def iou(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        if not dt_index.size:
            return np.zeros(0)
        a, b = dt[dt_index], gt[gt_index]
        inter = shapely.area(shapely.intersection(a, b))
        union = shapely.area(a) + shapely.area(b) - inter
        out = np.zeros(dt_index.size)
        np.divide(inter, union, out=out, where=union > 0)
        return out
    return iou
