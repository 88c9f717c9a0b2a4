"""Detection states merged and accumulated per category (and, for the largest labels, per span of
IoU thresholds) rather than whole: category_parts and span_part split a shard's state,
category_result accumulates one label's merged state, category_records puts the labels' results
together into the records state_records gives for the whole state.
"""

from __future__ import annotations

import numpy as np

from evalbeam.transforms.kernels.detection_coco import (AREA_RANGES, IOU_THRESHOLDS, MAX_DETS,
                                                        RECALL_THRESHOLDS, CocoState, accumulate)
from evalbeam.transforms.kernels.detection_config import DetectionConfig, DetectionState, Protocol
from evalbeam.transforms.kernels.detection_records import coco_records
from evalbeam.transforms.kernels.detection_valor import (highest_scores, valor_counts,
                                                         valor_metrics_from)
from evalbeam.transforms.kernels.detection_valor_records import (valor_exact_records,
                                                                 valor_example_records)


def splits_by_category(config: DetectionConfig) -> bool:
    """Whether a (model, slice)'s states are merged and accumulated per category (category_parts,
    category_result, category_records) rather than whole: the exact state of either protocol
    without bootstrap replicates, whose every number but the means over labels is one label's
    (the valor protocol's DetailedPrecisionRecallCurve and ConfusionMatrix, which cross
    labels, merge on one more key). The merged state grows with the detections (40 bytes per
    kept detection); per category it is spread over as many keys as there are categories,
    merged and accumulated on different workers."""
    return not config.protocol.score_bins and config.bootstrap is None


WHOLE = -2        # category_parts' key of the valor protocol's DetailedState and ConfusionState
# the maxDets index at which coco_records reads precision (summarize's AP family) and scores
_LARGEST = MAX_DETS.index(max(MAX_DETS))


def category_parts(state: DetectionState) -> list[tuple[int, DetectionState]]:
    """A CocoState-holding DetectionState -> (label k, the state of k's rows, with the ground
    truth counts of k alone) for every label with rows or ground truth, in label order, then
    (WHOLE, an empty CocoState with the DetailedState and ConfusionState) when the state has
    them (valor protocol); for a state with none of these, [(-1, an empty state)], so that its
    key still gets its records."""
    m = state.matches
    K = m.n_categories
    order = np.argsort(m.category, kind="stable")
    bounds = np.searchsorted(m.category[order], np.arange(K + 1))
    parts = []
    for k in np.flatnonzero((np.diff(bounds) > 0) | (m.n_gt.sum(axis=1) > 0)).tolist():
        rows = order[bounds[k]:bounds[k + 1]]
        n_gt = np.zeros_like(m.n_gt)
        n_gt[k] = m.n_gt[k]
        parts.append((k, DetectionState(CocoState(K, n_gt, m.category[rows], m.score[rows],
                                                  m.image_key[rows], m.rank[rows], m.tp[rows],
                                                  m.fp[rows]))))
    if state.detailed is not None or state.confusion is not None:
        parts.append((WHOLE, DetectionState(CocoState(K, np.zeros_like(m.n_gt)), state.detailed,
                                            state.confusion)))
    return parts or [(-1, DetectionState(CocoState(K, np.zeros_like(m.n_gt))))]


# A label holding more than 1 / SPLIT_SHARES of a model's detections is merged and accumulated
# on more keys than one, each for some of the IoU thresholds (label_spans). Every span ships the
# label's rows again, so the fewest spans that keep the workers busy win: 4 gives COCO's
# "person" (30%) 2 spans, as fast as 3 on 2 workers for fewer bytes shuffled
SPLIT_SHARES = 4
# ... when it holds at least this many: below, one key's work is milliseconds
SPLIT_MIN_DETECTIONS = 100_000


def label_spans(detections: int, total: int, n_thresholds: int,
                min_detections: int = SPLIT_MIN_DETECTIONS) -> list[tuple[int, int]]:
    """The IoU-threshold spans [(t0, t1), ...] on whose keys one label is merged and
    accumulated, given its detections and the model's total: ceil(SPLIT_SHARES x detections /
    total) spans of as equal sizes as the thresholds allow (at most n_thresholds, one each),
    when detections >= min_detections; else [(0, n_thresholds)].

    Why: the accumulation of a label's sequences (one per area range and IoU threshold) is
    that label's alone, and a label may hold a third of the detections ("person" in COCO), so
    one worker works on it while the others wait, and holds its sequences in memory. The
    sequences of different thresholds are independent, so the label's rows go to each span's
    key (a shuffle of ~32 B a row per span instead of 40 B once) and each key accumulates its
    thresholds. The same label is split the same way on every shard: the counts come from the
    whole input (the readers' TAG_SIZES), not from one shard."""
    if detections < max(min_detections, 1) or total <= 0:
        return [(0, n_thresholds)]
    parts = min(n_thresholds, max(1, -(-SPLIT_SHARES * detections // total)))
    bounds = [n_thresholds * i // parts for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def span_part(state: DetectionState, t0: int, t1: int, n_thresholds: int) -> DetectionState:
    """A label's part (category_parts) for the IoU thresholds t0 .. t1 - 1: the same rows, with
    bit t of tp and fp the part's bit t0 + t, uint8 when the span has at most 8 thresholds;
    the part itself for the whole span (0, n_thresholds)."""
    if (t0, t1) == (0, n_thresholds):
        return state
    m = state.matches
    mask = (1 << (t1 - t0)) - 1
    dtype = np.uint8 if t1 - t0 <= 8 else np.uint16
    return DetectionState(CocoState(m.n_categories, m.n_gt, m.category, m.score, m.image_key,
                                    m.rank, ((m.tp >> t0) & mask).astype(dtype),
                                    ((m.fp >> t0) & mask).astype(dtype)))


def category_result(k: int, state: DetectionState, config: DetectionConfig,
                    span: tuple[int, int] | None = None):
    """The merged state of label k -> what category_records needs of it: None for the -1
    placeholder; (detailed, confusion) for WHOLE; under the coco protocol, the parts of
    accumulate()'s arrays of the label that the records read (precision float64[T, R, A] at
    the largest maxDets, recall [T, A, M], scores [T, R] at area "all" and the largest maxDets:
    41 KB where the whole arrays are 194 KB, gathered per (model, slice)); under the valor
    protocol, a dict of the label's slices of valor_metrics' inputs (precision and scores
    [T, R] over the matching thresholds, counts [I, S, 3] at the score thresholds,
    curve_counts [I, P, 3] at the PR curve's, n_gt, highest score). span (t0, t1): the state
    is span_part's for those IoU thresholds, and T and I are t1 - t0 (default all)."""
    if k == -1:
        return None
    if k == WHOLE:
        return state.detailed, state.confusion
    m, protocol = state.matches, config.protocol
    matched = np.array(protocol.matching_thresholds)
    if span is not None:
        matched = matched[span[0]:span[1]]
    if protocol.name == "coco":
        precision, recall, scores = accumulate(m, matched, with_scores=True, categories=[k])
        return precision[:, :, 0, :, _LARGEST], recall[:, 0], scores[:, :, 0, 0, _LARGEST]
    precision, _, scores = accumulate(m, matched, RECALL_THRESHOLDS, max_dets=(None,),
                                      with_scores=True, categories=[k])
    return {"precision": precision[:, :, 0, 0, 0], "scores": scores[:, :, 0, 0, 0],
            "counts": valor_counts(m, matched.size, np.array(protocol.score_thresholds))[:, :, k],
            "curve_counts": valor_counts(m, matched.size,
                                         np.array(protocol.pr_curve_thresholds))[:, :, k],
            "n_gt": int(m.n_gt[k, 0]), "highest": float(highest_scores(m)[k])}


def _joined_spans(results, n_thresholds: int) -> dict:
    """((k, t0, t1), category_result) pairs -> {k: the result over all thresholds}: each label's
    spans, in threshold order, concatenated along their first axis (the thresholds'); the
    placeholder and WHOLE keys come as (0, n_thresholds). Spans that do not tile
    0 .. n_thresholds exactly are an error of the pipeline, not of the input."""
    by_label: dict = {}
    for (k, t0, t1), result in results:
        by_label.setdefault(k, []).append((t0, t1, result))
    joined = {}
    for k, spans in by_label.items():
        spans.sort(key=lambda span: span[0])
        bounds = [(t0, t1) for t0, t1, _ in spans]
        if [t0 for t0, _ in bounds] + [n_thresholds] != [0] + [t1 for _, t1 in bounds]:
            raise ValueError(f"label {k}: IoU-threshold spans {bounds} do not tile 0..{n_thresholds}")
        parts = [result for _, _, result in spans]
        if len(parts) == 1:
            joined[k] = parts[0]
        elif isinstance(parts[0], dict):
            joined[k] = {**parts[0], **{name: np.concatenate([p[name] for p in parts])
                                        for name in ("precision", "scores", "counts", "curve_counts")}}
        else:
            joined[k] = tuple(np.concatenate([p[i] for p in parts]) for i in range(3))
    return joined


def category_records(results, config: DetectionConfig, categories: dict):
    """((label k, t0, t1), category_result) pairs of one (model, slice), in any order, a
    label's IoU-threshold spans tiling all of them (one (0, T) span when it is not split) ->
    the records state_records gives for the whole merged state (a label without a pair has no
    ground truth and no detection: -1 throughout, as accumulate leaves it, and not present)."""
    K = len(categories["id"])
    results = _joined_spans(results, len(config.protocol.matching_thresholds))
    if config.protocol.name == "valor":
        yield from _valor_category_records(results, K, categories, config.protocol)
        return
    T, R, A, M = IOU_THRESHOLDS.size, RECALL_THRESHOLDS.size, len(AREA_RANGES), len(MAX_DETS)
    precision, recall, scores = -np.ones((T, R, K, A, M)), -np.ones((T, K, A, M)), -np.ones((T, R, K, A, M))
    for k, result in results.items():
        if result is not None:    # the rest of the arrays stays -1: the records never read it
            precision[:, :, k, :, _LARGEST], recall[:, k], scores[:, :, k, 0, _LARGEST] = result
    yield from coco_records(precision, recall, scores, categories, config.iou_type)


def _valor_category_records(results: dict, K: int, categories, protocol: Protocol):
    """category_records under the valor protocol: valor_metrics' arrays put together from the
    labels' results, then the records valor_records and state_records write."""
    matched = list(protocol.matching_thresholds)
    use = [matched.index(t) for t in protocol.iou_thresholds]
    T, R = len(matched), RECALL_THRESHOLDS.size
    S, P = len(protocol.score_thresholds), len(protocol.pr_curve_thresholds)
    precision, scores = -np.ones((T, R, K, 1, 1)), -np.ones((T, R, K, 1, 1))
    counts, curve_counts = np.zeros((T, S, K, 3), np.int64), np.zeros((T, P, K, 3), np.int64)
    n_gt, highest, present = np.zeros(K, np.int64), np.full(K, -np.inf), np.zeros(K, bool)
    for k, result in results.items():
        if k < 0:
            continue
        precision[:, :, k, 0, 0], scores[:, :, k, 0, 0] = result["precision"], result["scores"]
        counts[:, :, k], curve_counts[:, :, k] = result["counts"], result["curve_counts"]
        n_gt[k], highest[k], present[k] = result["n_gt"], result["highest"], True
    m = valor_metrics_from(precision, counts, n_gt, present, use)
    m["curve"] = (precision[:, :, :, 0, 0], scores[:, :, :, 0, 0])
    yield from valor_exact_records(m, curve_counts, n_gt, highest, categories, protocol)
    detailed, confusion = results[WHOLE]
    yield from valor_example_records(detailed, confusion, categories, protocol, present)
