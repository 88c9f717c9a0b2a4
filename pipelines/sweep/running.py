"""Running a sweep's cells: every cell that runs in one Beam pipeline (cells that share their
task and options as one graph, pipelines/sweep/cells.py), the fall-back to one cell at a time
when that pipeline fails, then the end: each cell's run.json read back, the leaderboard, the
files of pipelines/sweep/finishing.py, sweep.json published (pipelines/sweep/folder.py) and the
summary printed.
"""

from __future__ import annotations

import json
import sys
import time

from evalbeam.pipelines.launch.common import (EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_REJECTED,
                                              EXIT_USAGE, say_error)
from evalbeam.pipelines.sweep import finishing as sweep_finishing
from evalbeam.pipelines.sweep.folder import (LEADERBOARD_CSV, LEADERBOARD_JSONL, SWEEP_OUTPUTS,
                                             publish, read_or_none, remove_leftovers, sweep_info,
                                             write_sweep_json, write_text)
from evalbeam.pipelines.sweep.plan import ENDED, Plan
from evalbeam.transforms.outputs import EXIT_CODES, path_exists

# a task that averages each model over the datums it answered (pipelines/sweep/leaderboard.py)
OWN_DATUMS = {"retrieval": lambda config: not getattr(config, "complete", True)}


def execute(plans: list[Plan], beam_args: list[str], quiet: bool, started: float,
            sidecars: bool = True) -> str | None:
    """Run the cells as one pipeline. Returns None, or the failure's reason when the pipeline
    failed (cells that published before it keep their outputs)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from evalbeam.pipelines.launch.common import make_pipeline
    from evalbeam.pipelines.launch.launcher import failure_of, multi_process, worker_stderr_filtered
    from evalbeam.transforms.io import split_inputs

    if not plans:
        return None
    options = PipelineOptions(plans[0].beam_args)
    pipeline = make_pipeline(options)
    split_inputs(pipeline, plans[0].args.input_split_bytes)
    _split_judge_rates(plans)
    try:
        _add_cells(pipeline, plans, started, sidecars)
        with worker_stderr_filtered(multi_process(options), keep_progress=not quiet):
            pipeline.run().wait_until_finish()
    except Exception as error:
        return failure_of(error)[2]
    return None


def _add_cells(pipeline, plans: list[Plan], started: float, sidecars: bool) -> None:
    """Every cell's graph: cells that share their task and options as one graph over all their
    datasets and models (pipelines/sweep/cells.py), any other cell as its own launcher.TaskJob."""
    from evalbeam.pipelines.launch.launcher import TaskJob
    from evalbeam.pipelines.sweep.leaderboard import cell_sidecar
    from evalbeam.pipelines.sweep.cells import CellGroupJob, group_job, groups_of
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
        if not path_exists(output):
            from apache_beam.io.filesystems import FileSystems

            FileSystems.mkdirs(output)
        write_sweep_json(output, info)
        for name in (LEADERBOARD_JSONL, LEADERBOARD_CSV) + SWEEP_OUTPUTS:
            # never stale beside a running sweep
            if path_exists(join(output, name)):
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
        left = [p for p in todo if (read_or_none(p.folder.final("run.json"), read_json) or {}
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


WORST = (EXIT_FAILED, EXIT_INCOMPLETE, EXIT_REJECTED, EXIT_OK)


def finish(plans: list[Plan], manifest, output: str, started: float, failures: dict,
           quiet: bool, args=None) -> int:
    """Read every cell's run.json, write and publish the leaderboard (and the files of
    sweep_finishing) and sweep.json (publish), print the summary; returns the exit code."""
    from evalbeam.pipelines.sweep import leaderboard
    from evalbeam.transforms.io import read_json
    from evalbeam.transforms.outputs import OutputFolder

    info = sweep_info(manifest, plans, started, "complete")
    finished, codes = [], []
    for p, entry in zip(plans, info["cells"]):
        run_json = read_or_none(p.folder.final("run.json"), read_json) or {}
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
        side = read_or_none(p.sidecar_path, read_json) if status in ENDED else None
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
    write_text(staging.temp(LEADERBOARD_JSONL), with_jsonl)
    write_text(staging.temp(LEADERBOARD_CSV), leaderboard.to_csv(rows))
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
            for c in bad[:10]) + ". sweep.json and each cell's run.json say more; the other "
              "cells' outputs are complete.", file=sys.stderr)
    return code



def summary(info: dict, rows: list[dict], output: str) -> str:
    from evalbeam.pipelines.tasks.summary import printable, text_table

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
    text = text_table(["dataset", "model", "rank", "headline", "value", "difference"], table_rows)
    return (f"{text}\n\nSweep: {len(info['cells'])} cell(s), {ran} ran, {skipped} skipped (done). "
            f"Leaderboard ({info['leaderboard_rows']:,} rows, every slice) in {output}/leaderboard.jsonl "
            f"and .csv; cells in {output}/cells/; sweep.json. Wall time "
            f"{info['wall_time_seconds']:.1f} s.")
