"""A merged DetectionState -> its metric records (state_records), and the coco protocol's records
from accumulate()'s arrays (COCOSummary, COCOClassSummary, InterpolatedPrecisionRecallCurve).
"""

from __future__ import annotations

import numpy as np

from evalbeam.transforms.kernels.bootstrap import REPLICATES, attach_replicates, record_identity
from evalbeam.transforms.kernels.detection_binned import BinnedState, accumulate_binned
from evalbeam.transforms.kernels.detection_coco import (IOU_THRESHOLDS, MAX_DETS, SUMMARY_NAMES,
                                                        CocoState, accumulate, summarize)
from evalbeam.transforms.kernels.detection_config import DetectionConfig, DetectionState
from evalbeam.transforms.kernels.detection_replicates import coco_summary_replicates
from evalbeam.transforms.kernels.detection_valor import ValorBinnedState, valor_present
from evalbeam.transforms.kernels.detection_valor_records import (interpolated_curve_record,
                                                                 valor_example_records,
                                                                 valor_records,
                                                                 valor_replicate_records)


def state_records(state: DetectionState, config: DetectionConfig, categories: dict):
    """A merged DetectionState -> the metric records of the protocol (without model and slice).

    categories: {"id": category ids, ascending, "name": their names} (the state's label k is
    the k-th). coco: COCOSummary, then one COCOClassSummary per category (twice, lower and upper
    bound, under --score_bins), then one InterpolatedPrecisionRecallCurve per IoU threshold and
    category (not under --score_bins); valor: Valor's records (valor_records, with an
    InterpolatedPrecisionRecallCurve per IoU threshold and label present except under
    --score_bins), the DetailedPrecisionRecallCurve and the ConfusionMatrix records, for the
    labels present."""
    protocol, iou_type = config.protocol, config.iou_type
    matches = state.matches
    if protocol.name == "valor":
        if isinstance(matches, CocoState) and matches.n_gt_replicates is not None:
            records = list(valor_records(matches, categories, protocol))
            yield from attach_replicates(records, valor_replicate_records(
                matches, categories, protocol, config.bootstrap), record_identity_of)
        else:
            yield from valor_records(matches, categories, protocol)
        present = matches.present if isinstance(matches, ValorBinnedState) else valor_present(matches)
        yield from valor_example_records(state.detailed, state.confusion, categories, protocol,
                                         present)
        return
    if isinstance(matches, BinnedState):
        yield from binned_records(matches, categories, iou_type)
        return
    precision, recall, scores = accumulate(matches, with_scores=True)
    replicates = per_category = None
    if matches.n_gt_replicates is not None:
        replicates, per_category = coco_summary_replicates(matches, config.bootstrap)
    yield from coco_records(precision, recall, scores, categories, iou_type, replicates, per_category)


def coco_records(precision, recall, scores, categories: dict, iou_type: str, replicates=None,
                 per_category=None):
    """accumulate()'s arrays over every label (and the bootstrap's summaries, or None) -> the
    coco protocol's records: COCOSummary, a COCOClassSummary per category, an
    InterpolatedPrecisionRecallCurve per IoU threshold and category."""
    summary = {"type": "COCOSummary", "value": summarize(precision, recall),
               "parameters": {"iou_type": iou_type, "protocol": "coco", "max_detections": list(MAX_DETS)}}
    if replicates is not None:
        summary[REPLICATES] = _statistic_replicates(replicates)
    yield summary
    for k, (cid, name) in enumerate(zip(categories["id"], categories["name"])):
        record = {"type": "COCOClassSummary", "value": summarize(precision, recall, category=k),
                  "parameters": {"iou_type": iou_type, "protocol": "coco", "label": name,
                                 "category_id": cid}}
        if replicates is not None:
            record[REPLICATES] = _statistic_replicates(per_category[:, k])
        yield record
    # the curves AP integrates: area "all", the largest maxDets, every IoU threshold and category
    # (-1 throughout for a category without ground truth, as pycocotools' arrays and its AP)
    m = MAX_DETS.index(max(MAX_DETS))
    for t, iou in enumerate(IOU_THRESHOLDS.tolist()):        # accumulate()'s, the protocol's
        for k, (cid, name) in enumerate(zip(categories["id"], categories["name"])):
            yield interpolated_curve_record(precision[t, :, k, 0, m], scores[t, :, k, 0, m], iou,
                                            name, category_id=cid)


def _statistic_replicates(values: np.ndarray) -> dict:
    """float64[R, 12] (NaN: undefined) -> {statistic: [R values, None where undefined]}: the
    REPLICATES of a COCOSummary / COCOClassSummary record, one list per field of its value."""
    return {name: [None if np.isnan(v) else float(v) for v in values[:, i].tolist()]
            for i, name in enumerate(SUMMARY_NAMES)}


def record_identity_of(record: dict) -> str:
    """What attach_replicates matches a point record and its replicates' records by: its type
    and parameters (kernels.bootstrap.record_identity)."""
    return record_identity(record["type"], record["parameters"])


def binned_records(state: BinnedState, categories, iou_type: str):
    """COCOSummary and COCOClassSummary records of a --score_bins run: one with the lower and one
    with the upper bound of each statistic (the exact value lies between; AR is exact)."""
    for bound, upper in (("lower", False), ("upper", True)):
        precision, recall = accumulate_binned(state, upper=upper)
        parameters = {"iou_type": iou_type, "protocol": "coco", "max_detections": list(MAX_DETS),
                      "score_bins": state.n_bins, "bound": bound}
        yield {"type": "COCOSummary", "value": summarize(precision, recall),
               "parameters": parameters}
        for k, (cid, name) in enumerate(zip(categories["id"], categories["name"])):
            yield {"type": "COCOClassSummary", "value": summarize(precision, recall, category=k),
                   "parameters": dict(parameters, label=name, category_id=cid)}
