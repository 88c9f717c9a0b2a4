"""Classification's records: a merged ClassificationState -> metric records (state_records, one
label key at a time by key_metrics), with the bootstrap replicates' values on the scalar ones.
"""

from __future__ import annotations

import numpy as np

from evalbeam.transforms.kernels.bootstrap import PROPORTION, REPLICATES, replicate_blocks
from evalbeam.transforms.kernels.calibration import calibration_records
from evalbeam.transforms.kernels.classification_replicates import ReplicateState
from evalbeam.transforms.kernels.classification_state import (DETAILED, ClassificationConfig,
                                                              ClassificationState, KeyState)
from evalbeam.transforms.kernels.ranking import (counts_at_thresholds, replicate_roc_auc, roc_auc,
                                                 roc_bins)


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


def state_records(state: ClassificationState, config: ClassificationConfig,
                  vocab: dict[str, list[str]]) -> list[dict]:
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
