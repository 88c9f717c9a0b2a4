"""What every task's file PTransform takes and returns: the contract between a task's Beam
plumbing (transforms/<task>.py) and the one launcher (pipelines/launcher.py).

A task's `Evaluate<Task>Files(config, job)` reads the files of `job.sources`, evaluates them and
returns an `Evaluated`; the launcher writes metrics.jsonl and rejected.jsonl from it, publishes
the outputs and run.json, and turns the run's status into an exit code. See pipelines/DESIGN.md.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import apache_beam as beam


class FilesJob(NamedTuple):
    """Everything about one run that is not the task's own configuration.

    sources: {"groundtruths" | model name: transforms.io.Source} (expanded, checked files);
    models: model names, sorted; slices: tuples of metadata keys; num_shards: datum shards;
    quiet: no progress lines; started: the run's start (time.time()); temp(name): where the
    task writes an extra output (e.g. "scores.jsonl") or scratch files before publishing;
    bootstrap: transforms.kernels.bootstrap.Bootstrap, the replicates the task's kernels weigh
    (replicates 0: none); compare_to: the baseline model of the paired comparisons, or None;
    presence: return Evaluated.presence even without compare_to or replicates (the sweep's
    datum fingerprints, pipelines/leaderboard.py); the metrics do not change. layout: None, or
    {dataset: (first shard, shard count)} for a job over several datasets whose source names
    are qualified by their dataset (transforms.io.qualified; a sweep's group of cells, only for
    tasks with TaskSpec.separable_models)."""

    sources: dict
    models: tuple
    slices: tuple
    num_shards: int
    quiet: bool
    started: float
    temp: Callable[[str], str]
    bootstrap: Any = None
    compare_to: Any = None
    presence: bool = False
    layout: Any = None


class Evaluated(NamedTuple):
    """The PCollections a task's file PTransform returns.

    metrics: metric records {"type", "value", "parameters", "model", "slice"};
    rejected: rejection dicts {"source", "file", "line" | "row", "reason"};
    stats: ((counter, source name), n) pairs, counters rows_read / rows_evaluated /
      rows_rejected (the launcher checks that they add up), and the shuffle meters of
      transforms/meters.py ((meter, stage), n), which become run.json's "shuffles";
    problems: problem dicts (transforms.outputs.problem) the task found;
    extra: {output file name: PCollection of the one row count of that file}, for files the
      task wrote itself at job.temp(name) (scores.jsonl, per_query.jsonl);
    report: None, or a PCollection of one dict merged into run.json (text: "judge");
    presence: None, or a PCollection of (slice JSON, (source, uint64[n] datum hashes)): the
      datums of a slice that have a ground truth (source "groundtruths") or at least one
      prediction of a model (source = model name); the paired comparisons count from it the
      datums one model lacks (transforms.uncertainty);
    outcomes: None, or a PCollection of ((record identity, slice JSON), (model, uint64[n]
      datum hashes, bool[n] correct)): per-datum correctness behind a record
      (kernels.bootstrap.record_identity), for McNemar's test (classification Accuracy, text
      rule pass/fail).

    Metric records may carry the internal fields kernels.bootstrap.REPLICATES and PROPORTION;
    transforms.uncertainty.Uncertainty turns them into intervals and removes them."""

    metrics: Any
    rejected: Any
    stats: Any
    problems: Any
    extra: dict = {}
    report: Any = None
    presence: Any = None
    outcomes: Any = None


class EvaluateRows(beam.PTransform):
    """What every Evaluate<Task> (a task's metrics on a dict of PCollections of row dicts, for
    users' own pipelines) takes besides its own options: config, the task's configuration;
    slices, tuples of ground-truth metadata keys (as --slice); num_shards, the datum shards;
    batch_size, rows per batch on their way into shard pieces; with_diagnostics, also return
    the rejections and the counters; bootstrap, a kernels.bootstrap.Bootstrap (intervals on
    every scalar record when its replicates > 0); compare_to, a model name: also Comparison
    records of every other model against it (needs bootstrap). A subclass ends its expand with
    self.uncertain(records, presence, outcomes)."""

    def __init__(self, config=None, slices=(), num_shards: int = 16, batch_size: int = 1000,
                 with_diagnostics: bool = False, bootstrap=None, compare_to: str | None = None):
        super().__init__()
        from evalbeam.transforms.kernels.bootstrap import Bootstrap

        self.config = config
        self.slices = [tuple(s) for s in slices]
        self.num_shards = num_shards
        self.batch_size = batch_size
        self.with_diagnostics = with_diagnostics
        self.bootstrap = bootstrap or Bootstrap()
        self.compare_to = compare_to
        if compare_to is not None and not self.bootstrap.enabled:
            raise ValueError("compare_to needs bootstrap replicates (Bootstrap(replicates=R), R > 0)")

    def uncertain(self, records, presence=None, outcomes=None, unit: str = "datum"):
        """records with their intervals (and the Comparison records), internal fields gone."""
        from evalbeam.transforms.uncertainty import Uncertainty

        return Uncertainty.inputs(records, presence, outcomes) | "Uncertainty" >> Uncertainty(
            self.bootstrap, unit, self.compare_to)

    @staticmethod
    def row_counters(stats):
        """stats without the shuffle meters (transforms/meters.py): the diagnostics users get
        hold the row counters only, which add up with `sum`."""
        from evalbeam.transforms.meters import is_row_counter

        return stats | "RowCounters" >> beam.Filter(is_row_counter)

    @property
    def slice_keys(self) -> list[str]:
        return sorted({key for spec in self.slices for key in spec})
