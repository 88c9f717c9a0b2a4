"""What every task's file PTransform takes and returns: the contract between a task's Beam
plumbing (transforms/<task>.py) and the one launcher (pipelines/launcher.py).

A task's `Evaluate<Task>Files(config, job)` reads the files of `job.sources`, evaluates them and
returns an `Evaluated`; the launcher writes metrics.jsonl and rejected.jsonl from it, publishes
the outputs and run.json, and turns the run's status into an exit code. See pipelines/DESIGN.md.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class FilesJob(NamedTuple):
    """Everything about one run that is not the task's own configuration.

    sources: {"groundtruths" | model name: transforms.io.Source} (expanded, checked files);
    models: model names, sorted; slices: tuples of metadata keys; num_shards: datum shards;
    quiet: no progress lines; started: the run's start (time.time()); temp(name): where the
    task writes an extra output (e.g. "scores.jsonl") or scratch files before publishing."""

    sources: dict
    models: tuple
    slices: tuple
    num_shards: int
    quiet: bool
    started: float
    temp: Callable[[str], str]


class Evaluated(NamedTuple):
    """The PCollections a task's file PTransform returns.

    metrics: metric records {"type", "value", "parameters", "model", "slice"};
    rejected: rejection dicts {"source", "file", "line" | "row", "reason"};
    stats: ((counter, source name), n) pairs, counters rows_read / rows_evaluated /
      rows_rejected (the launcher checks that they add up);
    problems: problem dicts (transforms.outputs.problem) the task found;
    extra: {output file name: PCollection of the one row count of that file}, for files the
      task wrote itself at job.temp(name) (scores.jsonl, per_query.jsonl);
    report: None, or a PCollection of one dict merged into run.json (text: "judge")."""

    metrics: Any
    rejected: Any
    stats: Any
    problems: Any
    extra: dict = {}
    report: Any = None
