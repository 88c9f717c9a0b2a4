"""Detection geometry: the IoU of (detection, ground truth) box pairs, and how many pairs an image
makes before any IoU is computed (the bound on one image's matching work).

Matching asks for IoUs through a pair_iou(dt_index, gt_index) -> float64[P] callable, so the
geometry (boxes here, masks and polygons in kernels.masks) stays out of the matching code.
"""

from __future__ import annotations

import numpy as np

# Pairs whose IoU is computed at once (pair_box_iou, kernels.masks): ~130 bytes of temporaries
# each, 130 MB.
PAIR_CHUNK = 1 << 20


def pair_box_iou(dt_boxes: np.ndarray, gt_boxes: np.ndarray, gt_crowd: np.ndarray):
    """pair_iou for boxes [x, y, w, h] (pycocotools' bbIou arithmetic, elementwise).

    The pairs are computed PAIR_CHUNK at a time: the arithmetic holds some 15 temporaries per
    pair, which for the millions of pairs of a dense image would outweigh the result."""
    def chunk(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        d, g = dt_boxes[dt_index], gt_boxes[gt_index]
        w = np.minimum(d[:, 2] + d[:, 0], g[:, 2] + g[:, 0]) - np.maximum(d[:, 0], g[:, 0])
        h = np.minimum(d[:, 3] + d[:, 1], g[:, 3] + g[:, 1]) - np.maximum(d[:, 1], g[:, 1])
        inter = w * h
        da = d[:, 2] * d[:, 3]
        union = np.where(gt_crowd[gt_index], da, (da + g[:, 2] * g[:, 3]) - inter)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = inter / union
        return np.where((w > 0) & (h > 0), out, 0.0)

    def iou(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        if dt_index.size <= PAIR_CHUNK:
            return chunk(dt_index, gt_index)
        out = np.empty(dt_index.size)
        for start in range(0, dt_index.size, PAIR_CHUNK):
            end = start + PAIR_CHUNK
            out[start:end] = chunk(dt_index[start:end], gt_index[start:end])
        return out
    return iou


def image_pair_counts(gt_image: np.ndarray, gt_category: np.ndarray, dt_image: np.ndarray,
                      dt_category: np.ndarray, n_images: int, max_det: int | None = None):
    """(pairs, predictions) int64[n_images] each: the (detection, ground truth) pairs matching
    computes per image, and the detections that take part, before any IoU is computed.

    gt_* [M] and dt_* [N] hold image indices in [0, n_images) and category indices (>= 0).
    max_det None (the valor protocol): every detection with every ground truth of its image,
    n_dt * n_gt, since the confusion matrix pairs labels across (per-category matching needs
    fewer). max_det m (the coco protocol): per (image, category), min(n_dt, m) * n_gt, summed
    over the image's categories; the predictions counted are min(n_dt, m) per category."""
    n_gt = np.bincount(gt_image, minlength=n_images).astype(np.int64)
    if max_det is None:
        n_dt = np.bincount(dt_image, minlength=n_images).astype(np.int64)
        return n_dt * n_gt, n_dt
    width = int(max(gt_category.max(initial=-1), dt_category.max(initial=-1))) + 1
    gt_key, gt_count = np.unique(gt_image.astype(np.int64) * width + gt_category, return_counts=True)
    dt_key, dt_count = np.unique(dt_image.astype(np.int64) * width + dt_category, return_counts=True)
    kept = np.minimum(dt_count, max_det).astype(np.int64)
    n_dt = np.bincount(dt_key // width if width else dt_key, weights=kept,
                       minlength=n_images).astype(np.int64)
    at = np.minimum(np.searchsorted(gt_key, dt_key), max(gt_key.size - 1, 0))
    found = (gt_key[at] == dt_key) if gt_key.size else np.zeros(dt_key.size, bool)
    pairs = np.zeros(n_images, np.int64)
    np.add.at(pairs, dt_key[found] // width, kept[found] * gt_count[at[found]])
    return pairs, n_dt
