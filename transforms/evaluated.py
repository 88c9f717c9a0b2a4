"""What the one graph (transforms/graph.py) takes from the launcher and returns to it.

A task's `Evaluate<Task>Files(config, job)` (a transforms.graph.EvaluateFiles) reads the files of
`job.sources`, evaluates them and returns an `Evaluated`; the launcher writes metrics.jsonl and
rejected.jsonl from it, publishes the outputs and run.json, and turns the run's status into an
exit code. See pipelines/DESIGN.md.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple



class FilesJob(NamedTuple):
    """Everything about one run that is not the task's own configuration.

    sources: {"groundtruths" | model name: transforms.io.Source} (expanded, checked files);
    models: model names, sorted; slices: tuples of metadata keys; num_shards: datum shards;
    quiet: no progress lines; started: the run's start (time.time()); temp(name): where the
    task writes an extra output (e.g. "scores.jsonl") or scratch files before publishing;
    bootstrap: transforms.kernels.bootstrap.Bootstrap, the replicates the task's kernels weigh
    (replicates 0: none); compare_to: the baseline model of the paired comparisons, or None;
    presence: return Evaluated.presence even without compare_to or replicates (the sweep's
    datum fingerprints, pipelines/sweep/leaderboard.py); the metrics do not change. layout: None, or
    {dataset: (first shard, shard count)} for a job over several datasets whose source names
    are qualified by their dataset (transforms.io.qualified; a sweep's group of cells, only for
    tasks with Task.separable_models)."""

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
