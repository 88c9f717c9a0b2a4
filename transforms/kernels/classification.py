"""Classification: per-shard matching, mergeable partial state and final metrics (pure numpy).

ClassificationConfig is the whole configuration; match_key fills one label key's KeyState from one
shard; ClassificationState holds the KeyStates of one (model, slice) and merges them;
state_records turns a merged state into metric records.

Vocabulary. For each model, each label key k has a sorted vocabulary of label values (the union of
the ground truth's values and that model's predicted values over the whole input, never another
model's: a model's results do not depend on the other models of a run); value index i is the i-th
string in sorted order, so "smallest index" means "lexicographically smallest value". Shards
share the vocabulary, so merging partial states is addition.

Population. For a model and key k, the population is every datum that has a ground-truth value for
k or at least one prediction for k. A datum in the population without a ground-truth value for k
(only predictions) is a negative for every value; its positive predictions are hallucinations.
A datum with a ground truth for k and no prediction for k scores 0 for every value (a miss).

Predicted positive. A prediction (d, v, s) is positive at score threshold t when s >= t and s > 0
(a score of 0 is "not predicted", as in Valor). With hardmax, only the datum's top-scoring value
for the key can be positive; ties in score go to the lexicographically smallest value.

Per value v at threshold t (one-vs-rest):
    tp = #datums with ground truth v and v positive     fp = #datums without ground truth v and v positive
    fn = #datums with ground truth v and v not positive  tn = n_pop - tp - fp - fn
    precision = tp / (tp + fp), recall = tp / (tp + fn), F1 = 2 tp / (2 tp + fp + fn),
each 0 when its denominator is 0 (scikit-learn's zero_division=0).
Accuracy(k, t) = sum_v tp / #datums with a ground truth for k (0 when there are none).
ROC AUC(v): sklearn.metrics.roc_auc_score(gt == v, score_v) over the population, computed exactly
from score histograms; undefined (None) without positives or negatives.

Bootstrap replicates (issue 16). Given weights uint8[R, n] (kernels.bootstrap: datum d weighs
w[r, d] in replicate r), match_key also fills a ReplicateState: n_pop, n_gt, n_pred, tp and fp
with every datum counted w[r, d] times, and for ROC AUC the entries' datum hashes and score bins
(RocEntries), from which the records step rebuilds the binned weighted score histograms
(ranking.ReplicateHistogram) a block of replicates at a time, drawing the weights again (issue
39: R histograms in the state took 16 R bytes per occupied bin, 5.9 GB for 20,000 datums x 3
values at R = 10,000). Replicate r's Precision, Recall, F1 and Accuracy are the formulas
above on its counts, i.e. the metrics of the dataset where datum d appears w[r, d] times;
its ROC AUC ranks the scores by bin (exact unless a bin holds two distinct scores; error bound
in ranking.replicate_roc_auc). Every step that holds replicates works on blocks of them
(kernels.bootstrap.replicate_blocks), so memory beyond the counts does not grow with R.
key_metrics puts the replicate values on each scalar record (kernels.bootstrap.REPLICATES:
None where the replicate's dataset has no such record or the value is undefined) and [successes, trials] on the proportions (PROPORTION): Accuracy
[sum_v tp, datums with a ground truth], Precision [tp, tp + fp], Recall [tp, tp + fn].

Calibration (ECE, MCE, BrierScore, reliability diagrams) is kernels.calibration's, kept per key
beside the rest when config.metrics asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evalbeam.schemas.ordering import grouped_order
from evalbeam.transforms.kernels.examples import ExampleSet, first_k, make_examples, record_layers
from evalbeam.transforms.kernels.bootstrap import (PROPORTION, REPLICATES, Bootstrap,
                                                   replicate_blocks)
from evalbeam.transforms.kernels.calibration import (BINNINGS, CALIBRATION_TYPES, DEFAULT_BINS,
                                                     CalibrationConfig, CalibrationKeyState,
                                                     calibration_records, match_calibration)
from evalbeam.transforms.kernels.ranking import (ReplicateHistogram, ScoreHistogram,
                                                 counts_at_thresholds, replicate_roc_auc,
                                                 roc_auc, roc_bins, score_bins)

# The metric types computed by default (and before calibration existed).
METRIC_TYPES = (
    "Counts", "Precision", "Recall", "F1", "Accuracy", "ROCAUC", "mROCAUC",
    "PrecisionRecallCurve", "ConfusionMatrix", "DetailedPrecisionRecallCurve",
)
# Every type --metrics accepts, in metrics.jsonl's order: the calibration types
# (kernels.calibration) are computed only when asked for, so default outputs stay as they were.
ALL_METRIC_TYPES = METRIC_TYPES + CALIBRATION_TYPES
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
    metrics: frozenset[str] = frozenset(METRIC_TYPES)
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
    # Weighted bincounts: measured about twice as fast as np.add.reduceat along the datum axis
    # of the [R, m] gathered weights. Each call counts a block of replicates (their groups
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


def _check_weights(weights: np.ndarray, datum_hash: np.ndarray, bootstrap: Bootstrap | None) -> None:
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


def _replicate_state(weights, R: int, datum_hash, has_gt, gt_value, entry_datum, entry_value,
                     entry_score, is_match, level, V, config) -> ReplicateState:
    """match_key's replicate part: the same counts as the point state, each datum weighed by
    its weight in each of the R replicates. weights(first, stop) -> uint8[stop - first, n]: the
    weights of replicates first .. stop - 1, datums in match_key's working order. The counts are
    made a block of replicates at a time (replicate_blocks), so what this holds besides the
    state does not grow with R."""
    T = len(config.score_thresholds)
    pop = np.flatnonzero(has_gt | np.bincount(entry_datum, minlength=has_gt.size).astype(bool))
    with_gt = np.flatnonzero(has_gt)
    gt_groups = gt_value[with_gt].astype(np.int64)
    # every entry by (match, value, level): "level > t" as a reversed cumulative sum over levels
    # gives tp / fp, and the sum over match and level gives n_pred, in one pass over the entries
    # (a second pass for n_pred cost 10% of a --bootstrap 100 run)
    groups = (is_match.astype(np.int64) * V + entry_value) * (T + 1) + level
    n_pop = np.empty(R, dtype=np.int64)
    n_gt = np.empty((R, V), dtype=np.int64)
    n_pred = np.empty((R, V), dtype=np.int64)
    tp = np.empty((R, T, V), dtype=np.int64)
    fp = np.empty((R, T, V), dtype=np.int64)
    # per replicate: its weights, their copy on the population, and the int64 counts
    per_replicate = 2 * has_gt.size + 8 * V * (2 + 4 * (T + 1))
    for first, stop in replicate_blocks(R, per_replicate):
        w = weights(first, stop)
        rows = slice(first, stop)
        n_pop[rows] = w[:, pop].sum(axis=1, dtype=np.int64)
        n_gt[rows] = dense_weight_sums(w, with_gt, gt_groups, V)
        counts = dense_weight_sums(w, entry_datum, groups, 2 * V * (T + 1)).reshape(-1, 2, V, T + 1)
        above = np.cumsum(counts[..., ::-1], axis=-1)[..., ::-1]                 # [r, 2, V, T + 1]
        fp[rows] = above[:, 0, :, 1:].transpose(0, 2, 1)
        tp[rows] = above[:, 1, :, 1:].transpose(0, 2, 1)
        n_pred[rows] = above[..., 0].sum(axis=1)
        del w, counts, above
    if not (config.metrics & {"ROCAUC", "mROCAUC"}):
        return ReplicateState(n_pop, n_gt, n_pred, tp, fp)
    # ROC AUC: no replicate axis here; the histograms are rebuilt from these entries when the
    # records are made (ReplicateState.histogram)
    return ReplicateState(n_pop, n_gt, n_pred, tp, fp, [RocEntries.build(
        datum_hash, has_gt, entry_datum, entry_value, entry_score, is_match, V)])



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


def winners(entry_datum: np.ndarray, entry_value: np.ndarray, entry_score: np.ndarray) -> np.ndarray:
    """Mask of each datum's top-scoring entry (bool[m]); ties go to the smallest value index.

    Entries must be sorted by datum (no sort here: segment reductions only)."""
    m = entry_datum.size
    if not m:
        return np.zeros(0, dtype=bool)
    starts = np.flatnonzero(np.r_[True, entry_datum[1:] != entry_datum[:-1]])
    segment = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, m]))
    tied = entry_score == np.maximum.reduceat(entry_score, starts)[segment]
    best = np.minimum.reduceat(np.where(tied, entry_value, np.iinfo(np.int32).max), starts)[segment]
    return tied & (entry_value == best)


def levels(score: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """How many thresholds each score reaches: the item is predicted positive at threshold index
    p (thresholds ascending) exactly when level > p. Scores of 0 reach none (never positive)."""
    out = np.searchsorted(thresholds, score, side="right").astype(np.int64)
    out[score <= 0] = 0
    return out


def counts_above(groups: np.ndarray, item_levels: np.ndarray, n_groups: int, n_thresholds: int) -> np.ndarray:
    """int64[P, G]: at each threshold index p, how many items of each group have level > p."""
    P = n_thresholds
    h = np.bincount(groups.astype(np.int64) * (P + 1) + item_levels,
                    minlength=n_groups * (P + 1)).reshape(n_groups, P + 1)
    at_least = np.cumsum(h[:, ::-1], axis=1)[:, ::-1]
    return np.ascontiguousarray(at_least[:, 1:].T)


def counts_from(groups: np.ndarray, start_levels: np.ndarray, n_groups: int, n_thresholds: int) -> np.ndarray:
    """int64[P, G]: at each threshold index p, how many items of each group have start <= p."""
    P = n_thresholds
    h = np.bincount(groups.astype(np.int64) * (P + 1) + start_levels,
                    minlength=n_groups * (P + 1)).reshape(n_groups, P + 1)
    return np.ascontiguousarray(np.cumsum(h, axis=1)[:, :P].T)


def match_key(gt_value: np.ndarray, datum_hash: np.ndarray, datum_uid,
              entry_datum: np.ndarray, entry_value: np.ndarray, entry_score: np.ndarray,
              n_values: int, config: ClassificationConfig,
              weights: np.ndarray | Bootstrap | None = None) -> KeyState:
    """Partial state of one label key over one shard (or one slice of a shard).

    gt_value int32[n]: ground-truth value index of each datum, -1 when it has none for this key.
    datum_hash uint64[n]; datum_uid (Arrow or numpy, length n), read only for chosen examples.
    entry_datum int64[m], entry_value int32[m], entry_score float64[m]: the model's prediction
    entries for this key (at most one per (datum, value)), in any order.
    weights: None, or uint8[R, n] bootstrap weights of the datums (Bootstrap.weights of the
    FNV-1a hashes of their datum_uids, i.e. of datum_hash), or that Bootstrap itself, to draw
    them here a block of replicates at a time (memory that does not grow with R; the array
    serves when one is shared by several calls): the state then also carries a ReplicateState
    (O(R (n + m)) more work). With ROCAUC or mROCAUC, config.bootstrap must be that Bootstrap:
    the ROC AUC replicates draw the weights again from the hashes when the records are made.
    Work is O(n + m) per threshold-independent step and O(m log m) for the histogram.
    """
    n, V = gt_value.size, n_values
    # Work in hash order: datums sorted by hash, entries by datum. "First in sequence" is then
    # "smallest hash", the documented rule for examples, and no per-threshold sort is needed.
    # any sort will do: tied hashes are ordered by uid just below
    order = np.argsort(datum_hash)
    if n > 1 and (datum_hash[order][1:] == datum_hash[order][:-1]).any():
        # Two uids share a 64-bit hash (rare): the uid breaks the tie, never the input order.
        uids = datum_uid.to_pylist() if hasattr(datum_uid, "to_pylist") else list(datum_uid)
        order = np.array(sorted(range(n), key=lambda i: (int(datum_hash[i]), uids[i])), dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    gt_value, datum_hash = gt_value[order], datum_hash[order]
    entry_datum = rank[entry_datum]
    e_order = grouped_order(entry_datum)
    entry_datum, entry_value, entry_score = entry_datum[e_order], entry_value[e_order], entry_score[e_order]

    def examples(group, position, score) -> ExampleSet:
        return make_examples(group, order[position], score, datum_hash[position], datum_uid)

    has_gt = gt_value >= 0
    has_entry = np.zeros(n, dtype=bool)
    has_entry[entry_datum] = True
    n_pop = int(np.count_nonzero(has_gt | has_entry))
    n_gt = np.bincount(gt_value[has_gt], minlength=V).astype(np.int64)
    n_pred = np.bincount(entry_value, minlength=V).astype(np.int64)
    entry_gt = gt_value[entry_datum]
    is_match = entry_value == entry_gt
    k = config.max_examples

    thresholds = np.asarray(config.score_thresholds, dtype=np.float64)
    T = thresholds.size
    level = levels(entry_score, thresholds)
    if config.hardmax:
        level[~winners(entry_datum, entry_value, entry_score)] = 0
    tp = counts_above(entry_value[is_match], level[is_match], V, T)
    fp = counts_above(entry_value[~is_match], level[~is_match], V, T)
    state = KeyState(V, n_pop, n_gt, n_pred, tp, fp)
    drawn = isinstance(weights, Bootstrap)
    if weights is not None:
        wants_roc = bool(config.metrics & {"ROCAUC", "mROCAUC"})
        if drawn:
            if wants_roc and config.bootstrap != weights:
                raise ValueError("ROC AUC replicates need config.bootstrap to be the Bootstrap "
                                 "given to match_key")
            R = weights.replicates

            def block(first, stop, bootstrap=weights):
                return bootstrap.weights(datum_hash, first, stop)   # hash order: working order
        else:
            if weights.ndim != 2 or weights.shape[1] != n:
                raise ValueError(f"weights must be [R, {n}], not {weights.shape}")
            if wants_roc:
                # the hashes of the weights' first columns (datum_hash is in hash order now)
                _check_weights(weights, datum_hash[rank[:8]], config.bootstrap)
            R = weights.shape[0]

            def block(first, stop, given=weights):
                return given[first:stop][:, order]
        state.replicates = _replicate_state(block, R, datum_hash, has_gt, gt_value, entry_datum,
                                            entry_value, entry_score, is_match, level, V, config)
    calibration = config.calibration
    if calibration is not None:
        if calibration.bootstrap is not None and weights is None:
            raise ValueError("config.bootstrap has replicates: pass match_key their weights")
        # (drawn: match_calibration draws them from config.bootstrap, in the working order)
        state.calibration = match_calibration(
            gt_value, datum_hash, entry_datum, entry_value, entry_score, V, calibration,
            None if calibration.bootstrap is None or drawn else weights[:, order])

    if config.needs_confusion:
        cells_n = (V + 1) ** 2
        state.cm = np.zeros((T, V + 1, V + 1), dtype=np.int64)
        parts = []
        for t in range(T):
            pos = np.flatnonzero(level > t)
            cells = np.where(entry_gt[pos] >= 0, entry_gt[pos], V).astype(np.int64) * (V + 1) + entry_value[pos]
            answered = np.zeros(n, dtype=bool)
            answered[entry_datum[pos]] = True
            missed = np.flatnonzero(has_gt & ~answered)
            missed_cells = gt_value[missed].astype(np.int64) * (V + 1) + V
            state.cm[t] = np.bincount(np.r_[cells, missed_cells], minlength=cells_n).reshape(V + 1, V + 1)
            chosen = first_k(cells, k, cells_n)
            parts.append(examples(t * cells_n + cells[chosen], entry_datum[pos[chosen]],
                                  entry_score[pos[chosen]]))
            chosen = first_k(missed_cells, k, cells_n)
            parts.append(examples(t * cells_n + missed_cells[chosen], missed[chosen],
                                  np.full(chosen.size, np.nan)))
        state.cm_examples = ExampleSet.concat(parts).reduce(k)

    if config.needs_histogram:
        # Entries give (value, score) with their datum's label; every datum of the population
        # without an entry for v scores 0 for v, added here as counts in the 0 bin.
        pos_absent = n_gt - np.bincount(entry_value[is_match], minlength=V)
        neg_absent = (n_pop - n_gt) - np.bincount(entry_value[~is_match], minlength=V)
        values = np.arange(V, dtype=np.int32)
        state.hist_parts = [ScoreHistogram.build(
            np.r_[entry_value.astype(np.int32), values],
            np.r_[entry_score, np.zeros(V)],
            np.r_[is_match.astype(np.int64), pos_absent],
            np.r_[(~is_match).astype(np.int64), neg_absent],
        )]

    if config.needs_detailed:
        state.detailed, state.detailed_examples = _detailed(
            gt_value, has_gt, entry_datum, entry_value, entry_score, entry_gt, is_match, V,
            config, examples)
    return state


def datum_correct(gt_value: np.ndarray, entry_datum: np.ndarray, entry_value: np.ndarray,
                  entry_score: np.ndarray, config: ClassificationConfig) -> np.ndarray:
    """bool[T, n]: whether each datum counts as correct in Accuracy at each score threshold
    (the per-datum outcomes behind Accuracy, for McNemar's test): it has a ground-truth value
    for the key and that value is predicted positive at the threshold (with hardmax: it is also
    the datum's top-scoring value). A datum without a ground truth or without a prediction is
    never correct. Inputs as match_key's, datums in the caller's order; sum over datums of
    correct[t] = sum_v tp[t, v]."""
    n = gt_value.size
    thresholds = np.asarray(config.score_thresholds, dtype=np.float64)
    if not entry_datum.size:
        return np.zeros((thresholds.size, n), dtype=bool)
    e_order = np.argsort(entry_datum, kind="stable")    # winners() needs entries by datum
    entry_datum, entry_value, entry_score = entry_datum[e_order], entry_value[e_order], entry_score[e_order]
    level = levels(entry_score, thresholds)
    if config.hardmax:
        level[~winners(entry_datum, entry_value, entry_score)] = 0
    is_match = entry_value == gt_value[entry_datum]
    reached = np.zeros(n, dtype=np.int64)
    reached[entry_datum[is_match]] = level[is_match]
    return reached[None, :] > np.arange(thresholds.size)[:, None]


def _detailed(gt_value, has_gt, entry_datum, entry_value, entry_score, entry_gt, is_match, V,
              config, examples):
    """Counts int64[P, V, 5] (DETAILED order) and examples of DetailedPrecisionRecallCurve.

    No hardmax: each value is its own binary problem, as in PrecisionRecallCurve. At threshold
    index p, with a = level of the datum's ground-truth value and b = the highest level of its
    other values: tp/fp entries have level > p; a ground truth is missed when a <= p, a
    misclassification when also p < b, else no_prediction (p >= max(a, b))."""
    n = gt_value.size
    k = config.max_examples
    thresholds = np.asarray(config.pr_curve_thresholds, dtype=np.float64)
    P = thresholds.size
    counts = np.zeros((P, V, len(DETAILED)), dtype=np.int64)
    parts = []
    stride = len(DETAILED) * V  # group = p * stride + category * V + value

    # tp, fp misclassification, fp hallucination: entries, eligible while level > p
    level = levels(entry_score, thresholds)
    category = np.where(is_match, 0, np.where(entry_gt >= 0, 1, 2))
    live = np.flatnonzero(level > 0)
    groups = category[live].astype(np.int64) * V + entry_value[live]
    counts[:, :, :3] = counts_above(groups, level[live], 3 * V, P).reshape(P, 3, V).transpose(0, 2, 1)
    survivors = record_layers(groups, level[live], k)
    for p in range(P):
        eligible = survivors[level[live[survivors]] > p]
        chosen = eligible[first_k(groups[eligible], k, 3 * V)]
        parts.append(examples(p * stride + groups[chosen], entry_datum[live[chosen]],
                              entry_score[live[chosen]]))

    # fn misclassification and no_prediction: datums with a ground truth
    a = np.zeros(n, dtype=np.int64)
    a[entry_datum[is_match]] = level[is_match]
    b = np.zeros(n, dtype=np.int64)
    if entry_datum.size:
        starts = np.flatnonzero(np.r_[True, entry_datum[1:] != entry_datum[:-1]])
        b[entry_datum[starts]] = np.maximum.reduceat(np.where(is_match, 0, level), starts)
    datums = np.flatnonzero(has_gt)
    g, a, b = gt_value[datums].astype(np.int64), a[datums], b[datums]
    mis = b > a
    counts[:, :, 3] = counts_from(g[mis], a[mis], V, P) - counts_from(g[mis], b[mis], V, P)
    counts[:, :, 4] = counts_from(g, np.maximum(a, b), V, P)
    for p in range(P):
        for category, eligible in ((3, np.flatnonzero((a <= p) & (p < b))),
                                   (4, np.flatnonzero(np.maximum(a, b) <= p))):
            chosen = eligible[first_k(g[eligible], k, V)]
            parts.append(examples(p * stride + category * V + g[chosen], datums[chosen],
                                  np.full(chosen.size, np.nan)))
    return counts, ExampleSet.concat(parts).reduce(k)


# ----------------------------------------------------------------------------- final metrics

def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0."""
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    out = np.zeros(np.broadcast(numerator, denominator).shape)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def _threshold_key(t: float) -> str:
    return repr(float(t))


def _example(uid: str, score: float) -> dict:
    return {"datum_uid": uid} if np.isnan(score) else {"datum_uid": uid, "score": score}


def _nest(moved: np.ndarray):
    """An array whose last axis is the replicate -> nested lists of [R] floats, None for NaN."""
    if moved.ndim == 1:
        return [None if x != x else x for x in moved.tolist()]
    return [_nest(part) for part in moved]


def _replicate_values(reps: ReplicateState, config: ClassificationConfig) -> dict:
    """The scalar metrics of every replicate, with the point formulas on the weighted counts:
    {"Precision" | "Recall" | "F1": [t][v] -> [R] values, "Accuracy": [t] -> [R],
    "ROCAUC": {v: [R]}, "mROCAUC": [R]}; None where the replicate's dataset has no such record
    (no datum of the key, or no datum with or predicted as the value, as state_records leaves
    a value out of a state that has none) or the metric is undefined (ROC AUC without positive
    or negative weight)."""
    R = reps.replicates
    tp, fp = reps.tp, reps.fp                                 # [R, T, V]
    n_gt = reps.n_gt[:, None, :]
    keyed = (reps.n_pop > 0)                                   # [R]
    present = ((reps.n_gt > 0) | (reps.n_pred > 0)) & keyed[:, None]   # [R, V]
    shown = np.broadcast_to(present[:, None, :], tp.shape)
    out = {
        "Precision": _nest(np.moveaxis(np.where(shown, _ratio(tp, tp + fp), np.nan), 0, -1)),
        "Recall": _nest(np.moveaxis(np.where(shown, _ratio(tp, n_gt), np.nan), 0, -1)),
        "F1": _nest(np.moveaxis(np.where(shown, _ratio(2 * tp, tp + fp + n_gt), np.nan), 0, -1)),
        "Accuracy": _nest(np.moveaxis(np.where(keyed[:, None], _ratio(
            tp.sum(axis=2), reps.n_gt.sum(axis=1)[:, None]), np.nan), 0, -1)),
    }
    entries = reps.compact()
    if entries is not None:
        if R and (config.bootstrap is None or config.bootstrap.replicates != R):
            raise ValueError("ROC AUC replicates need config.bootstrap, the Bootstrap of the state")
        V = reps.n_gt.shape[1]
        aucs = np.full((R, V), np.nan)
        values = np.flatnonzero(present.any(axis=0))
        # a block of replicates at a time: each replicate's AUC depends on its own row only, so
        # the values are those of all replicates at once, with a peak that does not grow with R
        for first, stop in replicate_blocks(R, entries.bytes_per_replicate()):
            hist = reps.histogram(config.bootstrap, first, stop)
            for v in values:
                aucs[first:stop, v] = replicate_roc_auc(*hist.segment(int(v), roc_bins(V)))[0]
            del hist
        aucs[~present] = np.nan
        out["ROCAUC"] = {v: _nest(aucs[:, v]) for v in range(V)}
        defined = np.isfinite(aucs)
        count = defined.sum(axis=1)
        # mean over the defined values (the point value is np.mean of a list; this row sum may
        # add in another order, which changes the last bits at most)
        total = np.where(defined, aucs, 0.0).sum(axis=1)
        out["mROCAUC"] = _nest(np.where(count > 0, total / np.maximum(count, 1), np.nan))
    return out


def key_metrics(state: KeyState, key: str, vocabulary: list[str],
                config: ClassificationConfig) -> list[dict]:
    """Metric records ({"type", "value", "parameters"}) of one label key from its merged state.

    Per-value records cover the values seen in this state (as ground truth or prediction)."""
    wanted = config.metrics
    present = np.flatnonzero((state.n_gt > 0) | (state.n_pred > 0))
    records: list[dict] = []
    tp, fp = state.tp, state.fp
    fn = state.n_gt[None, :] - tp
    tn = state.n_pop - state.n_gt[None, :] - fp
    precision = _ratio(tp, tp + fp)
    recall = _ratio(tp, state.n_gt[None, :])
    f1 = _ratio(2 * tp, 2 * tp + fp + fn)
    n_with_gt = int(state.n_gt.sum())
    reps = _replicate_values(state.replicates, config) if state.replicates is not None else None
    # proportions over datums: successes and trials of Precision, Recall and Accuracy
    trials = {"Precision": tp + fp, "Recall": np.broadcast_to(state.n_gt[None, :], tp.shape)}
    for t, threshold in enumerate(config.score_thresholds):
        for v in present:
            params = {"label": {"key": key, "value": vocabulary[v]},
                      "score_threshold": threshold, "hardmax": config.hardmax}
            if "Counts" in wanted:
                records.append({"type": "Counts", "parameters": params, "value": {
                    "tp": int(tp[t, v]), "fp": int(fp[t, v]),
                    "fn": int(fn[t, v]), "tn": int(tn[t, v])}})
            for name, values in (("Precision", precision), ("Recall", recall), ("F1", f1)):
                if name in wanted:
                    records.append({"type": name, "parameters": params, "value": float(values[t, v])})
                    if reps is not None:
                        records[-1][REPLICATES] = reps[name][t][v]
                        if name in trials:
                            records[-1][PROPORTION] = [int(tp[t, v]), int(trials[name][t, v])]
        if "Accuracy" in wanted:
            records.append({"type": "Accuracy", "value": float(_ratio(tp[t].sum(), n_with_gt)),
                            "parameters": {"label_key": key, "score_threshold": threshold,
                                           "hardmax": config.hardmax}})
            if reps is not None:
                records[-1][REPLICATES] = reps["Accuracy"][t]
                records[-1][PROPORTION] = [int(tp[t].sum()), n_with_gt]

    hist = state.compact() if config.needs_histogram else None
    if hist is not None:
        aucs = {}
        curve = {}
        thresholds = np.asarray(config.pr_curve_thresholds, dtype=np.float64)
        for v in present:
            scores, pos, neg = hist.segment(int(v))
            aucs[v] = roc_auc(pos, neg)
            c_tp, c_fp = counts_at_thresholds(scores, pos, neg, thresholds)
            c_fn = state.n_gt[v] - c_tp
            c_tn = state.n_pop - state.n_gt[v] - c_fp
            c_precision = _ratio(c_tp, c_tp + c_fp)
            c_recall = _ratio(c_tp, state.n_gt[v])
            c_f1 = _ratio(2 * c_tp, 2 * c_tp + c_fp + c_fn)
            curve[vocabulary[v]] = {
                _threshold_key(th): {
                    "tp": int(c_tp[i]), "fp": int(c_fp[i]), "fn": int(c_fn[i]), "tn": int(c_tn[i]),
                    "precision": float(c_precision[i]), "recall": float(c_recall[i]),
                    "f1_score": float(c_f1[i])}
                for i, th in enumerate(config.pr_curve_thresholds)}
        if "ROCAUC" in wanted:
            for v in present:
                records.append({"type": "ROCAUC", "value": aucs[v],
                                "parameters": {"label": {"key": key, "value": vocabulary[v]}}})
                if reps is not None and aucs[v] is not None:
                    records[-1][REPLICATES] = reps["ROCAUC"][v]
        if "mROCAUC" in wanted:
            defined = [a for a in aucs.values() if a is not None]
            records.append({"type": "mROCAUC", "value": float(np.mean(defined)) if defined else None,
                            "parameters": {"label_key": key}})
            if reps is not None and defined:
                records[-1][REPLICATES] = reps["mROCAUC"]
        if "PrecisionRecallCurve" in wanted:
            records.append({"type": "PrecisionRecallCurve", "value": curve,
                            "parameters": {"label_key": key}})

    if state.cm is not None and "ConfusionMatrix" in wanted:
        examples = state.cm_examples.by_group()
        for t, threshold in enumerate(config.score_thresholds):
            records.append({"type": "ConfusionMatrix",
                            "value": _confusion_value(state.cm[t], examples, t, vocabulary),
                            "parameters": {"label_key": key, "score_threshold": threshold,
                                           "hardmax": config.hardmax,
                                           "max_examples": config.max_examples}})

    if state.detailed is not None and "DetailedPrecisionRecallCurve" in wanted:
        records.append({"type": "DetailedPrecisionRecallCurve",
                        "value": _detailed_value(state, present, vocabulary, config),
                        "parameters": {"label_key": key, "max_examples": config.max_examples}})
    if state.calibration is not None:
        records.extend(calibration_records(state.calibration, key, vocabulary, config.calibration))
    return records


def state_records(state: ClassificationState, vocab: dict[str, list[str]],
                  config: ClassificationConfig) -> list[dict]:
    """Metric records ({"type", "value", "parameters"}) of a merged state: key_metrics of each
    label key, keys in sorted order; vocab: {key: sorted values}, the vocabulary the state's
    value indices refer to."""
    records = []
    for key in sorted(state.by_key):
        records.extend(key_metrics(state.by_key[key], key, vocab[key], config))
    return records


def _confusion_value(cm: np.ndarray, examples: dict, t: int, vocabulary: list[str]) -> dict:
    V = len(vocabulary)
    base = t * (V + 1) ** 2

    def cell(row: int, col: int) -> dict:
        found = examples.get(base + row * (V + 1) + col, [])
        return {"count": int(cm[row, col]), "examples": [_example(u, s) for u, s in found]}

    matrix: dict = {}
    unmatched_gt: dict = {}
    unmatched_pd: dict = {}
    for row, col in zip(*np.nonzero(cm)):
        row, col = int(row), int(col)
        if row < V and col < V:
            matrix.setdefault(vocabulary[row], {})[vocabulary[col]] = cell(row, col)
        elif row < V:
            unmatched_gt[vocabulary[row]] = cell(row, col)
        elif col < V:
            unmatched_pd[vocabulary[col]] = cell(row, col)
    return {"confusion_matrix": matrix, "unmatched_ground_truths": unmatched_gt,
            "unmatched_predictions": unmatched_pd}


def _detailed_value(state: KeyState, present: np.ndarray, vocabulary: list[str],
                    config: ClassificationConfig) -> dict:
    V = state.n_values
    examples = state.detailed_examples.by_group()
    value: dict = {}
    for v in present:
        per_threshold = {}
        for p, threshold in enumerate(config.pr_curve_thresholds):
            counts = state.detailed[p, v]

            def observation(category: int) -> dict:
                found = examples.get((p * len(DETAILED) + category) * V + int(v), [])
                return {"count": int(counts[category]),
                        "examples": [_example(u, s) for u, s in found]}

            per_threshold[_threshold_key(threshold)] = {
                "tp": {"total": int(counts[0]), "observations": {"all": observation(0)}},
                "fp": {"total": int(counts[1] + counts[2]), "observations": {
                    "misclassifications": observation(1), "hallucinations": observation(2)}},
                "fn": {"total": int(counts[3] + counts[4]), "observations": {
                    "misclassifications": observation(3), "no_predictions": observation(4)}},
            }
        value[vocabulary[v]] = per_threshold
    return value
