"""The report's view of a run against its gates and its baseline (--gates, --baseline): the
gates' checks, the records that changed, and the datums whose correctness changed.

The per-datum values of a baseline (scores.jsonl, per_query.jsonl) are the only file the page
holds whole, at most MAX_FLIP_ROWS of them; beyond that the flips are not shown, and the page
says so.
"""

from __future__ import annotations

import heapq
import json

from evalbeam.pipelines.report.elements import (MAX_EXAMPLES, RunFiles, clip, fmt, interval_text,
                                                params_text, slice_text, table)

MAX_FLIP_ROWS = 2_000_000


def gates_view(checks) -> dict | None:
    if checks is None:
        return None
    from evalbeam.pipelines.quality.gates import FAILING

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
