"""Exact score histograms: ROC AUC and threshold counts that merge across shards without loss.

A histogram holds, for every (label value, distinct score), how many positive and how many negative
datums carry that score. It is the complete sufficient statistic of a one-vs-rest ranking, so ROC
AUC computed from merged shard histograms equals scikit-learn's roc_auc_score on the concatenated
data, ties included, and threshold counts (tp, fp at score >= t) are exact too.

For bootstrap replicates (kernels.bootstrap) ReplicateHistogram keeps, per (label value, score
bin), the positive and negative weights of R replicates at once; replicate_roc_auc reads an AUC
per replicate from it, with a stated bound on what the binning costs.
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
        # Two passes (by score, then stably by value) instead of np.lexsort: the second pass
        # sorts small integers, for which numpy uses a radix sort. The first need not be stable:
        # rows of one (value, score) are added up, so their order is lost anyway (and numpy's
        # default sort of floats is faster than its stable one).
        order = np.argsort(score)
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


# ----------------------------------------------------------------------------- bootstrap replicates

# Score bins of the replicate histograms: with B bins per value, a score s in [0, 1] falls in bin
# floor(s * B) (1.0 alone in bin B). B is a power of two, so s * B is exact and the bin is a
# monotone function of the score, the same on every shard. B is ROC_BINS for keys of up to 16
# values, and shrinks for larger vocabularies so that one key's histogram has at most
# ROC_KEY_BINS bins in all (its memory: ROC_KEY_BINS x 16 bytes per replicate; classification
# builds it for a block of replicates at a time,
# kernels.classification_replicates.RocEntries).
ROC_BINS_LOG2 = 12
ROC_BINS = 1 << ROC_BINS_LOG2
ROC_KEY_BINS = 1 << 16


def roc_bins(n_values: int) -> int:
    """B, the score bins per value of a key with n_values values: the largest power of two
    <= min(ROC_BINS, ROC_KEY_BINS / n_values), at least 1."""
    share = ROC_KEY_BINS // max(int(n_values), 1)
    return max(1, min(ROC_BINS, 1 << (share.bit_length() - 1))) if share else 1


def score_bins(score: np.ndarray, bins: int = ROC_BINS) -> np.ndarray:
    """int64 bin of each score in [0, 1]: floor(score * bins), in 0 .. bins."""
    return np.floor(np.asarray(score, dtype=np.float64) * bins).astype(np.int64)


@dataclass
class ReplicateHistogram:
    """Weighted binned score histograms of R bootstrap replicates, sparse over (value, bin).

    key int64[k]: value * (bins + 1) + bin, ascending and distinct (bins: roc_bins of the
    key's vocabulary, the same for every part); pos, neg int64[R, k]:
    in replicate r, the summed weights of the positive / negative datums whose score for that
    value falls in the bin; low, high float64[k]: the smallest and largest score seen in the bin
    (over all datums, whatever their weights). A bin with low == high holds a single distinct
    score, so it loses nothing; see replicate_roc_auc for what a bin with low < high costs."""

    key: np.ndarray
    pos: np.ndarray
    neg: np.ndarray
    low: np.ndarray
    high: np.ndarray

    @staticmethod
    def empty(replicates: int) -> "ReplicateHistogram":
        return ReplicateHistogram(np.zeros(0, np.int64), np.zeros((replicates, 0), np.int64),
                                  np.zeros((replicates, 0), np.int64), np.zeros(0), np.zeros(0))

    def __len__(self) -> int:
        return int(self.key.size)

    @staticmethod
    def merge(parts: list["ReplicateHistogram"]) -> "ReplicateHistogram":
        """The histogram of the union: counts of the same key add (integers: exact, order-free),
        low and high take the min and max."""
        parts = [p for p in parts if len(p)] or parts[:1]
        if len(parts) == 1:
            return parts[0]
        key = np.unique(np.concatenate([p.key for p in parts]))
        R = parts[0].pos.shape[0]
        pos = np.zeros((R, key.size), dtype=np.int64)
        neg = np.zeros((R, key.size), dtype=np.int64)
        low = np.full(key.size, np.inf)
        high = np.full(key.size, -np.inf)
        for p in parts:
            # keys are distinct within a part, so fancy-indexed += adds each column once
            at = np.searchsorted(key, p.key)
            pos[:, at] += p.pos
            neg[:, at] += p.neg
            low[at] = np.minimum(low[at], p.low)
            high[at] = np.maximum(high[at], p.high)
        return ReplicateHistogram(key, pos, neg, low, high)

    def segment(self, v: int, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pos [R, b], neg [R, b], low [b], high [b]) of label value v, bins ascending (bins:
        the score bins per value the histogram was built with)."""
        lo, hi = np.searchsorted(self.key, [v * (bins + 1), (v + 1) * (bins + 1)])
        return self.pos[:, lo:hi], self.neg[:, lo:hi], self.low[lo:hi], self.high[lo:hi]


def replicate_roc_auc(pos: np.ndarray, neg: np.ndarray, low: np.ndarray, high: np.ndarray,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(auc float64[R], bound float64[R]) from one value's replicate histogram (bins ascending).

    auc[r] = sum_b neg[r, b] (2 above[r, b] + pos[r, b]) / (2 P_r N_r), above = positive weight
    in higher bins, P_r and N_r the total positive and negative weights: roc_auc with each bin
    taken as one tied score, numerator summed exactly in int64; NaN where P_r or N_r is 0.

    Error bound. Pairs (positive, negative) in different bins are ordered as their scores are
    (the bin is monotone in the score); a pair in one bin counts 1/2, where the exact AUC counts
    0, 1/2 or 1. So |auc - exact| <= bound = sum over bins with low < high of
    pos * neg / (2 P N), and bound = 0 (the replicate is exact) when every such bin holds only
    positives or only negatives, in particular when no bin holds two distinct scores (with
    4,096 bins, scores of 3 decimals or fewer: their spacing, 0.001, exceeds the bin width).
    For scores spread evenly over [0, 1] the bound is about 1 / (2 B): 1.2e-4 with 4,096 bins."""
    P = pos.sum(axis=1)
    N = neg.sum(axis=1)
    above = P[:, None] - np.cumsum(pos, axis=1)
    numerator = np.sum(neg * (2 * above + pos), axis=1)
    mixed = low < high
    loose = np.sum(pos[:, mixed] * neg[:, mixed], axis=1)
    auc = np.full(P.shape, np.nan)
    bound = np.full(P.shape, np.nan)
    ok = (P > 0) & (N > 0)
    denominator = 2.0 * P[ok].astype(np.float64) * N[ok].astype(np.float64)
    auc[ok] = numerator[ok] / denominator
    bound[ok] = loose[ok] / denominator
    return auc, bound
