"""Bootstrap replicates of the COCO statistics: accumulate() and summarize() of every replicate
of a CocoState that carries image hashes and replicate ground-truth counts, without copying rows.

Replicate r is the dataset in which every image appears w times (w = its weight in r,
kernels.bootstrap), the copies of an image ordered right after it (pycocotools: image ids
i*N + c). Every step holds one block of replicates at a time (replicate_row_blocks), so memory
does not grow with R.

How a replicate is computed without copying rows (accumulate_replicates). Rows are sorted as
accumulate() sorts them (score descending, image, rank). A tie block is a maximal run of rows of
one image with one score; in the replicate its w copies follow each other (copy 0 of every row,
then copy 1, ...), other blocks keep their place. So a true positive row j of block B, copy c, is
the true-positive point number P = TP(before B) + c tp(B) + tp(B before j) (0-based), with
FP(before B) + c fp(B) + fp(B before j) false positives before it, where TP/FP(before B) sum the
weights of the true/false-positive rows before B and tp(B), fp(B) count one copy of B. Its
precision is (P + 1) / (fp + P + 1 + eps), pycocotools' formula on the same integers, so every
value is bit for bit the one pycocotools computes on the duplicated dataset. Recall threshold q
reads the running maximum from the right at point _recall_index; that maximum is
np.maximum.reduceat over the intervals between consecutive read points, then a running maximum
over those intervals. Where a block has no false positive at a threshold, a row's copies gain
precision copy after copy (true positives grow, false positives stay), so only its last copy can
be a running maximum: it alone is computed, the positions of its other copies hold -1, which no
maximum reads.

Cost: the weighted sums before each block are segment sums (np.add.reduceat) of the rows' uint8
weights between consecutive blocks holding a true positive, O(R x rows) per category and
max_dets (rows that are false positives at every IoU threshold of the area ranges they fall in,
most rows, are summed once for all area ranges) plus O(R x rows with a match x T) for the
others; then O(R x true positives) points, in chunks of replicates of at most chunk_points
points. Recall needs only the weighted true-positive counts, one matrix product per category and
max_dets. No Python loop over rows, points or replicates.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from evalbeam.transforms.kernels.bootstrap import replicate_blocks
from evalbeam.transforms.kernels.detection_coco import (AREA_NAMES, IOU_THRESHOLDS, MAX_DETS,
                                                        RECALL_THRESHOLDS, SUMMARY_NAMES, CocoState,
                                                        unpack_bits)


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
    step's peak does not grow with R (all R at once would hold R bytes of weights per row)."""
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
    same whichever block it is computed in). How, without copying rows: the module docstring.

    Returns precision_sum float64[R, K, A, M, T] (the sum over the recall thresholds of the
    interpolated precision, 0 where nothing is read), recall float64[R, K, A, M, T] and valid
    bool[R, K, A] (the replicate has non-ignored ground truth there; where not, pycocotools'
    arrays hold -1). precision_at: the max_dets indices whose precision is computed (None: all;
    summarize() reads precision at maxDets 100 only, recall at all three; precision_sum is 0
    elsewhere). full=True also returns, fourth, every replicate's precision array in
    accumulate()'s shape, float64[R, T, Q, K, A, M] (for tests on small data). chunk_points:
    the most precision points computed at once (_replicate_sequences).
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
    precision_at = range(M) if precision_at is None or full else precision_at
    for k in range(K):
        areas = np.flatnonzero(valid[:, k, :].any(axis=0))
        if not areas.size:
            continue
        rows_k = order[bounds[k]:bounds[k + 1]]
        reads = {a: _recall_index(npig_all[:, k, a], recall_thresholds) for a in areas}
        for m, max_det in enumerate(max_dets):
            kept = rows_k if max_det is None else rows_k[state.rank[rows_k] < max_det]
            for a in areas:
                ok = np.flatnonzero(valid[:, k, a])
                recall[ok, k, a, m, :] = 0.0
                if full:
                    table[ok, :, :, k, a, m] = 0.0
            if not kept.size:
                continue
            tp_bits, fp_bits = state.tp[kept], state.fp[kept]                # [nd, A]
            matched = (tp_bits[:, areas] != 0).any(axis=1)
            if not matched.any():                  # no true positive: recall 0, precision 0
                continue
            # recall: weighted true positives / weighted ground truths (exact: float64 sums of
            # small integers)
            hit = np.flatnonzero(matched)
            hits = weights[:, kept[hit]].astype(np.float64) @ unpack_bits(
                tp_bits[hit][:, areas], T).reshape(hit.size, -1).astype(np.float64)
            hits = hits.reshape(R, areas.size, T)
            for i, a in enumerate(areas):
                ok = np.flatnonzero(valid[:, k, a])
                recall[ok, k, a, m, :] = hits[ok, i, :] / npig_all[ok, k, a][:, None].astype(np.float64)
            if m not in precision_at:
                continue
            blocks, fp_uniform = _tie_blocks(state, kept, weights[:, kept], tp_bits, fp_bits,
                                             matched, areas, T)
            for a in areas:
                _replicate_sequences(
                    unpack_bits(tp_bits[:, a], T), unpack_bits(fp_bits[:, a], T), blocks,
                    fp_uniform[a], npig_all[:, k, a], reads[a], chunk_points,
                    precision_sum[:, k, a, m, :], None if table is None else table[:, :, :, k, a, m])
    if full:
        return precision_sum, recall, valid, table
    return precision_sum, recall, valid


class _TieBlocks(NamedTuple):
    """The nd rows of one category and max_dets, sorted as accumulate() sorts them, in tie blocks
    (maximal runs of one image and one score): w_rows uint8[R, nd], the rows' weights; summed
    bool[nd], the rows whose weighted false positives _replicate_sequences sums (the others'
    come summed, _tie_blocks' fp_uniform); start, end int64[nd], each row's block [start, end);
    queries int64[Q'], ascending: the starts of the blocks holding a true positive, the only
    places where weighted counts are read."""

    w_rows: np.ndarray
    summed: np.ndarray
    start: np.ndarray
    end: np.ndarray
    queries: np.ndarray


def _tie_blocks(state: CocoState, kept: np.ndarray, w_rows: np.ndarray, tp_bits: np.ndarray,
                fp_bits: np.ndarray, matched: np.ndarray, areas: np.ndarray, T: int,
                ) -> tuple[_TieBlocks, dict]:
    """The _TieBlocks of the rows kept (int64[nd], sorted) with weights w_rows uint8[R, nd],
    flags tp_bits and fp_bits uint16[nd, A] and matched bool[nd] (a true positive in some area
    range of areas), and fp_uniform {a: int64[R, Q']}: per area range, the weighted false
    positives before each query of the rows not summed. Those are the rows without a true
    positive whose false-positive bits are all set or all clear in every area range (most
    rows): their sums serve every threshold, so they are summed once per pattern of ranges."""
    A = tp_bits.shape[1]
    score, image = state.score[kept], state.image_key[kept]
    new_block = np.r_[True, (score[1:] != score[:-1]) | (image[1:] != image[:-1])]
    block = np.cumsum(new_block) - 1
    starts = np.flatnonzero(new_block)
    block_start = starts[block]
    block_end = np.r_[starts[1:], kept.size][block]
    queries = np.unique(block_start[matched])
    every = np.uint16((1 << T) - 1)
    uniform = ((tp_bits == 0) & ((fp_bits == every) | (fp_bits == 0))).all(axis=1)
    pattern = ((fp_bits == every) << np.arange(A, dtype=np.int64)).sum(axis=1)
    fp_uniform = {a: np.zeros((w_rows.shape[0], queries.size), np.int64) for a in areas}
    for p in np.unique(pattern[uniform]):
        if p == 0:
            continue
        before = _prefix_at(w_rows, np.flatnonzero(uniform & (pattern == p)), queries)
        for a in areas:
            if p >> a & 1:
                fp_uniform[a] += before
    return _TieBlocks(w_rows, ~uniform, block_start, block_end, queries), fp_uniform


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


def _replicate_sequences(is_tp: np.ndarray, is_fp: np.ndarray, blocks: _TieBlocks,
                         fp_uniform: np.ndarray, npig: np.ndarray, reads: np.ndarray,
                         chunk_points: int, out_sum: np.ndarray, out_table: np.ndarray | None = None):
    """One category, area range and max_dets: the T IoU-threshold sequences of every replicate
    (accumulate_replicates). is_tp, is_fp bool[nd, T] in sorted row order; blocks: the rows'
    _TieBlocks; fp_uniform int64[R, Q']: the weighted false positives of the rows not summed
    before each of blocks.queries; npig int64[R]; reads int64[R, Q] (_recall_index). Writes
    out_sum[R, T], the sum of the read precisions, where npig > 0 (and out_table[R, T, Q], the
    interpolated precisions, when given).

    Entries are the (threshold t, true-positive row j) pairs, sequence-major. The weighted true
    positives before j's block are a running sum of the entries' weights within t's sequence
    (the true positives of the block before j are the u entries just before it); the weighted
    false positives before it are a running sum over the summed rows' false-positive entries,
    plus fp_uniform."""
    w_rows, summed, block_start, block_end, queries = blocks
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
