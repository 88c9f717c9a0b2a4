"""`evalbeam retrieval`: ranking metrics of retrieval runs against qrels, trec_eval compatible.

    evalbeam retrieval --groundtruths QRELS --predictions [NAME=]RUN ... --output DIR [options]
    python -m evalbeam.pipelines.retrieval ...   (same flags)

The task's declaration (pipelines/task.py); the launcher (pipelines/launcher.py) does the rest.
Reference: pipelines/retrieval.md.
"""

from __future__ import annotations

from evalbeam.pipelines.common import UsageError
from evalbeam.pipelines.task import TaskSpec
from evalbeam.transforms.kernels.retrieval import RetrievalConfig

TASK = "retrieval"
MIN_SHARDS = 8


def add_arguments(parser) -> None:
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


def configure(args) -> RetrievalConfig:
    try:
        ks = tuple(int(k) for k in args.k.split(",") if k.strip())
    except ValueError:
        raise UsageError(f"--k takes positive integers, not {args.k!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise UsageError("--k takes positive integers")
    if args.relevance_level < 0 or args.max_docs < 0:
        raise UsageError("--relevance_level and --max_docs must be 0 or more")
    return RetrievalConfig(ks=ks, relevance_level=args.relevance_level,
                           max_docs_per_query=args.max_docs or None, complete=args.complete,
                           per_query=args.per_query)


def check_source(name: str, source, config: RetrievalConfig, slices) -> None:
    """A file must look like its kind: qrels lines of 4 fields or JSONL judgments; run lines of
    at least 6 fields or JSONL scores (rows are checked one by one later). --slice needs JSONL
    qrels (their metadata). A file of another task's rows (JSONL or Parquet) is named with the
    command that reads it. Only the first non-blank line is read (through open_input, so a
    compressed file that breaks off there is an input error too)."""
    from evalbeam.schemas.retrieval_rows import format_of
    from evalbeam.schemas.safe_json import loads_row
    from evalbeam.transforms.io import InputError, head_lines, open_input, wrong_task_message

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
    from evalbeam.transforms.io import InputError, open_input, wrong_task_message

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


def options(config: RetrievalConfig, args) -> dict:
    return {"k": list(config.ks), "relevance_level": config.relevance_level,
            "max_docs": config.max_docs_per_query, "complete": config.complete,
            "per_query": config.per_query}


def summarize(metrics_path: str, info: dict, config: RetrievalConfig) -> str:
    from evalbeam.pipelines.summary import retrieval_summary

    return retrieval_summary(metrics_path, info["counts"])


def extra_outputs(config: RetrievalConfig) -> tuple:
    return ("per_query.jsonl",) if config.per_query else ()


SPEC = TaskSpec(
    name=TASK,
    summary="evaluate retrieval runs against relevance judgments (TREC qrels/run files or JSONL), "
            "with trec_eval's conventions",
    input_help="TREC qrels / run files, or .jsonl rows",
    add_arguments=add_arguments, configure=configure, options=options,
    check_source=check_source, transforms="evalbeam.transforms.retrieval", summarize=summarize,
    extra_outputs=extra_outputs, min_shards=MIN_SHARDS, known_formats=False,
    interval_unit="query")   # transforms.retrieval.INTERVAL_UNIT


run = SPEC.run

if __name__ == "__main__":
    SPEC.main()
