"""Constant-memory detection state (--score_bins N): true and false positives counted per score
bin instead of kept per detection, and the lower and upper bounds of the precision they allow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evalbeam.transforms.kernels.detection_coco import (IOU_THRESHOLDS, RECALL_THRESHOLDS,
                                                        CocoState, unpack_bits)


@dataclass
class BinnedState:
    """Constant-memory partial state (--score_bins N): per (category, score bin, max_dets rank
    class) the true and false positives of every area range and IoU threshold.

    key int64[m] sorted and unique: (category * N + bin) * C + rank class; counts int64[m, A, T, 2]
    (tp, fp); n_gt int64[K, A]. bin = min(floor(score * N), N - 1) (scores in [0, 1]); rank class
    c counts the detections whose rank in their image and category is < max_dets[c] but not
    < max_dets[c - 1]. Memory grows with the number of occupied bins, never with detections."""

    n_categories: int
    n_bins: int
    n_classes: int
    n_gt: np.ndarray
    key: np.ndarray
    counts: np.ndarray

    @staticmethod
    def from_state(state: CocoState, n_bins: int, thresholds: np.ndarray,
                   max_dets: tuple) -> "BinnedState":
        T, A = thresholds.size, state.tp.shape[1]
        limits = [m for m in max_dets if m is not None]
        rank_class = np.searchsorted(np.array(limits, dtype=np.int64), state.rank, side="right")
        n_classes = len(max_dets)
        score_bin = np.clip((state.score * n_bins).astype(np.int64), 0, n_bins - 1)
        key = (state.category.astype(np.int64) * n_bins + score_bin) * n_classes + rank_class
        keep = rank_class < n_classes      # ranks beyond the largest max_dets never count
        unique, inverse = np.unique(key[keep], return_inverse=True)
        counts = np.zeros((unique.size, A, T, 2), dtype=np.int64)
        np.add.at(counts[..., 0], inverse, unpack_bits(state.tp[keep], T).astype(np.int64))
        np.add.at(counts[..., 1], inverse, unpack_bits(state.fp[keep], T).astype(np.int64))
        return BinnedState(state.n_categories, n_bins, n_classes, state.n_gt.copy(), unique, counts)

    def merge(self, other: "BinnedState") -> "BinnedState":
        key = np.concatenate([self.key, other.key])
        unique, inverse = np.unique(key, return_inverse=True)
        counts = np.zeros((unique.size,) + self.counts.shape[1:], dtype=np.int64)
        np.add.at(counts, inverse, np.concatenate([self.counts, other.counts]))
        self.key, self.counts, self.n_gt = unique, counts, self.n_gt + other.n_gt
        return self

    def copy(self) -> "BinnedState":
        return BinnedState(self.n_categories, self.n_bins, self.n_classes, self.n_gt.copy(),
                           self.key.copy(), self.counts.copy())


def accumulate_binned(state: BinnedState, thresholds: np.ndarray = IOU_THRESHOLDS,
                      recall_thresholds: np.ndarray = RECALL_THRESHOLDS,
                      upper: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """precision [T, R, K, A, M] and recall [T, K, A, M] from a BinnedState.

    Detections are taken a bin at a time, highest first. The counts at a bin's end do not depend
    on the order inside the bin, so these points lie on the exact precision-recall curve and the
    interpolated precision from them is a lower bound (upper=False). Inside a bin, precision is
    highest when its true positives come first; adding that point per bin gives an upper bound
    (upper=True). Recall (the AR statistics) is exact either way."""
    T, R, K = thresholds.size, recall_thresholds.size, state.n_categories
    A, M = state.counts.shape[1], state.n_classes
    precision = -np.ones((T, R, K, A, M))
    recall = -np.ones((T, K, A, M))
    category = state.key // (state.n_bins * M)
    score_bin = (state.key // M) % state.n_bins
    rank_class = state.key % M
    for k in range(K):
        areas = np.flatnonzero(state.n_gt[k] > 0)
        if not areas.size:
            continue
        npig = state.n_gt[k, areas].astype(float)[:, None, None]                  # [a, 1, 1]
        for m in range(M):
            rows = np.flatnonzero((category == k) & (rank_class <= m))
            bins = np.unique(score_bin[rows])[::-1]                                   # high first
            per_bin = np.zeros((bins.size, areas.size, T, 2), dtype=np.int64)
            np.add.at(per_bin, np.searchsorted(-bins, -score_bin[rows]), state.counts[rows][:, areas])
            per_bin = per_bin.transpose(1, 2, 0, 3)                                   # [a, T, b, 2]
            tp_end = np.cumsum(per_bin[..., 0], axis=2).astype(float)
            fp_end = np.cumsum(per_bin[..., 1], axis=2).astype(float)
            recall[:, k, areas, m] = (tp_end[:, :, -1] / npig[:, :, 0]).T if bins.size else 0.0
            if upper:  # each bin's best point (its true positives first), then its end
                tp_best = tp_end
                fp_best = fp_end - per_bin[..., 1]
                tp_pts = np.stack([tp_best, tp_end], axis=3).reshape(areas.size, T, -1)
                fp_pts = np.stack([fp_best, fp_end], axis=3).reshape(areas.size, T, -1)
            else:
                tp_pts, fp_pts = tp_end, fp_end
            rc = tp_pts / npig
            pr = tp_pts / (fp_pts + tp_pts + np.spacing(1))
            if not bins.size:
                precision[:, :, k, areas, m] = 0
                continue
            pr = np.maximum.accumulate(pr[:, :, ::-1], axis=2)[:, :, ::-1]
            for i, a in enumerate(areas):
                q = np.zeros((T, R))
                for t in range(T):
                    inds = np.searchsorted(rc[i, t], recall_thresholds, side="left")
                    valid = inds < rc.shape[2]
                    q[t, valid] = pr[i, t, inds[valid]]
                precision[:, :, k, a, m] = q
    return precision, recall
