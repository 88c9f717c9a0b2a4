"""Text generation rows (JSONL or Parquet), checked when read.

Ground truth: {"datum_uid": str, "metadata"?: {...}, "query"?: str, "references"?: [str, ...],
"condition"?: str}. Predictions: {"datum_uid": str, "response": str, "contexts"?: [str, ...]}.
A row is rejected whole when a field has the wrong type (a reference or context that is not a
string, a missing response...). Shared by `evalbeam text` and the LLM-judge metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.rows import canonical_json


@dataclass
class GroundTruthRow:
    uid: str
    position: int
    file_id: int
    query: str | None = None
    references: list = field(default_factory=list)
    condition: str | None = None
    slices: dict = field(default_factory=dict)


@dataclass
class PredictionRow:
    uid: str
    position: int
    file_id: int
    response: str = ""
    contexts: list | None = None


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _problem(row, scored: bool) -> str | None:
    if not isinstance(row, dict):
        return "row must be a JSON object"
    uid = row.get("datum_uid")
    if not isinstance(uid, str) or not uid:
        return "missing or empty datum_uid"
    if row.get("metadata") is not None and not isinstance(row["metadata"], dict):
        return "metadata must be an object"
    if scored:
        if not isinstance(row.get("response"), str):
            return "missing response (a string)"
        if row.get("contexts") is not None and not _strings(row["contexts"]):
            return "contexts must be a list of strings"
        return None
    if row.get("query") is not None and not isinstance(row["query"], str):
        return "query must be a string"
    if row.get("references") is not None and not _strings(row["references"]):
        return "references must be a list of strings"
    if row.get("condition") is not None and not isinstance(row["condition"], str):
        return "condition must be a string"
    return None


def text_rows(rows: list, positions: list, scored: bool, file_id: int, slice_keys: list[str],
              check_condition=None):
    """([GroundTruthRow or PredictionRow], [(position, uid or None, reason)]) of one file's parsed
    rows. check_condition(text) -> reason or None rejects ground truth whose condition does not
    parse (the reason names the column)."""
    good, bad = [], []
    for row, position in zip(rows, positions):
        problem = _problem(row, scored)
        uid = row.get("datum_uid") if isinstance(row, dict) else None
        if problem is None and not scored and row.get("condition") is not None and check_condition:
            reason = check_condition(row["condition"])
            problem = f"condition: {reason}" if reason else None
        if problem:
            bad.append((position, uid if isinstance(uid, str) else None, problem))
            continue
        if scored:
            good.append(PredictionRow(uid, position, file_id, row["response"], row.get("contexts")))
        else:
            metadata = row.get("metadata") or {}
            good.append(GroundTruthRow(uid, position, file_id, row.get("query"), list(row.get("references") or []),
                                       row.get("condition"),
                                       {k: canonical_json(metadata.get(k)) for k in slice_keys}))
    return good, bad
