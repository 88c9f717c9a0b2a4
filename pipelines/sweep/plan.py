"""A sweep's cells set up: each cell's Plan (its command line parsed and checked exactly as
`evalbeam <task>` alone would, its output folder, run.json as it would start) and the
fingerprint that decides whether a finished cell runs again (pipelines/sweep/sweep.md).

Nothing here writes: plan_cells raises ManifestError with every problem of every cell, so a
sweep that cannot run stops before any cell starts.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

from evalbeam.pipelines.launch.common import UsageError
from evalbeam.pipelines.sweep.folder import read_or_none
from evalbeam.pipelines.sweep.manifest import Cell, ManifestError, option_args

# the statuses of a cell that ended with its metrics written (a done cell is one of these)
ENDED = ("complete", "complete_with_rejections")
# options that change how a cell runs, not what it computes: left out of the fingerprint
NOT_IN_FINGERPRINT = {"num_shards", "rpm", "tpm", "concurrency", "workers", "timeout_s",
                      "deadline_s", "max_attempts", "journal", "skip_check", "dry_run",
                      "max_calls", "max_cost", "api_key_env", "price_prompt_1k",
                      "price_completion_1k"}


@dataclass(eq=False)
class Plan:
    """One cell, set up: the parsed command line (args, config, models, slices: what
    launcher.parse_command returns), the output folder, its sources and run.json as it would
    start (folder, sources, run_info, beam_args: what launcher.prepare_run returns), the
    leaderboard's headlines and whether the cell calls the judge; then, once planned, the
    fingerprint and whether it runs (decide). Compared by identity: two cells are never equal."""

    cell: Cell
    spec: object
    args: object
    config: object
    models: list
    slices: list
    folder: object
    sources: dict
    run_info: dict
    beam_args: list
    headlines: list
    judged: bool
    fingerprint: str | None = field(default=None, init=False)
    manifest_skip_check: bool = field(default=False, init=False)
    runs: bool = field(default=True, init=False)
    why: str = field(default="new", init=False)
    previous: dict | None = field(default=None, init=False)

    @property
    def sidecar_path(self) -> str:
        from evalbeam.pipelines.sweep.leaderboard import SIDECAR
        from evalbeam.transforms.io import join

        return join(self.folder.folder, SIDECAR)

    def decide(self, force: bool) -> None:
        """Whether the cell runs, and why: done cells (finished outputs with this fingerprint)
        are skipped unless force."""
        from evalbeam.transforms.io import read_json

        previous = read_or_none(self.folder.final("run.json"), read_json)
        side = read_or_none(self.sidecar_path, read_json)
        self.previous = previous
        if previous is None:
            self.runs, self.why = True, "new"
        elif previous.get("sweep", {}).get("fingerprint") != self.fingerprint:
            self.runs, self.why = True, "changed (inputs, options or evalbeam version)"
        elif previous.get("status") not in ENDED:
            self.runs, self.why = True, f"unfinished ({previous.get('status')})"
        elif side is None or side.get("fingerprint") != self.fingerprint:
            self.runs, self.why = True, "leaderboard inputs missing"
        elif force:
            self.runs, self.why = True, "forced (--force)"
        else:
            self.runs, self.why = False, "done"


def plan_cells(manifest, output: str, beam_args: list[str], sweep_args, started: float) -> list[Plan]:
    """Every cell set up as its own run would be, inputs and folders checked, nothing written;
    raises ManifestError with every problem found."""
    from evalbeam.pipelines.launch.launcher import build_parser as task_parser, parse_command, prepare_run
    from evalbeam.pipelines.sweep.leaderboard import headlines_of
    from evalbeam.pipelines.tasks.registry import task_of
    from evalbeam.transforms.io import InputError, join
    from evalbeam.transforms.outputs import ForeignOutputs

    errors: list[str] = []
    plans: list[Plan] = []
    settings = manifest.sweep
    common = []
    for key in ("bootstrap", "confidence", "bootstrap_seed", "max_rejected_fraction"):
        if key in settings:
            common += [f"--{key}", str(settings[key])]
    judge_args = option_list({f"judge_{k}": v for k, v in manifest.judge.items()})
    if manifest.judge and "journal" not in manifest.judge:
        judge_args += ["--judge_journal", join(output, "judge-journal")]
    headline_errors = set()
    parsers: dict = {}
    for cell in manifest.cells:
        spec = task_of(cell.task)
        where = f"cell {cell.id} (manifest line {cell.line})"
        if cell.task not in parsers:
            parsers[cell.task] = task_parser(spec)
        parser = parsers[cell.task]
        try:
            options = option_args(cell.options, parser, where)
        except UsageError as error:   # its message names the cell already
            errors.append(str(error))
            continue
        try:
            argv = ["--groundtruths", cell.groundtruths, "--predictions",
                    f"{cell.model}={cell.predictions}",
                    "--output", join(join(join(output, "cells"), cell.dataset), cell.model), "--quiet"]
            argv += options + common
            if sweep_args.num_shards:
                argv += ["--num_shards", str(sweep_args.num_shards)]
            split = getattr(sweep_args, "input_split_bytes", None)   # plan_cells' callers may omit it
            if split is not None:
                argv += ["--input_split_bytes", str(split)]
            judged = cell.task == "text" and bool(manifest.judge)
            if judged:
                # the endpoint is checked once, after the sweep knows a judge cell will run
                # (check_judge_once): a finished sweep reruns with the judge down
                argv += judge_args + ["--judge_skip_check"]
            # the Beam options too, as the run alone gets them (the judge's worker count)
            args, config, models, slices, cell_beam = parse_command(spec, argv + beam_args,
                                                                    exit_on_error=False,
                                                                    parser=parser)
            if getattr(config, "judge", None) is None:
                judged = False
            folder, sources, run_info, cell_beam = prepare_run(spec, config, args, models, slices,
                                                               beam_args, started)
        except ForeignOutputs as error:
            errors.append(f"{where}: {foreign_cell_files(error)}")
            continue
        except (UsageError, InputError) as error:
            errors.append(f"{where}: {getattr(error, 'message', str(error))}")
            continue
        texts = None
        for table in (settings.get("headline"), _dataset(manifest, cell.dataset).get("headline")):
            if isinstance(table, dict):
                texts = table.get(cell.task, texts)
            elif table is not None:
                texts = table
        try:
            headlines = headlines_of(cell.task, texts)
        except (ValueError, TypeError) as error:
            if str(error) not in headline_errors:
                headline_errors.add(str(error))
                errors.append(f"headline of {cell.dataset}: {error}")
            continue
        cell.argv = argv
        plans.append(Plan(cell, spec, args, config, models, slices, folder, sources, run_info,
                          cell_beam, headlines, judged))
    if errors:
        raise ManifestError(errors)
    for plan in plans:
        plan.manifest_skip_check = bool(manifest.judge.get("skip_check"))
    _share_shards(plans)
    checksums: dict = {}
    for plan in plans:
        plan.fingerprint = fingerprint(plan, checksums)
        plan.run_info["sweep"] = {"cell": plan.cell.id, "fingerprint": plan.fingerprint,
                                  "manifest": os.path.abspath(manifest.path)}
    return plans


def foreign_cell_files(error) -> str:
    """The refusal of a cell folder holding files evalbeam did not write (ForeignOutputs), with
    the remedies a sweep has: it takes no --overwrite, and --force reruns cells but never
    replaces a file evalbeam did not write."""
    them = "it" if len(error.names) == 1 else "them"
    return (f"the cell's folder {error.folder} holds {', '.join(error.names)}, which evalbeam did "
            "not write (or which changed since it wrote them), under the name of a file the cell "
            f"writes. A sweep never replaces such a file, not even with --force: move {them} "
            "away, or give the sweep another --output folder.")


def _dataset(manifest, name: str) -> dict:
    return next(d for d in manifest.datasets if d["name"] == name)


def option_list(options: dict) -> list[str]:
    """[judge] settings as arguments (checked later by the text task's parser)."""
    out = []
    for name, value in options.items():
        if isinstance(value, bool):
            if value:
                out.append(f"--{name}")
        elif isinstance(value, list):
            for item in value:
                out += [f"--{name}", str(item)]
        else:
            out += [f"--{name}", str(value)]
    return out


def _share_shards(plans: list[Plan]) -> None:
    """Cells of one dataset get one shard count (the largest any of them would pick alone), so
    that they read its ground truth once: a shared read needs equal reader settings. The shard
    count changes no metric (pipelines/DESIGN.md, determinism)."""
    groups: dict[tuple, list[Plan]] = {}
    for plan in plans:
        if plan.args.num_shards:
            continue
        groups.setdefault((plan.cell.task, plan.cell.dataset), []).append(plan)
    for members in groups.values():
        shards = max(p.run_info["options"]["num_shards"] for p in members)
        for p in members:
            p.run_info["options"]["num_shards"] = shards


def file_checksum(path: str, cache: dict) -> str:
    """sha256 of a local file's content; for other file systems the checksum (etag, CRC or
    MD5) the file system keeps, with the size."""
    from apache_beam.io.filesystems import FileSystems

    if path in cache:
        return cache[path]
    if "://" not in path:
        digest = hashlib.sha256()
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        value = "sha256:" + digest.hexdigest()
    else:
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        value = f"fs:{FileSystems.checksum(path)}:{size}"
    cache[path] = value
    return value


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in NOT_IN_FINGERPRINT}
    return value


def fingerprint(plan: Plan, checksums: dict) -> str:
    """SHA-256 (first 24 hex digits) of what decides a cell's results: task, model name,
    options as run.json records them (without those that change only how it runs), slices,
    evalbeam's version, headline specs, and every input file's checksum."""
    info = plan.run_info
    content = {
        "task": info["task"], "models": info["models"], "slices": info["slices"],
        "options": _strip(info["options"]),
        "evalbeam": info["versions"].get("evalbeam"),
        "headlines": [h.text for h in plan.headlines],
        "inputs": {name: [file_checksum(p, checksums) for p in s["files"]]
                   for name, s in info["inputs"].items()},
    }
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]

