"""Classification rows: validation of normalised tables into flat label arrays.

Ground-truth row: {"datum_uid": str, "metadata"?: {str: scalar}, "labels": [{"key", "value"}]},
one value per key. Prediction row: {"datum_uid": str, "labels": [{"key", "value", "score"}]}, any
number of scored values per key, each value at most once per key, scores in [0, 1]. Keys and
values are text; the readers turn integers into their decimal text (schemas.rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalbeam.schemas.rows import POSITION, REASON, SLICE_PREFIX
from evalbeam.schemas.hashing import fnv1a_64


@dataclass
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
    slices: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.uid)

    def take(self, rows: np.ndarray) -> "LabelRows":
        """The given rows (int64 indices, in the given order) with their labels, renumbered."""
        rows = np.asarray(rows, dtype=np.int64)
        new_index = np.full(len(self), -1, dtype=np.int64)
        new_index[rows] = np.arange(rows.size)
        keep = np.flatnonzero(new_index[self.label_row] >= 0)
        order = keep[np.argsort(new_index[self.label_row[keep]], kind="stable")]
        taken = pa.array(rows)
        return LabelRows(
            uid=self.uid.take(taken), position=self.position[rows],
            file_id=self.file_id[rows], hash=self.hash[rows],
            label_row=new_index[self.label_row[order]].astype(np.int32),
            key_code=self.key_code[order], key_names=self.key_names,
            value_code=self.value_code[order], value_names=self.value_names,
            label_score=None if self.label_score is None else self.label_score[order],
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
        """Rows grouped by shard = hash mod num_shards."""
        shard = (self.hash % np.uint64(num_shards)).astype(np.int64)
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(num_shards + 1))
        return {s: self.take(order[bounds[s]:bounds[s + 1]])
                for s in range(num_shards) if bounds[s + 1] > bounds[s]}

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


def validate(table: pa.Table, scored: bool, file_id: int, max_labels: int | None = None,
             ) -> tuple[LabelRows, list[tuple[int, str | None, str]]]:
    """Split a normalised table into valid rows and rejects [(position, datum_uid, reason)].

    A row is rejected, with the first reason that applies, when: the reader named a problem in
    the table's `__reason` column; it holds more than max_labels labels (None: no bound); its
    datum_uid is missing or empty; its labels are missing; a label has no key or no value
    (missing or empty string); a score is missing, NaN, infinite or outside [0, 1]
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

    if REASON in table.column_names:
        found = _combine(table.column(REASON))
        reason[:] = np.asarray(found.to_numpy(zero_copy_only=False), dtype=object)
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
    # duplicates within a row: (row, key) for ground truth, (row, key, value) for predictions
    if len(flat):
        combo = label_row * (int(key_code.max()) + 1) + key_code
        if scored:
            combo = combo * (int(value_code.max()) + 1) + value_code
        _, inverse, counts = np.unique(combo, return_inverse=True, return_counts=True)
        repeated = counts[inverse] > 1
        first_dup = {}
        for i in np.flatnonzero(repeated):
            first_dup.setdefault(int(label_row[i]), i)
        if scored:
            flag(rows_where(repeated), lambda r: (
                f"value {value[first_dup[r]].as_py()!r} is scored twice for key "
                f"{key[first_dup[r]].as_py()!r}"))
        else:
            flag(rows_where(repeated), lambda r: (
                f"key {key[first_dup[r]].as_py()!r} has more than one ground-truth value"))

    bad = reason != None  # noqa: E711
    rejects = [(int(position[r]), uid[r].as_py(), reason[r]) for r in np.flatnonzero(bad)]
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
