"""What every task's command line shares: parsing helpers, model specs, Beam options and
runners, version and secret-safe argument records, messages, exit codes (their meaning:
pipelines/launch/launcher.py)."""

from __future__ import annotations

import functools

import os
import platform
import re
import sys
from importlib import metadata


EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_GATES = 0, 1, 2, 3, 4, 5
NAME = re.compile(r"[A-Za-z0-9_.\-]+")   # used with fullmatch: "$" would let a final newline in
NAME_CHARACTERS = "ASCII letters, digits, '_', '.' and '-'"
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
    if sep and NAME.fullmatch(head) and tail:
        return head, tail
    if sep and "/" not in head and "\\" not in head:
        # NAME=PATH with a NAME that cannot be one (a path's "=" has a "/" before it)
        if not tail:
            raise UsageError(f"--predictions {spec!r}: no path after {head + '='!r}")
        raise UsageError(f"--predictions {spec!r}: the model name {head!r} may hold only "
                         f"{NAME_CHARACTERS}; it names outputs and files")
    stem = os.path.basename(spec.rstrip("/"))
    for suffix in (".gz", ".jsonl", ".ndjson", ".json", ".parquet", ".pq"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    if not NAME.fullmatch(stem):
        raise UsageError(f"cannot name the model of {spec!r} after its file ({stem!r}: a model name "
                         f"may hold only {NAME_CHARACTERS}); write NAME={spec} with such a NAME")
    return stem, spec


DASK_RUNNER = "evalbeam.pipelines.runners.dask.DaskRunner"


def split_beam_args(rest: list[str]) -> list[str]:
    """Check that the arguments evalbeam did not take are Beam pipeline options. `--runner
    DaskRunner` is taken as evalbeam's Dask runner (pipelines/runners/dask.py, Beam's with the
    graph translation fixed), whose module is imported so that its options
    (--dask_client_address, ...) are known."""
    rest = with_runner_paths(rest)
    unknown = _unknown_beam_args(tuple(rest))
    if unknown:
        # the values of options named like secrets stay out of the message (and the logs)
        raise UsageError(f"unknown option(s) {' '.join(safe_beam_args(list(unknown)))}: see the "
                         "command's --help, and Beam's pipeline options")
    return rest


def with_runner_paths(rest: list[str]) -> list[str]:
    """rest with a short Dask runner name replaced by its module path; raises UsageError when
    the Dask runner is asked for and dask is not installed."""
    out = list(rest)
    for i, arg in enumerate(out):
        if arg == "--runner" and i + 1 < len(out):
            name, at, prefix = out[i + 1], i + 1, ""
        elif arg.startswith("--runner="):
            name, at, prefix = arg.split("=", 1)[1], i, "--runner="
        else:
            continue
        if name.lower() in ("dask", "daskrunner"):
            out[at] = prefix + DASK_RUNNER
        if "dask" in out[at].lower():
            try:
                import importlib

                importlib.import_module("apache_beam.runners.dask.dask_runner")
                importlib.import_module("distributed")
            except ImportError as error:
                raise UsageError(f"--runner {name} needs Dask: pip install 'evalbeam[dask]' "
                                 f"({error})") from None
    return out


@functools.lru_cache(maxsize=64)
def _unknown_beam_args(rest: tuple) -> tuple:
    """The arguments of rest that no Beam options class takes (remembered: a sweep checks the
    same Beam options for every cell, and building Beam's parser takes about 15 ms)."""
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
        _, unknown = parser.parse_known_args(list(rest))
    except Exception:  # Beam's private parser changed: let Beam itself warn
        return ()
    return tuple(unknown)


def versions() -> dict:
    return dict(_versions())


@functools.lru_cache(maxsize=1)
def _versions() -> dict:
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

    from evalbeam.pipelines.launch.viewed_options import viewed_once

    options = viewed_once(options)
    name = options.view_as(StandardOptions).runner
    if name is None or name.lower() in ("direct", "directrunner"):
        return beam.Pipeline(runner=local_runner(options), options=options)
    return beam.Pipeline(options=options)


def local_pipeline(args: list[str] | None = None):
    """make_pipeline for Beam arguments (tests, notebooks: a local pipeline without Prism)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return make_pipeline(PipelineOptions(list(args or [])))


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


def quiet_logs() -> None:
    """Beam logs warnings of optional cloud clients on import, and tracebacks of failing steps;
    a CLI user needs none of them. EVALBEAM_LOG_LEVEL (e.g. INFO) brings them back."""
    import logging
    import os

    level = os.environ.get("EVALBEAM_LOG_LEVEL")
    logging.getLogger().setLevel((level or "ERROR").upper())
    if level is None:
        # Beam logs a failing step's traceback at ERROR; the launcher says what failed in one
        # paragraph (and run.json records it), so by default the traceback is not shown.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
