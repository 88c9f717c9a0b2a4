"""What every task's printed end-of-run summary is made of (each task's table is its own:
Task.summarize in pipelines/tasks/<task>.py), and the table of --compare_to's comparisons. The
files hold the full results."""

from __future__ import annotations

import json


def printable(text) -> str:
    """Text safe for a terminal: control characters (from untrusted metadata, label keys or
    model names) are shown escaped, never interpreted."""
    text = str(text)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def metric_records(metrics_path: str, comparisons: bool = False):
    """The records of metrics.jsonl: the task's own (comparisons=False) or only the Comparison
    records of --compare_to (comparisons=True)."""
    from evalbeam.transforms.input_files import iter_json_lines

    for _, record in iter_json_lines(metrics_path):
        if (record["type"] == "Comparison") == comparisons:
            yield record


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """The rows under the header in columns as wide as their widest cell, every cell printable."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def inputs_table(counts: dict) -> str:
    """The rows each source read, evaluated and rejected (run.json's "counts"), as a table."""
    return text_table(["source", "rows read", "evaluated", "rejected"],
                      [[name, f"{c['rows_read']:,}", f"{c['rows_evaluated']:,}",
                        f"{c['rows_rejected']:,}"] for name, c in counts.items()])


def fmt(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _brief(parameters: dict) -> str:
    """The parameters of a compared record in one short cell (label, threshold, k, ...)."""
    parts = []
    # the compared statistic first: it is what tells two rows of one record apart
    first = ("field", "label", "label_key", "k", "iou_threshold", "score_threshold")
    for key, value in sorted(parameters.items(),
                             key=lambda kv: (first.index(kv[0]) if kv[0] in first else len(first), kv[0])):
        if isinstance(value, dict):
            value = "/".join(str(v) for v in value.values())
        elif isinstance(value, list):
            continue
        parts.append(f"{key}={value}")
    text = ", ".join(parts)
    return text if len(text) <= 60 else text[:57] + "..."


def comparison_summary(metrics_path: str, shown: int = 15) -> str:
    """The Comparison records of a run (--compare_to): how many there are, how many have a
    Benjamini-Hochberg adjusted p-value under 0.05, and the `shown` smallest adjusted p-values
    as a table (difference, its interval, p, adjusted p, the datums a model lacks)."""
    found = list(metric_records(metrics_path, comparisons=True))
    if not found:
        return "No comparisons: no scalar metric was computed for both models."
    baseline = found[0]["parameters"]["baseline"]

    def q(record):
        value = record["comparison"].get("p_value_adjusted")
        return 2.0 if value is None else value

    found.sort(key=lambda r: (q(r), r["model"], len(r["slice"]), json.dumps(r["slice"], sort_keys=True),
                              r["parameters"]["metric"], json.dumps(r["parameters"], sort_keys=True)))
    significant = sum(1 for r in found if q(r) < 0.05)
    rows = []
    for record in found[:shown]:
        interval, comparison = record.get("interval") or {}, record["comparison"]
        lacks = comparison.get("model_lacks", 0) + comparison.get("baseline_lacks", 0)
        span = "-" if interval.get("low") is None else f"[{interval['low']:+.4f}, {interval['high']:+.4f}]"
        rows.append([record["model"],
                     ", ".join(f"{k}={v}" for k, v in record["slice"].items()) or "(all)",
                     record["parameters"]["metric"], _brief(record["parameters"]["metric_parameters"]),
                     f"{record['value']:+.4f}", span,
                     "-" if comparison["p_value"] is None else f"{comparison['p_value']:.3g}",
                     "-" if q(record) > 1 else f"{q(record):.3g}", str(lacks)])
    head = (f"Comparisons with {printable(baseline)}: {len(found):,} (model, metric, slice), "
            f"{significant:,} with a Benjamini-Hochberg adjusted p-value under 0.05; "
            f"the {min(shown, len(found))} smallest:")
    return head + "\n" + text_table(["model", "slice", "metric", "parameters", "difference", "interval",
                                 "p", "adjusted p", "lacking datums"], rows)
