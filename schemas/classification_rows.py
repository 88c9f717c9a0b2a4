"""Classification rows: the row format, its Arrow schemas, the readers of JSONL, Parquet and
Python rows into normalised tables (see schemas.arrow_tables), and validation into flat label arrays.

Ground-truth row: {"datum_uid": str, "metadata"?: {str: scalar}, "labels": [{"key", "value"}]},
one value per key. Prediction row: {"datum_uid": str, "labels": [{"key", "value", "score"}]}, any
number of scored values per key, each value at most once per key, scores in [0, 1].

Label keys and values are text. An integer (not a boolean) is accepted as its decimal text, so
scikit-learn's integer class labels need no conversion: 3 and "3" are the same label in every
format. Other non-strings (3.0, true, objects) are rejected with a reason that says how to write
them. Scores are numbers. A key or value is at most MAX_LABEL_CHARS (1,024) characters, an integer
counting its decimal digits; a longer one rejects its row in every format (check_row for rows
parsed one by one, validate for Arrow's tables) and never reaches the label names. A datum_uid is
at most MAX_UID_CHARS (4,096) characters, checked the same way; a longer one is never copied
into a reject, a shard piece or an example list.

JSONL is parsed a block at a time (schemas.formats.jsonl_blocks) by Arrow's multi-threaded JSON
reader. Arrow must never see a line nested deeper than schemas.safe_json.MAX_NESTING (its reader
overflows its stack, a segfault, near 20,000 levels): schemas.formats.deep_lines measures every
line of a block first, and a block with such a line is parsed the slow way. Arrow skips blank
lines and reports errors for a whole block, so the fast path is used only when every non-blank
line of the block became exactly one row; otherwise the block is parsed again line by line with
schemas.safe_json.loads_row, which finds each bad line and its reason (not JSON, nested too deep,
a lone UTF-16 surrogate). Either way every row keeps its 1-based line number. A line longer than
the reader's limit is never held in memory: jsonl_blocks skips it and parse_jsonl_block rejects
it.

The typing rule is the same in every format. Arrow types a column by the schema, so a block whose
label values are integers is read with an integer value column and cast to text; a Parquet column
is converted only when the rule allows it, and a row holding a value the rule refuses (a string
score, a float label) is rejected row by row, in whichever row group it lies.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from evalbeam.schemas.arrow_tables import (POSITION, REASON, SLICE_PREFIX, metadata_slice_columns,
                                           slice_columns)
from evalbeam.schemas.formats import (deep_lines, is_utf8, nonblank_line_numbers, not_utf8_reason,
                                      scan_lines)
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.schemas.limits import (MAX_LABEL_CHARS, MAX_UID_CHARS, label_length_problem,
                                     uid_length_problem)
from evalbeam.schemas.lines import BOM, SkippedLine, too_long_reason
from evalbeam.schemas.ordering import grouped_order
from evalbeam.schemas.safe_json import (MAX_NESTING, lone_surrogate, loads_row, slice_value_problem,
                                        surrogate_reason)


LABEL = pa.struct([("key", pa.string()), ("value", pa.string())])
SCORED_LABEL = pa.struct([("key", pa.string()), ("value", pa.string()), ("score", pa.float64())])

# The data contract of classification inputs (also what Parquet files are cast to).
CLASSIFICATION_GROUNDTRUTH = pa.schema([
    ("datum_uid", pa.string()),
    ("labels", pa.list_(LABEL)),
])
CLASSIFICATION_PREDICTION = pa.schema([
    ("datum_uid", pa.string()),
    ("labels", pa.list_(SCORED_LABEL)),
])


# ----------------------------------------------------------------------------- row checks

def _type_error(field: str, expected: str, value) -> str:
    return f"{field} must be {expected}, got {type(value).__name__} {json.dumps(value, default=str)[:60]}"


def is_integer(value) -> bool:
    """An integer label (Python or numpy), not a boolean (bool is an int subclass in Python)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def label_text(value):
    """A label key or value as text: strings as they are, integers as their decimal text."""
    return str(int(value)) if is_integer(value) else value


def label_text_problem(field: str, value) -> str | None:
    """Why a label key or value (a parsed JSON or Python value) is neither text nor an integer,
    with how to write it instead, or None. The same reason in every format (JSONL, Parquet,
    rows from a PCollection)."""
    if value is None or isinstance(value, str) or is_integer(value):
        return None
    shown = json.dumps(value, default=str)[:60]
    if isinstance(value, bool):
        hint = f'write it as a string ("{shown}")'
    elif isinstance(value, float) and value.is_integer():
        hint = f'write whole-number labels as integers ({int(value)}) or strings ("{int(value)}")'
    elif isinstance(value, float):
        hint = f'write it as a string ("{shown}")'
    else:
        hint = "a label is one string or integer"
    return (f"label {field} must be a string or an integer, got {type(value).__name__} {shown}: "
            f"{hint}")


def label_text_length(value) -> int:
    """Characters of a label key or value (a string or an integer, see label_text) as text. An
    integer far beyond the bound is measured by its logarithm, never written out (Python refuses
    to write integers of more than 4,300 digits)."""
    if not is_integer(value):
        return len(value)
    number = abs(int(value))
    sign = 1 if value < 0 else 0
    if number.bit_length() <= 4 * MAX_LABEL_CHARS:   # at most about 1,233 digits
        return len(str(number)) + sign
    return int(math.log10(number)) + 1 + sign


def label_length_reason(field: str, value) -> str | None:
    """Why a label key or value (text or an integer) is longer than MAX_LABEL_CHARS characters,
    or None. The same reason in every format."""
    if value is None:
        return None
    return label_length_problem(f"label {field}", label_text_length(value))


def score_problem(score) -> str | None:
    """Why a label score (a parsed JSON or Python value) is not a number, or None; the range is
    checked later, on the whole batch."""
    if score is None or (not isinstance(score, bool) and isinstance(score, (int, float, np.number))):
        return None
    return _type_error("label score", "a number", score)


def check_row(row, scored: bool, slice_keys=()) -> str | None:
    """Why a parsed JSON row does not have the shape of a classification row, or None.

    Shape only: a string datum_uid of at most MAX_UID_CHARS characters, a list of label objects
    with a key and a value (text or integer, see label_text_problem, of at most MAX_LABEL_CHARS
    characters) and, when `scored`, a numeric score; and, for each of `slice_keys`, a metadata
    value that can name a slice (no NaN or infinity, at most MAX_SLICE_CHARS characters as
    JSON). Within a label, the types of key, value and score are checked before the lengths of
    key and value. Meaning (non-empty, score range, duplicates) is checked later, on the whole
    batch at once."""
    if not isinstance(row, dict):
        return f"row must be a JSON object, got {type(row).__name__}"
    uid = row.get("datum_uid")
    if uid is not None and not isinstance(uid, str):
        return _type_error("datum_uid", "a string", uid)
    problem = uid_length_problem("datum_uid", len(uid)) if uid is not None else None
    if problem:
        return problem
    labels = row.get("labels")
    if labels is not None:
        if not isinstance(labels, list):
            return _type_error("labels", "a list", labels)
        for label in labels:
            if not isinstance(label, dict):
                return _type_error("each label", "an object", label)
            problem = (label_text_problem("key", label.get("key"))
                       or label_text_problem("value", label.get("value"))
                       or (score_problem(label.get("score")) if scored else None)
                       or label_length_reason("key", label.get("key"))
                       or label_length_reason("value", label.get("value")))
            if problem:
                return problem
    metadata = row.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return _type_error("metadata", "an object", metadata)
    for key in slice_keys:
        problem = slice_value_problem(key, metadata.get(key)) if metadata else None
        if problem:
            return problem
    return None


def rows_to_table(rows: list[dict], positions: list[int], schema: pa.Schema,
                  slice_keys: list[str]) -> pa.Table:
    """Normalised table from rows that passed check_row (integer label keys and values become
    their decimal text)."""
    scored = "score" in [f.name for f in schema.field("labels").type.value_type]

    def label(lab: dict) -> dict:
        out = {"key": label_text(lab.get("key")), "value": label_text(lab.get("value"))}
        if scored:
            s = lab.get("score")
            out["score"] = None if s is None else float(s)
        return out

    columns = {
        "datum_uid": pa.array([r.get("datum_uid") for r in rows], pa.string()),
        "labels": pa.array([None if r.get("labels") is None else [label(x) for x in r["labels"]]
                            for r in rows], schema.field("labels").type),
        POSITION: pa.array(positions, pa.int64()),
    }
    columns.update(slice_columns([r.get("metadata") for r in rows], slice_keys))
    return pa.table(columns)


# ----------------------------------------------------------------------------- readers

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
    if not is_utf8(block):   # Arrow's reader passes bytes that are not UTF-8 into its strings
        return _parse_slowly(block, first_line, schema, slice_keys, scored)
    if block.find(b"\n" + BOM) >= 0:
        # a line that starts with a byte order mark is a bad row (loads_row), but Arrow's reader
        # drops the mark when the line starts one of its own inner blocks (a block that starts
        # with one comes from jsonl_blocks with a blank line first)
        return _parse_slowly(block, first_line, schema, slice_keys, scored)
    lines = nonblank_line_numbers(block, first_line, scanned)
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
    return np.array([value is not None and not is_utf8(value) for value in raw], dtype=bool)


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


# ----------------------------------------------------------------------------- validation

@dataclasses.dataclass
class LabelRows:
    """Validated rows of one source: n rows and k labels.

    uid pa.string[n], position int64[n] (line or row number), file_id int32[n] (index into the
    source's file list), hash uint64[n] (FNV-1a of uid), slices {key: pa.string[n]} (canonical
    JSON of metadata values, ground truth only). Labels: label_row int32[k] (row of each label,
    ascending), key_code and value_code int32[k] indexing the small string lists key_names and
    value_names (codes, not strings, keep shuffled pieces small), label_score float64[k]
    (predictions) or None (ground truth).
    """

    uid: pa.Array
    position: np.ndarray
    file_id: np.ndarray
    hash: np.ndarray
    label_row: np.ndarray
    key_code: np.ndarray
    key_names: list
    value_code: np.ndarray
    value_names: list
    label_score: np.ndarray | None
    slices: dict = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.uid)

    def take(self, rows: np.ndarray) -> "LabelRows":
        """The given rows (int64 indices, in the given order) with their labels, renumbered."""
        rows = np.asarray(rows, dtype=np.int64)
        new_index = np.full(len(self), -1, dtype=np.int64)
        new_index[rows] = np.arange(rows.size)
        keep = np.flatnonzero(new_index[self.label_row] >= 0)
        order = keep[np.argsort(new_index[self.label_row[keep]], kind="stable")]
        return self._selected(rows, order, new_index[self.label_row[order]])

    def _selected(self, rows: np.ndarray, labels: np.ndarray, label_row: np.ndarray) -> "LabelRows":
        """The rows `rows` with the labels `labels` (indices into this one's labels), whose rows
        in the result are label_row."""
        taken = pa.array(rows)
        return LabelRows(
            uid=self.uid.take(taken), position=self.position[rows],
            file_id=self.file_id[rows], hash=self.hash[rows],
            label_row=label_row.astype(np.int32),
            key_code=self.key_code[labels], key_names=self.key_names,
            value_code=self.value_code[labels], value_names=self.value_names,
            label_score=None if self.label_score is None else self.label_score[labels],
            slices={k: v.take(taken) for k, v in self.slices.items()},
        )

    @staticmethod
    def concat(parts: list["LabelRows"]) -> "LabelRows":
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0] + [len(p) for p in parts[:-1]])
        key_names, key_codes = _unify([p.key_names for p in parts], [p.key_code for p in parts])
        value_names, value_codes = _unify([p.value_names for p in parts], [p.value_code for p in parts])
        return LabelRows(
            uid=pa.concat_arrays([p.uid for p in parts]),
            position=np.concatenate([p.position for p in parts]),
            file_id=np.concatenate([p.file_id for p in parts]),
            hash=np.concatenate([p.hash for p in parts]),
            label_row=np.concatenate([p.label_row + o for p, o in zip(parts, offsets)]).astype(np.int32),
            key_code=key_codes, key_names=key_names,
            value_code=value_codes, value_names=value_names,
            label_score=(None if parts[0].label_score is None
                         else np.concatenate([p.label_score for p in parts])),
            slices={k: pa.concat_arrays([p.slices[k] for p in parts]) for k in parts[0].slices},
        )

    def partition(self, num_shards: int) -> dict[int, "LabelRows"]:
        """Rows grouped by shard = hash mod num_shards: for each shard present, what
        take(its rows in input order) gives. The labels are ordered once for every shard (a take
        per shard read every label once per shard: 28 shards, 28 passes)."""
        shard = (self.hash % np.uint64(num_shards)).astype(np.int64)
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(num_shards + 1))
        new_index = np.empty(len(self), dtype=np.int64)
        new_index[order] = np.arange(len(self))
        label_index = new_index[self.label_row]
        by_row = grouped_order(label_index)          # label_row ascends: one run per row
        label_index = label_index[by_row]
        label_bounds = np.searchsorted(label_index, bounds)
        pieces = {}
        for s in range(num_shards):
            lo, hi = bounds[s], bounds[s + 1]
            if hi == lo:
                continue
            first, last = label_bounds[s], label_bounds[s + 1]
            pieces[s] = self._selected(order[lo:hi], by_row[first:last], label_index[first:last] - lo)
        return pieces

    def codes_in(self, names: list, codes: np.ndarray, vocabulary: list[str]) -> np.ndarray:
        """Map codes of `names` to positions in the sorted `vocabulary` (-1 when absent)."""
        position = {name: i for i, name in enumerate(vocabulary)}
        lookup = np.array([position.get(name, -1) for name in names] + [-1], dtype=np.int32)
        return lookup[codes]


def _unify(name_lists: list[list], code_arrays: list[np.ndarray]) -> tuple[list, np.ndarray]:
    """Codes of several (names, codes) pairs re-expressed over one shared list of names."""
    if all(names == name_lists[0] for names in name_lists):
        return name_lists[0], np.concatenate(code_arrays)
    merged: dict = {}
    for names in name_lists:
        for name in names:
            merged.setdefault(name, len(merged))
    out = [np.array([merged[name] for name in names] + [-1], dtype=np.int32)[codes]
           for names, codes in zip(name_lists, code_arrays)]
    return list(merged), np.concatenate(out)


def _combine(array):
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def too_many_labels(n_labels: int, limit: int) -> str:
    return (f"{n_labels:,} labels in one row, more than --max_labels_per_row allows ({limit:,}); "
            "raise it if rows this large are meant")


def _without_long_names(labels: pa.Array, flag) -> pa.Array:
    """The labels with every key and value longer than MAX_LABEL_CHARS characters made null, and
    their rows flagged with label_length_reason. The names must go before the key and value
    dictionaries are built: LabelRows.key_names and value_names hold every name of the table,
    also of rejected rows, and every shard piece carries them."""
    flat = pc.list_flatten(labels)
    length, long = {}, {}
    for field in ("key", "value"):
        length[field] = np.asarray(pc.utf8_length(_combine(flat.field(field))).fill_null(0))
        long[field] = length[field] > MAX_LABEL_CHARS
    either = long["key"] | long["value"]
    if not either.any():
        return labels
    label_row = np.asarray(pc.list_parent_indices(labels), dtype=np.int64)
    first = {}
    for i in np.flatnonzero(either).tolist():
        first.setdefault(int(label_row[i]), i)

    def reason(row: int) -> str:
        i = first[row]
        field = "key" if long["key"][i] else "value"
        return label_length_problem(f"label {field}", int(length[field][i]))

    flag(np.bincount(label_row[either], minlength=len(labels)) > 0, reason)
    fields = list(flat.type)
    children = [pc.if_else(pa.array(long[f.name]), pa.scalar(None, f.type), flat.field(f.name))
                if f.name in long else flat.field(f.name) for f in fields]
    values = pa.StructArray.from_arrays(children, fields=fields,
                                        mask=flat.is_null() if flat.null_count else None)
    lengths = np.asarray(pc.list_value_length(labels).fill_null(0), dtype=np.int64)
    offsets = pa.array(np.r_[0, np.cumsum(lengths)], pa.int32())
    return pa.ListArray.from_arrays(offsets, values, type=labels.type,
                                    mask=labels.is_null() if labels.null_count else None)


def _repeated_labels(label_row: np.ndarray, key_code: np.ndarray, value_code: np.ndarray,
                     key: pa.Array, value: pa.Array, scored: bool):
    """(labels repeated within their row: bool per label, reason(row) of a row holding one).
    A repeat is a key given twice in a row of ground truth (it would have two values), a (key,
    value) pair given twice in a row of predictions (a value scored twice); the reason names the
    row's first repeated label. The codes index the dictionaries of key and value."""
    combo = label_row * (int(key_code.max()) + 1) + key_code
    if scored:
        combo = combo * (int(value_code.max()) + 1) + value_code
    _, inverse, counts = np.unique(combo, return_inverse=True, return_counts=True)
    repeated = counts[inverse] > 1
    first_dup = {}
    for i in np.flatnonzero(repeated):
        first_dup.setdefault(int(label_row[i]), i)
    if scored:
        return repeated, lambda r: (f"value {value[first_dup[r]].as_py()!r} is scored twice for key "
                                    f"{key[first_dup[r]].as_py()!r}")
    return repeated, lambda r: (f"key {key[first_dup[r]].as_py()!r} has more than one "
                                "ground-truth value")


def validate(table: pa.Table, scored: bool, file_id: int, max_labels: int | None = None,
             ) -> tuple[LabelRows, list[tuple[int, str | None, str]]]:
    """Split a normalised table into valid rows and rejects [(position, datum_uid, reason)].

    A row is rejected, with the first reason that applies, when: its datum_uid is longer than
    MAX_UID_CHARS characters (first, as check_row checks it first: a reader's reasons are about
    labels and slices, or a uid that is not UTF-8 and is then null); the reader named a problem in
    the table's `__reason` column; a label key or value is longer than MAX_LABEL_CHARS
    characters (the first such label, key before value); it holds more than max_labels labels
    (None: no bound); its datum_uid is missing or empty; its labels are missing; a label has no
    key or no value (missing or empty string); a score is missing, NaN, infinite or outside [0, 1]
    (predictions); a key has two values (ground truth) or a value is scored twice for one key
    (predictions)."""
    n = table.num_rows
    uid = _combine(table.column("datum_uid"))
    labels = _combine(table.column("labels"))
    position = np.asarray(table.column(POSITION).to_numpy(), dtype=np.int64)
    reason = np.full(n, None, dtype=object)

    def flag(mask: np.ndarray, text) -> None:
        """Give rows in mask the reason `text` (or text(row)) unless they already have one."""
        for row in np.flatnonzero(mask & (reason == None)):  # noqa: E711 (object array)
            reason[row] = text(row) if callable(text) else text

    uid_length = np.asarray(pc.utf8_length(uid).fill_null(0), dtype=np.int64)
    long_uid = uid_length > MAX_UID_CHARS
    flag(long_uid, lambda r: uid_length_problem("datum_uid", int(uid_length[r])))
    if REASON in table.column_names:
        found = _combine(table.column(REASON))
        found = np.asarray(found.to_numpy(zero_copy_only=False), dtype=object)
        reason[:] = np.where(long_uid, reason, found)
    labels = _without_long_names(labels, flag)
    if max_labels is not None:
        n_labels = np.asarray(pc.list_value_length(labels).fill_null(0), dtype=np.int64)
        flag(n_labels > max_labels, lambda r: too_many_labels(int(n_labels[r]), max_labels))
    flag(~np.asarray(pc.fill_null(pc.greater(pc.utf8_length(uid), 0), False)), "missing or empty datum_uid")
    flag(~np.asarray(labels.is_valid()), "missing labels")

    flat = pc.list_flatten(labels)
    label_row = np.asarray(pc.list_parent_indices(labels), dtype=np.int64)
    key = _combine(flat.field("key"))
    value = _combine(flat.field("value"))

    def rows_where(label_mask: np.ndarray) -> np.ndarray:
        return np.bincount(label_row[label_mask], minlength=n) > 0

    flag(rows_where(~np.asarray(pc.fill_null(pc.greater(pc.utf8_length(key), 0), False))),
         "label without key")
    flag(rows_where(~np.asarray(pc.fill_null(pc.greater(pc.utf8_length(value), 0), False))),
         "label without value")
    score = None
    if scored:
        raw = flat.field("score")
        missing = ~np.asarray(raw.is_valid())
        score = np.asarray(raw.fill_null(0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
        flag(rows_where(missing), "label without score")
        with np.errstate(invalid="ignore"):
            bad_score = ~missing & ~((score >= 0.0) & (score <= 1.0))
        bad_at = {}
        for i in np.flatnonzero(bad_score):
            bad_at.setdefault(int(label_row[i]), float(score[i]))
        flag(rows_where(bad_score), lambda r: f"score {bad_at[r]!r} is not a number in [0, 1]")

    key_dict = pc.dictionary_encode(key.fill_null(""))
    value_dict = pc.dictionary_encode(value.fill_null(""))
    key_code = np.asarray(key_dict.indices, dtype=np.int64)
    value_code = np.asarray(value_dict.indices, dtype=np.int64)
    if len(flat):
        repeated, why = _repeated_labels(label_row, key_code, value_code, key, value, scored)
        flag(rows_where(repeated), why)

    bad = reason != None  # noqa: E711
    # a uid too long is not copied out of the table: its reject names its length instead
    rejects = [(int(position[r]), None if long_uid[r] else uid[r].as_py(), reason[r])
               for r in np.flatnonzero(bad)]
    keep = np.flatnonzero(~bad)
    keep_labels = np.flatnonzero(~bad[label_row]) if len(flat) else np.zeros(0, np.int64)
    new_row = np.cumsum(~bad) - 1
    kept_uid = uid.take(pa.array(keep))
    rows = LabelRows(
        uid=kept_uid.cast(pa.string()),
        position=position[keep],
        file_id=np.full(keep.size, file_id, dtype=np.int32),
        hash=fnv1a_64(kept_uid),
        label_row=new_row[label_row[keep_labels]].astype(np.int32),
        key_code=key_code[keep_labels].astype(np.int32),
        key_names=key_dict.dictionary.to_pylist(),
        value_code=value_code[keep_labels].astype(np.int32),
        value_names=value_dict.dictionary.to_pylist(),
        label_score=None if score is None else score[keep_labels],
        slices={name[len(SLICE_PREFIX):]: _combine(table.column(name)).take(pa.array(keep))
                for name in table.column_names if name.startswith(SLICE_PREFIX)},
    )
    return rows, rejects


def vocabulary(rows: LabelRows) -> dict[str, set[str]]:
    """{label key: set of label values} seen in the rows."""
    if not len(rows.key_code):
        return {}
    pairs = np.unique(rows.key_code.astype(np.int64) * (len(rows.value_names) + 1) + rows.value_code)
    out: dict[str, set[str]] = {}
    for pair in pairs.tolist():
        k, v = divmod(pair, len(rows.value_names) + 1)
        out.setdefault(rows.key_names[k], set()).add(rows.value_names[v])
    return out


# Field sets that mark a row (column names or JSON keys) as this task's: a file given to another
# task's command is named by the command it belongs to (transforms.preflight.task_of_fields).
IDENTIFYING_FIELDS = (("labels",),)
