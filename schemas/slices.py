"""Slice values: the canonical JSON that names a metadata value in a slice, the same for equal
values whatever their origin (file format, Python type of a PCollection's row), and its bound:
at most MAX_SLICE_CHARS characters (schemas/limits.py), since the text is copied into every
metric record of its slice."""

from __future__ import annotations

import json

from evalbeam.schemas.limits import MAX_SLICE_CHARS, slice_length_reason


def canonical_json(value) -> str:
    """JSON text of a metadata value, identical for equal values whatever their origin."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _json_chars_at_least(value, stop: int) -> int:
    """A lower bound on the length of canonical_json(value), exact enough to pass `stop` as soon
    as the value is clearly longer: strings count their characters and quotes, containers their
    brackets and one separator per item, integers a quarter of their bits (a decimal digit holds
    log2(10) > 3.3 bits), everything else one character. The walk stops once the count passes
    `stop`, so a 50 MB string or a list of a million items costs one step, never a copy."""
    total, stack = 0, [value]
    while stack and total <= stop:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += 1 + 2 * len(item)          # braces, colons, commas
            if total <= stop:
                for key, inner in item.items():
                    total += len(key) + 2 if isinstance(key, str) else 3
                    stack.append(inner)
        elif isinstance(item, (list, tuple)):
            total += 1 + len(item)              # brackets, commas
            if total <= stop:
                stack.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            total += max(1, item.bit_length() // 4)
        else:
            total += 1
    return total


def slice_text(key: str, value, limit: int = MAX_SLICE_CHARS) -> tuple[str | None, str | None]:
    """(canonical JSON of the value, None), or (None, reason) when that text would be longer than
    `limit` characters. A value clearly longer is refused before any text is made
    (_json_chars_at_least); otherwise the text is made (at most a few times `limit`: escapes) and
    measured. Raises what canonical_json raises for a value that is not JSON (TypeError,
    ValueError, RecursionError)."""
    if _json_chars_at_least(value, limit) > limit:
        return None, slice_length_reason(key, limit)
    text = canonical_json(value)
    if len(text) > limit:
        return None, slice_length_reason(key, limit)
    return text, None


def slice_length_problem(key: str, value, limit: int = MAX_SLICE_CHARS) -> str | None:
    """Why a metadata value is too long to name a slice (slice_text), or None; a value that is
    not JSON at all is left to the caller, which reports it in its own words."""
    try:
        return slice_text(key, value, limit)[1]
    except (TypeError, ValueError, RecursionError):
        return None
