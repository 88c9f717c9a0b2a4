"""Readable end-of-run summaries printed by the launchers (the files hold the full results)."""

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


def _table(header: list[str], rows: list[list[str]]) -> str:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def classification_summary(metrics_path: str, counts: dict, config) -> str:
    """One row per (model, slice, label key): accuracy, macro precision/recall/F1 at the first
    score threshold, and mROCAUC.

    The macro means average over the label values present in the slice: those with a ground
    truth there or predicted there at the threshold (tp + fp + fn > 0 in their Counts record),
    which is scikit-learn's default label set (labels=None: the union of y_true and y_pred). A
    value that is only scored, never top-scoring (with hardmax) or never above the threshold,
    and is nobody's ground truth, has precision = recall = 0 by zero division and would drag
    the mean down for nothing. Without Counts records (--metrics left them out) presence is
    unknown and the mean covers every value with a record; a note under the table says so."""
    threshold = config.score_thresholds[0]
    table: dict[tuple, dict] = {}
    for record in metric_records(metrics_path):
        params = record["parameters"]
        if params.get("score_threshold", threshold) != threshold:
            continue
        label = params.get("label") or {}
        key = params.get("label_key") or label.get("key")
        row = table.setdefault((record["model"], json.dumps(record["slice"]), key),
                               {"values": {}})
        kind = record["type"]
        if kind in ("Precision", "Recall", "F1", "Counts"):
            row["values"].setdefault(label.get("value"), {})[kind] = record["value"]
        elif kind in ("Accuracy", "mROCAUC"):
            row[kind] = record["value"]
    rows, unknown_presence = [], False
    for (model, slice_text, key), row in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1] != "{}", kv[0][1], kv[0][2])):
        values = list(row["values"].values())
        if values and all("Counts" in v for v in values):
            values = [v for v in values
                      if v["Counts"]["tp"] + v["Counts"]["fp"] + v["Counts"]["fn"] > 0]
        elif values:
            unknown_presence = True
        macro = {}
        for kind in ("Precision", "Recall", "F1"):
            found = [v[kind] for v in values if kind in v]
            macro[kind] = sum(found) / len(found) if found else None
        slice_value = json.loads(slice_text)
        rows.append([model, ", ".join(f"{k}={v}" for k, v in slice_value.items()) or "(all)", key,
                     _fmt(row.get("Accuracy")), _fmt(macro["Precision"]),
                     _fmt(macro["Recall"]), _fmt(macro["F1"]), _fmt(row.get("mROCAUC"))])
    header = ["model", "slice", "label key", "accuracy", "precision", "recall", "F1", "mROCAUC"]
    hardmax = "hardmax" if config.hardmax else "no hardmax"
    title = (f"\nClassification summary (score threshold {threshold}, {hardmax}; precision, "
             f"recall and F1 are macro means over the label values present in the slice, as "
             f"ground truth or prediction: scikit-learn's default label set)")
    note = ("\n(Counts not computed: those means cover every label value with a record, also "
            "values present in neither role.)" if unknown_presence else "")
    inputs = _table(["source", "rows read", "evaluated", "rejected"],
                    [[name, f"{c['rows_read']:,}", f"{c['rows_evaluated']:,}", f"{c['rows_rejected']:,}"]
                     for name, c in counts.items()])
    return f"{title}\n{_table(header, rows)}{note}\n\n{inputs}"


def detection_summary(metrics_path: str, counts: dict) -> str:
    """COCO protocol: all 12 COCO statistics per (model, slice), in two tables of six columns
    (average precision, average recall) so each fits a terminal; "-" where a statistic is
    undefined (-1 in metrics.jsonl: no ground truth in that area range). Valor protocol: mAP
    averaged over the IoU thresholds."""
    precision = ("AP", "AP50", "AP75", "APsmall", "APmedium", "APlarge")
    recall = ("AR1", "AR10", "AR100", "ARsmall", "ARmedium", "ARlarge")
    rows, valor = [], []
    for record in metric_records(metrics_path):
        if record["type"] == "mAPAveragedOverIOUs":
            valor.append(record)
        if record["type"] != "COCOSummary":
            continue
        where = ", ".join(f"{k}={v}" for k, v in record["slice"].items()) or "(all)"
        if "bound" in record["parameters"]:
            where += f" [{record['parameters']['bound']} bound]"
        rows.append(([record["model"], where], record["value"]))
    inputs = _table(["source", "rows read", "evaluated", "rejected"],
                    [[name, f"{c['rows_read']:,}", f"{c['rows_evaluated']:,}", f"{c['rows_rejected']:,}"]
                     for name, c in counts.items()])
    if valor:
        rows = [[r["model"], ", ".join(f"{k}={v}" for k, v in r["slice"].items()) or "(all)",
                 f"{r['value']:.4f}"] for r in valor]
        title = "\nDetection summary (valor protocol: mAP averaged over the IoU thresholds)"
        return f"{title}\n{_table(['model', 'slice', 'mAP'], rows)}\n\n{inputs}"

    def stat(value) -> str:
        return "-" if value == -1 else f"{value:.4f}"

    tables = [_table(["model", "slice", *names], [cells + [stat(value[n]) for n in names]
                                                  for cells, value in rows])
              for names in (precision, recall)]
    title = ("\nDetection summary (COCO protocol; IoU .50:.95 and maxDets 100 unless named)\n"
             "(\"-\": undefined, no ground truth in that area range)")
    return (f"{title}\nAverage precision\n{tables[0]}\n\nAverage recall\n{tables[1]}"
            f"\n\n{inputs}")


def segmentation_summary(metrics_path: str, counts: dict) -> str:
    """One row per (model, slice): mIOU and pixel accuracy."""
    found: dict = {}
    for record in metric_records(metrics_path):
        if record["type"] in ("mIOU", "Accuracy"):
            where = ", ".join(f"{k}={v}" for k, v in record["slice"].items()) or "(all)"
            found.setdefault((record["model"], where), {})[record["type"]] = record["value"]
    rows = [[model, where, f"{v.get('mIOU', 0):.4f}", f"{v.get('Accuracy', 0):.4f}"]
            for (model, where), v in found.items()]
    inputs = _table(["source", "rows read", "evaluated", "rejected"],
                    [[name, f"{c['rows_read']:,}", f"{c['rows_evaluated']:,}", f"{c['rows_rejected']:,}"]
                     for name, c in counts.items()])
    return f"\nSemantic segmentation summary\n{_table(['model', 'slice', 'mIOU', 'accuracy'], rows)}\n\n{inputs}"


def text_summary(metrics_path: str, counts: dict) -> str:
    """One row per (model, slice): mean ROUGE-L F, mean BLEU, corpus BLEU and rule pass rates;
    then one row per judge metric: mean over the datums judged ok, ok/all, other statuses."""
    found: dict = {}
    judged: list = []
    for record in metric_records(metrics_path):
        where = ", ".join(f"{k}={v}" for k, v in record["slice"].items()) or "(all)"
        cells = found.setdefault((record["model"], where), {})
        kind, value = record["type"], record["value"]
        if "counts" in record:   # a judge metric: one line each, below
            label = (record["parameters"].get("template") or record["parameters"].get("aspect")
                     or record["parameters"].get("label") or record["parameters"].get("component"))
            name = kind + (f" ({label})" if label else "")
            n = sum(record["counts"].values())
            others = ", ".join(f"{k} {v}" for k, v in record["counts"].items() if k != "ok")
            judged.append([record["model"], where, name, "" if value is None else f"{value:.4f}",
                           f"{record['counts'].get('ok', 0)}/{n}", others])
        elif kind == "ROUGE" and record["parameters"].get("rouge_type") == "rougeL":
            cells["ROUGE-L F"] = f"{value['fmeasure']:.4f}"
        elif kind == "BLEU":
            cells["BLEU"] = f"{value:.4f}"
        elif kind == "CorpusBLEU":
            cells["corpus BLEU"] = f"{value['score']:.2f}"
        elif isinstance(value, dict) and "pass" in value:
            cells[f"{kind} pass"] = f"{value['pass']:.3f}"
    columns = sorted({c for cells in found.values() for c in cells})
    rows = [[model, where] + [cells.get(c, "") for c in columns] for (model, where), cells in found.items()]
    inputs = _table(["source", "rows read", "evaluated", "rejected"],
                    [[name, f"{c['rows_read']:,}", f"{c['rows_evaluated']:,}", f"{c['rows_rejected']:,}"]
                     for name, c in counts.items()])
    judge = ("\n\nJudge metrics (means over the datums judged ok)\n"
             + _table(["model", "slice", "metric", "value", "ok", "other statuses"], judged)) if judged else ""
    return f"\nText summary (means over datums; per-datum scores in scores.jsonl)\n" \
           f"{_table(['model', 'slice', *columns], rows) if columns else '(no local metrics)'}{judge}\n\n{inputs}"


def retrieval_summary(metrics_path: str, counts: dict) -> str:
    """One row per (model, slice): queries, MAP, MRR, P@10, NDCG@10, NDCG."""
    wanted = {("Queries", None): "queries", ("MAP", None): "MAP", ("MRR", None): "MRR",
              ("Precision", 10): "P@10", ("NDCG", 10): "NDCG@10", ("NDCG", None): "NDCG"}
    found: dict = {}
    for record in metric_records(metrics_path):
        name = wanted.get((record["type"], record["parameters"].get("k")))
        if name:
            where = ", ".join(f"{k}={v}" for k, v in record["slice"].items()) or "(all)"
            value = record["value"]
            found.setdefault((record["model"], where), {})[name] = (
                f"{value:,}" if name == "queries" else f"{value:.4f}")
    columns = [c for c in wanted.values() if any(c in cells for cells in found.values())]
    rows = [[model, where] + [cells.get(c, "") for c in columns] for (model, where), cells in found.items()]
    inputs = _table(["source", "rows read", "evaluated", "rejected"],
                    [[name, f"{c['rows_read']:,}", f"{c['rows_evaluated']:,}", f"{c['rows_rejected']:,}"]
                     for name, c in counts.items()])
    return f"\nRetrieval summary (trec_eval conventions)\n{_table(['model', 'slice', *columns], rows)}\n\n{inputs}"


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
    return head + "\n" + _table(["model", "slice", "metric", "parameters", "difference", "interval",
                                 "p", "adjusted p", "lacking datums"], rows)
