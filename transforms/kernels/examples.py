"""Bounded, mergeable sets of example datums, chosen by a stable hash.

An example set holds candidate examples, each in a group (a cell of a confusion matrix, a
(threshold, label, category) of a curve...). Reducing keeps, per group, the k examples with the
smallest (hash of datum_uid, datum_uid). The choice depends only on which datums qualify, never on
arrival order, shard count or worker count, and merging reduced sets then reducing again gives the
same result as reducing everything at once, which is what a CombineFn needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ExampleSet:
    """Columns of equal length n: group int64, hash uint64, uid object (str), score float64 (NaN
    when the example has no prediction score)."""

    group: np.ndarray
    hash: np.ndarray
    uid: np.ndarray
    score: np.ndarray

    @staticmethod
    def empty() -> "ExampleSet":
        return ExampleSet(np.zeros(0, np.int64), np.zeros(0, np.uint64),
                          np.zeros(0, object), np.zeros(0, np.float64))

    def __len__(self) -> int:
        return int(self.group.size)

    @staticmethod
    def concat(parts: list["ExampleSet"]) -> "ExampleSet":
        parts = [p for p in parts if len(p)]
        if not parts:
            return ExampleSet.empty()
        if len(parts) == 1:
            return parts[0]
        return ExampleSet(*(np.concatenate([getattr(p, f) for p in parts])
                            for f in ("group", "hash", "uid", "score")))

    def take(self, index: np.ndarray) -> "ExampleSet":
        return ExampleSet(self.group[index], self.hash[index], self.uid[index], self.score[index])

    def reduce(self, k: int) -> "ExampleSet":
        """Keep the k smallest (hash, uid) per group; the result is sorted by (group, hash, uid)."""
        if k <= 0 or not len(self):
            return ExampleSet.empty()
        order = np.lexsort((self.hash, self.group))
        group, hashes = self.group[order], self.hash[order]
        same = (group[1:] == group[:-1]) & (hashes[1:] == hashes[:-1])
        if same.any():
            # Two distinct uids with one 64-bit hash: rare, but the uid must break the tie so
            # that the choice stays independent of input order.
            keys = list(zip(group.tolist(), hashes.tolist(), self.uid[order].tolist()))
            order = order[sorted(range(len(keys)), key=keys.__getitem__)]
            group = self.group[order]
        starts = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1]
        rank = np.arange(group.size) - np.repeat(starts, np.diff(np.r_[starts, group.size]))
        return self.take(order[rank < k])

    def by_group(self) -> dict[int, list[tuple[str, float]]]:
        """{group: [(uid, score), ...]} in stored order (call on a reduced set)."""
        out: dict[int, list[tuple[str, float]]] = {}
        for g, u, s in zip(self.group.tolist(), self.uid.tolist(), self.score.tolist()):
            out.setdefault(g, []).append((u, s))
        return out


def smallest_k(group: np.ndarray, keys: list[np.ndarray], k: int) -> np.ndarray:
    """Positions of the k items with the smallest keys (compared in the order given, then by
    position) in each group: int64, grouped by group."""
    if not group.size or k <= 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort(tuple(reversed(keys)) + (group,))
    g = group[order]
    starts = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    rank = np.arange(g.size) - np.repeat(starts, np.diff(np.r_[starts, g.size]))
    return order[rank < k]


def first_k(groups: np.ndarray, k: int, n_groups: int) -> np.ndarray:
    """Positions of the first k items of each group, the sequence being in the preferred order
    (ascending hash): int64 positions, ascending. O(k * n), no sort.

    groups int64[n] in [0, n_groups)."""
    chosen = []
    alive = np.arange(groups.size)
    for _ in range(k):
        if not alive.size:
            break
        first = np.full(n_groups, -1, dtype=np.int64)
        first[groups[alive][::-1]] = alive[::-1]  # the last write wins: the earliest position
        picked = first[first >= 0]
        chosen.append(picked)
        if len(chosen) < k:
            keep = np.ones(groups.size, dtype=bool)
            keep[picked] = False
            alive = alive[keep[alive]]
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def record_layers(groups: np.ndarray, levels: np.ndarray, k: int) -> np.ndarray:
    """Positions that can be among the first k of their group with level > p, for any p.

    The sequence is in the preferred order; levels are small non-negative ints (an item is
    eligible at threshold index p when level > p). An item that has k earlier items of its group
    with a level at least its own can never be among the first k eligible ones, so only the first
    k layers of running-maximum records per group survive: typically O(k log n) per group, which
    makes per-threshold example selection cheap. Returns int64 positions, ascending."""
    if not groups.size or k <= 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(groups, kind="stable")
    span = int(levels.max()) + 1
    combined = groups[order].astype(np.int64) * span + levels[order]
    layers = []
    alive = np.arange(order.size)
    for _ in range(k):
        if not alive.size:
            break
        values = combined[alive]
        # values of a later group are all larger, so a group's first item is always a record
        before = np.maximum.accumulate(np.r_[np.int64(-1), values[:-1]])
        record = values > before
        layers.append(alive[record])
        alive = alive[~record]
    return np.sort(order[np.concatenate(layers)])


def make_examples(group: np.ndarray, datum: np.ndarray, score: np.ndarray,
                  hashes: np.ndarray, datum_uid) -> ExampleSet:
    """ExampleSet of chosen examples: group, datum index into datum_uid (Arrow array or numpy
    object array), score and hash of each; uids are fetched only for these few."""
    index = np.asarray(datum, dtype=np.int64)
    if hasattr(datum_uid, "take") and not isinstance(datum_uid, np.ndarray):
        uids = np.array(datum_uid.take(index).to_pylist(), dtype=object)
    else:
        uids = np.asarray(datum_uid, dtype=object)[index]
    return ExampleSet(np.asarray(group, dtype=np.int64), np.asarray(hashes, dtype=np.uint64), uids,
                      np.asarray(score, dtype=np.float64))
