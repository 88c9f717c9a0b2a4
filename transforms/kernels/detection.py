"""Object detection, COCO protocol: IoU, greedy matching, mergeable state, accumulate, summary.

Pure numpy; the semantics are pycocotools' COCOeval, reproduced exactly:
- per (image, category), detections sorted by score, descending, ties in input order (a stable
  sort), and only the first max(max_dets) = 100 kept;
- a ground truth is ignored in area range a when it is a crowd region or its "area" lies outside
  [lo, hi] (both ends inclusive, so an area of exactly 32**2 is small and medium);
- greedy matching in score order, per IoU threshold t (compared as min(t, 1 - 1e-10)): a
  detection takes the not-yet-matched, non-ignored ground truth with the highest IoU >= t (ties:
  the later ground truth); only if there is none, the best ignored one (crowd regions can absorb
  any number of detections). A detection matched to an ignored ground truth is ignored, and so
  is an unmatched detection whose area lies outside the range. Annotation ids play no part
  (pycocotools counts a match to an annotation with id 0 as no match, a bug not copied here);
- crowd IoU is intersection / area(detection);
- accumulate: per category, area range and max_dets, all images' detections ordered by score,
  ties by image id then rank in the image; precision made monotone, read at 101 recall
  thresholds; -1 where a category has no non-ignored ground truth.
Matching is vectorised over detection rank: step j handles the j-th detection of every group
(image, category, area range) at once, for all IoU thresholds together.

Also the task's configuration (Protocol, DetectionConfig), its partial state (DetectionState,
which wraps the protocol's states) and state_records, which turns a merged state into records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from evalbeam.schemas.limits import MAX_IMAGE_PAIRS, MAX_IMAGE_PIXELS
from evalbeam.transforms.kernels.bootstrap import (REPLICATES, attach_replicates, record_identity,
                                                   replicate_blocks)
from evalbeam.transforms.kernels.detection_confusion import ConfusionState
from evalbeam.transforms.kernels.examples import ExampleSet, smallest_k

IOU_THRESHOLDS = np.linspace(.5, 0.95, int(np.round((0.95 - .5) / .05)) + 1, endpoint=True)
RECALL_THRESHOLDS = np.linspace(.0, 1.00, int(np.round((1.00 - .0) / .01)) + 1, endpoint=True)
MAX_DETS = (1, 10, 100)
# Pairs whose IoU is computed at once (pair_box_iou): ~130 bytes of temporaries each, 130 MB.
PAIR_CHUNK = 1 << 20
AREA_RANGES = ((0 ** 2, 1e5 ** 2), (0 ** 2, 32 ** 2), (32 ** 2, 96 ** 2), (96 ** 2, 1e5 ** 2))
AREA_NAMES = ("all", "small", "medium", "large")
SUMMARY_NAMES = ("AP", "AP50", "AP75", "APsmall", "APmedium", "APlarge",
                 "AR1", "AR10", "AR100", "ARsmall", "ARmedium", "ARlarge")


def _last_argmax(values: np.ndarray) -> np.ndarray:
    """Index of the maximum along the last axis, ties to the last occurrence."""
    return values.shape[-1] - 1 - np.argmax(values[..., ::-1], axis=-1)


def greedy_match(iou: np.ndarray, n_dt: np.ndarray, gt_ignore: np.ndarray, gt_crowd: np.ndarray,
                 gt_valid: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pycocotools' greedy matching for B groups at once.

    iou float64[B, D, W]: IoU of the j-th detection (score order) with each ground truth (in the
    file's order); n_dt int[B] detections per group; gt_ignore, gt_crowd, gt_valid bool[B, W]
    (valid marks real columns of the padding); thresholds float64[T].
    Returns matched bool[B, T, D], matched_ignored bool[B, T, D] (matched to an ignored gt) and
    column int64[B, T, D] (the ground truth taken, -1 when none).
    """
    B, D, W = iou.shape
    T = thresholds.size
    limit = np.minimum(thresholds, 1 - 1e-10)[None, :, None]
    taken = np.zeros((B, T, W), dtype=bool)
    matched = np.zeros((B, T, D), dtype=bool)
    matched_ignored = np.zeros((B, T, D), dtype=bool)
    column = np.full((B, T, D), -1, dtype=np.int64)
    for j in range(D):
        act = np.flatnonzero(n_dt > j)
        if not act.size:
            break
        row = iou[act, j, :][:, None, :]                                   # [A, 1, W]
        crowd = gt_crowd[act][:, None, :]
        ignore = gt_ignore[act][:, None, :]
        ok = gt_valid[act][:, None, :] & (~taken[act] | crowd) & (row >= limit)  # [A, T, W]
        regular = ok & ~ignore
        ignored = ok & ignore
        has_regular = regular.any(axis=-1)
        has_ignored = ignored.any(axis=-1)
        pick = np.where(has_regular, _last_argmax(np.where(regular, row, -1.0)),
                        _last_argmax(np.where(ignored, row, -1.0)))
        hit = has_regular | has_ignored
        matched[act, :, j] = hit
        matched_ignored[act, :, j] = hit & ~has_regular
        a, t = np.nonzero(hit)
        taken[act[a], t, pick[a, t]] = True
        column[act[a], t, j] = pick[a, t]
    return matched, matched_ignored, column


@dataclass
class CocoState:
    """Mergeable partial state of the COCO protocol for K categories and A = 4 area ranges.

    One row per kept detection (the first 100 per image and category in score order): category
    int32, score float64, image_key int64 (pycocotools' image order: the image id), rank int32
    (position in its image and category), tp and fp uint16[n, A] (bit t set: true / false
    positive at IoU threshold t in that area range; neither bit: ignored). n_gt int64[K, A]:
    non-ignored ground truths. Merging concatenates rows and adds counts; the order of rows is
    irrelevant because accumulate() sorts them by a total key.

    Bootstrap (both None when off): image_hash uint64[n], the datum hash (FNV-1a 64 of the
    image's datum_uid) of each row, from which accumulate_replicates draws the row's weight in
    every replicate; n_gt_replicates int64[R, K, A], the non-ignored ground truths of replicate
    r, each counted as many times as its image's weight. Both merge like the point parts
    (concatenation, integer sums)."""

    n_categories: int
    n_gt: np.ndarray
    category: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    score: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    image_key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    tp: np.ndarray = field(default_factory=lambda: np.zeros((0, len(AREA_RANGES)), np.uint16))
    fp: np.ndarray = field(default_factory=lambda: np.zeros((0, len(AREA_RANGES)), np.uint16))
    image_hash: np.ndarray | None = None
    n_gt_replicates: np.ndarray | None = None

    def merge(self, other: "CocoState") -> "CocoState":
        self.__dict__.update(CocoState.merge_all([self, other]).__dict__)
        return self

    @staticmethod
    def merge_all(states: list["CocoState"]) -> "CocoState":
        """The sum of states, each row column concatenated once; the states are unchanged.
        Merging n states pairwise copies the rows held so far n times, quadratic in n: 128
        parts of 100,000 rows took 2.98 s pairwise and 0.68 s at once, and the 256 shards' parts
        of one category at 10 M images would copy ~128x its ~5 GB."""
        first = states[0]
        for other in states[1:]:
            if other.n_categories != first.n_categories:
                raise ValueError("cannot merge states built on different category lists")
            if (first.image_hash is None) != (other.image_hash is None):
                raise ValueError("cannot merge a bootstrapped state with one that is not")
            if first.image_hash is not None and other.n_gt_replicates.shape != first.n_gt_replicates.shape:
                raise ValueError("cannot merge states with different numbers of replicates")
        merged = CocoState(first.n_categories, sum(s.n_gt for s in states[1:]) + first.n_gt,
                           *(np.concatenate([getattr(s, name) for s in states])
                             for name in ("category", "score", "image_key", "rank", "tp", "fp")))
        if first.image_hash is not None:
            merged.image_hash = np.concatenate([s.image_hash for s in states])
            merged.n_gt_replicates = sum(s.n_gt_replicates for s in states[1:]) + first.n_gt_replicates
        return merged

    def copy(self) -> "CocoState":
        return CocoState(self.n_categories, self.n_gt.copy(), self.category, self.score,
                         self.image_key, self.rank, self.tp, self.fp, self.image_hash,
                         None if self.n_gt_replicates is None else self.n_gt_replicates.copy())


def _bits(flags: np.ndarray) -> np.ndarray:
    """bool[..., T] (T <= 16) -> uint16[...] with bit t set where flags[..., t]."""
    packed = np.packbits(flags, axis=-1, bitorder="little")
    if packed.shape[-1] == 1:
        return packed[..., 0].astype(np.uint16)
    return packed[..., 0].astype(np.uint16) | (packed[..., 1].astype(np.uint16) << 8)


def _unbits(bits: np.ndarray, T: int) -> np.ndarray:
    """uint16[...] -> bool[..., T]."""
    pairs = np.stack([(bits & 0xFF).astype(np.uint8), (bits >> 8).astype(np.uint8)], axis=-1)
    return np.unpackbits(pairs, axis=-1, bitorder="little")[..., :T].astype(bool)


def _planes(bits: np.ndarray, T: int) -> np.ndarray:
    """uint16[n] -> bool[T, n]: bit t of every row, one contiguous run of n flags per bit, so
    that running counts and searches along the rows read memory in order (along axis 0 of
    _unbits' layout, a cumulative sum took 8 ns an element; here 0.5-2). Peak memory 2 bytes a
    flag (the shifted copy of one bit at a time)."""
    out = np.empty((T, bits.size), dtype=bool)
    for t in range(T):
        np.not_equal(bits & np.uint16(1 << t), 0, out=out[t])
    return out


def _pow2(x: np.ndarray) -> np.ndarray:
    """Smallest power of two >= x (x >= 1)."""
    return (1 << np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64)).astype(np.int64)


def coco_match(group_category: np.ndarray, group_image_key: np.ndarray,
               dt_group: np.ndarray, dt_score: np.ndarray, dt_area: np.ndarray,
               gt_group: np.ndarray, gt_area: np.ndarray, gt_crowd: np.ndarray,
               pair_iou, n_categories: int, thresholds: np.ndarray = IOU_THRESHOLDS,
               max_det: int | None = MAX_DETS[-1],
               area_ranges: tuple = AREA_RANGES, with_matches: bool = False,
               group_image_hash: np.ndarray | None = None, bootstrap=None):
    """Partial COCO state of a set of groups (one per image and category), columnar.

    group_category int[n_groups], group_image_key int64[n_groups]; detections dt_* [N] and
    ground truths gt_* [M] in input order, each with its group index; pair_iou(dt_index,
    gt_index) -> float64[P] gives the IoU of pairs (indices into the dt and gt arrays).
    max_det None keeps every detection; area_ranges are [lo, hi] pairs (COCO's four by default).
    with_matches also returns kept int64[n] (the detections kept, state row order) and
    matched_gt int64[n, A, T] (the ground truth each one took, -1 when none).
    bootstrap (a kernels.bootstrap.Bootstrap, enabled) with group_image_hash uint64[n_groups],
    the datum hash of each group's image: the state also carries the rows' image hashes and the
    replicates' weighted ground-truth counts (CocoState). Matching itself is the same.
    """
    T, A = thresholds.size, len(area_ranges)
    lo = np.array([r[0] for r in area_ranges])
    hi = np.array([r[1] for r in area_ranges])
    n_groups = group_category.size
    N, M = dt_score.size, gt_area.size

    gt_ignore = gt_crowd[:, None] | (gt_area[:, None] < lo) | (gt_area[:, None] > hi)   # [M, A]
    n_gt = np.zeros((n_categories, A), dtype=np.int64)
    for a in range(A):
        n_gt[:, a] = np.bincount(group_category[gt_group[~gt_ignore[:, a]]], minlength=n_categories)

    # detections: score order within each group, ties in input order, the first max_det kept
    order = np.lexsort((np.arange(N), -dt_score, dt_group))
    grp = dt_group[order]
    first = np.searchsorted(grp, np.arange(n_groups))
    rank = np.arange(N) - first[grp]
    keep = rank < max_det if max_det is not None else np.ones(N, dtype=bool)
    kept, grp, rank = order[keep], grp[keep], rank[keep]
    dt_out = (dt_area[kept][:, None] < lo) | (dt_area[kept][:, None] > hi)          # [n, A]

    # ground truths: columns in input order within each group
    gt_order = np.argsort(gt_group, kind="stable")
    n_gts = np.bincount(gt_group, minlength=n_groups)
    gt_first = np.r_[0, np.cumsum(n_gts)[:-1]]
    column = np.empty(M, dtype=np.int64)
    column[gt_order] = np.arange(M) - gt_first[gt_group[gt_order]]

    tp = np.zeros((kept.size, A), dtype=np.uint16)
    matched_gt = np.full((kept.size, A, T), -1, dtype=np.int64) if with_matches else None
    fp = _bits(np.repeat(~dt_out[:, :, None], T, axis=2))   # unmatched: fp unless out of range
    with_gt = n_gts[grp] > 0
    if with_gt.any():
        # every (kept detection, ground truth of its group) pair
        rows = np.flatnonzero(with_gt)
        counts = n_gts[grp[rows]]
        pair_row = np.repeat(rows, counts)
        offset = np.arange(pair_row.size) - np.repeat(np.cumsum(counts) - counts, counts)
        pair_gt = gt_order[np.repeat(gt_first[grp[rows]], counts) + offset]
        iou = pair_iou(kept[pair_row], pair_gt)
        # Only detections with some IoU >= the lowest threshold can match; the others stay
        # unmatched and change nothing for later ones, so matching skips them (most
        # detections), renumbering the candidates of each group in score order.
        best = np.zeros(kept.size)
        np.maximum.at(best, pair_row, iou)
        candidate = best >= np.minimum(thresholds.min(), 1 - 1e-10)
        n_cand = np.bincount(grp[candidate], minlength=n_groups)
        step = np.cumsum(candidate) - 1
        step -= np.r_[0, np.cumsum(candidate)][np.searchsorted(grp, grp, side="left")]
        keep_pair = candidate[pair_row]
        pair_row, pair_gt, iou = pair_row[keep_pair], pair_gt[keep_pair], iou[keep_pair]
        # buckets of groups with similar (candidates, ground truths) counts, padded to powers of 2
        groups = np.flatnonzero((n_cand > 0) & (n_gts > 0))
        depth, width = _pow2(n_cand[groups]), _pow2(n_gts[groups])
        bucket_of = np.full(n_groups, -1, dtype=np.int64)
        for d_w in np.unique(np.stack([depth, width], axis=1), axis=0):
            members = groups[(depth == d_w[0]) & (width == d_w[1])]
            bucket_of[members] = np.arange(members.size)
            in_bucket = np.zeros(n_groups, dtype=bool)
            in_bucket[members] = True
            sel_pairs = np.flatnonzero(in_bucket[grp[pair_row]])
            sel_rows = np.flatnonzero(in_bucket[grp] & candidate)
            B, D, W = members.size, int(d_w[0]), int(d_w[1])
            padded = np.full((B, D, W), -1.0)
            padded[bucket_of[grp[pair_row[sel_pairs]]], step[pair_row[sel_pairs]],
                   column[pair_gt[sel_pairs]]] = iou[sel_pairs]
            ignore = np.zeros((B, W, A), dtype=bool)
            crowd = np.zeros((B, W), dtype=bool)
            valid = np.zeros((B, W), dtype=bool)
            g_sel = np.flatnonzero(in_bucket[gt_group])
            gb, gc = bucket_of[gt_group[g_sel]], column[g_sel]
            ignore[gb, gc] = gt_ignore[g_sel]
            crowd[gb, gc] = gt_crowd[g_sel]
            valid[gb, gc] = True
            # the four area ranges are four copies of each group: [B, A, ...] -> [B * A, ...]
            matched, matched_ignored, taken_column = greedy_match(
                np.repeat(padded, A, axis=0), np.repeat(n_cand[members], A),
                ignore.transpose(0, 2, 1).reshape(B * A, W), np.repeat(crowd, A, axis=0),
                np.repeat(valid, A, axis=0), thresholds)
            rb, rr = bucket_of[grp[sel_rows]], step[sel_rows]
            m = matched.reshape(B, A, T, D)[rb, :, :, rr]                  # [n, A, T]
            mi = matched_ignored.reshape(B, A, T, D)[rb, :, :, rr]
            tp[sel_rows] = _bits(m & ~mi)
            fp[sel_rows] = _bits(~m & ~dt_out[sel_rows][:, :, None])
            if with_matches:
                gt_at = np.full((B, W), -1, dtype=np.int64)
                gt_at[gb, gc] = g_sel
                col = taken_column.reshape(B, A, T, D)[rb, :, :, rr]             # [n, A, T]
                matched_gt[sel_rows] = np.where(col >= 0, gt_at[rb[:, None, None], np.maximum(col, 0)], -1)
    state = CocoState(n_categories, n_gt, group_category[grp].astype(np.int32),
                      dt_score[kept].astype(np.float64), group_image_key[grp].astype(np.int64),
                      rank.astype(np.int32), tp, fp)
    if bootstrap is not None and bootstrap.enabled:
        hashes = np.asarray(group_image_hash, dtype=np.uint64)
        state.image_hash = hashes[grp]
        state.n_gt_replicates = weighted_gt_counts(
            bootstrap.weights(hashes), gt_group, group_category, gt_ignore, n_categories)
    return (state, kept, matched_gt) if with_matches else state


def weighted_gt_counts(group_weights: np.ndarray, gt_group: np.ndarray, group_category: np.ndarray,
                       gt_ignore: np.ndarray, n_categories: int) -> np.ndarray:
    """int64[R, K, A]: per replicate, category and area range, the non-ignored ground truths,
    each counted w times, w = group_weights[r, its group] (its image's weight).

    group_weights uint8[R, n_groups]; gt_group int[M]; group_category int[n_groups]; gt_ignore
    bool[M, A]. Exact integer sums: the ground truths are sorted by category once and each
    category's weights summed with np.add.reduceat (int64)."""
    R, A = group_weights.shape[0], gt_ignore.shape[1]
    out = np.zeros((R, n_categories, A), dtype=np.int64)
    if not gt_group.size or not R:
        return out
    category = group_category[gt_group]
    order = np.argsort(category, kind="stable")
    weights = group_weights[:, gt_group[order]].astype(np.int64)              # [R, M]
    for a in range(A):
        keep = ~gt_ignore[order, a]
        if not keep.any():
            continue
        cats = category[order][keep]
        present, first = np.unique(cats, return_index=True)
        out[:, present, a] = np.add.reduceat(weights[:, keep], first, axis=1)
    return out


def pair_box_iou(dt_boxes: np.ndarray, gt_boxes: np.ndarray, gt_crowd: np.ndarray):
    """pair_iou for boxes [x, y, w, h] (pycocotools' bbIou arithmetic, elementwise).

    The pairs are computed PAIR_CHUNK at a time: the arithmetic holds some 15 temporaries per
    pair, which for the millions of pairs of a dense image would outweigh the result."""
    def chunk(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        d, g = dt_boxes[dt_index], gt_boxes[gt_index]
        w = np.minimum(d[:, 2] + d[:, 0], g[:, 2] + g[:, 0]) - np.maximum(d[:, 0], g[:, 0])
        h = np.minimum(d[:, 3] + d[:, 1], g[:, 3] + g[:, 1]) - np.maximum(d[:, 1], g[:, 1])
        inter = w * h
        da = d[:, 2] * d[:, 3]
        union = np.where(gt_crowd[gt_index], da, (da + g[:, 2] * g[:, 3]) - inter)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = inter / union
        return np.where((w > 0) & (h > 0), out, 0.0)

    def iou(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        if dt_index.size <= PAIR_CHUNK:
            return chunk(dt_index, gt_index)
        out = np.empty(dt_index.size)
        for start in range(0, dt_index.size, PAIR_CHUNK):
            end = start + PAIR_CHUNK
            out[start:end] = chunk(dt_index[start:end], gt_index[start:end])
        return out
    return iou


def accumulate(state: CocoState, thresholds: np.ndarray = IOU_THRESHOLDS,
               recall_thresholds: np.ndarray = RECALL_THRESHOLDS,
               max_dets: tuple[int, ...] = MAX_DETS, with_scores: bool = False,
               categories: np.ndarray | None = None):
    """precision float64[T, R, K, A, M] and recall float64[T, K, A, M], -1 where undefined,
    with pycocotools' accumulate() arithmetic (the same float operations, all area ranges of a
    category at once). A max_dets entry of None keeps every detection. categories: the label
    indices to compute, in that order (K of the arrays is then their number; default all).

    with_scores=True also returns, third, pycocotools' scores float64[T, R, K, A, M]: at each
    recall threshold the score of the detection the interpolated precision is read at
    (pycocotools' `ss[ri] = dtScoresSorted[pi]`, pi = np.searchsorted(rc, recThrs, "left") on
    the recall after each detection in score order). For a threshold > 0 that detection is the
    first true positive whose recall reaches it; for a threshold <= 0 it is the first detection
    (the highest score), whatever it is. 0 where the curve does not reach the threshold (or the
    category has ground truth but no detection), -1 where precision is -1."""
    chosen = np.arange(state.n_categories) if categories is None else np.asarray(categories)
    T, R, K, A, M = thresholds.size, recall_thresholds.size, chosen.size, state.tp.shape[1], len(max_dets)
    precision = -np.ones((T, R, K, A, M))
    recall = -np.ones((T, K, A, M))
    scores = -np.ones((T, R, K, A, M)) if with_scores else None
    at_first = recall_thresholds <= 0          # read at the first detection (pycocotools' pi = 0)
    order = np.lexsort((state.rank, state.image_key, -state.score, state.category))
    category = state.category[order]
    bounds = np.searchsorted(category, np.arange(state.n_categories + 1))
    for k, label in enumerate(chosen.tolist()):
        areas = np.flatnonzero(state.n_gt[label] > 0)
        if not areas.size:
            continue
        npig = state.n_gt[label, areas].astype(np.int64)
        rows = order[bounds[label]:bounds[label + 1]]
        # the label's columns gathered once, in score order; each maxDets keeps a subsequence
        rank, tp_rows, fp_rows = state.rank[rows], state.tp[rows], state.fp[rows]
        score_rows = state.score[rows] if with_scores else None
        for m, max_det in enumerate(max_dets):
            kept = None if max_det is None or rank.size == 0 or rank.max() < max_det else rank < max_det
            nd = rows.size if kept is None else int(np.count_nonzero(kept))
            if not nd:
                recall[:, k, areas, m] = 0
                precision[:, :, k, areas, m] = 0
                if with_scores:
                    scores[:, :, k, areas, m] = 0
                continue
            # Precision only matters where a true positive lands: recall steps there, the
            # envelope (running maximum from the right) peaks there, and every recall threshold
            # reads one of those points. So the float arithmetic runs on those points only,
            # with pycocotools' formula, giving its values bit for bit. One area range at a
            # time: the running false-positive count is 4 bytes per (row, IoU threshold), and
            # for all four ranges at once that was 12x the category's state at its peak (85 GB
            # for "person" at 10 M images, where the state is 6.8 GB).
            tp_bits, fp_bits, sorted_scores = ((tp_rows, fp_rows, score_rows) if kept is None else
                                               (tp_rows[kept], fp_rows[kept],
                                                None if score_rows is None else score_rows[kept]))
            for a, area in enumerate(areas.tolist()):
                is_tp = _planes(tp_bits[:, area], T)                              # [T, nd]
                # int32: a category's rows stay below 2**31 (a state's rows are int64-indexed,
                # but one category of one merged state holding 2 billion detections is not a
                # workload)
                fp_cum = np.cumsum(_planes(fp_bits[:, area], T), axis=1,
                                   dtype=np.int32 if nd < 2**31 else np.int64)
                recall[:, k, area, m] = is_tp.sum(axis=1) / npig[a]
                if not with_scores:
                    precision[:, :, k, area, m] = _interpolated_precision(
                        is_tp[None], fp_cum[None], npig[a:a + 1], recall_thresholds)[0]
                    continue
                values, read = _interpolated_precision(is_tp[None], fp_cum[None], npig[a:a + 1],
                                                       recall_thresholds, with_index=True)
                precision[:, :, k, area, m] = values[0]
                at = np.where(read[0] >= 0, sorted_scores[np.maximum(read[0], 0)], 0.0)  # [T, R]
                at[:, at_first] = sorted_scores[0]
                scores[:, :, k, area, m] = at
    if with_scores:
        return precision, recall, scores
    return precision, recall


def _interpolated_precision(is_tp: np.ndarray, fp_cum: np.ndarray, npig: np.ndarray,
                            recall_thresholds: np.ndarray, with_index: bool = False):
    """Precision at the recall thresholds, float64[a, T, R], for each (area range, IoU threshold)
    sequence of one category: is_tp bool[a, T, nd], fp_cum int[a, T, nd] (false positives so
    far, the row included), npig int[a].

    Only true-positive points matter: recall steps there, the envelope (running maximum from the
    right) peaks there, and each recall threshold reads one of them. At the j-th true positive
    tp = j and recall = j / npig for every IoU threshold, so the recall lookup is one
    searchsorted per area range. Precision uses pycocotools' formula tp / (fp + tp + eps), so the
    values are its values bit for bit; the per-sequence envelope is a running maximum of exact
    value ranks with a per-sequence offset.

    with_index=True also returns int64[a, T, R]: the row (0 .. nd - 1) of the true positive each
    value is read at, -1 where the recall threshold is not reached (the value is 0 there)."""
    a_n, T, nd = is_tp.shape
    R = recall_thresholds.size
    out = np.zeros((a_n, T, R))
    index = np.full((a_n, T, R), -1, dtype=np.int64) if with_index else None
    flat = np.flatnonzero(is_tp)                                      # sequence-major order
    if not flat.size:
        return (out, index) if with_index else out
    seq, pos = np.divmod(flat, nd)
    counts = np.bincount(seq, minlength=a_n * T)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    tp = (np.arange(pos.size) - starts[seq] + 1).astype(float)
    fp = fp_cum.reshape(-1)[flat].astype(float)
    pr = tp / (fp + tp + np.spacing(1))
    values, rank = np.unique(pr, return_inverse=True)
    # running maximum from the right inside each sequence: reversed, later sequences get larger
    # offsets, so a maximum never leaks from one sequence into the next
    key = (a_n * T - seq).astype(np.int64) * (values.size + 1) + rank
    envelope = values[np.maximum.accumulate(key[::-1])[::-1] % (values.size + 1)]
    most = int(counts.max())
    for a in range(a_n):
        rc = np.arange(1, most + 1, dtype=float) / npig[a]
        inds = np.searchsorted(rc, recall_thresholds, side="left")            # [R]
        n = counts[a * T:(a + 1) * T]                                          # [T]
        valid = inds[None, :] < n[:, None]                                     # [T, R]
        t_of, r_of = np.nonzero(valid)
        point = starts[a * T + t_of] + inds[r_of]
        out[a, t_of, r_of] = envelope[point]
        if with_index:
            index[a, t_of, r_of] = pos[point]
    return (out, index) if with_index else out


def summarize(precision: np.ndarray, recall: np.ndarray, thresholds: np.ndarray = IOU_THRESHOLDS,
              max_dets: tuple[int, ...] = MAX_DETS, category: int | None = None) -> dict:
    """The 12 COCO statistics (pycocotools' summarize()), over all categories or one."""
    if category is not None:
        precision = precision[:, :, category:category + 1]
        recall = recall[:, category:category + 1]

    def one(ap: bool, iou=None, area="all", max_det=100):
        a = AREA_NAMES.index(area)
        m = max_dets.index(max_det)
        s = precision if ap else recall
        if iou is not None:
            s = s[np.where(iou == thresholds)[0]]
        s = s[:, :, :, a, m] if ap else s[:, :, a, m]
        return -1.0 if len(s[s > -1]) == 0 else float(np.mean(s[s > -1]))

    values = [one(True), one(True, .5, max_det=max_dets[2]), one(True, .75, max_det=max_dets[2]),
              one(True, area="small", max_det=max_dets[2]),
              one(True, area="medium", max_det=max_dets[2]),
              one(True, area="large", max_det=max_dets[2]),
              one(False, max_det=max_dets[0]), one(False, max_det=max_dets[1]),
              one(False, max_det=max_dets[2]),
              one(False, area="small", max_det=max_dets[2]),
              one(False, area="medium", max_det=max_dets[2]),
              one(False, area="large", max_det=max_dets[2])]
    return dict(zip(SUMMARY_NAMES, values))



# ----------------------------------------------------------------------------- bootstrap

def replicate_row_weights(state: CocoState, bootstrap, replicates: tuple[int, int] | None = None,
                          ) -> np.ndarray:
    """uint8[R, n]: each row's weight in each replicate (replicates: (first, stop), those
    replicates only), its image's Poisson weight (drawn once per distinct image hash)."""
    unique, inverse = np.unique(state.image_hash, return_inverse=True)
    first, stop = replicates or (0, bootstrap.replicates)
    return bootstrap.weights(unique, first, stop)[:, inverse]


def replicate_row_blocks(state: CocoState, per_replicate: int) -> list[tuple[int, int]]:
    """The blocks of replicates (first, stop) in which the records step computes the state's
    replicates: their arrays hold one weight byte per row and per_replicate bytes more per
    replicate, and a block holds at most kernels.bootstrap.REPLICATE_BLOCK_BYTES of them, so the
    step's peak does not grow with R (all R at once: 2.8 GB of weights alone for 281,230
    detections at R = 10,000)."""
    return replicate_blocks(state.n_gt_replicates.shape[0], state.score.size + per_replicate)


def _recall_index(n_gt: np.ndarray, recall_thresholds: np.ndarray) -> np.ndarray:
    """int64[S, Q]: for each sequence s with n_gt[s] > 0 ground truths and recall threshold q,
    the number of true-positive points k >= 1 whose recall k / n_gt[s] (a float division, as
    pycocotools computes it) is below the threshold: np.searchsorted(rc, q, side="left") on
    rc = [1, 2, ...] / n_gt without building rc. The count lies within 4 of floor(q n_gt) - 2,
    so four float comparisons settle it exactly."""
    npig = np.maximum(n_gt, 1).astype(np.float64)[:, None]    # 0: never read (no ground truth)
    base = np.maximum(np.floor(recall_thresholds[None, :] * npig).astype(np.int64) - 2, 0)
    index = base.copy()
    for d in range(1, 5):
        index += ((base + d) / npig < recall_thresholds[None, :])
    return index


def accumulate_replicates(state: CocoState, bootstrap, thresholds: np.ndarray = IOU_THRESHOLDS,
                          recall_thresholds: np.ndarray = RECALL_THRESHOLDS,
                          max_dets: tuple = MAX_DETS, chunk_points: int = 1 << 22,
                          precision_at: tuple | None = None, full: bool = False,
                          replicates: tuple[int, int] | None = None):
    """The replicates of accumulate(), reduced to what the summaries read (replicates:
    (first, stop), those replicates only, R = stop - first; each replicate's values are the
    same whichever block it is computed in).

    Replicate r is the dataset in which every image appears w times (w = its weight in r), the
    copies of an image ordered right after it (pycocotools: image ids i*N + c). Returns
    precision_sum float64[R, K, A, M, T] (the sum over the recall thresholds of the
    interpolated precision, 0 where nothing is read), recall float64[R, K, A, M, T] and valid
    bool[R, K, A] (the replicate has non-ignored ground truth there; where not, pycocotools'
    arrays hold -1). precision_at: the max_dets indices whose precision is computed (None: all;
    summarize() reads precision at maxDets 100 only, recall at all three; precision_sum is 0
    elsewhere). full=True also returns, fourth, every replicate's precision array in
    accumulate()'s shape, float64[R, T, Q, K, A, M] (for tests on small data).

    How a replicate is computed without copying rows. Rows are sorted as accumulate() sorts
    them (score descending, image, rank). A tie block is a maximal run of rows of one image with
    one score; in the replicate its w copies follow each other (copy 0 of every row, then copy
    1, ...), other blocks keep their place. So a true positive row j of block B, copy c, is the
    true-positive point number P = TP(before B) + c tp(B) + tp(B before j) (0-based), with
    FP(before B) + c fp(B) + fp(B before j) false positives before it, where TP/FP(before B)
    sum the weights of the true/false-positive rows before B and tp(B), fp(B) count one copy
    of B. Its precision is (P + 1) / (fp + P + 1 + eps), pycocotools' formula on the same
    integers, so every value is bit for bit the one pycocotools computes on the duplicated
    dataset. Recall threshold q reads the running maximum from the right at point
    _recall_index; that maximum is np.maximum.reduceat over the intervals between consecutive
    read points, then a running maximum over those intervals. Where a block has no false
    positive at a threshold, a row's copies gain precision copy after copy (true positives grow,
    false positives stay), so only its last copy can be a running maximum: it alone is computed,
    the positions of its other copies hold -1, which no maximum reads.

    Cost: the weighted sums before each block are segment sums (np.add.reduceat) of the rows'
    uint8 weights between consecutive blocks holding a true positive, O(R x rows) per category
    and max_dets (rows that are false positives at every IoU threshold of the area ranges they
    fall in, most rows, are summed once for all area ranges) plus O(R x rows with a match x T)
    for the others; then O(R x true positives) points, in chunks of replicates of at most
    chunk_points points. Recall needs only the weighted true-positive counts, one matrix
    product per category and max_dets. No Python loop over rows, points or replicates.
    """
    T, Q, K = thresholds.size, recall_thresholds.size, state.n_categories
    A, M = state.tp.shape[1], len(max_dets)
    npig_all = state.n_gt_replicates                                          # [R, K, A]
    if replicates is not None:
        npig_all = npig_all[replicates[0]:replicates[1]]
    R = npig_all.shape[0]
    precision_sum = np.zeros((R, K, A, M, T))
    recall = -np.ones((R, K, A, M, T))
    valid = npig_all > 0
    table = -np.ones((R, T, Q, K, A, M)) if full else None
    weights = (replicate_row_weights(state, bootstrap, replicates) if state.score.size
               else np.zeros((R, 0), np.uint8))
    order = np.lexsort((state.rank, state.image_key, -state.score, state.category))
    category = state.category[order]
    bounds = np.searchsorted(category, np.arange(K + 1))
    every = np.uint16((1 << T) - 1)
    precision_at = range(M) if precision_at is None or full else precision_at
    for k in range(K):
        areas = np.flatnonzero(valid[:, k, :].any(axis=0))
        if not areas.size:
            continue
        rows_k = order[bounds[k]:bounds[k + 1]]
        reads = {a: _recall_index(npig_all[:, k, a], recall_thresholds) for a in areas}
        for m, max_det in enumerate(max_dets):
            kept = rows_k if max_det is None else rows_k[state.rank[rows_k] < max_det]
            nd = kept.size
            for a in areas:
                ok = np.flatnonzero(valid[:, k, a])
                recall[ok, k, a, m, :] = 0.0
                if full:
                    table[ok, :, :, k, a, m] = 0.0
            if not nd:
                continue
            tp_bits, fp_bits = state.tp[kept], state.fp[kept]                # [nd, A]
            matched = (tp_bits[:, areas] != 0).any(axis=1)
            if not matched.any():                  # no true positive: recall 0, precision 0
                continue
            # recall: weighted true positives / weighted ground truths (exact: float64 sums of
            # small integers)
            hit = np.flatnonzero(matched)
            hits = weights[:, kept[hit]].astype(np.float64) @ _unbits(
                tp_bits[hit][:, areas], T).reshape(hit.size, -1).astype(np.float64)
            hits = hits.reshape(R, areas.size, T)
            for i, a in enumerate(areas):
                ok = np.flatnonzero(valid[:, k, a])
                recall[ok, k, a, m, :] = hits[ok, i, :] / npig_all[ok, k, a][:, None].astype(np.float64)
            if m not in precision_at:
                continue
            # tie blocks: runs of one image and one score (rows are sorted by score, image)
            score, image = state.score[kept], state.image_key[kept]
            new_block = np.r_[True, (score[1:] != score[:-1]) | (image[1:] != image[:-1])]
            block = np.cumsum(new_block) - 1
            starts = np.flatnonzero(new_block)
            block_start = starts[block]
            block_end = np.r_[starts[1:], nd][block]
            # the blocks whose weighted counts are read: those holding a true positive
            queries = np.unique(block_start[matched])
            w_rows = weights[:, kept]                                             # [R, nd]
            # rows without a true positive whose false-positive bits are all set or all clear in
            # every area range: their sums serve every threshold, summed once per pattern
            uniform = ((tp_bits == 0) & ((fp_bits == every) | (fp_bits == 0))).all(axis=1)
            pattern = ((fp_bits == every) << np.arange(A, dtype=np.int64)).sum(axis=1)
            fp_uniform = {a: np.zeros((R, queries.size), np.int64) for a in areas}
            for p in np.unique(pattern[uniform]):
                if p == 0:
                    continue
                before = _prefix_at(w_rows, np.flatnonzero(uniform & (pattern == p)), queries)
                for a in areas:
                    if p >> a & 1:
                        fp_uniform[a] += before
            for a in areas:
                _replicate_sequences(
                    _unbits(tp_bits[:, a], T), _unbits(fp_bits[:, a], T), w_rows, ~uniform,
                    block_start, block_end, queries, fp_uniform[a], npig_all[:, k, a], reads[a],
                    chunk_points, precision_sum[:, k, a, m, :],
                    None if table is None else table[:, :, :, k, a, m])
    if full:
        return precision_sum, recall, valid, table
    return precision_sum, recall, valid


def _prefix_at(w: np.ndarray, rows: np.ndarray, queries: np.ndarray, extra=None) -> np.ndarray:
    """int64[R, n_queries] (or [R, n_queries, X] with extra bool[len(rows), X]): the sum of
    w[:, i] (times extra[i] per column) over the rows i (sorted) with i < query, for sorted
    queries. Segment sums between consecutive queries (np.add.reduceat), then a running sum over
    the segments: the rows are read once."""
    R = w.shape[0]
    shape = (R, queries.size) + (() if extra is None else (extra.shape[1],))
    if not rows.size or not queries.size:
        return np.zeros(shape, np.int64)
    n_before = np.searchsorted(rows, queries)                    # rows before each query
    cuts = np.unique(np.r_[0, n_before[n_before < rows.size]])
    values = w[:, rows]
    if extra is not None:
        values = values[:, :, None] * extra[None].astype(np.uint8)
    sums = np.add.reduceat(values, cuts, axis=1, dtype=np.int64)
    prefix = np.concatenate([np.zeros((R, 1) + shape[2:], np.int64), np.cumsum(sums, axis=1)], axis=1)
    return prefix[:, np.searchsorted(cuts, n_before)]


def _replicate_sequences(is_tp, is_fp, w_rows, summed, block_start, block_end, queries, fp_uniform,
                         npig, reads, chunk_points, out_sum, out_table=None):
    """One category, area range and max_dets: the T IoU-threshold sequences of every replicate
    (accumulate_replicates). is_tp, is_fp bool[nd, T] in sorted row order; w_rows uint8[R, nd];
    summed bool[nd]: the rows whose weighted false positives are summed here (fp_uniform
    int64[R, Q'] holds the others' before each of the sorted block starts `queries`);
    block_start, block_end int[nd] (each row's tie block, [start, end)); npig int64[R]; reads
    int64[R, Q] (_recall_index). Writes out_sum[R, T], the sum of the read precisions, where
    npig > 0 (and out_table[R, T, Q], the interpolated precisions, when given).

    Entries are the (threshold t, true-positive row j) pairs, sequence-major. The weighted true
    positives before j's block are a running sum of the entries' weights within t's sequence
    (the true positives of the block before j are the u entries just before it); the weighted
    false positives before it are a running sum over the summed rows' false-positive entries,
    plus fp_uniform."""
    nd, T = is_tp.shape
    live = np.flatnonzero(npig > 0)
    t, j = np.nonzero(is_tp.T)                           # true-positive rows, sequence-major
    if not live.size or not j.size:
        return
    E = j.size
    # one copy of each block: true / false positives before each row and in its block
    tp_prefix = _exclusive_cumsum(is_tp, axis=0)                              # [nd + 1, T]
    fp_prefix = _exclusive_cumsum(is_fp, axis=0)
    bs, be = block_start[j], block_end[j]
    u = tp_prefix[j, t] - tp_prefix[bs, t]
    tp_block = tp_prefix[be, t] - tp_prefix[bs, t]
    fp_within = fp_prefix[j, t] - fp_prefix[bs, t]
    fp_block = fp_prefix[be, t] - fp_prefix[bs, t]
    t_first = np.searchsorted(t, np.arange(T + 1))
    # weighted true positives before each entry's block
    w_entry = w_rows[:, j]                                                    # uint8[R, E]
    running = _exclusive_cumsum(w_entry, axis=1, dtype=np.int32)              # [R, E + 1]
    entry = np.arange(E)
    tp_before = (running[:, entry - u] - running[:, t_first[t]]).astype(np.int64)
    # weighted false positives before it: the summed rows' false-positive entries, by threshold
    f_t, f_row = np.nonzero(is_fp.T & summed[None, :])
    f_key = f_t.astype(np.int64) * nd + f_row
    f_running = _exclusive_cumsum(w_rows[:, f_row], axis=1, dtype=np.int32)   # [R, F + 1]
    f_at = np.searchsorted(f_key, t.astype(np.int64) * nd + bs)
    f_from = np.searchsorted(f_key, t.astype(np.int64) * nd)
    f_before = f_running[:, f_at] - f_running[:, f_from]
    fp_before = (f_before + fp_uniform[:, np.searchsorted(queries, bs)] + fp_within).astype(np.int64)
    simple = fp_block == 0       # only the last copy counts (accumulate_replicates)
    mixed = np.flatnonzero(~simple)
    n_seq = np.zeros((w_entry.shape[0], T), dtype=np.int64)
    has_t = t_first[1:] > t_first[:-1]
    n_seq[:, has_t] = np.add.reduceat(w_entry, t_first[:-1][has_t], axis=1, dtype=np.int64)
    step = max(1, int(chunk_points // E))
    for first in range(0, live.size, step):
        reps = live[first:first + step]
        n_rep = reps.size
        w = w_entry[reps].astype(np.int64)                                    # [r, E]
        per_seq = n_seq[reps]                                                 # [r, T]
        seq_start = np.r_[0, np.cumsum(per_seq)[:-1]].reshape(n_rep, T)
        ordered = np.full(int(per_seq.sum()), -1.0)
        start = seq_start[:, t]                                               # [r, E]
        last = tp_before[reps] + (w - 1) * tp_block + u
        tp_count = (last + 1).astype(np.float64)
        value = tp_count / (fp_before[reps].astype(np.float64) + tp_count + np.spacing(1))
        keep = (w > 0) & simple
        ordered[(start + last)[keep]] = value[keep]
        if mixed.size:
            wm = w[:, mixed].ravel()
            pair = np.repeat(np.arange(wm.size), wm)
            c = np.arange(pair.size) - np.repeat(np.cumsum(wm) - wm, wm)
            r_i, e = pair // mixed.size, mixed[pair % mixed.size]
            position = tp_before[reps[r_i], e] + c * tp_block[e] + u[e]
            tp_count = (position + 1).astype(np.float64)
            false_pos = (fp_before[reps[r_i], e] + c * fp_block[e]).astype(np.float64)
            ordered[start[r_i, e] + position] = tp_count / (false_pos + tp_count + np.spacing(1))
        read = np.repeat(reads[reps], T, axis=0)                                  # [r*T, Q]
        ok = read < per_seq.ravel()[:, None]
        total = np.zeros(n_rep * T)
        if ok.any():
            highest = np.maximum.reduceat(ordered, (seq_start.ravel()[:, None] + read)[ok])
            grid = np.full(ok.shape, -1.0)
            grid[ok] = highest
            envelope = np.where(ok, np.maximum.accumulate(grid[:, ::-1], axis=1)[:, ::-1], 0.0)
            total = envelope.sum(axis=1)
            if out_table is not None:
                out_table[reps] = envelope.reshape(n_rep, T, -1)
        out_sum[reps] = total.reshape(n_rep, T)


def _exclusive_cumsum(x: np.ndarray, axis: int, dtype=np.int64) -> np.ndarray:
    """Cumulative sum along axis with a 0 in front."""
    shape = list(x.shape)
    shape[axis] = 1
    return np.concatenate([np.zeros(shape, dtype), np.cumsum(x, axis=axis, dtype=dtype)], axis=axis)


def summarize_replicates(precision_sum: np.ndarray, recall: np.ndarray, valid: np.ndarray,
                         n_recall: int = RECALL_THRESHOLDS.size,
                         thresholds: np.ndarray = IOU_THRESHOLDS,
                         max_dets: tuple = MAX_DETS) -> tuple[np.ndarray, np.ndarray]:
    """summarize() of every replicate from accumulate_replicates' output: float64[R, 12] over
    all categories and float64[R, K, 12] per category, NaN where summarize() gives -1.

    An AP statistic is the mean of the precision entries of the categories with ground truth
    (valid) over the chosen IoU thresholds and the n_recall recall thresholds; each valid
    category contributes the same number of entries, so the mean over categories is
    sum(precision_sum) / (valid categories x entries per category). AR likewise from recall.
    The value equals summarize() on the replicate's arrays up to float summation order."""
    R, K = valid.shape[:2]
    overall = np.full((R, len(SUMMARY_NAMES)), np.nan)
    per_category = np.full((R, K, len(SUMMARY_NAMES)), np.nan)
    big = max_dets.index(max_dets[2])
    specs = [(True, None, "all", big), (True, .5, "all", big), (True, .75, "all", big),
             (True, None, "small", big), (True, None, "medium", big), (True, None, "large", big),
             (False, None, "all", 0), (False, None, "all", 1), (False, None, "all", big),
             (False, None, "small", big), (False, None, "medium", big), (False, None, "large", big)]
    for i, (ap, iou, area, m) in enumerate(specs):
        a = AREA_NAMES.index(area)
        t_sel = np.arange(thresholds.size) if iou is None else np.where(iou == thresholds)[0]
        source = precision_sum if ap else recall
        entries = t_sel.size * (n_recall if ap else 1)
        if not entries:
            continue
        values = source[:, :, a, m, :][:, :, t_sel].sum(axis=-1)                # [R, K]
        ok = valid[:, :, a]
        with np.errstate(invalid="ignore", divide="ignore"):
            per_category[:, :, i] = np.where(ok, values / entries, np.nan)
            n_ok = ok.sum(axis=1)
            overall[:, i] = np.where(n_ok > 0, np.where(ok, values, 0.0).sum(axis=1)
                                     / (np.maximum(n_ok, 1) * entries), np.nan)
    return overall, per_category


def image_pair_counts(gt_image: np.ndarray, gt_category: np.ndarray, dt_image: np.ndarray,
                      dt_category: np.ndarray, n_images: int, max_det: int | None = None):
    """(pairs, predictions) int64[n_images] each: the (detection, ground truth) pairs matching
    computes per image, and the detections that take part, before any IoU is computed.

    gt_* [M] and dt_* [N] hold image indices in [0, n_images) and category indices (>= 0).
    max_det None (the valor protocol): every detection with every ground truth of its image,
    n_dt * n_gt, since the confusion matrix pairs labels across (per-category matching needs
    fewer). max_det m (the coco protocol): per (image, category), min(n_dt, m) * n_gt, summed
    over the image's categories; the predictions counted are min(n_dt, m) per category."""
    n_gt = np.bincount(gt_image, minlength=n_images).astype(np.int64)
    if max_det is None:
        n_dt = np.bincount(dt_image, minlength=n_images).astype(np.int64)
        return n_dt * n_gt, n_dt
    width = int(max(gt_category.max(initial=-1), dt_category.max(initial=-1))) + 1
    gt_key, gt_count = np.unique(gt_image.astype(np.int64) * width + gt_category, return_counts=True)
    dt_key, dt_count = np.unique(dt_image.astype(np.int64) * width + dt_category, return_counts=True)
    kept = np.minimum(dt_count, max_det).astype(np.int64)
    n_dt = np.bincount(dt_key // width if width else dt_key, weights=kept,
                       minlength=n_images).astype(np.int64)
    at = np.minimum(np.searchsorted(gt_key, dt_key), max(gt_key.size - 1, 0))
    found = (gt_key[at] == dt_key) if gt_key.size else np.zeros(dt_key.size, bool)
    pairs = np.zeros(n_images, np.int64)
    np.add.at(pairs, dt_key[found] // width, kept[found] * gt_count[at[found]])
    return pairs, n_dt


def coco_state(image_key: np.ndarray, n_categories: int,
               gt_image: np.ndarray, gt_category: np.ndarray, gt_area: np.ndarray,
               gt_crowd: np.ndarray, dt_image: np.ndarray, dt_category: np.ndarray,
               dt_score: np.ndarray, dt_area: np.ndarray, pair_iou, image_hash=None,
               bootstrap=None, **options) -> CocoState:
    """CocoState of a set of images: groups are the (image, category) pairs that occur.

    image_key int64[I] (the image id, pycocotools' order); gt_* [M] and dt_* [N] in input order
    with image and category indices; pair_iou(dt_index, gt_index) as in coco_match. With an
    enabled bootstrap, image_hash uint64[I] gives each image's datum hash (coco_match)."""
    key = np.r_[gt_image * n_categories + gt_category, dt_image * n_categories + dt_category]
    unique, inverse = np.unique(key, return_inverse=True)
    M = gt_image.size
    if bootstrap is not None and bootstrap.enabled:
        options = dict(options, bootstrap=bootstrap,
                       group_image_hash=np.asarray(image_hash, np.uint64)[unique // n_categories])
    return coco_match(
        group_category=(unique % n_categories).astype(np.int64),
        group_image_key=image_key[unique // n_categories],
        dt_group=inverse[M:], dt_score=dt_score, dt_area=dt_area,
        gt_group=inverse[:M], gt_area=gt_area, gt_crowd=gt_crowd,
        pair_iou=pair_iou, n_categories=n_categories, **options)


# ----------------------------------------------------------------------------- Valor protocol

VALOR_AREA_RANGES = ((0.0, np.inf),)


def valor_counts(state: CocoState, n_thresholds: int, score_thresholds: np.ndarray) -> np.ndarray:
    """int64[I, S, K, 3]: (tp, fp, fn) per matched IoU threshold, score threshold and label,
    counting the detections with score >= s and score > 0. Greedy matching runs in score order,
    so the true positives among those detections are the matches a run on them alone makes."""
    K, S = state.n_categories, score_thresholds.size
    n_gt = state.n_gt[:, 0]
    out = np.zeros((n_thresholds, S, K, 3), dtype=np.int64)
    is_tp = _unbits(state.tp[:, 0], n_thresholds)                                      # [n, I]
    for j, s in enumerate(score_thresholds):
        counted = (state.score >= s) & (state.score > 0)
        n_counted = np.bincount(state.category[counted], minlength=K)
        for i in range(n_thresholds):
            tp = np.bincount(state.category[counted & is_tp[:, i]], minlength=K)
            out[i, j, :, 0] = tp
            out[i, j, :, 1] = n_counted - tp
            out[i, j, :, 2] = n_gt - tp
    return out


def valor_metrics(state: CocoState, thresholds: np.ndarray, score_thresholds: np.ndarray,
                  use: list[int] | None = None,
                  recall_thresholds: np.ndarray = RECALL_THRESHOLDS) -> dict:
    """Valor's detection metrics from a state built with one area range, no max_dets truncation
    and no crowd rule (the "valor" protocol) over the IoU `thresholds`; `use` picks the ones the
    metrics report and average over (default all). See valor_metrics_from; also "curve":
    (precision, scores) float64[T, R, K], accumulate()'s arrays (with_scores) over all of
    `thresholds`, the InterpolatedPrecisionRecallCurve's values (-1 for labels without ground
    truth)."""
    precision, _, scores = accumulate(state, thresholds, recall_thresholds, max_dets=(None,),
                                      with_scores=True)
    present = (state.n_gt[:, 0] > 0) | (np.bincount(state.category, minlength=state.n_categories) > 0)
    out = valor_metrics_from(precision, valor_counts(state, thresholds.size, score_thresholds),
                             state.n_gt[:, 0], present, use)
    out["curve"] = (precision[:, :, :, 0, 0], scores[:, :, :, 0, 0])
    return out


def valor_metrics_from(precision: np.ndarray, counts: np.ndarray, n_gt: np.ndarray,
                       present: np.ndarray, use: list[int] | None = None) -> dict:
    """Valor's metrics from pycocotools-shaped precision [T, R, K, 1, 1] (one area range, no
    max_dets) and valor_counts() [T, S, K, 3] over the same T IoU thresholds.

    AP[t, k]: the mean over the recall points of the interpolated precision, 0 for a label that
    has predictions but no ground truth (Valor counts such a label, with AP 0, in mAP). AR[s, k]:
    mean over IoU thresholds of recall counting only detections with score >= s and score > 0.
    Means over labels cover the labels present (with ground truth or predictions)."""
    use = list(range(precision.shape[0])) if use is None else use
    has_gt = n_gt > 0
    ap = np.where(has_gt[None, :], precision[use, :, :, 0, 0].mean(axis=1), 0.0)       # [T, K]
    return _valor_metrics_of(ap, counts, n_gt, present, use)


def _valor_metrics_of(ap: np.ndarray, counts: np.ndarray, n_gt: np.ndarray, present: np.ndarray,
                      use: list[int]) -> dict:
    """valor_metrics_from's output from AP float64[len(use), K] (0 for labels without ground
    truth) and the rest of its arguments."""
    has_gt = n_gt > 0
    recall = np.zeros((len(use),) + counts.shape[1:3])
    np.divide(counts[use, :, :, 0], n_gt, out=recall, where=has_gt)
    ar = recall.mean(axis=0)                                                           # [S, K]

    def over_labels(values: np.ndarray) -> np.ndarray:
        return values[..., present].mean(axis=-1) if present.any() else np.zeros(values.shape[:-1])

    return {"present": present, "counts": counts, "AP": ap, "mAP": over_labels(ap),
            "APAveragedOverIOUs": ap.mean(axis=0), "mAPAveragedOverIOUs": over_labels(ap.mean(axis=0)),
            "AR": ar, "mAR": over_labels(ar),
            "ARAveragedOverScores": ar.mean(axis=0), "mARAveragedOverScores": over_labels(ar.mean(axis=0))}


@dataclass
class ValorBinnedState:
    """Constant-memory valor-protocol state (--score_bins N): the BinnedState (one area range, no
    max_dets) for AP bounds, and the exact, additive valor_counts() [T, S, K, 3] at the score
    thresholds known in advance (metric and PR-curve thresholds), so Counts, AR and the curve
    stay exact. Matching is per datum, so a shard's counts are final for its datums."""

    binned: "BinnedState"
    score_thresholds: np.ndarray
    counts: np.ndarray

    @staticmethod
    def from_state(state: CocoState, n_bins: int, thresholds: np.ndarray,
                   score_thresholds: np.ndarray) -> "ValorBinnedState":
        return ValorBinnedState(BinnedState.from_state(state, n_bins, thresholds, (None,)),
                                score_thresholds, valor_counts(state, thresholds.size, score_thresholds))

    def merge(self, other: "ValorBinnedState") -> "ValorBinnedState":
        self.binned = self.binned.merge(other.binned)
        self.counts = self.counts + other.counts
        return self

    def copy(self) -> "ValorBinnedState":
        return ValorBinnedState(self.binned.copy(), self.score_thresholds, self.counts.copy())

    @property
    def present(self) -> np.ndarray:
        b = self.binned
        with_predictions = np.zeros(b.n_categories, dtype=bool)
        with_predictions[b.key // (b.n_bins * b.n_classes)] = True
        return (b.n_gt[:, 0] > 0) | with_predictions

    def metrics(self, thresholds: np.ndarray, score_thresholds, use: list[int], upper: bool) -> dict:
        """valor_metrics_from with AP's lower (upper=False) or upper bound; the rest is exact."""
        precision, _ = accumulate_binned(self.binned, thresholds, upper=upper)
        picked = [int(np.flatnonzero(self.score_thresholds == s)[0]) for s in score_thresholds]
        return valor_metrics_from(precision, self.counts[:, picked], self.binned.n_gt[:, 0],
                                  self.present, use)

    def curve_counts(self, score_thresholds) -> np.ndarray:
        return self.counts[:, [int(np.flatnonzero(self.score_thresholds == s)[0]) for s in score_thresholds]]


# ----------------------------------------------------------------------------- score bins

@dataclass
class BinnedState:
    """Constant-memory partial state (--score_bins N): per (category, score bin, max_dets rank
    class) the true and false positives of every area range and IoU threshold.

    key int64[m] sorted and unique: (category * N + bin) * C + rank class; counts int64[m, A, T, 2]
    (tp, fp); n_gt int64[K, A]. bin = min(floor(score * N), N - 1) (scores in [0, 1]); rank class
    c counts the detections whose rank in their image and category is < max_dets[c] but not
    < max_dets[c - 1]. Memory grows with the number of occupied bins, never with detections."""

    n_categories: int
    n_bins: int
    n_classes: int
    n_gt: np.ndarray
    key: np.ndarray
    counts: np.ndarray

    @staticmethod
    def from_state(state: CocoState, n_bins: int, thresholds: np.ndarray,
                   max_dets: tuple) -> "BinnedState":
        T, A = thresholds.size, state.tp.shape[1]
        limits = [m for m in max_dets if m is not None]
        rank_class = np.searchsorted(np.array(limits, dtype=np.int64), state.rank, side="right")
        n_classes = len(max_dets)
        score_bin = np.clip((state.score * n_bins).astype(np.int64), 0, n_bins - 1)
        key = (state.category.astype(np.int64) * n_bins + score_bin) * n_classes + rank_class
        keep = rank_class < n_classes      # ranks beyond the largest max_dets never count
        unique, inverse = np.unique(key[keep], return_inverse=True)
        counts = np.zeros((unique.size, A, T, 2), dtype=np.int64)
        np.add.at(counts[..., 0], inverse, _unbits(state.tp[keep], T).astype(np.int64))
        np.add.at(counts[..., 1], inverse, _unbits(state.fp[keep], T).astype(np.int64))
        return BinnedState(state.n_categories, n_bins, n_classes, state.n_gt.copy(), unique, counts)

    def merge(self, other: "BinnedState") -> "BinnedState":
        key = np.concatenate([self.key, other.key])
        unique, inverse = np.unique(key, return_inverse=True)
        counts = np.zeros((unique.size,) + self.counts.shape[1:], dtype=np.int64)
        np.add.at(counts, inverse, np.concatenate([self.counts, other.counts]))
        self.key, self.counts, self.n_gt = unique, counts, self.n_gt + other.n_gt
        return self

    def copy(self) -> "BinnedState":
        return BinnedState(self.n_categories, self.n_bins, self.n_classes, self.n_gt.copy(),
                           self.key.copy(), self.counts.copy())


def accumulate_binned(state: BinnedState, thresholds: np.ndarray = IOU_THRESHOLDS,
                      recall_thresholds: np.ndarray = RECALL_THRESHOLDS,
                      upper: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """precision [T, R, K, A, M] and recall [T, K, A, M] from a BinnedState.

    Detections are taken a bin at a time, highest first. The counts at a bin's end do not depend
    on the order inside the bin, so these points lie on the exact precision-recall curve and the
    interpolated precision from them is a lower bound (upper=False). Inside a bin, precision is
    highest when its true positives come first; adding that point per bin gives an upper bound
    (upper=True). Recall (the AR statistics) is exact either way."""
    T, R, K = thresholds.size, recall_thresholds.size, state.n_categories
    A, M = state.counts.shape[1], state.n_classes
    precision = -np.ones((T, R, K, A, M))
    recall = -np.ones((T, K, A, M))
    category = state.key // (state.n_bins * M)
    score_bin = (state.key // M) % state.n_bins
    rank_class = state.key % M
    for k in range(K):
        areas = np.flatnonzero(state.n_gt[k] > 0)
        if not areas.size:
            continue
        npig = state.n_gt[k, areas].astype(float)[:, None, None]                  # [a, 1, 1]
        for m in range(M):
            rows = np.flatnonzero((category == k) & (rank_class <= m))
            bins = np.unique(score_bin[rows])[::-1]                                   # high first
            per_bin = np.zeros((bins.size, areas.size, T, 2), dtype=np.int64)
            np.add.at(per_bin, np.searchsorted(-bins, -score_bin[rows]), state.counts[rows][:, areas])
            per_bin = per_bin.transpose(1, 2, 0, 3)                                   # [a, T, b, 2]
            tp_end = np.cumsum(per_bin[..., 0], axis=2).astype(float)
            fp_end = np.cumsum(per_bin[..., 1], axis=2).astype(float)
            recall[:, k, areas, m] = (tp_end[:, :, -1] / npig[:, :, 0]).T if bins.size else 0.0
            if upper:  # each bin's best point (its true positives first), then its end
                tp_best = tp_end
                fp_best = fp_end - per_bin[..., 1]
                tp_pts = np.stack([tp_best, tp_end], axis=3).reshape(areas.size, T, -1)
                fp_pts = np.stack([fp_best, fp_end], axis=3).reshape(areas.size, T, -1)
            else:
                tp_pts, fp_pts = tp_end, fp_end
            rc = tp_pts / npig
            pr = tp_pts / (fp_pts + tp_pts + np.spacing(1))
            if not bins.size:
                precision[:, :, k, areas, m] = 0
                continue
            pr = np.maximum.accumulate(pr[:, :, ::-1], axis=2)[:, :, ::-1]
            for i, a in enumerate(areas):
                q = np.zeros((T, R))
                for t in range(T):
                    inds = np.searchsorted(rc[i, t], recall_thresholds, side="left")
                    valid = inds < rc.shape[2]
                    q[t, valid] = pr[i, t, inds[valid]]
                precision[:, :, k, a, m] = q
    return precision, recall


# ----------------------------------------------------------------------------- detailed curve

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
    int[n]); describe(kind, index) -> example dict ({"datum_uid", "geometry", "score"?})."""
    from evalbeam.transforms.kernels.classification import counts_above, counts_from, levels

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


# ----------------------------------------------------------------------------- configuration

@dataclass(frozen=True)
class Protocol:
    """How detections are matched and averaged: "coco" (pycocotools: maxDets, four area ranges,
    crowd regions) or "valor" (every detection, one area range, crowd flags ignored)."""

    name: str = "coco"
    iou_thresholds: tuple = tuple(IOU_THRESHOLDS.tolist())
    score_thresholds: tuple = (0.5,)
    pr_curve_thresholds: tuple = tuple(round(0.05 * i, 2) for i in range(1, 20))
    pr_curve_iou_threshold: float = 0.5
    score_bins: int | None = None   # constant-memory state, AP as [lower, upper] bounds
    max_examples: int = 1

    @property
    def detailed(self) -> bool:
        """The valor protocol also builds the DetailedPrecisionRecallCurve."""
        return self.name == "valor"

    @property
    def matching_thresholds(self) -> tuple:
        """The IoU thresholds matched: the metric thresholds plus the PR curve's (valor)."""
        if self.name == "coco":
            return self.iou_thresholds
        return tuple(sorted(set(self.iou_thresholds) | {self.pr_curve_iou_threshold}))

    @property
    def counted_score_thresholds(self) -> np.ndarray:
        """Score thresholds with exact counts under --score_bins (valor: metrics and curve)."""
        return np.array(sorted(set(self.score_thresholds) | set(self.pr_curve_thresholds)))

    def binned(self, state: "DetectionState") -> "DetectionState":
        """The constant-memory form of a shard's state (--score_bins)."""
        thresholds = np.array(self.matching_thresholds)
        if self.name == "coco":
            return DetectionState(BinnedState.from_state(state.matches, self.score_bins, thresholds,
                                                         MAX_DETS))
        return DetectionState(ValorBinnedState.from_state(state.matches, self.score_bins, thresholds,
                                                          self.counted_score_thresholds),
                              state.detailed, state.confusion)

    @property
    def max_det(self) -> int | None:
        """Detections kept per image and category before matching (coco: maxDets' largest)."""
        return MAX_DETS[-1] if self.name == "coco" else None

    @property
    def options(self) -> dict:
        thresholds = np.array(self.matching_thresholds)
        if self.name == "coco":
            return {"thresholds": thresholds}
        return {"thresholds": thresholds, "max_det": None, "area_ranges": VALOR_AREA_RANGES}


COCO = Protocol()
VALOR = Protocol("valor")


class DetectionConfig(NamedTuple):
    """What `evalbeam detection` evaluates: iou_type "bbox" or "segm"; protocol (COCO or a
    valor Protocol); native: the inputs are native rows (else COCO files); max_image_pixels:
    the largest mask a row may hold; bootstrap: a kernels.bootstrap.Bootstrap with replicates
    > 0 (the states carry replicate parts and the records "_replicates"), or None;
    max_image_pairs: the most (prediction, ground truth) pairs one model may make in one image
    (image_pair_counts), beyond which its predictions there are rejected."""

    iou_type: str = "bbox"
    protocol: Protocol = COCO
    native: bool = False
    max_image_pixels: int = MAX_IMAGE_PIXELS
    bootstrap: object = None
    max_image_pairs: int = MAX_IMAGE_PAIRS


# ----------------------------------------------------------------------------- the state

@dataclass
class DetectionState:
    """The partial state of one (model, slice): matches, a CocoState (exact) or, under
    --score_bins, a BinnedState (coco protocol) or ValorBinnedState (valor protocol); with the
    valor protocol also the DetailedState (DetailedPrecisionRecallCurve) and the ConfusionState
    (ConfusionMatrix), None otherwise. Merging merges each part (exact and order-free)."""

    matches: "CocoState | BinnedState | ValorBinnedState"
    detailed: "DetailedState | None" = None
    confusion: "ConfusionState | None" = None

    def copy(self) -> "DetectionState":
        return DetectionState(self.matches.copy(),
                              None if self.detailed is None else self.detailed.copy(),
                              None if self.confusion is None else self.confusion.copy())

    def merge(self, other: "DetectionState") -> "DetectionState":
        self.matches = self.matches.merge(other.matches)
        if self.detailed is not None:
            self.detailed = self.detailed.merge(other.detailed)
        if self.confusion is not None:
            self.confusion = self.confusion.merge(other.confusion)
        return self

    @staticmethod
    def merge_all(states: list["DetectionState"]) -> "DetectionState":
        """The sum of states, the states unchanged: the exact CocoStates' rows concatenated once
        (CocoState.merge_all), the bounded parts (binned states, DetailedState,
        ConfusionState) merged pairwise into a copy of the first's."""
        first = states[0]
        if len(states) == 1 or not isinstance(first.matches, CocoState):
            merged = first.copy()
            for other in states[1:]:
                merged = merged.merge(other)
            return merged
        merged = DetectionState(CocoState.merge_all([s.matches for s in states]),
                                None if first.detailed is None else first.detailed.copy(),
                                None if first.confusion is None else first.confusion.copy())
        for other in states[1:]:
            if merged.detailed is not None:
                merged.detailed = merged.detailed.merge(other.detailed)
            if merged.confusion is not None:
                merged.confusion = merged.confusion.merge(other.confusion)
        return merged


# ----------------------------------------------------------------------------- records

def state_records(state: DetectionState, categories: dict, config: DetectionConfig):
    """A merged DetectionState -> the metric records of the protocol (without model and slice).

    categories: {"id": category ids, ascending, "name": their names} (the state's label k is
    the k-th). coco: COCOSummary, then one COCOClassSummary per category (twice, lower and upper
    bound, under --score_bins), then one InterpolatedPrecisionRecallCurve per IoU threshold and
    category (not under --score_bins); valor: Valor's records (_valor_records, with an
    InterpolatedPrecisionRecallCurve per IoU threshold and label present except under
    --score_bins), the DetailedPrecisionRecallCurve and the ConfusionMatrix records, for the
    labels present."""
    protocol, iou_type = config.protocol, config.iou_type
    matches = state.matches
    if protocol.name == "valor":
        if isinstance(matches, CocoState) and matches.n_gt_replicates is not None:
            records = list(_valor_records(matches, categories, protocol))
            yield from attach_replicates(records, _valor_replicate_records(
                matches, categories, protocol, config.bootstrap), _identity)
        else:
            yield from _valor_records(matches, categories, protocol)
        present = matches.present if isinstance(matches, ValorBinnedState) else valor_present(matches)
        yield from _valor_example_records(state.detailed, state.confusion, categories, protocol,
                                          present)
        return
    if isinstance(matches, BinnedState):
        yield from _binned_records(matches, categories, iou_type)
        return
    precision, recall, scores = accumulate(matches, with_scores=True)
    replicates = per_category = None
    if matches.n_gt_replicates is not None:
        replicates, per_category = coco_summary_replicates(matches, config.bootstrap)
    yield from _coco_records(precision, recall, scores, categories, iou_type, replicates, per_category)


def coco_summary_replicates(state: CocoState, bootstrap) -> tuple[np.ndarray, np.ndarray]:
    """summarize_replicates(accumulate_replicates(state)) of every replicate, float64[R, 12]
    and [R, K, 12], computed a block of replicates at a time (replicate_row_blocks): each
    replicate's statistics are those of all R at once, bit for bit (each depends on its own
    row of every array only)."""
    K, A, T = state.n_categories, state.tp.shape[1], IOU_THRESHOLDS.size
    # accumulate_replicates' precision_sum and recall (float64[K, A, 3, T] each) and the
    # copies of the weights it makes (at most 10 bytes per row)
    per_replicate = 8 * 2 * K * A * len(MAX_DETS) * T + 9 * state.score.size
    overall, per_category = [], []
    for block in replicate_row_blocks(state, per_replicate):
        o, c = summarize_replicates(*accumulate_replicates(
            state, bootstrap, precision_at=(MAX_DETS.index(MAX_DETS[2]),), replicates=block))
        overall.append(o)
        per_category.append(c)
    if not overall:
        return np.zeros((0, len(SUMMARY_NAMES))), np.zeros((0, K, len(SUMMARY_NAMES)))
    return np.concatenate(overall), np.concatenate(per_category)


# ----------------------------------------------------------------------------- per category

def splits_by_category(config: DetectionConfig) -> bool:
    """Whether a (model, slice)'s states are merged and accumulated per category (category_parts,
    category_result, category_records) rather than whole: the exact state of either protocol
    without bootstrap replicates, whose every number but the means over labels is one label's
    (the valor protocol's DetailedPrecisionRecallCurve and ConfusionMatrix, which cross
    labels, merge on one more key). The merged state grows with the detections (23 GB for 10 M
    COCO images); per category it is spread over as many keys as there are categories, merged
    and accumulated on different workers."""
    return not config.protocol.score_bins and config.bootstrap is None


WHOLE = -2        # category_parts' key of the valor protocol's DetailedState and ConfusionState
# the maxDets index at which _coco_records reads precision (summarize's AP family) and scores
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
# label's rows again; 4 gives COCO's "person" (30%) 2 spans, which on 2 workers ran as fast as 3
# (paired runs at 50,000 images: ratio 1.00) for +18% of MergeStates' bytes where 3 cost +42%
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
            "n_gt": int(m.n_gt[k, 0]), "highest": float(_highest_scores(m)[k])}


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


def category_records(results, categories: dict, config: DetectionConfig):
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
    yield from _coco_records(precision, recall, scores, categories, config.iou_type)


def _valor_category_records(results: dict, K: int, categories, protocol: Protocol):
    """category_records under the valor protocol: valor_metrics' arrays put together from the
    labels' results, then the records _valor_records and state_records write."""
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
    yield from _valor_exact_records(m, curve_counts, n_gt, highest, categories, protocol)
    detailed, confusion = results[WHOLE]
    yield from _valor_example_records(detailed, confusion, categories, protocol, present)


def _valor_example_records(detailed, confusion, categories, protocol: Protocol, present):
    """The valor protocol's DetailedPrecisionRecallCurve and ConfusionMatrix records, for the
    labels present."""
    yield {"type": "DetailedPrecisionRecallCurve",
           "value": _detailed_value(detailed, categories, protocol, present),
           "parameters": {"pr_curve_iou_threshold": protocol.pr_curve_iou_threshold,
                          "max_examples": protocol.max_examples}}
    yield from _confusion_records(confusion, categories, protocol, present)


def _coco_records(precision, recall, scores, categories: dict, iou_type: str, replicates=None,
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


def interpolated_curve_record(precisions: np.ndarray, scores: np.ndarray, iou_threshold: float,
                              label: str, **parameters) -> dict:
    """An InterpolatedPrecisionRecallCurve record: valor-lite's object-detection
    PrecisionRecallCurve shape, {"precisions": [R], "scores": [R]} at the recall thresholds
    (np.linspace(0, 1, 101)), parameters iou_threshold and label (and any extra ones). The
    values are the float64s as computed, unrounded."""
    return {"type": "InterpolatedPrecisionRecallCurve",
            "value": {"precisions": precisions.tolist(), "scores": scores.tolist()},
            "parameters": {"iou_threshold": iou_threshold, "label": label, **parameters}}


def _statistic_replicates(values: np.ndarray) -> dict:
    """float64[R, 12] (NaN: undefined) -> {statistic: [R values, None where undefined]}: the
    REPLICATES of a COCOSummary / COCOClassSummary record, one list per field of its value."""
    return {name: [None if np.isnan(v) else float(v) for v in values[:, i].tolist()]
            for i, name in enumerate(SUMMARY_NAMES)}


def _identity(record: dict) -> str:
    return record_identity(record["type"], record["parameters"])


def _binned_records(state: BinnedState, categories, iou_type: str):
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


AP_KINDS = ("AP", "mAP", "APAveragedOverIOUs", "mAPAveragedOverIOUs")


def _valor_records(state, categories, protocol: Protocol):
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
        yield from _valor_exact_records(m, curve_counts, state.n_gt[:, 0], _highest_scores(state),
                                        categories, protocol)
        return
    for bound in ("lower", "upper"):
        m = state.metrics(np.array(matched), scores, use, upper=bound == "upper")
        records = _valor_metric_records(m, categories, ious, use, scores,
                                        {"score_bins": protocol.score_bins, "bound": bound})
        yield from (r for r in records if (r["type"] in AP_KINDS) or bound == "lower")
    yield _pr_curve_record(state.curve_counts(protocol.pr_curve_thresholds), state.present,
                           categories, protocol)


def _highest_scores(state: CocoState) -> np.ndarray:
    """float64[K]: each label's highest detection score, -inf for a label without detections."""
    highest = np.full(state.n_categories, -np.inf)
    np.maximum.at(highest, state.category, state.score)
    return highest


def _valor_exact_records(m: dict, curve_counts: np.ndarray, n_gt: np.ndarray, highest: np.ndarray,
                         categories, protocol: Protocol):
    """The exact (not binned) state's Valor records from valor_metrics' m (with "curve"),
    valor_counts at the PR curve's score thresholds, n_gt int[K] and _highest_scores."""
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


def _category_sums(weights: np.ndarray, category: np.ndarray, mask: np.ndarray,
                   n_categories: int) -> np.ndarray:
    """int64[R, K]: per replicate and category, the weights (uint8[R, n]) of the rows in mask,
    for rows sorted by category (int[n])."""
    out = np.zeros((weights.shape[0], n_categories), dtype=np.int64)
    rows = np.flatnonzero(mask)
    if rows.size:
        present, first = np.unique(category[rows], return_index=True)
        out[:, present] = np.add.reduceat(weights[:, rows], first, axis=1, dtype=np.int64)
    return out


def valor_counts_replicates(state: CocoState, bootstrap, n_thresholds: int,
                            score_thresholds: np.ndarray, replicates: tuple[int, int] | None = None,
                            ) -> tuple[np.ndarray, np.ndarray]:
    """valor_counts() of every replicate (replicates: (first, stop), those only), int64[R, I,
    S, K, 3], each detection and ground truth counted as many times as its image's weight; and
    the weighted number of detections per label, int64[R, K] (a label is present in a replicate
    when it has ground truth or a detection there)."""
    first, stop = replicates or (0, state.n_gt_replicates.shape[0])
    n_gt = state.n_gt_replicates[first:stop, :, 0]                              # [R, K]
    K, S, R = state.n_categories, score_thresholds.size, n_gt.shape[0]
    out = np.zeros((R, n_thresholds, S, K, 3), dtype=np.int64)
    order = np.argsort(state.category, kind="stable")
    category = state.category[order]
    weights = (replicate_row_weights(state, bootstrap, (first, stop))[:, order] if order.size
               else np.zeros((R, 0), np.uint8))
    is_tp = _unbits(state.tp[order, 0], n_thresholds)                              # [n, I]
    score = state.score[order]
    for j, s in enumerate(score_thresholds):
        counted = (score >= s) & (score > 0)
        n_counted = _category_sums(weights, category, counted, K)
        for i in range(n_thresholds):
            tp = _category_sums(weights, category, counted & is_tp[:, i], K)
            out[:, i, j, :, 0] = tp
            out[:, i, j, :, 1] = n_counted - tp
            out[:, i, j, :, 2] = n_gt - tp
    return out, _category_sums(weights, category, np.ones(category.size, bool), K)


def _valor_replicate_records(state: CocoState, categories, protocol: "Protocol", bootstrap):
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
            m = _valor_metrics_of(ap, counts[r], n_gt[r], present, use)
            yield [rec for rec in _valor_metric_records(m, categories, ious, use, scores, {})
                   if rec["type"] != "Counts"]


def valor_present(state: CocoState) -> np.ndarray:
    """Labels with ground truth or predictions."""
    return (state.n_gt[:, 0] > 0) | (np.bincount(state.category, minlength=state.n_categories) > 0)


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
