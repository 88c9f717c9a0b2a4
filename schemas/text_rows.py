"""Text generation rows (JSONL or Parquet), checked when read.

Ground truth: {"datum_uid": str, "metadata"?: {...}, "query"?: str, "references"?: [str, ...],
"condition"?: str}. Predictions: {"datum_uid": str, "response": str, "contexts"?: [str, ...]}.
A row is rejected whole when a field has the wrong type (a reference or context that is not a
string, a missing response...), when its datum_uid is longer than MAX_UID_CHARS characters
(schemas/limits.py: scores.jsonl repeats it for every metric), when the response or a reference
is longer than max_text_chars characters (MAX_TEXT_CHARS, --max_text_chars), when the metadata value of a
--slice key is not finite (NaN, Infinity: JSON outputs cannot carry it), is longer than
MAX_SLICE_CHARS characters as JSON (schemas/limits.py) or cannot be written as JSON, and, for
rows that come as Python dicts from a user's pipeline, when any string of the row holds a lone
UTF-16 surrogate (rows read from files are checked for it by schemas.safe_json.loads_row, with a
reason of the same form).
Shared by `evalbeam text` and the LLM-judge metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evalbeam.schemas.limits import MAX_TEXT_CHARS, row_uid_problem, text_length_problem
from evalbeam.schemas.safe_json import lone_surrogate, slice_value_problem
from evalbeam.schemas.slices import canonical_json

SURROGATE_REASON = ("{where} holds a lone UTF-16 surrogate (such as \\ud800 without its pair): "
                    "not valid Unicode text")


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


def _problem(row, scored: bool, max_text_chars: int = MAX_TEXT_CHARS) -> str | None:
    problem = row_uid_problem(row)
    if problem:
        return problem
    if row.get("metadata") is not None and not isinstance(row["metadata"], dict):
        return "metadata must be an object"
    if scored:
        if not isinstance(row.get("response"), str):
            return "missing response (a string)"
        problem = text_length_problem("response", len(row["response"]), max_text_chars)
        if problem:
            return problem
        if row.get("contexts") is not None and not _strings(row["contexts"]):
            return "contexts must be a list of strings"
        return None
    if row.get("query") is not None and not isinstance(row["query"], str):
        return "query must be a string"
    if row.get("references") is not None and not _strings(row["references"]):
        return "references must be a list of strings"
    for i, reference in enumerate(row.get("references") or []):
        problem = text_length_problem(f"reference {i + 1}", len(reference), max_text_chars)
        if problem:
            return problem
    if row.get("condition") is not None and not isinstance(row["condition"], str):
        return "condition must be a string"
    return None


def _slices(metadata: dict, slice_keys: list[str]) -> tuple[dict, str | None]:
    """({key: canonical JSON of the value}, None), or ({}, reason) when a value cannot name a
    slice: not finite, longer than MAX_SLICE_CHARS characters as JSON, or not JSON at all (a Python object or a value nested past the recursion
    limit in a row from a user's pipeline)."""
    out = {}
    for key in slice_keys:
        value = metadata.get(key)
        problem = slice_value_problem(key, value)
        if problem:
            return {}, problem
        try:
            out[key] = canonical_json(value)
        except (TypeError, ValueError, RecursionError) as error:
            return {}, f"metadata {key!r} cannot be written as JSON: {type(error).__name__}"
    return out, None


def text_rows(rows: list, positions: list, scored: bool, file_id: int, slice_keys: list[str],
              check_condition=None, check_strings: bool = False, max_text_chars: int = MAX_TEXT_CHARS):
    """([GroundTruthRow or PredictionRow], [(position, uid or None, reason)]) of one file's parsed
    rows. check_condition(text) -> reason or None rejects ground truth whose condition does not
    parse (the reason names the column). check_strings: reject rows holding a lone surrogate
    (rows built in Python; JSON lines were checked when parsed). A rejected row's uid is left out
    when it is not valid text (and by reject() when it is too long)."""
    good, bad = [], []
    for row, position in zip(rows, positions):
        if check_strings:
            where = lone_surrogate(row)
            if where is not None:
                bad.append((position, None, SURROGATE_REASON.format(where=where)))
                continue
        problem = _problem(row, scored, max_text_chars)
        uid = row.get("datum_uid") if isinstance(row, dict) else None
        if problem is None and not scored and row.get("condition") is not None and check_condition:
            reason = check_condition(row["condition"])
            problem = f"condition: {reason}" if reason else None
        slices = {}
        if problem is None and not scored and slice_keys:
            slices, problem = _slices(row.get("metadata") or {}, slice_keys)
        if problem:
            bad.append((position, uid if isinstance(uid, str) else None, problem))
            continue
        if scored:
            good.append(PredictionRow(uid, position, file_id, row["response"], row.get("contexts")))
        else:
            good.append(GroundTruthRow(uid, position, file_id, row.get("query"), list(row.get("references") or []),
                                       row.get("condition"), slices))
    return good, bad


# Field sets that mark a row (column names or JSON keys) as this task's: a file given to another
# task's command is named by the command it belongs to (transforms.preflight.task_of_fields).
IDENTIFYING_FIELDS = (("response",), ("references",), ("query",))
