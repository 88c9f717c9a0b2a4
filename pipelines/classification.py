"""`evalbeam classification`: classification metrics on Apache Beam, end to end.

    evalbeam classification --groundtruths PATH --predictions [NAME=]PATH ... --output DIR
        [options] [Beam pipeline options]
    python -m pipelines.classification ...   (same flags)
"""

from __future__ import annotations

import argparse
import sys
import time

from pipelines.common import (EXIT_USAGE, UsageError, add_common_arguments, add_input_arguments,
                              parse_float_list, parse_models, parse_slices, run_job, say_error,
                              split_beam_args)
from transforms.kernels.classification import (DEFAULT_PR_THRESHOLDS, METRIC_TYPES,
                                               ClassificationConfig)

TASK = "classification"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"evalbeam {TASK}", allow_abbrev=False,
        description="Evaluate classification predictions of one or more models against ground "
                    "truth. Options not listed here are passed to Beam (--runner, "
                    "--direct_num_workers, --direct_running_mode, ...).")
    add_input_arguments(parser, ".jsonl or .parquet rows")
    add_common_arguments(parser)
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
    parser.add_argument("--metrics", default=",".join(METRIC_TYPES), metavar="TYPE[,TYPE...]",
                        help=f"metric types to compute (default all: {', '.join(METRIC_TYPES)})")
    parser.add_argument("--max_label_values", type=int, default=None, metavar="N",
                        help="most distinct values a label key may have; a key with more is not "
                             "evaluated and the run is incomplete (default: what fits 256 MiB per "
                             "model and slice with the chosen metrics and thresholds: 5,742 with "
                             "the defaults, as the confusion matrix grows with its square)")
    parser.add_argument("--max_labels_per_row", type=int, default=None, metavar="N",
                        help="most labels one row may hold; a longer row is rejected (default: "
                             "the bound of --max_label_values)")
    return parser


def parse_args(argv: list[str]):
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    beam_args = split_beam_args(rest)
    metrics = frozenset(m.strip() for m in args.metrics.split(",") if m.strip())
    unknown = sorted(metrics - set(METRIC_TYPES))
    if unknown or not metrics:
        raise UsageError(f"--metrics takes names from {', '.join(METRIC_TYPES)}; got {unknown or 'none'}")
    if args.max_examples < 0:
        raise UsageError("--max_examples must be 0 or more")
    if args.num_shards is not None and args.num_shards < 1:
        raise UsageError("--num_shards must be 1 or more")
    if not 0.0 <= args.max_rejected_fraction <= 1.0:
        raise UsageError("--max_rejected_fraction must lie in [0, 1]")
    for name in ("max_label_values", "max_labels_per_row"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name} must be 1 or more")
    config = ClassificationConfig(
        score_thresholds=parse_float_list(args.score_thresholds, "--score_thresholds"),
        hardmax=args.hardmax,
        pr_curve_thresholds=parse_float_list(args.pr_curve_thresholds, "--pr_curve_thresholds"),
        max_examples=args.max_examples,
        metrics=metrics,
        max_label_values=args.max_label_values,
        max_labels_per_row=args.max_labels_per_row,
    )
    models = parse_models(args.predictions)
    slices = parse_slices(args.slice)
    return args, config, models, slices, beam_args


def build_pipeline(pipeline, sources, config, models, slices, num_shards, folder, quiet,
                   started, run_info, max_rejected_fraction):
    """Add the classification job to `pipeline`: read, evaluate, write, publish (see
    transforms.outputs.finalize_run)."""
    import apache_beam as beam

    from transforms.classification import (MatchAndCombine, ReadClassificationFiles,
                                           Vocabularies, record_sort_key, reject_sort_key,
                                           vocabulary_problems)
    from transforms.io import WriteJsonl
    from transforms.outputs import finalize_run

    slice_keys = sorted({key for spec in slices for key in spec})
    pieces, read_rejects, read_stats = pipeline | "ReadInputs" >> ReadClassificationFiles(
        sources, slice_keys, num_shards, quiet, started, config)
    per_source, vocab = pieces | "Vocabularies" >> Vocabularies(config)
    problems = per_source | "LabelProblems" >> beam.Map(vocabulary_problems, sorted(models), config)
    records, match_rejects, match_stats = (pieces, vocab) | "Evaluate" >> MatchAndCombine(
        config, sorted(models), slices, {n: s.files for n, s in sources.items()}, quiet, started,
        num_shards)
    n_metrics = records | "WriteMetrics" >> WriteJsonl(folder.temp("metrics.jsonl"), record_sort_key)
    n_rejected = ((read_rejects, match_rejects) | "Rejects" >> beam.Flatten()
                  | "WriteRejects" >> WriteJsonl(folder.temp("rejected.jsonl"), reject_sort_key))
    _ = ((read_stats, match_stats) | "Stats" >> beam.Flatten()
         | "SumStats" >> beam.CombinePerKey(sum)
         | "GatherStats" >> beam.combiners.ToList()
         | "Publish" >> beam.Map(finalize_run, beam.pvalue.AsSingleton(n_metrics),
                                 beam.pvalue.AsSingleton(n_rejected), folder, run_info, started,
                                 max_rejected_fraction,
                                 problems=beam.pvalue.AsSingleton(problems)))


def run(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    try:
        args, config, models, slices, beam_args = parse_args(argv)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE
    from transforms.classification import schema_of
    from transforms.io import preflight

    def check_source(name, source):
        preflight(source, schema_of(name), ("datum_uid", "labels"), [], task=TASK)

    def build(pipeline, sources, num_shards, folder, run_info):
        build_pipeline(pipeline, sources, config, models, slices, num_shards, folder, args.quiet,
                       started, run_info, args.max_rejected_fraction)

    def summarize(metrics_path, counts):
        from pipelines.summary import classification_summary

        return classification_summary(metrics_path, counts, config)

    task_options = {
        "score_thresholds": list(config.score_thresholds), "hardmax": config.hardmax,
        "pr_curve_thresholds": list(config.pr_curve_thresholds),
        "max_examples": config.max_examples,
        "metrics": [m for m in METRIC_TYPES if m in config.metrics],
        "max_label_values": config.value_limit,
        "max_labels_per_row": config.labels_per_row_limit,
    }
    return run_job(TASK, args, models, slices, beam_args, task_options, check_source, build,
                   summarize, started)


def main() -> None:
    from pipelines.cli import quiet_logs

    quiet_logs()
    sys.exit(run())


if __name__ == "__main__":
    main()
