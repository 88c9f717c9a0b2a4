"""The task contract: what a task declares, so that one launcher can run it.

Every task (pipelines/<task>.py) defines one `TaskSpec` named SPEC; pipelines/registry.py lists
them, `evalbeam <task>` and `python -m evalbeam.pipelines.<task>` run them through
pipelines/launcher.py, which does everything that is the same for every task once: the common
arguments and their checks, the inputs, the output folder, the Beam pipeline's writing and
publishing steps, run.json, the printed summary and the exit code. See pipelines/DESIGN.md.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


def _no_extra_outputs(config) -> tuple:
    return ()


def _no_option_files(args) -> tuple:
    return ()


@dataclass(frozen=True)
class TaskSpec:
    """One task, declared.

    name: the command (`evalbeam <name>`); summary: one line for `evalbeam --help`;
    input_help: what --groundtruths / --predictions files are, for --help;
    add_arguments(parser): the task's own options;
    configure(args) -> config: the task's configuration (transforms.kernels.<task>.<Task>Config)
      from the parsed options (args.beam_args: the Beam options); raises pipelines.common.UsageError for a command line that
      cannot run (nothing has been read or written yet);
    options(config, args) -> dict: the task's options as run.json records them;
    check_source(name, source, config, slices): checks one input source before anything is
      written (slices: the --slice key tuples);
      raises transforms.io.InputError;
    transforms: the module of the task's Beam plumbing (evalbeam.transforms.<task>), imported
      only when the task runs. It defines, by these names: Evaluate<Task>Files(config, job), the
      PTransform on files that the launcher applies (returns a transforms.evaluated.Evaluated);
      Evaluate<Task>, the PTransform on PCollections of row dicts for users' own pipelines; and
      record_sort_key(record), the order of metrics.jsonl;
    summarize(metrics_path, info, config) -> str: the table printed after a run (info: run.json);
    extra_outputs(config) -> file names the task writes besides metrics.jsonl, rejected.jsonl
      and run.json (scores.jsonl, per_query.jsonl);
    option_files(args) -> the files the task's own options name and the run reads (a
      --label_names .json, --judge_byop templates): inputs, which the output folder protects;
    min_shards: the fewest datum shards by default; known_formats: inputs must be .jsonl or
      .parquet files (False: the task reads other formats, e.g. TREC files);
    interval_unit: what one bootstrap weight is drawn for ("datum", "image", "query"), as the
      intervals of metrics.jsonl name it;
    separable_models: each model's records of a multi-model run are exactly those of the model
      run alone, and its problems carry their "model": a sweep then runs the cells of one
      dataset as one multi-model graph (pipelines/sweep_cells.py)."""

    name: str
    summary: str
    input_help: str
    add_arguments: Callable
    configure: Callable
    options: Callable
    check_source: Callable
    transforms: str
    summarize: Callable
    extra_outputs: Callable = _no_extra_outputs
    option_files: Callable = _no_option_files
    min_shards: int = 1
    known_formats: bool = True
    interval_unit: str = "datum"
    separable_models: bool = False

    def plumbing(self):
        return importlib.import_module(self.transforms)

    @property
    def title(self) -> str:
        return self.name.capitalize()

    def files_transform(self):
        """Evaluate<Task>Files, the class."""
        return getattr(self.plumbing(), f"Evaluate{self.title}Files")

    def pcollection_transform(self):
        """Evaluate<Task>, the class."""
        return getattr(self.plumbing(), f"Evaluate{self.title}")

    def run(self, argv: list[str] | None = None) -> int:
        """The task's command line (argv, default sys.argv[1:]) run to its exit code."""
        from evalbeam.pipelines.launcher import run_task

        return run_task(self, argv)

    def main(self) -> None:
        """`python -m evalbeam.pipelines.<task>`."""
        from evalbeam.pipelines.launcher import main_of

        main_of(self)
