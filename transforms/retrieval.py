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
qrels rows whose --slice metadata cannot name a slice: not finite, or too long); the shard
counts the rows it rejects as duplicates and the rows it keeps (rows_evaluated), so every row
read is counted once.

Intervals (--bootstrap R): each shard also weighs its queries' values by their Poisson bootstrap
weights (kernels.bootstrap, keyed by FNV-1a of the query id) and keeps the R weighted sums exactly
beside the point sums (kernels.retrieval.weighted_totals); the records carry the replicate means,
and transforms.uncertainty turns them into intervals (pipelines/tasks/retrieval.md, Intervals).

The same job on a user's PCollections of row dicts (EvaluateRetrieval): RetrievalRowsFromDicts
checks the rows as JSONL rows are checked and cuts them into the same pieces, which then go
through the same MatchRetrieval, MergeStates and records_of.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa

from evalbeam.schemas.hashing import fnv1a_64, shard_of
from evalbeam.schemas.rejections import reject
from evalbeam.schemas.retrieval_rows import (QrelsColumns, RunColumns, dict_row_problem,
                                             duplicate_groups, duplicate_reason,
                                             duplicate_rows_reason, format_of, parse_qrels,
                                             parse_run, slice_values, without_rows)
from evalbeam.schemas.slices import canonical_json
from evalbeam.transforms.graph import (TAG_PRESENCE, EvaluateFiles, EvaluateRows, MatchContext,
                                       TaskGraph)
from evalbeam.transforms.io import (GROUNDTRUTHS, TAG_REJECTED, TAG_STATS, ProgressDoFn,
                                    created_whole, join, line_splittable, merge_sorted_parts,
                                    open_input, open_span, span_of, span_text)
from evalbeam.transforms.kernels.retrieval import (RetrievalConfig, RetrievalState, encode_ids,
                                                   evaluate, state_records)

TAG_PER_QUERY = "per_query"
TAG_COVERAGE = "coverage"
# what one bootstrap weight is drawn for, as the intervals name it (its Task's interval_unit)
INTERVAL_UNIT = "query"
EXAMPLES = 3   # query ids quoted in a coverage problem

# every record type, in the order of metrics.jsonl
RECORD_ORDER = ("Queries", "Precision", "Recall", "F1", "Hit", "MRR", "MAP", "RPrecision", "DCG", "NDCG")


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


class ReadRetrievalFile(ProgressDoFn):
    """(source, file id) -> (shard, (source, file id, columns, None)) pieces; rejects and stats
    excluded: {qrels file id: {line: reason}}, qrels rows rejected for their --slice metadata
    (see read_slices). Repeated (query, doc) pairs are left to the shard."""

    def __init__(self, sources, num_shards: int, quiet: bool, started: float,
                 excluded: dict | None = None):
        super().__init__(quiet, started)
        self.sources = sources
        self.num_shards = num_shards
        self.excluded = excluded or {}

    def splits(self, path: str) -> bool:
        """Whether ReadFiles may hand this reader byte spans of the file."""
        return line_splittable(path)

    def process(self, element):
        name, file_id, start, end, first_line = span_of(element)
        path = self.sources[name].files[file_id]
        # open_input (through open_span): a truncated or corrupt compressed file raises
        # ReadError (an input error) instead of reading as a shorter file.
        with open_span(path, start, end) as stream:
            data = stream.read()
        parse = parse_qrels if name == GROUNDTRUTHS else parse_run
        columns, rejects = parse(data, format_of(path), first_line, start)
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
            yield shard, (name, file_id, _take(columns, index), None)
        self.progress.say(path, f"read {len(columns) + len(rejects):,} rows of {path}"
                                f"{span_text(start, end)}", force=True)


class RetrievalRowsFromDicts(beam.DoFn):
    """(source, [row dict, ...]) batches -> (shard, (source, 0, columns, slice values)) pieces,
    like ReadRetrievalFile for files; rejects and stats tagged. Rows are checked as JSONL rows are
    (schemas/retrieval_rows.py dict_row_problem); with slice_keys, a qrels row whose metadata
    cannot name a slice is rejected too (slice_values), and each qrels piece carries, per row,
    the canonical JSON of its metadata values for slice_keys (None for a row without a metadata
    object): MatchRetrieval takes each query's slice values from them. Runs' pieces carry None.
    A rejected row has no file or line: the source name is its file, its "row" is None."""

    def __init__(self, slice_keys: list[str], num_shards: int):
        self.slice_keys = list(slice_keys)
        self.num_shards = num_shards

    def process(self, element):
        source, batch = element
        qrels = source == GROUNDTRUTHS
        kind, value_name = ("qrels", "relevance") if qrels else ("run", "score")
        sliced = qrels and bool(self.slice_keys)
        queries, docs, values, row_slices, rejected = [], [], [], [], 0
        for row in batch:
            problem = dict_row_problem(row, kind)
            values_of_row = None
            if problem is None and sliced:
                values_of_row, problem = slice_values(row, self.slice_keys)
            if problem:
                rejected += 1
                yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(source, source, None, problem,
                                                                    position_name="row"))
                continue
            queries.append(row["query_id"])
            docs.append(row["doc_id"])
            values.append(row[value_name])
            row_slices.append(values_of_row)
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", source), len(batch)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", source), rejected))
        kind_of = QrelsColumns if qrels else RunColumns
        columns = kind_of(pa.chunked_array([pa.array(queries, pa.string())]),
                          pa.chunked_array([pa.array(docs, pa.string())]),
                          np.array(values, np.int64 if qrels else np.float64),
                          np.zeros(len(queries), np.int64))
        for shard, index in _split_by_query(columns, self.num_shards).items():
            piece_slices = [row_slices[i] for i in index.tolist()] if sliced else None
            yield shard, (source, 0, _take(columns, index), piece_slices)


def _concat(pieces):
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0]
    value = "relevance" if hasattr(first, "relevance") else "score"
    return type(first)(pa.chunked_array([c for p in pieces for c in p.query.chunks], first.query.type),
                       pa.chunked_array([c for p in pieces for c in p.doc.chunks], first.doc.type),
                       np.concatenate([getattr(p, value) for p in pieces]),
                       np.concatenate([p.line for p in pieces]))


def _piece_order(piece) -> tuple:
    source, file_id, columns, _ = piece
    return source, file_id, int(columns.line[0]) if len(columns) else 0


def unique_pairs(source: str, files: tuple | None, parts: list):
    """One source's rows in a shard, from [(file id, columns)] sorted by file id, without every
    row of a (query, doc) pair that occurs more than once (each copy becomes a reject record
    naming its file and line, and the reason lists every copy; files None: rows of a user's
    PCollection, which have neither). Returns (columns, rejects)."""
    columns = _concat([c for _, c in parts])
    file_id = np.repeat(np.array([f for f, _ in parts], np.int64), [len(c) for _, c in parts])
    groups = duplicate_groups(columns.query, columns.doc)
    rejects = []
    for rows in groups:
        first = pa.array(rows[:1])
        query, doc = columns.query.take(first)[0].as_py(), columns.doc.take(first)[0].as_py()
        if files is None:
            reason = duplicate_rows_reason(query, doc, len(rows), source)
            rejects += [reject(source, source, None, reason, position_name="row") for _ in rows]
            continue
        paths = [files[f] for f in file_id[rows]]
        lines = columns.line[rows].tolist()
        reason = duplicate_reason(query, doc, lines, paths)
        rejects += [reject(source, path, line, reason) for path, line in zip(paths, lines)]
    dropped = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    return without_rows(columns, dropped), rejects


class MatchRetrieval(ProgressDoFn):
    """(shard, pieces) -> ((model, slice JSON), RetrievalState); tagged: rejects and stats (the
    shard's duplicates, its rows kept), (model, QueryCoverage) (TAG_COVERAGE), and per-query rows
    to per_query_dir/part-<shard>.jsonl (TAG_PER_QUERY: (path, rows)) when per_query_dir is set.

    context (transforms.graph.MatchContext): files, {source: its file paths} (rejects name
    them; {} for rows of a user's PCollections); read, (query slices, queries left out)
    (read_slices), or None. Query slices: {slice spec: {query id: canonical JSON values}}, read
    from the qrels files before the run, or None: then, with slice_specs, each query takes the values
    of its qrels rows in the shard (RetrievalRowsFromDicts' pieces carry them per row): rows of a
    PCollection have no order, so of a query's rows with a metadata object the one whose values
    (canonical JSON, over the sorted slice keys) sort first gives them.

    context.bootstrap (kernels.bootstrap.Bootstrap, or None): the states also carry
    the replicates' weighted sums, each query weighed by Bootstrap.weights of the FNV-1a hash of
    its query id. context.presence (with or without bootstrap): tagged TAG_PRESENCE, per slice, (slice JSON,
    ("groundtruths", uint64 hashes of the qrels' queries)) and (slice JSON, (model, hashes of
    those queries that the model's run answers))."""

    def __init__(self, config: RetrievalConfig, context: MatchContext):
        super().__init__(context.quiet, context.started)
        self.files = context.files
        self.models = list(context.models)
        self.config = config
        self.query_slices = context.read[0] if context.read is not None else None
        self.slice_specs = [tuple(spec) for spec in context.slices]
        self.per_query_dir = per_query_dir(config, context)
        self.bootstrap = context.bootstrap
        self.presence = context.presence

    def process(self, element):
        shard, pieces = element
        by_source: dict = {}
        row_slices = []
        # Pieces arrive in any order; sorted by file and line (a file read in byte spans gives
        # several pieces) they make the same columns every time.
        for source, file_id, columns, piece_slices in sorted(pieces, key=_piece_order):
            by_source.setdefault(source, []).append((file_id, columns))
            if piece_slices is not None:
                row_slices.append((columns.query.to_pylist(), piece_slices))
        query_slices = self.query_slices
        if query_slices is None:
            query_slices = self._slices_of_rows(row_slices)
        unique = {}
        for source, parts in sorted(by_source.items()):
            columns, rejects = unique_pairs(source, self.files.get(source), parts)
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
        if self.presence:
            yield from self._qrels_presence(qrels, query_slices or {})
        for model in self.models:
            run = unique.get(model)
            empty = pa.chunked_array([], pa.string())
            codes = encode_ids(qrels.query, qrels.doc, run.query if run else empty, run.doc if run else empty)
            yield beam.pvalue.TaggedOutput(TAG_COVERAGE, (model, coverage_of_codes(codes)))
            query_codes, values = evaluate(codes.qrels_query, codes.qrels_doc, qrels.relevance,
                                           codes.run_query, codes.run_doc,
                                           run.score if run else np.zeros(0), self.config)
            query_array = codes.query_ids.take(pa.array(query_codes, pa.int64()))
            query_ids = query_array.to_pylist()
            groups = self._groups(query_ids, query_slices or {})
            weights = hashes = None
            if self.bootstrap is not None or self.presence:
                hashes = fnv1a_64(query_array)
            if self.bootstrap is not None:
                weights = self.bootstrap.weights(hashes)
            for slice_json, index in groups.items():
                yield (model, slice_json), RetrievalState().add_queries(values, index, weights)
            if self.presence:
                answered = (np.bincount(codes.run_query, minlength=len(codes.query_ids)) > 0)[query_codes]
                for slice_json, index in groups.items():
                    yield beam.pvalue.TaggedOutput(
                        TAG_PRESENCE, (slice_json, (model, hashes[index[answered[index]]])))
            if self.per_query_dir is not None:
                names = sorted(values)
                for i, qid in enumerate(query_ids):
                    rows.append((json.dumps(qid, ensure_ascii=False), model,
                                 {n: float(values[n][i]) for n in names}))
        if self.per_query_dir is not None:
            rows.sort(key=lambda r: (r[0], r[1]))
            path = join(self.per_query_dir, f"part-{shard:05d}.jsonl")
            with created_whole(path) as out:
                out.write("".join(f'{{"query_id": {q}, "model": {json.dumps(m)}, "measures": '
                                  f'{json.dumps(v)}}}\n' for q, m, v in rows).encode("utf-8"))
            yield beam.pvalue.TaggedOutput(TAG_PER_QUERY, (path, len(rows)))
        self.progress.say("evaluate", f"evaluated shard {shard}")

    def _qrels_presence(self, qrels, query_slices: dict):
        """TAG_PRESENCE of the shard's qrels queries, per slice (the datums of a comparison)."""
        import pyarrow.compute as pc

        distinct = pc.unique(qrels.query)
        distinct = distinct.combine_chunks() if isinstance(distinct, pa.ChunkedArray) else distinct
        hashes = fnv1a_64(distinct)
        for slice_json, index in self._groups(distinct.to_pylist(), query_slices).items():
            yield beam.pvalue.TaggedOutput(TAG_PRESENCE, (slice_json, (GROUNDTRUTHS, hashes[index])))

    def _slices_of_rows(self, row_slices: list) -> dict:
        """query_slices from the qrels pieces' per-row values [(query ids, values per row)]."""
        first: dict = {}
        for queries, values in row_slices:
            for query, row_values in zip(queries, values):
                if row_values is not None and (query not in first or row_values < first[query]):
                    first[query] = row_values
        return per_spec(first, self.slice_specs)

    @staticmethod
    def _groups(query_ids: list, query_slices: dict) -> dict:
        """{slice JSON: positions}: every query in "{}", and per --slice combination."""
        groups = {"{}": np.arange(len(query_ids))}
        for spec, per_query in query_slices.items():
            combos: dict = {}
            for i, qid in enumerate(query_ids):
                values = per_query.get(qid)
                if values is not None:
                    combos.setdefault(values, []).append(i)
            for values, index in combos.items():
                key = canonical_json({k: json.loads(v) for k, v in zip(spec, values)})
                groups[key] = np.array(index, dtype=np.int64)
        return groups


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
    is NaN or infinite (no JSON output can name that slice) or longer than MAX_SLICE_CHARS
    characters as JSON (every record of the slice would carry it) is listed with the reason and
    rejected by the pipeline's reader, so its judgment is not used either; the query's values
    then come from its next row. Lines are read one at a time, at most MAX_ROW_BYTES each."""
    if not slices:
        return None, {}
    from evalbeam.schemas.retrieval_rows import MAX_ROW_BYTES, json_row
    from evalbeam.schemas.safe_json import iter_lines

    keys = sorted({key for spec in slices for key in spec})
    per_query: dict = {}
    excluded: dict = {}
    for file_id, path in enumerate(sources["groundtruths"].files):
        with open_input(path) as stream:
            for number, raw in iter_lines(stream, MAX_ROW_BYTES):
                if raw is None or not raw.strip():
                    continue
                row, problem = json_row(raw, "qrels")
                if problem:
                    continue
                values, reason = slice_values(row, keys)
                if reason:
                    excluded.setdefault(file_id, {})[number] = reason
                elif values is not None:
                    per_query.setdefault(row["query_id"], values)
    return per_spec(per_query, slices), excluded


def per_spec(per_query: dict, slices) -> dict:
    """{spec: {query id: values of the spec's keys}} from {query id: values of every slice key,
    sorted (schemas/retrieval_rows.py slice_values)}."""
    keys = sorted({key for spec in slices for key in spec})
    return {tuple(spec): {q: tuple(values[keys.index(k)] for k in spec) for q, values in per_query.items()}
            for spec in slices}


class RetrievalGraph(TaskGraph):
    """Retrieval in the one graph (transforms/graph.py). Before the graph is built, the --slice
    values of each query are read from the qrels (read_slices; context.read holds them and the
    queries left out). The matcher's own outputs: the coverage of the queries the runs share
    with the qrels (TAG_COVERAGE), the run's problems (coverage_problems), and with
    config.per_query the per-query part files (TAG_PER_QUERY) merged into per_query.jsonl. With
    a bootstrap, the measure records carry their replicates (the Hit records their proportions).
    Users' pipelines get neither the coverage findings nor per_query.jsonl; their rows have no
    order, so when a query's qrels rows disagree on their metadata, the values that sort first
    (as canonical JSON) name its slices, where the command takes its first row's."""

    name = "retrieval"
    match_tags = (TAG_PER_QUERY, TAG_COVERAGE)
    interval_unit = INTERVAL_UNIT
    record_order = RECORD_ORDER
    state_records = staticmethod(state_records)

    def prepare(self, config, context, sources):
        if sources is not None:
            context = context._replace(read=read_slices(sources, list(context.slices)))
        return config, context

    def file_reader(self, config, context, sources):
        return ReadRetrievalFile(sources, context.num_shards, context.quiet, context.started,
                                 excluded=context.read[1])

    def rows_reader(self, config, context):
        return RetrievalRowsFromDicts(context.slice_keys, context.num_shards)

    def matcher(self, config, context):
        return MatchRetrieval(config, context)

    def problems(self, stages, config, context):
        return (stages.matched[TAG_COVERAGE]
                | "GatherCoverage" >> beam.combiners.ToList()
                | "CoverageProblems" >> beam.FlatMap(coverage_problems, config.complete))

    def extra_outputs(self, stages, config, context):
        if per_query_dir(config, context) is None:
            return {}
        return {"per_query.jsonl": (
            stages.matched[TAG_PER_QUERY]
            | "GatherParts" >> beam.combiners.ToList()
            | "MergePerQuery" >> beam.Map(merge_sorted_parts, context.temp("per_query.jsonl"),
                                          "query_id"))}

    record_sort_key = staticmethod(record_sort_key)


def per_query_dir(config: RetrievalConfig, context) -> str | None:
    """Where the matcher writes its per-query part files: with config.per_query, on the command
    line (context.temp); None otherwise."""
    return context.temp("per-query-parts") if config.per_query and context.temp else None


class EvaluateRetrievalFiles(EvaluateFiles):
    """Qrels and run files (job.sources) -> Evaluated (transforms/graph.py, RetrievalGraph)."""

    graph = RetrievalGraph()


class EvaluateRetrieval(EvaluateRows):
    """Retrieval metrics for a user's own pipeline (transforms.graph.EvaluateRows). Rows as the
    JSONL format's: {"groundtruths": qrels rows {"query_id", "doc_id", "relevance",
    "metadata"?}, "<model name>": run rows {"query_id", "doc_id", "score"}}. Not computed here:
    the coverage findings and per_query.jsonl (config.per_query is ignored); see RetrievalGraph
    for the slices of a query whose rows disagree."""

    graph = RetrievalGraph()
    default_config = RetrievalConfig
