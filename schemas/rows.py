"""Input rows: Arrow schemas, normalisation of raw rows, and the reject record.

Every reader (JSONL, Parquet, Python dicts from a user's PCollection) produces a *normalised
table*: the row fields the task needs with their Arrow types, a `__position` column (1-based line
number for JSONL, 0-based row index for Parquet, element number for dicts) and one string column
`__slice__:<key>` per metadata key used for slicing, holding the value as canonical JSON ("null"
when the datum has no such key). Normalisation checks only types; validate_* in the task modules
check meaning. A reader that finds a row unusable while building the table (a Parquet score column
of strings, a slice value that is NaN) keeps the row and names the problem in an optional
`__reason` column (null for good rows); validation rejects such rows first, with that reason.

Label keys and values are text. An integer (not a boolean) is accepted as its decimal text, so
scikit-learn's integer class labels need no conversion: 3 and "3" are the same label in every
format. Other non-strings (3.0, true, objects) are rejected with a reason that says how to write
them.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalbeam.schemas.safe_json import slice_value_problem

POSITION = "__position"
SLICE_PREFIX = "__slice__:"
REASON = "__reason"

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


_ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+")


def reject(source: str, file: str, position: int | None, reason: str,
           datum_uid: str | None = None, position_name: str = "line") -> dict:
    """The record of one rejected input row, as written to rejected.jsonl. Memory addresses
    that library messages carry ("<_io.BytesIO object at 0x7f...>") are removed from the
    reason, so the same input gives the same rejected.jsonl in every run."""
    record = {"source": source, "file": file, position_name: position,
              "reason": _ADDRESS.sub("", reason)}
    if datum_uid is not None:
        record["datum_uid"] = datum_uid
    return record


def canonical_json(value) -> str:
    """JSON text of a metadata value, identical for equal values whatever their origin."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def slice_columns(metadata: list, slice_keys: list[str]) -> dict[str, pa.Array]:
    """`__slice__:<key>` columns from a list of metadata dicts (or None)."""
    return {SLICE_PREFIX + key: pa.array(
        [canonical_json(m.get(key) if isinstance(m, dict) else None) for m in metadata],
        pa.string()) for key in slice_keys}


def metadata_slice_columns(metadata: pa.Array | None, n: int, slice_keys: list[str]) -> dict[str, pa.Array]:
    """`__slice__:<key>` columns from an Arrow metadata column (struct or map) of n rows, plus a
    `__reason` column when some row's slice value holds NaN or an infinity (JSON outputs cannot
    carry it: schemas.safe_json.slice_value_problem).

    Values are converted to canonical JSON once per distinct value, not once per row. The
    non-finite check is vectorised for float columns (the usual case of NaN) and runs per distinct
    value only for nested values (objects, lists), which may hold a float anywhere."""
    out = {}
    reasons = None
    for key in slice_keys:
        if metadata is None:
            column = pa.nulls(n)
        elif pa.types.is_struct(metadata.type):
            names = [metadata.type.field(i).name for i in range(metadata.type.num_fields)]
            column = (metadata.field(key) if key in names else pa.nulls(n))
            if metadata.null_count and key in names:
                column = pc.if_else(metadata.is_valid(), column, pa.scalar(None, column.type))
        elif pa.types.is_map(metadata.type):
            column = pc.map_lookup(metadata, pa.scalar(key, metadata.type.key_type), "first")
        else:
            raise TypeError(f"metadata must be an object, got {metadata.type}")
        encoded = column.dictionary_encode() if not pa.types.is_null(column.type) else None
        if encoded is None:
            out[SLICE_PREFIX + key] = pa.array(["null"] * n, pa.string())
            continue
        values, unreadable = _python_values(key, encoded.dictionary)
        texts = pa.array([canonical_json(_plain(v)) for v in values] + ["null"], pa.string())
        indices = encoded.indices.fill_null(len(encoded.dictionary))
        out[SLICE_PREFIX + key] = texts.take(indices)
        problems = _non_finite_problems(key, encoded.dictionary, values, unreadable)
        if problems is not None:
            found = problems.take(indices).to_numpy(zero_copy_only=False)
            # a row keeps the reason of its first slice key that has one
            reasons = found if reasons is None else np.where(reasons == None, found, reasons)  # noqa: E711
    if reasons is not None:
        out[REASON] = pa.array(reasons, pa.string())
    return out


def _python_values(key: str, dictionary: pa.Array) -> tuple[list, list | None]:
    """The distinct values as Python objects and, when some hold text that is not UTF-8 (Arrow
    does not check the strings of a Parquet file when it reads them), why each cannot name a
    slice (those values become None)."""
    try:
        return dictionary.to_pylist(), None
    except UnicodeDecodeError:
        pass
    values, problems = [], []
    for i in range(len(dictionary)):
        try:
            values.append(dictionary[i].as_py())
            problems.append(None)
        except UnicodeDecodeError as error:
            values.append(None)
            problems.append(f"metadata {key!r} holds text that is not valid UTF-8 "
                            f"({error.reason} at byte {error.start})")
    return values, problems


def _non_finite_problems(key: str, dictionary: pa.Array, values: list,
                         unreadable: list | None = None) -> pa.Array | None:
    """Per distinct slice value (plus a last null entry for "no value"), why it cannot name a
    slice (unreadable text first, then NaN or an infinity), or None when every value can."""
    kind = dictionary.type
    if unreadable is None:
        if pa.types.is_floating(kind):
            if pc.all(pc.is_finite(dictionary)).as_py():
                return None
        elif not pa.types.is_nested(kind):
            return None   # strings, integers, booleans: always finite
    problems = [(unreadable[i] if unreadable else None) or slice_value_problem(key, _plain(v))
                for i, v in enumerate(values)] + [None]
    if all(p is None for p in problems):
        return None
    return pa.array(problems, pa.string())


def _plain(value):
    """Arrow's Python value, with floats that are whole numbers kept as floats (1.0 stays 1.0)."""
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return dict(value)  # a map value
    return value


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


def score_problem(score) -> str | None:
    """Why a label score (a parsed JSON or Python value) is not a number, or None; the range is
    checked later, on the whole batch."""
    if score is None or (not isinstance(score, bool) and isinstance(score, (int, float, np.number))):
        return None
    return _type_error("label score", "a number", score)


def check_row(row, scored: bool, slice_keys=()) -> str | None:
    """Why a parsed JSON row does not have the shape of a classification row, or None.

    Shape only: a string datum_uid, a list of label objects with a key and a value (text or
    integer, see label_text_problem) and, when `scored`, a numeric score; and, for each of
    `slice_keys`, a metadata value that can name a slice (no NaN or infinity). Meaning (non-empty,
    score range, duplicates) is checked later, on the whole batch at once."""
    if not isinstance(row, dict):
        return f"row must be a JSON object, got {type(row).__name__}"
    uid = row.get("datum_uid")
    if uid is not None and not isinstance(uid, str):
        return _type_error("datum_uid", "a string", uid)
    labels = row.get("labels")
    if labels is not None:
        if not isinstance(labels, list):
            return _type_error("labels", "a list", labels)
        for label in labels:
            if not isinstance(label, dict):
                return _type_error("each label", "an object", label)
            problem = (label_text_problem("key", label.get("key"))
                       or label_text_problem("value", label.get("value"))
                       or (score_problem(label.get("score")) if scored else None))
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
