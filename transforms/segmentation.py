"""Semantic segmentation on Beam: read rows, decode masks per shard, add pixel confusion matrices.

Rows are read and checked cheaply (schemas/segmentation_rows.py) and keyed by the shard of their
datum_uid; each shard then decodes its masks (RLE, PNG/.npy files through FileSystems, label maps),
builds one (K + 1)^2 pixel confusion matrix per (datum, model) with one bincount, and adds them per
(model, slice) into a SegmentationState (transforms/kernels/segmentation.py). Decoding happens
after the shuffle, so workers share it. MergeStates adds the shards' states and state_records
turns them into records; the labels are a side input (sorted names), so every shard agrees on codes.

Intervals (--bootstrap R): each datum's matrix is also reduced to its datum_statistics, and a
shard adds them per (model, slice) weighted by the datums' Poisson bootstrap weights (one integer
matrix product per batch of datums); the records carry the replicate values and
transforms.uncertainty turns them into intervals (pipelines/tasks/segmentation.md, Intervals).
"""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np

from evalbeam.schemas.hashing import fnv1a_64, uid_shards
from evalbeam.schemas.limits import ImageLimits
from evalbeam.schemas.mask_files import MaskFileError
from evalbeam.schemas.segmentation_rows import SegmentRow, segment_rows
from evalbeam.schemas.slices import canonical_json
from evalbeam.transforms.graph import (TAG_PRESENCE, EvaluateFiles, EvaluateRows, MatchContext,
                                       TaskGraph)
from evalbeam.transforms.io import (GROUNDTRUTHS, TAG_STATS, ParsedRows, ProgressDoFn, ReadError,
                                    ReadRowFile, RowsFromDicts, reject_row, unique_by_source)
from evalbeam.transforms.kernels.segmentation import (SegmentationConfig, SegmentationState,
                                                      UnknownIds, code_table, datum_statistics,
                                                      label_ids, lookup_table, pixel_confusion,
                                                      pixel_label_sets, state_records)
from evalbeam.transforms.mask_files import read_array

TAG_LABELS = "labels"
REPLICATE_BATCH = 256   # datums weighed at a time per (model, slice) (MatchSegmentation)
# what one bootstrap weight is drawn for, as the intervals name it (its Task's interval_unit)
INTERVAL_UNIT = "image"


class RowProblem(Exception):
    """Why a row's pixels cannot be used: its rejection reason."""


class ReadSegmentationFile(ReadRowFile):
    """(source name, file id) -> (shard, (source, [SegmentRow])) pieces; rejects and stats
    tagged; TAG_LABELS: the set of segment labels seen."""

    def __init__(self, sources, slice_keys: list[str], num_shards: int, quiet: bool, started: float,
                 limits: ImageLimits = ImageLimits()):
        super().__init__(sources, slice_keys, num_shards, quiet, started)
        self.limits = limits

    def pieces(self, parsed: ParsedRows):
        return row_pieces(parsed, self.slice_keys if parsed.name == GROUNDTRUTHS else [],
                          self.num_shards, self.limits.max_pixels)


def row_pieces(parsed: ParsedRows, slice_keys, num_shards: int, max_pixels: int):
    """Check parsed rows of one source and yield their shard pieces (main output) with rejects,
    stats and labels (tagged). parsed.path names the file in rejects (and resolves relative mask
    URIs)."""
    good, bad = segment_rows(parsed.rows, parsed.positions_or_minus_one(), parsed.path,
                             parsed.file_id, slice_keys, max_pixels)
    yield from parsed.outcome(bad)
    yield beam.pvalue.TaggedOutput(TAG_LABELS, {label for row in good for label in row.labels})
    shards = uid_shards([row.uid for row in good], num_shards)
    for shard in sorted(set(shards.tolist())):
        yield int(shard), (parsed.name, [row for row, s in zip(good, shards.tolist()) if s == shard])


class SegmentationRowsFromDicts(RowsFromDicts):
    """(source, [row dict, ...]) batches -> shard pieces, like ReadSegmentationFile for files."""

    def __init__(self, slice_keys: list[str], num_shards: int, limits: ImageLimits = ImageLimits()):
        super().__init__(slice_keys, num_shards)
        self.limits = limits

    def process(self, element):
        source, batch = element
        yield from row_pieces(ParsedRows.of_batch(source, batch), self.keys_of(source),
                              self.num_shards, self.limits.max_pixels)


class LabelSet(beam.CombineFn):
    """Union of label sets -> sorted list of names."""

    def create_accumulator(self):
        return set()

    def add_input(self, acc, labels):
        acc |= set(labels)
        return acc

    def merge_accumulators(self, accs):
        return set().union(*accs)

    def extract_output(self, acc):
        return sorted(acc)


def decode(row: SegmentRow, codes: dict, table: np.ndarray | None, groundtruth: bool,
           limits: ImageLimits = ImageLimits()):
    """(ids[h, w], id -> code table, [codes of the row's segment labels]) or RowProblem.

    Label maps keep their class ids and use the --label_names table; segments become segment
    numbers (label_ids) with their own table: RLE segments are painted from their runs (never
    decoded one by one; overlapping ones are found from the runs), mask files are read and
    painted one at a time after them. Unknown ids are found later, by pixel_confusion. Files are
    read within `limits` (transforms/mask_files.py); RLE sizes and run lengths were checked, and
    mask files per row bounded (schemas/segmentation_rows.py), when the row was read."""
    if row.label_map is not None:
        if table is None:
            raise RowProblem("label_map_uri needs --label_names (class id -> label name)")
        try:
            ids = read_array(row.label_map, limits, "label_map_uri")
        except MaskFileError as error:
            raise RowProblem(str(error)) from None
        if row.shape is not None and tuple(ids.shape) != tuple(row.shape):
            raise RowProblem(f"label map {row.label_map} has shape {list(ids.shape)}, the row says "
                             f"{list(row.shape)}")
        if ids.dtype == bool:
            ids = ids.astype(np.uint8)
        if ids.dtype.kind == "i" and ids.size and int(ids.min()) < 0:
            raise RowProblem(f"label map {row.label_map} has negative ids")
        return ids, table, []
    h, w = row.shape
    rles = {i: payload["counts"] for i, (_, kind, payload) in enumerate(row.segments) if kind == "rle"}

    def masks():
        for i, (label, kind, payload) in enumerate(row.segments):
            if kind == "rle":
                continue
            try:
                mask = read_array(payload, limits) != 0
            except MaskFileError as error:
                raise RowProblem(f"segment {i} ({label}): {error}") from None
            if mask.shape != (h, w):
                raise RowProblem(f"segment {i} ({label}): mask shape {list(mask.shape)} differs from "
                                 f"the row's shape {[h, w]}")
            yield i, mask

    segment_codes = [codes[label] for label, _, _ in row.segments]
    ids, overlap = label_ids((h, w), rles, masks(), len(row.segments))
    if overlap:
        whose = "ground-truth" if groundtruth else "prediction"
        raise RowProblem(f"{whose} segments overlap on {overlap} pixels (each pixel takes one label)")
    return ids, code_table(segment_codes), segment_codes


def _unknown_reason(error: UnknownIds, whose: str) -> str:
    return (f"the {whose} label map has ids that --label_names does not name: "
            f"{error.ids[:10]}{' ...' if len(error.ids) > 10 else ''}")


def check_label_count(n_labels: int, max_labels: int) -> None:
    """Every (model, slice) keeps a dense (K + 1)^2 int64 pixel matrix, and every datum adds one:
    K labels beyond max_labels would cost gigabytes (65,536 labels: 32 GiB a matrix), so the run
    stops with an input error instead (ReadError: exit 2, one paragraph)."""
    if n_labels > max_labels:
        size = (n_labels + 1) ** 2 * 8
        shown = next((f"{size / scale:,.1f} {unit}" for unit, scale in (("GiB", 2**30), ("MiB", 2**20))
                      if size >= scale), f"{size:,} bytes")
        raise ReadError(f"the segments and --label_names name {n_labels:,} distinct labels, more "
                        f"than --max_labels {max_labels:,}: each (model, slice) would keep a pixel "
                        f"count matrix of {shown}. Check that segment labels are class names (not "
                        "instance names); raise --max_labels if they really are classes.")


class MatchSegmentation(ProgressDoFn):
    """(shard, pieces) -> ((model, slice JSON), SegmentationState) per model and slice, plus
    rejects and stats. Each datum's ground truth is decoded once and compared with each model's
    prediction; a datum without a usable prediction counts as predicted "no label" everywhere.

    context.bootstrap (kernels.bootstrap.Bootstrap, or None): each state also gets the
    replicates' weighted datum_statistics, the weights drawn from FNV-1a of the datum_uid.
    context.presence: tagged TAG_PRESENCE, per slice,
    (slice JSON, ("groundtruths", uint64 hashes of the evaluated datums)) and (slice JSON,
    (model, hashes of those with a usable prediction of the model))."""

    def __init__(self, config: SegmentationConfig, context: MatchContext):
        super().__init__(context.quiet, context.started)
        self.models = list(context.models)
        self.slice_specs = [tuple(s) for s in context.slices]
        self.config = config
        self.files = context.files
        self.bootstrap = context.bootstrap
        self.presence = context.presence

    def _reject(self, source, row, reason: str):
        return reject_row(self.files, source, row, reason)

    def _compare(self, uid, truth, truth_table, truth_codes, predictions, codes, tables, K):
        """[(model, matrix, declared codes, prediction row or None, rejection reason or None)]
        for one datum, or the ground truth's rejection reason (unknown ids). A prediction that
        cannot be used is rejected and the datum counts as predicted "no label"."""
        done = []
        for model in self.models:
            pred_row = predictions[model].get(uid)
            prediction, pred_table, problem, declared = None, None, None, list(truth_codes)
            if pred_row is not None:
                try:
                    prediction, pred_table, pred_codes = decode(pred_row, codes, tables and tables[False],
                                                                False, self.config.limits)
                    if prediction.shape != truth.shape:
                        raise RowProblem(f"shape {list(prediction.shape)} differs from the ground "
                                         f"truth's {list(truth.shape)}")
                    declared += pred_codes
                except RowProblem as error:
                    prediction, problem = None, str(error)
            try:
                matrix = pixel_confusion(truth, prediction, truth_table, pred_table, K)
            except UnknownIds as error:
                if error.side == "groundtruth":
                    return _unknown_reason(error, "ground truth")
                problem, declared = _unknown_reason(error, "prediction"), list(truth_codes)
                matrix = pixel_confusion(truth, None, truth_table, None, K)
            done.append((model, matrix, declared, pred_row, problem))
        for model in self.models:
            predictions[model].pop(uid, None)
        return done

    def process(self, element, labels):
        shard, pieces = element
        config = self.config
        check_label_count(len(labels), config.max_labels)
        codes = {name: i for i, name in enumerate(labels)}
        K = len(labels)
        tables = None
        if config.label_names is not None:
            tables = {gt: lookup_table(config.label_names, codes, config.ignore_id,
                                       config.unlabeled_id, gt)
                      for gt in (True, False)}
        pieces = list(pieces)
        outputs: list = []
        truths, predictions = unique_by_source(self.files, pieces, self.models, outputs)
        evaluated = {source: 0 for source in [GROUNDTRUTHS, *self.models]}
        states: dict = {}
        uids = sorted(truths)
        hashes = weights = None
        if (self.bootstrap is not None or self.presence) and uids:
            import pyarrow as pa

            hashes = fnv1a_64(pa.array(uids, pa.string()))
            if self.bootstrap is not None:
                weights = self.bootstrap.weights(hashes)
        # with bootstrap: per (model, slice), the positions (in uids) and datum_statistics rows
        # of datums not yet weighed; weighed REPLICATE_BATCH at a time, so the rows kept stay
        # bounded (4K + 3 integers each) however many datums the shard holds
        pending: dict = {}
        present: dict = {}
        for position, uid in enumerate(uids):
            row = truths[uid]
            try:
                truth, truth_table, truth_codes = decode(row, codes, tables and tables[True], True,
                                                         config.limits)
            except RowProblem as error:
                outputs.append(self._reject(GROUNDTRUTHS, row, str(error)))
                continue
            done = self._compare(uid, truth, truth_table, truth_codes, predictions, codes, tables, K)
            if isinstance(done, str):   # the ground truth holds unknown ids
                outputs.append(self._reject(GROUNDTRUTHS, row, done))
                continue
            evaluated[GROUNDTRUTHS] += 1
            groups = ["{}"] + [canonical_json({k: json.loads(row.slices[k]) for k in spec})
                               for spec in self.slice_specs]
            if self.presence:
                for group in groups:
                    present.setdefault((group, GROUNDTRUTHS), []).append(position)
            for model, matrix, declared, pred_row, problem in done:
                if problem is not None:
                    outputs.append(self._reject(model, pred_row, problem))
                elif pred_row is not None:
                    evaluated[model] += 1
                    if self.presence:
                        for group in groups:
                            present.setdefault((group, model), []).append(position)
                statistics = datum_statistics(matrix, declared) if self.bootstrap is not None else None
                for group in groups:
                    state = states.get((model, group))
                    if state is None:
                        state = states[(model, group)] = SegmentationState.empty(K)
                    state.add_datum(matrix, declared)
                    if statistics is not None:
                        positions, rows = pending.setdefault((model, group), ([], []))
                        positions.append(position)
                        rows.append(statistics)
                        if len(rows) >= REPLICATE_BATCH:
                            state.add_replicates(weights[:, positions], np.stack(rows))
                            del pending[(model, group)]
        for model in self.models:  # predictions whose datum has no usable ground truth
            for row in predictions[model].values():
                outputs.append(self._reject(model, row, "no valid ground truth for this datum_uid"))
        yield from outputs
        for key, (positions, rows) in pending.items():
            states[key].add_replicates(weights[:, positions], np.stack(rows))
        for (group, source), positions in sorted(present.items()):
            yield beam.pvalue.TaggedOutput(TAG_PRESENCE, (group, (source, hashes[positions])))
        for source in [GROUNDTRUTHS, *self.models]:
            n_rows = sum(len(rows) for name, rows in pieces if name == source)
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", source), evaluated[source]))
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", source), n_rows - evaluated[source]))
        for key in sorted(states):
            yield key, states[key]
        self.progress.say("match", f"matched shard {shard}")


def pixel_labels(element, labels) -> tuple:
    """((model, slice JSON), SegmentationState) -> (model, ground-truth labels, predicted labels):
    the labels with pixels on each side (ignored pixels and "no label" left out)."""
    (model, _), state = element
    return (model, *pixel_label_sets(state, labels))


def overall_slice(element) -> bool:
    (_, slice_json), _ = element
    return slice_json == "{}"


def vocabulary_problems(found: list) -> list:
    """transforms.outputs.label_problems on the labels with pixels of the overall slice: a model
    none of whose predicted labels has a ground-truth pixel is an error (the label names differ
    between the two sides, or it predicts only classes the ground truth never has). found:
    [(model, ground-truth labels, predicted labels)]; the ground-truth pixels are the same datums
    for every model, so their labels are one set."""
    from evalbeam.transforms.outputs import label_problems

    truth = set().union(*(t for _, t, _ in found)) if found else set()
    return label_problems({None: truth}, {model: {None: predicted} for model, _, predicted in found})


RECORD_ORDER = ("Accuracy", "mIOU", "IOU", "Precision", "Recall", "F1", "ConfusionMatrix")


def record_sort_key(record: dict):
    """model, slice, type, label."""
    return (record["model"], len(record["slice"]), json.dumps(record["slice"], sort_keys=True),
            RECORD_ORDER.index(record["type"]), str(record["parameters"].get("label", "")))


class SegmentationGraph(TaskGraph):
    """Segmentation in the one graph (transforms/graph.py). Side state: the run's labels (every
    label a reader saw, TAG_LABELS, and those --label_names declares: LabelSet), by which every
    matcher codes its pixels and every state is read. Problems: the label findings of the whole
    dataset's merged states (vocabulary_problems)."""

    name = "segmentation"
    read_tags = (TAG_LABELS,)
    match_sides = ("labels",)
    state_records = staticmethod(state_records)
    records_side = "labels"
    interval_unit = INTERVAL_UNIT
    record_order = RECORD_ORDER

    def file_reader(self, config, context, sources):
        return ReadSegmentationFile(sources, context.slice_keys, context.num_shards, context.quiet,
                                    context.started, config.limits)

    def rows_reader(self, config, context):
        return SegmentationRowsFromDicts(context.slice_keys, context.num_shards, config.limits)

    def side_states(self, pbegin, read, shards, config, context):
        declared = sorted(set((config.label_names or {}).values()))
        return {"labels": beam.pvalue.AsSingleton(
            (read.tagged[TAG_LABELS], pbegin | "DeclaredLabels" >> beam.Create([declared]))
            | "AllLabels" >> beam.Flatten()
            | "Labels" >> beam.CombineGlobally(LabelSet()))}

    def matcher(self, config, context):
        return MatchSegmentation(config, context)

    def problems(self, stages, config, context):
        return (stages.merged.states
                | "Overall" >> beam.Filter(overall_slice)
                | "PixelLabels" >> beam.Map(pixel_labels, stages.sides["labels"])
                | "GatherPixelLabels" >> beam.combiners.ToList()
                | "LabelProblems" >> beam.FlatMap(vocabulary_problems))

    record_sort_key = staticmethod(record_sort_key)


class EvaluateSegmentationFiles(EvaluateFiles):
    """Segmentation row files (job.sources) -> Evaluated (transforms/graph.py, SegmentationGraph)."""

    graph = SegmentationGraph()


def users_default_config() -> SegmentationConfig:
    """EvaluateSegmentation's default: label maps' id 255 is "ignore", as in most datasets."""
    return SegmentationConfig(ignore_id=255)


class EvaluateSegmentation(EvaluateRows):
    """Semantic segmentation metrics for a user's own pipeline (transforms.graph.EvaluateRows):
    rows as in the README, relative mask URIs relative to the working directory. The config
    (kernels.segmentation.SegmentationConfig; default ignore_id 255) holds label_names, the ids,
    and the limits that bound what one row and the run may cost (schemas/limits.py)."""

    graph = SegmentationGraph()
    default_config = users_default_config
