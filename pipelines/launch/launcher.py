"""The one launcher: runs any task declared by a Task (pipelines/tasks/task.py), end to end.

What it does for every task, once: the command line (the task's options, the common ones and
their checks, Beam's options), the inputs (expanded, checked before anything is written), the
output folder (transforms.outputs), the Beam pipeline around the task's PTransform on files
(writing metrics.jsonl and rejected.jsonl, publishing with run.json), the summary printed, the
run's problems, and the exit code.

Exit codes (run.json's status in brackets): 0 success ("complete"); 1 the run finished and wrote
its outputs but rejected more rows than --max_rejected_fraction allows
("complete_with_rejections"); 2 unusable command line, inputs, output folder or Dask scheduler
(nothing on disk changed), or an input that broke off while being read ("failed"); 3 the
pipeline failed ("failed"; no metrics.jsonl is left behind); 4 the outputs were written but the
run could not compute what was asked ("incomplete": every row of a source rejected, a --slice
key no row has, judge calls that failed; run.json's "problems" say which); 5 every output was
written, the run is complete, but a gate failed (--gates; run.json's "gates" and gates.json say
which).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import sys
import time

import apache_beam as beam

from evalbeam.pipelines.launch.common import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, make_pipeline,
                                       parse_models, parse_slices, quiet_logs, rejection_message,
                                       safe_beam_args, say_error, split_beam_args, versions)
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the spec calls the launcher (Task.run), not the other way round
    from evalbeam.pipelines.tasks.task import Task


def build_parser(spec: Task) -> argparse.ArgumentParser:
    """The task's command line: the inputs, the options every task has, then the task's own."""
    parser = argparse.ArgumentParser(
        prog=f"evalbeam {spec.name}", allow_abbrev=False,
        description=f"{spec.summary[:1].upper()}{spec.summary[1:]}. Options not listed here are "
                    "passed to Beam (--runner, --direct_num_workers, --direct_running_mode, ...).")
    add_input_arguments(parser, spec.input_help)
    add_common_arguments(parser)
    add_finishing_arguments(parser)
    spec.add_arguments(parser)
    return parser


def parse_command(spec: Task, argv: list[str], exit_on_error: bool = True, parser=None):
    """(args, config, models, slices, beam_args) of a command line; raises UsageError.
    exit_on_error=False: argparse's own errors (a missing or malformed option) raise UsageError
    too, instead of printing the usage and exiting (the sweep checks many command lines).
    parser: build_parser(spec) made earlier, for many command lines of one task."""
    parser = parser or build_parser(spec)
    if not exit_on_error:
        parser.error = _raise_usage
    from evalbeam.schemas.safe_json import lone_surrogate

    for arg in argv:
        if lone_surrogate(arg):   # undecodable bytes, as Python reads them from the command line
            raise UsageError(f"the argument {arg!r} is not UTF-8 text (a file or folder name with "
                             "bytes of another encoding?): evalbeam records every path and option "
                             "in run.json, a UTF-8 file. Rename it.")
    args, rest = parser.parse_known_args(argv)
    beam_args = split_beam_args(rest)
    if args.num_shards is not None and args.num_shards < 1:
        raise UsageError("--num_shards must be 1 or more")
    if args.input_split_bytes is not None and args.input_split_bytes < 0:
        raise UsageError("--input_split_bytes must be 0 (no splitting) or more")
    if not 0.0 <= args.max_rejected_fraction <= 1.0:
        raise UsageError("--max_rejected_fraction must lie in [0, 1]")
    models = parse_models(args.predictions)
    slices = parse_slices(args.slice)
    args.uncertainty = parse_bootstrap(args, models)
    args.beam_args = beam_args       # for tasks whose config depends on them (judge workers)
    config = spec.configure(args)
    return args, config, models, slices, beam_args


def _raise_usage(message: str):
    raise UsageError(message)


MAX_REPLICATES = 10_000


def parse_bootstrap(args, models: dict):
    """The Bootstrap of --bootstrap, --confidence and --bootstrap_seed, after checking them and
    --compare_to; raises UsageError."""
    from evalbeam.transforms.kernels.bootstrap import Bootstrap

    if not 0 <= args.bootstrap <= MAX_REPLICATES:
        raise UsageError(f"--bootstrap must lie in [0, {MAX_REPLICATES:,}] (replicates; 0: no intervals)")
    if not 0.0 < args.confidence < 1.0:
        raise UsageError("--confidence must lie strictly between 0 and 1 (e.g. 0.95)")
    if not 0 <= args.bootstrap_seed < 2 ** 63:
        raise UsageError("--bootstrap_seed must lie in [0, 2^63)")
    if args.compare_to is not None:
        if args.bootstrap < 1:
            raise UsageError("--compare_to needs --bootstrap R (R > 0, e.g. 1000): the paired "
                             "comparisons are made from the bootstrap replicates")
        if args.compare_to not in models:
            raise UsageError(f"--compare_to {args.compare_to!r} is not one of the models "
                             f"({', '.join(sorted(models))})")
        if len(models) < 2:
            raise UsageError("--compare_to needs at least two models (--predictions NAME=PATH, twice)")
    return Bootstrap(args.bootstrap, args.confidence, args.bootstrap_seed)


def run_task(spec: Task, argv: list[str] | None = None) -> int:
    """Run one task's command line; returns the exit code (it agrees with run.json's status)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    try:
        args, config, models, slices, beam_args = parse_command(spec, argv)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE
    return run_job(spec, config, args, models, slices, beam_args, started)


def main_of(spec: Task) -> None:
    """`python -m evalbeam.pipelines.tasks.<task>`: the task's command with quiet logs."""
    quiet_logs()
    sys.exit(run_task(spec))


def add_input_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--groundtruths", required=True, metavar="PATH",
                        help=f"ground truth: a path or glob ({what})")
    parser.add_argument("--predictions", required=True, action="append", metavar="[NAME=]PATH",
                        help="predictions of one model (repeatable); without NAME the model "
                             "is named after the file's stem")



def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="output folder (local path or FileSystems URI)")
    parser.add_argument("--slice", action="append", default=[], metavar="KEY[,KEY...]",
                        help="also compute every metric per combination of values of these ground-"
                             "truth metadata keys (repeatable)")
    parser.add_argument("--num_shards", type=int, default=None,
                        help="number of datum shards (default: from the input size)")
    parser.add_argument("--input_split_bytes", type=int, default=None, metavar="N",
                        help="read an uncompressed JSONL or TREC file larger than this in byte "
                             "spans, on several workers at once (default: the input in 32 spans "
                             "of 8 to 64 MiB; 0: each file by one worker)")
    parser.add_argument("--max_rejected_fraction", type=float, default=0.0, metavar="F",
                        help="exit 0 even if up to this fraction of rows was rejected (default 0)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace files named like evalbeam's outputs in --output even if "
                             "evalbeam did not write them (inputs are never replaced)")
    parser.add_argument("--quiet", action="store_true", help="no progress and no summary")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="R",
                        help="Poisson bootstrap replicates: a confidence interval on every scalar "
                             "metric (default 0: none; see pipelines/launch/uncertainty.md)")
    parser.add_argument("--confidence", type=float, default=0.95, metavar="C",
                        help="coverage of the intervals (default 0.95)")
    parser.add_argument("--bootstrap_seed", type=int, default=0, metavar="S",
                        help="seed of the bootstrap weights (default 0); the same seed gives the "
                             "same intervals on any runner, shard count or input order")
    parser.add_argument("--compare_to", default=None, metavar="MODEL",
                        help="compare every other model with this one: paired differences with "
                             "intervals and p-values (needs --bootstrap)")



def add_finishing_arguments(parser: argparse.ArgumentParser, what: str = "run") -> None:
    """What is made of a run's finished outputs (pipelines/launch/finishing.py), and results history;
    what: "run", or "sweep" (whose baseline is an earlier sweep, its cells logged one by one)."""
    parser.add_argument("--gates", default=None, metavar="FILE",
                        help="quality gates (TOML [[gate]] tables, pipelines/quality/gates.md): gates.json "
                             "records every check; a failed gate exits 5")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help=f"an earlier {what}'s output folder: comparison.jsonl, and the "
                             "baseline of the gates' change bounds")
    parser.add_argument("--report", action="store_true",
                        help="also write report.html, one self-contained page (pipelines/report/report.md)")
    parser.add_argument("--mlflow_tracking_uri", default=None, metavar="URI",
                        help=f"log the {'cells that ran' if what == 'sweep' else 'run'} to MLflow "
                             "(needs evalbeam[mlflow]; pipelines/quality/history.md)")


def prepare_finishing(spec: Task, args, models, slices):
    """The run's Finishing (pipelines/launch/finishing.py) from --gates, --baseline and --report, after
    checking them and --mlflow_tracking_uri; raises UsageError before anything is written."""
    from evalbeam.pipelines.quality import gates as gating
    from evalbeam.pipelines.quality.comparison import check_baseline
    from evalbeam.pipelines.launch.finishing import Finishing

    baseline = getattr(args, "baseline", None)
    if baseline:
        check_baseline(baseline, spec.name, output=args.output)
    gates = ()
    if getattr(args, "gates", None):
        gates = tuple(gating.load_gates(args.gates))
        types = set(spec.metric_types) | ({"Comparison"} if args.compare_to else set())
        gating.check_gates(list(gates), metric_types=types, models=models, slices=slices,
                           intervals=args.uncertainty.enabled, baseline=bool(baseline))
    if getattr(args, "mlflow_tracking_uri", None):
        from evalbeam.pipelines.quality.history import check_tracking_uri

        check_tracking_uri(args.mlflow_tracking_uri)
    return Finishing(gates=gates, gates_source=getattr(args, "gates", None), baseline=baseline,
                     report=bool(getattr(args, "report", False)))


def default_num_shards(total_bytes: int, replicates: int = 0) -> int:
    """About one shard per 64 MiB of input, at least 2 (so two workers have work), at most 256.
    With more than 100 bootstrap replicates, proportionally more: a shard holds one weight
    byte per datum and replicate while it is matched, so this keeps that memory about what
    --bootstrap 100 costs (about 100 MB for a 64 MiB shard of short rows)."""
    scaled = total_bytes * max(1.0, replicates / 100.0)
    return max(2, min(256, -(-int(scaled) // (64 << 20))))



def multi_process(options) -> bool:
    all_options = options.get_all_options()
    runner = (all_options.get("runner") or "direct").lower()
    return runner in ("direct", "directrunner") and \
        all_options.get("direct_running_mode") == "multi_processing"


@contextlib.contextmanager
def worker_stderr_filtered(enabled: bool, keep_progress: bool):
    """On the multi-process DirectRunner, pass the worker processes' standard error through a
    filter while the pipeline runs: only evalbeam's own lines ("evalbeam: ...", the progress)
    go on, and none with --quiet. The workers inherit stderr, and Beam's worker start-up logs
    at INFO, warns about optional cloud clients and prints a failing step's traceback before or
    regardless of any level set by options; the launcher reports failures in one paragraph
    after the run, with stderr restored. EVALBEAM_LOG_LEVEL set: nothing is filtered."""
    if not enabled or os.environ.get("EVALBEAM_LOG_LEVEL"):
        yield
        return
    import threading

    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()

    def relay():
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if keep_progress and line.startswith(b"evalbeam: "):
                    os.write(saved, line)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        os.dup2(write_end, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(write_end)
        thread.join(timeout=10)
        os.close(saved)


def _inputs_of(sources: dict) -> list[str]:
    return [path for source in sources.values() for path in source.files]


def _option_files(spec: Task, args) -> list[str]:
    """The files a run reads from its options rather than its sources (--gates, and the task's
    own: Task.option_files): inputs too, which the output folder's check protects."""
    named = [getattr(args, "gates", None), *spec.option_files(args)]
    return [str(path) for path in named if path]


def report_problems(info: dict, rejected_path: str, allowed: float) -> None:
    """The run's warnings, why it is incomplete, and the rejection message, on stderr: what the
    exit code means, in words, whatever --quiet says."""
    from evalbeam.transforms.outputs import INCOMPLETE, WITH_REJECTIONS

    for p in info.get("problems", []):
        if p["severity"] == "warning":
            print(f"evalbeam: warning: {p['message']}", file=sys.stderr)
    errors = [p["message"] for p in info.get("problems", []) if p["severity"] == "error"]
    if info["status"] == INCOMPLETE:
        print(f"evalbeam: the run is incomplete (status \"incomplete\", exit 4): "
              f"{' '.join(errors)} The outputs were written; run.json lists the problems.",
              file=sys.stderr)
    elif info["status"] == WITH_REJECTIONS:
        print(rejection_message(info["counts"], info["first_rejections"], rejected_path, allowed),
              file=sys.stderr)




def prepare_run(spec: Task, config, args, models: dict[str, str], slices: list,
                beam_args: list[str], started: float, num_shards: int | None = None,
                after: tuple = ()):
    """(folder, sources, run_info, beam_args) of one run, after checking its inputs
    (spec.check_source) and its output folder, with nothing written yet; raises
    transforms.io.InputError. num_shards: the shard count when --num_shards does not give one
    (default: default_num_shards of the input size). beam_args gain the default worker log
    level. after: the files written from the finished outputs (Finishing.names). Shared by
    run_job and the sweep (pipelines/sweep/command.py), so that a sweep's cell is set up exactly as the
    same run alone."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.preflight import expand_source
    from evalbeam.transforms.outputs import OutputFolder

    outputs = tuple(spec.extra_outputs(config))
    folder = OutputFolder(args.output, outputs, overwrite=args.overwrite, after=after)
    sources = {"groundtruths": expand_source("groundtruths", args.groundtruths, spec.known_formats)}
    for name, pattern in models.items():
        sources[name] = expand_source(name, pattern, spec.known_formats)
    for name, source in sources.items():
        spec.check_source(name, source, config, slices)
    folder.check(_inputs_of(sources) + _option_files(spec, args))
    if args.num_shards:
        num_shards = args.num_shards
    elif num_shards is None:
        total_bytes = sum(FileSystems.match([path])[0].metadata_list[0].size_in_bytes
                          for path in _inputs_of(sources))
        num_shards = max(spec.min_shards,
                         default_num_shards(total_bytes, args.uncertainty.replicates))
        num_shards = balanced_shards(num_shards, _local_workers(tuple(beam_args)))
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        # multi-process and remote workers log at INFO by default; keep stderr for progress
        beam_args = beam_args + ["--default_sdk_harness_log_level=ERROR"]
    run_info = {
        "task": spec.name,
        "inputs": {name: {"pattern": s.pattern, "files": list(s.files)} for name, s in sources.items()},
        "models": sorted(models),
        "sources": list(sources),
        "slices": [list(s) for s in slices],
        "options": dict(spec.options(config, args), num_shards=num_shards,
                        max_rejected_fraction=args.max_rejected_fraction,
                        bootstrap=args.uncertainty.replicates, confidence=args.confidence,
                        bootstrap_seed=args.bootstrap_seed, compare_to=args.compare_to),
        "runner": _runner_name(tuple(beam_args)),
        "beam_args": safe_beam_args(beam_args),
        "versions": versions(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }
    return folder, sources, run_info, beam_args


def balanced_shards(num_shards: int, workers: int) -> int:
    """num_shards rounded up to a multiple of workers. The multi-process DirectRunner deals a
    step's keys to its workers in equal numbers, and the step waits for the last: 5 detection
    shards on 2 workers made one worker match a third shard alone (19.1 s; 6 shards: 17.6-18.1 s,
    50,000 images)."""
    return -(-num_shards // workers) * workers if workers > 1 else num_shards


@functools.lru_cache(maxsize=64)
def _local_workers(beam_args: tuple) -> int:
    """The worker processes of the multi-process DirectRunner these options ask for (0: one per
    core, as Beam reads it); 1 for any other runner or mode, whose workers are not known here."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    options = PipelineOptions(list(beam_args))
    if not multi_process(options):
        return 1
    return options.view_as(DirectOptions).direct_num_workers or os.cpu_count() or 1


@functools.lru_cache(maxsize=64)
def _runner_name(beam_args: tuple) -> str:
    """The runner these Beam options name, for run.json (remembered per options: the sweep
    prepares every cell with the same)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(list(beam_args)).get_all_options().get("runner") or "DirectRunner"


def check_runner(beam_args: list[str]) -> None:
    """Raise UsageError when the runner these Beam options name cannot be used, before anything
    is written: today, a Dask runner's --dask_client_address where no Dask scheduler answers
    within a few seconds (pipelines/dask_runner.check_scheduler)."""
    if "dask" in _runner_name(tuple(beam_args)).lower():
        from evalbeam.pipelines.runners.dask import check_scheduler_option

        check_scheduler_option(beam_args)


def failure_of(error: Exception) -> tuple[int, str, str]:
    """(exit code, what happened, reason in one line) of a pipeline that raised `error`: an
    input that broke off while being read is the user's to fix (exit 2), anything else is a
    failed pipeline (exit 3)."""
    from evalbeam.transforms.io import READ_ERROR

    text = str(error)
    if READ_ERROR in text:
        reason = text[text.rindex(READ_ERROR) + len(READ_ERROR):].strip().splitlines()[0]
        reason = re.sub(r" \[while running '.*'\]$", "", reason)
        return EXIT_USAGE, "the run stopped on its input", reason
    reason = f"{type(error).__name__}: {(text.strip().splitlines() or [''])[-1]}"
    return EXIT_FAILED, "the pipeline failed", reason


def run_job(spec: Task, config, args, models: dict[str, str], slices: list,
            beam_args: list[str], started: float) -> int:
    """Everything around the task's pipeline.

    Expands and checks the inputs (spec.check_source raises InputError), the output folder and
    the runner (check_runner), all without writing anything; takes the output folder
    (transforms.outputs), runs the pipeline (build_pipeline) on Beam, and reports: one
    paragraph on failure, else the task's summary, the run's problems and, when too many rows
    were rejected, the rejection message.
    Returns the exit code, which agrees with run.json's status (transforms.outputs.EXIT_CODES)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from evalbeam.transforms.evaluated import FilesJob
    from evalbeam.transforms.io import InputError, read_json, split_inputs
    from evalbeam.transforms.outputs import EXIT_CODES, RUNNING

    try:
        finishing = prepare_finishing(spec, args, models, slices)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE
    try:
        folder, sources, run_info, beam_args = prepare_run(spec, config, args, models, slices,
                                                           beam_args, started, after=finishing.names)
    except InputError as error:
        say_error(getattr(error, "message", str(error)))
        return EXIT_USAGE
    try:
        check_runner(beam_args)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE
    num_shards = run_info["options"]["num_shards"]
    options = PipelineOptions(beam_args)
    try:
        folder.start(run_info)
    except InputError as error:
        say_error(str(error))
        return EXIT_USAGE
    if not args.quiet:
        print(f"evalbeam: evaluating {len(models)} model(s) over {num_shards} shard(s) "
              f"on {run_info['runner']}", file=sys.stderr)
    try:
        pipeline = make_pipeline(options)
        split_inputs(pipeline, args.input_split_bytes)
        # presence: the datum hashes behind run.json's "datums" fingerprint (baseline checks)
        job = FilesJob(sources, tuple(sorted(models)), tuple(slices), num_shards, args.quiet,
                       started, folder.temp, args.uncertainty, args.compare_to, presence=True)
        build_pipeline(pipeline, spec, config, job, folder, run_info, args.max_rejected_fraction,
                       finishing)
        with worker_stderr_filtered(multi_process(options), keep_progress=not args.quiet):
            pipeline.run().wait_until_finish()
    except Exception as error:  # the pipeline failed: say why in one paragraph, keep no metrics
        code, kind, reason = failure_of(error)
        run_info.update(error=reason, wall_time_seconds=round(time.time() - started, 3))
        folder.fail(run_info)
        say_error(f"{kind} ({reason}). No metrics were written; {folder.final('run.json')} "
                  f"records the failure.")
        return code
    info = read_json(folder.final("run.json"))
    if info.get("status") == RUNNING:
        # A runner that returns before the job ends (e.g. a Dataflow flex template launch).
        print(f"evalbeam: job submitted; its outputs will appear in {args.output} when it "
              "finishes (run.json says \"running\" until then).", file=sys.stderr)
        return EXIT_OK
    from evalbeam.pipelines.launch.finishing import gates_exit, print_gates

    if not args.quiet and info.get("gates") and not info["gates"]["passed"]:
        print_gates(info, args.output, sys.stderr)      # failed checks first
    if not args.quiet:
        print(spec.summarize(folder.final("metrics.jsonl"), info, config))
        if args.uncertainty.enabled:
            print(f"\nIntervals: every scalar metric in metrics.jsonl has an \"interval\" "
                  f"({args.confidence:.0%}, {args.uncertainty.replicates:,} Poisson bootstrap "
                  f"replicates, seed {args.bootstrap_seed}); see pipelines/launch/uncertainty.md."
                  + (" With so few replicates the interval ends and p-values are coarse: use "
                     "1,000 or more for a report." if args.uncertainty.replicates < 200 else ""))
        if args.compare_to is not None:
            from evalbeam.pipelines.tasks.summary import comparison_summary

            print("\n" + comparison_summary(folder.final("metrics.jsonl")))
        scores = "".join(f"{name} ({info[name.split('.')[0] + '_written']:,} rows), " for name in folder.extra
                         if name.split(".")[0] + "_written" in info)
        made = "".join(f", {name}" for name in folder.after)
        print(f"\nOutputs in {args.output}: metrics.jsonl ({info['metrics_written']:,} records), "
              f"{scores}run.json, rejected.jsonl ({info['rows_rejected']:,} rows){made}. "
              f"Wall time {info['wall_time_seconds']:.1f} s.")
    report_problems(info, folder.final("rejected.jsonl"), args.max_rejected_fraction)
    if info.get("gates") and (args.quiet or info["gates"]["passed"]):
        print_gates(info, args.output, sys.stderr)
    if "report.html" in folder.after and not args.quiet:
        print(f"evalbeam: report in {folder.final('report.html')}", file=sys.stderr)
    code = gates_exit(info, EXIT_CODES[info["status"]])
    if args.mlflow_tracking_uri:
        code = log_history(args.mlflow_tracking_uri, args.output, code, quiet=args.quiet)
    return code


def log_history(uri: str, folder: str, code: int, quiet: bool, run_name=None, tags=None) -> int:
    """Log a finished run folder to MLflow (pipelines/quality/history.py); a failure to log is said in
    one line and makes a successful run exit EXIT_FAILED, the outputs being complete: a nightly
    job whose history silently stops is the failure this option exists to prevent."""
    from evalbeam.pipelines.quality.history import log_run

    try:
        run_id = log_run(folder, uri, run_name=run_name, tags=tags)
    except Exception as error:
        say_error(f"the run finished and its outputs are in {folder}, but logging it to MLflow "
                  f"({uri}) failed: {type(error).__name__}: {error}")
        return code if code != EXIT_OK else EXIT_FAILED
    if not quiet:
        print(f"evalbeam: logged to MLflow at {uri} (run {run_id})", file=sys.stderr)
    return code


def build_pipeline(pipeline, spec: Task, config, job, folder, run_info: dict,
                   max_rejected_fraction: float, finishing=None) -> None:
    """Add the task's job to `pipeline` (see TaskJob)."""
    _ = pipeline | TaskJob(spec, config, job, folder, run_info, max_rejected_fraction,
                           finishing=finishing)


class TaskJob(beam.PTransform):
    """One run of a task on a pipeline's begin: the task's PTransform on files, then
    metrics.jsonl and rejected.jsonl in their orders, then one step that checks the counts,
    judges the run and publishes everything with run.json (transforms.outputs.finalize_run)
    after every output is written. Returns the PCollection of the published run.json.

    sidecar(out) -> a PCollection of one (path, dict), or None: a JSON file written (atomically)
    just before the run publishes, so that it exists whenever run.json says the run ended (the
    sweep's per-cell leaderboard inputs, pipelines/sweep/command.py). finishing: a
    pipelines.finishing.Finishing (comparison, gates, report), run just before publishing."""

    def __init__(self, spec: Task, config, job, folder, run_info: dict,
                 max_rejected_fraction: float, sidecar=None, finishing=None):
        super().__init__()
        self.spec, self.config, self.job, self.folder = spec, config, job, folder
        self.run_info, self.max_rejected_fraction, self.sidecar = run_info, max_rejected_fraction, sidecar
        self.finishing = finishing or None

    def expand(self, pbegin):
        from evalbeam.transforms.io import WriteJsonl
        from evalbeam.transforms.meters import add_stats, datum_fingerprint_stats
        from evalbeam.transforms.outputs import reject_sort_key
        from evalbeam.transforms.uncertainty import Uncertainty, with_comparisons_last

        spec, job, folder = self.spec, self.job, self.folder
        out = pbegin | spec.title >> spec.files_transform()(self.config, job)
        metrics = (Uncertainty.inputs(out.metrics, out.presence, out.outcomes)
                   | "Uncertainty" >> Uncertainty(job.bootstrap, spec.interval_unit, job.compare_to))
        n_metrics = metrics | "WriteMetrics" >> WriteJsonl(
            folder.temp("metrics.jsonl"), with_comparisons_last(spec.graph.record_sort_key))
        n_rejected = out.rejected | "WriteRejects" >> WriteJsonl(folder.temp("rejected.jsonl"),
                                                                 reject_sort_key)
        extra = [beam.pvalue.AsSingleton(out.extra[name]) for name in folder.extra]
        report = beam.pvalue.AsSingleton(out.report) if out.report is not None else None
        sidecar = self.sidecar(out) if self.sidecar is not None else None
        stats = out.stats
        if out.presence is not None:   # run.json's "datums": their count and fingerprint
            stats = (stats, out.presence | "DatumFingerprint" >> beam.FlatMap(datum_fingerprint_stats)
                     ) | "WithDatums" >> beam.Flatten()
        stats = stats | "SumStats" >> beam.CombinePerKey(add_stats)
        return (pbegin
                | "Once" >> beam.Create([None])
                | "Publish" >> beam.Map(
                    _publish_once, beam.pvalue.AsList(stats), beam.pvalue.AsSingleton(n_metrics),
                    beam.pvalue.AsSingleton(n_rejected), folder, self.run_info, job.started,
                    self.max_rejected_fraction, *extra, problems=beam.pvalue.AsList(out.problems),
                    report=report, finish=self.finishing,
                    sidecar=beam.pvalue.AsSingleton(sidecar) if sidecar is not None else None))


def _publish_once(_, stats, *args, **kwargs):
    return publish_run(list(stats), *args, **kwargs)


def publish_run(stats, n_metrics, n_rejected, folder, run_info, started, max_rejected_fraction,
                *n_rows, problems=(), report=None, sidecar=None, finish=None):
    """Publish one run (transforms.outputs.finalize_run) from what its graph computed. Its many
    parameters are Beam side inputs, which a step receives as arguments: stats, n_metrics,
    n_rejected, the row counts n_rows of folder.extra, problems, report (a dict merged into
    run.json) and sidecar ((path, content) written just before publishing), then the run's
    settings (folder, run_info, started, max_rejected_fraction, finish)."""
    from evalbeam.transforms.outputs import finalize_run, write_json_atomic

    if report:
        run_info = dict(run_info, **report)
    if sidecar is not None:
        path, content = sidecar
        write_json_atomic(content, path)
    return finalize_run(stats, n_metrics, n_rejected, folder, run_info, started,
                        max_rejected_fraction, dict(zip(folder.extra, n_rows)),
                        problems=list(problems), finish=finish)
