"""Normalised Arrow tables of input rows (classification's readers build them): the position,
slice and reason columns.

Every reader (JSONL, Parquet, Python dicts from a user's PCollection) produces a *normalised
table*: the row fields the task needs with their Arrow types, a `__position` column (1-based line
number for JSONL, 0-based row index for Parquet, element number for dicts) and one string column
`__slice__:<key>` per metadata key used for slicing, holding the value as canonical JSON ("null"
when the datum has no such key). Normalisation checks only types; validation in the task's rows
module (schemas/<task>_rows.py) checks meaning. A reader that finds a row unusable while building
the table (a Parquet score column of strings, a slice value that is NaN) keeps the row and names
the problem in an optional `__reason` column (null for good rows); validation rejects such rows
first, with that reason.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalbeam.schemas.safe_json import slice_value_problem
from evalbeam.schemas.slices import canonical_json, slice_text

POSITION = "__position"
SLICE_PREFIX = "__slice__:"
REASON = "__reason"

def slice_columns(metadata: list, slice_keys: list[str]) -> dict[str, pa.Array]:
    """`__slice__:<key>` columns from a list of metadata dicts (or None)."""
    return {SLICE_PREFIX + key: pa.array(
        [canonical_json(m.get(key) if isinstance(m, dict) else None) for m in metadata],
        pa.string()) for key in slice_keys}


def metadata_slice_columns(metadata: pa.Array | None, n: int, slice_keys: list[str]) -> dict[str, pa.Array]:
    """`__slice__:<key>` columns from an Arrow metadata column (struct or map) of n rows, plus a
    `__reason` column when some row's slice value holds NaN or an infinity (JSON outputs cannot
    carry it) or is longer than MAX_SLICE_CHARS characters as JSON (schemas.safe_json.
    slice_value_problem gives the same reasons to rows read one by one).

    Values are converted to canonical JSON once per distinct value, not once per row; a value
    too long is measured without being written out (schemas.slices.slice_text) and its rows hold
    "null" until validation rejects them. The non-finite check is vectorised for float columns
    (the usual case of NaN) and runs per distinct value only for nested values (objects, lists),
    which may hold a float anywhere."""
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
        texts, too_long = _slice_texts(key, values)
        indices = encoded.indices.fill_null(len(encoded.dictionary))
        out[SLICE_PREFIX + key] = texts.take(indices)
        problems = _non_finite_problems(key, encoded.dictionary, values, unreadable, too_long)
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


def _slice_texts(key: str, values: list) -> tuple[pa.Array, list | None]:
    """The canonical JSON of each distinct value, plus a last "null" for "no value", and, when
    some value is longer than MAX_SLICE_CHARS as JSON, the reason of each (None for the others):
    such a value gets the text "null", so its text is never copied into the row's column (its
    row is rejected anyway)."""
    texts, too_long = [], []
    for value in values:
        text, problem = slice_text(key, _plain(value))
        texts.append("null" if problem else text)
        too_long.append(problem)
    return (pa.array(texts + ["null"], pa.string()),
            too_long if any(too_long) else None)


def _non_finite_problems(key: str, dictionary: pa.Array, values: list,
                         unreadable: list | None = None,
                         too_long: list | None = None) -> pa.Array | None:
    """Per distinct slice value (plus a last null entry for "no value"), why it cannot name a
    slice (unreadable text first, then NaN or an infinity, then a length beyond MAX_SLICE_CHARS
    as _slice_texts found it: the order of schemas.safe_json.slice_value_problem), or None when
    every value can."""
    kind = dictionary.type
    if unreadable is None and too_long is None:
        if pa.types.is_floating(kind):
            if pc.all(pc.is_finite(dictionary)).as_py():
                return None
        elif not pa.types.is_nested(kind):
            return None   # strings, integers, booleans: always finite
    problems = [(unreadable[i] if unreadable else None)
                or _non_finite_problem(key, _plain(v), kind)
                or (too_long[i] if too_long else None)
                for i, v in enumerate(values)] + [None]
    if all(p is None for p in problems):
        return None
    return pa.array(problems, pa.string())


def _non_finite_problem(key: str, value, kind: pa.DataType) -> str | None:
    """slice_value_problem of a value of a float or nested column; other kinds (strings,
    integers, booleans) are always finite, and their length is _slice_texts's to check."""
    if pa.types.is_floating(kind) or pa.types.is_nested(kind):
        return slice_value_problem(key, value)
    return None


def _plain(value):
    """Arrow's Python value, with floats that are whole numbers kept as floats (1.0 stays 1.0)."""
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return dict(value)  # a map value
    return value
