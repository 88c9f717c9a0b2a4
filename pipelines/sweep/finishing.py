"""A sweep's gates, baseline comparison, report and results history (pipelines/sweep/sweep.md).

Gates come from the manifest's `[[gate]]` tables and `--gates FILE`; a gate without `dataset`
applies to every cell whose task writes its metric type. They are checked after the pipeline,
on every finished cell's metrics.jsonl (cells skipped as done included), against the same cell
of `--baseline DIR` (an earlier sweep's folder) for change bounds: DIR/gates.json, and exit 5
when a check fails (unless a cell failed, 3, or is incomplete, 4). DIR/comparison.jsonl has
the rows of pipelines/quality/comparison.py for every cell present in both sweeps, each with its
"dataset". DIR/report.html is the sweep's page (pipelines/report/page.py). With
--mlflow_tracking_uri, each cell that ran is one MLflow run.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from evalbeam.pipelines.launch.common import UsageError
from evalbeam.pipelines.sweep.folder import read_or_none, write_text
from evalbeam.pipelines.sweep.plan import ENDED

CELL_ONLY = ("gates", "baseline", "report", "mlflow_tracking_uri")


def add_arguments(parser) -> None:
    from evalbeam.pipelines.launch.launcher import add_finishing_arguments

    add_finishing_arguments(parser, "sweep")


def check_cell_options(manifest) -> None:
    """These options belong to the sweep, not to a cell's options."""
    for cell in manifest.cells:
        bad = sorted(k for k in cell.options if k in CELL_ONLY)
        if bad:
            raise UsageError(f"cell {cell.id} (manifest line {cell.line}): {', '.join(bad)} is an "
                             "option of the sweep (a [[gate]] table, or `evalbeam sweep --gates/"
                             "--baseline/--report/--mlflow_tracking_uri`), not of a cell")


def prepare(manifest, plans, args) -> tuple:
    """(gates, baseline cell folders {(dataset, model): folder} or None), after checking both
    against the cells; raises UsageError."""
    from evalbeam.pipelines.quality import gates as gating
    from evalbeam.pipelines.quality.comparison import check_baseline

    check_cell_options(manifest)
    gates = list(gating.parse_gates(manifest.gates, manifest.path)) if manifest.gates else []
    if args.gates:
        offset = len(gates)
        extra = gating.load_gates(args.gates)
        gates += [dataclasses.replace(g, index=g.index + offset) for g in extra]
    baseline = None
    if args.baseline:
        info = check_baseline(args.baseline, sweep=True, output=args.output)
        baseline = {(c["dataset"], c["model"]): c["folder"] for c in info.get("cells", [])}
    for gate in gates:
        applies = [p for p in plans if applies_to(gate, p)]
        if not applies:
            types = sorted({t for p in plans for t in p.spec.metric_types})
            raise UsageError(f"gate {gate.index} ({gate.describe()}) applies to no cell of the sweep: "
                             f"no cell of dataset {gate.dataset or 'any'} and model "
                             f"{gate.model or 'any'} writes {gate.metric!r} (types: {', '.join(types)})")
        for plan in applies:
            gating.check_gates([gate], metric_types=_types(plan), models=plan.models,
                               slices=plan.slices, intervals=plan.args.uncertainty.enabled,
                               baseline=baseline is not None,
                               where=f"cell {plan.cell.id}")
    if args.mlflow_tracking_uri:
        from evalbeam.pipelines.quality.history import check_tracking_uri

        check_tracking_uri(args.mlflow_tracking_uri)
    return gates, baseline


def _types(plan) -> set:
    return set(plan.spec.metric_types) | ({"Comparison"} if plan.args.compare_to else set())


def applies_to(gate, plan) -> bool:
    return (gate.dataset in (None, plan.cell.dataset) and gate.model in (None, plan.cell.model)
            and gate.metric in _types(plan))


def _baseline_records(folder: str) -> tuple:
    """(records of a baseline cell's metrics.jsonl, None), or (None, why they cannot be used)."""
    from evalbeam.pipelines.quality.comparison import read_records
    from evalbeam.transforms.io import join

    path = join(folder, "metrics.jsonl")
    try:
        return read_records(path), None
    except FileNotFoundError:
        return None, "has no metrics.jsonl"
    except Exception as error:
        return None, f"has a metrics.jsonl that cannot be used ({error})"


def _changed_of(folder: str):
    """A reader of a baseline cell's run.json giving comparison.changed_since of its
    metrics.jsonl (None when unchanged)."""
    from evalbeam.pipelines.quality.comparison import changed_since
    from evalbeam.transforms.io import join, read_json

    return lambda run_json: changed_since(read_json(run_json), join(folder, "metrics.jsonl"))


def finish(plans, output: str, gates, baseline, args, code: int, info: dict, quiet: bool,
           into: str | None = None) -> int:
    """Gates, comparison and report of a finished sweep; returns the exit code and updates
    info (sweep.json) with "gates", "comparison" and "files" (their names). into: the folder
    they are written into (default output): the sweep's temporary folder, from which
    folder.publish moves them into output with the leaderboard files, which the report reads
    there."""
    from evalbeam.pipelines.quality import comparison as comparing
    from evalbeam.pipelines.quality import gates as gating
    from evalbeam.pipelines.launch.common import EXIT_GATES, EXIT_OK, EXIT_REJECTED
    from evalbeam.transforms.io import join
    from evalbeam.transforms.outputs import WARNING, problem, write_json_atomic

    into = into or output
    checks, rows, problems = [], [], []
    usable = ENDED + ("incomplete",)
    for plan, entry in zip(plans, info["cells"]):
        if entry["status"] not in usable:
            continue
        metrics = join(plan.folder.folder, "metrics.jsonl")
        records = read_or_none(metrics, comparing.read_records) or []
        old, differs, changed = None, [], None
        mine = [g for g in gates if applies_to(g, plan)]
        if baseline is not None:
            folder = baseline.get((plan.cell.dataset, plan.cell.model))
            old, unreadable = _baseline_records(folder) if folder else (None, None)
            if unreadable:
                problems.append(dict(problem(
                    WARNING, "baseline_unreadable",
                    f"cell {plan.cell.id}: the baseline's cell {folder} {unreadable}; the cell is "
                    "compared with nothing and its change bounds are missing_baseline"),
                    cell=plan.cell.id))
            if old is not None:
                rows += [dict(r, dataset=plan.cell.dataset) for r in comparing.compare(records, old)]
                differs = cell_data_differences(plan, folder)
                gated = any(g.needs_baseline for g in mine)
                if differs:
                    found = comparing.differs_problem(differs, folder, gated,
                                                      where=f"cell {plan.cell.id}: ")
                    problems.append(dict(found, cell=plan.cell.id))
                changed = read_or_none(join(folder, "run.json"), _changed_of(folder))
                if changed:
                    found = comparing.changed_problem(changed, folder, gated,
                                                      where=f"cell {plan.cell.id}: ")
                    problems.append(dict(found, cell=plan.cell.id))
        if mine:
            checks += gating.evaluate(mine, records, old if old is not None else [],
                                      dataset=plan.cell.dataset, baseline_differs=differs,
                                      baseline_changed=changed)
    files = {}
    if baseline is not None:
        info["baseline_problems"] = problems
        for found in problems:
            print(f"evalbeam: warning: {found['message']}", file=sys.stderr)
        write_text(join(into, "comparison.jsonl"),
                    "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
        info["comparison"] = dict(comparing.comparison_summary(rows), baseline=args.baseline,
                                  file="comparison.jsonl")
        files["comparison.jsonl"] = True
    if gates:
        write_json_atomic(gating.gates_document(checks, _gate_source(args), args.baseline),
                          join(into, "gates.json"))
        info["gates"] = dict(gating.summarize(checks), file="gates.json")
        files["gates.json"] = True
        if not info["gates"]["passed"] and code in (EXIT_OK, EXIT_REJECTED):
            code = EXIT_GATES
        if not quiet or not info["gates"]["passed"]:
            for line in gating.failed_lines(checks):
                print(f"evalbeam: gate {line}", file=sys.stderr)
            verdict = "passed" if info["gates"]["passed"] else \
                f"FAILED ({info['gates']['failed']} of {info['gates']['checks']} checks)"
            print(f"evalbeam: gates {verdict}; every check in {join(output, 'gates.json')}",
                  file=sys.stderr)
    if args.report:
        from evalbeam.pipelines.report.page import write_sweep_report

        write_sweep_report(into, join(into, "report.html"), info=dict(info, exit_code=code),
                           checks=checks if gates else None, baseline=args.baseline)
        files["report.html"] = True
        if not quiet:
            print(f"evalbeam: report in {join(output, 'report.html')}", file=sys.stderr)
    info["files"] = sorted(files)
    info["exit_code"] = code
    return code


def cell_data_differences(plan, folder: str) -> list[str]:
    """comparing.data_differences of a cell and its baseline cell's folder: run.json's counts
    and the leaderboard inputs' datum fingerprints."""
    from evalbeam.pipelines.quality import comparison as comparing
    from evalbeam.pipelines.sweep.leaderboard import SIDECAR
    from evalbeam.transforms.io import join, read_json

    info = read_or_none(plan.folder.final("run.json"), read_json)
    old = read_or_none(join(folder, "run.json"), read_json)
    if not isinstance(info, dict) or not isinstance(old, dict):
        return []
    return comparing.data_differences(info, old, read_or_none(plan.sidecar_path, read_json),
                                      read_or_none(join(folder, SIDECAR), read_json))


def _gate_source(args) -> str:
    return args.gates or "the manifest's [[gate]] tables"


def log_cells(plans, info: dict, uri: str, output: str, quiet: bool, code: int) -> int:
    """One MLflow run per cell that ran this time and ended (skipped cells were logged when
    they ran)."""
    from evalbeam.pipelines.launch.launcher import log_history

    for plan, entry in zip(plans, info["cells"]):
        if plan.runs and entry["status"] in ("complete", "complete_with_rejections", "incomplete"):
            code = log_history(uri, plan.folder.folder, code, quiet=True,
                               run_name=plan.cell.id,
                               tags={"dataset": plan.cell.dataset, "sweep": output})
    if not quiet:
        print(f"evalbeam: cells logged to MLflow at {uri}", file=sys.stderr)
    return code
