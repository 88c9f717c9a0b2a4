"""`evalbeam text`: text generation metrics that need no LLM, on Apache Beam, end to end.

    evalbeam text --groundtruths PATH --predictions [NAME=]PATH ... --output DIR
        [--metrics ROUGE,BLEU,Faithfulness,...|all] [--judge_url URL --judge_* ...]
        [options] [Beam pipeline options]
    python -m pipelines.text ...   (same flags)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pipelines.common import (EXIT_USAGE, UsageError, add_common_arguments, add_input_arguments,
                              parse_float_list, parse_models, parse_slices, run_job, say_error,
                              split_beam_args)
from pipelines.judge_options import add_judge_arguments
from schemas.formats import format_of

TASK = "text"
# scoring is the work: enough shards for the workers to share it, and for bounded memory per shard
MIN_SHARDS = 16
RULE_METRICS = ("TextMatching", "PIILeakage", "SensitiveDataLeakage", "EncodingGuardrail",
                "LoopingDetection")
LOCAL_METRICS = ("ROUGE", "BLEU", "CorpusBLEU") + RULE_METRICS


def _judge_metrics() -> tuple:
    from transforms.judge.metrics import JUDGE_METRICS

    return JUDGE_METRICS


METRICS = LOCAL_METRICS + _judge_metrics()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"evalbeam {TASK}", allow_abbrev=False,
        description="Evaluate generated text of one or more models: ROUGE, BLEU and rule-based "
                    "guardrails locally, and LLM-judge and embedding metrics through any OpenAI-"
                    "compatible endpoint (--judge_url). Options not listed here are passed to "
                    "Beam (--runner, --direct_num_workers, --direct_running_mode, ...).")
    add_input_arguments(parser, ".jsonl or .parquet rows")
    add_common_arguments(parser)
    parser.add_argument("--metrics", default="all", metavar="NAMES",
                        help="metric types, comma-separated, or 'all' (default: every local metric, "
                             "plus every judge metric when --judge_url is given, BYOP with "
                             f"--judge_byop): {', '.join(METRICS)}")
    parser.add_argument("--rouge_types", default="rouge1,rouge2,rougeL,rougeLsum", metavar="TYPES",
                        help="ROUGE types (rougeN, rougeL, rougeLsum; default all four)")
    parser.add_argument("--rouge_use_stemmer", action="store_true",
                        help="Porter-stem tokens longer than 3 characters before ROUGE")
    parser.add_argument("--bleu_weights", default="0.25,0.25,0.25,0.25", metavar="W[,W...]",
                        help="n-gram weights of sentence BLEU (default 0.25 x 4)")
    add_judge_arguments(parser)
    return parser


def parse_metrics(text: str, judge: bool = False, byop: bool = False) -> frozenset:
    """The metric names asked; 'all' is every local metric, plus the judge metrics when a judge
    is configured (BYOP only with templates)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if names == ["all"]:
        wanted = set(LOCAL_METRICS)
        if judge:
            wanted |= set(_judge_metrics()) - ({"BYOP"} if not byop else set())
        return frozenset(wanted)
    unknown = sorted(set(names) - set(METRICS))
    if unknown or not names:
        raise UsageError(f"--metrics takes 'all' or names from {', '.join(METRICS)}; got "
                         f"{unknown or 'none'}")
    return frozenset(names)


def parse_args(argv: list[str]):
    from transforms.kernels.text_scores import TextConfig

    args, rest = build_parser().parse_known_args(argv)
    beam_args = split_beam_args(rest)
    if args.num_shards is not None and args.num_shards < 1:
        raise UsageError("--num_shards must be 1 or more")
    if not 0.0 <= args.max_rejected_fraction <= 1.0:
        raise UsageError("--max_rejected_fraction must lie in [0, 1]")
    rouge_types = tuple(t.strip() for t in args.rouge_types.split(",") if t.strip())
    for rouge_type in rouge_types:
        if rouge_type not in ("rougeL", "rougeLsum") and not (
                rouge_type.startswith("rouge") and rouge_type[5:].isdigit() and len(rouge_type) == 6
                and rouge_type[5] != "0"):
            raise UsageError(f"--rouge_types: {rouge_type!r} is not rouge1..rouge9, rougeL or rougeLsum")
    if not rouge_types:
        raise UsageError("--rouge_types is empty")
    weights = parse_float_list(args.bleu_weights, "--bleu_weights")
    if not weights or any(w < 0 for w in weights):
        raise UsageError("--bleu_weights takes one or more non-negative numbers")
    metrics = parse_metrics(args.metrics, bool(args.judge_url), bool(args.judge_byop))
    judge = {}
    if metrics & set(_judge_metrics()):
        from pipelines.judge_options import judge_setup

        settings, judge_config, journal = judge_setup(args, beam_args)
        if "BYOP" in metrics and not judge_config.byop:
            raise UsageError("metric BYOP needs at least one --judge_byop FILE")
        judge = dict(judge=judge_config, judge_settings=settings, journal_root=journal)
    config = TextConfig(metrics=metrics, rouge_types=rouge_types,
                        rouge_use_stemmer=args.rouge_use_stemmer, bleu_weights=tuple(weights), **judge)
    return args, config, parse_models(args.predictions), parse_slices(args.slice), beam_args


def check_source(name: str, source) -> None:
    from transforms.io import InputError, preflight

    for path in source.files:
        if format_of(path) not in ("jsonl", "parquet") or path.lower().endswith(".json"):
            raise InputError(f"{path} (given for {name}) is not a .jsonl or .parquet file of text "
                             "rows; see the README for the format.")
    required = ("datum_uid",) if name == "groundtruths" else ("datum_uid", "response")
    preflight(source, None, required, [], task=TASK)


def build_pipeline(pipeline, sources, models, slices, config, num_shards, folder, quiet, started,
                   run_info, max_rejected_fraction, judge_max_failed_fraction=0.0):
    import apache_beam as beam

    from transforms.classification import reject_sort_key
    from transforms.io import WriteJsonl
    from transforms.text import EvaluateTextFiles, merge_score_parts

    metrics, score_parts, rejected, stats, judge_stats = pipeline | "Text" >> EvaluateTextFiles(
        sources, sorted(models), slices, config, num_shards, folder.temp("scores-parts"), quiet, started)
    n_metrics = metrics | "WriteMetrics" >> WriteJsonl(folder.temp("metrics.jsonl"), record_sort_key)
    n_rejected = rejected | "WriteRejects" >> WriteJsonl(folder.temp("rejected.jsonl"), reject_sort_key)
    n_scores = (score_parts
                | "GatherScoreParts" >> beam.combiners.ToList()
                | "MergeScores" >> beam.Map(merge_score_parts, folder.temp("scores.jsonl")))
    # the judge metrics' records of the whole dataset: their status counts decide the run's status
    judged_records = metrics | "JudgedRecords" >> beam.Filter(
        lambda record: "counts" in record and record["slice"] == {})
    _ = (stats
         | "SumStats" >> beam.CombinePerKey(sum)
         | "GatherStats" >> beam.combiners.ToList()
         | "Publish" >> beam.Map(publish, beam.pvalue.AsSingleton(n_metrics),
                                 beam.pvalue.AsSingleton(n_rejected), folder, run_info, started,
                                 max_rejected_fraction, beam.pvalue.AsSingleton(n_scores),
                                 beam.pvalue.AsSingleton(judge_stats), config.judge is not None,
                                 beam.pvalue.AsList(judged_records), judge_max_failed_fraction))


def publish(stats, n_metrics, n_rejected, folder, run_info, started, max_rejected_fraction,
            n_scores, judge_stats, judged, judged_records=(), judge_max_failed_fraction=0.0):
    """finalize_run, with run.json's "judge" section (calls, cache hits, failures by status,
    tokens, estimated cost, achieved rate) when judge metrics ran, and the run's problems with
    the judge (pipelines.judge_options.judge_problems: a metric the judge could not compute for
    more than judge_max_failed_fraction of its datums makes the run incomplete)."""
    from pipelines.judge_options import judge_problems, judge_report
    from transforms.outputs import finalize_run

    problems = []
    if judged:
        report = judge_report(judge_stats)
        run_info = dict(run_info, judge=report)
        problems = judge_problems(list(judged_records), judge_max_failed_fraction,
                                  report["error_samples"])
    return finalize_run(stats, n_metrics, n_rejected, folder, run_info, started,
                        max_rejected_fraction, n_scores, problems=problems)


RECORD_ORDER = METRICS


def record_sort_key(record: dict):
    """model, slice, type, then parameters."""
    return (record["model"], len(record["slice"]), json.dumps(record["slice"], sort_keys=True),
            RECORD_ORDER.index(record["type"]), json.dumps(record["parameters"], sort_keys=True))


def run(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    try:
        args, config, models, slices, beam_args = parse_args(argv)
        settings = config.judge_settings
        if settings is not None and not settings.dry_run and not args.judge_skip_check:
            # before any input is read or anything written: a judge that cannot answer would
            # otherwise cost a whole run of failed calls (a dry run sends nothing: no check)
            from pipelines.judge_options import check_judge

            check_judge(settings, key_named=args.judge_api_key_env is not None)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE

    def build(pipeline, sources, num_shards, folder, run_info):
        build_pipeline(pipeline, sources, models, slices, config, num_shards, folder, args.quiet,
                       started, run_info, args.max_rejected_fraction, args.judge_max_failed_fraction)

    def summarize(metrics_path, counts):
        from pipelines.summary import text_summary

        text = text_summary(metrics_path, counts)
        if config.judge is not None:
            from pipelines.judge_options import judge_table
            from transforms.io import read_json

            text += "\n" + judge_table(read_json(metrics_path.rsplit("/", 1)[0] + "/run.json")["judge"])
        return text

    options = {"metrics": sorted(config.metrics), "rouge_types": list(config.rouge_types),
               "rouge_use_stemmer": config.rouge_use_stemmer, "bleu_weights": list(config.bleu_weights)}
    if config.judge is not None:
        from pipelines.judge_options import judge_options_info

        options["judge"] = dict(judge_options_info(config.judge_settings, config.judge, config.journal_root),
                                max_failed_fraction=args.judge_max_failed_fraction,
                                skip_check=args.judge_skip_check)
    return run_job(TASK, args, models, slices, beam_args, options,
                   check_source, build, summarize, started, min_shards=MIN_SHARDS,
                   outputs=("scores.jsonl",))


def main() -> None:
    from pipelines.cli import quiet_logs

    quiet_logs()
    sys.exit(run())


if __name__ == "__main__":
    main()
