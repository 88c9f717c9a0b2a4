"""Text generation metrics on Beam (no LLM): read rows, score each datum per shard, combine.

Rows are checked when read (schemas/text_rows.py) and keyed by FNV-1a(datum_uid) mod S; each
shard joins ground truth and each model's predictions and scores every datum
(transforms/kernels/text.py). The per-datum score rows go to one part file per shard
(sorted), merged into scores.jsonl by one streaming k-way merge, so their order is the same for
any shard or worker count; the states per (model, slice) are merged by transforms.merge.combine_states
and turned into records by the kernel's state_records.

Bootstrap (job.bootstrap / EvaluateText(bootstrap=...)): each shard draws the Poisson weights of
its datums once (kernels.bootstrap, keyed by FNV-1a of the datum_uid), the kernels note each
datum's column beside its scores, and the states are sealed (one weighted product per metric)
before they leave the shard; the records carry the internal replicate fields, which transforms.uncertainty turns into
intervals (one per field for the dict values of ROUGE, CorpusBLEU and the rule evaluators).
"""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pyarrow as pa

from evalbeam.schemas.hashing import fnv1a_64, uid_shards
from evalbeam.schemas.limits import MAX_TEXT_CHARS
from evalbeam.schemas.slices import canonical_json
from evalbeam.schemas.text_rows import GroundTruthRow, PredictionRow, text_rows
from evalbeam.transforms.graph import (TAG_OUTCOMES, TAG_PRESENCE, EvaluateFiles, EvaluateRows,
                                       MatchContext, TaskGraph)
from evalbeam.transforms.io import (GROUNDTRUTHS, TAG_STATS, ParsedRows, ProgressDoFn, ReadRowFile,
                                    RowsFromDicts, created_whole, join, merge_sorted_parts,
                                    reject_row, unique_by_source, unique_rows)
from evalbeam.transforms.judge.metrics import JUDGE_METRICS
from evalbeam.transforms.judge.report import judge_problems, judge_report
from evalbeam.transforms.judge.session import merge_counters
from evalbeam.transforms.kernels.bertscore import add_counts
from evalbeam.transforms.kernels.bootstrap import record_identity
from evalbeam.transforms.kernels.text import (LOCAL_METRICS, TextConfig, TextState, score_datum,
                                              state_records)

TAG_SCORES = "scores"
TAG_JUDGE = "judge_stats"


def score_sort_key(row: dict):
    """Rows sort by the JSON text of datum_uid (what merge_score_parts compares), then model,
    metric and parameters."""
    return (json.dumps(row["datum_uid"], ensure_ascii=False), row["model"], row["metric"],
            canonical_json(row["parameters"]))


def score_line(row: dict) -> str:
    """One scores.jsonl line; datum_uid first (merge_score_parts reads it from the raw line)."""
    return json.dumps(row, ensure_ascii=False) + "\n"


def row_pieces(parsed: ParsedRows, slice_keys, num_shards, check_condition, check_strings=False,
               max_text_chars=MAX_TEXT_CHARS):
    """Shard pieces (main output) of one source's parsed rows, with rejects and stats (tagged).
    The strings of rows from a PCollection are checked for lone surrogates (check_strings), which
    JSON lines were checked for when parsed."""
    scored = parsed.name != GROUNDTRUTHS
    good, bad = text_rows(parsed.rows, parsed.positions_or_minus_one(), scored, parsed.file_id,
                          slice_keys if not scored else [], check_condition, check_strings,
                          max_text_chars)
    yield from parsed.outcome(bad)
    shards = uid_shards([row.uid for row in good], num_shards).tolist()
    for shard in sorted(set(shards)):
        yield int(shard), (parsed.name, [row for row, s in zip(good, shards) if s == shard])


def _condition_checker(config: TextConfig):
    """A function text -> reason or None when conditions matter (TextMatching, EncodingGuardrail)."""
    if not ({"TextMatching", "EncodingGuardrail"} & set(config.metrics)):
        return None
    from evalbeam.transforms.kernels.rule_metrics import condition_problem

    return condition_problem


class ReadTextFile(ReadRowFile):
    """(source name, file id) -> (shard, (source, [row])) pieces; rejects and stats tagged."""

    def __init__(self, sources, slice_keys, num_shards, config: TextConfig, quiet, started):
        super().__init__(sources, slice_keys, num_shards, quiet, started)
        self.config = config

    def pieces(self, parsed: ParsedRows):
        return row_pieces(parsed, self.slice_keys if parsed.name == GROUNDTRUTHS else [],
                          self.num_shards, _condition_checker(self.config),
                          max_text_chars=self.config.max_text_chars)


class TextRowsFromDicts(RowsFromDicts):
    """(source, [row dict, ...]) batches -> shard pieces, like ReadTextFile for files."""

    def __init__(self, slice_keys, num_shards, config: TextConfig):
        super().__init__(slice_keys, num_shards)
        self.config = config

    def process(self, element):
        source, batch = element
        yield from row_pieces(ParsedRows.of_batch(source, batch), self.keys_of(source),
                              self.num_shards, _condition_checker(self.config),
                              check_strings=True, max_text_chars=self.config.max_text_chars)


class MatchText(ProgressDoFn):
    """(shard, pieces) -> ((model, slice JSON), TextState) per model and slice; score rows to
    scores_dir/part-<shard>.jsonl (then TAG_SCORES: (path, rows)) or, without scores_dir, each
    score row on TAG_SCORES; rejects and stats tagged. scores_dir: context.temp("scores-parts")
    on the command line, None in users' pipelines.

    context.bootstrap (a kernels.bootstrap.Bootstrap, or None: off): the states carry R weighted
    replicates. With context.compare as well, TAG_PRESENCE gets per slice (slice JSON, ("groundtruths"
    | model, uint64 hashes of the shard's datums with a ground truth | a prediction of model)),
    and TAG_OUTCOMES per rule evaluator and slice ((record identity, slice JSON), (model, uint64
    hashes, bool passed)) of the datums its pass rate counts (Evaluated.presence, .outcomes).
    context.presence: TAG_PRESENCE (not TAG_OUTCOMES) even without bootstrap or compare."""

    def __init__(self, config: TextConfig, context: MatchContext):
        super().__init__(context.quiet, context.started)
        self.models = list(context.models)
        self.slice_specs = [tuple(s) for s in context.slices]
        self.config = config
        self.files = context.files
        self.scores_dir = context.temp("scores-parts") if context.temp else None
        self.bootstrap = context.bootstrap
        self.compare = context.compare
        self.presence = context.presence

    def setup(self):
        super().setup()
        self.session = None
        if self.config.judge_settings is not None:
            from evalbeam.transforms.judge.session import JudgeSession

            self.session = JudgeSession(self.config.judge_settings, self.config.journal_root)
            self.session.open()

    def teardown(self):
        if getattr(self, "session", None) is not None:
            self.session.close()

    def _reject(self, source, row, reason: str):
        return reject_row(self.files, source, row, reason)

    def process(self, element, idf=None):
        shard, pieces = element
        pieces = list(pieces)
        self.idf = idf      # the same table for every element; finish_bundle uses it
        outputs: list = []
        truths, predictions = unique_by_source(self.files, pieces, self.models, outputs)
        for model in self.models:
            for uid in sorted(set(predictions[model]) - set(truths)):
                outputs.append(self._reject(model, predictions[model].pop(uid),
                                            "no valid ground truth for this datum_uid"))
        yield from outputs
        for source in [GROUNDTRUTHS, *self.models]:
            n_rows = sum(len(rows) for name, rows in pieces if name == source)
            n_ok = len(truths) if source == GROUNDTRUTHS else len(predictions[source])
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", source), n_ok))
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", source), n_rows - n_ok))
        states: dict = {}
        score_rows: list = []
        judged: list = []
        uids = sorted(truths)
        hashes = weights = None
        if self.bootstrap is not None or self.presence:
            hashes = fnv1a_64(pa.array(uids, pa.string()))
        if self.bootstrap is not None:
            # one weight per (replicate, datum), drawn once per shard; column = position in uids
            weights = self.bootstrap.weights(hashes)
        members: dict = {}   # (source, slice JSON) -> columns, for the presence output
        for column, uid in enumerate(uids):
            truth: GroundTruthRow = truths[uid]
            groups = ["{}"] + [canonical_json({k: json.loads(truth.slices[k]) for k in spec})
                               for spec in self.slice_specs]
            if self.presence:
                for group in groups:
                    members.setdefault((GROUNDTRUTHS, group), []).append(column)
            noted = column if weights is not None else None
            for model in self.models:
                prediction: PredictionRow | None = predictions[model].get(uid)
                targets = [states.setdefault((model, group), TextState()) for group in groups]
                score_rows.extend(score_datum(self.config, truth, prediction, model, targets, noted))
                if self.session is not None:
                    judged.append((truth, prediction, model, targets, noted))
                if self.presence and prediction is not None:
                    for group in groups:
                        members.setdefault((model, group), []).append(column)
        for (source, group), columns in sorted(members.items()):
            yield beam.pvalue.TaggedOutput(TAG_PRESENCE, (group, (source, hashes[np.asarray(columns)])))
        if judged:
            # judged at the end of the bundle, together with the bundle's other shards
            self.pending.append((shard, states, score_rows, judged, hashes, weights))
            return
        yield from self._shard_outputs(shard, states, score_rows, hashes, weights)

    def start_bundle(self):
        self.pending = []   # (shard, states, score rows, judged datums) waiting for the judge

    def finish_bundle(self):
        """Judge the datums of every shard of the bundle at once, then emit what process() emits
        for a shard without judge metrics. One shard at a time would wait for each shard's
        slowest retry chain before starting the next shard's calls."""
        if not self.pending:
            return
        from evalbeam.transforms.judge.judged_text import judge_datums
        from evalbeam.transforms.meters import in_global_window

        pending, self.pending = self.pending, []
        judged_rows = judge_datums(self.session, self.config, [p[3] for p in pending], self.idf)

        def windowed(output):
            if isinstance(output, beam.pvalue.TaggedOutput):
                return beam.pvalue.TaggedOutput(output.tag, in_global_window(output.value))
            return in_global_window(output)

        for (shard, states, score_rows, _, hashes, weights), rows in zip(pending, judged_rows):
            score_rows.extend(rows)
            for output in self._shard_outputs(shard, states, score_rows, hashes, weights):
                yield windowed(output)
        yield windowed(beam.pvalue.TaggedOutput(TAG_JUDGE, self.session.take_stats()))

    def _shard_outputs(self, shard, states: dict, score_rows: list, hashes=None, weights=None):
        """The score part (or rows) and the partial states of one scored shard; with bootstrap
        weights (uint8[R, n], the columns of hashes), the rule outcomes (when comparing) and the
        states sealed."""
        score_rows.sort(key=score_sort_key)
        if self.scores_dir is not None:
            path = join(self.scores_dir, f"part-{shard:05d}.jsonl")
            with created_whole(path) as out:
                out.write("".join(score_line(r) for r in score_rows).encode("utf-8"))
            yield beam.pvalue.TaggedOutput(TAG_SCORES, (path, len(score_rows)))
        else:
            for row in score_rows:
                yield beam.pvalue.TaggedOutput(TAG_SCORES, row)
        if weights is not None:
            for (model, group), state in sorted(states.items()):
                if self.compare:
                    yield from rule_outcomes(model, group, state, hashes)
                state.seal(weights)
        for key in sorted(states):
            yield key, states[key]
        self.progress.say("match", f"scored shard {shard}")


# The parameters that name the "pass" field of a rule record's value in a comparison: a record
# whose value is an object is compared field by field, each field named by the record's
# parameters plus {"field": name} (the identity of its outcomes for McNemar's test)
PASS_FIELD = {"field": "pass"}


def rule_outcomes(model: str, group: str, state: TextState, hashes: np.ndarray):
    """TAG_OUTCOMES of one unsealed state: per rule evaluator, ((identity of its pass rate, slice
    JSON), (model, uint64 hashes, bool passed)) of the datums its rates count (parse failures
    included, as not passed), for McNemar's test of the pass rates. The identity is
    record_identity(type, {"field": "pass"}): the record's parameters ({}) and the field."""
    from evalbeam.transforms.kernels.rule_metrics import COUNT_FIELDS, RuleState

    passed_index = COUNT_FIELDS.index("passed")
    for kind, rule in sorted(state.rules.items()):
        if not isinstance(rule, RuleState) or not rule.notes:
            continue
        columns = np.array([column for column, _, _ in rule.notes], np.int64)
        passed = np.array([counts[passed_index] == 1 for _, counts, _ in rule.notes], bool)
        yield beam.pvalue.TaggedOutput(TAG_OUTCOMES, ((record_identity(kind, PASS_FIELD), group),
                                                      (model, hashes[columns], passed)))


def merge_score_parts(parts: list, path: str) -> int:
    """Merge the sorted part files [(path, rows)] into scores.jsonl; returns the rows."""
    return merge_sorted_parts(parts, path, "datum_uid")


def idf_encoder(config: TextConfig) -> str | None:
    """The BERTScore encoder's folder when its idf weights are asked (--bertscore_idf), else None."""
    judge = config.judge
    if judge is None or not judge.bertscore_idf or "BERTScore" not in config.metrics:
        return None
    return next(uri for metric, uri, _ in judge.classifiers if metric == "BERTScore")


def shard_reference_counts(element, encoder: str) -> tuple[int, dict]:
    """(shard, pieces) -> the references' token counts of its ground truths (local_encoder.
    reference_counts): a datum_uid repeated in the shard is left out, as MatchText rejects it,
    and all copies of a uid share its shard, so the sum over shards is the dataset's."""
    from evalbeam.transforms.judge.local_encoder import reference_counts

    _, pieces = element
    truths = unique_rows([row for source, rows in pieces if source == GROUNDTRUTHS for row in rows],
                         lambda row, copies: None)
    return reference_counts(encoder, [ref for uid in sorted(truths) for ref in truths[uid].references or ()])


# every metric type, in the order of metrics.jsonl
RECORD_ORDER = LOCAL_METRICS + JUDGE_METRICS


def record_sort_key(record: dict):
    """model, slice, type, then parameters."""
    return (record["model"], len(record["slice"]), json.dumps(record["slice"], sort_keys=True),
            RECORD_ORDER.index(record["type"]), json.dumps(record["parameters"], sort_keys=True))


class TextGraph(TaskGraph):
    """Text in the one graph (transforms/graph.py). Side state: with --bertscore_idf, the
    document frequencies of every reference's tokens (idf_encoder), counted from the grouped
    shards before any datum is scored ("idf"). The matcher's own outputs: per-datum score rows
    (TAG_SCORES; part files merged into scores.jsonl on the command line) and the judge's
    counters (TAG_JUDGE; run.json's "judge" report). Problems: the checks before the run found
    (config.model_problems) and, with judge metrics, the judge's failures
    (transforms.judge.report), decided by the status counts of the whole dataset's judge
    records. Users' pipelines get the score rows as Diagnosed.extra["scores"]."""

    name = "text"
    match_tags = (TAG_SCORES, TAG_JUDGE)
    match_sides = ("idf",)
    record_order = RECORD_ORDER
    state_records = staticmethod(state_records)

    def file_reader(self, config, context, sources):
        return ReadTextFile(sources, context.slice_keys, context.num_shards, config,
                            context.quiet, context.started)

    def rows_reader(self, config, context):
        return TextRowsFromDicts(context.slice_keys, context.num_shards, config)

    def side_states(self, pbegin, read, shards, config, context):
        encoder = idf_encoder(config)
        if encoder is None:
            return {}
        # BERTScore's idf needs every reference of the dataset before any datum is scored
        return {"idf": beam.pvalue.AsSingleton(
            shards
            | "ReferenceTokens" >> beam.Map(shard_reference_counts, encoder)
            | "DocumentFrequency" >> beam.CombineGlobally(add_counts))}

    def matcher(self, config, context):
        return MatchText(config, context)

    def report(self, stages, config, context):
        if config.judge is None:
            return None
        return (stages.matched[TAG_JUDGE]
                | "JudgeStats" >> beam.CombineGlobally(merge_counters)
                | "JudgeReport" >> beam.Map(lambda c: {"judge": judge_report(c)}))

    def problems(self, stages, config, context):
        # the checks before the run found these (config.model_problems)
        found = stages.pbegin | "ModelProblems" >> beam.Create(list(config.model_problems))
        if stages.report is None:
            return found
        # the judge metrics' records of the whole dataset: their status counts decide the status
        judged = stages.merged.records | "JudgedRecords" >> beam.Filter(
            lambda record: "counts" in record and record["slice"] == {})
        problems = stages.report | "JudgeProblems" >> beam.FlatMap(
            lambda r, records, allowed: judge_problems(list(records), allowed,
                                                       r["judge"]["error_samples"]),
            beam.pvalue.AsList(judged), config.judge_max_failed_fraction)
        return (problems, found) | "AllProblems" >> beam.Flatten()

    def extra_outputs(self, stages, config, context):
        if context.temp is None:
            return {}
        return {"scores.jsonl": (
            stages.matched[TAG_SCORES]
            | "GatherScoreParts" >> beam.combiners.ToList()
            | "MergeScores" >> beam.Map(merge_score_parts, context.temp("scores.jsonl")))}

    def diagnostics(self, stages):
        return {"scores": stages.matched[TAG_SCORES]}

    record_sort_key = staticmethod(record_sort_key)


class EvaluateTextFiles(EvaluateFiles):
    """Text row files (job.sources) -> Evaluated (transforms/graph.py, TextGraph): per-datum
    scores in job.temp("scores.jsonl"), the judge's report and problems."""

    graph = TextGraph()


class EvaluateText(EvaluateRows):
    """Text metrics for a user's own pipeline (transforms.graph.EvaluateRows); with
    with_diagnostics=True, Diagnosed.extra["scores"] holds the per-datum score rows."""

    graph = TextGraph()
    default_config = TextConfig
