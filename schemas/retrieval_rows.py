"""Retrieval inputs: qrels and runs (TREC text or JSONL bytes) read into columns.

TREC qrels: `query iter doc relevance`, exactly 4 whitespace-separated fields; iter is ignored,
relevance an integer (negative allowed: trec_eval reads it as "judged, not usable").
TREC run: `query Q0 doc rank score tag`, at least 6 fields; Q0, rank and tag are ignored, and
fields after the 6th are ignored too, as trec_eval does (its own test run has such lines).
Fields are separated by any run of ASCII whitespace (space, tab, CR, VT, FF); blank lines are
skipped.
JSONL qrels: {"query_id": str, "doc_id": str, "relevance": int, "metadata"?: object};
JSONL run: {"query_id": str, "doc_id": str, "score": number}. Other keys are ignored.
Row dicts of a user's PCollection (transforms.retrieval.EvaluateRetrieval) are the JSONL rows,
parsed: dict_row_problem checks them as JSONL lines are checked, slice_values reads their
--slice values.

Columns: ids are Arrow string columns (pa.ChunkedArray of pa.string(), one chunk or more per
block read: 10 M ids stay in a few buffers where a numpy object array would hold 10 M Python
objects); relevance int64, score float64, line int64 (the 1-based line of each row). Use
transforms.kernels.retrieval.encode_ids to turn the ids into the kernel's codes.

Rejects: [(line, reason)] sorted by line, for lines that are not rows: wrong field count,
relevance not an integer (or out of int64), score not a number or not finite, id not UTF-8 or
empty (JSONL), a query id longer than MAX_UID_CHARS characters (schemas/limits.py: outputs write
it per query; document ids are not bounded, as no output repeats them), and for JSONL lines:
malformed JSON, JSON nested deeper than MAX_NESTING levels, a lone UTF-16 surrogate anywhere in
the row, a line past byte 0 of its file that starts with a UTF-8 byte order mark
(schemas/safe_json.py), a line longer than MAX_ROW_BYTES. A bad line never stops the read.

Duplicates: a (query, doc) pair may occur once per source (the qrels, or one model's run);
every copy of a repeated pair is rejected (trec_eval would stop on them; keeping one would be
arbitrary). That is a property of the whole source, whatever files it is split into, so
parse_qrels/parse_run (one file, as the pipeline reads it) leave it to the caller: the pipeline
checks it per query shard, where every row of a query meets (transforms/retrieval.py), with
duplicate_groups and duplicate_reason. read_qrels/read_run read one file that is a whole source
and reject its duplicates themselves.

Speed: a file is read in blocks of whole lines. A block whose fields are separated by single
spaces (or single tabs), the common case, is parsed by Arrow's multi-threaded CSV reader; a
JSONL block by Arrow's JSON reader. Any block that path cannot take exactly (other whitespace,
a parse error, an empty field, a non-finite score, a missing key, ...) is parsed again line by
line in Python, which is the reference behaviour: the fast path only ever accepts blocks on
which it agrees with the slow one. A JSONL block with an escaped UTF-16 surrogate, a line of
more than MAX_NESTING opening brackets or a line that starts with a byte order mark never reaches
Arrow's parser (it would accept the first, may overflow its stack on the second and drops the
mark of the third when the line starts one of its inner blocks). The fast paths reject a query id
too long themselves, as the slow ones do. Duplicates are found with one 64-bit hash per row,
sorted, and confirmed by comparing the strings of the few rows whose hashes collide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from evalbeam.schemas.limits import MAX_UID_CHARS, uid_length_problem
from evalbeam.schemas.safe_json import (BOM, MAX_NESTING, MAX_ROW_BYTES, SURROGATE_ESCAPE,
                                         lone_surrogate, loads_row, slice_value_problem,
                                         surrogate_reason)
from evalbeam.schemas.slices import canonical_json

FORMATS = ("trec", "jsonl")
# Ids are read as 8-byte words (below) up to this many words (256 bytes): a longer id costs every
# row of its array that many words, so beyond it the pair hash reads only the first words and the
# kernel's codes come from Arrow's string sort (transforms/kernels/retrieval.py sorted_codes).
MAX_ID_WORDS = 32
BLOCK_BYTES = 64 << 20
_INT64 = (-(1 << 63), (1 << 63) - 1)
QRELS_TREC_FIELDS = ("query", "iter", "doc", "relevance")
RUN_TREC_FIELDS = ("query", "q0", "doc", "rank", "score", "tag")
MAX_LINES_LISTED = 10


@dataclass
class QrelsColumns:
    """n judgments: query, doc (Arrow string chunked arrays), relevance int64[n], line int64[n]
    (1-based)."""

    query: pa.ChunkedArray
    doc: pa.ChunkedArray
    relevance: np.ndarray
    line: np.ndarray

    def __len__(self) -> int:
        return int(self.line.size)


@dataclass
class RunColumns:
    """n retrieved docs: query, doc (Arrow string chunked arrays), score float64[n] (finite),
    line int64[n] (1-based)."""

    query: pa.ChunkedArray
    doc: pa.ChunkedArray
    score: np.ndarray
    line: np.ndarray

    def __len__(self) -> int:
        return int(self.line.size)


COMPRESSED = (".gz", ".bz2", ".xz", ".lzma", ".deflate")


def format_of(path: str) -> str:
    """"jsonl" for .jsonl/.ndjson/.json names, also compressed (run.jsonl.gz), else "trec"
    (TREC files rarely have a suffix)."""
    name = path.lower()
    for suffix in COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return "jsonl" if name.endswith((".jsonl", ".ndjson", ".json")) else "trec"


def parse_qrels(data: bytes, fmt: str, first_line: int = 1, start: int = 0,
                ) -> tuple[QrelsColumns, list[tuple[int, str]]]:
    """Qrels columns and rejects of one file's bytes (or str); fmt "trec" or "jsonl"; first_line:
    the number of the bytes' first line, start: the byte of the file where they start (a span
    of a file; only at start 0 is a byte order mark dropped). Repeated (query, doc) pairs are
    kept: see duplicate_groups."""
    blocks = _read(data, fmt, "qrels", first_line, start)
    return QrelsColumns(*_concat(blocks, np.int64)), sorted(r for b in blocks for r in b[4])


def parse_run(data: bytes, fmt: str, first_line: int = 1, start: int = 0,
                ) -> tuple[RunColumns, list[tuple[int, str]]]:
    """Run columns and rejects of one file's bytes (or str); fmt "trec" or "jsonl"; first_line
    and start: as for parse_qrels. Repeated (query, doc) pairs are kept: see duplicate_groups."""
    blocks = _read(data, fmt, "run", first_line, start)
    return RunColumns(*_concat(blocks, np.float64)), sorted(r for b in blocks for r in b[4])


def read_qrels(data: bytes, fmt: str) -> tuple[QrelsColumns, list[tuple[int, str]]]:
    """parse_qrels of a file that holds a whole qrels, without every repeated (query, doc) pair
    (each copy rejected)."""
    columns, rejects = parse_qrels(data, fmt)
    columns, duplicates = _drop_duplicates(columns)
    return columns, sorted(rejects + duplicates)


def read_run(data: bytes, fmt: str) -> tuple[RunColumns, list[tuple[int, str]]]:
    """parse_run of a file that holds a whole run, without every repeated (query, doc) pair
    (each copy rejected)."""
    columns, rejects = parse_run(data, fmt)
    columns, duplicates = _drop_duplicates(columns)
    return columns, sorted(rejects + duplicates)


# A parsed block: (query, doc, value, line, rejects).
_Block = tuple


def _read(data: bytes, fmt: str, kind: str, first_line: int = 1, offset: int = 0) -> list[_Block]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if isinstance(data, str):
        data = data.encode("utf-8")
    data = bytes(data)
    # A UTF-8 byte order mark is dropped at byte 0 of a file, and only there: whether it is must
    # not depend on the other lines of the block (Arrow's readers drop one at the start of any
    # buffer, the line-by-line TREC reader keeps it in the query id) nor on where the file is
    # split into spans (only the span at byte 0 holds it).
    if offset == 0 and data.startswith(BOM):
        data = data[len(BOM):]
    fast, slow = ((_trec_fast, _trec_slow) if fmt == "trec" else (_jsonl_fast, _jsonl_slow))
    blocks = []
    line = first_line      # a span of a file starts at its own line (transforms/line_spans.py)
    start = 0
    while start < len(data):
        end = data.find(b"\n", min(start + BLOCK_BYTES, len(data)) - 1)
        end = len(data) if end < 0 else end + 1
        parsed = fast(data, start, end, line, kind)
        if parsed is not None and fmt == "trec":
            line += int(parsed[3].size)  # one row per line, or the fast path would have failed
        else:
            if parsed is None:
                parsed = slow(data[start:end], line, kind)
            line += data.count(b"\n", start, end)
        blocks.append(parsed)
        start = end
    return blocks


def _concat(blocks: list[_Block], value_type) -> tuple:
    def strings(i):
        chunks = [c for b in blocks for c in (b[i].chunks if isinstance(b[i], pa.ChunkedArray) else [b[i]])]
        return pa.chunked_array([c for c in chunks if len(c)], pa.string())

    value = np.concatenate([np.asarray(b[2], value_type) for b in blocks] + [np.zeros(0, value_type)])
    line = np.concatenate([np.asarray(b[3], np.int64) for b in blocks] + [np.zeros(0, np.int64)])
    return strings(0), strings(1), value, line


# ---------------------------------------------------------------------------------------------
# TREC

def _trec_fast(data: bytes, start: int, end: int, first_line: int, kind: str) -> _Block | None:
    """Arrow's CSV reader on data[start:end] when one byte separates the fields; None when
    that could differ from the line-by-line reader."""
    if data.startswith(BOM, start):
        return None  # Arrow would drop it; past byte 0 of a file it is part of the query id
    if data.find(b"\x0b", start, end) >= 0 or data.find(b"\x0c", start, end) >= 0:
        return None
    if data.find(b"\r", start, end) >= 0 and data.count(b"\r", start, end) != data.count(b"\r\n", start, end):
        return None  # a lone CR separates fields for trec_eval but ends a row for Arrow
    if data.find(b"\t", start, end) < 0:
        delimiter = " "
    elif data.find(b" ", start, end) < 0:
        delimiter = "\t"
    else:
        return None
    names = QRELS_TREC_FIELDS if kind == "qrels" else RUN_TREC_FIELDS
    value_name, value_type = ("relevance", pa.int64()) if kind == "qrels" else ("score", pa.float64())
    types = {name: pa.string() for name in names}
    types[value_name] = value_type
    try:
        table = pacsv.read_csv(
            pa.py_buffer(memoryview(data)[start:end]),
            read_options=pacsv.ReadOptions(column_names=list(names), block_size=4 << 20),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, quote_char=False,
                                             escape_char=False, double_quote=False,
                                             newlines_in_values=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(column_types=types, null_values=[],
                                                 strings_can_be_null=False,
                                                 quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None  # wrong field count, blank line, bad number, invalid UTF-8, ...
    # Two separators in a row make an empty field (a space-separated line with a double space),
    # which the line-by-line reader would not see as a field at all.
    if any(_has_empty(table.column(name)) for name in names if name != value_name):
        return None
    value = _numbers(table.column(value_name), np.int64 if kind == "qrels" else np.float64)
    if kind == "run" and not np.isfinite(value).all():
        return None
    line = np.arange(first_line, first_line + table.num_rows, dtype=np.int64)
    return _without_long_queries(table.column("query"), table.column("doc"), value, line,
                                 "query id")


def _trec_slow(block: bytes, first_line: int, kind: str) -> _Block:
    """The reference reader: one line at a time, whitespace-separated fields."""
    wanted = 4 if kind == "qrels" else 6
    queries, docs, values, lines, rejects = [], [], [], [], []
    for number, raw in enumerate(block.split(b"\n"), start=first_line):
        fields = raw.split()
        if not fields:
            continue
        if len(fields) != wanted and (kind == "qrels" or len(fields) < wanted):
            rejects.append((number, _field_count_reason(kind, len(fields))))
            continue
        try:
            query, doc = fields[0].decode("utf-8"), fields[2].decode("utf-8")
        except UnicodeDecodeError:
            rejects.append((number, "query or doc id is not valid UTF-8"))
            continue
        problem = uid_length_problem("query id", len(query))
        if problem:
            rejects.append((number, problem))
            continue
        if kind == "qrels":
            value, problem = _parse_relevance(fields[3])
        else:
            value, problem = _parse_score(fields[4])
        if problem:
            rejects.append((number, problem))
            continue
        queries.append(query)
        docs.append(doc)
        values.append(value)
        lines.append(number)
    return (pa.array(queries, pa.string()), pa.array(docs, pa.string()), values,
            np.array(lines, np.int64), rejects)


def _field_count_reason(kind: str, found: int) -> str:
    if kind == "qrels":
        return f"expected 4 fields (query iter doc relevance), found {found}"
    return f"expected at least 6 fields (query Q0 doc rank score tag), found {found}"


def _parse_relevance(token: bytes) -> tuple[int | None, str | None]:
    try:
        # int() would accept "1_0"; neither trec_eval nor Arrow does.
        value = int(token) if b"_" not in token else None
    except ValueError:
        value = None
    if value is None:
        return None, f"relevance {token.decode('utf-8', 'replace')!r} is not an integer"
    if not _INT64[0] <= value <= _INT64[1]:
        return None, f"relevance {token.decode('utf-8', 'replace')!r} is out of range"
    return value, None


def _parse_score(token: bytes) -> tuple[float | None, str | None]:
    try:
        value = float(token) if b"_" not in token else None
    except ValueError:
        value = None
    if value is None:
        return None, f"score {token.decode('utf-8', 'replace')!r} is not a number"
    if not math.isfinite(value):
        return None, f"score {value!r} is not finite"
    return value, None


def _numbers(column: pa.ChunkedArray, dtype) -> np.ndarray:
    """The values of a numeric column without nulls. Read from the Arrow buffers: to_numpy()
    imports pandas on first use, a quarter second."""
    parts = [np.frombuffer(c.buffers()[1], dtype)[c.offset: c.offset + len(c)]
             for c in column.chunks if len(c)]
    return np.concatenate(parts + [np.zeros(0, dtype)])


def _has_empty(column: pa.ChunkedArray) -> bool:
    """Whether any string of the column is "" (two offsets in a row are equal)."""
    for chunk in column.chunks:
        _, offsets_buf, _ = chunk.buffers()
        offset_type = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
        offsets = np.frombuffer(offsets_buf, offset_type)[chunk.offset: chunk.offset + len(chunk) + 1]
        if np.any(offsets[1:] == offsets[:-1]):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# JSONL

_WHITESPACE = np.frombuffer(b" \t\r\n\x0b\x0c", np.uint8)
_JSON_VALUE = {"qrels": ("relevance", pa.int64()), "run": ("score", pa.float64())}


def _jsonl_fast(data: bytes, start: int, end: int, first_line: int, kind: str) -> _Block | None:
    """Arrow's JSON reader on data[start:end] (whole lines), or None when that could differ from
    the line-by-line reader (_jsonl_slow)."""
    value_name, value_type = _JSON_VALUE[kind]
    schema = pa.schema([("query_id", pa.string()), ("doc_id", pa.string()), (value_name, value_type)])
    if data.startswith(BOM, start) or data.find(b"\n" + BOM, start, end) >= 0:
        # Arrow's reader drops a BOM at the start of its buffer and of its own inner blocks;
        # past byte 0 of a file (dropped by _read) a line that starts with one is a bad row
        return None
    block = memoryview(data)[start:end]
    # A surrogate escape may be a lone one, which Arrow would accept (the row must be rejected);
    # a backslash is rare in ids, so the pattern is looked for only when there is one.
    if data.find(b"\\", start, end) >= 0 and SURROGATE_ESCAPE.search(data, start, end):
        return None
    buf = np.frombuffer(block, np.uint8)
    newlines = np.flatnonzero(buf == ord("\n"))
    if _bracket_heavy(buf, newlines, data.find(b"[", start, end) >= 0):
        return None
    lines = _nonblank_lines(buf, newlines, first_line)
    try:
        table = pajson.read_json(
            pa.BufferReader(pa.py_buffer(block)),
            read_options=pajson.ReadOptions(use_threads=True, block_size=4 << 20),
            parse_options=pajson.ParseOptions(explicit_schema=schema,
                                              unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != lines.size:
        return None
    if any(table.column(name).null_count for name in schema.names):
        return None
    if _has_empty(table.column("query_id")) or _has_empty(table.column("doc_id")):
        return None
    value = _numbers(table.column(value_name), np.int64 if kind == "qrels" else np.float64)
    if kind == "run" and not np.isfinite(value).all():
        return None
    return _without_long_queries(table.column("query_id"), table.column("doc_id"), value, lines,
                                 "query_id")


def _without_long_queries(query: pa.ChunkedArray, doc: pa.ChunkedArray, value: np.ndarray,
                          line: np.ndarray, what: str) -> _Block:
    """A block of the fast paths without its rows whose query id is longer than MAX_UID_CHARS
    characters, each rejected as the line-by-line readers reject it (what: the id's name in the
    reason). Every other row of such a block is valid (or the fast path would have given up), so
    both readers agree. Byte lengths (from the offsets) rule out the usual block at once; the
    characters are counted only when an id has more bytes than the bound has characters."""
    if string_lengths(query)[1] <= MAX_UID_CHARS:
        return query, doc, value, line, []
    length = np.concatenate([np.asarray(c, np.int64) for c in pc.utf8_length(query).chunks]
                            + [np.zeros(0, np.int64)])
    long = length > MAX_UID_CHARS
    rejects = [(int(line[i]), uid_length_problem(what, int(length[i])))
               for i in np.flatnonzero(long).tolist()]
    keep = pa.array(~long)
    return query.filter(keep), doc.filter(keep), value[~long], line[~long], rejects


def _bracket_heavy(buf: np.ndarray, newlines: np.ndarray, squares: bool) -> bool:
    """Whether a line of a block (uint8 bytes, "\\n" at positions newlines) holds more than
    MAX_NESTING opening brackets, the least a line nested deeper than that needs; squares: the
    block holds a "[" (else only "{" is counted, one pass fewer). Such a block goes to the
    line-by-line reader, which rejects a line that really is that deep without parsing it."""
    is_open = buf == ord("{")
    if squares:
        is_open |= buf == ord("[")
    opens = np.flatnonzero(is_open)
    if opens.size <= MAX_NESTING:
        return False
    # Line of each opening bracket (ascending): a line with more than MAX_NESTING of them has
    # the same line at positions i and i + MAX_NESTING.
    line_of = np.searchsorted(newlines, opens)
    return bool(np.any(line_of[MAX_NESTING:] == line_of[:-MAX_NESTING]))


def _nonblank_lines(buf: np.ndarray, newlines: np.ndarray, first_line: int) -> np.ndarray:
    """1-based numbers of the lines of a block (uint8 bytes, "\\n" at positions newlines) that
    hold a non-whitespace byte."""
    ends = newlines
    if buf.size and buf[-1] != ord("\n"):
        ends = np.r_[ends, buf.size]
    starts = np.r_[0, ends[:-1] + 1]
    # A line whose first byte is not whitespace is not blank: one look per line decides the
    # usual case instead of a scan of every byte.
    first = buf[np.minimum(starts, max(buf.size - 1, 0))] if buf.size else np.zeros(0, np.uint8)
    if not np.isin(first, _WHITESPACE).any() and not (starts == ends).any():
        return first_line + np.arange(ends.size, dtype=np.int64)
    solid = np.r_[0, np.cumsum(~np.isin(buf, _WHITESPACE))]
    per_line = solid[ends] - solid[starts]
    return first_line + np.flatnonzero(per_line > 0).astype(np.int64)


def _jsonl_slow(block: bytes, first_line: int, kind: str) -> _Block:
    value_name = _JSON_VALUE[kind][0]
    queries, docs, values, lines, rejects = [], [], [], [], []
    for number, raw in enumerate(block.split(b"\n"), start=first_line):
        if not raw.strip():
            continue
        row, problem = json_row(raw, kind)
        if problem:
            rejects.append((number, problem))
            continue
        queries.append(row["query_id"])
        docs.append(row["doc_id"])
        values.append(row[value_name])
        lines.append(number)
    return (pa.array(queries, pa.string()), pa.array(docs, pa.string()), values,
            np.array(lines, np.int64), rejects)


def json_row(raw: bytes, kind: str) -> tuple[dict | None, str | None]:
    """(row, None) for a JSONL line that is a valid qrels (kind "qrels") or run ("run") row, else
    (None, reason). The line is parsed by safe_json.loads_row: too long, too deeply nested, not
    JSON or holding a lone surrogate is a reason, never an exception."""
    if len(raw) > MAX_ROW_BYTES:
        return None, f"line longer than {MAX_ROW_BYTES:,} bytes"
    row, problem = loads_row(raw)
    if problem is None:
        problem = _json_row_problem(row, kind, _JSON_VALUE[kind][0])
    return (None, problem) if problem else (row, None)


def dict_row_problem(row, kind: str) -> str | None:
    """Why a row dict of a user's PCollection is not a valid qrels (kind "qrels") or run ("run")
    row, or None: the checks json_row makes on a parsed JSONL line (a lone surrogate anywhere in
    the row, then the fields). A Python int too large for a float is out of range, not an error."""
    value_name = _JSON_VALUE[kind][0]
    where = lone_surrogate(row) if isinstance(row, dict) else None
    if where is not None:
        return surrogate_reason(where)
    try:
        return _json_row_problem(row, kind, value_name)
    except OverflowError:
        return f"{value_name} is out of range"


def slice_values(row: dict, keys: list[str]) -> tuple[tuple | None, str | None]:
    """The --slice values a valid qrels row gives its query: (canonical JSON of metadata[key] for
    each key, None) when the row's "metadata" is an object, (None, None) when it is not (the row
    gives none), and (None, reason) when a value cannot name a slice (the row is rejected): NaN
    or infinite, longer than MAX_SLICE_CHARS characters as JSON (schemas/limits.py), as
    read_slices (transforms/retrieval.py) finds in JSONL files, or not JSON."""
    metadata = row.get("metadata")
    if not isinstance(metadata, dict):
        return None, None
    reason = next(filter(None, (slice_value_problem(k, metadata.get(k)) for k in keys)), None)
    if reason:
        return None, reason
    values = []
    for key in keys:
        try:
            values.append(canonical_json(metadata.get(key)))
        except (TypeError, ValueError, RecursionError) as error:
            return None, f"metadata {key!r} cannot be written as JSON: {type(error).__name__}"
    return tuple(values), None


def _json_row_problem(row, kind: str, value_name: str) -> str | None:
    if not isinstance(row, dict):
        return "row must be a JSON object"
    for key in ("query_id", "doc_id"):
        if key not in row or row[key] is None:
            return f"missing {key}"
        if not isinstance(row[key], str):
            return f"{key} must be a string, got {type(row[key]).__name__}"
        if not row[key]:
            return f"empty {key}"
        try:
            row[key].encode("utf-8")
        except UnicodeEncodeError:
            return f"{key} is not valid UTF-8"
        if key == "query_id" and len(row[key]) > MAX_UID_CHARS:
            return uid_length_problem(key, len(row[key]))
    value = row.get(value_name)
    if value is None:
        return f"missing {value_name}"
    if kind == "qrels":
        if not isinstance(value, int) or isinstance(value, bool):
            return f"relevance {value!r} is not an integer"
        if not _INT64[0] <= value <= _INT64[1]:
            return f"relevance {value!r} is out of range"
    else:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return f"score {value!r} is not a number"
        value = float(value)
        if not math.isfinite(value):
            return f"score {value!r} is not finite"
    return None


# ---------------------------------------------------------------------------------------------
# Arrow strings as 8-byte words: the pair hash below, and the kernel's id codes
# (transforms/kernels/retrieval.py encode_ids), read ids this way.

def as_strings(values) -> pa.Array | pa.ChunkedArray:
    """Arrow strings (string or large_string, chunked or not) from Arrow arrays, numpy arrays or
    lists; Arrow input is returned as it is."""
    if not isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = pa.array(values if isinstance(values, list) else np.asarray(values, dtype=object),
                          pa.string())
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise TypeError(f"expected strings, got {values.type}")
    return values


def string_lengths(strings) -> tuple[int, int]:
    """(shortest, longest) byte length, (0, 0) when empty."""
    shortest, longest = None, 0
    for chunk in string_chunks(as_strings(strings)):
        lengths = np.diff(string_layout(chunk)[0])
        low = int(lengths.min())
        shortest = low if shortest is None else min(shortest, low)
        longest = max(longest, int(lengths.max()))
    return shortest or 0, longest


def string_width(strings, skip: int = 0) -> int:
    """Words needed by the longest string after skip bytes (at least 1)."""
    return max(1, -(-(string_lengths(strings)[1] - skip) // 8))


def iter_string_words(strings, width: int, skip: int = 0, rows: int = 1 << 16):
    """Each string as `width` big-endian 8-byte words (skip: bytes left out at the start of
    every string; bytes past a string's end are 0), so that comparing word tuples compares the
    bytes; a slice of rows at a time, to use the words without holding all of them. Yields (lo,
    hi, words of rows lo..hi-1, their lengths after skip, whether they hold a 0 byte)."""
    lo = 0
    for chunk in string_chunks(as_strings(strings)):
        offsets, data = string_layout(chunk)
        if data.size < 8:
            data = np.r_[data, np.zeros(8, np.uint8)]
        # One unaligned big-endian word starting at every byte of the buffer, read without a
        # copy. The few reads that would pass the end of the buffer come from a padded copy.
        at_byte = np.ndarray(shape=(data.size - 7,), dtype=">u8", buffer=data, strides=(1,))
        tail_from = data.size - 8
        tail = np.r_[data[tail_from:], np.zeros(8 * width, np.uint8)]
        at_tail = np.ndarray(shape=(tail.size - 7,), dtype=">u8", buffer=tail, strides=(1,))
        for first in range(0, offsets.size - 1, rows):
            bounds = offsets[first: first + rows + 1]
            used = data[int(bounds[0]):int(bounds[-1])]
            lengths = np.diff(bounds).astype(np.int64) - skip
            position = bounds[:-1].astype(np.int64) + skip
            words = []
            for j in range(width):
                past_end = position > tail_from
                if past_end.any():
                    word = at_byte[np.where(past_end, 0, position)].astype(np.uint64)
                    word[past_end] = at_tail[position[past_end] - tail_from]
                else:
                    word = at_byte[position].astype(np.uint64)
                remaining = lengths - 8 * j
                if not (remaining >= 8).all():
                    # Keep the word's first `remaining` bytes: numpy shifts uint64 by 64 to 0.
                    shift = (64 - 8 * np.clip(remaining, 0, 8)).astype(np.uint64)
                    word >>= shift
                    word <<= shift
                words.append(word)
                position += 8
            yield lo, lo + lengths.size, words, lengths, bool(used.size and not used.all())
            lo += lengths.size


def string_chunks(strings) -> list[pa.Array]:
    """The non-empty chunks of Arrow strings (chunked or not)."""
    chunks = strings.chunks if isinstance(strings, pa.ChunkedArray) else [strings]
    return [c for c in chunks if len(c)]


def string_layout(chunk: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data bytes) of an Arrow string array, as numpy views."""
    _, offsets_buf, data_buf = chunk.buffers()
    offset_type = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
    offsets = np.frombuffer(offsets_buf, offset_type)[chunk.offset: chunk.offset + len(chunk) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


# ---------------------------------------------------------------------------------------------
# Duplicates

_PRIME = np.uint64(0x100000001B3)


def _pair_hash(query, doc) -> np.ndarray:
    """A uint64 per row, equal for equal (query, doc) pairs. Collisions are possible (rows are
    compared as strings afterwards), so a cheap polynomial over the 8-byte words is enough: over
    the first MAX_ID_WORDS words and the length, so that one very long id costs no more words per
    row (ids alike in their first 256 bytes and their length meet in the exact comparison)."""
    hashed = np.empty(len(query), dtype=np.uint64)
    hashed.fill(0xCBF29CE484222325)
    for strings in (query, doc):
        width = min(string_width(strings), MAX_ID_WORDS)
        for lo, hi, words, lengths, _ in iter_string_words(strings, width):
            part = hashed[lo:hi]
            for word in words + [lengths.astype(np.uint64)]:
                part *= _PRIME
                part ^= word
    return hashed


def duplicate_groups(query, doc) -> list[np.ndarray]:
    """The rows of each (query, doc) pair that occurs more than once: one ascending int64 array
    of row indices per repeated pair, pairs in the order of their first row. query, doc: Arrow
    string arrays of equal length. Cost: one hash per row and a sort; strings are compared only
    for the rows whose hash repeats."""
    n = len(query)
    if n < 2:
        return []
    hashed = _pair_hash(query, doc)
    ordered = np.sort(hashed)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if not repeated.size:
        return []
    # Rows whose hash is a repeated one: a bit table on the low 20 bits finds them in one
    # gather, and the few false hits are dropped by the exact test.
    table = np.zeros(1 << 20, bool)
    table[repeated & np.uint64((1 << 20) - 1)] = True
    candidates = np.flatnonzero(table[hashed & np.uint64((1 << 20) - 1)])
    candidates = candidates[np.isin(hashed[candidates], repeated)]
    at = pa.array(candidates)
    groups: dict[tuple[str, str], list[int]] = {}
    for row, pair in zip(candidates.tolist(), zip(query.take(at).to_pylist(), doc.take(at).to_pylist())):
        groups.setdefault(pair, []).append(row)
    return [np.array(rows, np.int64) for rows in groups.values() if len(rows) > 1]


def duplicate_reason(query: str, doc: str, lines, files=None) -> str:
    """The reason written for every copy of a repeated pair. lines: the copies' line numbers;
    files: the file of each copy, or None when they are all in one (the rejected row names its
    file). Copies are listed in the order given, at most MAX_LINES_LISTED of them."""
    if files is None or len(set(files)) == 1:
        where, places = "on lines", [str(line) for line in lines]
    else:
        where, places = "at", [f"{file}:{line}" for file, line in zip(files, lines)]
    listed = ", ".join(places[:MAX_LINES_LISTED])
    if len(places) > MAX_LINES_LISTED:
        listed += f", ... ({len(places)} copies)"
    return f"duplicate (query, doc) pair ({query!r}, {doc!r}) {where} {listed}"


def duplicate_rows_reason(query: str, doc: str, copies: int, source: str) -> str:
    """The reason written for every copy of a pair repeated in the rows of a user's PCollection
    (rows there have no file or line)."""
    return f"duplicate (query, doc) pair ({query!r}, {doc!r}): {copies} rows of {source}"


def without_rows(columns, rows: np.ndarray):
    """The columns (QrelsColumns or RunColumns) without the rows at the given indices."""
    if not len(rows):
        return columns
    keep = np.ones(len(columns), bool)
    keep[rows] = False
    mask = pa.array(keep)
    value = columns.relevance if isinstance(columns, QrelsColumns) else columns.score
    return type(columns)(columns.query.filter(mask), columns.doc.filter(mask), value[keep],
                         columns.line[keep])


def _drop_duplicates(columns):
    """The columns of one file without every row whose (query, doc) pair occurs more than once,
    and one (line, reason) reject per dropped row."""
    groups = duplicate_groups(columns.query, columns.doc)
    rejects = []
    for rows in groups:
        first = pa.array(rows[:1])
        reason = duplicate_reason(columns.query.take(first)[0].as_py(), columns.doc.take(first)[0].as_py(),
                                  columns.line[rows].tolist())
        rejects += [(int(line), reason) for line in columns.line[rows]]
    dropped = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    return without_rows(columns, dropped), rejects


# Field sets that mark a row (column names or JSON keys) as this task's: a file given to another
# task's command is named by the command it belongs to (transforms.preflight.task_of_fields).
IDENTIFYING_FIELDS = (("query_id", "doc_id"),)
