"""Classification's configuration (ClassificationConfig, the metric types) and its mergeable
partial states: KeyState for one label key, ClassificationState for the keys of one
(model, slice). The semantics are kernels.classification's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evalbeam.transforms.kernels.bootstrap import Bootstrap
from evalbeam.transforms.kernels.calibration import (BINNINGS, CALIBRATION_TYPES, DEFAULT_BINS,
                                                     CalibrationConfig, CalibrationKeyState)
from evalbeam.transforms.kernels.classification_replicates import ReplicateState
from evalbeam.transforms.kernels.examples import ExampleSet
from evalbeam.transforms.kernels.ranking import ScoreHistogram

# The metric types computed by default (and before calibration existed).
DEFAULT_METRIC_TYPES = (
    "Counts", "Precision", "Recall", "F1", "Accuracy", "ROCAUC", "mROCAUC",
    "PrecisionRecallCurve", "ConfusionMatrix", "DetailedPrecisionRecallCurve",
)
# Every type --metrics accepts, in metrics.jsonl's order: the calibration types
# (kernels.calibration) are computed only when asked for, so default outputs stay as they were.
ALL_METRIC_TYPES = DEFAULT_METRIC_TYPES + CALIBRATION_TYPES
DEFAULT_PR_THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))
# Order of the categories of DetailedPrecisionRecallCurve counts (last axis of KeyState.detailed).
DETAILED = ("tp", "fp_misclassification", "fp_hallucination", "fn_misclassification",
            "fn_no_prediction")


# The memory one (model, slice, label key) state may take by default: the bound on a key's
# vocabulary is derived from it (see ClassificationConfig.state_bytes and value_limit).
STATE_BUDGET_BYTES = 256 << 20


@dataclass(frozen=True)
class ClassificationConfig:
    """What to compute, and the bounds on what the input may cost.

    max_label_values: the most distinct values a label key may have (ground truth and every
    model together); None derives it from STATE_BUDGET_BYTES (value_limit). A key beyond it is
    not evaluated (its dense arrays would not fit) and the run says so.
    max_labels_per_row: the most labels one row may hold; None means value_limit, so that no
    single row can by itself push a key beyond its bound. A longer row is rejected.
    calibration_bins: B of the calibration metrics (ECE, MCE, ReliabilityDiagram,
    ClasswiseReliabilityDiagram; computed only when metrics holds some of CALIBRATION_TYPES).
    bootstrap: the kernels.bootstrap.Bootstrap whose replicates the states keep: the calibration
    state's equal-mass replicates and the ROC AUC replicates redraw the weights from it (from
    the datum hashes) at the records step, so it must be the Bootstrap of the weights given to
    match_key; None: none. The other metrics' replicates follow the weights given to
    match_key."""

    score_thresholds: tuple[float, ...] = (0.0,)
    hardmax: bool = True
    pr_curve_thresholds: tuple[float, ...] = DEFAULT_PR_THRESHOLDS
    max_examples: int = 1
    metrics: frozenset[str] = frozenset(DEFAULT_METRIC_TYPES)
    max_label_values: int | None = None
    max_labels_per_row: int | None = None
    calibration_bins: int = DEFAULT_BINS
    bootstrap: Bootstrap | None = None

    def __post_init__(self):
        # Kernels rely on ascending, distinct thresholds.
        for name in ("score_thresholds", "pr_curve_thresholds"):
            object.__setattr__(self, name, tuple(sorted(set(float(t) for t in getattr(self, name)))))

    @property
    def needs_histogram(self) -> bool:
        return bool(self.metrics & {"ROCAUC", "mROCAUC", "PrecisionRecallCurve"})

    @property
    def needs_confusion(self) -> bool:
        return "ConfusionMatrix" in self.metrics

    @property
    def needs_detailed(self) -> bool:
        return "DetailedPrecisionRecallCurve" in self.metrics

    @property
    def calibration(self) -> CalibrationConfig | None:
        """The calibration kernel's configuration, None when no calibration type is asked."""
        wanted = self.metrics & set(CALIBRATION_TYPES)
        if not wanted:
            return None
        bootstrap = self.bootstrap if self.bootstrap is not None and self.bootstrap.enabled else None
        return CalibrationConfig(self.calibration_bins, BINNINGS, wanted, bootstrap)

    def state_bytes(self, n_values: int) -> int:
        """Bytes of the dense arrays of one KeyState of n_values values V, with T score
        thresholds and P curve thresholds (int64 counts): n_gt and n_pred 2V; tp and fp 2TV; the
        confusion matrix T(V+1)^2 (ConfusionMatrix); the detailed curve 5PV
        (DetailedPrecisionRecallCurve). match_key allocates about as much again while it counts
        one shard. Score histograms grow with the prediction entries, not with V. With
    ClasswiseReliabilityDiagram, 8 V B more (B calibration bins)."""
        V, T, P = n_values, len(self.score_thresholds), len(self.pr_curve_thresholds)
        cells = 2 * V + 2 * T * V
        if self.needs_confusion:
            cells += T * (V + 1) ** 2
        if self.needs_detailed:
            cells += len(DETAILED) * P * V
        if "ClasswiseReliabilityDiagram" in self.metrics:
            # the classwise equal-width cells: V B cells of (2 + 3 b) int64, b ~ 2 bands
            cells += 8 * V * self.calibration_bins
        return 8 * cells

    @property
    def value_limit(self) -> int:
        """The most values a label key may have: max_label_values, or else the largest V whose
        state_bytes(V) fits STATE_BUDGET_BYTES: 5,742 with the default options, where the
        confusion matrix dominates (3,326 with three score thresholds), 338,933 without
        ConfusionMatrix."""
        if self.max_label_values is not None:
            return self.max_label_values
        low, high = 1, 1 << 32       # state_bytes(low) fits, state_bytes(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.state_bytes(middle) <= STATE_BUDGET_BYTES else (low, middle)
        return low

    @property
    def labels_per_row_limit(self) -> int:
        return self.max_labels_per_row if self.max_labels_per_row is not None else self.value_limit


@dataclass
class KeyState:
    """Mergeable partial state of one label key with V values, T score thresholds and
    P PR-curve thresholds.

    n_pop: datums in the population; n_gt int64[V]: datums with ground truth v;
    n_pred int64[V]: prediction entries with value v (any score); tp, fp int64[T, V];
    hist_parts: score histograms (merged lazily, see compact()); cm int64[T, V+1, V+1]: confusion
    counts, row = ground truth (V = none), column = positive prediction (V = none);
    detailed int64[P, V, 5] in DETAILED order; examples of the confusion matrix (group =
    (t * (V+1) + row) * (V+1) + column) and of the detailed curve (group = (p * 5 + category) * V + v).
    """

    n_values: int
    n_pop: int
    n_gt: np.ndarray
    n_pred: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    hist_parts: list[ScoreHistogram] = field(default_factory=list)
    cm: np.ndarray | None = None
    cm_examples: ExampleSet | None = None
    detailed: np.ndarray | None = None
    detailed_examples: ExampleSet | None = None
    replicates: "ReplicateState | None" = None
    calibration: CalibrationKeyState | None = None

    def copy(self) -> "KeyState":
        """A copy whose arrays can be added to without touching self (example sets and
        histograms are never modified in place, so they are shared)."""
        return KeyState(
            self.n_values, self.n_pop, self.n_gt.copy(), self.n_pred.copy(), self.tp.copy(),
            self.fp.copy(), list(self.hist_parts), None if self.cm is None else self.cm.copy(),
            self.cm_examples, None if self.detailed is None else self.detailed.copy(),
            self.detailed_examples, None if self.replicates is None else self.replicates.copy(),
            None if self.calibration is None else self.calibration.copy())

    def merge(self, other: "KeyState", config: ClassificationConfig) -> "KeyState":
        """Add other into self (same key, same vocabulary) and return self."""
        if other.n_values != self.n_values:
            raise ValueError("cannot merge states built on different vocabularies")
        self.n_pop += other.n_pop
        self.n_gt += other.n_gt
        self.n_pred += other.n_pred
        self.tp += other.tp
        self.fp += other.fp
        self.hist_parts.extend(other.hist_parts)
        self._maybe_compact()
        if self.cm is not None:
            self.cm += other.cm
            self.cm_examples = ExampleSet.concat(
                [self.cm_examples, other.cm_examples]).reduce(config.max_examples)
        if self.detailed is not None:
            self.detailed += other.detailed
            self.detailed_examples = ExampleSet.concat(
                [self.detailed_examples, other.detailed_examples]).reduce(config.max_examples)
        if (self.replicates is None) != (other.replicates is None):
            raise ValueError("cannot merge a state with bootstrap replicates and one without")
        if self.replicates is not None:
            self.replicates.merge(other.replicates)
        if self.calibration is not None:
            self.calibration.merge(other.calibration)
        return self

    def _maybe_compact(self) -> None:
        # Merge pending histograms once they outweigh the largest one: each entry is then
        # re-sorted O(log #parts) times in all, instead of once per incoming shard.
        if len(self.hist_parts) < 2:
            return
        sizes = sorted(len(p) for p in self.hist_parts)
        if sum(sizes[:-1]) >= sizes[-1] or len(self.hist_parts) > 32:
            self.compact()

    def compact(self) -> ScoreHistogram:
        hist = ScoreHistogram.merge(self.hist_parts)
        self.hist_parts = [hist] if len(hist) else []
        if self.replicates is not None:
            self.replicates.compact()
        if self.calibration is not None:
            self.calibration.compact()
        return hist


class ClassificationState:
    """Partial state of one (model, slice): {label key: KeyState} (by_key), with the
    configuration that merging needs (KeyState.merge keeps config.max_examples examples).

    merge is exact and order-free, key by key; a key present in one state only is copied over.
    """

    def __init__(self, config: ClassificationConfig, by_key: dict[str, KeyState] | None = None):
        self.config = config
        self.by_key = {} if by_key is None else by_key

    def add_key(self, key: str, state: KeyState) -> "ClassificationState":
        """Add one label key's partial state (match_key's, which this state now owns)."""
        if key in self.by_key:
            self.by_key[key].merge(state, self.config)
        else:
            self.by_key[key] = state
        return self

    def copy(self) -> "ClassificationState":
        return ClassificationState(self.config, {key: state.copy() for key, state in self.by_key.items()})

    def merge(self, other: "ClassificationState") -> "ClassificationState":
        """Add other into self and return self (other is left as it was)."""
        for key, state in other.by_key.items():
            if key in self.by_key:
                self.by_key[key].merge(state, self.config)
            else:
                self.by_key[key] = state.copy()
        return self

    def compact(self) -> "ClassificationState":
        """Merge each key's pending score histograms (before the state is shipped or read)."""
        for state in self.by_key.values():
            state.compact()
        return self
