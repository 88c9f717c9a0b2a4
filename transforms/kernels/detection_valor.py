"""The valor protocol's metrics (valor-lite's object detection): AP, AR and counts per label from a
CocoState matched with one area range, no max_dets and no crowd rule; its constant-memory state
(ValorBinnedState) and its bootstrap replicates' counts.

AP[t, k] is the mean of pycocotools' interpolated precision over the 101 recall thresholds, 0 for
a label that has predictions but no ground truth; AR[s, k] is the mean over IoU thresholds of the
recall counting only detections with score >= s and score > 0. Means over labels cover the
labels present (with ground truth or predictions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evalbeam.transforms.kernels.detection_binned import BinnedState, accumulate_binned
from evalbeam.transforms.kernels.detection_coco import (RECALL_THRESHOLDS, CocoState, accumulate,
                                                        unpack_bits)
from evalbeam.transforms.kernels.detection_replicates import replicate_row_weights

VALOR_AREA_RANGES = ((0.0, np.inf),)


def valor_counts(state: CocoState, n_thresholds: int, score_thresholds: np.ndarray) -> np.ndarray:
    """int64[I, S, K, 3]: (tp, fp, fn) per matched IoU threshold, score threshold and label,
    counting the detections with score >= s and score > 0. Greedy matching runs in score order,
    so the true positives among those detections are the matches a run on them alone makes."""
    K, S = state.n_categories, score_thresholds.size
    n_gt = state.n_gt[:, 0]
    out = np.zeros((n_thresholds, S, K, 3), dtype=np.int64)
    is_tp = unpack_bits(state.tp[:, 0], n_thresholds)                                      # [n, I]
    for j, s in enumerate(score_thresholds):
        counted = (state.score >= s) & (state.score > 0)
        n_counted = np.bincount(state.category[counted], minlength=K)
        for i in range(n_thresholds):
            tp = np.bincount(state.category[counted & is_tp[:, i]], minlength=K)
            out[i, j, :, 0] = tp
            out[i, j, :, 1] = n_counted - tp
            out[i, j, :, 2] = n_gt - tp
    return out


def valor_metrics(state: CocoState, thresholds: np.ndarray, score_thresholds: np.ndarray,
                  use: list[int] | None = None,
                  recall_thresholds: np.ndarray = RECALL_THRESHOLDS) -> dict:
    """Valor's detection metrics from a state built with one area range, no max_dets truncation
    and no crowd rule (the "valor" protocol) over the IoU `thresholds`; `use` picks the ones the
    metrics report and average over (default all). See valor_metrics_from; also "curve":
    (precision, scores) float64[T, R, K], accumulate()'s arrays (with_scores) over all of
    `thresholds`, the InterpolatedPrecisionRecallCurve's values (-1 for labels without ground
    truth)."""
    precision, _, scores = accumulate(state, thresholds, recall_thresholds, max_dets=(None,),
                                      with_scores=True)
    present = (state.n_gt[:, 0] > 0) | (np.bincount(state.category, minlength=state.n_categories) > 0)
    out = valor_metrics_from(precision, valor_counts(state, thresholds.size, score_thresholds),
                             state.n_gt[:, 0], present, use)
    out["curve"] = (precision[:, :, :, 0, 0], scores[:, :, :, 0, 0])
    return out


def valor_metrics_from(precision: np.ndarray, counts: np.ndarray, n_gt: np.ndarray,
                       present: np.ndarray, use: list[int] | None = None) -> dict:
    """Valor's metrics from pycocotools-shaped precision [T, R, K, 1, 1] (one area range, no
    max_dets) and valor_counts() [T, S, K, 3] over the same T IoU thresholds.

    AP[t, k]: the mean over the recall points of the interpolated precision, 0 for a label that
    has predictions but no ground truth (Valor counts such a label, with AP 0, in mAP). AR[s, k]:
    mean over IoU thresholds of recall counting only detections with score >= s and score > 0.
    Means over labels cover the labels present (with ground truth or predictions)."""
    use = list(range(precision.shape[0])) if use is None else use
    has_gt = n_gt > 0
    ap = np.where(has_gt[None, :], precision[use, :, :, 0, 0].mean(axis=1), 0.0)       # [T, K]
    return valor_metrics_of(ap, counts, n_gt, present, use)


def valor_metrics_of(ap: np.ndarray, counts: np.ndarray, n_gt: np.ndarray, present: np.ndarray,
                     use: list[int]) -> dict:
    """valor_metrics_from's output from AP float64[len(use), K] (0 for labels without ground
    truth) and the rest of its arguments."""
    has_gt = n_gt > 0
    recall = np.zeros((len(use),) + counts.shape[1:3])
    np.divide(counts[use, :, :, 0], n_gt, out=recall, where=has_gt)
    ar = recall.mean(axis=0)                                                           # [S, K]

    def over_labels(values: np.ndarray) -> np.ndarray:
        return values[..., present].mean(axis=-1) if present.any() else np.zeros(values.shape[:-1])

    return {"present": present, "counts": counts, "AP": ap, "mAP": over_labels(ap),
            "APAveragedOverIOUs": ap.mean(axis=0), "mAPAveragedOverIOUs": over_labels(ap.mean(axis=0)),
            "AR": ar, "mAR": over_labels(ar),
            "ARAveragedOverScores": ar.mean(axis=0), "mARAveragedOverScores": over_labels(ar.mean(axis=0))}


@dataclass
class ValorBinnedState:
    """Constant-memory valor-protocol state (--score_bins N): the BinnedState (one area range, no
    max_dets) for AP bounds, and the exact, additive valor_counts() [T, S, K, 3] at the score
    thresholds known in advance (metric and PR-curve thresholds), so Counts, AR and the curve
    stay exact. Matching is per datum, so a shard's counts are final for its datums."""

    binned: "BinnedState"
    score_thresholds: np.ndarray
    counts: np.ndarray

    @staticmethod
    def from_state(state: CocoState, n_bins: int, thresholds: np.ndarray,
                   score_thresholds: np.ndarray) -> "ValorBinnedState":
        return ValorBinnedState(BinnedState.from_state(state, n_bins, thresholds, (None,)),
                                score_thresholds, valor_counts(state, thresholds.size, score_thresholds))

    def merge(self, other: "ValorBinnedState") -> "ValorBinnedState":
        self.binned = self.binned.merge(other.binned)
        self.counts = self.counts + other.counts
        return self

    def copy(self) -> "ValorBinnedState":
        return ValorBinnedState(self.binned.copy(), self.score_thresholds, self.counts.copy())

    @property
    def present(self) -> np.ndarray:
        b = self.binned
        with_predictions = np.zeros(b.n_categories, dtype=bool)
        with_predictions[b.key // (b.n_bins * b.n_classes)] = True
        return (b.n_gt[:, 0] > 0) | with_predictions

    def metrics(self, thresholds: np.ndarray, score_thresholds, use: list[int], upper: bool) -> dict:
        """valor_metrics_from with AP's lower (upper=False) or upper bound; the rest is exact."""
        precision, _ = accumulate_binned(self.binned, thresholds, upper=upper)
        picked = [int(np.flatnonzero(self.score_thresholds == s)[0]) for s in score_thresholds]
        return valor_metrics_from(precision, self.counts[:, picked], self.binned.n_gt[:, 0],
                                  self.present, use)

    def curve_counts(self, score_thresholds) -> np.ndarray:
        return self.counts[:, [int(np.flatnonzero(self.score_thresholds == s)[0]) for s in score_thresholds]]


def valor_present(state: CocoState) -> np.ndarray:
    """Labels with ground truth or predictions."""
    return (state.n_gt[:, 0] > 0) | (np.bincount(state.category, minlength=state.n_categories) > 0)


def highest_scores(state: CocoState) -> np.ndarray:
    """float64[K]: each label's highest detection score, -inf for a label without detections."""
    highest = np.full(state.n_categories, -np.inf)
    np.maximum.at(highest, state.category, state.score)
    return highest


def _category_sums(weights: np.ndarray, category: np.ndarray, mask: np.ndarray,
                   n_categories: int) -> np.ndarray:
    """int64[R, K]: per replicate and category, the weights (uint8[R, n]) of the rows in mask,
    for rows sorted by category (int[n])."""
    out = np.zeros((weights.shape[0], n_categories), dtype=np.int64)
    rows = np.flatnonzero(mask)
    if rows.size:
        present, first = np.unique(category[rows], return_index=True)
        out[:, present] = np.add.reduceat(weights[:, rows], first, axis=1, dtype=np.int64)
    return out


def valor_counts_replicates(state: CocoState, bootstrap, n_thresholds: int,
                            score_thresholds: np.ndarray, replicates: tuple[int, int] | None = None,
                            ) -> tuple[np.ndarray, np.ndarray]:
    """valor_counts() of every replicate (replicates: (first, stop), those only), int64[R, I,
    S, K, 3], each detection and ground truth counted as many times as its image's weight; and
    the weighted number of detections per label, int64[R, K] (a label is present in a replicate
    when it has ground truth or a detection there)."""
    first, stop = replicates or (0, state.n_gt_replicates.shape[0])
    n_gt = state.n_gt_replicates[first:stop, :, 0]                              # [R, K]
    K, S, R = state.n_categories, score_thresholds.size, n_gt.shape[0]
    out = np.zeros((R, n_thresholds, S, K, 3), dtype=np.int64)
    order = np.argsort(state.category, kind="stable")
    category = state.category[order]
    weights = (replicate_row_weights(state, bootstrap, (first, stop))[:, order] if order.size
               else np.zeros((R, 0), np.uint8))
    is_tp = unpack_bits(state.tp[order, 0], n_thresholds)                              # [n, I]
    score = state.score[order]
    for j, s in enumerate(score_thresholds):
        counted = (score >= s) & (score > 0)
        n_counted = _category_sums(weights, category, counted, K)
        for i in range(n_thresholds):
            tp = _category_sums(weights, category, counted & is_tp[:, i], K)
            out[:, i, j, :, 0] = tp
            out[:, i, j, :, 1] = n_counted - tp
            out[:, i, j, :, 2] = n_gt - tp
    return out, _category_sums(weights, category, np.ones(category.size, bool), K)
