"""Semantic segmentation kernels: per-datum pixel confusion matrices and Valor's metrics.

Pixels arrive as ids (a label map's class ids, or segment numbers, see label_ids) and a table
maps each id to a label code: 0..K-1 are labels; UNLABELED (-1) marks a pixel no segment covers
(Valor's "background": not a class, the source of unmatched pixels); IGNORED (-2) marks a
ground-truth pixel left out of every count (the label map's ignore id).

The confusion matrix has K + 1 rows and columns: row/column 0 is "unlabeled", row/column k + 1
is label k; matrix[g, p] counts the pixels whose ground truth is g and prediction is p. It is
additive over datums, so shards and workers merge it exactly: SegmentationState sums it per
(model, slice), and state_records turns a merged state into Valor's records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from evalbeam.schemas.limits import MAX_LABELS, ImageLimits

UNLABELED = -1
IGNORED = -2
UNKNOWN = -3   # a table entry for an id that names no label


class SegmentationConfig(NamedTuple):
    """What `evalbeam segmentation` evaluates: label_names {class id: label} of label-map
    images (None: rows carry segments); ignore_id: the label-map id of ground-truth pixels left
    out; unlabeled_id: the id meaning "no label"; limits: the largest image and mask file a row
    may hold; max_labels: the most distinct labels in a run."""

    label_names: dict | None = None
    ignore_id: int | None = None
    unlabeled_id: int | None = None
    limits: ImageLimits = ImageLimits()
    max_labels: int = MAX_LABELS


@dataclass
class SegmentationState:
    """The partial state of one (model, slice): matrix int64[K + 1, K + 1] (the pixel confusion
    matrix of the module docstring, summed over datums); declared bool[K]: labels named by a
    segment of an evaluated row (reported even without pixels, as Valor does). K is the run's
    number of labels, the same in every state (codes are indices into the sorted label names).

    replicates: None (no bootstrap), or int64[R, 4K + 3], row r the weighted sum over datums of
    their datum_statistics, each datum counted w(d, r) times (kernels.bootstrap): what the
    scalar records of replicate r need, a fraction of the (K + 1)^2 matrix."""

    matrix: np.ndarray
    declared: np.ndarray
    replicates: np.ndarray | None = None

    @classmethod
    def empty(cls, n_labels: int) -> "SegmentationState":
        return cls(np.zeros((n_labels + 1, n_labels + 1), dtype=np.int64),
                   np.zeros(n_labels, dtype=bool))

    def add_datum(self, matrix: np.ndarray, declared: list[int]) -> None:
        """Add one datum: its pixel_confusion matrix and the codes its segments name."""
        self.matrix += matrix
        self.declared[declared] = True

    def add_replicates(self, weights: np.ndarray, statistics: np.ndarray) -> None:
        """Add datums to the replicates: weights [R, n] (Bootstrap.weights of the n datums),
        statistics int64[n, 4K + 3] (their datum_statistics rows). One integer matrix product,
        exact: a pixel count is below 2^33 and a weight at most 18."""
        part = weights.astype(np.int64) @ statistics
        self.replicates = part if self.replicates is None else self.replicates + part

    def merge(self, other: "SegmentationState") -> "SegmentationState":
        self.matrix = self.matrix + other.matrix
        self.declared = self.declared | other.declared
        if other.replicates is not None:
            self.replicates = (other.replicates.copy() if self.replicates is None
                               else self.replicates + other.replicates)
        return self

    def copy(self) -> "SegmentationState":
        return SegmentationState(self.matrix.copy(), self.declared.copy(),
                                 None if self.replicates is None else self.replicates.copy())


def datum_statistics(matrix: np.ndarray, declared: list[int]) -> np.ndarray:
    """int64[4K + 3] of one datum's [K + 1, K + 1] pixel_confusion matrix and its segments'
    label codes: [tp (K), gt (K), pd (K), declared (K, 0/1), pixels with no label in both,
    counted pixels, 1 (the datum)]. Additive over datums like the matrix; everything the scalar
    records need (replicate_scalars), so a replicate does not keep a (K + 1)^2 matrix."""
    K = matrix.shape[0] - 1
    out = np.zeros(4 * K + 3, dtype=np.int64)
    out[:K] = np.diagonal(matrix)[1:]
    out[K:2 * K] = matrix[1:, :].sum(axis=1)
    out[2 * K:3 * K] = matrix[:, 1:].sum(axis=0)
    out[3 * K + np.asarray(declared, dtype=np.int64)] = 1
    out[4 * K] = matrix[0, 0]
    out[4 * K + 1] = matrix.sum()
    out[4 * K + 2] = 1
    return out


class UnknownIds(Exception):
    """Label-map ids that the lookup table does not name: side is "groundtruth" or "prediction",
    ids the (sorted) offending ids."""

    def __init__(self, side: str, ids: list[int]):
        super().__init__(f"{side} ids {ids}")
        self.side = side
        self.ids = ids


def lookup_table(label_names: dict, codes: dict, ignore_id: int | None, unlabeled_id: int | None,
                 groundtruth: bool) -> np.ndarray:
    """int32[65536] table from label-map id to label code: UNKNOWN for ids --label_names does not
    name, the unlabeled id to UNLABELED, the ignore id to IGNORED (ground truth: left out) or
    UNLABELED (predictions: no label)."""
    table = np.full(65536, UNKNOWN, dtype=np.int32)
    for i, name in label_names.items():
        table[i] = codes[name]
    if unlabeled_id is not None:
        table[unlabeled_id] = UNLABELED
    if ignore_id is not None:
        table[ignore_id] = IGNORED if groundtruth else UNLABELED
    return table


# RLE run lengths taken at a time from a list (a compressed string is parsed in chunks of
# schemas.coco.RUN_CHUNK_CHARS characters): each chunk's arrays stay some tens of MB.
RUN_CHUNK = 1 << 20
# overlap_pixels keeps about 64 bytes a run; painting coverage keeps 2 bytes a pixel. A row of
# RLE segments is checked from its runs alone while that costs no more memory than the pixels
# would (runs <= pixels / 32), or up to SWEEP_RUNS runs (64 MB) whatever the image size.
SWEEP_RUNS = 1 << 20


def rle_set_runs(counts, chunk: int = RUN_CHUNK):
    """The pixels a checked RLE sets (schemas.coco.rle_problem passed), as half-open intervals
    [start, end) of the column-major flat pixel index: (starts, ends) int64 arrays in increasing
    order, a chunk of runs at a time; empty runs are left out. counts: the compressed string or
    the list of run lengths (runs alternate unset and set pixels, unset first)."""
    from evalbeam.schemas.coco import iter_rle_run_arrays

    if isinstance(counts, str):
        chunks = iter_rle_run_arrays(counts)
    else:
        chunks = (np.asarray(counts[i:i + chunk], dtype=np.int64)
                  for i in range(0, len(counts), chunk))
    position, n_runs = 0, 0     # pixels and runs before the chunk
    for runs in chunks:
        ends = position + np.cumsum(runs)
        position, first_set = int(ends[-1]), 1 - n_runs % 2    # set runs have odd indices
        n_runs += runs.size
        starts, ends = ends[first_set::2] - runs[first_set::2], ends[first_set::2]
        keep = ends > starts
        yield starts[keep], ends[keep]


def overlap_pixels(segments: list) -> int:
    """Pixels covered by more than one segment, from the segments' runs alone (no pixel is
    touched): segments is a list of (starts, ends) of each segment's set runs (rle_set_runs,
    concatenated), disjoint within a segment. All runs' starts and ends are sorted together;
    between two consecutive positions the coverage is the number of starts minus ends before,
    and the pixels where it exceeds 1 are summed. O(R log R) time and ~64 bytes a run."""
    starts = np.concatenate([s for s, _ in segments] or [np.zeros(0, np.int64)])
    ends = np.concatenate([e for _, e in segments] or [np.zeros(0, np.int64)])
    if not starts.size:
        return 0
    # one sort key per event, its kind in the lowest bit: at a shared position an end (0) comes
    # before a start (1), so runs that touch never count as covering a pixel twice
    keys = np.concatenate((starts * 2 + 1, ends * 2))
    del starts, ends
    keys.sort()
    depth = np.cumsum((keys & 1).astype(np.int64) * 2 - 1)   # coverage after each event
    gaps = np.diff(keys >> 1)                                  # pixels to the next event
    return int(gaps[depth[:-1] > 1].sum())


def _all_runs(counts) -> tuple[np.ndarray, np.ndarray]:
    """rle_set_runs of one RLE as one (starts, ends) pair."""
    parts = list(rle_set_runs(counts))
    empty = np.zeros(0, dtype=np.int64)
    return (np.concatenate([s for s, _ in parts] or [empty]),
            np.concatenate([e for _, e in parts] or [empty]))


def _running_sum_image(flat: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The (h, w) view of a column-major difference array's running sum, summed in place in its
    own dtype (the sums wrap around as the differences did)."""
    h, w = shape
    np.cumsum(flat, dtype=flat.dtype, out=flat)
    return flat[:h * w].reshape(w, h).T


def label_ids(shape: tuple[int, int], rles: dict, masks, n_segments: int,
              sweep_runs: int | None = None) -> tuple[np.ndarray | None, int]:
    """(ids[h, w], number of pixels covered by more than one segment) of a datum given as
    n_segments segments; segment i paints id i + 1, so 0 means "no segment" (see code_table for
    the ids' label codes). uint8 while the ids fit (the fast path of pair_counts), else uint16
    (at most 65,535 segments); column-major (the RLEs' order) unless the datum has mask files
    (pair_counts takes either order).
    ids is None when segments overlap (the caller rejects the row).

    rles: {segment index: counts} of the segments given as checked RLEs (rle_set_runs), whose
    size is the shape. masks: an iterable of (segment index, bool[h, w]) for the other segments,
    taken one at a time after the RLEs (a generator that reads each file when asked keeps one
    mask in memory; whatever it raises goes through).

    Cost, whatever the number of segments: the RLEs are never decoded one by one. They paint a
    difference array (+id where a run starts, -id where it ends, wrapping around the unsigned
    dtype) whose running sum is the id map: one pass over the pixels plus their runs. When every
    segment is an RLE and their runs are few enough (at most sweep_runs; by default the larger
    of SWEEP_RUNS and pixels / 32), overlaps are counted from the runs first (overlap_pixels),
    so overlapping segments are rejected without touching a pixel; otherwise a coverage count is
    painted the same way (2 bytes a pixel), each mask adds to it, and the pixels covered more
    than once are counted at the end. Both ways give the same count."""
    h, w = shape
    n_pixels = h * w
    dtype = np.uint8 if n_segments < 255 else np.uint16
    if not n_segments:
        return np.zeros(shape, dtype=dtype), 0
    if sweep_runs is None:
        sweep_runs = max(SWEEP_RUNS, n_pixels // 32)
    runs_bound = sum(len(counts) // 2 + 1 for counts in rles.values())   # set runs, at most
    swept = len(rles) == n_segments and runs_bound <= sweep_runs
    runs = {}
    if swept:
        runs = {i: _all_runs(counts) for i, counts in rles.items()}
        overlap = overlap_pixels(list(runs.values()))
        if overlap:
            return None, overlap
    image = coverage = None
    if rles:
        # difference arrays, flat in column-major order (the RLEs' order), with one element past
        # the end for runs that end there
        ids = np.zeros(n_pixels + 1, dtype=dtype)
        cover = None if swept else np.zeros(n_pixels + 1, dtype=np.uint16)
        for i, counts in rles.items():
            for starts, ends in ([runs[i]] if swept else rle_set_runs(counts)):
                # a segment's runs are disjoint: no index repeats within one assignment
                ids[starts] += i + 1
                ids[ends] -= i + 1
                if cover is not None:
                    cover[starts] += 1
                    cover[ends] -= 1
        image = _running_sum_image(ids, shape)
        coverage = None if cover is None else _running_sum_image(cover, shape)
        del ids, cover
    if swept:
        return image, 0
    if len(rles) < n_segments:
        # masks are row-major: painting and adding them to column-major maps would take a
        # transposing pass each, so the maps turn row-major once
        image = np.zeros(shape, dtype=dtype) if image is None else np.ascontiguousarray(image)
        coverage = (np.zeros(shape, dtype=np.uint16) if coverage is None
                    else np.ascontiguousarray(coverage))
        for i, mask in masks:
            image[mask] = i + 1
            coverage += mask
    overlap = int(np.count_nonzero(coverage > 1))
    if overlap:
        return None, overlap
    return image, 0


def code_table(segment_codes: list[int]) -> np.ndarray:
    """The id -> code table of label_ids' output: 0 -> UNLABELED, i + 1 -> segment_codes[i]."""
    return np.array([UNLABELED, *segment_codes], dtype=np.int32)


# Pixels counted at a time: the counting temporaries (bincount's int64 copy of its input, the
# int64 keys np.unique sorts) stay near 8 bytes x PAIR_CHUNK = 32 MB however large the image.
PAIR_CHUNK = 1 << 22


def pair_counts(groundtruth: np.ndarray, prediction: np.ndarray | None, chunk: int = PAIR_CHUNK):
    """(gt ids, prediction ids, pixel counts) of the distinct id pairs of one datum.

    groundtruth, prediction: non-negative integer id arrays of one shape, in any memory order
    (prediction None: only the ground truth's ids, with prediction ids -1). Two uint8 maps take
    one bincount over (g << 8) | p; other dtypes np.unique over g * (max p + 1) + p. Images of
    more than `chunk` pixels are counted a chunk at a time and the counts of equal pairs added
    (the same result; memory beyond the two maps stays about 8 bytes x chunk, where counting a
    large image at once would hold several int64 copies of it)."""
    # both maps flattened in one memory order, without a copy when they share it (segment rows
    # give column-major maps, label maps row-major ones; a transposing copy costs a full pass)
    maps = [a for a in (groundtruth, prediction) if a is not None]
    order = "F" if all(a.flags.f_contiguous for a in maps) else "C"
    g = groundtruth.ravel(order)
    p = None if prediction is None else prediction.ravel(order)
    if g.size <= chunk:
        return _pair_counts(g, p)
    parts = [_pair_counts(g[start:start + chunk], None if p is None else p[start:start + chunk])
             for start in range(0, g.size, chunk)]
    gs, ps, counts = (np.concatenate(column) for column in zip(*parts))
    width = int(ps.max(initial=0)) + 2        # prediction ids start at -1
    keys, index = np.unique(gs.astype(np.int64) * width + (ps + 1), return_inverse=True)
    total = np.zeros(keys.size, dtype=np.int64)
    np.add.at(total, index, counts)
    return keys // width, keys % width - 1, total


def _pair_counts(g: np.ndarray, p: np.ndarray | None):
    """pair_counts of flat id arrays, all at once."""
    if p is None:
        if g.dtype == np.uint8:
            counts = np.bincount(g, minlength=256)
            ids = np.flatnonzero(counts)
            return ids, np.full(ids.size, -1), counts[ids]
        ids, counts = np.unique(g, return_counts=True)
        return ids.astype(np.int64), np.full(ids.size, -1), counts
    if g.dtype == np.uint8 and p.dtype == np.uint8:
        counts = np.bincount((g.astype(np.uint16) << 8) | p, minlength=1 << 16)
        pairs = np.flatnonzero(counts)
        return pairs >> 8, pairs & 0xFF, counts[pairs]
    width = int(p.max(initial=0)) + 1
    pairs, counts = np.unique(g.astype(np.int64) * width + p, return_counts=True)
    return pairs // width, pairs % width, counts


def pixel_confusion(groundtruth: np.ndarray, prediction: np.ndarray | None, gt_table: np.ndarray,
                    pd_table: np.ndarray, n_labels: int) -> np.ndarray:
    """int64[K + 1, K + 1] pixel counts (see the module docstring) of one datum.

    groundtruth, prediction: id arrays (pair_counts; prediction None = nothing predicted); the
    tables map an id to its label code: a label in [0, K), UNLABELED, IGNORED (ground truth only:
    the pixel is not counted) or anything else for an id that names nothing, which raises
    UnknownIds. Work is one pass over the pixels plus O(distinct pairs)."""
    g, p, counts = pair_counts(groundtruth, prediction)
    if g.size and int(g.max()) >= gt_table.size:
        raise UnknownIds("groundtruth", sorted({int(i) for i in g[g >= gt_table.size]}))
    gc = gt_table[g]
    bad = (gc <= UNKNOWN) | (gc >= n_labels)
    if bad.any():
        raise UnknownIds("groundtruth", sorted({int(i) for i in g[bad]}))
    if prediction is None:
        pc = np.full(g.size, UNLABELED)
    else:
        if p.size and int(p.max()) >= pd_table.size:
            raise UnknownIds("prediction", sorted({int(i) for i in p[p >= pd_table.size]}))
        pc = pd_table[p]
        bad = (pc <= IGNORED) | (pc >= n_labels)
        if bad.any():
            raise UnknownIds("prediction", sorted({int(i) for i in p[bad]}))
    keep = gc != IGNORED
    K1 = n_labels + 1
    flat = np.bincount((gc[keep] + 1) * K1 + (pc[keep] + 1), weights=counts[keep], minlength=K1 * K1)
    return flat.astype(np.int64).reshape(K1, K1)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    out = np.zeros(np.broadcast(numerator, denominator).shape, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def segmentation_metrics(matrix: np.ndarray) -> dict:
    """Valor's semantic segmentation metrics from a [K + 1, K + 1] pixel confusion matrix.

    With tp_k = matrix[k+1, k+1], gt_k = row sum of label k (every prediction, unlabeled too),
    pd_k = column sum of label k:
      precision_k = tp_k / pd_k, recall_k = tp_k / gt_k, F1_k = 2 P R / (P + R),
      iou[g, p] = matrix[g+1, p+1] / (gt_g + pd_p - matrix[g+1, p+1]) (IOU_k = iou[k, k]),
      unmatched prediction ratio_k = matrix[0, k+1] / pd_k (predicted where no label is),
      unmatched ground truth ratio_k = matrix[k+1, 0] / gt_k (labelled but predicted as nothing),
      accuracy = (sum tp_k + matrix[0, 0]) / all counted pixels, mIOU = mean over labels of IOU_k.
    Every undefined ratio is 0 (as valor-lite); a label with no pixels at all has zeros and still
    counts in mIOU."""
    matrix = np.asarray(matrix, dtype=np.int64)
    K = matrix.shape[0] - 1
    inner = matrix[1:, 1:]
    gt = matrix[1:, :].sum(axis=1)
    pd = matrix[:, 1:].sum(axis=0)
    tp = np.diagonal(inner).copy()
    precision, recall = _ratio(tp, pd), _ratio(tp, gt)
    f1 = _ratio(2 * precision * recall, precision + recall)
    iou = _ratio(inner, gt[:, None] + pd[None, :] - inner)
    total = int(matrix.sum())
    return {
        "precision": precision, "recall": recall, "f1": f1, "iou": iou,
        "IOU": np.diagonal(iou).copy(), "mIOU": float(np.diagonal(iou).mean()) if K else 0.0,
        "accuracy": (int(tp.sum()) + int(matrix[0, 0])) / total if total else 0.0,
        "unmatched_prediction_ratio": _ratio(matrix[0, 1:], pd),
        "unmatched_groundtruth_ratio": _ratio(matrix[1:, 0], gt),
        "unmatched_prediction_pixels": matrix[0, 1:].copy(),
        "unmatched_groundtruth_pixels": matrix[1:, 0].copy(),
    }


def replicate_scalars(statistics: np.ndarray) -> list[dict | None]:
    """The scalar metrics of each bootstrap replicate, from its summed datum_statistics
    (int64[R, 4K + 3], SegmentationState.replicates): per replicate r, None when no datum has a
    positive weight (the replicate's dataset holds no datum of this model and slice), else
    {"Accuracy": float, "mIOU": float, "present": bool[K], "IOU", "Precision", "Recall", "F1":
    float64[K]}, with the formulas of segmentation_metrics applied to the matrix of the dataset
    in which each datum appears w(d, r) times: the same integer counts, the same float
    operations in the same order, so the values are those of state_records on that dataset
    (mIOU is the mean over the labels present in the replicate: declared by a datum of positive
    weight, or with pixels on either side)."""
    statistics = np.asarray(statistics, dtype=np.int64)
    K = (statistics.shape[1] - 3) // 4
    tp, gt, pd = statistics[:, :K], statistics[:, K:2 * K], statistics[:, 2 * K:3 * K]
    declared = statistics[:, 3 * K:4 * K] > 0
    both_unlabeled, total, datums = statistics[:, 4 * K], statistics[:, 4 * K + 1], statistics[:, 4 * K + 2]
    precision, recall = _ratio(tp, pd), _ratio(tp, gt)
    f1 = _ratio(2 * precision * recall, precision + recall)
    iou = _ratio(tp, gt + pd - tp)
    present = declared | ((gt + pd) > 0)
    out: list[dict | None] = []
    for r in range(statistics.shape[0]):   # R is small; each replicate keeps its own labels
        if not datums[r]:
            out.append(None)
            continue
        kept = iou[r, present[r]]
        out.append({
            "Accuracy": (int(tp[r].sum()) + int(both_unlabeled[r])) / int(total[r]) if total[r] else 0.0,
            "mIOU": float(kept.mean()) if kept.size else 0.0,
            "present": present[r], "IOU": iou[r], "Precision": precision[r], "Recall": recall[r],
            "F1": f1[r]})
    return out


def attach_segmentation_replicates(records: list[dict], statistics: np.ndarray, keep: np.ndarray) -> list[dict]:
    """Put kernels.bootstrap.REPLICATES on the scalar records of one state (Accuracy, mIOU, and
    IOU / Precision / Recall / F1 of label code keep[i], in state_records' order): replicate r's
    value, or None where the replicate has no datum or does not have the label."""
    from evalbeam.transforms.kernels.bootstrap import REPLICATES

    replicas = replicate_scalars(statistics)
    label_index = 0
    for record in records:
        kind = record["type"]
        if kind in ("Accuracy", "mIOU"):
            record[REPLICATES] = [None if rep is None else float(rep[kind]) for rep in replicas]
        elif kind in ("IOU", "Precision", "Recall", "F1"):
            k = int(keep[label_index])
            record[REPLICATES] = [None if rep is None or not rep["present"][k] else float(rep[kind][k])
                                  for rep in replicas]
            if kind == "F1":
                label_index += 1
    return records


def state_records(state: SegmentationState, config: SegmentationConfig | None,
                  labels: list[str]):
    """Valor's records of one merged state for the labels present: those named by an evaluated
    segment or with pixels in the ground truth or a prediction. labels: the run's sorted label
    names (code k is labels[k]). Records are {"type", "value", "parameters"}: Accuracy, mIOU,
    then IOU, Precision, Recall and F1 per label, then one ConfusionMatrix. With replicates
    (bootstrap), the scalar records also carry kernels.bootstrap.REPLICATES (no PROPORTION:
    these are ratios of pixels, which are not independent draws; the unit is the image)."""
    if state.replicates is not None:
        records = list(_point_records(state, labels))
        matrix = state.matrix
        pixels = (matrix[1:, :].sum(axis=1) + matrix[:, 1:].sum(axis=0)) > 0
        yield from attach_segmentation_replicates(records, state.replicates,
                                                  np.flatnonzero(state.declared | pixels))
        return
    yield from _point_records(state, labels)


def _point_records(state: SegmentationState, labels: list[str]):
    """state_records without replicates: the point values."""
    matrix = state.matrix
    pixels = (matrix[1:, :].sum(axis=1) + matrix[:, 1:].sum(axis=0)) > 0
    keep = np.flatnonzero(state.declared | pixels)
    # the metrics of the labels present: drop the others' rows and columns (they are all zero)
    index = np.r_[0, keep + 1]
    m = segmentation_metrics(matrix[np.ix_(index, index)])
    names = [labels[k] for k in keep]

    def record(kind, value, **parameters):
        return {"type": kind, "value": value, "parameters": parameters}

    yield record("Accuracy", float(m["accuracy"]))
    yield record("mIOU", float(m["mIOU"]))
    for i, name in enumerate(names):
        yield record("IOU", float(m["IOU"][i]), label=name)
        yield record("Precision", float(m["precision"][i]), label=name)
        yield record("Recall", float(m["recall"][i]), label=name)
        yield record("F1", float(m["f1"][i]), label=name)
    inner = matrix[np.ix_(index, index)]
    yield record("ConfusionMatrix", {
        "confusion_matrix": {g: {p: {"iou": float(m["iou"][i, j]), "count": int(inner[i + 1, j + 1])}
                                 for j, p in enumerate(names)} for i, g in enumerate(names)},
        "unmatched_predictions": {p: {"ratio": float(m["unmatched_prediction_ratio"][j]),
                                      "count": int(m["unmatched_prediction_pixels"][j])}
                                  for j, p in enumerate(names)},
        "unmatched_ground_truths": {g: {"ratio": float(m["unmatched_groundtruth_ratio"][i]),
                                        "count": int(m["unmatched_groundtruth_pixels"][i])}
                                    for i, g in enumerate(names)},
    })


def pixel_label_sets(state: SegmentationState, labels: list[str]) -> tuple[set, set]:
    """(ground-truth labels, predicted labels) of a merged state: the labels with pixels on each
    side (ignored pixels and "no label" left out)."""
    matrix = state.matrix
    truth = np.flatnonzero(matrix[1:, :].sum(axis=1) > 0)
    predicted = np.flatnonzero(matrix[:, 1:].sum(axis=0) > 0)
    return {labels[k] for k in truth.tolist()}, {labels[k] for k in predicted.tolist()}
