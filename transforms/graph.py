"""The one evaluation graph: Read -> GroupByShard -> Match -> MergeStates -> Records, for every task.

A task plugs in by subclassing `TaskGraph` in transforms/<task>.py (the way a Beam
`ModelHandler` plugs into RunInference: the task overrides methods, this module owns the graph).
What a task must give: a reader of its files and one of row dicts (both DoFns that emit shard
pieces), a matcher (the DoFn that joins one shard's pieces and fills partial states) and its
`record_order`. Everything else has a default: no side states, `merged_records` with the
kernel's `state_records`, no problems, no extra outputs, no report.

    pieces      (shard, (source, rows))                     readers' main output
    partials    ((model, slice JSON), partial state)        the matcher's main output
    presence    (slice JSON, (source, uint64[n] datum hashes))
    outcomes    ((record identity, slice JSON), (model, uint64[n] hashes, bool[n] correct))
    rejected    rejection dicts (schemas/rejections.py)
    stats       ((counter, source), n) and the shuffle meters ((meter, stage), n)

A matcher is built as `Matcher(config, context)` from a `MatchContext`, and tags its outputs
with TAG_REJECTED, TAG_STATS, TAG_PRESENCE (when context.presence), TAG_OUTCOMES (when
context.compare; tasks with per-datum correctness) and its task's own `match_tags`. Side states
(a task's vocabularies, categories, label sets, idf counts) are PCollections the task builds in
`side_states`; the ones named in `match_sides` reach the matcher's process() as keyword side
inputs of the same name.

`EvaluateFiles` is the launcher's job on files (transforms.evaluated.FilesJob -> Evaluated);
`EvaluateRows` is the users' PTransform on PCollections of row dicts. Both run `evaluate`.
"""

from __future__ import annotations

import typing
from typing import Any, Callable, NamedTuple

import apache_beam as beam

from evalbeam.transforms.evaluated import Evaluated
from evalbeam.transforms.grouping import group_by_shard
from evalbeam.transforms.io import (GROUNDTRUTHS, TAG_REJECTED, TAG_STATS, ReadFiles,
                                    read_pcollections)
from evalbeam.transforms.merge import merged_records

TAG_PRESENCE = "presence"
TAG_OUTCOMES = "outcomes"

# ((model, slice JSON), partial state): what a matcher emits and MergeStates adds up
PARTIAL = typing.Tuple[typing.Tuple[str, str], typing.Any]
# (slice JSON, (source, uint64[n] datum hashes)): the datums each side of a comparison holds
PRESENCE = typing.Tuple[str, typing.Tuple[str, typing.Any]]
# ((record identity, slice JSON), (model, uint64[n] datum hashes, bool[n] correct))
OUTCOME = typing.Tuple[typing.Tuple[str, str], typing.Tuple[str, typing.Any, typing.Any]]


class MatchContext(NamedTuple):
    """What a matcher (and the task's other steps) know of the run besides the task's config.

    models: model names, sorted; slices: tuples of ground-truth metadata keys; files: {source:
    file paths} (for rejection records; {} for PCollections); quiet, started: progress lines;
    num_shards: datum shards; bootstrap: a kernels.bootstrap.Bootstrap with replicates, or None;
    compare: paired comparisons asked (bootstrap and a compare_to model): outcomes are emitted;
    presence: presence is emitted (compare, or asked by the sweep's fingerprints); layout: a
    multi-dataset job's {dataset: (first shard, shard count)}, or None; temp(name): where the
    task writes scratch and extra outputs, or None (users' pipelines write no files); read:
    what the task read while the graph was built (retrieval's query slices), or None."""

    models: tuple
    slices: tuple = ()
    files: dict = {}
    quiet: bool = True
    started: float = 0.0
    num_shards: int = 16
    bootstrap: Any = None
    compare: bool = False
    presence: bool = False
    layout: Any = None
    temp: Callable[[str], str] | None = None
    read: Any = None

    @property
    def slice_keys(self) -> list[str]:
        return sorted({key for spec in self.slices for key in spec})

    @classmethod
    def of_job(cls, job) -> "MatchContext":
        """The context of a launcher's FilesJob."""
        boot = job.bootstrap if job.bootstrap is not None and job.bootstrap.enabled else None
        compare = boot is not None and job.compare_to is not None
        return cls(tuple(job.models), tuple(tuple(s) for s in job.slices),
                   {name: source.files for name, source in job.sources.items()}, job.quiet,
                   job.started, job.num_shards, boot, compare, compare or bool(job.presence),
                   job.layout, job.temp)


class Read(NamedTuple):
    """A task's reading: pieces (shard, (source, rows)), rejected, stats, and {tag: PCollection}
    of the reader's own tagged outputs (TaskGraph.read_tags)."""

    pieces: Any
    rejected: Any
    stats: Any
    tagged: dict = {}

    @classmethod
    def of(cls, result, tags: tuple) -> "Read":
        """From a ParDo's tagged result: main output "pieces", TAG_REJECTED, TAG_STATS, tags."""
        return cls(result.pieces, result[TAG_REJECTED], result[TAG_STATS],
                   {tag: result[tag] for tag in tags})


class Merged(NamedTuple):
    """MergeStates' outcome: records (without intervals), meters (its shuffle meters, stats
    pairs) and states ((model, slice JSON), merged state), or None where the task's merge
    does not keep them as one PCollection."""

    records: Any
    meters: Any
    states: Any = None


class Stages(NamedTuple):
    """The graph's PCollections so far, as the task's later hooks (problems, extra_outputs,
    report, diagnostics) see them: pbegin (the pipeline), read (Read), shards (the grouped
    pieces), sides (side_states), matched (the matcher's tagged result), merged (Merged), report
    (what TaskGraph.report gave, or None)."""

    pbegin: Any
    read: Read
    shards: Any
    sides: dict
    matched: Any
    merged: Merged
    report: Any = None


class TaskGraph:
    """One task's part of the graph. Subclasses live in transforms/<task>.py; the class
    attributes and methods below are the whole contract (defaults are noted)."""

    name: str = ""
    read_tags: tuple = ()        # a reader's tagged outputs besides TAG_REJECTED and TAG_STATS
    match_tags: tuple = ()       # a matcher's own tagged outputs (e.g. text's scores)
    match_sides: tuple = ()      # side_states handed to the matcher's process() by name
    interval_unit: str = "datum"  # what one bootstrap weight is drawn for
    record_order: tuple = ()     # every metric type the task writes, in metrics.jsonl's order
    default_metrics: tuple | None = None   # the types computed by default (None: every type)
    state_records: Callable | None = None   # the kernel's state_records(state, config, side)
    records_side: str | None = None   # the side state state_records reads (None: no side)
    records_by_model: bool = False    # that side state is {model: value}

    # -- reading
    def file_reader(self, config, context: MatchContext, sources: dict) -> beam.DoFn:
        """A DoFn of (source name, file id) -> pieces and tagged outputs (transforms.io.ReadFiles);
        sources: {name: transforms.io.Source}."""
        raise NotImplementedError

    def rows_reader(self, config, context: MatchContext) -> beam.DoFn:
        """A DoFn of (source name, [row dict, ...]) -> pieces and tagged outputs."""
        raise NotImplementedError

    def read_files(self, pbegin, config, context: MatchContext, sources: dict) -> Read:
        tags = (TAG_REJECTED, TAG_STATS) + tuple(self.read_tags)
        reader = self.file_reader(config, context, sources)
        read = pbegin | "ReadFiles" >> ReadFiles(sources, reader, tags)
        return Read.of(read, self.read_tags)

    def read_rows(self, pcolls: dict, config, context: MatchContext, batch_size: int) -> Read:
        tags = (TAG_REJECTED, TAG_STATS) + tuple(self.read_tags)
        _, read = read_pcollections(pcolls, batch_size, self.rows_reader(config, context), tags,
                                    f"Evaluate{self.name.capitalize()}")
        return Read.of(read, self.read_tags)

    # -- the run's shape
    def prepare(self, config, context: MatchContext, sources: dict | None):
        """(config, context) for this run: a task may set what its config takes from the run
        (the bootstrap) or read what the graph needs before it is built (context.read).
        sources: the job's Sources, or None for users' PCollections."""
        return config, context

    def side_states(self, pbegin, read: Read, shards, config, context: MatchContext) -> dict:
        """{name: PCollection or side-input view} built before matching; default none."""
        return {}

    # -- matching and merging
    def matcher(self, config, context: MatchContext) -> beam.DoFn:
        raise NotImplementedError

    def merge(self, partials, sides: dict, config, spill_dir: str | None) -> Merged:
        """The partial states merged per (model, slice) and read into records; default
        merged_records with the kernel's state_records(state, config, sides[records_side])."""
        side = sides[self.records_side] if self.records_side else None
        return Merged(*merged_records(partials, type(self).state_records, config, side,
                                      self.records_by_model, spill_dir))

    # -- what else the run reports
    def report(self, stages: Stages, config, context: MatchContext):
        """A PCollection of one dict merged into run.json, or None."""
        return None

    def problems(self, stages: Stages, config, context: MatchContext):
        """A PCollection of problem dicts (transforms.outputs.problem), or None."""
        return None

    def extra_outputs(self, stages: Stages, config, context: MatchContext) -> dict:
        """{file name: PCollection of its one row count} for files written at context.temp."""
        return {}

    def diagnostics(self, stages: Stages) -> dict:
        """What users' PTransforms return beside records, rejected and stats ({name:
        PCollection})."""
        return {}

    # -- order
    def record_sort_key(self, record: dict):
        raise NotImplementedError

    @property
    def metric_types(self) -> tuple:
        """Every record type the task can write (gates check names against it)."""
        return tuple(self.record_order)

    @property
    def default_metric_types(self) -> tuple:
        """The record types a run writes when its options ask for no others."""
        return tuple(self.default_metrics or self.record_order)


def evaluate(graph: TaskGraph, pbegin, read: Read, config, context: MatchContext,
             spill_dir: str | None = None):
    """The one graph after reading: (Evaluated, Stages). Pieces are grouped by shard
    (grouping.group_by_shard, spilled to spill_dir when given), matched, merged per (model,
    slice) into records; rejections and stats of reading and matching are flattened together."""
    shards, shard_meter = group_by_shard(read.pieces, spill_dir)
    sides = graph.side_states(pbegin, read, shards, config, context)
    matched = (shards
               | "Match" >> beam.ParDo(graph.matcher(config, context),
                                       **{name: sides[name] for name in graph.match_sides
                                          if name in sides})
               .with_output_types(PARTIAL)
               .with_outputs(TAG_REJECTED, TAG_STATS, TAG_PRESENCE, TAG_OUTCOMES,
                             *graph.match_tags, main="partials"))
    merged = graph.merge(matched.partials, sides, config, spill_dir)
    stages = Stages(pbegin, read, shards, sides, matched, merged)
    stages = stages._replace(report=graph.report(stages, config, context))
    problems = graph.problems(stages, config, context)
    if problems is None:
        problems = pbegin | "NoProblems" >> beam.Create([])
    rejected = (read.rejected, matched[TAG_REJECTED]) | "Rejected" >> beam.Flatten()
    stats = ((read.stats, matched[TAG_STATS], shard_meter, merged.meters)
             | "AllStats" >> beam.Flatten())
    evaluated = Evaluated(
        merged.records, rejected, stats, problems,
        graph.extra_outputs(stages, config, context), stages.report,
        matched[TAG_PRESENCE] if context.presence else None,
        matched[TAG_OUTCOMES] if context.compare else None)
    return evaluated, stages


class EvaluateFiles(beam.PTransform):
    """A task's job on files: (graph, config, job) -> Evaluated, what the launcher writes. A
    task's Evaluate<Task>Files subclass names its graph (class attribute `graph`)."""

    graph: TaskGraph = None

    def __init__(self, config, job):
        super().__init__()
        self.config, self.context = self.graph.prepare(config, MatchContext.of_job(job),
                                                       job.sources)
        self.sources = job.sources
        self.spill_dir = job.temp("pieces")

    def expand(self, pbegin):
        read = self.graph.read_files(pbegin, self.config, self.context, self.sources)
        evaluated, _ = evaluate(self.graph, pbegin, read, self.config, self.context, self.spill_dir)
        return evaluated


class Diagnosed(NamedTuple):
    """What an Evaluate<Task> with with_diagnostics=True returns: metrics (records with their
    intervals), rejected, stats (row counters only, which add up with `sum`) and {name:
    PCollection} of what else the task gives (text: "scores", the per-datum score rows)."""

    metrics: Any
    rejected: Any
    stats: Any
    extra: dict = {}


class EvaluateRows(beam.PTransform):
    """A task's metrics on a dict of PCollections of row dicts, {"groundtruths": ..., "<model
    name>": ...}, for users' own pipelines; every task's Evaluate<Task> is one with its graph.

    config: the task's configuration (default: the task's default config); slices: tuples of
    ground-truth metadata keys (as --slice); num_shards: datum shards; batch_size: rows per
    batch on their way into shard pieces; with_diagnostics: return a Diagnosed instead of the
    records alone; bootstrap: a kernels.bootstrap.Bootstrap (intervals on every scalar record
    when its replicates > 0); compare_to: a model name: also Comparison records of every other
    model against it (needs bootstrap). Output: a PCollection of metric records {"type",
    "value", "parameters", "model", "slice"}, as the command's metrics.jsonl for the same rows."""

    graph: TaskGraph = None
    default_config: Callable = None

    def __init__(self, config=None, slices=(), num_shards: int = 16, batch_size: int = 1000,
                 with_diagnostics: bool = False, bootstrap=None, compare_to: str | None = None):
        super().__init__()
        from evalbeam.transforms.kernels.bootstrap import Bootstrap

        self.config = config if config is not None else type(self).default_config()
        self.slices = [tuple(s) for s in slices]
        self.num_shards = num_shards
        self.batch_size = batch_size
        self.with_diagnostics = with_diagnostics
        self.bootstrap = bootstrap or Bootstrap()
        self.compare_to = compare_to
        if compare_to is not None and not self.bootstrap.enabled:
            raise ValueError("compare_to needs bootstrap replicates "
                             "(Bootstrap(replicates=R), R > 0)")

    def expand(self, pcolls):
        from evalbeam.transforms.meters import is_row_counter
        from evalbeam.transforms.uncertainty import Uncertainty

        name = type(self).__name__
        if GROUNDTRUTHS not in pcolls:
            raise ValueError(f"{name} needs a {GROUNDTRUTHS!r} PCollection")
        boot = self.bootstrap if self.bootstrap.enabled else None
        compare = boot is not None and self.compare_to is not None
        context = MatchContext(tuple(sorted(n for n in pcolls if n != GROUNDTRUTHS)),
                               tuple(self.slices), {}, num_shards=self.num_shards, bootstrap=boot,
                               compare=compare, presence=compare)
        config, context = self.graph.prepare(self.config, context, None)
        read = self.graph.read_rows(pcolls, config, context, self.batch_size)
        evaluated, stages = evaluate(self.graph, pcolls[GROUNDTRUTHS].pipeline, read, config,
                                     context)
        records = (Uncertainty.inputs(evaluated.metrics, evaluated.presence, evaluated.outcomes)
                   | "Uncertainty" >> Uncertainty(self.bootstrap, self.graph.interval_unit,
                                                  self.compare_to))
        if not self.with_diagnostics:
            return records
        stats = evaluated.stats | "RowCounters" >> beam.Filter(is_row_counter)
        return Diagnosed(records, evaluated.rejected, stats, self.graph.diagnostics(stages))
