"""Valor's DetailedPrecisionRecallCurve for detection: true positives, false positives split into
misclassifications and hallucinations, false negatives into misclassifications and missed
detections, per PR score threshold and label, with examples; a mergeable state (DetailedState).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from evalbeam.transforms.kernels.classification_match import counts_above, counts_from, levels
from evalbeam.transforms.kernels.examples import ExampleSet, smallest_k

DETAILED = ("tp", "fp_misclassification", "fp_hallucination", "fn_misclassification",
            "fn_missed_detection")


@dataclass
class DetailedState:
    """DetailedPrecisionRecallCurve partial state: counts int64[P, K, 5] (DETAILED order) per PR
    score threshold and label, and up to k examples per (threshold, category, label), chosen by
    the smallest (hash of datum_uid, uid) (ExampleSet; group = (p * 5 + category) * K + label).
    Merging adds counts and keeps the k smallest examples."""

    counts: np.ndarray
    examples: "ExampleSet"
    k: int

    def merge(self, other: "DetailedState") -> "DetailedState":
        self.counts = self.counts + other.counts
        self.examples = ExampleSet.concat([self.examples, other.examples]).reduce(self.k)
        return self

    def copy(self) -> "DetailedState":
        return DetailedState(self.counts.copy(), self.examples, self.k)


def detailed_curve(dt_label, dt_score, dt_matched, dt_misclassified, gt_label, gt_matcher_score,
                   gt_other_best, n_labels: int, thresholds: np.ndarray, k: int,
                   dt_where, gt_where, describe) -> DetailedState:
    """Valor's detailed curve at one IoU threshold for the given PR score thresholds (ascending).

    Detections: label, score, matched (took a ground truth of its label), misclassified (some
    ground truth of another label in its datum has IoU >= the threshold). Ground truths: label,
    score of the detection that took it (-1 if none), best score of an other-label detection with
    IoU >= the threshold (-1 if none). At score threshold s (a detection counts when score >= s
    and > 0): tp = matched detections; fp = the other detections, misclassifications when
    misclassified, else hallucinations; fn = ground truths whose taker scores below s (or none),
    misclassifications when an other-label detection with score >= s overlaps them, else missed
    detections.

    Examples: per (threshold, category, label) the k annotations with the smallest (hash of
    datum_uid, file, position); dt_where and gt_where are (hash uint64[n], file int[n], position
    int[n]); describe(kind, index) -> example dict ({"datum_uid", "geometry", "score"?}).

    The arguments are per-annotation columns as the plumbing computes them while matching a
    shard, and the protocol's settings, passed through as they are."""
    P, K, C = thresholds.size, n_labels, len(DETAILED)
    counts = np.zeros((P, K, C), dtype=np.int64)
    level = levels(dt_score, thresholds)
    groups, owners, kinds = [], [], []
    for category, mask in enumerate((dt_matched, ~dt_matched & dt_misclassified,
                                     ~dt_matched & ~dt_misclassified)):
        counts[:, :, category] = counts_above(dt_label[mask], level[mask], K, P)
        for p in range(P):
            index = np.flatnonzero(mask & (level > p))
            groups.append((p * C + category) * K + dt_label[index])
            owners.append(index)
            kinds.append(np.zeros(index.size, dtype=np.int8))
    a = levels(gt_matcher_score, thresholds)
    b = levels(gt_other_best, thresholds)
    mis = b > a
    counts[:, :, 3] = counts_from(gt_label[mis], a[mis], K, P) - counts_from(gt_label[mis], b[mis], K, P)
    counts[:, :, 4] = counts_from(gt_label, np.maximum(a, b), K, P)
    for p in range(P):
        for category, mask in ((3, (a <= p) & (p < b)), (4, np.maximum(a, b) <= p)):
            index = np.flatnonzero(mask)
            groups.append((p * C + category) * K + gt_label[index])
            owners.append(index)
            kinds.append(np.ones(index.size, dtype=np.int8))
    group = np.concatenate(groups).astype(np.int64)
    owner = np.concatenate(owners).astype(np.int64)
    kind = np.concatenate(kinds)
    where = [np.where(kind == 0, dt_where[i][np.minimum(owner, max(len(dt_where[i]) - 1, 0))] if len(dt_where[i]) else 0,
                      gt_where[i][np.minimum(owner, max(len(gt_where[i]) - 1, 0))] if len(gt_where[i]) else 0)
             for i in range(3)]
    chosen = smallest_k(group, [where[0].astype(np.uint64), where[1], where[2]], k)
    uids = np.array([json.dumps(describe(int(kind[i]), int(owner[i])), sort_keys=True) for i in chosen],
                    dtype=object)
    examples = ExampleSet(group[chosen], where[0][chosen].astype(np.uint64), uids,
                          np.zeros(chosen.size)).reduce(k)
    return DetailedState(counts, examples, k)
