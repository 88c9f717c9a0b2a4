"""`evalbeam retrieval`: ranking metrics of retrieval runs against qrels, trec_eval compatible.

    evalbeam retrieval --groundtruths QRELS --predictions [NAME=]RUN ... --output DIR [options]
    python -m pipelines.retrieval ...   (same flags)
"""

from __future__ import annotations

import argparse
import sys
import time

from pipelines.common import (EXIT_USAGE, UsageError, add_common_arguments, add_input_arguments,
                              parse_models, parse_slices, run_job, say_error, split_beam_args)

TASK = "retrieval"
MIN_SHARDS = 8


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"evalbeam {TASK}", allow_abbrev=False,
        description="Evaluate retrieval runs against relevance judgments (TREC qrels/run files or "
                    "JSONL), with trec_eval's conventions. Options not listed here are passed to "
                    "Beam (--runner, --direct_num_workers, --direct_running_mode, ...).")
    add_input_arguments(parser, "TREC qrels / run files, or .jsonl rows")
    add_common_arguments(parser)
    parser.add_argument("--k", default="1,3,5,10,20,100,1000", metavar="K[,K...]",
                        help="rank cutoffs of Precision, Recall, F1, Hit, MAP@k, DCG and NDCG "
                             "(default 1,3,5,10,20,100,1000)")
    parser.add_argument("--relevance_level", type=int, default=1, metavar="L",
                        help="a document is relevant when its level is >= L (trec_eval -l; default 1)")
    parser.add_argument("--max_docs", type=int, default=1000, metavar="N",
                        help="documents kept per query after ranking (trec_eval convention; "
                             "default 1000, 0 for no cut)")
    parser.add_argument("--complete", action="store_true",
                        help="average over every query of the qrels, a query missing from a run "
                             "scoring 0 (trec_eval -c); default: the queries of the run")
    parser.add_argument("--per_query", action="store_true",
                        help="also write per_query.jsonl: every measure of every (query, model)")
    return parser


def parse_args(argv: list[str]):
    from transforms.kernels.retrieval import RetrievalConfig

    args, rest = build_parser().parse_known_args(argv)
    beam_args = split_beam_args(rest)
    if args.num_shards is not None and args.num_shards < 1:
        raise UsageError("--num_shards must be 1 or more")
    if not 0.0 <= args.max_rejected_fraction <= 1.0:
        raise UsageError("--max_rejected_fraction must lie in [0, 1]")
    try:
        ks = tuple(int(k) for k in args.k.split(",") if k.strip())
    except ValueError:
        raise UsageError(f"--k takes positive integers, not {args.k!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise UsageError("--k takes positive integers")
    if args.relevance_level < 0 or args.max_docs < 0:
        raise UsageError("--relevance_level and --max_docs must be 0 or more")
    config = RetrievalConfig(ks=ks, relevance_level=args.relevance_level,
                             max_docs_per_query=args.max_docs or None)
    return args, config, parse_models(args.predictions), parse_slices(args.slice), beam_args


def check_source(name: str, source, slices=()) -> None:
    """A file must look like its kind: qrels lines of 4 fields or JSONL judgments; run lines of
    at least 6 fields or JSONL scores (rows are checked one by one later). --slice needs JSONL
    qrels (their metadata). A file of another task's rows (JSONL or Parquet) is named with the
    command that reads it. Only the first non-blank line is read (through open_input, so a
    compressed file that breaks off there is an input error too)."""
    from schemas.retrieval_rows import format_of
    from schemas.safe_json import loads_row
    from transforms.io import InputError, head_lines, open_input, wrong_task_message

    qrels = name == "groundtruths"
    for path in source.files:
        if slices and qrels and format_of(path) != "jsonl":
            raise InputError(f"--slice reads the \"metadata\" of JSONL qrels rows; {path} is a TREC "
                             "qrels file, which has none.")
        if path.lower().endswith((".parquet", ".pq")):
            _check_parquet(name, path)
        try:
            with open_input(path) as stream:
                lines = head_lines(stream, 1)
        except InputError:
            raise
        except Exception as error:
            raise InputError(f"cannot read {path} (given for {name}): {error}") from None
        if not lines:
            raise InputError(f"{path} (given for {name}) holds no rows.")
        line = lines[0]
        jsonl = format_of(path) == "jsonl"
        row = loads_row(line)[0] if jsonl or line.lstrip().startswith(b"{") else None
        if isinstance(row, dict):
            other = wrong_task_message(path, name, row, TASK)
            if other:
                raise InputError(other)
        need = ("query_id", "doc_id", "relevance" if qrels else "score")
        if jsonl:
            if not isinstance(row, dict) or any(k not in row for k in need):
                raise InputError(f"{path} (given for {name}) does not start with a JSON object "
                                 f"with {list(need)}; see the README for the formats.")
        elif isinstance(row, dict) and all(k in row for k in need):
            raise InputError(f"{path} (given for {name}) holds JSON rows, but only names ending in "
                             ".jsonl, .ndjson or .json (optionally compressed, e.g. .jsonl.gz) are "
                             "read as JSONL; every other file is read as TREC text. Rename it.")
        else:
            fields = len(line.split())
            if (qrels and fields != 4) or (not qrels and fields < 6):
                what = "qrels lines 'query iter doc relevance'" if qrels else \
                    "run lines 'query Q0 doc rank score tag'"
                raise InputError(f"{path} (given for {name}) starts with a line of {fields} fields; "
                                 f"expected TREC {what} (or .jsonl rows).")


def _check_parquet(name: str, path: str) -> None:
    """Retrieval reads no Parquet: name the command for another task's file, else say so."""
    from transforms.io import InputError, open_input, wrong_task_message

    try:
        import pyarrow.parquet as pq

        with open_input(path) as stream:
            columns = pq.ParquetFile(stream).schema_arrow.names
    except InputError:
        raise
    except Exception:
        columns = []
    other = wrong_task_message(path, name, columns, TASK) if columns else None
    raise InputError(other or f"{path} (given for {name}) is a Parquet file; evalbeam {TASK} reads "
                              "TREC qrels and run files, or JSONL rows (see the README).")


def read_slices(sources, slices) -> tuple[dict | None, dict]:
    """The --slice values of each query and the qrels rows that cannot carry them.

    Returns ({spec: {query_id: tuple of canonical JSON values}}, {qrels file id: {line:
    reason}}). A query's values come from its first qrels row (files in order) that has a
    "metadata" object; rows the reader rejects do not count (json_row: malformed, too deep, a
    lone surrogate, a bad field, a line too long), rows the shards reject as repeated (query,
    doc) pairs do (that needs every file at once). A row whose metadata value for a --slice key
    is NaN or infinite (no JSON output can name that slice) is listed with the reason and
    rejected by the pipeline's reader, so its judgment is not used either; the query's values
    then come from its next row. Lines are read one at a time, at most MAX_ROW_BYTES each."""
    if not slices:
        return None, {}
    from schemas.retrieval_rows import MAX_ROW_BYTES, json_row
    from schemas.rows import canonical_json
    from schemas.safe_json import iter_lines, slice_value_problem
    from transforms.io import open_input

    keys = sorted({key for spec in slices for key in spec})
    per_query: dict = {}
    excluded: dict = {}
    for file_id, path in enumerate(sources["groundtruths"].files):
        with open_input(path) as stream:
            for number, raw in iter_lines(stream, MAX_ROW_BYTES):
                if raw is None or not raw.strip():
                    continue
                row, problem = json_row(raw, "qrels")
                if problem or not isinstance(row.get("metadata"), dict):
                    continue
                metadata = row["metadata"]
                reason = next(filter(None, (slice_value_problem(k, metadata.get(k)) for k in keys)), None)
                if reason:
                    excluded.setdefault(file_id, {})[number] = reason
                    continue
                per_query.setdefault(row["query_id"], metadata)
    values = {spec: {q: tuple(canonical_json(m.get(k)) for k in spec) for q, m in per_query.items()}
              for spec in slices}
    return values, excluded


def build_pipeline(pipeline, sources, models, slices, config, complete, per_query, num_shards,
                   folder, quiet, started, run_info, max_rejected_fraction):
    import apache_beam as beam

    from transforms.classification import reject_sort_key
    from transforms.io import WriteJsonl, merge_sorted_parts
    from transforms.retrieval import EvaluateRetrievalFiles, record_sort_key

    slice_values, excluded = read_slices(sources, slices)
    metrics, parts, rejected, stats, coverage = pipeline | "Retrieval" >> EvaluateRetrievalFiles(
        sources, sorted(models), config, complete, slice_values, num_shards,
        folder.temp("per-query-parts") if per_query else None, quiet, started,
        folder.temp("pieces"), excluded)
    n_metrics = metrics | "WriteMetrics" >> WriteJsonl(folder.temp("metrics.jsonl"), record_sort_key)
    n_rejected = rejected | "WriteRejects" >> WriteJsonl(folder.temp("rejected.jsonl"), reject_sort_key)
    extra = []
    if per_query:
        n_rows = (parts | "GatherParts" >> beam.combiners.ToList()
                  | "MergePerQuery" >> beam.Map(merge_sorted_parts, folder.temp("per_query.jsonl"),
                                                "query_id"))
        extra = [beam.pvalue.AsSingleton(n_rows)]
    _ = (stats
         | "SumStats" >> beam.CombinePerKey(sum)
         | "GatherStats" >> beam.combiners.ToList()
         | "Publish" >> beam.Map(publish, beam.pvalue.AsSingleton(n_metrics),
                                 beam.pvalue.AsSingleton(n_rejected), folder, run_info, started,
                                 max_rejected_fraction, *extra,
                                 coverage=beam.pvalue.AsList(coverage), complete=complete))


def publish(stats, n_metrics, n_rejected, folder, run_info, started, max_rejected_fraction,
            *n_rows, coverage=(), complete=False):
    """finalize_run, with the findings on the queries the runs share with the qrels (coverage:
    the (model, QueryCoverage) pairs of every shard; transforms.retrieval.coverage_problems).
    n_rows: the rows of per_query.jsonl, when written."""
    from transforms.outputs import finalize_run
    from transforms.retrieval import coverage_problems

    return finalize_run(stats, n_metrics, n_rejected, folder, run_info, started,
                        max_rejected_fraction, *n_rows,
                        problems=coverage_problems(coverage, complete))


def run(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    try:
        args, config, models, slices, beam_args = parse_args(argv)
    except UsageError as error:
        say_error(str(error))
        return EXIT_USAGE

    def build(pipeline, sources, num_shards, folder, run_info):
        build_pipeline(pipeline, sources, models, slices, config, args.complete, args.per_query,
                       num_shards, folder, args.quiet, started, run_info, args.max_rejected_fraction)

    def summarize(metrics_path, counts):
        from pipelines.summary import retrieval_summary

        return retrieval_summary(metrics_path, counts)

    return run_job(TASK, args, models, slices, beam_args,
                   {"k": list(config.ks), "relevance_level": config.relevance_level,
                    "max_docs": config.max_docs_per_query, "complete": args.complete,
                    "per_query": args.per_query},
                   lambda name, source: check_source(name, source, slices), build, summarize,
                   started, min_shards=MIN_SHARDS,
                   outputs=("per_query.jsonl",) if args.per_query else (), known_formats=False)


def main() -> None:
    from pipelines.cli import quiet_logs

    quiet_logs()
    sys.exit(run())


if __name__ == "__main__":
    main()
