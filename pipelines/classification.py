"""`evalbeam classification`: classification metrics on Apache Beam, end to end.

    evalbeam classification --groundtruths PATH --predictions [NAME=]PATH ... --output DIR
        [options] [Beam pipeline options]
    python -m pipelines.classification ...   (same flags)
"""

from __future__ import annotations

import argparse
import sys
import time

from pipelines.common import (EXIT_FAILED, EXIT_OK, EXIT_REJECTED, EXIT_USAGE,
                              UsageError, add_common_arguments, default_num_shards,
                              parse_float_list, parse_model_spec, rejection_message,
                              safe_beam_args, say_error, split_beam_args, versions)
from transforms.kernels.classification import (DEFAULT_PR_THRESHOLDS, METRIC_TYPES,
                                               ClassificationConfig)

TASK = "classification"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"evalbeam {TASK}", allow_abbrev=False,
        description="Evaluate classification predictions of one or more models against ground "
                    "truth. Options not listed here are passed to Beam (--runner, "
                    "--direct_num_workers, --direct_running_mode, ...).")
    parser.add_argument("--groundtruths", required=True, metavar="PATH",
                        help="ground-truth rows: a path or glob, .jsonl or .parquet")
    parser.add_argument("--predictions", required=True, action="append", metavar="[NAME=]PATH",
                        help="prediction rows of one model (repeatable); without NAME the model "
                             "is named after the file's stem")
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
    config = ClassificationConfig(
        score_thresholds=parse_float_list(args.score_thresholds, "--score_thresholds"),
        hardmax=args.hardmax,
        pr_curve_thresholds=parse_float_list(args.pr_curve_thresholds, "--pr_curve_thresholds"),
        max_examples=args.max_examples,
        metrics=metrics,
    )
    models: dict[str, str] = {}
    for spec in args.predictions:
        name, pattern = parse_model_spec(spec)
        if name == "groundtruths":
            raise UsageError("'groundtruths' cannot be a model name")
        if name in models:
            raise UsageError(f"two --predictions are named {name!r}; name them NAME=PATH")
        models[name] = pattern
    slices = []
    for spec in args.slice:
        keys = tuple(k.strip() for k in spec.split(",") if k.strip())
        if not keys:
            raise UsageError("--slice needs at least one metadata key")
        slices.append(keys)
    return args, config, models, slices, beam_args


def build_pipeline(pipeline, sources, config, models, slices, num_shards, folder, quiet,
                   started, run_info, max_rejected_fraction):
    """Add the classification job to `pipeline`: read, evaluate, write, publish (see
    transforms.io.finalize_run)."""
    import apache_beam as beam

    from transforms.classification import (MatchAndCombine, ReadClassificationFiles,
                                           record_sort_key, reject_sort_key)
    from transforms.io import WriteJsonl, finalize_run

    slice_keys = sorted({key for spec in slices for key in spec})
    pieces, vocab, read_rejects, read_stats = pipeline | "ReadInputs" >> ReadClassificationFiles(
        sources, slice_keys, num_shards, quiet, started)
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
                                 max_rejected_fraction))


def run(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    try:
        args, config, models, slices, beam_args = parse_args(argv)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE

    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from transforms.classification import GROUNDTRUTHS, schema_of
    from transforms.io import InputError, OutputFolder, expand_source, preflight, read_json

    try:
        sources = {GROUNDTRUTHS: expand_source(GROUNDTRUTHS, args.groundtruths)}
        for name, pattern in models.items():
            sources[name] = expand_source(name, pattern)
        for name, source in sources.items():
            preflight(source, schema_of(name), ("datum_uid", "labels"), [])
        folder = OutputFolder(args.output)
        folder.prepare()
    except InputError as error:
        say_error(str(error))
        _record_input_failure(args.output, str(error), started)
        return EXIT_USAGE

    total_bytes = sum(_size(path) for s in sources.values() for path in s.files)
    num_shards = args.num_shards or default_num_shards(total_bytes)
    if not any(a.startswith("--default_sdk_harness_log_level") for a in beam_args):
        # multi-process and remote workers log at INFO by default; keep stderr for progress
        beam_args = beam_args + ["--default_sdk_harness_log_level=ERROR"]
    options = PipelineOptions(beam_args)
    run_info = {
        "task": TASK,
        "status": "running",
        "inputs": {name: {"pattern": s.pattern, "files": list(s.files)} for name, s in sources.items()},
        "models": sorted(models),
        "sources": list(sources),
        "slices": [list(s) for s in slices],
        "options": {
            "score_thresholds": list(config.score_thresholds), "hardmax": config.hardmax,
            "pr_curve_thresholds": list(config.pr_curve_thresholds),
            "max_examples": config.max_examples,
            "metrics": [m for m in METRIC_TYPES if m in config.metrics],
            "num_shards": num_shards, "max_rejected_fraction": args.max_rejected_fraction,
        },
        "runner": options.get_all_options().get("runner") or "DirectRunner",
        "beam_args": safe_beam_args(beam_args),
        "versions": versions(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }
    quiet = args.quiet
    if not quiet:
        print(f"evalbeam: evaluating {len(models)} model(s) over {num_shards} shard(s) "
              f"on {run_info['runner']}", file=sys.stderr)
    try:
        pipeline = beam.Pipeline(options=options)
        build_pipeline(pipeline, sources, config, models, slices, num_shards, folder, quiet,
                       started, run_info, args.max_rejected_fraction)
        pipeline.run().wait_until_finish()
    except Exception as error:  # the pipeline failed: say why in one paragraph, keep no metrics
        first_line = (str(error).strip().splitlines() or [""])[-1]
        run_info.update(status="failed", error=f"{type(error).__name__}: {first_line}",
                        wall_time_seconds=round(time.time() - started, 3))
        folder.fail(run_info)
        say_error(f"the pipeline failed ({type(error).__name__}: {first_line}). No metrics were "
                  f"written; {folder.final('run.json')} records the failure.")
        return EXIT_FAILED
    if not FileSystems.exists(folder.final("run.json")):
        # A runner that returns before the job ends (e.g. a Dataflow flex template launch).
        print(f"evalbeam: job submitted; its outputs will appear in {args.output} when it "
              "finishes (run.json last but one, metrics.jsonl last).", file=sys.stderr)
        return EXIT_OK
    info = read_json(folder.final("run.json"))
    if not quiet:
        from pipelines.summary import classification_summary

        print(classification_summary(folder.final("metrics.jsonl"), info["counts"], config))
        print(f"\nOutputs in {args.output}: metrics.jsonl ({info['metrics_written']:,} records), "
              f"run.json, rejected.jsonl ({info['rows_rejected']:,} rows). "
              f"Wall time {info['wall_time_seconds']:.1f} s.")
    if info["status"] != "complete":
        print(rejection_message(info["counts"], info["first_rejections"],
                                folder.final("rejected.jsonl"), args.max_rejected_fraction),
              file=sys.stderr)
        return EXIT_REJECTED
    return EXIT_OK


def _record_input_failure(output: str, error: str, started: float) -> None:
    """Clear an earlier run's outputs and leave a run.json that says why this run stopped, so a
    scheduled job never shows yesterday's metrics as today's. Best effort: the output folder may
    be the problem."""
    from transforms.io import OutputFolder

    try:
        folder = OutputFolder(output)
        folder.prepare()
        folder.fail({"task": TASK, "status": "failed", "error": error, "versions": versions(),
                     "wall_time_seconds": round(time.time() - started, 3)})
    except Exception:
        pass


def _size(path: str) -> int:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def main() -> None:
    from pipelines.cli import quiet_logs

    quiet_logs()
    sys.exit(run())


if __name__ == "__main__":
    main()
