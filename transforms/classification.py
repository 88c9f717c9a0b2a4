"""Beam plumbing of classification: reading, shard matching, merging, the composites.

Data flow (see pipelines/DESIGN.md): rows of every source are validated and split by shard
(ReadClassificationFile, or ClassificationRowsFromDicts for a user's PCollections) ->
GroupByKey(shard) -> MatchClassification joins ground truths and each model's predictions of the
shard and runs the numpy kernel per (model, slice) into a ClassificationState ->
combine_states (transforms/merge.py) adds the partial states -> records_of(state_records). With a
bootstrap (kernels.bootstrap), each shard draws its datums' weights once (or, past
SHARED_WEIGHTS_BYTES, each state draws its own in blocks of replicates) and every state also
carries the replicates' weighted counts; the records then hold internal replicate fields that
transforms.uncertainty turns into intervals. Beside it,
Vocabularies collects each source's label values (bounded: a key with more values than
ClassificationConfig.value_limit is only marked as such and is not evaluated), their unions for the
kernels (per model: the ground truth's values and the model's own), and the run's findings on
them (vocabulary_problems).
"""

from __future__ import annotations

import dataclasses
import json

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalbeam.schemas.classification_rows import (CLASSIFICATION_GROUNDTRUTH,
                                                  CLASSIFICATION_PREDICTION, LabelRows,
                                                  dict_rows_table, parquet_tables,
                                                  parse_jsonl_block, validate, vocabulary)
from evalbeam.schemas.formats import format_of, jsonl_blocks, position_name
from evalbeam.schemas.rejections import reject
from evalbeam.schemas.slices import canonical_json
from evalbeam.transforms.graph import (TAG_OUTCOMES, TAG_PRESENCE, EvaluateFiles, EvaluateRows,
                                       MatchContext, Read, TaskGraph)
from evalbeam.transforms.io import (GROUNDTRUTHS, TAG_REJECTED, TAG_STATS, ProgressDoFn,
                                    ReadDatasets, dataset_of, is_truth, line_splittable, open_span,
                                    qualified, role_of, shard_range, span_of,
                                    span_text, truth_of)
from evalbeam.transforms.kernels.bootstrap import Bootstrap, record_identity
from evalbeam.transforms.kernels.classification import (ALL_METRIC_TYPES, DEFAULT_METRIC_TYPES,
                                                        ClassificationConfig,
                                                        ClassificationState, datum_correct,
                                                        match_key, state_records)

# The most a shard's bootstrap weights (one byte per datum and replicate) may take to be drawn
# once and shared by its states; beyond it each state draws its own in blocks of replicates
# (MatchClassification._weights). The default shard count keeps them near 100 MB.
SHARED_WEIGHTS_BYTES = 256 << 20


def schema_of(source: str) -> pa.Schema:
    return CLASSIFICATION_GROUNDTRUTH if is_truth(source) else CLASSIFICATION_PREDICTION


def validate_source(table: pa.Table, file_id: int, source: str, max_labels: int | None = None):
    return validate(table, scored=not is_truth(source), file_id=file_id, max_labels=max_labels)


def validate_table(table: pa.Table, file_id: int, max_labels: int | None = None):
    """validate() with `scored` read from the normalised table's schema (predictions score)."""
    scored = "score" in [f.name for f in table.schema.field("labels").type.value_type]
    return validate(table, scored=scored, file_id=file_id, max_labels=max_labels)


class VocabularyCombineFn(beam.CombineFn):
    """{label key: values} parts -> {label key: sorted list of values}, with None for a key that
    has more than `limit` values: only that fact is kept, so memory stays bounded by the limit
    whatever the input."""

    def __init__(self, limit: int | None = None):
        self.limit = limit

    def create_accumulator(self):
        return {}

    def add_input(self, acc, part):
        for key, values in part.items():
            if key in acc and acc[key] is None:
                continue
            if values is None:
                acc[key] = None
                continue
            merged = acc.setdefault(key, set())
            merged.update(values)
            if self.limit is not None and len(merged) > self.limit:
                acc[key] = None
        return acc

    def merge_accumulators(self, accs):
        out = {}
        for acc in accs:
            self.add_input(out, acc)
        return out

    def extract_output(self, acc):
        return {key: None if values is None else sorted(values)
                for key, values in sorted(acc.items())}


def piece_vocabulary(piece) -> tuple[str, dict]:
    """(shard, (source, rows)) -> (source, {label key: set of values})."""
    _, (source, rows) = piece
    return source, vocabulary(rows)


def union_vocabulary(per_source: dict, limit: int | None) -> dict:
    """{source: {key: values or None}} -> {key: sorted values of all sources, or None}."""
    combine = VocabularyCombineFn(limit)
    acc = combine.create_accumulator()
    for part in per_source.values():
        combine.add_input(acc, part)
    return combine.extract_output(acc)


def model_vocabularies(per_source: dict, models: list[str], limit: int | None) -> dict:
    """{source: {key: values or None}} -> {model: {key: sorted values or None}}, the vocabulary
    a model is evaluated on: the ground truth's values (of its dataset, transforms.io.truth_of)
    and its own, never another model's (so neither its records nor the bound on its keys depend
    on the other models of the run)."""
    return {model: union_vocabulary({GROUNDTRUTHS: per_source.get(truth_of(model), {}),
                                     model: per_source.get(model, {})}, limit)
            for model in models}


def too_many_values(key: str, config: ClassificationConfig) -> str:
    limit = config.value_limit
    square = (" The confusion matrix alone holds (V+1)^2 counts per score threshold; leaving "
              "ConfusionMatrix out of --metrics makes the memory linear in V."
              if config.needs_confusion else "")
    return (f"label key {key!r} has more than {limit:,} distinct values (ground truth and "
            f"predictions together), so none of its metrics was computed: with these options one "
            f"(model, slice) state of {limit + 1:,} values needs "
            f"{config.state_bytes(limit + 1) / 2**20:,.0f} MiB, and there is one per model and "
            f"slice value. --max_label_values raises the bound.{square}")


def vocabulary_problems(per_source: dict, models: list[str], config: ClassificationConfig,
                        ) -> list[dict]:
    """The run's findings on label vocabularies ({source: {key: values or None}}): an error per
    key beyond the vocabulary bound in the ground truth (evaluated for no model), and per model
    and key beyond it in the model's vocabulary (model_vocabularies; not evaluated for that
    model), then
    transforms.outputs.label_problems of each model's keys and values against the ground
    truth's (keys beyond the bound left out; nothing when the ground truth has no valid row,
    which is reported already). A problem about one model names it (problem()'s "model")."""
    from evalbeam.transforms.outputs import ERROR, label_problems, problem

    vocabs = model_vocabularies(per_source, models, config.value_limit)
    found = []
    datasets = {dataset_of(m) for m in models} | {dataset_of(s) for s in per_source if is_truth(s)}
    for dataset in sorted(datasets):
        # a key over the bound in the ground truth is over it for every model: said once
        truth_name = qualified(dataset, GROUNDTRUTHS)
        truth = per_source.get(truth_name, {})
        everywhere = sorted(key for key, values in truth.items() if values is None)
        mine = [problem(ERROR, "label_values_over_limit", too_many_values(key, config))
                for key in everywhere]
        members = [m for m in models if dataset_of(m) == dataset]
        over = {}
        for model in members:
            over[model] = {key for key, values in vocabs[model].items() if values is None}
            name = role_of(model)
            mine += [problem(ERROR, "label_values_over_limit",
                             f"model {name!r}: " + too_many_values(key, config), name)
                     for key in sorted(over[model] - set(everywhere))]

        def sets(source: str, skip) -> dict:
            return {key: set(values) for key, values in per_source.get(source, {}).items()
                    if key not in skip and values}

        groundtruth = sets(truth_name, set(everywhere))
        if groundtruth:
            mine += label_problems(groundtruth, {role_of(m): sets(m, over[m]) for m in members})
        if dataset:   # a multi-dataset job's: which cells a problem concerns
            for finding in mine:
                finding["dataset"] = dataset
        found += mine
    return found


def refuse_over_limit(vocabs: dict, config: ClassificationConfig) -> dict:
    """The vocabularies ({model: {key: values or None}}), or ValueError naming a key beyond the
    bound (EvaluateClassification, which has no run.json to record an incomplete run in)."""
    for model, vocab in sorted(vocabs.items()):
        over = sorted(key for key, values in vocab.items() if values is None)
        if over:
            raise ValueError(f"model {model!r}: " + too_many_values(over[0], config))
    return vocabs


class Vocabularies(beam.PTransform):
    """Shard pieces -> (per source {source: {key: values or None}}, per model {model: {key:
    values or None}} (model_vocabularies)), both singletons; None marks a key with more values
    than config.value_limit."""

    def __init__(self, config: ClassificationConfig, models: list[str]):
        super().__init__()
        self.config = config
        self.models = list(models)

    def expand(self, pieces):
        limit = self.config.value_limit
        per_source = (pieces
                      | "PieceVocabulary" >> beam.Map(piece_vocabulary)
                      | "PerSource" >> beam.CombinePerKey(VocabularyCombineFn(limit))
                      | "BySource" >> beam.combiners.ToDict())
        return per_source, (per_source
                            | "PerModel" >> beam.Map(model_vocabularies, self.models, limit))


def _dedupe(rows: LabelRows) -> tuple[LabelRows, np.ndarray, np.ndarray]:
    """Drop every row whose datum_uid occurs more than once: (kept rows, dropped row indices,
    occurrence count of each dropped row's uid)."""
    codes = pc.dictionary_encode(rows.uid).indices.to_numpy()
    counts = np.bincount(codes, minlength=1)[codes] if len(rows) else np.zeros(0, np.int64)
    dropped = np.flatnonzero(counts > 1)
    if not dropped.size:
        return rows, dropped, counts[dropped]
    return rows.take(np.flatnonzero(counts == 1)), dropped, counts[dropped]


def _code(names: list, name: str) -> int:
    """Code of name in names, or -1 (matches no label) when absent."""
    try:
        return names.index(name)
    except ValueError:
        return -1


def slice_groups(gt: LabelRows, slice_specs: list[tuple[str, ...]]) -> list[tuple[str, np.ndarray]]:
    """[(slice JSON, datum indices)]: the whole shard as "{}", then one group per combination of
    values of each spec's metadata keys present in the shard."""
    groups = [("{}", np.arange(len(gt)))]
    for spec in slice_specs:
        columns = [gt.slices[key].to_numpy(zero_copy_only=False) for key in spec]
        if not len(gt):
            continue
        combos = np.array(["\x1f".join(parts) for parts in zip(*columns)], dtype=object)
        unique, inverse = np.unique(combos, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(unique.size + 1))
        for i, combo in enumerate(unique):
            values = {key: json.loads(text) for key, text in zip(spec, combo.split("\x1f"))}
            groups.append((canonical_json(values), order[bounds[i]:bounds[i + 1]]))
    return groups


class MatchClassification(ProgressDoFn):
    """(shard, [(source, rows), ...]) -> ((model, slice JSON), ClassificationState).

    Rejects here what only the whole shard can show: a datum_uid repeated within one source
    (every copy is rejected, so the result does not depend on which copy came first) and
    predictions whose datum has no valid ground truth. Tagged outputs as in ReadClassificationFile.

    context (transforms.graph.MatchContext): with context.bootstrap the states carry its
    replicates, weighted by Bootstrap.weights of the datums' FNV-1a uid hashes. compare: also
    emit, per slice of the shard, TAG_PRESENCE (slice JSON, ("groundtruths" | model, uint64
    hashes of the slice's datums with a ground truth | with a prediction row of the model)) and
    TAG_OUTCOMES ((identity of an Accuracy record, slice JSON), (model, uint64 hashes of the
    datums with a ground truth for its key, bool correct)) for McNemar's test. presence: emit
    TAG_PRESENCE (not TAG_OUTCOMES) even without compare or bootstrap. context.layout: {dataset: (first
    shard, shard count)} of a job over several datasets (FilesJob.layout): a shard then holds
    one dataset's rows, matched against that dataset's ground truth and models."""

    def __init__(self, config: ClassificationConfig, context: MatchContext):
        super().__init__(context.quiet, context.started)
        self.config = config
        self.layout = dict(context.layout or {})
        self.models = list(context.models)
        self.slice_specs = [tuple(s) for s in context.slices]
        self.files = context.files
        self.num_shards = context.num_shards
        self.bootstrap = context.bootstrap
        self.compare = context.compare
        self.presence = context.presence

    def setup(self):
        super().setup()
        self.matched = 0

    def _reject(self, source, rows: LabelRows, index, reason_of):
        for i in np.asarray(index, dtype=np.int64):
            files = self.files.get(source, ())
            file_id = int(rows.file_id[i])
            path = files[file_id] if file_id < len(files) else source
            yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(
                source, path, int(rows.position[i]), reason_of(i), rows.uid[int(i)].as_py(),
                position_name(path)))

    def _deduplicated(self, source: str, parts: list[LabelRows], where: str):
        """A source's rows in this shard without repeated uids: (rows, rejected count,
        outputs to yield)."""
        rows = LabelRows.concat(parts)
        kept, dropped, counts = _dedupe(rows)
        times = dict(zip(dropped.tolist(), counts.tolist()))
        outputs = list(self._reject(source, rows, dropped,
                                    lambda i: f"datum_uid appears {times[int(i)]} times in {where}"))
        return kept, len(dropped), outputs

    @staticmethod
    def _gt_values(gt: LabelRows, keys, vocab) -> dict[str, np.ndarray]:
        """{key: int32[n] vocabulary index of each datum's ground-truth value, -1 if none}."""
        out = {}
        for key in keys:
            column = np.full(len(gt), -1, dtype=np.int32)
            mask = gt.key_code == _code(gt.key_names, key)
            column[gt.label_row[mask]] = gt.codes_in(gt.value_names, gt.value_code[mask], vocab[key])
            out[key] = column
        return out

    @staticmethod
    def _entries(predictions: LabelRows, datum: np.ndarray, keys, vocab) -> dict:
        """{key: (datum index, value index, score) of the prediction labels of matched rows}."""
        entries = {}
        if not len(predictions.label_row):
            return entries
        label_datum = datum[predictions.label_row]
        matched = label_datum >= 0
        for key in keys:
            mask = matched & (predictions.key_code == _code(predictions.key_names, key))
            if mask.any():
                entries[key] = (label_datum[mask],
                                predictions.codes_in(predictions.value_names,
                                                     predictions.value_code[mask], vocab[key]),
                                predictions.label_score[mask])
        return entries

    def process(self, element, vocabs):
        """vocabs: {model: {key: sorted values, or None for too many}} (model_vocabularies)."""
        shard, pieces = element
        by_source: dict[str, list[LabelRows]] = {}
        for source, rows in pieces:
            by_source.setdefault(source, []).append(rows)
        dataset = next((d for d, (first, count) in self.layout.items()
                        if first <= shard < first + count), "")
        truth = qualified(dataset, GROUNDTRUTHS)
        gt = None
        if truth in by_source:
            gt, n_dropped, outputs = self._deduplicated(truth, by_source[truth], GROUNDTRUTHS)
            yield from outputs
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", truth), n_dropped))
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", truth), len(gt)))
            groups = slice_groups(gt, self.slice_specs)
            weights = self._weights(gt.hash)
            if self.presence:
                for slice_json, rows in groups:
                    yield beam.pvalue.TaggedOutput(
                        TAG_PRESENCE, (slice_json, (truth, gt.hash[rows])))

        for model in self.models:
            if dataset_of(model) != dataset:
                continue
            vocab = vocabs.get(model, {})
            keys = sorted(key for key, values in vocab.items() if values is not None)
            entries = {}
            if model in by_source:
                predictions, n_dropped, outputs = self._deduplicated(
                    model, by_source[model], f"the predictions of {role_of(model)}")
                yield from outputs
                datum = np.full(len(predictions), -1, dtype=np.int64)
                if gt is not None and len(predictions):
                    datum = np.asarray(pc.index_in(predictions.uid, value_set=gt.uid).fill_null(-1),
                                       dtype=np.int64)
                orphans = np.flatnonzero(datum < 0)
                yield from self._reject(model, predictions, orphans,
                                        lambda i: "no valid ground truth for this datum_uid")
                yield beam.pvalue.TaggedOutput(
                    TAG_STATS, (("rows_rejected", model), n_dropped + len(orphans)))
                yield beam.pvalue.TaggedOutput(
                    TAG_STATS, (("rows_evaluated", model), len(predictions) - len(orphans)))
                entries = self._entries(predictions, datum, keys, vocab)
            if gt is None:
                continue
            gt_values = self._gt_values(gt, keys, vocab)
            predicted = np.zeros(len(gt), dtype=bool)
            if self.presence and model in by_source:
                predicted[datum[datum >= 0]] = True
            for slice_json, rows in groups:
                yield (model, slice_json), self._slice_state(
                    gt, gt_values, entries, rows, vocab, self._slice_weights(weights, rows))
                if self.presence:
                    yield beam.pvalue.TaggedOutput(
                        TAG_PRESENCE, (slice_json, (model, gt.hash[rows[predicted[rows]]])))
                if self.compare:
                    yield from self._outcomes(model, slice_json, gt, gt_values, entries, rows)
        self.matched += 1
        self.progress.say("match", f"matched shard {shard} ({self.matched} in this worker, "
                                   f"{self.num_shards} in all)")

    def _weights(self, hashes: np.ndarray):
        """The bootstrap weights of the shard's datums for match_key: None without bootstrap;
        uint8[R, n], drawn once and shared by every model, slice and key, while they take at
        most SHARED_WEIGHTS_BYTES; else the Bootstrap, from which each match_key draws its own
        datums' weights a block of replicates at a time (each draw is repeated per model, slice
        and key, but a shard's memory stops growing with R x datums)."""
        if self.bootstrap is None:
            return None
        if self.bootstrap.replicates * hashes.size <= SHARED_WEIGHTS_BYTES:
            return self.bootstrap.weights(hashes)
        return self.bootstrap

    @staticmethod
    def _slice_weights(weights, rows: np.ndarray):
        """The weights of the datums `rows` of the shard (_weights): the columns of the shared
        array (no copy for the whole shard), or the Bootstrap as it is."""
        if weights is None or isinstance(weights, Bootstrap):
            return weights
        if rows.size == weights.shape[1] and np.array_equal(rows, np.arange(rows.size)):
            return weights
        return weights[:, rows]

    @staticmethod
    def _positions(gt, rows) -> np.ndarray:
        """int64[len(gt)]: each datum's position in rows, -1 outside."""
        position = np.full(len(gt), -1, dtype=np.int64)
        position[rows] = np.arange(rows.size)
        return position

    @staticmethod
    def _slice_entries(position, entries, key):
        """A key's entries (datum, value, score) restricted to the datums with a position
        (_positions), datum indices renumbered to those positions."""
        if key not in entries:
            return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0)
        d, v, s = entries[key]
        inside = position[d] >= 0
        return position[d[inside]], v[inside], s[inside]

    def _slice_state(self, gt, gt_values, entries, rows, vocab, weights=None) -> ClassificationState:
        uid = gt.uid.take(pa.array(rows))
        position = self._positions(gt, rows)
        state = ClassificationState(self.config)
        for key, column in gt_values.items():
            sub_gt = column[rows]
            d, v, s = self._slice_entries(position, entries, key)
            if not (sub_gt >= 0).any() and not d.size:
                continue
            state.add_key(key, match_key(sub_gt, gt.hash[rows], uid, d, v, s, len(vocab[key]),
                                         self.config, weights))
        return state

    def _outcomes(self, model, slice_json, gt, gt_values, entries, rows):
        """TAG_OUTCOMES of one model and slice: per key and score threshold, whether each datum
        with a ground truth for the key is correct (as Accuracy counts it)."""
        if "Accuracy" not in self.config.metrics:
            return
        position = self._positions(gt, rows)
        for key, column in gt_values.items():
            sub_gt = column[rows]
            labelled = np.flatnonzero(sub_gt >= 0)
            if not labelled.size:
                continue
            d, v, s = self._slice_entries(position, entries, key)
            correct = datum_correct(sub_gt, d, v, s, self.config)
            hashes = gt.hash[rows[labelled]]
            for t, threshold in enumerate(self.config.score_thresholds):
                identity = record_identity("Accuracy", {"label_key": key, "score_threshold": threshold,
                                                        "hardmax": self.config.hardmax})
                yield beam.pvalue.TaggedOutput(
                    TAG_OUTCOMES, ((identity, slice_json), (model, hashes, correct[t, labelled])))


TYPE_ORDER = {name: i for i, name in enumerate(ALL_METRIC_TYPES)}


def record_sort_key(record: dict):
    """Stable order of metrics.jsonl: model, slice, label key, type, label value, threshold."""
    params = record["parameters"]
    label = params.get("label") or {}
    return (record["model"], len(record["slice"]), canonical_json(record["slice"]),
            label.get("key", params.get("label_key", "")), TYPE_ORDER.get(record["type"], 99),
            label.get("value", ""), params.get("score_threshold", -1.0),
            canonical_json(params))


class ClassificationRowsFromDicts(beam.DoFn):
    """(source, [row dict, ...]) batches -> shard pieces, like ReadClassificationFile for files."""

    def __init__(self, slice_keys: list[str], num_shards: int, max_labels: int | None = None):
        self.slice_keys = slice_keys
        self.num_shards = num_shards
        self.max_labels = max_labels

    def process(self, element):
        source, batch = element
        slice_keys = self.slice_keys if source == GROUNDTRUTHS else []
        table, unparsed = dict_rows_table(batch, 0, schema_of(source), slice_keys)
        rows, rejects = validate_source(table, 0, source, self.max_labels)
        for _, reason in unparsed:
            yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(source, source, None, reason, None, "row"))
        for _, uid, reason in rejects:
            yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(source, source, None, reason, uid, "row"))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", source), len(batch)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", source), len(unparsed) + len(rejects)))
        for shard, piece in rows.partition(self.num_shards).items():
            yield shard, (source, piece)


class ClassificationGraph(TaskGraph):
    """Classification in the one graph (transforms/graph.py). Side states: each label key's
    values, per source and per model (Vocabularies), found from the pieces before matching; the
    matcher and each model's records read them ("vocabs"). A key with more values than
    config.value_limit is a problem of the run on the command line, and fails a user's pipeline
    with a ValueError that says so (refuse_over_limit)."""

    name = "classification"
    match_sides = ("vocabs",)
    state_records = staticmethod(state_records)
    records_side = "vocabs"   # each model's states read on its own vocabulary
    records_by_model = True
    record_order = ALL_METRIC_TYPES
    default_metrics = DEFAULT_METRIC_TYPES

    def prepare(self, config: ClassificationConfig, context, sources):
        # the calibration state keeps its replicates by the config's Bootstrap: the run's
        if config.bootstrap != context.bootstrap:
            config = dataclasses.replace(config, bootstrap=context.bootstrap)
        return config, context

    def file_reader(self, config, context, sources, num_shards: int | None = None, layout=None):
        return ReadClassificationFile(sources, config, context.slice_keys,
                                      num_shards or context.num_shards, context.quiet,
                                      context.started, layout)

    def read_files(self, pbegin, config, context, sources):
        if not context.layout:
            return super().read_files(pbegin, config, context, sources)
        # a sweep's group of datasets: each dataset's rows in its own range of shards
        pieces, rejected, stats = pbegin | "ReadDatasets" >> ReadDatasets(
            context.layout, lambda srcs, shards, layout: self.file_reader(
                config, context, srcs, shards, layout), sources)
        return Read(pieces, rejected, stats)

    def rows_reader(self, config, context):
        return ClassificationRowsFromDicts(context.slice_keys, context.num_shards,
                                           config.labels_per_row_limit)

    def side_states(self, pbegin, read, shards, config, context):
        per_source, vocab = read.pieces | "Vocabularies" >> Vocabularies(config, context.models)
        if context.temp is None:   # a user's pipeline: no run.json to record the key in
            vocab = vocab | "RefuseOverLimit" >> beam.Map(refuse_over_limit, config)
        return {"per_source": per_source, "vocabs": beam.pvalue.AsSingleton(vocab)}

    def matcher(self, config, context):
        return MatchClassification(config, context)

    def problems(self, stages, config, context):
        return stages.sides["per_source"] | "LabelProblems" >> beam.FlatMap(
            vocabulary_problems, list(context.models), config)

    record_sort_key = staticmethod(record_sort_key)


class EvaluateClassificationFiles(EvaluateFiles):
    """The classification job on files (the launcher's; transforms/graph.py): read and validate
    every source, find each label key's values, match per shard, merge, and turn the merged
    states into records. Its problems are the label findings (vocabulary_problems)."""

    graph = ClassificationGraph()


class EvaluateClassification(EvaluateRows):
    """Classification metrics for a user's own pipeline (transforms.graph.EvaluateRows: config,
    slices, num_shards, batch_size, with_diagnostics, bootstrap, compare_to). A label key with
    more values than config.value_limit fails the pipeline with a ValueError that says so (the
    command line instead records it in run.json and skips the key)."""

    graph = ClassificationGraph()
    default_config = ClassificationConfig


class ReadClassificationFile(ProgressDoFn):
    """(source name, file id) -> validated rows split by shard.

    Main output: (shard, (source name, rows)) for each shard present in each block. Tagged
    outputs: TAG_REJECTED reject records, TAG_STATS ((counter, source), n). Rows are validated
    by validate_table with config.labels_per_row_limit. layout: a multi-dataset read's shard
    range per dataset (transforms.io.ReadDatasets, shard_range)."""

    def __init__(self, sources: dict, config: ClassificationConfig, slice_keys: list[str],
                 num_shards: int, quiet: bool, started: float, layout: dict | None = None):
        super().__init__(quiet, started)
        self.layout = layout
        self.sources = sources
        self.schemas = {name: schema_of(name) for name in sources}
        self.max_labels = config.labels_per_row_limit
        self.slice_keys = slice_keys
        self.num_shards = num_shards

    def splits(self, path: str) -> bool:
        """Whether ReadFiles may hand this reader byte spans of the file."""
        return line_splittable(path)

    def process(self, element):
        name, file_id, start, end, first_line = span_of(element)
        source = self.sources[name]
        path = source.files[file_id]
        schema = self.schemas[name]
        position = position_name(path)
        slice_keys = self.slice_keys if is_truth(name) else []
        first, count = shard_range(self.layout, name, self.num_shards)
        read = 0
        path_text = path + span_text(start, end)
        with open_span(path, start, end) as stream:
            if format_of(path) == "parquet":
                tables = ((table, []) for table in parquet_tables(stream, schema, slice_keys))
            else:
                tables = (parse_jsonl_block(block, line, schema, slice_keys)
                          for block, line in jsonl_blocks(stream, first_line=first_line))
            for table, unparsed in tables:
                rows, rejects = validate_table(table, file_id, self.max_labels)
                for line, reason in unparsed:
                    yield beam.pvalue.TaggedOutput(
                        TAG_REJECTED, reject(name, path, line, reason, None, position))
                for line, uid, reason in rejects:
                    yield beam.pvalue.TaggedOutput(
                        TAG_REJECTED, reject(name, path, line, reason, uid, position))
                n = table.num_rows + len(unparsed)
                read += n
                yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", name), n))
                yield beam.pvalue.TaggedOutput(
                    TAG_STATS, (("rows_rejected", name), len(unparsed) + len(rejects)))
                for shard, piece in rows.partition(count).items():
                    yield first + shard, (name, piece)
                self.progress.say(path, f"read {read:,} rows of {path_text}")
        self.progress.say(path, f"read {read:,} rows of {path_text}, done", force=True)
