"""`evalbeam sweep`: many models x many datasets in one Beam pipeline, resumable, with a
leaderboard.

    evalbeam sweep SWEEP.toml --output DIR [--dry_run] [--force] [--quiet] [Beam options]
    evalbeam sweep validate SWEEP.toml [--output DIR]

The manifest (pipelines/sweep_manifest.py) expands to cells, one per (dataset, model). Each
cell is set up exactly as `evalbeam <task>` would set it up alone (launcher.parse_command and
prepare_run) and writes the same files under DIR/cells/<dataset>/<model>/; all the cells that
need to run are one pipeline, in which a source several cells read is read once
(transforms.io.share_reads). A cell whose fingerprint (task, options, evalbeam version, every
input file's checksum) matches finished outputs is skipped. DIR/sweep.json records the manifest,
every cell's fingerprint, status, counts and wall time; DIR/leaderboard.jsonl and .csv put the
headline metrics side by side (pipelines/leaderboard.py). Reference: pipelines/sweep.md.

Exit codes: 0 every cell complete; 1 a cell rejected more rows than allowed; 2 an unusable
manifest, command line, input or output folder (nothing ran); 3 a cell's pipeline failed;
4 a cell is incomplete; 5 every cell ended but a gate failed (pipelines/sweep_finishing.py).
With several, the worst in the order 3, 4, 5, 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

from evalbeam.pipelines.common import (EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_REJECTED,
                                       EXIT_USAGE, UsageError, say_error, split_beam_args)
from evalbeam.pipelines import sweep_finishing
from evalbeam.pipelines.sweep_manifest import Cell, ManifestError, load, option_args
from evalbeam.transforms.outputs import EXIT_CODES, _exists

SWEEP_JSON, LEADERBOARD_JSONL, LEADERBOARD_CSV = "sweep.json", "leaderboard.jsonl", "leaderboard.csv"
ENDED = ("complete", "complete_with_rejections")
# options that change how a cell runs, not what it computes: left out of the fingerprint
NOT_IN_FINGERPRINT = {"num_shards", "rpm", "tpm", "concurrency", "workers", "timeout_s",
                      "deadline_s", "max_attempts", "journal", "skip_check", "dry_run",
                      "max_calls", "max_cost", "api_key_env", "price_prompt_1k",
                      "price_completion_1k"}
# a task that averages each model over the datums it answered (pipelines/leaderboard.py)
OWN_DATUMS = {"retrieval": lambda config: not getattr(config, "complete", True)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evalbeam sweep", allow_abbrev=False,
        description="Evaluate many models on many datasets in one Beam pipeline, skipping cells "
                    "whose inputs and options have not changed, and write a leaderboard. "
                    "`evalbeam sweep validate SWEEP.toml` checks the manifest and every input. "
                    "Options not listed here are passed to Beam.")
    parser.add_argument("manifest", metavar="SWEEP.toml")
    parser.add_argument("--output", metavar="DIR", default=None,
                        help="the sweep's folder: sweep.json, leaderboard.jsonl/.csv, cells/")
    parser.add_argument("--dry_run", action="store_true",
                        help="list the cells, which would run and which are done, and the judge "
                             "calls and estimated cost; write nothing into DIR")
    parser.add_argument("--force", action="store_true", help="rerun every cell, done or not")
    parser.add_argument("--quiet", action="store_true", help="no progress and no summary")
    parser.add_argument("--num_shards", type=int, default=None,
                        help="datum shards of every cell (default: per dataset, from its size)")
    parser.add_argument("--input_split_bytes", type=int, default=None, metavar="N",
                        help="read an uncompressed JSONL or TREC file larger than this in byte "
                             "spans, on several workers at once (default: the input in 32 spans "
                             "of 8 to 64 MiB; 0: each file by one worker)")
    sweep_finishing.add_arguments(parser)
    return parser


def run(argv: list[str]) -> int:
    started = time.time()
    validate_only = bool(argv) and argv[0] == "validate"
    if validate_only:
        argv = argv[1:]
    parser = build_parser()
    parser.error = _usage_error
    try:
        args, rest = parser.parse_known_args(argv)
        beam_args = split_beam_args(rest)
        if args.output is None and not validate_only:
            raise UsageError("--output DIR is required (the sweep's folder)")
        if args.num_shards is not None and args.num_shards < 1:
            raise UsageError("--num_shards must be 1 or more")
        manifest = load(args.manifest)
        output = args.output or os.path.join(os.path.dirname(os.path.abspath(args.manifest)),
                                             ".evalbeam-validate")
        plans = plan_cells(manifest, output, beam_args, args, started)
        args.finishing = sweep_finishing.prepare(manifest, plans, args)
        if not validate_only:
            check_sweep_folder(output)
    except ManifestError as error:
        for message in error.errors:
            say_error(message)
        say_error(f"{len(error.errors)} problem(s) in {args.manifest if 'args' in dir() else 'the manifest'}; nothing ran.")
        return EXIT_USAGE
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE
    if validate_only:
        try:
            check_judge_once(plans)
        except UsageError as error:
            say_error(str(error))
            return EXIT_USAGE
        judge = sum(1 for p in plans if p.judged)
        print(f"{args.manifest}: {len(plans)} cell(s) over {len({p.cell.dataset for p in plans})} "
              f"dataset(s) and {len({p.cell.model for p in plans})} model(s), every input "
              f"checked{f'; {judge} cell(s) call the judge' if judge else ''}. The manifest is valid.")
        return EXIT_OK
    for plan in plans:
        plan.decide(args.force)
    if args.dry_run:
        return dry_run(plans, manifest, output, beam_args, args, started)
    try:
        check_judge_once([p for p in plans if p.runs])
    except UsageError as error:
        say_error(f"{error} Nothing ran.")
        return EXIT_USAGE
    if any(p.runs for p in plans):
        from evalbeam.pipelines.launcher import check_runner

        try:
            check_runner(beam_args)      # before run_sweep writes sweep.json
        except UsageError as error:
            say_error(str(error))
            return EXIT_USAGE
    return run_sweep(plans, manifest, output, beam_args, args, started)


def check_judge_once(plans: list) -> None:
    """The judge endpoint and key checked once (pipelines.judge_options.check_judge), if any of
    these cells calls the judge and the manifest does not say skip_check; raises UsageError."""
    from evalbeam.pipelines.judge_options import check_judge

    judged = [p for p in plans if p.judged]
    if judged and not judged[0].manifest_skip_check:
        p = judged[0]
        check_judge(p.config.judge_settings, key_named=p.args.judge_api_key_env is not None)


def _usage_error(message: str):
    raise UsageError(message)


class Plan:
    """One cell, set up: the parsed command line, the output folder, run.json as it would
    start, the fingerprint, and whether it runs."""

    def __init__(self, cell: Cell, spec, args, config, models, slices, folder, sources, run_info,
                 beam_args, headlines, judged: bool):
        self.cell, self.spec, self.args, self.config = cell, spec, args, config
        self.models, self.slices, self.folder, self.sources = models, slices, folder, sources
        self.run_info, self.beam_args, self.headlines, self.judged = run_info, beam_args, headlines, judged
        self.fingerprint = None
        self.manifest_skip_check = False
        self.runs, self.why = True, "new"
        self.previous = None

    @property
    def sidecar_path(self) -> str:
        from evalbeam.pipelines.leaderboard import SIDECAR
        from evalbeam.transforms.io import join

        return join(self.folder.folder, SIDECAR)

    def decide(self, force: bool) -> None:
        """Whether the cell runs, and why: done cells (finished outputs with this fingerprint)
        are skipped unless force."""
        from evalbeam.transforms.io import read_json

        previous = _read_or_none(self.folder.final("run.json"), read_json)
        side = _read_or_none(self.sidecar_path, read_json)
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


def _read_or_none(path, reader):
    try:
        return reader(path)
    except Exception:
        return None


def plan_cells(manifest, output: str, beam_args: list[str], sweep_args, started: float) -> list[Plan]:
    """Every cell set up as its own run would be, inputs and folders checked, nothing written;
    raises ManifestError with every problem found."""
    from evalbeam.pipelines.launcher import build_parser as task_parser, parse_command, prepare_run
    from evalbeam.pipelines.leaderboard import headlines_of
    from evalbeam.pipelines.registry import spec_of
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
        spec = spec_of(cell.task)
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


# ---- the sweep's own folder ----

def check_sweep_folder(output: str) -> None:
    """Refuse a folder whose sweep.json or leaderboard files evalbeam did not write."""
    from evalbeam.transforms.io import join, read_json

    if "://" not in output and os.path.exists(output) and not os.path.isdir(output):
        raise UsageError(f"--output {output} is a file, not a folder")
    own = _read_or_none(join(output, SWEEP_JSON), read_json)
    present = [n for n in (SWEEP_JSON, LEADERBOARD_JSONL, LEADERBOARD_CSV) + sweep_finishing.SWEEP_OUTPUTS
               if _exists(join(output, n))]
    if present and not (isinstance(own, dict) and own.get("written_by") == "evalbeam"):
        raise UsageError(f"the folder {output} holds {', '.join(present)}, which evalbeam's sweep "
                         "did not write; choose another --output or move them away")


def write_sweep_json(output: str, info: dict) -> None:
    from evalbeam.transforms.io import join
    from evalbeam.transforms.outputs import write_json_atomic

    write_json_atomic(dict(info, written_by="evalbeam"), join(output, SWEEP_JSON))


def sweep_info(manifest, plans: list[Plan], started: float, status: str) -> dict:
    from evalbeam.pipelines.common import versions

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
    from evalbeam.pipelines.common import SECRET_WORDS

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

    from evalbeam.pipelines.common import safe_beam_args

    argv = [a for a in plan.cell.argv if a != "--judge_skip_check"]
    for i, arg in enumerate(argv[:-1]):
        if arg == "--judge_url":
            argv[i + 1] = _safe_url(argv[i + 1])
    return " ".join(shlex.quote(a) for a in ["evalbeam", plan.cell.task] + safe_beam_args(argv))


# ---- dry run ----

def dry_run(plans: list[Plan], manifest, output: str, beam_args, args, started) -> int:
    """The cells, which would run and why, and for judge cells that would run the judge calls
    and estimated cost (the text task's --judge_dry_run, run in a scratch folder: nothing is
    sent and nothing is written into DIR)."""
    import tempfile

    from evalbeam.pipelines.summary import _table

    judge = {}
    todo = [p for p in plans if p.runs and p.judged]
    if todo:
        with tempfile.TemporaryDirectory(prefix="evalbeam-sweep-dry-") as scratch:
            judge = _judge_dry_run(todo, output, scratch, beam_args, started)
    rows = []
    for p in plans:
        calls = judge.get(p.cell.id)
        rows.append([p.cell.id, p.cell.task, "run" if p.runs else "skip", p.why,
                     "-" if calls is None else f"{calls['requests']:,} ({calls['cached']:,} cached)",
                     "-" if calls is None else f"{calls['estimated_cost']:.4f}"])
    print(_table(["cell", "task", "action", "why", "judge requests", "est. cost"], rows))
    runs = sum(p.runs for p in plans)
    total = sum(c["requests"] - c["cached"] for c in judge.values())
    cost = sum(c["estimated_cost"] for c in judge.values())
    print(f"\nDry run: {runs} of {len(plans)} cell(s) would run, {len(plans) - runs} are done"
          + (f"; the judge would get {total:,} request(s) not in the journal, estimated cost "
             f"{cost:.4f}" if judge else "") + ". Nothing was written.")
    return EXIT_OK


def _judge_dry_run(todo: list[Plan], output: str, scratch: str, beam_args, started) -> dict:
    from evalbeam.pipelines.launcher import parse_command, prepare_run
    from evalbeam.transforms.io import join, read_json

    dry = []
    for p in todo:
        argv = [a for a in p.cell.argv]
        i = argv.index("--output")
        argv[i + 1] = join(join(scratch, p.cell.dataset), p.cell.model)
        if "--judge_journal" not in argv:
            argv += ["--judge_journal", join(output, "judge-journal")]
        argv += ["--judge_dry_run"]
        args, config, models, slices, _ = parse_command(p.spec, argv + beam_args, exit_on_error=False)
        folder, sources, run_info, cell_beam = prepare_run(p.spec, config, args, models, slices,
                                                           beam_args, started)
        clone = Plan(p.cell, p.spec, args, config, models, slices, folder, sources, run_info,
                     cell_beam, p.headlines, True)
        clone.fingerprint = p.fingerprint
        dry.append(clone)
    execute(dry, beam_args, quiet=True, started=started, sidecars=False)
    out = {}
    for p in dry:
        info = _read_or_none(p.folder.final("run.json"), read_json) or {}
        report = info.get("judge") or {}
        out[p.cell.id] = {"requests": report.get("requests", 0), "cached": report.get("cached", 0),
                          "estimated_cost": report.get("estimated_cost", 0.0)}
    return out


# ---- running ----

def execute(plans: list[Plan], beam_args: list[str], quiet: bool, started: float,
            sidecars: bool = True) -> str | None:
    """Run the cells as one pipeline. Returns None, or the failure's reason when the pipeline
    failed (cells that published before it keep their outputs)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from evalbeam.pipelines.common import make_pipeline
    from evalbeam.pipelines.launcher import _multi_process, failure_of, worker_stderr_filtered
    from evalbeam.transforms.io import split_inputs

    if not plans:
        return None
    options = PipelineOptions(plans[0].beam_args)
    pipeline = make_pipeline(options)
    split_inputs(pipeline, plans[0].args.input_split_bytes)
    _split_judge_rates(plans)
    try:
        _add_cells(pipeline, plans, started, sidecars)
        with worker_stderr_filtered(_multi_process(options), keep_progress=not quiet):
            pipeline.run().wait_until_finish()
    except Exception as error:
        return failure_of(error)[2]
    return None


def _add_cells(pipeline, plans: list[Plan], started: float, sidecars: bool) -> None:
    """Every cell's graph: cells that share their task and options as one graph over all their
    datasets and models (pipelines/sweep_cells.py), any other cell as its own launcher.TaskJob."""
    from evalbeam.pipelines.launcher import TaskJob
    from evalbeam.pipelines.leaderboard import cell_sidecar
    from evalbeam.pipelines.sweep_cells import CellGroupJob, group_job, groups_of
    from evalbeam.transforms.evaluated import FilesJob
    from evalbeam.transforms.io import share_reads

    groups = groups_of(plans)
    # a source that several graphs read is read once and shared; the others are read together
    # with their graph's other sources, as in a run alone (transforms.io.ReadFiles)
    uses: dict = {}
    for group in groups:
        sources = {(name, tuple(source.files)) for p in group for name, source in p.sources.items()}
        for key in sources:
            uses[key] = uses.get(key, 0) + 1
    share_reads(pipeline, uses)
    for group in groups:
        for p in group:
            p.folder.start(p.run_info)
        p = group[0]
        own_datums = OWN_DATUMS.get(p.cell.task, lambda c: False)(p.config)
        if len(group) == 1:
            job = FilesJob(p.sources, tuple(sorted(p.models)), tuple(p.slices),
                           p.run_info["options"]["num_shards"], True, started, p.folder.temp,
                           p.args.uncertainty, None, presence=sidecars)
            sidecar = (cell_sidecar(p.sidecar_path, p.cell.model, p.headlines, own_datums,
                                    p.fingerprint, p.cell.id) if sidecars else None)
            _ = pipeline | f"Cell[{p.cell.id}]" >> TaskJob(
                p.spec, p.config, job, p.folder, p.run_info, p.args.max_rejected_fraction, sidecar)
            continue
        job, cells = group_job(group, started, sidecars)
        _ = pipeline | f"Cells[{p.cell.id} and {len(group) - 1} more]" >> CellGroupJob(
            p.spec, p.config, job, cells, p.args.max_rejected_fraction, p.headlines, own_datums)


def _split_judge_rates(plans: list[Plan]) -> None:
    """The judge's rate limits are the whole sweep's: cells that call it at once share them."""
    import dataclasses

    judged = [p for p in plans if getattr(p.config, "judge_settings", None) is not None]
    if len(judged) < 2:
        return
    n = len(judged)
    for p in judged:
        s = p.config.judge_settings
        settings = dataclasses.replace(
            s, rpm=s.rpm / n, tpm=None if s.tpm is None else s.tpm / n,
            concurrency=max(1, s.concurrency // n))
        p.config = dataclasses.replace(p.config, judge_settings=settings)


def run_sweep(plans: list[Plan], manifest, output: str, beam_args, args, started: float) -> int:
    from evalbeam.transforms.io import InputError, join, read_json

    todo = [p for p in plans if p.runs]
    info = sweep_info(manifest, plans, started, "running")
    try:
        if not _exists(output):
            from apache_beam.io.filesystems import FileSystems

            FileSystems.mkdirs(output)
        write_sweep_json(output, info)
        for name in (LEADERBOARD_JSONL, LEADERBOARD_CSV) + sweep_finishing.SWEEP_OUTPUTS:
            # never stale beside a running sweep
            if _exists(join(output, name)):
                from apache_beam.io.filesystems import FileSystems

                FileSystems.delete([join(output, name)])
        remove_leftovers(output, [p for p in plans if not p.runs])
    except Exception as error:
        say_error(f"cannot write to the sweep folder {output!r}: {error}")
        return EXIT_USAGE
    if not args.quiet:
        print(f"evalbeam: sweep of {len(plans)} cell(s): {len(todo)} to run, "
              f"{len(plans) - len(todo)} done already", file=sys.stderr)
    failures: dict[str, str] = {}
    try:
        reason = execute(todo, beam_args, args.quiet, started)
    except InputError as error:
        reason = str(error)
    if reason is not None:
        # One pipeline: a cell that breaks it stops the others. Run the unfinished ones one by
        # one, so that the failing cell fails alone and the others finish.
        left = [p for p in todo if (_read_or_none(p.folder.final("run.json"), read_json) or {}
                                    ).get("status") not in ENDED]
        if not args.quiet:
            print(f"evalbeam: the sweep's pipeline failed ({reason}); running the "
                  f"{len(left)} unfinished cell(s) one at a time", file=sys.stderr)
        for p in left:
            p.folder = type(p.folder)(p.folder.folder, p.folder.extra, overwrite=True, after=p.folder.after)
            p.folder.check([])
            alone = execute([p], beam_args, args.quiet, started)
            if alone is not None:
                failures[p.cell.id] = alone
                p.run_info.update(error=alone, wall_time_seconds=round(time.time() - started, 3))
                p.folder.fail(p.run_info)
    return finish(plans, manifest, output, started, failures, args.quiet, args)


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
        stale = folder._temp_folders()
        if stale:
            FileSystems.delete(stale)


WORST = (EXIT_FAILED, EXIT_INCOMPLETE, EXIT_REJECTED, EXIT_OK)


def finish(plans: list[Plan], manifest, output: str, started: float, failures: dict,
           quiet: bool, args=None) -> int:
    """Read every cell's run.json, write and publish the leaderboard (and the files of
    sweep_finishing) and sweep.json (publish), print the summary; returns the exit code."""
    from evalbeam.pipelines import leaderboard
    from evalbeam.transforms.io import read_json
    from evalbeam.transforms.outputs import OutputFolder

    info = sweep_info(manifest, plans, started, "complete")
    finished, codes = [], []
    for p, entry in zip(plans, info["cells"]):
        run_json = _read_or_none(p.folder.final("run.json"), read_json) or {}
        status = run_json.get("status", "failed")
        if status == "running":
            status = "failed"
        entry.update(status=status,
                     counts={"rows_read": run_json.get("rows_read"),
                             "rows_rejected": run_json.get("rows_rejected")},
                     wall_time_seconds=run_json.get("wall_time_seconds"),
                     problems=[x["message"] for x in run_json.get("problems", [])
                               if x.get("severity") == "error"])
        if p.cell.id in failures:
            entry["error"] = failures[p.cell.id]
        elif run_json.get("error"):
            entry["error"] = run_json["error"]
        codes.append(EXIT_CODES.get(status, EXIT_FAILED))
        side = _read_or_none(p.sidecar_path, read_json) if status in ENDED else None
        if side is not None and side.get("fingerprint") == p.fingerprint:
            finished.append({"cell": p.cell.id, "dataset": p.cell.dataset, "task": p.cell.task,
                             "model": p.cell.model, "sidecar": side})
    confidence = float(manifest.sweep.get("confidence", 0.95))
    baselines = {d["name"]: d.get("baseline", manifest.sweep.get("baseline")) for d in manifest.datasets}
    rows, problems = leaderboard.build(finished, confidence, baselines)
    # every file of the sweep is written into a temporary folder first, then published (publish)
    staging = OutputFolder(output)
    staging.make_temp()
    with_jsonl = "".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in rows)
    _write_text(staging.temp(LEADERBOARD_JSONL), with_jsonl)
    _write_text(staging.temp(LEADERBOARD_CSV), leaderboard.to_csv(rows))
    code = next((c for c in WORST if c in codes), EXIT_OK)
    info.update(status="complete" if code == EXIT_OK else "failed" if code == EXIT_FAILED else
                "incomplete" if code == EXIT_INCOMPLETE else "complete_with_rejections",
                exit_code=code, leaderboard_problems=problems,
                ran=sum(p.runs for p in plans), skipped=sum(not p.runs for p in plans),
                leaderboard_rows=len(rows),
                wall_time_seconds=round(time.time() - started, 3))
    if args is not None and getattr(args, "finishing", None):
        gates, baseline = args.finishing
        code = sweep_finishing.finish(plans, output, gates, baseline, args, code, info, quiet,
                                      into=staging.tmp)
    publish(output, staging, [LEADERBOARD_JSONL, LEADERBOARD_CSV] + info.get("files", []), info)
    if args is not None and getattr(args, "mlflow_tracking_uri", None):
        code = sweep_finishing.log_cells(plans, info, args.mlflow_tracking_uri, output, quiet, code)
    if not quiet:
        print(summary(info, rows, output))
    for problem in problems:
        print(f"evalbeam: warning: {problem}", file=sys.stderr)
    bad = [c for c in info["cells"] if c["status"] != "complete"]
    if bad:
        print("evalbeam: " + "; ".join(
            f"cell {c['cell']} is {c['status']}" + (f" ({c['error']})" if c.get("error") else
                                                    f" ({' '.join(c['problems'])})" if c["problems"] else "")
            for c in bad[:10]) + f". sweep.json and each cell's run.json say more; the other "
              "cells' outputs are complete.", file=sys.stderr)
    return code


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
    present = [path for path in finals if _exists(path)]
    if present:   # removed when the sweep started; only a concurrent writer puts one back
        FileSystems.delete(present)
    FileSystems.rename([staging.temp(n) for n in names], finals)
    write_sweep_json(output, info)
    staging.cleanup()


def _write_text(path: str, text: str) -> None:
    """Write a text file atomically (temporary name, then rename)."""
    from apache_beam.io.filesystems import FileSystems

    tmp = path + ".tmp"
    with FileSystems.create(tmp) as stream:
        stream.write(text.encode("utf-8"))
    if _exists(path):
        FileSystems.delete([path])
    FileSystems.rename([tmp], [path])


def summary(info: dict, rows: list[dict], output: str) -> str:
    from evalbeam.pipelines.summary import _table, printable

    def fmt(metric):
        if metric is None or metric.get("value") is None:
            return "-"
        text = f"{metric['value']:.4f}"
        interval = metric.get("interval")
        if interval and interval.get("low") is not None:
            text += f" [{interval['low']:.4f}, {interval['high']:.4f}]"
        return text

    table_rows = []
    for r in rows:
        if r["slice"]:
            continue
        primary = r["primary"]
        comparison = (r["metrics"].get(primary) or {}).get("comparison") or {}
        vs = "-"
        if comparison:
            vs = f"{comparison['difference']:+.4f} vs {comparison['against']}"
            if comparison.get("p_value_adjusted") is not None:
                vs += f" (q={comparison['p_value_adjusted']:.3g})"
        table_rows.append([r["dataset"], r["model"], "-" if r["rank"] is None else str(r["rank"]),
                           printable(primary), fmt(r["metrics"].get(primary)), vs])
    ran, skipped = info["ran"], info["skipped"]
    text = _table(["dataset", "model", "rank", "headline", "value", "difference"], table_rows)
    return (f"{text}\n\nSweep: {len(info['cells'])} cell(s), {ran} ran, {skipped} skipped (done). "
            f"Leaderboard ({info['leaderboard_rows']:,} rows, every slice) in {output}/leaderboard.jsonl "
            f"and .csv; cells in {output}/cells/; sweep.json. Wall time "
            f"{info['wall_time_seconds']:.1f} s.")
