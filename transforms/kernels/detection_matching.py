"""COCO matching: the detections and ground truths of a set of images -> a CocoState.

The semantics are pycocotools' COCOeval evaluate(), reproduced exactly:
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
- crowd IoU is intersection / area(detection) (the pair_iou callable's business,
  kernels.detection_geometry and kernels.masks).
Matching is vectorised over detection rank: step j handles the j-th detection of every group
(image, category, area range) at once, for all IoU thresholds together. The valor protocol
matches the same way with one area range, no max_dets and no crowd rule (Protocol.options).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from evalbeam.transforms.kernels.detection_coco import (AREA_RANGES, IOU_THRESHOLDS, MAX_DETS,
                                                        CocoState, pack_bits)


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


def _pow2(x: np.ndarray) -> np.ndarray:
    """Smallest power of two >= x (x >= 1)."""
    return (1 << np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64)).astype(np.int64)


class MatchGroups(NamedTuple):
    """What coco_match matches: the groups (one per image and category that occur) and the
    annotations in them, in input order, each with its group index.

    category int[n_groups] (label index), image_key int64[n_groups] (pycocotools' image order:
    the image id); detections dt_group int[N], dt_score float64[N], dt_area float64[N]; ground
    truths gt_group int[M], gt_area float64[M], gt_crowd bool[M]; image_hash uint64[n_groups],
    the datum hash of each group's image, read only with an enabled bootstrap."""

    category: np.ndarray
    image_key: np.ndarray
    dt_group: np.ndarray
    dt_score: np.ndarray
    dt_area: np.ndarray
    gt_group: np.ndarray
    gt_area: np.ndarray
    gt_crowd: np.ndarray
    image_hash: np.ndarray | None = None


class _Kept(NamedTuple):
    """The detections kept (the first max_det of each group in score order, ties in input
    order), in state row order: index int64[n] into the input arrays, group int64[n], rank
    int64[n] (position in the group), out bool[n, A] (its area lies outside area range a)."""

    index: np.ndarray
    group: np.ndarray
    rank: np.ndarray
    out: np.ndarray


class _GtColumns(NamedTuple):
    """Ground truths laid out by group, input order within each: order int64[M] (indices sorted
    by group, stable), count int64[n_groups], first int64[n_groups] (each group's start in
    order), column int64[M] (each ground truth's position in its group)."""

    order: np.ndarray
    count: np.ndarray
    first: np.ndarray
    column: np.ndarray


class _Candidates(NamedTuple):
    """The kept detections that can match (some IoU >= the lowest threshold): mask bool[n],
    count int64[n_groups] per group, step int64[n] (a candidate's position among its group's
    candidates, in score order); and their pairs with the ground truths of their group:
    pair_row int64[P] (into the kept rows), pair_gt int64[P] (into the ground truths),
    pair_iou float64[P]."""

    mask: np.ndarray
    count: np.ndarray
    step: np.ndarray
    pair_row: np.ndarray
    pair_gt: np.ndarray
    pair_iou: np.ndarray


def coco_match(groups: MatchGroups, pair_iou, n_categories: int,
               thresholds: np.ndarray = IOU_THRESHOLDS, max_det: int | None = MAX_DETS[-1],
               area_ranges: tuple = AREA_RANGES, with_matches: bool = False, bootstrap=None):
    """Partial COCO state of a set of groups (one per image and category), columnar.

    groups: MatchGroups; pair_iou(dt_index, gt_index) -> float64[P] gives the IoU of pairs
    (indices into the dt and gt arrays). max_det None keeps every detection; area_ranges are
    [lo, hi] pairs (COCO's four by default). with_matches also returns kept int64[n] (the
    detections kept, state row order) and matched_gt int64[n, A, T] (the ground truth each one
    took, -1 when none). bootstrap (a kernels.bootstrap.Bootstrap, enabled) with
    groups.image_hash: the state also carries the rows' image hashes and the replicates'
    weighted ground-truth counts (CocoState). Matching itself is the same.
    """
    T, A = thresholds.size, len(area_ranges)
    lo = np.array([r[0] for r in area_ranges])
    hi = np.array([r[1] for r in area_ranges])
    n_groups = groups.category.size
    gt_area = groups.gt_area[:, None]
    gt_ignore = groups.gt_crowd[:, None] | (gt_area < lo) | (gt_area > hi)               # [M, A]
    n_gt = np.zeros((n_categories, A), dtype=np.int64)
    for a in range(A):
        n_gt[:, a] = np.bincount(groups.category[groups.gt_group[~gt_ignore[:, a]]],
                                 minlength=n_categories)
    kept = _kept_detections(groups, n_groups, max_det, lo, hi)
    gts = _gt_columns(groups.gt_group, n_groups)
    tp = np.zeros((kept.index.size, A), dtype=np.uint16)
    matched_gt = np.full((kept.index.size, A, T), -1, dtype=np.int64) if with_matches else None
    fp = pack_bits(np.repeat(~kept.out[:, :, None], T, axis=2))   # unmatched: fp unless out of range
    if (gts.count[kept.group] > 0).any():
        _match_pairs(groups, kept, gts, gt_ignore, pair_iou, thresholds, tp, fp, matched_gt)
    state = CocoState(n_categories, n_gt, groups.category[kept.group].astype(np.int32),
                      groups.dt_score[kept.index].astype(np.float64),
                      groups.image_key[kept.group].astype(np.int64), kept.rank.astype(np.int32),
                      tp, fp)
    if bootstrap is not None and bootstrap.enabled:
        hashes = np.asarray(groups.image_hash, dtype=np.uint64)
        state.image_hash = hashes[kept.group]
        state.n_gt_replicates = weighted_gt_counts(
            bootstrap.weights(hashes), groups.gt_group, groups.category, gt_ignore, n_categories)
    return (state, kept.index, matched_gt) if with_matches else state


def _kept_detections(groups: MatchGroups, n_groups: int, max_det: int | None, lo: np.ndarray,
                     hi: np.ndarray) -> _Kept:
    """The detections in score order within each group, ties in input order, the first max_det
    kept (all when None); lo, hi float[A]: the area ranges' bounds."""
    N = groups.dt_score.size
    order = np.lexsort((np.arange(N), -groups.dt_score, groups.dt_group))
    grp = groups.dt_group[order]
    first = np.searchsorted(grp, np.arange(n_groups))
    rank = np.arange(N) - first[grp]
    keep = rank < max_det if max_det is not None else np.ones(N, dtype=bool)
    kept = order[keep]
    area = groups.dt_area[kept][:, None]
    return _Kept(kept, grp[keep], rank[keep], (area < lo) | (area > hi))


def _gt_columns(gt_group: np.ndarray, n_groups: int) -> _GtColumns:
    """Each ground truth's column in its group: the groups' ground truths in input order."""
    M = gt_group.size
    order = np.argsort(gt_group, kind="stable")
    count = np.bincount(gt_group, minlength=n_groups)
    first = np.r_[0, np.cumsum(count)[:-1]]
    column = np.empty(M, dtype=np.int64)
    column[order] = np.arange(M) - first[gt_group[order]]
    return _GtColumns(order, count, first, column)


def _candidates(kept: _Kept, gts: _GtColumns, pair_iou, thresholds: np.ndarray,
                n_groups: int) -> _Candidates:
    """Every (kept detection, ground truth of its group) pair's IoU, and the detections that can
    match. Only detections with some IoU >= the lowest threshold can match; the others stay
    unmatched and change nothing for later ones, so matching skips them (most detections),
    renumbering the candidates of each group in score order."""
    grp = kept.group
    rows = np.flatnonzero(gts.count[grp] > 0)
    counts = gts.count[grp[rows]]
    pair_row = np.repeat(rows, counts)
    offset = np.arange(pair_row.size) - np.repeat(np.cumsum(counts) - counts, counts)
    pair_gt = gts.order[np.repeat(gts.first[grp[rows]], counts) + offset]
    iou = pair_iou(kept.index[pair_row], pair_gt)
    best = np.zeros(kept.index.size)
    np.maximum.at(best, pair_row, iou)
    candidate = best >= np.minimum(thresholds.min(), 1 - 1e-10)
    n_cand = np.bincount(grp[candidate], minlength=n_groups)
    step = np.cumsum(candidate) - 1
    step -= np.r_[0, np.cumsum(candidate)][np.searchsorted(grp, grp, side="left")]
    keep_pair = candidate[pair_row]
    return _Candidates(candidate, n_cand, step, pair_row[keep_pair], pair_gt[keep_pair],
                       iou[keep_pair])


def _match_pairs(groups: MatchGroups, kept: _Kept, gts: _GtColumns, gt_ignore: np.ndarray,
                 pair_iou, thresholds: np.ndarray, tp: np.ndarray, fp: np.ndarray,
                 matched_gt: np.ndarray | None) -> None:
    """Greedy matching of the candidate detections (_candidates): writes their rows of tp and fp
    (uint16[n, A]) and, when not None, of matched_gt (int64[n, A, T]). gt_ignore bool[M, A].

    Groups with similar (candidates, ground truths) counts form a bucket, padded to powers of 2
    ([B, D, W] IoUs), and greedy_match runs on a bucket at once, its A area ranges as A copies
    of each group."""
    n_groups = groups.category.size
    A, T = gt_ignore.shape[1], thresholds.size
    grp = kept.group
    cand = _candidates(kept, gts, pair_iou, thresholds, n_groups)
    matchable = np.flatnonzero((cand.count > 0) & (gts.count > 0))
    depth, width = _pow2(cand.count[matchable]), _pow2(gts.count[matchable])
    bucket_of = np.full(n_groups, -1, dtype=np.int64)
    for d_w in np.unique(np.stack([depth, width], axis=1), axis=0):
        members = matchable[(depth == d_w[0]) & (width == d_w[1])]
        bucket_of[members] = np.arange(members.size)
        in_bucket = np.zeros(n_groups, dtype=bool)
        in_bucket[members] = True
        sel_pairs = np.flatnonzero(in_bucket[grp[cand.pair_row]])
        sel_rows = np.flatnonzero(in_bucket[grp] & cand.mask)
        B, D, W = members.size, int(d_w[0]), int(d_w[1])
        padded = np.full((B, D, W), -1.0)
        padded[bucket_of[grp[cand.pair_row[sel_pairs]]], cand.step[cand.pair_row[sel_pairs]],
               gts.column[cand.pair_gt[sel_pairs]]] = cand.pair_iou[sel_pairs]
        ignore = np.zeros((B, W, A), dtype=bool)
        crowd = np.zeros((B, W), dtype=bool)
        valid = np.zeros((B, W), dtype=bool)
        g_sel = np.flatnonzero(in_bucket[groups.gt_group])
        gb, gc = bucket_of[groups.gt_group[g_sel]], gts.column[g_sel]
        ignore[gb, gc] = gt_ignore[g_sel]
        crowd[gb, gc] = groups.gt_crowd[g_sel]
        valid[gb, gc] = True
        # the four area ranges are four copies of each group: [B, A, ...] -> [B * A, ...]
        matched, matched_ignored, taken_column = greedy_match(
            np.repeat(padded, A, axis=0), np.repeat(cand.count[members], A),
            ignore.transpose(0, 2, 1).reshape(B * A, W), np.repeat(crowd, A, axis=0),
            np.repeat(valid, A, axis=0), thresholds)
        rb, rr = bucket_of[grp[sel_rows]], cand.step[sel_rows]
        m = matched.reshape(B, A, T, D)[rb, :, :, rr]                  # [n, A, T]
        mi = matched_ignored.reshape(B, A, T, D)[rb, :, :, rr]
        tp[sel_rows] = pack_bits(m & ~mi)
        fp[sel_rows] = pack_bits(~m & ~kept.out[sel_rows][:, :, None])
        if matched_gt is not None:
            gt_at = np.full((B, W), -1, dtype=np.int64)
            gt_at[gb, gc] = g_sel
            col = taken_column.reshape(B, A, T, D)[rb, :, :, rr]             # [n, A, T]
            matched_gt[sel_rows] = np.where(col >= 0, gt_at[rb[:, None, None], np.maximum(col, 0)], -1)


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


def coco_state(image_key: np.ndarray, n_categories: int,
               gt_image: np.ndarray, gt_category: np.ndarray, gt_area: np.ndarray,
               gt_crowd: np.ndarray, dt_image: np.ndarray, dt_category: np.ndarray,
               dt_score: np.ndarray, dt_area: np.ndarray, pair_iou, image_hash=None,
               bootstrap=None, **options) -> CocoState:
    """CocoState of a set of images: groups are the (image, category) pairs that occur.

    image_key int64[I] (the image id, pycocotools' order); gt_* [M] and dt_* [N] in input order
    with image and category indices; pair_iou(dt_index, gt_index) as in coco_match; options:
    coco_match's (thresholds, max_det, area_ranges, with_matches). With an enabled bootstrap,
    image_hash uint64[I] gives each image's datum hash (coco_match).

    The annotation columns come one by one, as the plumbing holds them after reading a shard
    (arrays of the ground-truth and detection tables); coco_match takes them grouped."""
    key = np.r_[gt_image * n_categories + gt_category, dt_image * n_categories + dt_category]
    unique, inverse = np.unique(key, return_inverse=True)
    M = gt_image.size
    image = unique // n_categories
    booted = bootstrap is not None and bootstrap.enabled
    groups = MatchGroups((unique % n_categories).astype(np.int64), image_key[image],
                         inverse[M:], dt_score, dt_area, inverse[:M], gt_area, gt_crowd,
                         np.asarray(image_hash, np.uint64)[image] if booted else None)
    return coco_match(groups, pair_iou, n_categories, bootstrap=bootstrap if booted else None,
                      **options)
