"""`evalbeam classification`: classification metrics on Apache Beam, end to end.

    evalbeam classification --groundtruths PATH --predictions [NAME=]PATH ... --output DIR
        [options] [Beam pipeline options]
    python -m evalbeam.pipelines.tasks.classification ...   (same flags)

The task's declaration (pipelines/tasks/task.py); the launcher (pipelines/launch/launcher.py) does the rest.
Reference: pipelines/tasks/classification.md.
"""

from __future__ import annotations

import json

from evalbeam.pipelines.launch.common import UsageError, parse_float_list
from evalbeam.pipelines.tasks.summary import fmt, inputs_table, metric_records, text_table
from evalbeam.pipelines.tasks.task import Task
from evalbeam.transforms.kernels.calibration import CALIBRATION_TYPES, DEFAULT_BINS
from evalbeam.transforms.kernels.classification import (ALL_METRIC_TYPES, DEFAULT_PR_THRESHOLDS,
                                                        DEFAULT_METRIC_TYPES, ClassificationConfig)

NAME = "classification"


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
                     fmt(row.get("Accuracy")), fmt(macro["Precision"]),
                     fmt(macro["Recall"]), fmt(macro["F1"]), fmt(row.get("mROCAUC"))])
    header = ["model", "slice", "label key", "accuracy", "precision", "recall", "F1", "mROCAUC"]
    hardmax = "hardmax" if config.hardmax else "no hardmax"
    title = (f"\nClassification summary (score threshold {threshold}, {hardmax}; precision, "
             f"recall and F1 are macro means over the label values present in the slice, as "
             f"ground truth or prediction: scikit-learn's default label set)")
    note = ("\n(Counts not computed: those means cover every label value with a record, also "
            "values present in neither role.)" if unknown_presence else "")
    inputs = inputs_table(counts)
    return f"{title}\n{text_table(header, rows)}{note}\n\n{inputs}"


def classification_report_blocks(records, charts) -> list:
    """The report's tables and charts of one model and slice's records (Task.report_blocks)."""
    from evalbeam.pipelines.report.blocks import bars, label_of, record_charts, scalar_rows
    from evalbeam.pipelines.report.elements import fmt, table, value_text
    blocks = []
    head = scalar_rows(records, ("Accuracy", "mROCAUC", "ECE", "MCE", "BrierScore"),
                        lambda r: (r.get("parameters") or {}).get("label_key", ""))
    if head:
        blocks.append(table("Overall", ["label key", "metric", "parameters", "value", "interval"], head))
    per_label: dict = {}
    for r in records:
        if r["type"] in ("Precision", "Recall", "F1", "ROCAUC", "Counts"):
            params = r.get("parameters") or {}
            key = (label_of(r), params.get("score_threshold"))
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
    f1_records = [r for r in records if r["type"] == "F1"
                  and (r.get("parameters") or {}).get("score_threshold") == f1_at]
    chart = bars(f1_records, ("F1",), charts, f"F1 per label (score threshold {fmt(f1_at)})", label_of, "F1")
    if chart:
        blocks.append(chart)
    return [b for b in blocks + record_charts(records, charts) if b]


class ClassificationTask(Task):
    """`evalbeam classification`: the task's command-side declaration (pipelines/tasks/task.py)."""

    name = NAME
    summary = "evaluate classification predictions of one or more models against ground truth"
    plumbing = "evalbeam.transforms.classification"
    # records cover only the label values a model's own rows or the ground truth hold
    # (kernels.classification.key_metrics), so the other models of a run change none of them
    separable_models = True
    report_blocks = staticmethod(classification_report_blocks)   # (records, charts) -> blocks
    headlines = ("Accuracy", "mROCAUC")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--score_thresholds", default="0.0", metavar="T[,T...]",
                            help="score thresholds of Counts, Precision, Recall, F1, Accuracy and "
                                 "ConfusionMatrix (default 0.0)")
        parser.add_argument("--hardmax", dest="hardmax", action="store_true", default=True,
                            help="only each key's top-scoring value counts as predicted (default)")
        parser.add_argument("--no_hardmax", dest="hardmax", action="store_false",
                            help="every value scoring at least the threshold counts as predicted")
        parser.add_argument("--pr_curve_thresholds", default=",".join(map(str, DEFAULT_PR_THRESHOLDS)),
                            metavar="T[,T...]", help="thresholds of the precision-recall curves "
                                                     "(default 0.05 to 0.95 by 0.05)")
        parser.add_argument("--max_examples", type=int, default=1, metavar="N",
                            help="example datum uids kept per confusion-matrix cell and curve "
                                 "observation (default 1)")
        parser.add_argument("--metrics", default=None, metavar="TYPE[,TYPE...]",
                            help=f"metric types to compute, from {', '.join(ALL_METRIC_TYPES)} "
                                 f"(default: {', '.join(DEFAULT_METRIC_TYPES)}; with --calibration_bins also "
                                 f"{', '.join(CALIBRATION_TYPES)})")
        parser.add_argument("--calibration_bins", type=int, default=None, metavar="B",
                            help=f"bins of the calibration metrics (default {DEFAULT_BINS}); giving it "
                                 f"adds {', '.join(CALIBRATION_TYPES)} to the default metrics")
        parser.add_argument("--max_label_values", type=int, default=None, metavar="N",
                            help="most distinct values a label key may have; a key with more is not "
                                 "evaluated and the run is incomplete (default: what fits 256 MiB per "
                                 "model and slice with the chosen metrics and thresholds: 5,742 with "
                                 "the defaults, as the confusion matrix grows with its square)")
        parser.add_argument("--max_labels_per_row", type=int, default=None, metavar="N",
                            help="most labels one row may hold; a longer row is rejected (default: "
                                 "the bound of --max_label_values)")

    def configure(self, args) -> ClassificationConfig:
        if args.metrics is not None:
            metrics = frozenset(m.strip() for m in args.metrics.split(",") if m.strip())
        else:
            # calibration is computed when asked for, so the default outputs stay as they were
            metrics = frozenset(DEFAULT_METRIC_TYPES) | (
                frozenset(CALIBRATION_TYPES) if args.calibration_bins is not None else frozenset())
        unknown = sorted(metrics - set(ALL_METRIC_TYPES))
        if unknown or not metrics:
            raise UsageError(f"--metrics takes names from {', '.join(ALL_METRIC_TYPES)}; got {unknown or 'none'}")
        if args.calibration_bins is not None and args.calibration_bins < 1:
            raise UsageError("--calibration_bins must be 1 or more")
        if args.max_examples < 0:
            raise UsageError("--max_examples must be 0 or more")
        for name in ("max_label_values", "max_labels_per_row"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise UsageError(f"--{name} must be 1 or more")
        return ClassificationConfig(
            score_thresholds=parse_float_list(args.score_thresholds, "--score_thresholds"),
            hardmax=args.hardmax,
            pr_curve_thresholds=parse_float_list(args.pr_curve_thresholds, "--pr_curve_thresholds"),
            max_examples=args.max_examples,
            metrics=metrics,
            max_label_values=args.max_label_values,
            max_labels_per_row=args.max_labels_per_row,
            calibration_bins=DEFAULT_BINS if args.calibration_bins is None else args.calibration_bins,
        )

    def options(self, config: ClassificationConfig, args) -> dict:
        return {
            "score_thresholds": list(config.score_thresholds), "hardmax": config.hardmax,
            "pr_curve_thresholds": list(config.pr_curve_thresholds),
            "max_examples": config.max_examples,
            "metrics": [m for m in ALL_METRIC_TYPES if m in config.metrics],
            "calibration_bins": config.calibration_bins,
            "max_label_values": config.value_limit,
            "max_labels_per_row": config.labels_per_row_limit,
        }

    def check_source(self, name: str, source, config: ClassificationConfig, slices) -> None:
        from evalbeam.transforms.classification import schema_of
        from evalbeam.transforms.preflight import preflight

        preflight(source, schema_of(name), ("datum_uid", "labels"), [], task=NAME)

    def summarize(self, metrics_path: str, info: dict, config: ClassificationConfig) -> str:
        return classification_summary(metrics_path, info["counts"], config)


TASK = ClassificationTask()


run = TASK.run

if __name__ == "__main__":
    TASK.main()
