"""Mergeable per-(model, slice) state of one judge metric (exact sums and status counts), and the
bootstrap replicate sums every text state shares (ReplicateSums).

A datum adds its value to the mean only when its status is "ok"; every datum is counted under
its status (ok, not_applicable, missing_prediction, no_statements, a judge call's failure
status, not_sent, dry_run), so the counts add up to the datums evaluated.

Bootstrap replicates (kernels/bootstrap.py). While a shard is scored, a state only notes each
datum's column in the shard's weight matrix W (uint8[R, n], row r = replicate r) beside its
value (note_*); seal(W) then turns the notes into ReplicateSums in one vectorised step per
metric, so the per-datum work is never repeated per replicate. Replicate r of a mean is
sum_i W[r, i] x_i / sum_i W[r, i] over the datums where the metric is defined: with integer
weights and exact sums this is exactly the mean of the dataset in which datum i appears
W[r, i] times. Replicates whose weighted count is 0 are undefined (None).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evalbeam.transforms.kernels.exact_sum import (ExactSum, merge_totals, total_value,
                                                   weighted_totals)


@dataclass
class ReplicateSums:
    """Weighted sums of c components over the datums of R bootstrap replicates, exact and
    order-free: weight[r] = sum_i W[r, i] (int64[R]); totals[j][r] = the exact_totals
    ({exponent: integer}) of sum_i W[r, i] x[i, j]."""

    weight: np.ndarray
    totals: list

    @classmethod
    def empty(cls, replicates: int, components: int) -> "ReplicateSums":
        return cls(np.zeros(replicates, np.int64), [[{} for _ in range(replicates)]
                                                    for _ in range(components)])

    @classmethod
    def of(cls, weights: np.ndarray, values: np.ndarray) -> "ReplicateSums":
        """weights: integer [R, n] (the datums' columns of W); values: float64[n, c], finite."""
        values = np.asarray(values, dtype=np.float64).reshape(weights.shape[1], -1)
        weight = weights.sum(axis=1, dtype=np.int64)
        return cls(weight, weighted_totals(values, weights))

    def merge(self, other: "ReplicateSums") -> "ReplicateSums":
        self.weight = self.weight + other.weight
        self.totals = [[merge_totals(a, b) for a, b in zip(mine, theirs)]
                       for mine, theirs in zip(self.totals, other.totals)]
        return self

    def copy(self) -> "ReplicateSums":
        return ReplicateSums(self.weight.copy(), [[dict(t) for t in column] for column in self.totals])

    def means(self) -> list[list[float | None]]:
        """[component][replicate]: the exact weighted sum rounded once, over the weighted count
        (None where the count is 0)."""
        return [[total_value(t) / int(w) if w else None for t, w in zip(column, self.weight)]
                for column in self.totals]


def merge_optional(mine, theirs):
    """mine merged with theirs where either may be None (a state not started): theirs is
    copied, never shared, when mine is None."""
    if theirs is None:
        return mine
    return theirs.copy() if mine is None else mine.merge(theirs)


@dataclass
class JudgeMetricState:
    """kind and parameters name the records; total: exact sum of the ok values; counts: datums
    per status; binary: the per-datum value is 0 or 1 (a verdict), so the mean is a proportion
    of datums; replicates: ReplicateSums of the ok values (bootstrap only); notes: the shard's
    unsealed (column, value or None) pairs."""

    kind: str
    parameters: dict
    total: ExactSum = field(default_factory=ExactSum)
    counts: dict = field(default_factory=dict)
    binary: bool = False
    replicates: ReplicateSums | None = None
    notes: list | None = None

    def add(self, value: float | None, status: str, column: int | None = None) -> None:
        """One datum; column: its column in the shard's weight matrix when bootstrapping."""
        self.counts[status] = self.counts.get(status, 0) + 1
        ok = status == "ok" and value is not None
        if ok:
            self.total.add(float(value))
        if column is not None:
            if self.notes is None:
                self.notes = []
            self.notes.append((column, float(value) if ok else None))

    def seal(self, weights: np.ndarray) -> None:
        """Turn the notes into replicate sums with the shard's weights uint8[R, n]."""
        notes, self.notes = self.notes or [], None
        kept = [(c, v) for c, v in notes if v is not None]
        if kept:
            columns = np.array([c for c, _ in kept], np.int64)
            part = ReplicateSums.of(weights[:, columns], np.array([v for _, v in kept]))
        else:
            part = ReplicateSums.empty(weights.shape[0], 1)
        self.replicates = merge_optional(self.replicates, part)

    def merge(self, other: "JudgeMetricState") -> "JudgeMetricState":
        self.total.merge(other.total)
        for status, n in other.counts.items():
            self.counts[status] = self.counts.get(status, 0) + n
        self.replicates = merge_optional(self.replicates, other.replicates)
        return self

    def copy(self) -> "JudgeMetricState":
        return JudgeMetricState(self.kind, dict(self.parameters), self.total.copy(), dict(self.counts),
                                self.binary, None if self.replicates is None else self.replicates.copy())

    def records(self) -> list[dict]:
        """One record: the mean over the ok datums (null when none), counts per status; when
        bootstrapped, REPLICATES (the replicate means) and, for a binary metric, PROPORTION
        [datums valued 1, ok datums]."""
        from evalbeam.transforms.kernels.bootstrap import PROPORTION, REPLICATES

        ok = self.counts.get("ok", 0)
        record = {"type": self.kind, "value": self.total.mean() if ok else None,
                  "parameters": dict(self.parameters), "counts": dict(sorted(self.counts.items()))}
        if self.replicates is not None and ok:
            # (a record without an ok datum has no value, hence no interval, as attach_replicates)
            record[REPLICATES] = self.replicates.means()[0]
            if self.binary:
                # the ok values are 0 and 1, so their exact sum is the count of ones
                record[PROPORTION] = [int(round(self.total.value())), ok]
        return [record]
