"""What every task's report blocks are made of (each task's own blocks are its
Task.report_blocks, pipelines/tasks/<task>.py): scalar tables, bar charts, the charts of records
that are a chart each; and the text task's per-datum views: the distribution of scores and the
worst examples with the model's response (scores.jsonl, streamed).
"""

from __future__ import annotations

import heapq
import math

from evalbeam.pipelines.report.elements import (Charts, RunFiles, clip, fmt, interval_text,
                                                params_text, table)


def scalar_rows(records, types, name_of, skip=()):
    rows = []
    for r in records:
        if r["type"] not in types or not isinstance(r.get("value"), (int, float)) or isinstance(r.get("value"), bool):
            continue
        rows.append([name_of(r), r["type"], params_text(r.get("parameters"), skip), fmt(r["value"]),
                     interval_text(r.get("interval"))])
    return rows


def bars(records, types, charts: Charts, title: str, name_of, x_title="value"):
    from evalbeam.pipelines.report import charts as report_charts

    rows = []
    for r in records:
        value = r.get("value")
        if r["type"] in types and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            interval = r.get("interval") if isinstance(r.get("interval"), dict) else {}
            rows.append({"name": name_of(r), "series": r["type"], "value": float(value),
                         "low": interval.get("low"), "high": interval.get("high")})
    return charts.add(report_charts.metric_bars(rows, title, x_title)) if rows else None


def label_of(r) -> str:
    label = (r.get("parameters") or {}).get("label")
    if isinstance(label, dict):
        return f"{label.get('key')}:{label.get('value')}"
    return "" if label is None else str(label)


def record_charts(records, charts: Charts) -> list:
    """The charts of the records that are a chart each: score-threshold PR curves, confusion
    matrices (with their example datums), reliability diagrams."""
    from evalbeam.pipelines.report import charts as report_charts

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


def text_distributions(files: RunFiles, charts: Charts) -> dict:
    """{model: [chart blocks]}: per metric, the distribution of per-datum scores (scores.jsonl,
    binned in Python: the page carries the bin counts, never the values)."""
    from evalbeam.pipelines.report import charts as report_charts

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
