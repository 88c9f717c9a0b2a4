"""Mergeable per-(model, slice) state of one judge metric: exact sums and status counts.

A datum adds its value to the mean only when its status is "ok"; every datum is counted under
its status (ok, not_applicable, missing_prediction, no_statements, a judge call's failure
status, not_sent, dry_run), so the counts add up to the datums evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evalbeam.transforms.kernels.exact_sum import ExactSum


@dataclass
class JudgeMetricState:
    kind: str
    parameters: dict
    total: ExactSum = field(default_factory=ExactSum)
    counts: dict = field(default_factory=dict)

    def add(self, value: float | None, status: str) -> None:
        self.counts[status] = self.counts.get(status, 0) + 1
        if status == "ok" and value is not None:
            self.total.add(float(value))

    def merge(self, other: "JudgeMetricState") -> "JudgeMetricState":
        self.total.merge(other.total)
        for status, n in other.counts.items():
            self.counts[status] = self.counts.get(status, 0) + n
        return self

    def copy(self) -> "JudgeMetricState":
        return JudgeMetricState(self.kind, dict(self.parameters), self.total.copy(), dict(self.counts))

    def records(self) -> list[dict]:
        """One record: the mean over the ok datums (null when none), counts per status."""
        ok = self.counts.get("ok", 0)
        return [{"type": self.kind, "value": self.total.mean() if ok else None,
                 "parameters": dict(self.parameters), "counts": dict(sorted(self.counts.items()))}]
