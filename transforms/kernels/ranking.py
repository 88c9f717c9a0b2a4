"""Exact score histograms: ROC AUC and threshold counts that merge across shards without loss.

A histogram holds, for every (label value, distinct score), how many positive and how many negative
datums carry that score. It is the complete sufficient statistic of a one-vs-rest ranking, so ROC
AUC computed from merged shard histograms equals scikit-learn's roc_auc_score on the concatenated
data, ties included, and threshold counts (tp, fp at score >= t) are exact too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ScoreHistogram:
    """Columns of equal length k, sorted by (value, score), each (value, score) pair at most once:
    value int32 (label value index), score float64, pos int64, neg int64 (datum counts)."""

    value: np.ndarray
    score: np.ndarray
    pos: np.ndarray
    neg: np.ndarray

    @staticmethod
    def empty() -> "ScoreHistogram":
        return ScoreHistogram(np.zeros(0, np.int32), np.zeros(0, np.float64),
                              np.zeros(0, np.int64), np.zeros(0, np.int64))

    def __len__(self) -> int:
        return int(self.value.size)

    @staticmethod
    def build(value: np.ndarray, score: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> "ScoreHistogram":
        """Sort (value, score) rows and add up the counts of repeated pairs."""
        if value.size == 0:
            return ScoreHistogram.empty()
        # Two stable passes (by score, then by value) instead of np.lexsort: the second pass
        # sorts small integers, for which numpy uses a radix sort.
        order = np.argsort(score, kind="stable")
        small = np.int16 if int(value.max()) < np.iinfo(np.int16).max else np.int64
        order = order[np.argsort(value[order].astype(small), kind="stable")]
        value, score, pos, neg = value[order], score[order], pos[order], neg[order]
        new = np.r_[True, (value[1:] != value[:-1]) | (score[1:] != score[:-1])]
        if new.all():
            return ScoreHistogram(value.astype(np.int32), score.astype(np.float64),
                                  pos.astype(np.int64), neg.astype(np.int64))
        starts = np.flatnonzero(new)
        return ScoreHistogram(value[starts].astype(np.int32), score[starts].astype(np.float64),
                              np.add.reduceat(pos.astype(np.int64), starts),
                              np.add.reduceat(neg.astype(np.int64), starts))

    @staticmethod
    def merge(parts: list["ScoreHistogram"]) -> "ScoreHistogram":
        """One histogram from several: per label value, the parts' sorted segments are
        concatenated and re-sorted with a stable sort, which finds the sorted runs (timsort), so
        merging k parts costs O(n log k) rather than a full sort."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return ScoreHistogram.empty()
        if len(parts) == 1:
            return parts[0]
        values = np.unique(np.concatenate([p.value[np.r_[True, p.value[1:] != p.value[:-1]]]
                                           for p in parts]))
        bounds = [(np.searchsorted(p.value, values, "left"), np.searchsorted(p.value, values, "right"))
                  for p in parts]
        columns: dict[str, list] = {"value": [], "score": [], "pos": [], "neg": []}
        for i, v in enumerate(values.tolist()):
            pieces = [(p, lo[i], hi[i]) for p, (lo, hi) in zip(parts, bounds) if hi[i] > lo[i]]
            score = np.concatenate([p.score[a:b] for p, a, b in pieces])
            pos = np.concatenate([p.pos[a:b] for p, a, b in pieces])
            neg = np.concatenate([p.neg[a:b] for p, a, b in pieces])
            if len(pieces) > 1:
                order = np.argsort(score, kind="stable")
                score, pos, neg = score[order], pos[order], neg[order]
                starts = np.flatnonzero(np.r_[True, score[1:] != score[:-1]])
                if starts.size < score.size:
                    score = score[starts]
                    pos, neg = np.add.reduceat(pos, starts), np.add.reduceat(neg, starts)
            columns["value"].append(np.full(score.size, v, dtype=np.int32))
            columns["score"].append(score)
            columns["pos"].append(pos)
            columns["neg"].append(neg)
        return ScoreHistogram(*(np.concatenate(columns[f]) for f in ("value", "score", "pos", "neg")))

    def segment(self, v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scores ascending, pos, neg) of label value v."""
        lo, hi = np.searchsorted(self.value, [v, v + 1])
        return self.score[lo:hi], self.pos[lo:hi], self.neg[lo:hi]


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float | None:
    """ROC AUC from counts per distinct score, scores ascending.

    AUC = P(score of a random positive > score of a random negative) + 0.5 P(equal)
        = sum_i neg_i * (2 * positives_above_i + pos_i) / (2 * P * N),
    which is the area under the trapezoidal ROC curve, i.e. sklearn.metrics.roc_auc_score with
    ties. The numerator is summed in int64, so the result is exact up to the final division.
    None when there are no positives or no negatives (the AUC is undefined).
    """
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    if n_pos == 0 or n_neg == 0:
        return None
    positives_above = n_pos - np.cumsum(pos)
    numerator = int(np.sum(neg * (2 * positives_above + pos)))
    return numerator / (2 * n_pos * n_neg)


def counts_at_thresholds(score: np.ndarray, pos: np.ndarray, neg: np.ndarray,
                         thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tp, fp) per threshold: positives and negatives whose score s satisfies s >= t and s > 0.

    score ascending (one segment of a histogram). A score of 0 never counts as a prediction,
    whatever the threshold, as in Valor. Returns two int64 arrays shaped like thresholds.
    """
    cum_pos = np.r_[0, np.cumsum(pos)]
    cum_neg = np.r_[0, np.cumsum(neg)]
    first_positive = np.searchsorted(score, 0.0, side="right")
    start = np.maximum(np.searchsorted(score, thresholds, side="left"), first_positive)
    return cum_pos[-1] - cum_pos[start], cum_neg[-1] - cum_neg[start]
