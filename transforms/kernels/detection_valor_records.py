"""The valor protocol's records (valor-lite's names, shapes and parameters) from its metrics and
states: the AP / AR / Counts family, the interpolated and plain precision-recall curves, the
DetailedPrecisionRecallCurve and the ConfusionMatrix, and each bootstrap replicate's scalars.
"""

from __future__ import annotations

import json

import numpy as np

from evalbeam.transforms.kernels.detection_coco import RECALL_THRESHOLDS, CocoState
from evalbeam.transforms.kernels.detection_config import Protocol
from evalbeam.transforms.kernels.detection_confusion import ConfusionState
from evalbeam.transforms.kernels.detection_detailed import DetailedState
from evalbeam.transforms.kernels.detection_replicates import (accumulate_replicates,
                                                              replicate_row_blocks)
from evalbeam.transforms.kernels.detection_valor import (ValorBinnedState, highest_scores,
                                                         valor_counts, valor_counts_replicates,
                                                         valor_metrics, valor_metrics_of)

AP_KINDS = ("AP", "mAP", "APAveragedOverIOUs", "mAPAveragedOverIOUs")


def valor_records(state, categories, protocol: Protocol):
    """Valor's records (valor-lite's names and parameters) for the labels present. Under
    --score_bins (a ValorBinnedState) the AP family comes twice, as lower and upper bounds
    (parameters score_bins and bound); everything else is exact and comes once."""
    matched = list(protocol.matching_thresholds)
    ious = list(protocol.iou_thresholds)
    use = [matched.index(t) for t in ious]
    scores = list(protocol.score_thresholds)
    if not isinstance(state, ValorBinnedState):
        m = valor_metrics(state, np.array(matched), np.array(scores), use)
        curve_counts = valor_counts(state, len(matched), np.array(protocol.pr_curve_thresholds))
        yield from valor_exact_records(m, curve_counts, state.n_gt[:, 0], highest_scores(state),
                                       categories, protocol)
        return
    for bound in ("lower", "upper"):
        m = state.metrics(np.array(matched), scores, use, upper=bound == "upper")
        records = _valor_metric_records(m, categories, ious, use, scores,
                                        {"score_bins": protocol.score_bins, "bound": bound})
        yield from (r for r in records if (r["type"] in AP_KINDS) or bound == "lower")
    yield _pr_curve_record(state.curve_counts(protocol.pr_curve_thresholds), state.present,
                           categories, protocol)


def valor_exact_records(m: dict, curve_counts: np.ndarray, n_gt: np.ndarray, highest: np.ndarray,
                        categories, protocol: Protocol):
    """The exact (not binned) state's Valor records from valor_metrics' m (with "curve"),
    valor_counts at the PR curve's score thresholds, n_gt int[K] and highest_scores."""
    matched = list(protocol.matching_thresholds)
    ious = list(protocol.iou_thresholds)
    use = [matched.index(t) for t in ious]
    scores = list(protocol.score_thresholds)
    yield from _valor_metric_records(m, categories, ious, use, scores, {})
    yield from _valor_curve_records(m, n_gt, highest, categories, ious, use)
    yield _pr_curve_record(curve_counts, m["present"], categories, protocol)


def _pr_curve_record(curve_counts: np.ndarray, present: np.ndarray, categories, protocol: Protocol) -> dict:
    """The PrecisionRecallCurve record: valor_counts [I, S, K, 3] at the PR curve's score
    thresholds, for the labels present, at the PR curve's IoU threshold."""
    matched = list(protocol.matching_thresholds)
    i = matched.index(protocol.pr_curve_iou_threshold)
    labels = [(k, name) for k, name in enumerate(categories["name"]) if present[k]]
    curve = {name: {repr(float(s)): _counts(curve_counts[i, j, k])
                    for j, s in enumerate(protocol.pr_curve_thresholds)}
             for k, name in labels}
    return {"type": "PrecisionRecallCurve", "value": curve,
            "parameters": {"pr_curve_iou_threshold": protocol.pr_curve_iou_threshold}}


def interpolated_curve_record(precisions: np.ndarray, scores: np.ndarray, iou_threshold: float,
                              label: str, **parameters) -> dict:
    """An InterpolatedPrecisionRecallCurve record: valor-lite's object-detection
    PrecisionRecallCurve shape, {"precisions": [R], "scores": [R]} at the recall thresholds
    (np.linspace(0, 1, 101)), parameters iou_threshold and label (and any extra ones). The
    values are the float64s as computed, unrounded."""
    return {"type": "InterpolatedPrecisionRecallCurve",
            "value": {"precisions": precisions.tolist(), "scores": scores.tolist()},
            "parameters": {"iou_threshold": iou_threshold, "label": label, **parameters}}


def _valor_curve_records(m: dict, n_gt: np.ndarray, highest: np.ndarray, categories, ious, use):
    """The InterpolatedPrecisionRecallCurve of every metric IoU threshold and label present: the
    precision AP averages and pycocotools' scores (accumulate(with_scores=True)). A label with
    predictions but no ground truth (AP 0) gets precision 0 everywhere and, as pycocotools
    gives a category whose recall stays 0 (and valor-lite gives such a label), its highest
    score at recall 0 and 0 elsewhere."""
    precision, scores = m["curve"]                                               # [T, R, K]
    at_first = RECALL_THRESHOLDS <= 0
    for t, iou in zip(use, ious):
        for k, name in enumerate(categories["name"]):
            if not m["present"][k]:
                continue
            if n_gt[k] > 0:
                yield interpolated_curve_record(precision[t, :, k], scores[t, :, k], iou, name)
                continue
            top = np.zeros(RECALL_THRESHOLDS.size)
            top[at_first] = highest[k]
            yield interpolated_curve_record(np.zeros(RECALL_THRESHOLDS.size), top, iou, name)


def _valor_metric_records(m: dict, categories, ious, use, scores, extra: dict):
    """The scalar and Counts records of valor_metrics_from's output m; extra parameters are
    added to the AP family only."""
    present = m["present"]
    labels = [(k, name) for k, name in enumerate(categories["name"]) if present[k]]

    def record(kind, value, **parameters):
        if kind in AP_KINDS:
            parameters.update(extra)
        return {"type": kind, "value": value if isinstance(value, dict) else float(value),
                "parameters": parameters}

    for t, iou in enumerate(ious):
        for k, name in labels:
            yield record("AP", m["AP"][t, k], iou_threshold=iou, label=name)
        yield record("mAP", m["mAP"][t], iou_threshold=iou)
    for k, name in labels:
        yield record("APAveragedOverIOUs", m["APAveragedOverIOUs"][k], iou_thresholds=ious, label=name)
    yield record("mAPAveragedOverIOUs", m["mAPAveragedOverIOUs"], iou_thresholds=ious)
    for j, s in enumerate(scores):
        for k, name in labels:
            yield record("AR", m["AR"][j, k], iou_thresholds=ious, score_threshold=s, label=name)
        yield record("mAR", m["mAR"][j], iou_thresholds=ious, score_threshold=s)
    for k, name in labels:
        yield record("ARAveragedOverScores", m["ARAveragedOverScores"][k], iou_thresholds=ious,
                     score_thresholds=scores, label=name)
    yield record("mARAveragedOverScores", m["mARAveragedOverScores"], iou_thresholds=ious,
                 score_thresholds=scores)
    for t, iou in zip(use, ious):
        for j, s in enumerate(scores):
            for k, name in labels:
                params = {"iou_threshold": iou, "score_threshold": s, "label": name}
                counts = _counts(m["counts"][t, j, k])
                yield record("Counts", {key: counts[key] for key in ("tp", "fp", "fn")}, **params)
                for kind, key in (("Precision", "precision"), ("Recall", "recall"), ("F1", "f1_score")):
                    yield record(kind, counts[key], **params)


def valor_replicate_records(state: CocoState, categories, protocol: "Protocol", bootstrap):
    """For each replicate in turn (a generator, for attach_replicates), the scalar records
    _valor_metric_records makes of it (the labels present in that replicate; none when no
    label is). The arrays behind them are computed a block of replicates at a time
    (replicate_row_blocks)."""
    matched = np.array(protocol.matching_thresholds)
    ious = list(protocol.iou_thresholds)
    use = [list(protocol.matching_thresholds).index(t) for t in ious]
    scores = list(protocol.score_thresholds)
    K, A = state.n_categories, state.tp.shape[1]
    # per replicate: accumulate_replicates' float64 outputs, the int64 counts, the copies of
    # the weights it makes (rows x (1 + 1 + 8) bytes at most)
    per_replicate = 8 * 2 * K * A * matched.size + 8 * 3 * K * matched.size * len(scores) \
        + 9 * state.score.size
    for first, stop in replicate_row_blocks(state, per_replicate):
        block = (first, stop)
        precision_sum, _, _ = accumulate_replicates(state, bootstrap, matched, max_dets=(None,),
                                                    replicates=block)
        counts, n_detections = valor_counts_replicates(state, bootstrap, matched.size,
                                                       np.array(scores), block)
        n_gt = state.n_gt_replicates[first:stop, :, 0]
        for r in range(stop - first):
            present = (n_gt[r] > 0) | (n_detections[r] > 0)
            if not present.any():
                yield []
                continue
            ap = np.where(n_gt[r][None, :] > 0,
                          precision_sum[r][:, 0, 0, :][:, use].T / RECALL_THRESHOLDS.size, 0.0)
            m = valor_metrics_of(ap, counts[r], n_gt[r], present, use)
            yield [rec for rec in _valor_metric_records(m, categories, ious, use, scores, {})
                   if rec["type"] != "Counts"]


def valor_example_records(detailed, confusion, categories, protocol: Protocol, present):
    """The valor protocol's DetailedPrecisionRecallCurve and ConfusionMatrix records, for the
    labels present."""
    yield {"type": "DetailedPrecisionRecallCurve",
           "value": _detailed_value(detailed, categories, protocol, present),
           "parameters": {"pr_curve_iou_threshold": protocol.pr_curve_iou_threshold,
                          "max_examples": protocol.max_examples}}
    yield from _confusion_records(confusion, categories, protocol, present)


def _detailed_value(detailed: DetailedState, categories, protocol: Protocol, present) -> dict:
    """{label: {"0.05": {"tp": ..., "fp": ..., "fn": ...}}} in Valor's shape, with examples."""
    K, C = len(categories["name"]), 5
    examples: dict = {}
    for group, uid in zip(detailed.examples.group.tolist(), detailed.examples.uid.tolist()):
        examples.setdefault(group, []).append(json.loads(uid))
    value = {}
    for k, name in enumerate(categories["name"]):
        if not present[k]:
            continue
        per_threshold = {}
        for p, threshold in enumerate(protocol.pr_curve_thresholds):
            counts = detailed.counts[p, k]

            def observation(category: int) -> dict:
                return {"count": int(counts[category]),
                        "examples": examples.get((p * C + category) * K + k, [])}

            per_threshold[repr(float(threshold))] = {
                "tp": {"total": int(counts[0]), "observations": {"all": observation(0)}},
                "fp": {"total": int(counts[1] + counts[2]), "observations": {
                    "misclassifications": observation(1), "hallucinations": observation(2)}},
                "fn": {"total": int(counts[3] + counts[4]), "observations": {
                    "misclassifications": observation(3), "missed_detections": observation(4)}},
            }
        value[name] = per_threshold
    return value


def _confusion_records(confusion: ConfusionState, categories, protocol: Protocol, present):
    """One ConfusionMatrix per (IoU threshold, score threshold), valor-lite's shape: plain
    counts with --max_examples 0, else {"count", "examples"} in every cell."""
    names = list(categories["name"])
    K, S = len(names), len(protocol.score_thresholds)
    width = K * K + 2 * K
    labels = [k for k in range(K) if present[k]]
    examples: dict = {}
    for group, uid in zip(confusion.examples.group.tolist(), confusion.examples.uid.tolist()):
        examples.setdefault(group, []).append(json.loads(uid))
    for t, iou in enumerate(protocol.iou_thresholds):
        for s, score in enumerate(protocol.score_thresholds):
            matrix, unmatched_gt, unmatched_dt = confusion.unpack(t, s)
            base_group = (t * S + s) * width

            def cell(count, group):
                if not protocol.max_examples:
                    return int(count)
                return {"count": int(count), "examples": examples.get(base_group + group, [])}

            value = {
                "confusion_matrix": {names[g]: {names[p]: cell(matrix[g, p], g * K + p) for p in labels}
                                     for g in labels},
                "unmatched_predictions": {names[p]: cell(unmatched_dt[p], K * K + K + p) for p in labels},
                "unmatched_ground_truths": {names[g]: cell(unmatched_gt[g], K * K + g) for g in labels},
            }
            yield {"type": "ConfusionMatrix", "value": value,
                   "parameters": {"iou_threshold": iou, "score_threshold": score,
                                  "max_examples": protocol.max_examples}}


def _counts(tp_fp_fn) -> dict:
    """tp, fp, fn with precision, recall and F1 (0 when undefined)."""
    tp, fp, fn = (int(v) for v in tp_fp_fn)

    def ratio(numerator, denominator):
        return numerator / denominator if denominator else 0.0

    return {"tp": tp, "fp": fp, "fn": fn, "precision": ratio(tp, tp + fp),
            "recall": ratio(tp, tp + fn), "f1_score": ratio(2 * tp, 2 * tp + fp + fn)}
