"""Input rows: Arrow schemas, normalisation of raw rows, and the reject record.

Every reader (JSONL, Parquet, Python dicts from a user's PCollection) produces a *normalised
table*: the row fields the task needs with their Arrow types, a `__position` column (1-based line
number for JSONL, 0-based row index for Parquet, element number for dicts) and one string column
`__slice__:<key>` per metadata key used for slicing, holding the value as canonical JSON ("null"
when the datum has no such key). Normalisation checks only types; validate_* in the task modules
check meaning.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.compute as pc

POSITION = "__position"
SLICE_PREFIX = "__slice__:"

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
    """`__slice__:<key>` columns from an Arrow metadata column (struct or map) of n rows.

    Values are converted to canonical JSON once per distinct value, not once per row."""
    out = {}
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
        texts = pa.array([canonical_json(_plain(v)) for v in encoded.dictionary.to_pylist()] + ["null"],
                         pa.string())
        indices = encoded.indices.fill_null(len(encoded.dictionary))
        out[SLICE_PREFIX + key] = texts.take(indices)
    return out


def _plain(value):
    """Arrow's Python value, with floats that are whole numbers kept as floats (1.0 stays 1.0)."""
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return dict(value)  # a map value
    return value


def _type_error(field: str, expected: str, value) -> str:
    return f"{field} must be {expected}, got {type(value).__name__} {json.dumps(value, default=str)[:60]}"


def check_row(row, scored: bool) -> str | None:
    """Why a parsed JSON row does not have the shape of a classification row, or None.

    Shape only: a string datum_uid, a list of label objects with string key and value and, when
    `scored`, a numeric score. Meaning (non-empty, score range, duplicates) is checked later, on
    the whole batch at once."""
    if not isinstance(row, dict):
        return f"row must be a JSON object, got {type(row).__name__}"
    uid = row.get("datum_uid")
    if uid is not None and not isinstance(uid, str):
        return _type_error("datum_uid", "a string", uid)
    labels = row.get("labels")
    if labels is None:
        return None
    if not isinstance(labels, list):
        return _type_error("labels", "a list", labels)
    for label in labels:
        if not isinstance(label, dict):
            return _type_error("each label", "an object", label)
        for field in ("key", "value"):
            v = label.get(field)
            if v is not None and not isinstance(v, str):
                return _type_error(f"label {field}", "a string", v)
        if scored:
            score = label.get("score")
            if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
                return _type_error("label score", "a number", score)
    metadata = row.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return _type_error("metadata", "an object", metadata)
    return None


def rows_to_table(rows: list[dict], positions: list[int], schema: pa.Schema,
                  slice_keys: list[str]) -> pa.Table:
    """Normalised table from rows that passed check_row."""
    scored = "score" in [f.name for f in schema.field("labels").type.value_type]

    def label(lab: dict) -> dict:
        out = {"key": lab.get("key"), "value": lab.get("value")}
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
