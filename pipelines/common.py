"""What every task's launcher shares: model specs, Beam options, outputs, run.json, exit codes.

Exit codes (run.json's status in brackets): 0 success ("complete"); 1 the run finished and wrote
its outputs but rejected more rows than --max_rejected_fraction allows
("complete_with_rejections"); 2 unusable command line, inputs or output folder (nothing on disk
changed), or an input that broke off while being read ("failed"); 3 the pipeline failed
("failed"; no metrics.jsonl is left behind); 4 the outputs were written but the run could not
compute what was asked ("incomplete": every row of a source rejected, a --slice key no row has,
judge calls that failed; run.json's "problems" say which).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import sys
import time
from importlib import metadata


EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_FAILED, EXIT_INCOMPLETE = 0, 1, 2, 3, 4
NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "auth")


class UsageError(Exception):
    """A command line that cannot be run; the message is shown as is."""


def parse_float_list(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{what} takes comma-separated numbers, e.g. 0.25,0.5; got {text!r}") from None
    if not values:
        raise UsageError(f"{what} needs at least one number")
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise UsageError(f"{what} must lie in [0, 1]; got {bad}")
    return values


def parse_optional_number(text: str, what: str, kind: type, low: float, high: float):
    """A number of type kind (int or float) in [low, high], or None for 'none' (also 'nan',
    'null'): for options whose "no value" is a choice, not a default."""
    if text.strip().lower() in ("none", "nan", "null"):
        return None
    noun = "an integer" if kind is int else "a number"
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(f"{what} takes {noun} in [{low}, {high}] or 'none'; got {text!r}") from None
    if not low <= value <= high:
        raise UsageError(f"{what} must lie in [{low}, {high}]; got {value}")
    return value


def parse_model_spec(spec: str) -> tuple[str, str]:
    """'NAME=PATH' or 'PATH' -> (name, pattern); a bare PATH is named after its file stem."""
    head, sep, tail = spec.partition("=")
    if sep and NAME.match(head) and tail:
        return head, tail
    stem = os.path.basename(spec.rstrip("/"))
    for suffix in (".gz", ".jsonl", ".ndjson", ".json", ".parquet", ".pq"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    if not NAME.match(stem):
        raise UsageError(f"cannot name the model of {spec!r} after its file; write NAME={spec}")
    return stem, spec


def split_beam_args(rest: list[str]) -> list[str]:
    """Check that the arguments evalbeam did not take are Beam pipeline options."""
    try:
        from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

        parser = _BeamArgumentParser(allow_abbrev=False)
        seen = set()
        stack = list(PipelineOptions.__subclasses__())
        while stack:
            cls = stack.pop()
            if cls in seen:
                continue
            seen.add(cls)
            stack.extend(cls.__subclasses__())
            cls._add_argparse_args(parser)
        _, unknown = parser.parse_known_args(rest)
    except Exception:  # Beam's private parser changed: let Beam itself warn
        return rest
    if unknown:
        # the values of options named like secrets stay out of the message (and the logs)
        raise UsageError(f"unknown option(s) {' '.join(safe_beam_args(unknown))}: see the "
                         "command's --help, and Beam's pipeline options")
    return rest


def versions() -> dict:
    out = {"python": platform.python_version()}
    for dist in ("evalbeam", "apache-beam", "pyarrow", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def safe_beam_args(args: list[str]) -> list[str]:
    """Beam arguments for run.json, with the values of anything that looks secret removed."""
    out, hide_next = [], False
    for arg in args:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        name = arg.split("=", 1)[0].lower()
        if any(word in name for word in SECRET_WORDS):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=***")
            else:
                out.append(arg)
                hide_next = True
        else:
            out.append(arg)
    return out


def rejection_message(counts: dict, first_reasons: list[dict], rejected_path: str,
                      allowed: float) -> str | None:
    """The message for a run that rejected more than `allowed` of its rows, else None."""
    read = sum(c["rows_read"] for c in counts.values())
    rejected = sum(c["rows_rejected"] for c in counts.values())
    if rejected == 0 or (read and rejected / read <= allowed):
        return None
    per_source = ", ".join(f"{name}: {c['rows_rejected']}" for name, c in counts.items()
                           if c["rows_rejected"])
    reasons = "; ".join(f"{r['file']}:{r.get('line', r.get('row'))}: {r['reason']}"
                        for r in first_reasons[:3])
    return (f"evalbeam: {rejected:,} of {read:,} input rows were rejected ({per_source}). "
            f"First reasons: {reasons}. Every rejected row is listed in {rejected_path}. "
            f"The metrics were computed without them and written, but the run counts as failed; "
            f"fix the inputs, or accept up to a fraction F of bad rows with "
            f"--max_rejected_fraction F.")


def say_error(message: str) -> None:
    print(f"evalbeam: error: {message}", file=sys.stderr)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="output folder (local path or FileSystems URI)")
    parser.add_argument("--slice", action="append", default=[], metavar="KEY[,KEY...]",
                        help="also compute every metric per combination of values of these ground-"
                             "truth metadata keys (repeatable)")
    parser.add_argument("--num_shards", type=int, default=None,
                        help="number of datum shards (default: from the input size)")
    parser.add_argument("--max_rejected_fraction", type=float, default=0.0, metavar="F",
                        help="exit 0 even if up to this fraction of rows was rejected (default 0)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace files named like evalbeam's outputs in --output even if "
                             "evalbeam did not write them (inputs are never replaced)")
    parser.add_argument("--quiet", action="store_true", help="no progress and no summary")


def default_num_shards(total_bytes: int) -> int:
    """About one shard per 64 MiB of input, at least 2 (so two workers have work), at most 256."""
    return max(2, min(256, -(-total_bytes // (64 << 20))))


def local_runner(options):
    """The DirectRunner's batch engine (the FnApiRunner, which honours --direct_running_mode and
    --direct_num_workers), set up as the DirectRunner sets it up, minus its first step: since
    Beam 2.6x the DirectRunner first tries the Prism runner, which downloads a binary from GitHub
    on first use. That is a network call in every run of a machine without it (and a hang where
    a firewall drops packets) and a different engine on a machine with it; evalbeam's local runs
    and tests need neither."""
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


def make_pipeline(options):
    """A beam.Pipeline for these options: local_runner() when no runner or the DirectRunner is
    asked for, else the runner named by --runner."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import StandardOptions

    name = options.view_as(StandardOptions).runner
    if name is None or name.lower() in ("direct", "directrunner"):
        return beam.Pipeline(runner=local_runner(options), options=options)
    return beam.Pipeline(options=options)


def local_pipeline(args: list[str] | None = None):
    """make_pipeline for Beam arguments (tests, notebooks: a local pipeline without Prism)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return make_pipeline(PipelineOptions(list(args or [])))


def _multi_process(options) -> bool:
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


def run_job(task: str, args, models: dict[str, str], slices: list, beam_args: list[str],
            task_options: dict, check_source, build, summarize, started: float,
            min_shards: int = 1, outputs: tuple = (), known_formats: bool = True) -> int:
    """Everything a task's launcher does around its pipeline.

    Expands and checks the inputs (check_source(name, source) raises InputError) and the output
    folder, all without writing anything; takes the output folder (transforms.outputs), runs
    build(pipeline, sources, num_shards, folder, run_info) on Beam, and reports: one paragraph
    on failure, else summarize(metrics_path, counts), the run's problems and, when too many rows
    were rejected, the rejection message. Returns the exit code, which agrees with run.json's
    status (transforms.outputs.EXIT_CODES)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.io import READ_ERROR, InputError, expand_source, read_json
    from transforms.outputs import EXIT_CODES, RUNNING, OutputFolder

    folder = OutputFolder(args.output, outputs, overwrite=getattr(args, "overwrite", False))
    try:
        sources = {"groundtruths": expand_source("groundtruths", args.groundtruths, known_formats)}
        for name, pattern in models.items():
            sources[name] = expand_source(name, pattern, known_formats)
        for name, source in sources.items():
            check_source(name, source)
        folder.check(_inputs_of(sources))
    except InputError as error:
        say_error(getattr(error, "message", str(error)))
        return EXIT_USAGE

    total_bytes = sum(FileSystems.match([path])[0].metadata_list[0].size_in_bytes
                      for path in _inputs_of(sources))
    num_shards = args.num_shards or max(min_shards, default_num_shards(total_bytes))
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        # multi-process and remote workers log at INFO by default; keep stderr for progress
        beam_args = beam_args + ["--default_sdk_harness_log_level=ERROR"]
    options = PipelineOptions(beam_args)
    run_info = {
        "task": task,
        "inputs": {name: {"pattern": s.pattern, "files": list(s.files)} for name, s in sources.items()},
        "models": sorted(models),
        "sources": list(sources),
        "slices": [list(s) for s in slices],
        "options": dict(task_options, num_shards=num_shards,
                        max_rejected_fraction=args.max_rejected_fraction),
        "runner": options.get_all_options().get("runner") or "DirectRunner",
        "beam_args": safe_beam_args(beam_args),
        "versions": versions(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }
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
        build(pipeline, sources, num_shards, folder, run_info)
        with worker_stderr_filtered(_multi_process(options), keep_progress=not args.quiet):
            pipeline.run().wait_until_finish()
    except Exception as error:  # the pipeline failed: say why in one paragraph, keep no metrics
        text = str(error)
        if READ_ERROR in text:   # an input that broke off while being read: not a bug
            reason = text[text.rindex(READ_ERROR) + len(READ_ERROR):].strip().splitlines()[0]
            reason = re.sub(r" \[while running '.*'\]$", "", reason)
            code, kind = EXIT_USAGE, "the run stopped on its input"
        else:
            reason = f"{type(error).__name__}: {(text.strip().splitlines() or [''])[-1]}"
            code, kind = EXIT_FAILED, "the pipeline failed"
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
    if not args.quiet:
        print(summarize(folder.final("metrics.jsonl"), info["counts"]))
        scores = "".join(f"{name} ({info[name.split('.')[0] + '_written']:,} rows), " for name in outputs
                         if name.split(".")[0] + "_written" in info)
        print(f"\nOutputs in {args.output}: metrics.jsonl ({info['metrics_written']:,} records), "
              f"{scores}run.json, rejected.jsonl ({info['rows_rejected']:,} rows). "
              f"Wall time {info['wall_time_seconds']:.1f} s.")
    report_problems(info, folder.final("rejected.jsonl"), args.max_rejected_fraction)
    return EXIT_CODES[info["status"]]


def report_problems(info: dict, rejected_path: str, allowed: float) -> None:
    """The run's warnings, why it is incomplete, and the rejection message, on stderr: what the
    exit code means, in words, whatever --quiet says."""
    from transforms.outputs import INCOMPLETE, WITH_REJECTIONS

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


def add_input_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--groundtruths", required=True, metavar="PATH",
                        help=f"ground truth: a path or glob ({what})")
    parser.add_argument("--predictions", required=True, action="append", metavar="[NAME=]PATH",
                        help="predictions of one model (repeatable); without NAME the model "
                             "is named after the file's stem")


def parse_models(specs: list[str]) -> dict[str, str]:
    models: dict[str, str] = {}
    for spec in specs:
        name, pattern = parse_model_spec(spec)
        if name == "groundtruths":
            raise UsageError("'groundtruths' cannot be a model name")
        if name in models:
            raise UsageError(f"two --predictions are named {name!r}; name them NAME=PATH")
        models[name] = pattern
    return models


def parse_slices(specs: list[str]) -> list[tuple[str, ...]]:
    slices = []
    for spec in specs:
        keys = tuple(k.strip() for k in spec.split(",") if k.strip())
        if not keys:
            raise UsageError("--slice needs at least one metadata key")
        slices.append(keys)
    return slices
