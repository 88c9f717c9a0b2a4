"""Format adapters: JSONL and Parquet bytes into normalised Arrow tables (see schemas.rows).

JSONL is parsed a block at a time by Arrow's multi-threaded JSON reader. Arrow skips blank lines
and reports errors for a whole block, so the fast path is used only when every non-blank line of
the block became exactly one row; otherwise the block is parsed again line by line with the
standard json module, which finds each bad line and its reason. Either way every row keeps its
1-based line number.
"""

from __future__ import annotations

import io
import json
from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from schemas.rows import POSITION, check_row, metadata_slice_columns, rows_to_table

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.gz", ".ndjson.gz", ".json.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")
WHITESPACE = np.array([ord(c) for c in " \t\r\n"], dtype=np.uint8)


def format_of(path: str) -> str | None:
    """'jsonl', 'parquet' or None, from the file name."""
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


def position_name(path: str) -> str:
    """How rows of this file are located in rejected.jsonl: "row" (0-based) for Parquet, else
    "line" (1-based)."""
    return "row" if format_of(path) == "parquet" else "line"


def jsonl_blocks(stream: BinaryIO, block_size: int = 16 << 20) -> Iterator[tuple[bytes, int]]:
    """Split a stream into blocks of whole lines: yields (bytes, number of the block's first line)."""
    line = 1
    rest = b""
    while True:
        chunk = stream.read(block_size)
        if not chunk:
            break
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            rest = data
            continue
        block, rest = data[:cut], data[cut:]
        yield block, line
        line += block.count(b"\n")
    if rest.strip():
        yield rest + b"\n", line


def _nonblank_line_numbers(block: bytes, first_line: int) -> np.ndarray:
    """Line numbers of the lines of `block` (ending in newline) that hold a non-space byte."""
    buf = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(buf == ord("\n"))
    starts = np.r_[0, ends[:-1] + 1]
    # A line that starts with a non-space byte is not blank: the usual case, decided by one
    # look at each line's first byte instead of a scan of every byte.
    maybe_blank = np.flatnonzero(np.isin(buf[starts], WHITESPACE))
    if not maybe_blank.size:
        return first_line + np.arange(ends.size)
    solid = np.cumsum(~np.isin(buf, WHITESPACE))
    per_line = np.diff(np.r_[0, solid[ends]])
    return first_line + np.flatnonzero(per_line > 0)


def parse_jsonl_block(block: bytes, first_line: int, schema: pa.Schema, slice_keys: list[str],
                      ) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Normalised table of a block of JSONL, and [(line, reason)] of the lines that are not rows."""
    scored = "score" in [f.name for f in schema.field("labels").type.value_type]
    lines = _nonblank_line_numbers(block, first_line)
    try:
        table = pajson.read_json(
            io.BytesIO(block),
            read_options=pajson.ReadOptions(use_threads=True, block_size=4 << 20),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema,
                unexpected_field_behavior="infer" if slice_keys else "ignore"),
        )
        if table.num_rows != lines.size:
            raise ValueError("rows and lines disagree")
    except (pa.ArrowInvalid, ValueError):
        return _parse_slowly(block, first_line, schema, slice_keys, scored)
    metadata = table.column("metadata").combine_chunks() if "metadata" in table.column_names else None
    if metadata is not None and not (pa.types.is_struct(metadata.type) or pa.types.is_null(metadata.type)):
        return _parse_slowly(block, first_line, schema, slice_keys, scored)
    if metadata is not None and pa.types.is_null(metadata.type):
        metadata = None
    columns = {name: table.column(name) for name in schema.names}
    columns[POSITION] = pa.array(lines, pa.int64())
    columns.update(metadata_slice_columns(metadata, table.num_rows, slice_keys))
    return pa.table(columns), []


def _parse_slowly(block: bytes, first_line: int, schema: pa.Schema, slice_keys: list[str],
                  scored: bool) -> tuple[pa.Table, list[tuple[int, str]]]:
    rows, positions, bad = [], [], []
    for number, raw in enumerate(block.split(b"\n"), start=first_line):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as error:
            bad.append((number, f"malformed JSON: {error}"))
            continue
        problem = check_row(row, scored)
        if problem:
            bad.append((number, problem))
            continue
        rows.append(row)
        positions.append(number)
    return rows_to_table(rows, positions, schema, slice_keys), bad


def parquet_tables(stream: BinaryIO, schema: pa.Schema, slice_keys: list[str],
                   batch_rows: int = 262_144) -> Iterator[pa.Table]:
    """Normalised tables from a Parquet file (positions are 0-based row indices).

    Raises TypeError with a readable message when the columns cannot be cast to the schema."""
    reader = pq.ParquetFile(stream)
    names = reader.schema_arrow.names
    missing = [n for n in schema.names if n not in names]
    if missing:
        raise TypeError(f"missing column(s) {missing}; the file has {names}")
    columns = schema.names + (["metadata"] if slice_keys and "metadata" in names else [])
    start = 0
    for batch in reader.iter_batches(batch_size=batch_rows, columns=columns):
        out = {}
        for field in schema:
            try:
                out[field.name] = batch.column(field.name).cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise TypeError(f"column {field.name!r} of type {batch.column(field.name).type} "
                                f"cannot be read as {field.type}: {error}") from None
        out[POSITION] = pa.array(np.arange(start, start + batch.num_rows), pa.int64())
        metadata = batch.column("metadata") if "metadata" in batch.schema.names else None
        out.update(metadata_slice_columns(metadata, batch.num_rows, slice_keys))
        start += batch.num_rows
        yield pa.table(out)


def dict_rows_table(rows: list, first_position: int, schema: pa.Schema, slice_keys: list[str],
                    ) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Normalised table from Python dict rows (a user's PCollection), like the JSONL slow path."""
    scored = "score" in [f.name for f in schema.field("labels").type.value_type]
    good, positions, bad = [], [], []
    for number, row in enumerate(rows, start=first_position):
        problem = check_row(row, scored)
        if problem:
            bad.append((number, problem))
        else:
            good.append(row)
            positions.append(number)
    return rows_to_table(good, positions, schema, slice_keys), bad
