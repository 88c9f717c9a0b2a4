"""Retrieval metrics on Beam: read qrels and runs, evaluate per query shard, average exactly.

Each file is read whole into Arrow columns (schemas/retrieval_rows.py) and split by
FNV-1a(query_id) mod S, so a shard holds every judgment and every retrieved document of its
queries. Per shard the numpy kernel (transforms/kernels/retrieval.py) gives per-query values;
their sums are kept exact (transforms/kernels/exact_sum.py: integer mantissas per exponent) so
the averages are identical for any shard count. With --per_query the per-query values go to one
sorted part file per shard, merged into per_query.jsonl.
"""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from schemas.retrieval_rows import format_of, read_qrels, read_run
from schemas.rows import canonical_json, reject
from transforms.io import TAG_REJECTED, TAG_STATS, MergeStates, ProgressDoFn, ReadFiles, join
from transforms.kernels.exact_sum import exact_totals, merge_totals, total_value
from transforms.kernels.hashing import fnv1a_64, shard_of
from transforms.kernels.retrieval import SUMMED, RetrievalConfig, encode_ids, evaluate

GROUNDTRUTHS = "groundtruths"
TAG_PER_QUERY = "per_query"
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
    from schemas.retrieval_rows import QrelsColumns, RunColumns

    with FileSystems.open(path) as stream:
        table = pa.ipc.open_stream(stream).read_all()
    kind = QrelsColumns if qrels else RunColumns
    return kind(table["query"], table["doc"], table["value"].to_numpy(), table["line"].to_numpy())


class ReadRetrievalFile(ProgressDoFn):
    """(source, file id) -> (shard, (source, columns)) pieces; rejects and stats tagged. With
    pieces_dir, each piece is written there as an Arrow IPC stream and only its path travels
    (hundreds of MB of ids need not pass through the runner's data plane)."""

    def __init__(self, sources, num_shards: int, quiet: bool, started: float,
                 pieces_dir: str | None = None):
        super().__init__(quiet, started)
        self.sources = sources
        self.num_shards = num_shards
        self.pieces_dir = pieces_dir

    def process(self, element):
        name, file_id = element
        path = self.sources[name].files[file_id]
        with FileSystems.open(path) as stream:
            data = stream.read()
        reader = read_qrels if name == GROUNDTRUTHS else read_run
        columns, rejects = reader(data, format_of(path))
        del data
        for line, reason in rejects:
            yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(name, path, int(line), reason))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", name), len(columns) + len(rejects)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", name), len(rejects)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", name), len(columns)))
        for shard, index in _split_by_query(columns, self.num_shards).items():
            piece = _take(columns, index)
            if self.pieces_dir is not None:
                path = join(self.pieces_dir, f"{shard:05d}-{name}-{file_id}.arrow")
                write_piece(piece, path)
                piece = path
            yield shard, (name, piece)
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


class EvaluateShard(ProgressDoFn):
    """(shard, pieces) -> ((model, slice JSON), RetrievalState); per-query rows to
    per_query_dir/part-<shard>.jsonl (TAG_PER_QUERY: (path, rows)) when per_query_dir is set."""

    def __init__(self, models, config: RetrievalConfig, complete: bool, slices: dict | None,
                 per_query_dir: str | None, quiet: bool, started: float):
        super().__init__(quiet, started)
        self.models = models
        self.config = config
        self.complete = complete
        self.slices = slices or {}
        self.per_query_dir = per_query_dir

    def process(self, element):
        shard, pieces = element
        by_source: dict = {}
        for source, columns in pieces:
            if isinstance(columns, str):      # a piece spilled to an Arrow IPC file
                columns = read_piece(columns, source == GROUNDTRUTHS)
            by_source.setdefault(source, []).append(columns)
        qrels = by_source.get(GROUNDTRUTHS)
        if not qrels:
            return
        qrels = _concat(qrels)
        rows = []
        for model in self.models:
            runs = by_source.get(model)
            run = _concat(runs) if runs else None
            empty = pa.chunked_array([], pa.string())
            codes = encode_ids(qrels.query, qrels.doc, run.query if run else empty, run.doc if run else empty)
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


class EvaluateRetrievalFiles(beam.PTransform):
    """Qrels and run files (Sources) -> (records, per-query parts, rejects, stats)."""

    def __init__(self, sources, models, config: RetrievalConfig, complete: bool, slices: dict | None,
                 num_shards: int, per_query_dir: str | None, quiet: bool, started: float,
                 pieces_dir: str | None = None):
        super().__init__()
        self.pieces_dir = pieces_dir
        self.sources = sources
        self.models = models
        self.config = config
        self.complete = complete
        self.slices = slices
        self.num_shards = num_shards
        self.per_query_dir = per_query_dir
        self.quiet = quiet
        self.started = started

    def expand(self, pbegin):
        read = pbegin | "ReadFiles" >> ReadFiles(
            self.sources, ReadRetrievalFile(self.sources, self.num_shards, self.quiet, self.started,
                                            self.pieces_dir),
            (TAG_REJECTED, TAG_STATS))
        evaluated = (read.pieces
                     | "GroupByShard" >> beam.GroupByKey()
                     | "Evaluate" >> beam.ParDo(EvaluateShard(
                         self.models, self.config, self.complete, self.slices, self.per_query_dir,
                         self.quiet, self.started))
                     .with_output_types(PARTIAL).with_outputs(TAG_PER_QUERY, main="partials"))
        metrics = (evaluated.partials
                   | "Combine" >> beam.CombinePerKey(MergeStates())
                   | "Records" >> beam.FlatMap(records, self.config, self.complete))
        return metrics, evaluated[TAG_PER_QUERY], read[TAG_REJECTED], read[TAG_STATS]
