"""A sweep's own folder (DIR): sweep.json, the leaderboard files and the files of
pipelines/sweep/finishing.py beside them, and how they are checked, written and published.

sweep.json is written first with status "running" and last with the sweep's end (publish), so
that it always tells whether the files beside it are one sweep's whole result.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import TYPE_CHECKING

from evalbeam.pipelines.launch.common import UsageError
from evalbeam.transforms.outputs import path_exists

if TYPE_CHECKING:   # a plan knows its folder's files, not the other way round
    from evalbeam.pipelines.sweep.plan import Plan

SWEEP_JSON, LEADERBOARD_JSONL, LEADERBOARD_CSV = "sweep.json", "leaderboard.jsonl", "leaderboard.csv"
# the files of pipelines/sweep/finishing.py: gates, the comparison with --baseline, the report
SWEEP_OUTPUTS = ("gates.json", "comparison.jsonl", "report.html")


def read_or_none(path, reader):
    """reader(path), or None when it raises (a file that is missing or cannot be used counts as
    none: a cell without a readable run.json has not ended)."""
    try:
        return reader(path)
    except Exception:
        return None


def check_sweep_folder(output: str) -> None:
    """Refuse a folder whose sweep.json or leaderboard files evalbeam did not write."""
    from evalbeam.transforms.io import join, read_json

    if "://" not in output and os.path.exists(output) and not os.path.isdir(output):
        raise UsageError(f"--output {output} is a file, not a folder")
    own = read_or_none(join(output, SWEEP_JSON), read_json)
    present = [n for n in (SWEEP_JSON, LEADERBOARD_JSONL, LEADERBOARD_CSV) + SWEEP_OUTPUTS
               if path_exists(join(output, n))]
    if present and not (isinstance(own, dict) and own.get("written_by") == "evalbeam"):
        raise UsageError(f"the folder {output} holds {', '.join(present)}, which evalbeam's sweep "
                         "did not write; choose another --output or move them away")


def write_sweep_json(output: str, info: dict) -> None:
    from evalbeam.transforms.io import join
    from evalbeam.transforms.outputs import write_json_atomic

    write_json_atomic(dict(info, written_by="evalbeam"), join(output, SWEEP_JSON))


def sweep_info(manifest, plans: list[Plan], started: float, status: str) -> dict:
    from evalbeam.pipelines.launch.common import versions

    from evalbeam.transforms.input_files import MAX_SETTINGS_BYTES, read_bytes

    raw = read_bytes(manifest.path, MAX_SETTINGS_BYTES, f"the sweep manifest {manifest.path}")
    return {
        "status": status,
        "manifest": {"path": os.path.abspath(manifest.path),
                     "sha256": hashlib.sha256(raw).hexdigest(),
                     "sweep": manifest.sweep, "judge": _safe_judge(manifest.judge),
                     "datasets": manifest.datasets, "models": manifest.models},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "versions": versions(),
        "cells": [{"cell": p.cell.id, "dataset": p.cell.dataset, "model": p.cell.model,
                   "task": p.cell.task, "fingerprint": p.fingerprint, "ran": p.runs,
                   "why": p.why, "folder": p.folder.folder, "command": _safe_command(p)}
                  for p in plans],
    }


def _safe_url(url: str) -> str:
    """A URL without user, password, query or fragment (where credentials could hide)."""
    from urllib.parse import urlsplit, urlunsplit

    from evalbeam.transforms.judge.journal import endpoint_host

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, endpoint_host(url), parts.path, "", ""))


def _safe_judge(judge: dict) -> dict:
    """The [judge] table for sweep.json: the URL without credentials (_safe_url), anything
    named like a secret masked."""
    from evalbeam.pipelines.launch.common import SECRET_WORDS

    out = {}
    for key, value in judge.items():
        if key == "url" and isinstance(value, str):
            out[key] = _safe_url(value)
        elif any(word in key for word in SECRET_WORDS) and key != "api_key_env":
            out[key] = "***"
        else:
            out[key] = value
    return out


def _safe_command(plan: Plan) -> str:
    """The cell's command line, as `evalbeam <task> ...` would take it (secrets never reach
    it: keys come from environment variables, which are named, not read, here)."""
    import shlex

    from evalbeam.pipelines.launch.common import safe_beam_args

    argv = [a for a in plan.cell.argv if a != "--judge_skip_check"]
    for i, arg in enumerate(argv[:-1]):
        if arg == "--judge_url":
            argv[i + 1] = _safe_url(argv[i + 1])
    return " ".join(shlex.quote(a) for a in ["evalbeam", plan.cell.task] + safe_beam_args(argv))



def remove_leftovers(output: str, skipped: list[Plan]) -> None:
    """Remove the temporary folders that killed runs left in DIR (a sweep killed while it
    published, see finish) and in the folders of the cells that are skipped as done.

    A cell that runs removes its own (OutputFolder.start), but a done cell is skipped, so a cell
    killed after its final run.json was written and before its temporary folder was removed
    (OutputFolder.publish) would keep that folder for good. Only folders that are provably
    evalbeam's are removed (transforms.outputs: marked as such, or named by the cell's own
    run.json); anything else named like one is the user's and stays."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.outputs import OutputFolder

    # the sweep folder's own: OutputFolder(output) only lists them, it checks nothing here
    folders = [OutputFolder(output)] + [p.folder for p in skipped]
    for folder in folders:
        stale = folder.temp_folders()
        if stale:
            FileSystems.delete(stale)



def publish(output: str, staging, names: list[str], info: dict) -> None:
    """Move the sweep's files (names, written into staging's temporary folder) into DIR, then
    write sweep.json with its final status, then remove the temporary folder.

    sweep.json is the sweep's status, and it is written last: while it says "running" (from the
    sweep's start, when the previous leaderboard files are removed, until here) the files beside
    it are not the sweep's result, whatever of them stands there (a kill while they were moved
    leaves some); one that says how the sweep ended stands beside every file of that sweep. A
    kill anywhere leaves the one or the other, and the sweep run again (done cells skipped)
    removes what was left (run_sweep, remove_leftovers) and publishes the whole set."""
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.io import join

    finals = [join(output, n) for n in names]
    present = [path for path in finals if path_exists(path)]
    if present:   # removed when the sweep started; only a concurrent writer puts one back
        FileSystems.delete(present)
    FileSystems.rename([staging.temp(n) for n in names], finals)
    write_sweep_json(output, info)
    staging.cleanup()


def write_text(path: str, text: str) -> None:
    """Write a text file atomically (temporary name, then rename)."""
    from apache_beam.io.filesystems import FileSystems

    tmp = path + ".tmp"
    with FileSystems.create(tmp) as stream:
        stream.write(text.encode("utf-8"))
    if path_exists(path):
        FileSystems.delete([path])
    FileSystems.rename([tmp], [path])
