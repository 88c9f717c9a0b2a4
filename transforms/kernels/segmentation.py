"""Semantic segmentation kernels: per-datum pixel confusion matrices and Valor's metrics.

Label codes: 0..K-1 are labels; UNLABELED (-1) marks a pixel no segment covers (Valor's
"background": not a class, the source of unmatched pixels); IGNORED (-2) marks a ground-truth
pixel left out of every count (the label map's ignore id).

The confusion matrix has K + 1 rows and columns: row/column 0 is "unlabeled", row/column k + 1
is label k; matrix[g, p] counts the pixels whose ground truth is g and prediction is p. It is
additive over datums, so shards and workers merge it exactly.
"""

from __future__ import annotations

import numpy as np

UNLABELED = -1
IGNORED = -2


def label_map(shape: tuple[int, int], masks: list[np.ndarray], codes: list[int]) -> tuple[np.ndarray, int]:
    """(int32[h, w] label codes, number of pixels covered by more than one mask).

    masks: bool[h, w] each (already checked to have this shape); codes: the label code of each.
    Pixels no mask covers are UNLABELED; where masks overlap the last one wins (the caller rejects
    overlapping ground truth, so the choice only matters for counting the overlap)."""
    out = np.full(shape, UNLABELED, dtype=np.int32)
    if not masks:
        return out, 0
    covered = np.zeros(shape, dtype=np.uint16)
    for mask, code in zip(masks, codes):
        out[mask] = code
        covered += mask
    return out, int((covered > 1).sum())


def pixel_confusion(groundtruth: np.ndarray, prediction: np.ndarray, n_labels: int) -> np.ndarray:
    """int64[K + 1, K + 1] pixel counts (see the module docstring) of one datum.

    groundtruth, prediction: integer label-code arrays of one shape, codes in [-1, K) (the
    ground truth may also hold IGNORED, whose pixels are not counted; the prediction must not).
    One bincount over g * (K + 1) + p, with ignored pixels sent to an extra row that is dropped
    (cheaper than selecting the other pixels)."""
    K1 = n_labels + 1
    g = groundtruth.astype(np.int64, copy=False).ravel()
    p = prediction.astype(np.int64, copy=False).ravel()
    # ignored (-2) -> row K + 1, unlabeled (-1) -> row 0, label k -> row k + 1
    rows = np.where(g == IGNORED, K1, g + 1)
    counts = np.bincount(rows * K1 + (p + 1), minlength=(K1 + 1) * K1)
    return counts[:K1 * K1].reshape(K1, K1)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    out = np.zeros(np.broadcast(numerator, denominator).shape, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def segmentation_metrics(matrix: np.ndarray) -> dict:
    """Valor's semantic segmentation metrics from a [K + 1, K + 1] pixel confusion matrix.

    With tp_k = matrix[k+1, k+1], gt_k = row sum of label k (every prediction, unlabeled too),
    pd_k = column sum of label k:
      precision_k = tp_k / pd_k, recall_k = tp_k / gt_k, F1_k = 2 P R / (P + R),
      iou[g, p] = matrix[g+1, p+1] / (gt_g + pd_p - matrix[g+1, p+1]) (IOU_k = iou[k, k]),
      unmatched prediction ratio_k = matrix[0, k+1] / pd_k (predicted where no label is),
      unmatched ground truth ratio_k = matrix[k+1, 0] / gt_k (labelled but predicted as nothing),
      accuracy = (sum tp_k + matrix[0, 0]) / all counted pixels, mIOU = mean over labels of IOU_k.
    Every undefined ratio is 0 (as valor-lite); a label with no pixels at all has zeros and still
    counts in mIOU."""
    matrix = np.asarray(matrix, dtype=np.int64)
    K = matrix.shape[0] - 1
    inner = matrix[1:, 1:]
    gt = matrix[1:, :].sum(axis=1)
    pd = matrix[:, 1:].sum(axis=0)
    tp = np.diagonal(inner).copy()
    precision, recall = _ratio(tp, pd), _ratio(tp, gt)
    f1 = _ratio(2 * precision * recall, precision + recall)
    iou = _ratio(inner, gt[:, None] + pd[None, :] - inner)
    total = int(matrix.sum())
    return {
        "precision": precision, "recall": recall, "f1": f1, "iou": iou,
        "IOU": np.diagonal(iou).copy(), "mIOU": float(np.diagonal(iou).mean()) if K else 0.0,
        "accuracy": (int(tp.sum()) + int(matrix[0, 0])) / total if total else 0.0,
        "unmatched_prediction_ratio": _ratio(matrix[0, 1:], pd),
        "unmatched_groundtruth_ratio": _ratio(matrix[1:, 0], gt),
        "unmatched_prediction_pixels": matrix[0, 1:].copy(),
        "unmatched_groundtruth_pixels": matrix[1:, 0].copy(),
    }
