"""The HTML report: one self-contained page of a run or a sweep that opens offline (reference:
pipelines/report.md).

Layout: `write_report` (a run) and `write_sweep_report` (a sweep folder) gather what the page
shows into plain dicts (status, counts, top rejection reasons, gates, comparison with a
baseline and the datums whose correctness changed, then one section per model and slice with
the task's tables and charts, and the worst examples), and render templates/report.html.j2 with
Jinja2's auto-escaping: every string from a run (labels, datum uids, model text, reasons) is
text, never markup. Charts are Vega-Lite specs (pipelines/report_charts.py, built with altair)
carried as JSON data and drawn by vega-embed, whose bundle (from vl-convert) is inlined once,
so the page needs no network; a chart is drawn when it scrolls into view, which keeps opening a
report of hundreds of charts fast.

Bounds (size and speed): tables list at most MAX_TABLE_ROWS rows, examples at most
MAX_EXAMPLES per list, model text at most MAX_TEXT characters; rejected.jsonl, scores.jsonl and
per_query.jsonl are streamed, never held whole except the per-datum values of a baseline
comparison (at most MAX_FLIP_ROWS rows; beyond that the flips are not shown, and the page says
so).
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import os
import re
import time

from evalbeam.schemas.slices import canonical_json

MAX_TABLE_ROWS = 200
MAX_EXAMPLES = 10
MAX_TEXT = 2000
MAX_FLIP_ROWS = 2_000_000
MAX_SECTIONS = 60          # model x slice sections with charts; more are listed as tables only
TEMPLATE = "report.html.j2"


# ---- where a run's files are -----------------------------------------------------------------

class RunFiles:
    """A run's files: `folder` holds them (a finished run folder, or the temporary folder of a
    run about to publish); `info` is its run.json (read from the folder when not given)."""

    def __init__(self, folder: str, info: dict | None = None):
        self.folder = folder
        self.info = info if info is not None else _read_json(self.path("run.json"))

    def path(self, name: str) -> str:
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.join(self.folder, name)

    def exists(self, name: str) -> bool:
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(self.path(name))

    def lines(self, name: str):
        """The parsed JSON lines of one of the run's files (nothing if it is absent)."""
        if not self.exists(name):
            return
        from evalbeam.transforms.input_files import iter_json_lines

        for _, value in iter_json_lines(self.path(name)):
            yield value


def _read_json(path: str):
    from evalbeam.transforms.io import read_json

    return read_json(path)


# ---- small formatting helpers (the template shows what these return, escaped) ----------------

def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def slice_text(slice_value: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(slice_value.items())) if slice_value else "all datums"


def params_text(params: dict, skip=()) -> str:
    parts = []
    for key, value in sorted((params or {}).items()):
        if key in skip:
            continue
        if isinstance(value, dict) and set(value) == {"key", "value"}:
            value = f"{value['key']}:{value['value']}"
        elif isinstance(value, list) and len(value) > 4:
            value = f"[{fmt(value[0])}..{fmt(value[-1])}, {len(value)}]"
        parts.append(f"{key}={value if isinstance(value, str) else json.dumps(value)}")
    return " ".join(parts)


def interval_text(interval) -> str:
    if not isinstance(interval, dict) or "low" not in interval:
        return ""
    return f"[{fmt(interval['low'])}, {fmt(interval['high'])}]"


def value_text(value, interval=None) -> str:
    """A number, then its interval when it has one: "0.91 [0.88, 0.93]"."""
    shown = interval_text(interval)
    return fmt(value) + (f" {shown}" if shown else "")


def clip(text, limit: int = MAX_TEXT) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit:,} more characters)"


# ---- charts ---------------------------------------------------------------------------------

class Charts:
    """The page's charts: each spec gets an id; the template writes them as JSON data."""

    def __init__(self):
        self.specs: list[tuple[str, str]] = []

    def add(self, spec) -> dict | None:
        if not spec:
            return None
        chart_id = f"chart-{len(self.specs)}"
        self.specs.append((chart_id, script_json(spec)))
        title = spec.get("title", "")
        if isinstance(title, dict):
            title = title.get("text", "")
        if isinstance(title, list):
            title = " ".join(map(str, title))
        return {"kind": "chart", "id": chart_id, "title": str(title)}


def script_json(value) -> str:
    """JSON safe inside a <script type="application/json"> element: no "</script>", no "<!--",
    whatever strings the value holds."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """vega, vega-lite and vega-embed in one script (vl-convert bundles them offline, in about
    2 s), made safe to inline in a <script> element. Kept in a cache file per vl-convert
    version (EVALBEAM_CACHE_DIR, default ~/.cache/evalbeam), written atomically; a cache that
    cannot be written only costs the time."""
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


def table(title: str, columns: list[str], rows: list[list], note: str = "", cls: str = "") -> dict:
    shown = rows[:MAX_TABLE_ROWS]
    if len(rows) > MAX_TABLE_ROWS:
        note = (note + " " if note else "") + f"First {MAX_TABLE_ROWS:,} of {len(rows):,} rows shown; metrics.jsonl has all."
    return {"kind": "table", "title": title, "columns": columns, "rows": shown, "note": note,
            "cls": cls}


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


# ---- gates and comparison ----------------------------------------------------------------------

def gates_view(checks) -> dict | None:
    if checks is None:
        return None
    from evalbeam.pipelines.gates import FAILING

    ordered = sorted(checks, key=lambda c: (c["verdict"] not in FAILING, c["gate"]))
    rows = [[c["verdict"].upper().replace("_", " "), c.get("dataset") or "", c["name"],
             c.get("model") or "every model", slice_text(c.get("slice") or {}),
             params_text(c.get("parameters") or {}), fmt(c.get("value")), interval_text(c.get("interval")),
             fmt(c.get("baseline_value")), fmt(c.get("change")),
             ", ".join(f"{k} {fmt(v)}" for k, v in c["bounds"].items()), c.get("reason", "")]
            for c in ordered]
    failed = sum(1 for c in checks if c["verdict"] in FAILING)
    if not any(c.get("dataset") for c in checks):
        rows = [r[:1] + r[2:] for r in rows]
        columns = ["verdict", "gate", "model", "slice", "parameters", "value", "interval",
                   "baseline", "change", "bounds", "why"]
    else:
        columns = ["verdict", "dataset", "gate", "model", "slice", "parameters", "value",
                   "interval", "baseline", "change", "bounds", "why"]
    return {"passed": failed == 0, "failed": failed, "checks": len(checks),
            "table": table(f"Gates: {len(checks) - failed} of {len(checks)} checks passed",
                           columns, rows, cls="gates")}


def comparison_view(rows, baseline: str | None) -> dict | None:
    if rows is None:
        return None
    counts = {"both": 0, "only_in_run": 0, "only_in_baseline": 0}
    changes = []
    for r in rows:
        counts[r["status"]] += 1
        change = r.get("change")
        if r["status"] != "both" or change is None:
            continue
        items = change.items() if isinstance(change, dict) else [(None, change)]
        for field, delta in items:
            if delta:
                old = r["baseline_value"][field] if field else r["baseline_value"]
                new = r["value"][field] if field else r["value"]
                changes.append((abs(delta), r, field, old, new, delta))
    changes.sort(key=lambda c: (-c[0], c[1]["type"], json.dumps(c[1]["parameters"], sort_keys=True)))
    table_rows = [[r["type"] + (f".{field}" if field else ""), r.get("model") or "",
                   slice_text(r.get("slice") or {}), params_text(r.get("parameters")),
                   fmt(old), fmt(new), fmt(delta),
                   fmt(delta / abs(old)) if isinstance(old, (int, float)) and old else "–"]
                  for _, r, field, old, new, delta in changes]
    grouped: dict = {}
    for r in rows:
        if r["status"] != "both":
            entry = grouped.setdefault((r["status"], r["type"]), [0, set(), set()])
            entry[0] += 1
            entry[1].add(str(r.get("model")))
            entry[2].add(slice_text(r.get("slice") or {}))
    only = [[status.replace("_", " "), metric, fmt(n), ", ".join(sorted(models)),
             clip(", ".join(sorted(slices)), 300)]
            for (status, metric), (n, models, slices) in sorted(grouped.items())]
    return {"baseline": baseline, "counts": counts,
            "changes": table("Largest changes against the baseline", ["metric", "model", "slice",
                             "parameters", "baseline", "now", "change", "relative"], table_rows[:100],
                             note=f"{len(changes):,} values changed; comparison.jsonl has every record."),
            "only": table("Records in one run only (comparison.jsonl lists each)",
                          ["where", "metric", "records", "models", "slices"], only)
            if only else None}


# ---- datums whose correctness changed -------------------------------------------------------------

def _example_correctness(records) -> dict:
    """{(model, label key, threshold): {datum uid: correct}} from classification and detection
    ConfusionMatrix examples of the whole dataset (the examples a run kept)."""
    out: dict = {}
    for r in records:
        if r.get("type") != "ConfusionMatrix" or r.get("slice"):
            continue
        value = r.get("value") or {}
        params = r.get("parameters") or {}
        key = (r.get("model"), params.get("label_key", ""), params.get("score_threshold"),
               params.get("iou_threshold"))
        seen = out.setdefault(key, {})
        for gt, row in (value.get("confusion_matrix") or {}).items():
            for pd, cell in row.items():
                for ex in cell.get("examples", []) if isinstance(cell, dict) else []:
                    uid = ex.get("datum_uid")
                    if uid is not None:
                        seen[uid] = seen.get(uid, True) and gt == pd
        for part in ("unmatched_ground_truths", "unmatched_predictions"):
            for cell in (value.get(part) or {}).values():
                for ex in cell.get("examples", []) if isinstance(cell, dict) else []:
                    if ex.get("datum_uid") is not None:
                        seen[ex["datum_uid"]] = False
    return out


def flips_view(files: RunFiles, baseline: RunFiles, records, baseline_records) -> dict | None:
    """Datums that went from correct to wrong and back between the baseline and this run: from
    per-datum scores (scores.jsonl: values in {0, 1} are correct/wrong, other scores list the
    largest falls and rises), per-query measures (per_query.jsonl: the largest falls and rises
    of each measure), or, failing those, the confusion-matrix examples both runs kept."""
    blocks = []
    if files.exists("scores.jsonl") and baseline.exists("scores.jsonl"):
        blocks += _score_flips(files, baseline)
    if files.exists("per_query.jsonl") and baseline.exists("per_query.jsonl"):
        blocks += _query_flips(files, baseline)
    if not blocks:
        new, old = _example_correctness(records), _example_correctness(baseline_records)
        rows = []
        for key in sorted(set(new) & set(old), key=lambda k: json.dumps(k)):
            for uid in sorted(set(new[key]) & set(old[key])):
                if new[key][uid] != old[key][uid]:
                    rows.append(["correct → wrong" if old[key][uid] else "wrong → correct", key[0],
                                 params_text({"label_key": key[1], "score_threshold": key[2],
                                              "iou_threshold": key[3]}), uid])
        if rows:
            blocks.append(table("Datums whose correctness changed (among the confusion-matrix "
                                "examples both runs kept)", ["change", "model", "parameters",
                                                              "datum_uid"], rows))
        elif new and old:
            blocks.append({"kind": "text", "text": "No datum among the examples both runs kept "
                           "changed from correct to wrong or back."})
    if not blocks:
        return None
    return {"blocks": blocks}


def _per_datum(files: RunFiles, name: str, key_of, value_of, limit: int):
    values = {}
    for row in files.lines(name):
        for key, value in value_of(row):
            values[key_of(row) + (key,)] = value
            if len(values) > limit:
                return None
    return values


def _score_flips(files: RunFiles, baseline: RunFiles) -> list[dict]:
    def key_of(row):
        return (row.get("model"), row.get("metric"), json.dumps(row.get("parameters", {}), sort_keys=True),
                row.get("datum_uid"))

    def value_of(row):
        value = row.get("value")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and row.get("status", "ok") == "ok":
            yield None, float(value)
        elif isinstance(value, dict):
            for k, v in sorted(value.items()):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    yield k, float(v)

    old = _per_datum(baseline, "scores.jsonl", key_of, value_of, MAX_FLIP_ROWS)
    if old is None:
        return [{"kind": "text", "text": f"The baseline's scores.jsonl has over {MAX_FLIP_ROWS:,} "
                 "values; per-datum changes are not shown."}]
    binary_keys: dict = {}
    for key, v in old.items():
        metric_key = key[:3] + key[4:]
        binary_keys[metric_key] = binary_keys.get(metric_key, True) and v in (0.0, 1.0)
    flips, moves = [], {}
    for row in files.lines("scores.jsonl"):
        for field, value in value_of(row):
            key = key_of(row) + (field,)
            before = old.get(key)
            if before is None or before == value:
                continue
            metric = row.get("metric") + (f".{field}" if field else "")
            if binary_keys.get(key[:3] + key[4:]) and value in (0.0, 1.0):
                flips.append(["correct → wrong" if before > value else "wrong → correct",
                              row.get("model"), metric, clip(row.get("datum_uid"), 200),
                              fmt(before), fmt(value)])
            else:
                heap = moves.setdefault((row.get("model"), metric), [])
                item = (-abs(value - before), clip(row.get("datum_uid"), 200), before, value)
                heapq.heappush(heap, tuple(-x if i == 0 else x for i, x in enumerate(item)))
                if len(heap) > MAX_EXAMPLES:
                    heapq.heappop(heap)
    blocks = []
    if flips:
        flips.sort(key=lambda r: (r[1], r[2], r[0], r[3]))
        blocks.append(table("Datums that went from correct to wrong and back (scores.jsonl, "
                            "metrics scored 0 or 1)", ["change", "model", "metric", "datum_uid",
                                                        "baseline", "now"], flips))
    rows = []
    for (model, metric), heap in sorted(moves.items()):
        for size, uid, before, value in sorted(heap, key=lambda x: (-x[0], x[1])):
            rows.append([model, metric, uid, fmt(before), fmt(value), fmt(value - before)])
    if rows:
        blocks.append(table(f"Largest per-datum changes (scores.jsonl, up to {MAX_EXAMPLES} per "
                            "model and metric)", ["model", "metric", "datum_uid", "baseline", "now",
                                                   "change"], rows))
    return blocks


FLIP_MEASURES = ("map", "ndcg_cut_10", "P_10", "recip_rank", "recall_100")


def _query_flips(files: RunFiles, baseline: RunFiles) -> list[dict]:
    def key_of(row):
        return (row.get("model"), row.get("query_id"))

    def value_of(row):
        for m in FLIP_MEASURES:
            v = (row.get("measures") or {}).get(m)
            if isinstance(v, (int, float)):
                yield m, float(v)

    old = _per_datum(baseline, "per_query.jsonl", key_of, value_of, MAX_FLIP_ROWS)
    if old is None:
        return [{"kind": "text", "text": "The baseline's per_query.jsonl is too large; per-query "
                 "changes are not shown."}]
    moves: dict = {}
    for row in files.lines("per_query.jsonl"):
        for m, value in value_of(row):
            before = old.get(key_of(row) + (m,))
            if before is None or before == value:
                continue
            heap = moves.setdefault((row.get("model"), m), [])
            heapq.heappush(heap, (abs(value - before), clip(row.get("query_id"), 200), before, value))
            if len(heap) > MAX_EXAMPLES:
                heapq.heappop(heap)
    rows = [[model, m, uid, fmt(b), fmt(v), fmt(v - b)]
            for (model, m), heap in sorted(moves.items())
            for _, uid, b, v in sorted(heap, key=lambda x: (-x[0], x[1]))]
    if not rows:
        return []
    return [table(f"Queries that changed most (per_query.jsonl, up to {MAX_EXAMPLES} per model "
                  "and measure)", ["model", "measure", "query_id", "baseline", "now", "change"], rows)]


# ---- per model and slice: the task's tables and charts ---------------------------------------

def _scalar_rows(records, types, name_of, skip=()):
    rows = []
    for r in records:
        if r["type"] not in types or not isinstance(r.get("value"), (int, float)) or isinstance(r.get("value"), bool):
            continue
        rows.append([name_of(r), r["type"], params_text(r.get("parameters"), skip), fmt(r["value"]),
                     interval_text(r.get("interval"))])
    return rows


def _bars(records, types, charts: Charts, title: str, name_of, x_title="value"):
    from evalbeam.pipelines import report_charts

    rows = []
    for r in records:
        value = r.get("value")
        if r["type"] in types and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            interval = r.get("interval") if isinstance(r.get("interval"), dict) else {}
            rows.append({"name": name_of(r), "series": r["type"], "value": float(value),
                         "low": interval.get("low"), "high": interval.get("high")})
    return charts.add(report_charts.metric_bars(rows, title, x_title)) if rows else None


def _label_of(r) -> str:
    label = (r.get("parameters") or {}).get("label")
    if isinstance(label, dict):
        return f"{label.get('key')}:{label.get('value')}"
    return "" if label is None else str(label)


def classification_blocks(records, charts: Charts) -> list:
    blocks = []
    head = _scalar_rows(records, ("Accuracy", "mROCAUC", "ECE", "MCE", "BrierScore"),
                        lambda r: (r.get("parameters") or {}).get("label_key", ""))
    if head:
        blocks.append(table("Overall", ["label key", "metric", "parameters", "value", "interval"], head))
    per_label: dict = {}
    for r in records:
        if r["type"] in ("Precision", "Recall", "F1", "ROCAUC", "Counts"):
            params = r.get("parameters") or {}
            key = (_label_of(r), params.get("score_threshold"))
            entry = per_label.setdefault(key, {})
            entry[r["type"]] = r
    thresholds = sorted({k[1] for k in per_label if k[1] is not None})
    rows = []
    for (label, threshold), entry in sorted(per_label.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        if threshold is None:
            continue
        counts = (entry.get("Counts") or {}).get("value") or {}
        roc = per_label.get((label, None), {}).get("ROCAUC")
        rows.append([label, fmt(threshold)] + [
            value_text(entry[t]["value"], entry[t].get("interval")) if t in entry else "–" for t in ("Precision", "Recall", "F1")] + [
            fmt(roc["value"]) if roc else "–", fmt(counts.get("tp")), fmt(counts.get("fp")),
            fmt(counts.get("fn")), fmt(counts.get("tn"))])
    if rows:
        blocks.append(table("Per label", ["label", "score threshold", "precision", "recall", "F1",
                                          "ROC AUC", "TP", "FP", "FN", "TN"], rows,
                            note=f"Score thresholds: {', '.join(fmt(t) for t in thresholds)}."))
    f1_at = thresholds[0] if thresholds else None
    bars = [r for r in records if r["type"] == "F1" and (r.get("parameters") or {}).get("score_threshold") == f1_at]
    chart = _bars(bars, ("F1",), charts, f"F1 per label (score threshold {fmt(f1_at)})", _label_of, "F1")
    if chart:
        blocks.append(chart)
    return [b for b in blocks + record_charts(records, charts) if b]


def record_charts(records, charts: Charts) -> list:
    """The charts of the records that are a chart each: score-threshold PR curves, confusion
    matrices (with their example datums), reliability diagrams."""
    from evalbeam.pipelines import report_charts

    blocks = []
    for r in records:
        if r["type"] == "PrecisionRecallCurve":
            blocks.append(charts.add(report_charts.pr_curves(r)))
        elif r["type"] == "ConfusionMatrix":
            blocks.append(charts.add(report_charts.confusion_heatmap(r)))
            blocks.append(_confusion_examples(r))
        elif r["type"] == "ReliabilityDiagram":
            blocks.append(charts.add(report_charts.reliability_diagram(r)))
    return blocks


def _confusion_examples(record) -> dict | None:
    rows = []
    value = record.get("value") or {}
    for gt, row in sorted((value.get("confusion_matrix") or {}).items()):
        for pd, cell in sorted(row.items(), key=lambda kv: -kv[1].get("count", 0) if isinstance(kv[1], dict) else 0):
            if gt == pd or not isinstance(cell, dict) or not cell.get("examples"):
                continue
            uids = ", ".join(clip(ex.get("datum_uid"), 200) for ex in cell["examples"][:3])
            rows.append([gt, pd, fmt(cell.get("count")), uids])
    for part, what in (("unmatched_ground_truths", "(missed)"), ("unmatched_predictions", "(extra)")):
        for label, cell in sorted((value.get(part) or {}).items()):
            if isinstance(cell, dict) and cell.get("examples"):
                uids = ", ".join(clip(ex.get("datum_uid"), 200) for ex in cell["examples"][:3])
                rows.append([label if part.endswith("truths") else what,
                             what if part.endswith("truths") else label, fmt(cell.get("count")), uids])
    if not rows:
        return None
    rows.sort(key=lambda r: -int(r[2].replace(",", "")) if r[2].replace(",", "").isdigit() else 0)
    return table(f"Confusions with example datums ({params_text(record.get('parameters'), ('max_examples',))})",
                 ["ground truth", "prediction", "count", "example datum uids"], rows[:50])


def detection_blocks(records, charts: Charts) -> list:
    from evalbeam.pipelines import report_charts

    blocks = []
    for r in records:
        if r["type"] == "COCOSummary":
            value = r.get("value") or {}
            interval = r.get("interval") or {}
            blocks.append(table(f"COCO summary ({params_text(r.get('parameters'), ('max_detections',))})",
                                ["statistic", "value", "interval"],
                                [[k, fmt(v), interval_text(interval.get(k))] for k, v in value.items()]))
    classes = [r for r in records if r["type"] == "COCOClassSummary"]
    if classes:
        fields = ["AP", "AP50", "AP75", "AR100"]
        # pycocotools' -1: a category with no ground truth, where AP and AR are undefined
        blocks.append(table("Per category (COCO)", ["label"] + fields,
                            [[_label_of(r)] + [("no ground truth" if (r.get("value") or {}).get(f) == -1
                                                else fmt((r.get("value") or {}).get(f))) for f in fields]
                             for r in sorted(classes, key=_label_of)]))
    head = _scalar_rows(records, ("mAP", "mAPAveragedOverIOUs", "mAR", "mARAveragedOverScores"),
                        lambda r: r["type"], skip=("iou_thresholds",))
    if head:
        blocks.append(table("Overall", ["metric", "type", "parameters", "value", "interval"], head))
    aps = [r for r in records if r["type"] in ("AP", "APAveragedOverIOUs")]
    if aps:
        per: dict = {}
        for r in aps:
            params = r.get("parameters") or {}
            column = "AP@[.5:.95]" if r["type"] == "APAveragedOverIOUs" else f"AP@{fmt(params.get('iou_threshold'))}"
            per.setdefault(_label_of(r), {})[column] = value_text(r["value"], r.get("interval"))
        columns = sorted({c for v in per.values() for c in v}, key=lambda c: (c != "AP@[.5:.95]", c))
        blocks.append(table("AP per label", ["label"] + columns,
                            [[label] + [v.get(c, "–") for c in columns] for label, v in sorted(per.items())]))
        chart = _bars([r for r in aps if r["type"] == "APAveragedOverIOUs"] or aps[:0] or
                      [r for r in aps if (r.get("parameters") or {}).get("iou_threshold") == 0.5],
                      ("AP", "APAveragedOverIOUs"), charts, "AP per label", _label_of, "AP")
        if chart:
            blocks.append(chart)
    curves: dict = {}
    for r in records:
        if r["type"] == "InterpolatedPrecisionRecallCurve":
            params = {k: v for k, v in (r.get("parameters") or {}).items() if k not in ("label", "category_id")}
            # category ids are per label: the chart's series
            label_params = dict(params, label=(r.get("parameters") or {}).get("label"))
            curves.setdefault(canonical_json(params), []).append(dict(r, parameters=label_params))
    for key in sorted(curves, key=lambda k: (json.loads(k).get("iou_threshold", 0), k)):
        blocks.append(charts.add(report_charts.interpolated_pr_curves(curves[key], series="label")))
    return [b for b in blocks + record_charts(records, charts) if b]


def segmentation_blocks(records, charts: Charts) -> list:
    from evalbeam.pipelines import report_charts

    blocks = []
    head = _scalar_rows(records, ("Accuracy", "mIOU"), lambda r: r["type"])
    if head:
        blocks.append(table("Overall", ["metric", "type", "parameters", "value", "interval"], head))
    per: dict = {}
    for r in records:
        if r["type"] in ("IOU", "Precision", "Recall", "F1"):
            per.setdefault(_label_of(r), {})[r["type"]] = r
    if per:
        blocks.append(table("Per label", ["label", "IOU", "precision", "recall", "F1"],
                            [[label] + [value_text(v[t]["value"], v[t].get("interval"))
                                        if t in v else "–" for t in ("IOU", "Precision", "Recall", "F1")]
                             for label, v in sorted(per.items())]))
        blocks.append(_bars([r for r in records if r["type"] == "IOU"], ("IOU",), charts,
                            "IOU per label", _label_of, "IOU"))
    confusion = [r for r in records if r["type"] == "ConfusionMatrix"]
    return [b for b in blocks + [charts.add(report_charts.confusion_heatmap(r)) for r in confusion] if b]


def text_blocks(records, charts: Charts) -> list:
    rows = []
    for r in records:
        value = r.get("value")
        interval = r.get("interval") or {}
        params = params_text(r.get("parameters"), ("template_version", "judge_model", "embedding_model"))
        counts = ", ".join(f"{k} {v:,}" for k, v in sorted((r.get("counts") or {}).items()))
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    rows.append([r["type"] + "." + k, params, fmt(v), interval_text(interval.get(k)), counts])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            rows.append([r["type"], params, fmt(value), interval_text(interval), counts])
        elif value is None:
            rows.append([r["type"], params, "–", "", counts])
    return [table("Metrics", ["metric", "parameters", "value", "interval", "datums by status"], rows)] if rows else []


def retrieval_blocks(records, charts: Charts) -> list:
    from evalbeam.pipelines import report_charts

    rows = _scalar_rows(records, {r["type"] for r in records}, lambda r: r["type"])
    at_k = []
    for r in records:
        k = (r.get("parameters") or {}).get("k")
        if k is not None and isinstance(r.get("value"), (int, float)):
            interval = r.get("interval") or {}
            at_k.append({"measure": r["type"], "k": int(k), "model": r.get("model") or "",
                         "value": float(r["value"]), "low": interval.get("low"), "high": interval.get("high")})
    blocks = [table("Measures", ["metric", "type", "parameters", "value", "interval"], rows)] if rows else []
    if at_k:
        blocks.append(charts.add(report_charts.at_k_lines(at_k, "Measures at each cut-off k")))
    return [b for b in blocks if b]


TASK_BLOCKS = {"classification": classification_blocks, "detection": detection_blocks,
               "segmentation": segmentation_blocks, "text": text_blocks,
               "retrieval": retrieval_blocks}


def headline_view(task: str, records) -> dict | None:
    """Per model and slice, the task's headline metrics (pipelines/leaderboard.py's defaults)."""
    from evalbeam.pipelines.leaderboard import DEFAULT_HEADLINES, Headline

    specs = [Headline(t) for t in DEFAULT_HEADLINES.get(task, [])]
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


def text_distributions(files: RunFiles, charts: Charts) -> dict:
    """{model: [chart blocks]}: per metric, the distribution of per-datum scores (scores.jsonl,
    binned in Python: the page carries the bin counts, never the values)."""
    from evalbeam.pipelines import report_charts

    values: dict = {}
    for row in files.lines("scores.jsonl"):
        value = row.get("value")
        if row.get("status", "ok") != "ok":
            continue
        if isinstance(value, dict):
            value = value.get("fmeasure", value.get("score"))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            bucket = values.setdefault(row.get("model"), {}).setdefault(row.get("metric"), [])
            if len(bucket) < 1_000_000:
                bucket.append(float(value))
    out = {}
    for model, metrics in values.items():
        out[model] = [charts.add(report_charts.histogram(
            v, f"{metric}: per-datum scores ({len(v):,} datums)", metric,
            # scores in [0, 1] on their whole range, so the charts of two metrics compare
            domain=(0.0, 1.0) if v and min(v) >= 0.0 and max(v) <= 1.0 else None))
            for metric, v in sorted(metrics.items())]
        out[model] = [b for b in out[model] if b]
    return out


def worst_examples(files: RunFiles) -> dict:
    """{model: table}: per metric the lowest-scoring datums of scores.jsonl, with the model's
    response (from its prediction files, as text) and the judge's reasons."""
    worst: dict = {}
    for row in files.lines("scores.jsonl"):
        value = row.get("value")
        if isinstance(value, dict):
            value = value.get("fmeasure")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or row.get("status", "ok") != "ok":
            continue
        heap = worst.setdefault((row.get("model"), row.get("metric")), [])
        item = (-float(value), str(row.get("datum_uid")), row.get("details"))
        if len(heap) < 3:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
    if not worst:
        return {}
    wanted: dict = {}
    for (model, _), heap in worst.items():
        wanted.setdefault(model, set()).update(uid for _, uid, _ in heap)
    texts = {model: _responses(files, model, uids) for model, uids in wanted.items()}
    out = {}
    for (model, metric), heap in sorted(worst.items()):
        for neg, uid, details in sorted(heap, key=lambda x: (-x[0], x[1]), reverse=True):
            reasons = ""
            if isinstance(details, dict):
                reasons = "; ".join(str(x) for x in (details.get("reasons") or [])[:3])
            out.setdefault(model, []).append([metric, fmt(-neg), clip(uid, 200),
                                              clip(texts.get(model, {}).get(uid, "(not found)"), 600),
                                              clip(reasons, 600)])
    return {model: table("Lowest-scoring datums per metric (scores.jsonl), with the model's response",
                         ["metric", "score", "datum_uid", "response", "judge's reasons"], rows, cls="examples")
            for model, rows in out.items()}


def _responses(files: RunFiles, model: str, uids: set) -> dict:
    """{uid: response} of a model's prediction files (JSONL or Parquet), read until found."""
    found = {}
    paths = ((files.info.get("inputs") or {}).get(model) or {}).get("files", [])
    for path in paths:
        try:
            if path.endswith((".parquet", ".pq")):
                import pyarrow.parquet as pq

                table_ = pq.read_table(path, columns=["datum_uid", "response"])
                for uid, response in zip(table_.column(0).to_pylist(), table_.column(1).to_pylist()):
                    if uid in uids:
                        found[uid] = response
                continue
            from evalbeam.schemas.safe_json import MAX_ROW_BYTES, iter_lines, loads_row
            from evalbeam.transforms.io import open_input

            with open_input(path) as stream:
                for _, line in iter_lines(stream, MAX_ROW_BYTES):
                    row = loads_row(line)[0] if line and line.strip() else None
                    if isinstance(row, dict) and row.get("datum_uid") in uids:
                        found[row["datum_uid"]] = row.get("response")
                        if len(found) == len(uids):
                            return found
        except Exception:     # the report shows "(not found)" rather than failing
            continue
    return found


def model_sections(files: RunFiles, records, charts: Charts) -> list[dict]:
    task = files.info.get("task")
    build = TASK_BLOCKS.get(task)
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
    from evalbeam.pipelines import comparison as comparing

    records = list(files.lines("metrics.jsonl"))
    charts = Charts()
    base_files = base_records = None
    if baseline:
        base_files = RunFiles(baseline)
        base_records = list(base_files.lines("metrics.jsonl"))
        if comparison is None:
            comparison = comparing.compare(records, base_records)
    if checks is None and files.exists("gates.json"):
        checks = _read_json(files.path("gates.json")).get("results")
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
    from evalbeam.pipelines import report_charts

    if info is None:
        info = RunFiles(folder, {}).info or _read_json(RunFiles(folder, {}).path("sweep.json"))
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
