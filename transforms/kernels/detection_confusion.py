"""Valor's detection ConfusionMatrix: one-to-one pairs, counted per IoU and score threshold.

Pairing (once, independent of thresholds and labels): every (prediction, ground truth) pair of a
datum with IoU > 1e-9 is ranked by score descending, then IoU descending, then ground-truth
position, then prediction position; walking that list, a pair is taken when neither its ground
truth nor its prediction has been taken yet. This is valor-lite's rule: the best-scoring
prediction claims the ground truth it overlaps most, whatever the labels.

Counting at IoU threshold t and score threshold s (a prediction counts when score >= s and
score > 0): a taken pair with IoU >= t and a counting prediction adds one to
matrix[ground-truth label][prediction label] (the diagonal holds true positives, the rest
misclassifications). Every other ground truth is an unmatched ground truth of its label; every
other counting prediction is an unmatched prediction of its label.

The partial state is additive (counts) plus bounded example sets, so shards merge exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from evalbeam.transforms.kernels.classification_match import counts_above, levels
from evalbeam.transforms.kernels.examples import ExampleSet, smallest_k

PAIR_MIN_IOU = 1e-9
# Ranked pairs converted to Python integers at a time by one_to_one's walk.
WALK_BLOCK = 1 << 16


def one_to_one(pair_dt: np.ndarray, pair_gt: np.ndarray, pair_iou: np.ndarray,
               dt_score: np.ndarray) -> np.ndarray:
    """Positions (into the pair arrays) of the pairs taken by the greedy one-to-one rule.

    pair_dt, pair_gt int64[n] index detections and ground truths of the same datum (indices
    grow with the position in the datum); pair_iou float64[n]. Pairs with IoU <= 1e-9 never
    take part."""
    keep = np.flatnonzero(pair_iou > PAIR_MIN_IOU)
    if not keep.size:
        return keep
    d, g, iou = pair_dt[keep], pair_gt[keep], pair_iou[keep]
    order = np.lexsort((d, g, -iou, -dt_score[d]))
    del iou
    used_dt = np.zeros(int(d.max()) + 1, dtype=bool)
    used_gt = np.zeros(int(g.max()) + 1, dtype=bool)
    # The walk ends once every detection or every ground truth is taken.
    most = min(np.count_nonzero(np.bincount(d)), np.count_nonzero(np.bincount(g)))
    taken = []
    # A sequential walk: whether a pair is taken depends on every pair ranked before it. Python
    # lists of a block at a time (a dense image has millions of pairs, 100 bytes each as lists).
    for start in range(0, order.size, WALK_BLOCK):
        block = order[start:start + WALK_BLOCK]
        for i, di, gi in zip(block.tolist(), d[block].tolist(), g[block].tolist()):
            if used_dt[di] or used_gt[gi]:
                continue
            used_dt[di] = used_gt[gi] = True
            taken.append(i)
        if len(taken) == most:
            break
    return keep[np.sort(np.array(taken, dtype=np.int64))]


@dataclass
class ConfusionState:
    """Partial ConfusionMatrix state for T IoU thresholds, S score thresholds and K labels.

    matrix int64[T, S, K * K] (ground-truth label * K + prediction label); gt_total int64[K];
    dt_counting int64[S, K] (predictions counting at each score threshold). Unmatched counts
    follow: gt_total - row sums, dt_counting - column sums. Examples (ExampleSet) are grouped by
    ((t * S + s) * (K * K + 2 * K) + cell), cells K * K matrix entries, then K unmatched ground
    truths, then K unmatched predictions; at most k per group."""

    matrix: np.ndarray
    gt_total: np.ndarray
    dt_counting: np.ndarray
    examples: ExampleSet
    k: int

    def merge(self, other: "ConfusionState") -> "ConfusionState":
        self.matrix = self.matrix + other.matrix
        self.gt_total = self.gt_total + other.gt_total
        self.dt_counting = self.dt_counting + other.dt_counting
        self.examples = ExampleSet.concat([self.examples, other.examples]).reduce(self.k)
        return self

    def copy(self) -> "ConfusionState":
        return ConfusionState(self.matrix.copy(), self.gt_total.copy(), self.dt_counting.copy(),
                              self.examples, self.k)

    def unpack(self, t: int, s: int):
        """(matrix int64[K, K], unmatched ground truths int64[K], unmatched predictions int64[K])."""
        K = self.gt_total.size
        matrix = self.matrix[t, s].reshape(K, K)
        return matrix, self.gt_total - matrix.sum(axis=1), self.dt_counting[s] - matrix.sum(axis=0)


def confusion_state(pair_dt, pair_gt, pair_iou, dt_label, dt_score, gt_label, n_labels: int,
                    iou_thresholds: np.ndarray, score_thresholds: np.ndarray, k: int,
                    dt_key, gt_key, describe) -> ConfusionState:
    """ConfusionState of one shard.

    pair_*: every same-datum (detection, ground truth) pair with its IoU (see one_to_one).
    dt_label, dt_score: per detection; gt_label: per ground truth; labels in [0, K).
    score_thresholds ascending. dt_key, gt_key: (hash uint64[n], position int64[n]) per
    detection / ground truth; examples of a group are those with the smallest keys (a pair is
    keyed by its ground truth, then its detection's position). describe(kind, dt, gt) -> example
    dict, kind 0 = pair, 1 = unmatched ground truth, 2 = unmatched prediction.

    The arguments are the shard's columns as the plumbing holds them (pairs, detections, ground
    truths) and the protocol's settings, passed through; inside, the taken pairs travel as one
    _Taken."""
    K, T, S = n_labels, iou_thresholds.size, score_thresholds.size
    chosen = one_to_one(pair_dt, pair_gt, pair_iou, dt_score)
    d, g = pair_dt[chosen], pair_gt[chosen]
    taken = _Taken(d, g, pair_iou[chosen], gt_label[g].astype(np.int64) * K + dt_label[d],
                   levels(dt_score[d], score_thresholds))
    dt_level = levels(dt_score, score_thresholds)
    matrix = np.zeros((T, S, K * K), dtype=np.int64)
    for t, threshold in enumerate(iou_thresholds):
        passing = taken.iou >= threshold
        matrix[t] = counts_above(taken.cell[passing], taken.level[passing], K * K, S)
    state = ConfusionState(matrix, np.bincount(gt_label, minlength=K).astype(np.int64),
                           counts_above(dt_label, dt_level, K, S), ExampleSet.empty(), k)
    if k > 0:
        candidates = _example_candidates(taken, dt_label, dt_level, gt_label, iou_thresholds,
                                          S, K)
        state.examples = _chosen_examples(*candidates, k, dt_key, gt_key, describe)
    return state


class _Taken(NamedTuple):
    """The pairs one_to_one takes: detection d and ground truth g int64[n], iou float64[n], cell
    int64[n] (ground-truth label * K + prediction label), level int64[n] (the score thresholds
    the detection reaches, classification.levels)."""

    d: np.ndarray
    g: np.ndarray
    iou: np.ndarray
    cell: np.ndarray
    level: np.ndarray


def _example_candidates(taken: _Taken, dt_label: np.ndarray, dt_level: np.ndarray,
                        gt_label: np.ndarray, iou_thresholds: np.ndarray, S: int, K: int):
    """Every annotation's example group at every (IoU threshold, score threshold), as arrays
    (group int64, kind int8: 0 pair, 1 unmatched ground truth, 2 unmatched prediction; dt and
    gt int64, -1 where the example has none); groups as ConfusionState numbers them."""
    d, g, iou, cell, pair_level = taken
    width = K * K + 2 * K
    n_gt = gt_label.size
    groups, kinds, dts, gts = [], [], [], []
    for t, threshold in enumerate(iou_thresholds):
        for s in range(S):
            counted = (iou >= threshold) & (pair_level > s)
            base = (t * S + s) * width
            groups.append(base + cell[counted])
            kinds.append(np.zeros(int(counted.sum()), np.int8))
            dts.append(d[counted])
            gts.append(g[counted])
            gt_free = np.ones(n_gt, dtype=bool)
            gt_free[g[counted]] = False
            index = np.flatnonzero(gt_free)
            groups.append(base + K * K + gt_label[index])
            kinds.append(np.ones(index.size, np.int8))
            dts.append(np.full(index.size, -1))
            gts.append(index)
            dt_free = dt_level > s
            dt_free[d[counted]] = False
            index = np.flatnonzero(dt_free)
            groups.append(base + K * K + K + dt_label[index])
            kinds.append(np.full(index.size, 2, np.int8))
            dts.append(index)
            gts.append(np.full(index.size, -1))
    return (np.concatenate(groups).astype(np.int64), np.concatenate(kinds),
            np.concatenate(dts).astype(np.int64), np.concatenate(gts).astype(np.int64))


def _chosen_examples(group: np.ndarray, kind: np.ndarray, dt: np.ndarray, gt: np.ndarray, k: int,
                     dt_key, gt_key, describe) -> ExampleSet:
    """The k examples with the smallest keys in every non-empty group (see ConfusionState), of
    _example_candidates' arrays; dt_key, gt_key and describe as confusion_state's."""
    if not group.size:
        return ExampleSet.empty()
    n_dt, n_gt = len(dt_key[0]), len(gt_key[0])
    # Key: hash of the datum, then the ground truth's position (predictions alone: -1), then the
    # prediction's position (ground truths alone: -1).
    has_gt, has_dt = gt >= 0, dt >= 0
    hashes = np.where(has_gt, gt_key[0][np.where(has_gt, gt, 0)] if n_gt else 0,
                      dt_key[0][np.where(has_dt, dt, 0)] if n_dt else 0).astype(np.uint64)
    gt_pos = np.where(has_gt, gt_key[1][np.where(has_gt, gt, 0)] if n_gt else 0, -1)
    dt_pos = np.where(has_dt, dt_key[1][np.where(has_dt, dt, 0)] if n_dt else 0, -1)
    chosen = smallest_k(group, [hashes, gt_pos, dt_pos], k)
    uids = np.array([json.dumps(describe(int(kind[i]), int(dt[i]), int(gt[i])), sort_keys=True)
                     for i in chosen], dtype=object)
    return ExampleSet(group[chosen], hashes[chosen], uids, np.zeros(chosen.size)).reduce(k)
