"""Classification's bootstrap replicates of one label key: their weighted counts
(ReplicateState), the ROC entries from which their score histograms are rebuilt a block of
replicates at a time (RocEntries), and per-group sums of datum weights for all replicates at
once (group_weight_sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evalbeam.transforms.kernels.bootstrap import Bootstrap
from evalbeam.transforms.kernels.ranking import ReplicateHistogram, roc_bins, score_bins


@dataclass
class ReplicateState:
    """The weighted counts of R Poisson bootstrap replicates of one label key (V values, T score
    thresholds): what the scalar metrics need, nothing else (no confusion matrix, curves or
    examples). In replicate r datum d weighs w[r, d] (kernels.bootstrap), so every count below
    is the count of the dataset in which datum d appears w[r, d] times.

    n_pop int64[R]; n_gt, n_pred int64[R, V]; tp, fp int64[R, T, V] (as in KeyState);
    roc_parts: RocEntries parts (ROCAUC / mROCAUC only; concatenated lazily), from which
    histogram() builds the replicates' score histograms a block of replicates at a time."""

    n_pop: np.ndarray
    n_gt: np.ndarray
    n_pred: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    roc_parts: list["RocEntries"] | None = None

    @property
    def replicates(self) -> int:
        return int(self.n_pop.size)

    def copy(self) -> "ReplicateState":
        # ROC parts are never modified in place, so they are shared
        return ReplicateState(self.n_pop.copy(), self.n_gt.copy(), self.n_pred.copy(),
                              self.tp.copy(), self.fp.copy(),
                              None if self.roc_parts is None else list(self.roc_parts))

    def merge(self, other: "ReplicateState") -> "ReplicateState":
        """Add other into self (integer sums: exact and order-free) and return self."""
        if other.n_pop.shape != self.n_pop.shape:
            raise ValueError("cannot merge states with different numbers of replicates")
        self.n_pop += other.n_pop
        self.n_gt += other.n_gt
        self.n_pred += other.n_pred
        self.tp += other.tp
        self.fp += other.fp
        if self.roc_parts is not None:
            self.roc_parts.extend(other.roc_parts)
            sizes = sorted(len(p) for p in self.roc_parts)
            # same policy as KeyState's score histograms
            if len(sizes) > 1 and (sum(sizes[:-1]) >= sizes[-1] or len(sizes) > 32):
                self.compact()
        return self

    def compact(self) -> "RocEntries | None":
        if self.roc_parts is None:
            return None
        entries = RocEntries.concat(self.roc_parts)
        self.roc_parts = [entries]
        return entries

    def histogram(self, bootstrap: Bootstrap, first: int = 0, stop: int | None = None,
                  ) -> ReplicateHistogram:
        """The replicate score histogram (ranking.ReplicateHistogram) of replicates
        first .. stop - 1 (default: all), their weights drawn again by bootstrap (the Bootstrap
        whose weights made this state) from the hashes the ROC entries keep."""
        stop = self.replicates if stop is None else stop
        entries = self.compact()
        rows = slice(first, stop)
        return entries.histogram(bootstrap.weights(entries.hash, first, stop), self.n_pop[rows],
                                 self.n_gt[rows], self.n_pred[rows])


@dataclass
class RocEntries:
    """What the replicates' ROC AUC needs, without a replicate axis: each prediction entry's
    datum (by hash) and (value, score bin, match) group, and the histogram's bins. A replicate's
    histogram is rebuilt from it for any block of replicates (histogram()), with the weights
    drawn again from the hashes, so the state costs the same whatever R is: 8 bytes per datum
    with an entry, 8 per entry and 24 per occupied (value, bin) in the shards it merges, where
    the histogram itself would take 16 R bytes per (value, bin) (up to R x 1 MB per key).

    stride: ranking.roc_bins(V) + 1, the bins of a value; hash uint64[d]: the datums that have
    an entry; entry_datum int32[m]: each entry's datum (index into hash); entry_group int32[m]:
    (value * stride + bin) * 2 + (1 if the value is the datum's ground truth); key int64[k],
    low, high float64[k]: the histogram's (value, bin) keys, ascending, with the smallest and
    largest score in each (ReplicateHistogram's); absent int64[a]: the values that some datum
    of the population has no entry for (it scores 0, bin 0, for them)."""

    stride: int
    hash: np.ndarray
    entry_datum: np.ndarray
    entry_group: np.ndarray
    key: np.ndarray
    low: np.ndarray
    high: np.ndarray
    absent: np.ndarray

    def __len__(self) -> int:
        return int(self.entry_group.size + self.key.size)

    @staticmethod
    def build(datum_hash, has_gt, entry_datum, entry_value, entry_score, is_match,
              V: int) -> "RocEntries":
        """The entries of one shard, as match_key holds them: datums in hash order, entries
        sorted by datum."""
        stride = roc_bins(V) + 1
        bins = entry_value.astype(np.int64) * stride + score_bins(entry_score, stride - 1)
        groups = bins * 2 + is_match
        if stride * 2 * max(V, 1) >= 1 << 31:
            raise ValueError(f"{V} values have too many score bins for int32 groups")
        # the datums with an entry, and each entry's index among them (entries are by datum)
        first = np.r_[True, entry_datum[1:] != entry_datum[:-1]] if entry_datum.size else \
            np.zeros(0, dtype=bool)
        with_entry = entry_datum[first]
        index = (np.cumsum(first) - 1).astype(np.int32)
        in_pop = has_gt.copy()
        in_pop[entry_datum] = True
        # (each datum has at most one entry per value, so the values some datum lacks are these)
        absent = np.flatnonzero(np.bincount(entry_value, minlength=V) < np.count_nonzero(in_pop))
        key, at = np.unique(np.r_[bins, absent * stride], return_inverse=True)
        low = np.full(key.size, np.inf)
        high = np.full(key.size, -np.inf)
        scores = np.r_[entry_score, np.zeros(absent.size)]
        np.minimum.at(low, at, scores)
        np.maximum.at(high, at, scores)
        return RocEntries(stride, datum_hash[with_entry].astype(np.uint64), index,
                          groups.astype(np.int32), key, low, high, absent.astype(np.int64))

    @staticmethod
    def concat(parts: list["RocEntries"]) -> "RocEntries":
        """The entries of the union (the parts' datums side by side: a datum in two parts
        counts twice, as adding their histograms would count it)."""
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0] + [p.hash.size for p in parts])
        if offsets[-1] >= 1 << 31:
            raise ValueError("more than 2^31 datums in one ROC state")
        key = np.unique(np.concatenate([p.key for p in parts]))
        low = np.full(key.size, np.inf)
        high = np.full(key.size, -np.inf)
        for p in parts:
            at = np.searchsorted(key, p.key)
            low[at] = np.minimum(low[at], p.low)
            high[at] = np.maximum(high[at], p.high)
        return RocEntries(
            parts[0].stride, np.concatenate([p.hash for p in parts]),
            np.concatenate([p.entry_datum + np.int32(o) for p, o in zip(parts, offsets)]),
            np.concatenate([p.entry_group for p in parts]), key, low, high,
            np.unique(np.concatenate([p.absent for p in parts])))

    def bytes_per_replicate(self) -> int:
        """What histogram() holds per replicate: the weights, the group sums, pos and neg, and
        replicate_roc_auc's temporaries on the largest value (int64 arrays of its bins)."""
        return int(self.hash.size + 8 * (2 * self.key.size + 2 * self.key.size)
                   + 8 * 6 * min(self.key.size, self.stride))

    def histogram(self, weights: np.ndarray, n_pop: np.ndarray, n_gt: np.ndarray,
                  n_pred: np.ndarray) -> ReplicateHistogram:
        """The ReplicateHistogram of the replicates whose weights of the datums of hash are
        weights (uint8[r, d]) and whose population, ground-truth and prediction counts are
        n_pop int64[r], n_gt and n_pred int64[r, V] (the ReplicateState's rows): each entry's
        weight in its (value, bin) as positive or negative, and each value's datums without an
        entry in its bin 0 (from the counts, as the weight of the population minus that of the
        entries)."""
        R, V = n_gt.shape
        stride = self.stride
        ids, sums, _, _ = group_weight_sums(weights, self.entry_datum, self.entry_group)
        match_of = (ids & 1).astype(bool)
        matched_sum = np.zeros((R, V), dtype=np.int64)  # weight of entries of v on datums of gt v
        v_ids, v_sums = ids[match_of] // (2 * stride), sums[:, match_of]
        if v_ids.size:      # ids ascending: each value's groups are contiguous
            starts = np.flatnonzero(np.r_[True, v_ids[1:] != v_ids[:-1]])
            matched_sum[:, v_ids[starts]] = np.add.reduceat(v_sums, starts, axis=1)
        pos = np.zeros((R, self.key.size), dtype=np.int64)
        neg = np.zeros((R, self.key.size), dtype=np.int64)
        # a (value, bin) key has at most one matching and one non-matching group
        at = np.searchsorted(self.key, ids // 2)
        pos[:, at[match_of]] += sums[:, match_of]
        neg[:, at[~match_of]] += sums[:, ~match_of]
        del sums
        absent = self.absent
        if absent.size:
            pos_absent = n_gt[:, absent] - matched_sum[:, absent]
            neg_absent = (n_pop[:, None] - n_gt[:, absent]) - (n_pred[:, absent] - matched_sum[:, absent])
            at = np.searchsorted(self.key, absent * stride)
            pos[:, at] += pos_absent
            neg[:, at] += neg_absent
        return ReplicateHistogram(self.key, pos, neg, self.low, self.high)


# gathered (replicate, item) weights per bincount call in group_weight_sums (16 MB with their bins)
_SUM_BLOCK = 1 << 20


def group_weight_sums(weights: np.ndarray, columns: np.ndarray, groups: np.ndarray,
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-group sums of datum weights, for all replicates at once.

    weights uint8[R, n] (replicate x datum); columns int64[m]: the datum of each item; groups
    int64[m]: its group. Returns (group ids ascending and distinct int64[k], sums int64[R, k]
    with sums[r, j] = sum of weights[r, columns[i]] over the items i of group j, the item order
    sorted by group, the start of each group in it). Cost O(R m) plus one sort of m groups."""
    R = weights.shape[0]
    if not groups.size:
        empty = np.zeros(0, dtype=np.int64)
        return empty, np.zeros((R, 0), dtype=np.int64), empty, empty
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    new = np.r_[True, sorted_groups[1:] != sorted_groups[:-1]]
    starts = np.flatnonzero(new)
    inverse = np.empty(groups.size, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    # Weighted bincounts, faster than np.add.reduceat along the datum axis of the [R, m]
    # gathered weights (tests/benchmarks/README.md). Each call counts a block of replicates (their groups
    # offset by r k) holding at most _SUM_BLOCK items, so a few hundred items do not pay
    # numpy's per-call cost per replicate and a large m never holds an [R, m] copy. The float64
    # sums are of small integers, exact up to 2^53, so the int64 result is exact.
    k = starts.size
    sums = np.empty((R, k), dtype=np.int64)
    rows = max(1, _SUM_BLOCK // groups.size)
    for start in range(0, R, rows):
        stop = min(start + rows, R)
        bins = (np.arange(stop - start, dtype=np.int64)[:, None] * k + inverse[None, :]).ravel()
        block = weights[start:stop][:, columns].ravel()
        sums[start:stop] = np.bincount(bins, weights=block, minlength=(stop - start) * k).reshape(-1, k)
    return sorted_groups[starts], sums, order, starts


def dense_weight_sums(weights: np.ndarray, columns: np.ndarray, groups: np.ndarray,
                      n_groups: int) -> np.ndarray:
    """int64[R, n_groups]: group_weight_sums laid out densely (0 for absent groups)."""
    ids, sums, _, _ = group_weight_sums(weights, columns, groups)
    out = np.zeros((weights.shape[0], n_groups), dtype=np.int64)
    out[:, ids] = sums
    return out


def check_weights(weights: np.ndarray, datum_hash: np.ndarray, bootstrap: Bootstrap | None) -> None:
    """The replicates' ROC AUC draws the weights again from the datum hashes
    (ReplicateState.histogram), with config.bootstrap: raise ValueError unless that is the
    Bootstrap that drew these weights (its R, and the weights of a few datums in a few
    replicates: 32 draws agree by chance with probability below 1e-16)."""
    if not weights.shape[0]:
        return
    if bootstrap is None or bootstrap.replicates != weights.shape[0]:
        raise ValueError("ROC AUC replicates need config.bootstrap, the Bootstrap that drew the "
                         "weights given to match_key")
    rows, columns = min(4, weights.shape[0]), min(8, weights.shape[1])
    if not np.array_equal(bootstrap.weights(datum_hash[:columns], 0, rows), weights[:rows, :columns]):
        raise ValueError("the weights given to match_key are not config.bootstrap's")
