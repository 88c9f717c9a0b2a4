"""Format adapters: JSONL and Parquet bytes into normalised Arrow tables (see schemas.rows).

JSONL is parsed a block at a time by Arrow's multi-threaded JSON reader. Arrow must never see a
line nested deeper than schemas.safe_json.MAX_NESTING (its reader overflows its stack, a
segfault, near 20,000 levels): deep_lines measures every line of a block first, and a block with
such a line is parsed the slow way. Arrow skips blank lines and reports errors for a whole block,
so the fast path is used only when every non-blank line of the block became exactly one row;
otherwise the block is parsed again line by line with schemas.safe_json.loads_row, which finds
each bad line and its reason (not JSON, nested too deep, a lone UTF-16 surrogate). Either way
every row keeps its 1-based line number. A line longer than the reader's limit is never held in
memory: jsonl_blocks skips it and parse_jsonl_block rejects it.

One typing rule for every format (schemas.rows): label keys and values are text, an integer
being its decimal text; scores are numbers. Arrow types a column by the schema, so a block whose
label values are integers is read with an integer value column and cast to text; a Parquet column
is converted only when the rule allows it, and a row holding a value the rule refuses (a string
score, a float label) is rejected row by row, in whichever row group it lies.
"""

from __future__ import annotations

import io
import re
from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from evalbeam.schemas.rows import (POSITION, REASON, check_row, label_text_problem, metadata_slice_columns,
                          rows_to_table, score_problem)
from evalbeam.schemas.safe_json import MAX_NESTING, MAX_ROW_BYTES, lone_surrogate, loads_row, surrogate_reason

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


class SkippedLine(bytes):
    """Yielded by jsonl_blocks in place of a line longer than its limit: an empty block that
    parse_jsonl_block turns into the line's rejection."""

    limit: int


def _skipped(limit: int) -> SkippedLine:
    out = SkippedLine(b"")
    out.limit = limit
    return out


def too_long_reason(limit: int) -> str:
    return f"line longer than {limit:,} bytes"


def jsonl_blocks(stream: BinaryIO, block_size: int = 16 << 20, max_line_bytes: int | None = None,
                 ) -> Iterator[tuple[bytes, int]]:
    """Split a stream into blocks of whole lines: yields (bytes, number of the block's first line).

    A line longer than max_line_bytes (default schemas.safe_json.MAX_ROW_BYTES), newline not
    counted, is yielded alone as a SkippedLine and its bytes are read and dropped, so memory stays
    within about block_size + max_line_bytes whatever the input (a 1 GB line without a newline
    included)."""
    if max_line_bytes is None:
        max_line_bytes = MAX_ROW_BYTES
    line = 1
    rest = b""          # the start of a line whose end has not been read yet
    skipping = False    # inside a line already known to be too long
    while True:
        chunk = stream.read(block_size)
        if not chunk:
            break
        if skipping:
            end = chunk.find(b"\n")
            if end < 0:
                continue
            yield _skipped(max_line_bytes), line
            line += 1
            chunk, skipping = chunk[end + 1:], False
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        block, rest = data[:cut], data[cut:]
        if block:
            yield from _without_long_lines(block, line, max_line_bytes)
            line += int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n")))
        if len(rest) > max_line_bytes:
            rest, skipping = b"", True
    if skipping:
        yield _skipped(max_line_bytes), line
    elif rest.strip():
        if len(rest) > max_line_bytes:
            yield _skipped(max_line_bytes), line
        else:
            yield rest + b"\n", line


def _without_long_lines(block: bytes, first_line: int, limit: int) -> Iterator[tuple[bytes, int]]:
    """The block as (bytes, first line) pieces with every line longer than limit replaced by a
    SkippedLine (only a block longer than limit can hold one)."""
    if len(block) <= limit + 1:
        yield block, first_line
        return
    ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n"))
    starts = np.r_[0, ends[:-1] + 1]
    start = 0
    for i in np.flatnonzero(ends - starts > limit).tolist():
        if starts[i] > start:
            yield block[start:starts[i]], first_line + int(np.count_nonzero(ends < start))
        yield _skipped(limit), first_line + i
        start = int(ends[i]) + 1
    if start < len(block):
        yield block[start:], first_line + int(np.count_nonzero(ends < start))


# Bytes that shape the nesting of JSON text: _exactly_deep drops every other byte at C speed.
_STRUCTURE = b'{[}]"\n'
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(_STRUCTURE)))


def scan_lines(block: bytes, piece: int = 1 << 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block as uint8, offset of each line's end, opening brackets '{' '[' per line).

    One numpy pass over 1 MiB pieces finds newlines and opening brackets together (cache-sized
    pieces, no temporary as large as the block): about as cheap as finding the newlines alone,
    which the reader needs anyway. A last line without a newline ends at the block's end."""
    buf = np.frombuffer(block, dtype=np.uint8)
    size = min(piece, buf.size)
    folded, hit, newline = (np.empty(size, dtype=np.uint8), np.empty(size, dtype=bool),
                            np.empty(size, dtype=bool))
    found = [np.zeros(0, dtype=np.int64)]
    for start in range(0, buf.size, piece):
        part = buf[start:start + piece]
        n = part.size
        np.bitwise_or(part, 0x20, out=folded[:n])           # '[' | 0x20 is '{'
        np.equal(folded[:n], ord("{"), out=hit[:n])
        np.equal(part, ord("\n"), out=newline[:n])
        np.logical_or(hit[:n], newline[:n], out=hit[:n])
        found.append(np.flatnonzero(hit[:n]) + start)
    found = np.concatenate(found)
    is_end = np.flatnonzero(buf[found] == ord("\n"))       # indices into found
    ends = found[is_end]
    if buf.size and buf[-1] != ord("\n"):
        ends = np.r_[ends, buf.size]
        is_end = np.r_[is_end, found.size]
    per_line = np.diff(np.r_[-1, is_end]) - 1               # brackets between line ends
    return buf, ends, per_line


def deep_lines(block: bytes, limit: int = MAX_NESTING, scanned=None) -> np.ndarray:
    """0-based indices of the lines of `block` that nest deeper than `limit`, by the rule of
    schemas.safe_json.nesting_depth (brackets inside strings do not count; a quote after an odd
    run of backslashes is escaped), for a whole block at once. `scanned`: scan_lines(block).

    Depth never exceeds the count of opening brackets, so the count per line settles normal rows
    (a few brackets each); only lines with more than `limit` opening brackets (rows with many
    labels, or hostile ones) are measured exactly."""
    _, ends, per_line = scan_lines(block) if scanned is None else scanned
    candidates = np.flatnonzero(per_line > limit)
    if not candidates.size:
        return candidates
    if 2 * candidates.size > ends.size:    # most lines (wide rows): measure the block as it is
        text = block if block.endswith(b"\n") else block + b"\n"
        return _exactly_deep(text, limit)
    starts = np.r_[0, ends[:-1] + 1]
    text = b"\n".join(block[starts[i]:ends[i]] for i in candidates.tolist()) + b"\n"
    return candidates[_exactly_deep(text, limit)]


def _exactly_deep(text: bytes, limit: int) -> np.ndarray:
    """Indices of the lines of `text` (each ending in a newline) nesting deeper than limit.

    Byte passes at C speed reduce the text to its structure: escaped backslashes and escaped
    quotes go first (escapes pair from the left, as in JSON), then every byte but brackets,
    quotes and newlines. A bracket is inside a string when an odd number of quotes precede it
    on its line; as the structure holds only quotes, brackets and newlines, the quotes before the
    k-th other byte, at offset p, number p - k: numpy works on brackets and newlines only. When
    every line has an even number of quotes and returns to depth 0 (valid rows), counts over the
    whole text are the per-line counts; otherwise each line's counts are taken from its start."""
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = np.frombuffer(text.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    offset = np.flatnonzero(structure != ord('"'))
    kind = structure[offset]
    quotes_before = offset - np.arange(offset.size)
    line_end = np.flatnonzero(kind == ord("\n"))
    folded = kind | 0x20
    opening, closing = folded == ord("{"), folded == ord("}")
    if not (quotes_before[line_end] & 1).any():
        outside = (quotes_before & 1) == 0
        depth = np.cumsum((opening & outside).astype(np.int64) - (closing & outside))
        if not depth[line_end].any():
            return np.unique(np.searchsorted(line_end, np.flatnonzero(depth > limit)))
    line = np.searchsorted(line_end, np.arange(offset.size))       # the line of each byte
    outside = ((quotes_before - np.r_[0, quotes_before[line_end]][line]) & 1) == 0
    depth = np.cumsum((opening & outside).astype(np.int64) - (closing & outside))
    depth -= np.r_[0, depth[line_end]][line]
    return np.unique(line[depth > limit])


def _nonblank_line_numbers(block: bytes, first_line: int, scanned=None) -> np.ndarray:
    """Line numbers of the lines of `block` (ending in newline) that hold a non-space byte.
    `scanned`: scan_lines(block)."""
    buf, ends, _ = scan_lines(block) if scanned is None else scanned
    if not ends.size:
        return np.zeros(0, dtype=np.int64)
    starts = np.r_[0, ends[:-1] + 1]
    # A line that starts with a non-space byte is not blank: the usual case, decided by one
    # look at each line's first byte instead of a scan of every byte.
    if starts[-1] < buf.size and not np.isin(buf[starts], WHITESPACE).any():
        return first_line + np.arange(ends.size)
    solid = np.r_[0, np.cumsum(~np.isin(buf, WHITESPACE))]   # solid bytes before each offset
    per_line = solid[ends] - solid[starts]
    return first_line + np.flatnonzero(per_line > 0)


def _is_utf8(data: bytes) -> bool:
    """Whether bytes are valid UTF-8 (encoded surrogates are not): ASCII, the usual case, is
    settled by one C-speed scan, other text by Arrow's vectorised validation (about 20 times
    faster than Python's decoder)."""
    if data.isascii():
        return True
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64).tobytes())
    text = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)])
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def not_utf8_reason(data: bytes, what: str = "the line") -> str | None:
    """Why bytes are not UTF-8 text, or None. Python's json parses bytes with the surrogatepass
    handler, so the UTF-8 form of a lone surrogate (ED A0 80) would pass it: checked here."""
    if data.isascii():
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        return (f"{what} holds text that is not valid UTF-8 ({error.reason} at byte "
                f"{error.start})")
    return None


def _empty_table(schema: pa.Schema, slice_keys: list[str]) -> pa.Table:
    return rows_to_table([], [], schema, slice_keys)


# The first label value of a block, when it is a number: the block is read with integer values.
_VALUE_FIELD = b'"value"'
_NUMBER_FOLLOWS = re.compile(rb"\s*:\s*-?[0-9]")


def _integer_values(schema: pa.Schema) -> pa.Schema:
    """The schema with int64 label values (read as such, then cast to their decimal text)."""
    label = schema.field("labels").type.value_type
    fields = [pa.field(f.name, pa.int64()) if f.name == "value" else f for f in label]
    return schema.set(schema.get_field_index("labels"),
                      pa.field("labels", pa.list_(pa.struct(fields))))


def _read_fast(block: bytes, schema: pa.Schema, slice_keys: list[str]) -> pa.Table | None:
    """Arrow's reading of a block as the schema, or None when Arrow refuses it. Label values are
    tried as text and as integers (cast to their decimal text), the kind of the block's first
    value first; a block that mixes both kinds, or holds anything else, is left to the slow
    path."""
    position = block.find(_VALUE_FIELD)
    integers = position >= 0 and _NUMBER_FOLLOWS.match(block, position + len(_VALUE_FIELD))
    attempts = [_integer_values(schema), schema] if integers else [schema, _integer_values(schema)]
    for attempt, explicit in enumerate(attempts):
        try:
            table = pajson.read_json(
                io.BytesIO(block),
                read_options=pajson.ReadOptions(use_threads=True, block_size=4 << 20),
                parse_options=pajson.ParseOptions(
                    explicit_schema=explicit,
                    unexpected_field_behavior="infer" if slice_keys else "ignore"),
            )
        except pa.ArrowInvalid as error:
            if attempt == 0 and "/value)" in str(error):
                continue    # "Column(/labels/[]/value) changed from string to number": the other kind
            return None
        if explicit is not schema:
            index = table.schema.get_field_index("labels")
            table = table.set_column(index, "labels",
                                     table.column("labels").cast(schema.field("labels").type))
        return table
    return None


def parse_jsonl_block(block: bytes, first_line: int, schema: pa.Schema, slice_keys: list[str],
                      ) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Normalised table of a block of JSONL, and [(line, reason)] of the lines that are not rows.

    A SkippedLine (see jsonl_blocks) is the rejection of one line too long to read."""
    scored = "score" in [f.name for f in schema.field("labels").type.value_type]
    if isinstance(block, SkippedLine):
        return _empty_table(schema, slice_keys), [(first_line, too_long_reason(block.limit))]
    scanned = scan_lines(block)
    if deep_lines(block, MAX_NESTING, scanned).size:   # Arrow's reader could overflow its stack
        return _parse_slowly(block, first_line, schema, slice_keys, scored)
    if not _is_utf8(block):   # Arrow's reader passes bytes that are not UTF-8 into its strings
        return _parse_slowly(block, first_line, schema, slice_keys, scored)
    lines = _nonblank_line_numbers(block, first_line, scanned)
    table = _read_fast(block, schema, slice_keys)
    if table is None or table.num_rows != lines.size:
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
    """Line by line: UTF-8, loads_row (not JSON, too deep, lone surrogate), then check_row
    (shape, label types, slice values)."""
    rows, positions, bad = [], [], []
    for number, raw in enumerate(block.split(b"\n"), start=first_line):
        if not raw.strip():
            continue
        problem = not_utf8_reason(raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw)
        row, problem = (None, problem) if problem else loads_row(raw)
        if problem is None:
            problem = check_row(row, scored, slice_keys)
        if problem:
            bad.append((number, problem))
            continue
        rows.append(row)
        positions.append(number)
    return rows_to_table(rows, positions, schema, slice_keys), bad


def _is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _is_text(kind.value_type)
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind))


def _invalid_utf8(array: pa.Array) -> np.ndarray | None:
    """Mask of the entries of a string array that are not valid UTF-8, or None when all are:
    Arrow does not check the strings of a Parquet file when it reads them."""
    try:
        array.validate(full=True)
        return None
    except pa.ArrowInvalid:
        pass
    raw = array.cast(pa.binary()).to_pylist()
    return np.array([value is not None and not _is_utf8(value) for value in raw], dtype=bool)


def _typed_child(name: str, child: pa.Array, target: pa.DataType,
                 ) -> tuple[pa.Array, np.ndarray | None, np.ndarray | None]:
    """One field of the labels, converted to `target` where the typing rule allows it: text
    (also binary) or integers (as decimal text) for key and value, numbers for score. Returns
    (array, mask of entries of a refused type, mask of entries that are not UTF-8 text); the
    refused entries are null in the array."""
    kind = child.type
    if pa.types.is_null(kind):
        return pa.nulls(len(child), target), None, None
    if pa.types.is_string(target):
        binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
        if _is_text(kind) or binary:
            text = (child.cast(pa.binary()) if binary else child).cast(target, safe=False)
            broken = _invalid_utf8(text)
            if broken is not None:
                text = pc.if_else(pa.array(broken), pa.scalar(None, target), text)
            return text, None, broken
        allowed = pa.types.is_integer(kind)
    else:
        allowed = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
    if allowed:
        return child.cast(target), None, None
    return pa.nulls(len(child), target), np.asarray(child.is_valid()), None


def _label_problem(name: str, value) -> str:
    return score_problem(value) if name == "score" else label_text_problem(name, value)


def parquet_labels(column: pa.Array, target: pa.DataType) -> tuple[pa.Array, np.ndarray | None]:
    """The labels column of a Parquet batch as `target` (a list of label structs), and the reason
    of each row (object[n], None for good rows; None when every row is good).

    Fields are taken by name (extra fields are ignored). A row whose labels hold a value of a
    type the rule refuses keeps its labels, with that field null, and gets the reason JSONL gives
    for the first such value (labels in order; key, value, score within a label). Raises
    TypeError when the column cannot hold labels at all."""
    kind = column.type
    if not ((pa.types.is_list(kind) or pa.types.is_large_list(kind))
            and pa.types.is_struct(kind.value_type)):
        raise TypeError(f"column 'labels' of type {kind} cannot be read as {target}: it must be a "
                        "list of label objects")
    present = [kind.value_type.field(i).name for i in range(kind.value_type.num_fields)]
    fields = list(target.value_type)
    missing = [f.name for f in fields if f.name not in present]
    if missing:
        raise TypeError(f"the labels of column 'labels' ({kind}) have no field(s) {missing}")
    flat = pc.list_flatten(column)
    children, broken, not_text = [], {}, {}
    for field in fields:
        child, bad, bad_text = _typed_child(field.name, pc.struct_field(flat, field.name), field.type)
        children.append(child)
        for found, masks in ((bad, broken), (bad_text, not_text)):
            if found is not None and found.any():
                masks[field.name] = found
    null_label = np.asarray(flat.is_null())
    values = pa.StructArray.from_arrays(children, fields=fields,
                                        mask=pa.array(null_label) if null_label.any() else None)
    lengths = np.asarray(pc.list_value_length(column).fill_null(0), dtype=np.int64)
    offsets = pa.array(np.r_[0, np.cumsum(lengths)], pa.int32())
    labels = pa.ListArray.from_arrays(offsets, values, type=target,
                                      mask=column.is_null() if column.null_count else None)
    if not broken and not not_text and not null_label.any():
        return labels, None
    label_row = np.asarray(pc.list_parent_indices(column), dtype=np.int64)
    any_bad = null_label.copy()
    for bad in list(broken.values()) + list(not_text.values()):
        any_bad |= bad
    reasons = np.full(len(column), None, dtype=object)
    first_label = {}
    for i in np.flatnonzero(any_bad).tolist():
        first_label.setdefault(int(label_row[i]), i)
    for row, i in first_label.items():
        if null_label[i]:
            reasons[row] = "each label must be an object, got NoneType null"
            continue
        name = next(f.name for f in fields if (f.name in broken and broken[f.name][i])
                    or (f.name in not_text and not_text[f.name][i]))
        if name in not_text and not_text[name][i]:
            raw = pc.struct_field(flat, name)[i].cast(pa.binary()).as_py()
            reasons[row] = not_utf8_reason(raw, f"label {name}")
        else:
            reasons[row] = _label_problem(name, pc.struct_field(flat, name)[i].as_py())
    return labels, reasons


def parquet_uids(column: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """The datum_uid column as text, and the reasons of rows whose uid is not UTF-8 text (found
    row by row only when the column as a whole is not), so a bad value in a late row group is a
    rejected row."""
    kind = column.type
    try:
        text = (column.cast(pa.binary()).cast(pa.string(), safe=False)
                if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) else column.cast(pa.string()))
    except pa.ArrowNotImplementedError as error:
        raise TypeError(f"column 'datum_uid' of type {kind} cannot be read as text: "
                        f"{error}") from None
    broken = _invalid_utf8(text)
    if broken is None:
        return text, None
    reasons = np.full(len(column), None, dtype=object)
    raw = text.cast(pa.binary()).to_pylist()
    for i in np.flatnonzero(broken).tolist():
        reasons[i] = not_utf8_reason(raw[i], "datum_uid")
    return pc.if_else(pa.array(broken), pa.scalar(None, pa.string()), text), reasons


def _first_reasons(*reasons) -> np.ndarray | None:
    """Row by row, the first reason of several reason arrays (None arrays are skipped)."""
    out = None
    for found in reasons:
        if found is None:
            continue
        out = found if out is None else np.where(out == None, found, out)  # noqa: E711
    return out


def parquet_tables(stream: BinaryIO, schema: pa.Schema, slice_keys: list[str],
                   batch_rows: int = 262_144) -> Iterator[pa.Table]:
    """Normalised tables from a Parquet file (positions are 0-based row indices).

    The typing rule is JSONL's, applied row by row and never by casting a whole column (see
    parquet_labels): a score column of strings such as "0.5" is not read as numbers, and a row
    that breaks the rule, in any row group, is kept with its reason in the `__reason` column for
    validation to reject. Raises TypeError with a readable message when the file cannot hold rows
    of the schema at all (a missing column, labels that are not a list of label objects)."""
    reader = pq.ParquetFile(stream)
    names = reader.schema_arrow.names
    missing = [n for n in schema.names if n not in names]
    if missing:
        raise TypeError(f"missing column(s) {missing}; the file has {names}")
    columns = schema.names + (["metadata"] if slice_keys and "metadata" in names else [])
    start = 0
    for batch in reader.iter_batches(batch_size=batch_rows, columns=columns):
        out = {}
        out["datum_uid"], uid_reasons = parquet_uids(batch.column("datum_uid"))
        out["labels"], label_reasons = parquet_labels(batch.column("labels"),
                                                      schema.field("labels").type)
        out[POSITION] = pa.array(np.arange(start, start + batch.num_rows), pa.int64())
        metadata = batch.column("metadata") if "metadata" in batch.schema.names else None
        out.update(metadata_slice_columns(metadata, batch.num_rows, slice_keys))
        slice_reasons = out.pop(REASON).to_numpy(zero_copy_only=False) if REASON in out else None
        reasons = _first_reasons(uid_reasons, label_reasons, slice_reasons)
        if reasons is not None:
            out[REASON] = pa.array(reasons, pa.string())
        start += batch.num_rows
        yield pa.table(out)


def _surrogate_problem(row) -> str | None:
    """A lone UTF-16 surrogate in a Python row (JSONL lines get the same check in loads_row):
    such text cannot be written to UTF-8 outputs."""
    where = lone_surrogate(row)
    return None if where is None else surrogate_reason(where)


def dict_rows_table(rows: list, first_position: int, schema: pa.Schema, slice_keys: list[str],
                    ) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Normalised table from Python dict rows (a user's PCollection), like the JSONL slow path."""
    scored = "score" in [f.name for f in schema.field("labels").type.value_type]
    good, positions, bad = [], [], []
    for number, row in enumerate(rows, start=first_position):
        problem = check_row(row, scored, slice_keys) or _surrogate_problem(row)
        if problem:
            bad.append((number, problem))
        else:
            good.append(row)
            positions.append(number)
    return rows_to_table(good, positions, schema, slice_keys), bad
