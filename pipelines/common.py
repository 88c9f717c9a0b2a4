"""What every task's launcher shares: model specs, Beam options, outputs, run.json, exit codes.

Exit codes: 0 success; 1 the run finished and wrote its outputs but rejected more rows than
--max_rejected_fraction allows; 2 unusable command line or inputs (nothing was run); 3 the
pipeline failed (no metrics.jsonl is left behind).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from importlib import metadata


EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3
NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
SECRET_WORDS = ("key", "token", "secret", "password", "credential")


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
        raise UsageError(f"unknown option(s) {unknown}: see 'evalbeam classification --help' and "
                         "Beam's pipeline options")
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
    parser.add_argument("--quiet", action="store_true", help="no progress and no summary")


def default_num_shards(total_bytes: int) -> int:
    """About one shard per 64 MiB of input, at least 2 (so two workers have work), at most 256."""
    return max(2, min(256, -(-total_bytes // (64 << 20))))


def now() -> float:
    return time.time()
