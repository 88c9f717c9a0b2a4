"""The task contract: what a task declares so that one launcher, one graph, the report and the
sweep can run it.

Each task is a `Task` subclass in pipelines/tasks/<task>.py with one instance named TASK;
pipelines/tasks/registry.py lists them. The class owns the command-side facts of its task (its
options and config, checks of its inputs, the printed summary, the report's blocks, the
leaderboard's headlines, its extra outputs); the Beam side is its graph plug-in, a
transforms.graph.TaskGraph in transforms/<task>.py (record order, metric types, interval unit,
reading, matching, merging), which the Task reaches through `graph`. The launcher
(pipelines/launch/launcher.py) does everything that is the same for every task. See
pipelines/DESIGN.md.
"""

from __future__ import annotations

import importlib


class Task:
    """One task. Class attributes (override them):

    name: the command (`evalbeam <name>`); summary: one line for `evalbeam --help`; input_help:
    what --groundtruths / --predictions files are, for --help; plumbing: the module of the
    task's Beam plumbing (evalbeam.transforms.<task>), imported only when the task runs; it
    defines Evaluate<Task>Files (the launcher's PTransform, whose `graph` is the task's
    TaskGraph) and Evaluate<Task> (users' PTransform on PCollections); min_shards: the fewest
    datum shards by default; known_formats: inputs must be .jsonl or .parquet files (False: the
    task reads other formats too, e.g. TREC files); separable_models: each model's records of a
    multi-model run are exactly those of the model run alone, and its problems carry their
    "model", so a sweep runs the cells of one dataset as one multi-model graph
    (pipelines/sweep/cells.py); headlines: the leaderboard's default headline metrics, best
    first (TYPE, TYPE.FIELD, TYPE[param=value,...]; pipelines/sweep/leaderboard.py).

    Methods with no default raise NotImplementedError; the others are documented where they
    are defined."""

    name: str = ""
    summary: str = ""
    input_help: str = ".jsonl or .parquet rows"
    plumbing: str = ""
    min_shards: int = 1
    known_formats: bool = True
    separable_models: bool = False
    headlines: tuple = ()

    # -- the command line
    def add_arguments(self, parser) -> None:
        """Add the task's own options to an argparse parser."""

    def configure(self, args):
        """The task's configuration (transforms.kernels.<task>.<Task>Config) from the parsed
        options (args.beam_args: the Beam options); raises pipelines.launch.common.UsageError
        for a command line that cannot run (nothing has been read or written yet)."""
        raise NotImplementedError

    def options(self, config, args) -> dict:
        """The task's options as run.json records them."""
        raise NotImplementedError

    def option_files(self, args) -> tuple:
        """The files the task's own options name and the run reads (a --label_names .json,
        --judge_byop templates): inputs, which the output folder protects."""
        return ()

    def check_source(self, name: str, source, config, slices) -> None:
        """Check one input source before anything is written (slices: the --slice key
        tuples); raises transforms.io.InputError."""
        raise NotImplementedError

    # -- what a run writes and prints
    def extra_outputs(self, config) -> tuple:
        """File names the task writes besides metrics.jsonl, rejected.jsonl and run.json."""
        return ()

    def summarize(self, metrics_path: str, info: dict, config) -> str:
        """The table printed after a run (info: run.json)."""
        raise NotImplementedError

    def report_blocks(self, records, charts) -> list:
        """The report's tables and charts of one (model, slice)'s records (report.html; built
        from pipelines/report/blocks.py and elements.py; charts: the page's chart registry,
        pipelines.report.elements.Charts). Default: none."""
        return []

    # -- from the graph (transforms/<task>.py)
    def module(self):
        return importlib.import_module(self.plumbing)

    @property
    def title(self) -> str:
        return self.name.capitalize()

    def files_transform(self):
        """Evaluate<Task>Files, the class."""
        return getattr(self.module(), f"Evaluate{self.title}Files")

    def pcollection_transform(self):
        """Evaluate<Task>, the class."""
        return getattr(self.module(), f"Evaluate{self.title}")

    @property
    def graph(self):
        """The task's transforms.graph.TaskGraph."""
        return self.files_transform().graph

    @property
    def metric_types(self) -> tuple:
        """Every record type the task can write, in metrics.jsonl's order (gates check names
        against it)."""
        return self.graph.metric_types

    @property
    def default_metric_types(self) -> tuple:
        """The record types a run writes when its options ask for no others."""
        return self.graph.default_metric_types

    @property
    def interval_unit(self) -> str:
        """What one bootstrap weight is drawn for ("datum", "image", "query")."""
        return self.graph.interval_unit

    def record_sort_key(self, record: dict):
        """The order of metrics.jsonl."""
        return self.graph.record_sort_key(record)

    # -- running
    def run(self, argv: list[str] | None = None) -> int:
        """The task's command line (argv, default sys.argv[1:]) run to its exit code."""
        from evalbeam.pipelines.launch.launcher import run_task

        return run_task(self, argv)

    def main(self) -> None:
        """`python -m evalbeam.pipelines.tasks.<task>`."""
        from evalbeam.pipelines.launch.launcher import main_of

        main_of(self)
