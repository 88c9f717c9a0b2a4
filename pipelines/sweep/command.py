"""`evalbeam sweep`: many models x many datasets in one Beam pipeline, resumable, with a
leaderboard.

    evalbeam sweep SWEEP.toml --output DIR [--dry_run] [--force] [--quiet] [Beam options]
    evalbeam sweep validate SWEEP.toml [--output DIR]

The manifest (pipelines/sweep/manifest.py) expands to cells, one per (dataset, model). Each
cell is set up exactly as `evalbeam <task>` would set it up alone (launcher.parse_command and
prepare_run) and writes the same files under DIR/cells/<dataset>/<model>/; all the cells that
need to run are one pipeline, in which a source several cells read is read once
(transforms.io.share_reads). A cell whose fingerprint (task, options, evalbeam version, every
input file's checksum) matches finished outputs is skipped. DIR/sweep.json records the manifest,
every cell's fingerprint, status, counts and wall time; DIR/leaderboard.jsonl and .csv put the
headline metrics side by side (pipelines/sweep/leaderboard.py). Reference: pipelines/sweep/sweep.md.

Exit codes: 0 every cell complete; 1 a cell rejected more rows than allowed; 2 an unusable
manifest, command line, input or output folder (nothing ran); 3 a cell's pipeline failed;
4 a cell is incomplete; 5 every cell ended but a gate failed (pipelines/sweep/finishing.py).
With several, the worst in the order 3, 4, 5, 1.

Here: the command line, its checks (`validate`) and the dry run. The cells' set-up and
fingerprints are pipelines/sweep/plan.py, running them and the end of the sweep
pipelines/sweep/running.py, the sweep folder's files pipelines/sweep/folder.py.
"""

from __future__ import annotations

import argparse
import os
import time

from evalbeam.pipelines.launch.common import EXIT_OK, EXIT_USAGE, UsageError, say_error, split_beam_args
from evalbeam.pipelines.sweep import finishing as sweep_finishing
from evalbeam.pipelines.sweep.folder import check_sweep_folder, read_or_none
from evalbeam.pipelines.sweep.manifest import ManifestError, load
from evalbeam.pipelines.sweep.plan import Plan, plan_cells
from evalbeam.pipelines.sweep.running import execute, run_sweep


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
        from evalbeam.pipelines.launch.launcher import check_runner

        try:
            check_runner(beam_args)      # before run_sweep writes sweep.json
        except UsageError as error:
            say_error(str(error))
            return EXIT_USAGE
    return run_sweep(plans, manifest, output, beam_args, args, started)


def check_judge_once(plans: list) -> None:
    """The judge endpoint and key checked once (pipelines.judge_options.check_judge), if any of
    these cells calls the judge and the manifest does not say skip_check; raises UsageError."""
    from evalbeam.pipelines.tasks.judge_options import check_judge

    judged = [p for p in plans if p.judged]
    if judged and not judged[0].manifest_skip_check:
        p = judged[0]
        check_judge(p.config.judge_settings, key_named=p.args.judge_api_key_env is not None)


def _usage_error(message: str):
    raise UsageError(message)


# ---- dry run ----

def dry_run(plans: list[Plan], manifest, output: str, beam_args, args, started) -> int:
    """The cells, which would run and why, and for judge cells that would run the judge calls
    and estimated cost (the text task's --judge_dry_run, run in a scratch folder: nothing is
    sent and nothing is written into DIR)."""
    import tempfile

    from evalbeam.pipelines.tasks.summary import text_table

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
    print(text_table(["cell", "task", "action", "why", "judge requests", "est. cost"], rows))
    runs = sum(p.runs for p in plans)
    total = sum(c["requests"] - c["cached"] for c in judge.values())
    cost = sum(c["estimated_cost"] for c in judge.values())
    print(f"\nDry run: {runs} of {len(plans)} cell(s) would run, {len(plans) - runs} are done"
          + (f"; the judge would get {total:,} request(s) not in the journal, estimated cost "
             f"{cost:.4f}" if judge else "") + ". Nothing was written.")
    return EXIT_OK


def _judge_dry_run(todo: list[Plan], output: str, scratch: str, beam_args, started) -> dict:
    from evalbeam.pipelines.launch.launcher import parse_command, prepare_run
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
        info = read_or_none(p.folder.final("run.json"), read_json) or {}
        report = info.get("judge") or {}
        out[p.cell.id] = {"requests": report.get("requests", 0), "cached": report.get("cached", 0),
                          "estimated_cost": report.get("estimated_cost", 0.0)}
    return out
