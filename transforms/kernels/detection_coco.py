"""The COCO protocol's constants, its mergeable partial state (CocoState) and pycocotools'
accumulate() and summarize() over that state (pure numpy).

accumulate, as pycocotools' COCOeval: per category, area range and max_dets, all images'
detections ordered by score, ties by image id then rank in the image; precision made monotone,
read at 101 recall thresholds; -1 where a category has no non-ignored ground truth. summarize()
averages those arrays into the 12 COCO statistics.

A row's true / false-positive flags at the T <= 16 IoU thresholds are packed into one uint16 per
area range (pack_bits): 2 bytes where bools take T, in a state that grows with the detections;
accumulate reads them back one threshold at a time (bit_planes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

IOU_THRESHOLDS = np.linspace(.5, 0.95, int(np.round((0.95 - .5) / .05)) + 1, endpoint=True)
RECALL_THRESHOLDS = np.linspace(.0, 1.00, int(np.round((1.00 - .0) / .01)) + 1, endpoint=True)
MAX_DETS = (1, 10, 100)
AREA_RANGES = ((0 ** 2, 1e5 ** 2), (0 ** 2, 32 ** 2), (32 ** 2, 96 ** 2), (96 ** 2, 1e5 ** 2))
AREA_NAMES = ("all", "small", "medium", "large")
SUMMARY_NAMES = ("AP", "AP50", "AP75", "APsmall", "APmedium", "APlarge",
                 "AR1", "AR10", "AR100", "ARsmall", "ARmedium", "ARlarge")


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
        Merging n states pairwise copies the rows held so far at every step, quadratic in n,
        and one large category's parts come from every shard."""
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


def pack_bits(flags: np.ndarray) -> np.ndarray:
    """bool[..., T] (T <= 16) -> uint16[...] with bit t set where flags[..., t]."""
    packed = np.packbits(flags, axis=-1, bitorder="little")
    if packed.shape[-1] == 1:
        return packed[..., 0].astype(np.uint16)
    return packed[..., 0].astype(np.uint16) | (packed[..., 1].astype(np.uint16) << 8)


def unpack_bits(bits: np.ndarray, T: int) -> np.ndarray:
    """uint16[...] -> bool[..., T]."""
    pairs = np.stack([(bits & 0xFF).astype(np.uint8), (bits >> 8).astype(np.uint8)], axis=-1)
    return np.unpackbits(pairs, axis=-1, bitorder="little")[..., :T].astype(bool)


def bit_planes(bits: np.ndarray, T: int) -> np.ndarray:
    """uint16[n] -> bool[T, n]: bit t of every row, one contiguous run of n flags per bit, so
    that running counts and searches along the rows read memory in order (along axis 0 of
    unpack_bits' layout [n, T] they stride through it, several times slower per element). Peak
    memory 2 bytes a flag (the shifted copy of one bit at a time)."""
    out = np.empty((T, bits.size), dtype=bool)
    for t in range(T):
        np.not_equal(bits & np.uint16(1 << t), 0, out=out[t])
    return out


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
            # for all four ranges at once the peak was many times the category's state.
            tp_bits, fp_bits, sorted_scores = ((tp_rows, fp_rows, score_rows) if kept is None else
                                               (tp_rows[kept], fp_rows[kept],
                                                None if score_rows is None else score_rows[kept]))
            for a, area in enumerate(areas.tolist()):
                is_tp = bit_planes(tp_bits[:, area], T)                              # [T, nd]
                # int32: a category's rows stay below 2**31 (a state's rows are int64-indexed,
                # but one category of one merged state holding 2 billion detections is not a
                # workload)
                fp_cum = np.cumsum(bit_planes(fp_bits[:, area], T), axis=1,
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
