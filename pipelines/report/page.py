"""The HTML report: one self-contained page of a run or a sweep that opens offline (reference:
pipelines/report/report.md).

Layout: `write_report` (a run) and `write_sweep_report` (a sweep folder) gather what the page
shows into plain dicts (status, counts, top rejection reasons, gates, comparison with a
baseline and the datums whose correctness changed, then one section per model and slice with
the task's tables and charts, and the worst examples), and render templates/report.html.j2 with
Jinja2's auto-escaping: every string from a run (labels, datum uids, model text, reasons) is
text, never markup. Charts are Vega-Lite specs (pipelines/report/charts.py, built with altair)
carried as JSON data and drawn by vega-embed, whose bundle (from vl-convert) is inlined once,
so the page needs no network; a chart is drawn when it scrolls into view, which keeps opening a
report of hundreds of charts fast.

The parts, in pipelines/report/: elements.py (a run's files, formatting, tables, the page's
charts), changes.py (gates, the comparison with a baseline, the datums that changed),
blocks.py (each task's tables and charts per model and slice), charts.py (the Vega-Lite
specs, built with vega.py); this module puts the page together and renders it.

Bounds (size and speed): tables list at most elements.MAX_TABLE_ROWS rows, examples at most
MAX_EXAMPLES per list, model text at most MAX_TEXT characters; rejected.jsonl, scores.jsonl and
per_query.jsonl are streamed, never held whole except the per-datum values of a baseline
comparison (at most changes.MAX_FLIP_ROWS rows; beyond that the flips are not shown, and the
page says so).
"""

from __future__ import annotations

import functools
import json
import os
import re
import time

from evalbeam.pipelines.report.blocks import text_distributions, worst_examples
from evalbeam.pipelines.report.changes import comparison_view, flips_view, gates_view
from evalbeam.pipelines.report.elements import (Charts, RunFiles, clip, fmt, interval_text,
                                                params_text, slice_text, table, value_text)
from evalbeam.schemas.slices import canonical_json

MAX_SECTIONS = 60          # model x slice sections with charts; more are listed as tables only
TEMPLATE = "report.html.j2"


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """vega, vega-lite and vega-embed in one script (vl-convert bundles them offline, slowly
    enough to be worth keeping: tests/benchmarks/README.md), made safe to inline in a <script>
    element. Kept in a cache file per vl-convert version (EVALBEAM_CACHE_DIR, default
    ~/.cache/evalbeam), written atomically; a cache that cannot be written only costs the time."""
    import vl_convert

    version = getattr(vl_convert, "__version__", "unknown")
    folder = os.environ.get("EVALBEAM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "evalbeam")
    path = os.path.join(folder, f"vega-bundle-{re.sub(r'[^A-Za-z0-9.]', '_', version)}.js")
    from evalbeam.transforms.input_files import InputError, read_text

    try:   # through the reading door: a cache file made a FIFO or a link to /dev/zero is rebuilt
        text = read_text(path, 64 << 20)
        if text.endswith("\n//evalbeam-end\n"):
            return text[: -len("\n//evalbeam-end\n")]
    except InputError:
        pass
    text = vl_convert.javascript_bundle().replace("</script", "<\\/script").replace("<!--", "<\\!--")
    try:
        os.makedirs(folder, exist_ok=True)
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w", encoding="utf-8") as out:
            out.write(text + "\n//evalbeam-end\n")
        os.replace(partial, path)
    except OSError:
        pass
    return text


# ---- what every run shows ---------------------------------------------------------------------

NUMBER = re.compile(r"-?\d+(\.\d+)?(e-?\d+)?")
QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def top_rejections(files: RunFiles, limit: int = 10, max_kinds: int = 10_000) -> list[dict]:
    """The most frequent kinds of rejection reasons (numbers and quoted values taken out, so
    "score 1.5 ..." and "score 7 ..." are one kind), each with a count, its sources and one
    example row; rejected.jsonl is streamed, and at most max_kinds kinds are tracked."""
    kinds: dict[str, dict] = {}
    for row in files.lines("rejected.jsonl"):
        reason = str(row.get("reason", ""))
        kind = NUMBER.sub("N", QUOTED.sub("'…'", reason))[:300]
        entry = kinds.get(kind)
        if entry is None:
            if len(kinds) >= max_kinds:
                kind, entry = "(other reasons)", kinds.setdefault("(other reasons)", {
                    "kind": "(other reasons)", "count": 0, "sources": set(), "example": row})
            else:
                entry = kinds[kind] = {"kind": kind, "count": 0, "sources": set(), "example": row}
        entry["count"] += 1
        entry["sources"].add(str(row.get("source")))
    top = sorted(kinds.values(), key=lambda e: (-e["count"], e["kind"]))[:limit]
    out = []
    for e in top:
        ex = e["example"]
        where = f"{ex.get('file', '')}:{ex.get('line', ex.get('row', ''))}"
        out.append({"kind": e["kind"], "count": e["count"], "sources": ", ".join(sorted(e["sources"])),
                    "example": f"{where} {clip(ex.get('reason', ''), 300)}",
                    "datum_uid": clip(ex.get("datum_uid", ""), 200)})
    return out


def problem_items(problems) -> list[dict]:
    """The Problems list of the overview: run.json's "problems" (or sweep.json's
    "baseline_problems"), {"severity", "code", "message"} each, the message clipped. The
    template escapes every field: messages quote paths, names and model output."""
    return [{"severity": p.get("severity"), "code": p.get("code"), "message": clip(p.get("message"), 1000)}
            for p in problems if isinstance(p, dict)]


def run_overview(files: RunFiles) -> dict:
    info = files.info
    counts = info.get("counts") or {}
    sources = [[name, fmt(c.get("rows_read")), fmt(c.get("rows_evaluated")), fmt(c.get("rows_rejected"))]
               for name, c in counts.items()]
    inputs = [[name, clip(entry.get("pattern"), 300), fmt(len(entry.get("files", [])))]
              for name, entry in (info.get("inputs") or {}).items()]
    options = [[k, clip(json.dumps(v) if not isinstance(v, str) else v, 300)]
               for k, v in sorted((info.get("options") or {}).items())]
    return {
        "task": info.get("task", "?"), "status": info.get("status", "?"),
        "started_at": info.get("started_at", ""), "wall_time": fmt(info.get("wall_time_seconds")),
        "runner": info.get("runner", ""), "models": info.get("models", []),
        "slices": [",".join(s) for s in info.get("slices", [])],
        "rows_read": fmt(info.get("rows_read")), "rows_rejected": fmt(info.get("rows_rejected")),
        "rows_evaluated": fmt(sum(c.get("rows_evaluated", 0) for c in counts.values())),
        "metrics_written": fmt(info.get("metrics_written")),
        "problems": problem_items(info.get("problems", [])),
        "sources": sources, "inputs": inputs, "options": options,
        "versions": ", ".join(f"{k} {v}" for k, v in sorted((info.get("versions") or {}).items())),
        "rejections": top_rejections(files),
        "judge": judge_overview(info.get("judge")),
    }


def judge_overview(judge) -> list | None:
    """run.json's judge section as tables: the totals (calls, cache, statuses, tokens, cost,
    rate) and, per metric, its requests, calls sent and cost."""
    if not isinstance(judge, dict):
        return None
    totals = [[key, clip(json.dumps(value, sort_keys=True), 300) if isinstance(value, (dict, list))
               else fmt(value) if not isinstance(value, str) else clip(value, 300)]
              for key, value in sorted(judge.items()) if key != "per_metric"]
    tables = [table("LLM judge: calls, statuses and cost (run.json \"judge\")", ["field", "value"], totals)]
    per_metric = judge.get("per_metric")
    if isinstance(per_metric, dict) and per_metric:
        columns = sorted({k for v in per_metric.values() if isinstance(v, dict) for k in v})
        tables.append(table("Per metric", ["metric"] + columns,
                            [[metric] + [fmt(v.get(c)) if not isinstance(v.get(c), (dict, list)) else
                                         clip(json.dumps(v.get(c), sort_keys=True), 200) for c in columns]
                             for metric, v in sorted(per_metric.items()) if isinstance(v, dict)]))
    return tables


def headline_view(task: str, records) -> dict | None:
    """Per model and slice, the task's headline metrics (pipelines/sweep/leaderboard.py's defaults)."""
    from evalbeam.pipelines.sweep.leaderboard import Headline, default_headlines

    specs = [Headline(t) for t in default_headlines(task)]
    if task == "detection":
        specs += [Headline("COCOSummary.AP"), Headline("COCOSummary.AP50")]
    columns, cells = [], {}
    for r in records:
        for spec in specs:
            if spec.matches(r):
                value = r["value"][spec.field] if spec.field else r["value"]
                interval = r.get("interval") or {}
                interval = interval.get(spec.field) if spec.field else interval
                if spec.text not in columns:
                    columns.append(spec.text)
                key = (r.get("model"), canonical_json(r.get("slice") or {}))
                cells.setdefault(key, {})[spec.text] = value_text(value, interval)
    if not columns:
        return None
    columns = [c.text for c in specs if c.text in columns]
    rows = [[model, slice_text(json.loads(s))] + [v.get(c, "–") for c in columns]
            for (model, s), v in sorted(cells.items(), key=lambda kv: (len(kv[0][1]), kv[0][1], kv[0][0]))]
    return table("Headline metrics per model and slice", ["model", "slice"] + columns, rows)


def report_blocks_of(task):
    """The task's report_blocks(records, charts) (pipelines/tasks/task.py), or None for a name
    that is no task."""
    from evalbeam.pipelines.tasks.registry import TASKS, task_of

    return task_of(task).report_blocks if task in TASKS else None


def model_sections(files: RunFiles, records, charts: Charts) -> list[dict]:
    task = files.info.get("task")
    build = report_blocks_of(task)
    groups: dict = {}
    for r in records:
        if r.get("type") == "Comparison":
            continue
        groups.setdefault((r.get("model"), canonical_json(r.get("slice") or {})), []).append(r)
    distributions = text_distributions(files, charts) if task == "text" else {}
    worst = worst_examples(files) if task == "text" else {}
    sections = []
    ordered = sorted(groups, key=lambda k: (len(k[1]), k[1], k[0]))
    for n, key in enumerate(ordered):
        model, slice_json = key
        with_charts = n < MAX_SECTIONS
        section_charts = charts if with_charts else Charts()
        blocks = build(groups[key], section_charts) if build else []
        if not with_charts:
            blocks = [b for b in blocks if b["kind"] != "chart"]
        if slice_json == "{}":
            blocks += distributions.get(model, [])
            if model in worst:
                blocks.append(worst[model])
        sections.append({"id": f"section-{n}", "model": model,
                         "slice": slice_text(json.loads(slice_json)), "blocks": blocks,
                         "open": n < 4})
    return sections


def comparisons_table(records) -> dict | None:
    """The paired comparisons between models (--compare_to) of the whole dataset; per-slice
    ones are in metrics.jsonl."""
    rows = []
    for r in records:
        if r.get("type") != "Comparison" or r.get("slice"):
            continue
        p = r.get("parameters") or {}
        c = r.get("comparison") or {}
        metric_params = p.get("metric_parameters") or {}
        metric = p.get("metric", "") + (f".{metric_params['field']}" if "field" in metric_params else "")
        rows.append([r.get("model"), p.get("baseline"), metric, params_text(metric_params, ("field",)),
                     fmt(c.get("model_value")), fmt(c.get("baseline_value")), fmt(r.get("value")),
                     interval_text(r.get("interval")), c.get("test", ""), fmt(c.get("p_value")),
                     fmt(c.get("p_value_adjusted"))])
    if not rows:
        return None
    return table("Paired comparisons between models (--compare_to; whole dataset)",
                 ["model", "against", "metric", "parameters", "model value", "against value",
                  "difference", "interval", "test", "p-value", "adjusted p"], rows,
                 note="Per-slice comparisons are in metrics.jsonl (type Comparison).")


# ---- rendering --------------------------------------------------------------------------------------

def render(context: dict) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template(TEMPLATE).render(**context)


def _write(html: str, out_path: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(out_path) as out:
        out.write(html.encode("utf-8"))


def run_context(files: RunFiles, baseline: str | None = None, checks=None, comparison=None) -> dict:
    """Everything the page of one run shows, as template data."""
    from evalbeam.pipelines.quality import comparison as comparing
    from evalbeam.transforms.io import read_json

    records = list(files.lines("metrics.jsonl"))
    charts = Charts()
    base_files = base_records = None
    if baseline:
        base_files = RunFiles(baseline)
        base_records = list(base_files.lines("metrics.jsonl"))
        if comparison is None:
            comparison = comparing.compare(records, base_records)
    if checks is None and files.exists("gates.json"):
        checks = read_json(files.path("gates.json")).get("results")
    overview = run_overview(files)
    return {
        "kind": "run",
        "title": f"evalbeam {overview['task']}: {', '.join(overview['models'])}",
        "overview": overview,
        "headline": headline_view(overview["task"], records),
        "gates": gates_view(checks),
        "comparison": comparison_view(comparison, baseline),
        "flips": flips_view(files, base_files, records, base_records) if base_files else None,
        "model_comparisons": comparisons_table(records),
        "sections": model_sections(files, records, charts),
        "charts": charts.specs,
        "bundle": vega_bundle() if charts.specs else "",
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def write_report(files: RunFiles, out_path: str, *, baseline: str | None = None, checks=None,
                 comparison=None) -> None:
    """report.html of one run (files: its folder and run.json) at out_path."""
    _write(render(run_context(files, baseline, checks, comparison)), out_path)


# ---- a sweep ---------------------------------------------------------------------------------------

def sweep_context(folder: str, info: dict | None = None, checks=None, baseline: str | None = None) -> dict:
    from evalbeam.pipelines.report import charts as report_charts
    from evalbeam.transforms.io import read_json

    if info is None:
        info = RunFiles(folder, {}).info or read_json(RunFiles(folder, {}).path("sweep.json"))
    charts = Charts()
    rows = list(RunFiles(folder, info).lines("leaderboard.jsonl"))
    cells = info.get("cells", [])
    cell_rows = [[c.get("dataset"), c.get("model"), c.get("status"),
                  "ran" if c.get("ran") else f"skipped ({c.get('why', 'done')})",
                  fmt((c.get("counts") or {}).get("rows_read")), fmt((c.get("counts") or {}).get("rows_rejected")),
                  fmt(c.get("wall_time_seconds")), clip(c.get("error") or "; ".join(c.get("problems") or []), 300)]
                 for c in cells]
    datasets = {}
    for row in rows:
        datasets.setdefault(row.get("dataset"), []).append(row)
    dataset_sections = []
    for n, (dataset, members) in enumerate(sorted(datasets.items(), key=lambda kv: str(kv[0]))):
        columns = [k for k in members[0].get("metrics", {})] if isinstance(members[0].get("metrics"), dict) else []
        blocks = []
        table_rows = []
        for row in sorted(members, key=lambda r: (len(r.get("slice") or {}), canonical_json(r.get("slice") or {}),
                                                  r.get("rank") or 10 ** 9, str(r.get("model")))):
            metrics = row.get("metrics") or {}
            table_rows.append([row.get("model"), slice_text(row.get("slice") or {}), fmt(row.get("rank"))] +
                              [fmt((metrics.get(c) or {}).get("value")) + " " +
                               interval_text((metrics.get(c) or {}).get("interval")) for c in columns] +
                              [row.get("note", "")])
        blocks.append(table("Leaderboard", ["model", "slice", "rank"] + columns + ["note"], table_rows))
        if columns:
            bars = []
            for row in members:
                if row.get("slice"):
                    continue
                metric = (row.get("metrics") or {}).get(columns[0]) or {}
                interval = metric.get("interval") or {}
                if isinstance(metric.get("value"), (int, float)):
                    bars.append({"name": str(row.get("model")), "series": columns[0], "value": metric["value"],
                                 "low": interval.get("low"), "high": interval.get("high")})
            if bars:
                blocks.append(charts.add(report_charts.metric_bars(bars, f"{columns[0]} per model", columns[0])))
        dataset_sections.append({"id": f"dataset-{n}", "model": str(dataset), "slice": "",
                                 "blocks": [b for b in blocks if b], "open": n < 4})
    # with --baseline, a baseline cell evaluated on other data (one problem per cell, its
    # message naming the cell), as a run's page shows its baseline_data_differs
    problems = problem_items(info.get("baseline_problems") or [])
    problems += [{"severity": "warning", "code": "leaderboard", "message": clip(p, 1000)}
                 for p in info.get("leaderboard_problems", [])]
    overview = {"task": "sweep", "status": info.get("status", "?"), "started_at": info.get("started_at", ""),
                "wall_time": fmt(info.get("wall_time_seconds")), "runner": "",
                "models": sorted({str(c.get("model")) for c in cells}),
                "slices": [], "rows_read": "", "rows_rejected": "", "rows_evaluated": "",
                "metrics_written": f"{fmt(info.get('leaderboard_rows'))} leaderboard rows over "
                                   f"{len({c.get('dataset') for c in cells})} datasets; {sum(1 for c in cells if c.get('ran'))} "
                                   f"cells ran, {sum(1 for c in cells if not c.get('ran'))} skipped (done)",
                "problems": problems, "sources": [],
                "inputs": [], "options": [], "versions": ", ".join(
                    f"{k} {v}" for k, v in sorted((info.get("versions") or {}).items())),
                "rejections": [], "judge": None}
    return {
        "kind": "sweep", "title": f"evalbeam sweep: {len(cells)} cells", "overview": overview,
        "headline": table("Cells", ["dataset", "model", "status", "this sweep", "rows read",
                                    "rows rejected", "wall time (s)", "problems"], cell_rows,
                          note="Each cell's outputs are in cells/<dataset>/<model>/; "
                               "`evalbeam report` on that folder makes its full page."),
        "gates": gates_view(checks), "comparison": None, "flips": None, "model_comparisons": None,
        "sections": dataset_sections, "charts": charts.specs,
        "bundle": vega_bundle() if charts.specs else "", "baseline": baseline,
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def write_sweep_report(folder: str, out_path: str, *, info: dict | None = None, checks=None,
                       baseline: str | None = None) -> None:
    """report.html of a sweep folder (info: its sweep.json, read when not given)."""
    _write(render(sweep_context(folder, info, checks, baseline)), out_path)
