"""`evalbeam classification`: classification metrics on Apache Beam, end to end.

    evalbeam classification --groundtruths PATH --predictions [NAME=]PATH ... --output DIR
        [options] [Beam pipeline options]
    python -m evalbeam.pipelines.classification ...   (same flags)

The task's declaration (pipelines/task.py); the launcher (pipelines/launcher.py) does the rest.
Reference: pipelines/classification.md.
"""

from __future__ import annotations

from evalbeam.pipelines.common import UsageError, parse_float_list
from evalbeam.pipelines.task import TaskSpec
from evalbeam.transforms.kernels.calibration import CALIBRATION_TYPES, DEFAULT_BINS
from evalbeam.transforms.kernels.classification import (ALL_METRIC_TYPES, DEFAULT_PR_THRESHOLDS,
                                                        METRIC_TYPES, ClassificationConfig)

TASK = "classification"


def add_arguments(parser) -> None:
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
                             f"(default: {', '.join(METRIC_TYPES)}; with --calibration_bins also "
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


def configure(args) -> ClassificationConfig:
    if args.metrics is not None:
        metrics = frozenset(m.strip() for m in args.metrics.split(",") if m.strip())
    else:
        # calibration is computed when asked for, so the default outputs stay as they were
        metrics = frozenset(METRIC_TYPES) | (
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


def options(config: ClassificationConfig, args) -> dict:
    return {
        "score_thresholds": list(config.score_thresholds), "hardmax": config.hardmax,
        "pr_curve_thresholds": list(config.pr_curve_thresholds),
        "max_examples": config.max_examples,
        "metrics": [m for m in ALL_METRIC_TYPES if m in config.metrics],
        "calibration_bins": config.calibration_bins,
        "max_label_values": config.value_limit,
        "max_labels_per_row": config.labels_per_row_limit,
    }


def check_source(name: str, source, config: ClassificationConfig, slices) -> None:
    from evalbeam.transforms.classification import schema_of
    from evalbeam.transforms.io import preflight

    preflight(source, schema_of(name), ("datum_uid", "labels"), [], task=TASK)


def summarize(metrics_path: str, info: dict, config: ClassificationConfig) -> str:
    from evalbeam.pipelines.summary import classification_summary

    return classification_summary(metrics_path, info["counts"], config)


SPEC = TaskSpec(
    name=TASK,
    summary="evaluate classification predictions of one or more models against ground truth",
    input_help=".jsonl or .parquet rows",
    add_arguments=add_arguments, configure=configure, options=options,
    check_source=check_source, transforms="evalbeam.transforms.classification", summarize=summarize,
    # records cover only the label values a model's own rows or the ground truth hold
    # (kernels.classification.key_metrics), so the other models of a run change none of them
    separable_models=True)


run = SPEC.run

if __name__ == "__main__":
    SPEC.main()
