"""Slice values: the canonical JSON that names a metadata value in a slice, the same for equal
values whatever their origin (file format, Python type of a PCollection's row)."""

from __future__ import annotations

import json


def canonical_json(value) -> str:
    """JSON text of a metadata value, identical for equal values whatever their origin."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
