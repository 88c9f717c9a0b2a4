"""`evalbeam retrieval`: ranking metrics of retrieval runs against qrels, trec_eval compatible.

    evalbeam retrieval --groundtruths QRELS --predictions [NAME=]RUN ... --output DIR [options]
    python -m evalbeam.pipelines.tasks.retrieval ...   (same flags)

The task's declaration (pipelines/tasks/task.py); the launcher (pipelines/launch/launcher.py) does the rest.
Reference: pipelines/tasks/retrieval.md.
"""

from __future__ import annotations

from evalbeam.pipelines.launch.common import UsageError
from evalbeam.pipelines.tasks.summary import inputs_table, metric_records, text_table
from evalbeam.pipelines.tasks.task import Task
from evalbeam.transforms.kernels.retrieval import RetrievalConfig

NAME = "retrieval"
MIN_SHARDS = 8
# lines of a file's head that check_source may read to find a row (as transforms.io.preflight)
HEAD_LINES = 100


def _check_head(path: str, name: str, qrels: bool, jsonl: bool, stream) -> None:
    """Refuse a file that is not of its kind, judging its first HEAD_LINES non-blank lines.

    The file passes at the first line that is a row of its format: a JSON object with the
    kind's fields (JSONL; the values are checked later), or a line of the right field count
    (TREC). Lines before it are bad rows, rejected one by one when the file is read (a lone
    surrogate, JSON nested too deep or broken, a wrong field count), so they never refuse the
    file on their own. A JSON object of another task's fields, or (in a file not named .jsonl)
    a JSON object of retrieval's fields, refuses it as soon as it is seen: the file is of
    another task or format. So does a file none of whose first HEAD_LINES lines is a row, with
    what its first line is. One line is held at a time (a line may be 64 MiB long)."""
    from evalbeam.schemas.safe_json import MAX_ROW_BYTES, iter_lines, loads_row
    from evalbeam.transforms.io import InputError
    from evalbeam.transforms.preflight import wrong_task_message

    need = ("query_id", "doc_id", "relevance" if qrels else "score")
    seen, first = 0, None      # non-blank lines judged; why the first of them is not a row
    for _, line in iter_lines(stream, MAX_ROW_BYTES, chunk_size=1 << 20):
        if line is None or not line.strip():
            continue
        seen += 1
        row, problem = loads_row(line) if jsonl or line.lstrip().startswith(b"{") else (None, None)
        if isinstance(row, dict):
            other = wrong_task_message(path, name, row, NAME)
            if other:
                raise InputError(other)
        complete = isinstance(row, dict) and all(k in row for k in need)
        if jsonl:
            if complete:
                return
            why = problem or (f"a JSON object with the keys {sorted(row)[:8]}"
                              if isinstance(row, dict) else "not a JSON object")
        elif complete:
            raise InputError(f"{path} (given for {name}) holds JSON rows, but only names ending in "
                             ".jsonl, .ndjson or .json (optionally compressed, e.g. .jsonl.gz) are "
                             "read as JSONL; every other file is read as TREC text. Rename it.")
        else:
            fields = len(line.split())
            if (qrels and fields == 4) or (not qrels and fields >= 6):
                return
            why = f"a line of {fields} fields"
        first = first or why
        if seen == HEAD_LINES:
            break
    if not seen:
        raise InputError(f"{path} (given for {name}) holds no rows.")
    if jsonl:
        raise InputError(f"{path} (given for {name}) holds no {'qrels' if qrels else 'run'} rows: "
                         f"{_none_is(seen, f'a JSON object with {list(need)}', first)}; see "
                         "pipelines/tasks/retrieval.md for the formats.")
    what = "qrels lines 'query iter doc relevance'" if qrels else \
        "run lines 'query Q0 doc rank score tag'"
    fields = "4 fields" if qrels else "6 or more fields"
    raise InputError(f"{path} (given for {name}) holds no TREC {what}: "
                     f"{_none_is(seen, f'a line of {fields}', first)}; JSONL rows are read from "
                     "files named .jsonl.")


def _none_is(lines: int, row: str, first: str) -> str:
    """'none of its 3 non-blank lines is {row} (the first: {first})', for the message of a file
    without rows; first: what its first non-blank line is instead."""
    if lines == 1:
        return f"its only non-blank line is not {row} ({first})"
    return (f"none of its {'first ' if lines == HEAD_LINES else ''}{lines} non-blank lines is "
            f"{row} (the first: {first})")


def _check_parquet(name: str, path: str) -> None:
    """Retrieval reads no Parquet: name the command for another task's file, else say so."""
    from evalbeam.transforms.io import InputError, open_input
    from evalbeam.transforms.preflight import wrong_task_message

    try:
        import pyarrow.parquet as pq

        with open_input(path) as stream:
            columns = pq.ParquetFile(stream).schema_arrow.names
    except InputError:
        raise
    except Exception:
        columns = []
    other = wrong_task_message(path, name, columns, NAME) if columns else None
    raise InputError(other or f"{path} (given for {name}) is a Parquet file; evalbeam {NAME} reads "
                              "TREC qrels and run files, or JSONL rows (pipelines/tasks/retrieval.md).")


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
    inputs = inputs_table(counts)
    return f"\nRetrieval summary (trec_eval conventions)\n{text_table(['model', 'slice', *columns], rows)}\n\n{inputs}"


def retrieval_report_blocks(records, charts) -> list:
    """The report's tables and charts of one model and slice's records (Task.report_blocks)."""
    from evalbeam.pipelines.report.blocks import scalar_rows
    from evalbeam.pipelines.report.elements import table
    from evalbeam.pipelines.report import charts as report_charts

    rows = scalar_rows(records, {r["type"] for r in records}, lambda r: r["type"])
    at_k = []
    for r in records:
        k = (r.get("parameters") or {}).get("k")
        if k is not None and isinstance(r.get("value"), (int, float)):
            interval = r.get("interval") or {}
            at_k.append({"measure": r["type"], "k": int(k), "model": r.get("model") or "",
                         "value": float(r["value"]), "low": interval.get("low"), "high": interval.get("high")})
    blocks = [table("Measures", ["metric", "type", "parameters", "value", "interval"], rows)] if rows else []
    if at_k:
        blocks.append(charts.add(report_charts.at_k_lines(at_k, "Measures at each cut-off k")))
    return [b for b in blocks if b]


class RetrievalTask(Task):
    """`evalbeam retrieval`: the task's command-side declaration (pipelines/tasks/task.py)."""

    name = NAME
    summary = ("evaluate retrieval runs against relevance judgments (TREC qrels/run files or "
               "JSONL), with trec_eval's conventions")
    input_help = "TREC qrels / run files, or .jsonl rows"
    plumbing = "evalbeam.transforms.retrieval"
    min_shards = MIN_SHARDS
    known_formats = False
    report_blocks = staticmethod(retrieval_report_blocks)   # (records, charts) -> blocks
    headlines = ("NDCG[k=10]", "MAP", "MRR")

    def add_arguments(self, parser) -> None:
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

    def configure(self, args) -> RetrievalConfig:
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

    def options(self, config: RetrievalConfig, args) -> dict:
        return {"k": list(config.ks), "relevance_level": config.relevance_level,
                "max_docs": config.max_docs_per_query, "complete": config.complete,
                "per_query": config.per_query}

    def check_source(self, name: str, source, config: RetrievalConfig, slices) -> None:
        """A file must hold rows of its kind: TREC qrels lines of 4 fields or JSONL judgments, TREC
        run lines of at least 6 fields or JSONL scores. --slice needs JSONL qrels (their metadata).
        A file of another task's rows (JSONL or Parquet) is named with the command that reads it.
        The head of each file is read through open_input (a compressed file that breaks off there
        is an input error too) and judged by _check_head."""
        from evalbeam.schemas.retrieval_rows import format_of
        from evalbeam.transforms.io import InputError, open_input

        qrels = name == "groundtruths"
        for path in source.files:
            if slices and qrels and format_of(path) != "jsonl":
                raise InputError(f"--slice reads the \"metadata\" of JSONL qrels rows; {path} is a TREC "
                                 "qrels file, which has none.")
            if path.lower().endswith((".parquet", ".pq")):
                _check_parquet(name, path)
            try:
                with open_input(path) as stream:
                    _check_head(path, name, qrels, format_of(path) == "jsonl", stream)
            except InputError:
                raise
            except Exception as error:
                raise InputError(f"cannot read {path} (given for {name}): {error}") from None

    def extra_outputs(self, config: RetrievalConfig) -> tuple:
        return ("per_query.jsonl",) if config.per_query else ()

    def summarize(self, metrics_path: str, info: dict, config: RetrievalConfig) -> str:
        return retrieval_summary(metrics_path, info["counts"])


TASK = RetrievalTask()


run = TASK.run

if __name__ == "__main__":
    TASK.main()
