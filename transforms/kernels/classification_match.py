"""Classification matching: one label key's datums and prediction entries over one shard -> its
KeyState (match_key), and the per-datum outcomes behind Accuracy (datum_correct). Also the
counting primitives by score threshold (levels, counts_above, counts_from) that detection's
curves share.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from evalbeam.schemas.ordering import grouped_order
from evalbeam.transforms.kernels.bootstrap import Bootstrap, replicate_blocks
from evalbeam.transforms.kernels.calibration import match_calibration
from evalbeam.transforms.kernels.classification_replicates import (ReplicateState, RocEntries,
                                                                   check_weights, dense_weight_sums)
from evalbeam.transforms.kernels.classification_state import (DETAILED, ClassificationConfig,
                                                              KeyState)
from evalbeam.transforms.kernels.examples import ExampleSet, first_k, make_examples, record_layers
from evalbeam.transforms.kernels.ranking import ScoreHistogram


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


class KeyRows(NamedTuple):
    """One label key's datums and prediction entries over one shard, in match_key's working
    order (datums by hash, entries by datum): gt_value int32[n] (ground-truth value index, -1
    when none), datum_hash uint64[n], has_gt bool[n]; entry_datum int64[m] (index into the
    datums), entry_value int32[m], entry_score float64[m], entry_gt int32[m] (the ground-truth
    value of the entry's datum), is_match bool[m] (entry_value == entry_gt), level int64[m] (the
    score thresholds the entry reaches, levels; 0 for the entries hardmax drops)."""

    gt_value: np.ndarray
    datum_hash: np.ndarray
    has_gt: np.ndarray
    entry_datum: np.ndarray
    entry_value: np.ndarray
    entry_score: np.ndarray
    entry_gt: np.ndarray
    is_match: np.ndarray
    level: np.ndarray


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

    thresholds = np.asarray(config.score_thresholds, dtype=np.float64)
    T = thresholds.size
    level = levels(entry_score, thresholds)
    if config.hardmax:
        level[~winners(entry_datum, entry_value, entry_score)] = 0
    rows = KeyRows(gt_value, datum_hash, has_gt, entry_datum, entry_value, entry_score, entry_gt,
                   is_match, level)
    tp = counts_above(entry_value[is_match], level[is_match], V, T)
    fp = counts_above(entry_value[~is_match], level[~is_match], V, T)
    state = KeyState(V, n_pop, n_gt, n_pred, tp, fp)
    if weights is not None:
        state.replicates = _replicates(weights, rows, order, rank, V, config)
    calibration = config.calibration
    if calibration is not None:
        if calibration.bootstrap is not None and weights is None:
            raise ValueError("config.bootstrap has replicates: pass match_key their weights")
        # (drawn: match_calibration draws them from config.bootstrap, in the working order)
        drawn = isinstance(weights, Bootstrap)
        state.calibration = match_calibration(
            gt_value, datum_hash, entry_datum, entry_value, entry_score, V, calibration,
            None if calibration.bootstrap is None or drawn else weights[:, order])
    if config.needs_confusion:
        state.cm, state.cm_examples = _confusion(rows, T, V, config.max_examples, examples)
    if config.needs_histogram:
        state.hist_parts = [_histogram(rows, n_gt, n_pop, V)]
    if config.needs_detailed:
        state.detailed, state.detailed_examples = _detailed(rows, V, config, examples)
    return state


def _replicates(weights: np.ndarray | Bootstrap, rows: KeyRows, order: np.ndarray,
                rank: np.ndarray, V: int, config: ClassificationConfig) -> ReplicateState:
    """match_key's ReplicateState from its weights argument: a Bootstrap draws them a block of
    replicates at a time from the datum hashes (the working order); an array uint8[R, n] in the
    caller's datum order (order: the working order's datums, rank its inverse) is read a block
    at a time in the working order, and checked against config.bootstrap when the ROC AUC
    replicates will draw the weights again."""
    wants_roc = bool(config.metrics & {"ROCAUC", "mROCAUC"})
    if isinstance(weights, Bootstrap):
        if wants_roc and config.bootstrap != weights:
            raise ValueError("ROC AUC replicates need config.bootstrap to be the Bootstrap "
                             "given to match_key")
        R = weights.replicates

        def block(first, stop, bootstrap=weights):
            return bootstrap.weights(rows.datum_hash, first, stop)   # hash order: working order
    else:
        n = rows.gt_value.size
        if weights.ndim != 2 or weights.shape[1] != n:
            raise ValueError(f"weights must be [R, {n}], not {weights.shape}")
        if wants_roc:
            # the hashes of the weights' first columns (datum_hash is in hash order now)
            check_weights(weights, rows.datum_hash[rank[:8]], config.bootstrap)
        R = weights.shape[0]

        def block(first, stop, given=weights):
            return given[first:stop][:, order]
    return _replicate_state(block, R, rows, V, config)


def _replicate_state(weights, R: int, rows: KeyRows, V: int,
                     config: ClassificationConfig) -> ReplicateState:
    """match_key's replicate part: the same counts as the point state, each datum weighed by
    its weight in each of the R replicates. weights(first, stop) -> uint8[stop - first, n]: the
    weights of replicates first .. stop - 1, datums in match_key's working order. The counts are
    made a block of replicates at a time (replicate_blocks), so what this holds besides the
    state does not grow with R."""
    T = len(config.score_thresholds)
    has_gt, entry_datum = rows.has_gt, rows.entry_datum
    pop = np.flatnonzero(has_gt | np.bincount(entry_datum, minlength=has_gt.size).astype(bool))
    with_gt = np.flatnonzero(has_gt)
    gt_groups = rows.gt_value[with_gt].astype(np.int64)
    # every entry by (match, value, level): "level > t" as a reversed cumulative sum over levels
    # gives tp / fp, and the sum over match and level gives n_pred, in one pass over the entries
    # (a second pass for n_pred would read every entry again)
    groups = (rows.is_match.astype(np.int64) * V + rows.entry_value) * (T + 1) + rows.level
    n_pop = np.empty(R, dtype=np.int64)
    n_gt = np.empty((R, V), dtype=np.int64)
    n_pred = np.empty((R, V), dtype=np.int64)
    tp = np.empty((R, T, V), dtype=np.int64)
    fp = np.empty((R, T, V), dtype=np.int64)
    # per replicate: its weights, their copy on the population, and the int64 counts
    per_replicate = 2 * has_gt.size + 8 * V * (2 + 4 * (T + 1))
    for first, stop in replicate_blocks(R, per_replicate):
        w = weights(first, stop)
        block = slice(first, stop)
        n_pop[block] = w[:, pop].sum(axis=1, dtype=np.int64)
        n_gt[block] = dense_weight_sums(w, with_gt, gt_groups, V)
        counts = dense_weight_sums(w, entry_datum, groups, 2 * V * (T + 1)).reshape(-1, 2, V, T + 1)
        above = np.cumsum(counts[..., ::-1], axis=-1)[..., ::-1]                 # [r, 2, V, T + 1]
        fp[block] = above[:, 0, :, 1:].transpose(0, 2, 1)
        tp[block] = above[:, 1, :, 1:].transpose(0, 2, 1)
        n_pred[block] = above[..., 0].sum(axis=1)
        del w, counts, above
    if not (config.metrics & {"ROCAUC", "mROCAUC"}):
        return ReplicateState(n_pop, n_gt, n_pred, tp, fp)
    # ROC AUC: no replicate axis here; the histograms are rebuilt from these entries when the
    # records are made (ReplicateState.histogram)
    return ReplicateState(n_pop, n_gt, n_pred, tp, fp, [RocEntries.build(
        rows.datum_hash, has_gt, entry_datum, rows.entry_value, rows.entry_score, rows.is_match,
        V)])


def _confusion(rows: KeyRows, T: int, V: int, k: int, examples) -> tuple[np.ndarray, ExampleSet]:
    """The confusion matrices int64[T, V + 1, V + 1] (row: ground truth, V = none; column:
    positive prediction, V = none) and their examples (match_key's examples(), k per cell)."""
    n = rows.gt_value.size
    cells_n = (V + 1) ** 2
    cm = np.zeros((T, V + 1, V + 1), dtype=np.int64)
    parts = []
    for t in range(T):
        pos = np.flatnonzero(rows.level > t)
        entry_gt = rows.entry_gt[pos]
        cells = np.where(entry_gt >= 0, entry_gt, V).astype(np.int64) * (V + 1) + rows.entry_value[pos]
        answered = np.zeros(n, dtype=bool)
        answered[rows.entry_datum[pos]] = True
        missed = np.flatnonzero(rows.has_gt & ~answered)
        missed_cells = rows.gt_value[missed].astype(np.int64) * (V + 1) + V
        cm[t] = np.bincount(np.r_[cells, missed_cells], minlength=cells_n).reshape(V + 1, V + 1)
        chosen = first_k(cells, k, cells_n)
        parts.append(examples(t * cells_n + cells[chosen], rows.entry_datum[pos[chosen]],
                              rows.entry_score[pos[chosen]]))
        chosen = first_k(missed_cells, k, cells_n)
        parts.append(examples(t * cells_n + missed_cells[chosen], missed[chosen],
                              np.full(chosen.size, np.nan)))
    return cm, ExampleSet.concat(parts).reduce(k)


def _histogram(rows: KeyRows, n_gt: np.ndarray, n_pop: int, V: int) -> ScoreHistogram:
    """The key's score histogram over the population (ROC AUC, PrecisionRecallCurve)."""
    # Entries give (value, score) with their datum's label; every datum of the population
    # without an entry for v scores 0 for v, added here as counts in the 0 bin.
    is_match, entry_value = rows.is_match, rows.entry_value
    pos_absent = n_gt - np.bincount(entry_value[is_match], minlength=V)
    neg_absent = (n_pop - n_gt) - np.bincount(entry_value[~is_match], minlength=V)
    values = np.arange(V, dtype=np.int32)
    return ScoreHistogram.build(
        np.r_[entry_value.astype(np.int32), values],
        np.r_[rows.entry_score, np.zeros(V)],
        np.r_[is_match.astype(np.int64), pos_absent],
        np.r_[(~is_match).astype(np.int64), neg_absent],
    )


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


def _detailed(rows: KeyRows, V: int, config: ClassificationConfig, examples):
    """Counts int64[P, V, 5] (DETAILED order) and examples of DetailedPrecisionRecallCurve.

    No hardmax: each value is its own binary problem, as in PrecisionRecallCurve. At threshold
    index p, with a = level of the datum's ground-truth value and b = the highest level of its
    other values: tp/fp entries have level > p; a ground truth is missed when a <= p, a
    misclassification when also p < b, else no_prediction (p >= max(a, b))."""
    gt_value, has_gt, entry_datum = rows.gt_value, rows.has_gt, rows.entry_datum
    entry_value, entry_score, entry_gt, is_match = (rows.entry_value, rows.entry_score,
                                                    rows.entry_gt, rows.is_match)
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
