"""Retrieval metrics on Beam: read qrels and runs, evaluate per query shard, average exactly.

Each file is read whole into Arrow columns (schemas/retrieval_rows.py) and split by
FNV-1a(query_id) mod S, so a shard holds every judgment and every retrieved document of its
queries, from every file of every source. That is where a source's repeated (query, doc) pairs
are found and every copy rejected, so the rule does not depend on how a source is split into
files (or a file into blocks) or on the shard count. Per shard the numpy kernel
(transforms/kernels/retrieval.py) gives per-query values; their sums are kept exact
(transforms/kernels/exact_sum.py: integer mantissas per exponent) so the averages are identical
for any shard count. With --per_query the per-query values go to one sorted part file per shard,
merged into per_query.jsonl. Each shard also counts, per model, the run's queries that have
judgments (QueryCoverage), from which coverage_problems tells a run that the qrels do not judge.

Counts: the reader counts a file's rows read and the rows it rejects (unparsable lines, and the
qrels rows whose --slice metadata is not finite); the shard counts the rows it rejects as
duplicates and the rows it keeps (rows_evaluated), so every row read is counted once.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from evalbeam.schemas.retrieval_rows import (duplicate_groups, duplicate_reason, format_of, parse_qrels,
                                    parse_run, without_rows)
from evalbeam.schemas.rows import canonical_json, reject
from evalbeam.transforms.evaluated import Evaluated
from evalbeam.transforms.io import (TAG_REJECTED, TAG_STATS, MergeStates, ProgressDoFn, ReadFiles, join,
                           merge_sorted_parts, open_input)
from evalbeam.transforms.kernels.exact_sum import exact_totals, merge_totals, total_value
from evalbeam.schemas.hashing import fnv1a_64, shard_of
from evalbeam.transforms.kernels.retrieval import SUMMED, RetrievalConfig, encode_ids, evaluate

GROUNDTRUTHS = "groundtruths"
TAG_PER_QUERY = "per_query"
TAG_COVERAGE = "coverage"
EXAMPLES = 3   # query ids quoted in a coverage problem
PARTIAL = typing.Tuple[typing.Tuple[str, str], typing.Any]

# record type and parameters of each kernel measure family (trec_eval names)
FAMILIES = {"P": "Precision", "recall": "Recall", "F1": "F1", "success": "Hit", "map_cut": "MAP",
            "dcg_cut": "DCG", "ndcg_cut": "NDCG"}
SINGLE = {"recip_rank": "MRR", "map": "MAP", "Rprec": "RPrecision", "ndcg": "NDCG"}
RECORD_ORDER = ("Queries", "Precision", "Recall", "F1", "Hit", "MRR", "MAP", "RPrecision", "DCG", "NDCG")


def record_of(measure: str):
    """(record type, parameters) of a kernel measure name, or None for measures not reported."""
    if measure in SINGLE:
        return SINGLE[measure], {}
    family, _, k = measure.rpartition("_")
    if family in FAMILIES and k.isdigit():
        return FAMILIES[family], {"k": int(k)}
    return None


@dataclass
class RetrievalState:
    """Per (model, slice): the number of queries evaluated and the exact totals of each measure."""

    queries: int = 0
    totals: dict = field(default_factory=dict)

    def merge(self, other: "RetrievalState") -> "RetrievalState":
        self.queries += other.queries
        for name, total in other.totals.items():
            self.totals[name] = merge_totals(self.totals.get(name, {}), total)
        return self

    def copy(self) -> "RetrievalState":
        return RetrievalState(self.queries, {k: dict(v) for k, v in self.totals.items()})


@dataclass
class QueryCoverage:
    """Per model: how the queries of its run meet those of the qrels. Shards hold disjoint sets
    of queries, so the counts of all shards add up to the run's.

    run_queries: distinct queries of the run; judged: those that are also qrels queries (the
    queries trec_eval evaluates); qrels_queries: distinct queries of the qrels;
    unjudged_examples, qrels_examples: the byte-wise smallest few ids of the run's queries
    without judgments and of the qrels' queries (for the message)."""

    run_queries: int = 0
    judged: int = 0
    qrels_queries: int = 0
    unjudged_examples: tuple = ()
    qrels_examples: tuple = ()

    def merge(self, other: "QueryCoverage") -> "QueryCoverage":
        self.run_queries += other.run_queries
        self.judged += other.judged
        self.qrels_queries += other.qrels_queries
        self.unjudged_examples = tuple(sorted(set(self.unjudged_examples + other.unjudged_examples))[:EXAMPLES])
        self.qrels_examples = tuple(sorted(set(self.qrels_examples + other.qrels_examples))[:EXAMPLES])
        return self

    def copy(self) -> "QueryCoverage":
        return QueryCoverage(self.run_queries, self.judged, self.qrels_queries,
                             self.unjudged_examples, self.qrels_examples)


def coverage_of_codes(codes) -> QueryCoverage:
    """QueryCoverage of one shard from encode_ids' codes (query codes are dense and ordered like
    the ids, so the smallest codes are the smallest ids)."""
    n = len(codes.query_ids)
    in_run = np.bincount(codes.run_query, minlength=n) > 0
    in_qrels = np.bincount(codes.qrels_query, minlength=n) > 0

    def ids(mask):
        return tuple(codes.query_ids.take(pa.array(np.flatnonzero(mask)[:EXAMPLES], pa.int64())).to_pylist())

    return QueryCoverage(int(in_run.sum()), int((in_run & in_qrels).sum()), int(in_qrels.sum()),
                         ids(in_run & ~in_qrels), ids(in_qrels))


def coverage_of_unjudged(query: pa.ChunkedArray) -> QueryCoverage:
    """QueryCoverage of a run's rows in a shard that holds no judgment."""
    import pyarrow.compute as pc

    distinct = pc.unique(query)
    smallest = distinct.take(pc.sort_indices(distinct)[:EXAMPLES]).to_pylist()
    return QueryCoverage(len(distinct), 0, 0, tuple(smallest), ())


def coverage_problems(coverage: list, complete: bool) -> list[dict]:
    """Findings on the queries each model's run shares with the qrels, from (model,
    QueryCoverage) pairs (one per shard and model, merged here):
    - error `no_judged_queries`: none of the run's queries has a judgment (query ids written
      differently on the two sides, or the wrong qrels): every measure would be an average over
      no query (or, with --complete, 0 for every qrels query);
    - warning `unjudged_queries`: more than half of the run's queries have no judgment; they are
      left out as trec_eval leaves them out;
    - warning `unanswered_queries` (without --complete): the run answers fewer than half of the
      qrels' queries, and its averages are over the answered ones only.
    A model without rows is count_problems' (transforms/outputs.py) finding, not one of these."""
    from evalbeam.transforms.outputs import ERROR, WARNING, problem

    merged: dict = {}
    for model, part in coverage:
        merged[model] = part.copy() if model not in merged else merged[model].merge(part)
    out = []
    for model, c in sorted(merged.items()):
        if not c.run_queries:
            continue
        examples = ", ".join(repr(q) for q in c.unjudged_examples)
        if not c.judged:
            qrels = ", ".join(repr(q) for q in c.qrels_examples) or "none"
            result = ("every qrels query scores 0 (--complete)" if complete
                      else "every measure is an average over no query")
            out.append(problem(ERROR, "no_judged_queries",
                               f"model {model!r}: none of the {c.run_queries:,} queries of its run "
                               f"has a judgment in the qrels, so {result}. Its query ids ({examples}"
                               f"{', ...' if c.run_queries > EXAMPLES else ''}) and the qrels' "
                               f"({qrels}{', ...' if c.qrels_queries > EXAMPLES else ''}) are "
                               "probably written differently, or the qrels are not this run's."))
            continue
        unjudged = c.run_queries - c.judged
        if 2 * unjudged > c.run_queries:
            out.append(problem(WARNING, "unjudged_queries",
                               f"model {model!r}: {unjudged:,} of the {c.run_queries:,} queries of "
                               f"its run have no judgment in the qrels (e.g. {examples}) and are left "
                               f"out, as trec_eval leaves them out; {c.judged:,} were evaluated."))
        if not complete and 2 * c.judged < c.qrels_queries:
            out.append(problem(WARNING, "unanswered_queries",
                               f"model {model!r} answers {c.judged:,} of the {c.qrels_queries:,} "
                               "queries of the qrels; its averages are over those only (pass "
                               "--complete to count each unanswered query as 0, as trec_eval -c)."))
    return out


def _split_by_query(columns, num_shards: int):
    """{shard: row indices} of columns: FNV-1a of the query id, mod num_shards. Rows of a query
    repeat its id (100 documents a query in a run), so the distinct ids are hashed and looked up."""
    if not len(columns):
        return {}
    import pyarrow.compute as pc

    distinct = pc.unique(columns.query)
    index = pc.index_in(columns.query, value_set=distinct)
    index = np.concatenate([c.to_numpy(zero_copy_only=False) for c in index.chunks]) \
        if isinstance(index, pa.ChunkedArray) else index.to_numpy(zero_copy_only=False)
    shards = shard_of(fnv1a_64(distinct), num_shards)[index]
    # small integers: numpy's stable sort is a radix sort for 16-bit keys
    order = np.argsort(shards.astype(np.uint16 if num_shards < 1 << 16 else np.int64), kind="stable")
    bounds = np.searchsorted(shards[order], np.arange(num_shards + 1))
    return {s: order[bounds[s]:bounds[s + 1]] for s in range(num_shards) if bounds[s + 1] > bounds[s]}


def _take(columns, index: np.ndarray):
    index_array = pa.array(index, pa.int64())
    return type(columns)(columns.query.take(index_array), columns.doc.take(index_array),
                         (columns.relevance if hasattr(columns, "relevance") else columns.score)[index],
                         columns.line[index])


def write_piece(columns, path: str) -> None:
    """Columns as one Arrow IPC stream (query, doc, value, line) at path, through FileSystems."""
    value = columns.relevance if hasattr(columns, "relevance") else columns.score
    table = pa.table({"query": columns.query, "doc": columns.doc, "value": value, "line": columns.line})
    with FileSystems.create(path) as out:
        with pa.ipc.new_stream(out, table.schema) as writer:
            writer.write_table(table)


def read_piece(path: str, qrels: bool):
    """The columns write_piece wrote (QrelsColumns when qrels, else RunColumns)."""
    from evalbeam.schemas.retrieval_rows import QrelsColumns, RunColumns

    with FileSystems.open(path) as stream:
        table = pa.ipc.open_stream(stream).read_all()
    kind = QrelsColumns if qrels else RunColumns
    return kind(table["query"], table["doc"], table["value"].to_numpy(), table["line"].to_numpy())


class ReadRetrievalFile(ProgressDoFn):
    """(source, file id) -> (shard, (source, file id, columns)) pieces; rejects and stats
    tagged. With pieces_dir, each piece is written there as an Arrow IPC stream and only its path
    travels (hundreds of MB of ids need not pass through the runner's data plane).
    excluded: {qrels file id: {line: reason}}, qrels rows rejected for their --slice metadata
    (see pipelines/retrieval.py read_slices). Repeated (query, doc) pairs are left to the shard."""

    def __init__(self, sources, num_shards: int, quiet: bool, started: float,
                 pieces_dir: str | None = None, excluded: dict | None = None):
        super().__init__(quiet, started)
        self.sources = sources
        self.num_shards = num_shards
        self.pieces_dir = pieces_dir
        self.excluded = excluded or {}

    def process(self, element):
        name, file_id = element
        path = self.sources[name].files[file_id]
        # open_input: a truncated or corrupt compressed file raises ReadError (an input error)
        # instead of reading as a shorter file.
        with open_input(path) as stream:
            data = stream.read()
        parse = parse_qrels if name == GROUNDTRUTHS else parse_run
        columns, rejects = parse(data, format_of(path))
        del data
        excluded = self.excluded.get(file_id) if name == GROUNDTRUTHS else None
        if excluded:
            drop = np.flatnonzero(np.isin(columns.line, np.fromiter(excluded, np.int64)))
            rejects = sorted(rejects + [(int(line), excluded[int(line)]) for line in columns.line[drop]])
            columns = without_rows(columns, drop)
        for line, reason in rejects:
            yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(name, path, int(line), reason))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", name), len(columns) + len(rejects)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", name), len(rejects)))
        for shard, index in _split_by_query(columns, self.num_shards).items():
            piece = _take(columns, index)
            if self.pieces_dir is not None:
                piece_path = join(self.pieces_dir, f"{shard:05d}-{name}-{file_id}.arrow")
                write_piece(piece, piece_path)
                piece = piece_path
            yield shard, (name, file_id, piece)
        self.progress.say(path, f"read {len(columns) + len(rejects):,} rows of {path}", force=True)


def _concat(pieces):
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    value = "relevance" if hasattr(first, "relevance") else "score"
    return type(first)(pa.chunked_array([c for p in pieces for c in p.query.chunks], first.query.type),
                       pa.chunked_array([c for p in pieces for c in p.doc.chunks], first.doc.type),
                       np.concatenate([getattr(p, value) for p in pieces]),
                       np.concatenate([p.line for p in pieces]))


def unique_pairs(source: str, files: tuple, parts: list):
    """One source's rows in a shard, from [(file id, columns)] sorted by file id, without every
    row of a (query, doc) pair that occurs more than once (each copy becomes a reject record
    naming its file and line, and the reason lists every copy). Returns (columns, rejects)."""
    columns = _concat([c for _, c in parts])
    file_id = np.repeat(np.array([f for f, _ in parts], np.int64), [len(c) for _, c in parts])
    groups = duplicate_groups(columns.query, columns.doc)
    rejects = []
    for rows in groups:
        first = pa.array(rows[:1])
        paths = [files[f] for f in file_id[rows]]
        lines = columns.line[rows].tolist()
        reason = duplicate_reason(columns.query.take(first)[0].as_py(), columns.doc.take(first)[0].as_py(),
                                  lines, paths)
        rejects += [reject(source, path, line, reason) for path, line in zip(paths, lines)]
    dropped = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    return without_rows(columns, dropped), rejects


class EvaluateShard(ProgressDoFn):
    """(shard, pieces) -> ((model, slice JSON), RetrievalState); tagged: rejects and stats (the
    shard's duplicates, its rows kept), (model, QueryCoverage) (TAG_COVERAGE), and per-query rows
    to per_query_dir/part-<shard>.jsonl (TAG_PER_QUERY: (path, rows)) when per_query_dir is set."""

    def __init__(self, sources, models, config: RetrievalConfig, complete: bool, slices: dict | None,
                 per_query_dir: str | None, quiet: bool, started: float):
        super().__init__(quiet, started)
        self.sources = sources
        self.models = models
        self.config = config
        self.complete = complete
        self.slices = slices or {}
        self.per_query_dir = per_query_dir

    def process(self, element):
        shard, pieces = element
        by_source: dict = {}
        # Pieces arrive in any order; sorted by file they make the same columns every time.
        for source, file_id, columns in sorted(pieces, key=lambda piece: (piece[0], piece[1])):
            if isinstance(columns, str):      # a piece spilled to an Arrow IPC file
                columns = read_piece(columns, source == GROUNDTRUTHS)
            by_source.setdefault(source, []).append((file_id, columns))
        unique = {}
        for source, parts in sorted(by_source.items()):
            columns, rejects = unique_pairs(source, self.sources[source].files, parts)
            for record in rejects:
                yield beam.pvalue.TaggedOutput(TAG_REJECTED, record)
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", source), len(rejects)))
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", source), len(columns)))
            unique[source] = columns
        qrels = unique.get(GROUNDTRUTHS)
        if qrels is None or not len(qrels):
            # Nothing to evaluate here; the runs' queries are still counted as unjudged.
            for model in self.models:
                if model in unique and len(unique[model]):
                    yield beam.pvalue.TaggedOutput(
                        TAG_COVERAGE, (model, coverage_of_unjudged(unique[model].query)))
            return
        rows = []
        for model in self.models:
            run = unique.get(model)
            empty = pa.chunked_array([], pa.string())
            codes = encode_ids(qrels.query, qrels.doc, run.query if run else empty, run.doc if run else empty)
            yield beam.pvalue.TaggedOutput(TAG_COVERAGE, (model, coverage_of_codes(codes)))
            query_codes, values = evaluate(codes.qrels_query, codes.qrels_doc, qrels.relevance,
                                           codes.run_query, codes.run_doc,
                                           run.score if run else np.zeros(0), self.config, self.complete)
            query_ids = codes.query_ids.take(pa.array(query_codes, pa.int64())).to_pylist()
            groups = self._groups(query_ids)
            for slice_json, index in groups.items():
                state = RetrievalState(int(index.size), {name: exact_totals(column[index])
                                                         for name, column in values.items()})
                yield (model, slice_json), state
            if self.per_query_dir is not None:
                names = sorted(values)
                for i, qid in enumerate(query_ids):
                    rows.append((json.dumps(qid, ensure_ascii=False), model,
                                 {n: float(values[n][i]) for n in names}))
        if self.per_query_dir is not None:
            rows.sort(key=lambda r: (r[0], r[1]))
            path = join(self.per_query_dir, f"part-{shard:05d}.jsonl")
            with FileSystems.create(path) as out:
                out.write("".join(f'{{"query_id": {q}, "model": {json.dumps(m)}, "measures": '
                                  f'{json.dumps(v)}}}\n' for q, m, v in rows).encode("utf-8"))
            yield beam.pvalue.TaggedOutput(TAG_PER_QUERY, (path, len(rows)))
        self.progress.say("evaluate", f"evaluated shard {shard}")

    def _groups(self, query_ids: list) -> dict:
        """{slice JSON: positions}: every query in "{}", and per --slice combination."""
        groups = {"{}": np.arange(len(query_ids))}
        for spec, per_query in self.slices.items():
            combos: dict = {}
            for i, qid in enumerate(query_ids):
                values = per_query.get(qid)
                if values is not None:
                    combos.setdefault(values, []).append(i)
            for values, index in combos.items():
                key = canonical_json({k: json.loads(v) for k, v in zip(spec, values)})
                groups[key] = np.array(index, dtype=np.int64)
        return groups


def records(element, config: RetrievalConfig, complete: bool):
    """Averages (sums for counts) of the reported measures, as trec_eval's `all` line."""
    (model, slice_json), state = element
    base = {"model": model, "slice": json.loads(slice_json)}
    settings = {"relevance_level": config.relevance_level, "max_docs": config.max_docs_per_query,
                "complete": complete}
    yield {"type": "Queries", "value": state.queries, "parameters": settings, **base}
    for name in sorted(state.totals):
        found = record_of(name)
        if found is None:
            continue
        kind, parameters = found
        total = total_value(state.totals[name])
        value = total if name in SUMMED else (total / state.queries if state.queries else 0.0)
        yield {"type": kind, "value": value, "parameters": parameters, **base}


def record_sort_key(record: dict):
    params = record["parameters"]
    return (record["model"], len(record["slice"]), json.dumps(record["slice"], sort_keys=True),
            RECORD_ORDER.index(record["type"]), params.get("k", 0))


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
    from evalbeam.schemas.retrieval_rows import MAX_ROW_BYTES, json_row
    from evalbeam.schemas.rows import canonical_json
    from evalbeam.schemas.safe_json import iter_lines, slice_value_problem
    from evalbeam.transforms.io import open_input

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


class EvaluateRetrievalFiles(beam.PTransform):
    """Qrels and run files (job.sources) -> Evaluated (transforms.evaluated). Its problems are
    the findings on the queries the runs share with the qrels (coverage_problems); with
    config.per_query, per_query.jsonl is written to job.temp("per_query.jsonl"). The --slice
    values of each query are read from the qrels first (read_slices), while the graph is built."""

    def __init__(self, config: RetrievalConfig, job):
        super().__init__()
        self.slices, self.excluded = read_slices(job.sources, list(job.slices))
        self.pieces_dir = job.temp("pieces")
        self.sources = job.sources
        self.models = list(job.models)
        self.config = config
        self.complete = config.complete
        self.num_shards = job.num_shards
        self.per_query_dir = job.temp("per-query-parts") if config.per_query else None
        self.per_query_path = job.temp("per_query.jsonl")
        self.quiet = job.quiet
        self.started = job.started

    def expand(self, pbegin):
        read = pbegin | "ReadFiles" >> ReadFiles(
            self.sources, ReadRetrievalFile(self.sources, self.num_shards, self.quiet, self.started,
                                            self.pieces_dir, self.excluded),
            (TAG_REJECTED, TAG_STATS))
        evaluated = (read.pieces
                     | "GroupByShard" >> beam.GroupByKey()
                     | "Evaluate" >> beam.ParDo(EvaluateShard(
                         self.sources, self.models, self.config, self.complete, self.slices,
                         self.per_query_dir, self.quiet, self.started))
                     .with_output_types(PARTIAL)
                     .with_outputs(TAG_PER_QUERY, TAG_REJECTED, TAG_STATS, TAG_COVERAGE, main="partials"))
        metrics = (evaluated.partials
                   | "Combine" >> beam.CombinePerKey(MergeStates())
                   | "Records" >> beam.FlatMap(records, self.config, self.complete))
        rejects = (read[TAG_REJECTED], evaluated[TAG_REJECTED]) | "AllRejects" >> beam.Flatten()
        stats = (read[TAG_STATS], evaluated[TAG_STATS]) | "AllStats" >> beam.Flatten()
        problems = (evaluated[TAG_COVERAGE]
                    | "GatherCoverage" >> beam.combiners.ToList()
                    | "CoverageProblems" >> beam.FlatMap(coverage_problems, self.complete))
        extra = {}
        if self.per_query_dir is not None:
            extra["per_query.jsonl"] = (
                evaluated[TAG_PER_QUERY]
                | "GatherParts" >> beam.combiners.ToList()
                | "MergePerQuery" >> beam.Map(merge_sorted_parts, self.per_query_path, "query_id"))
        return Evaluated(metrics, rejects, stats, problems, extra)
