"""The record of a rejected input row: one line of rejected.jsonl, the same for every task."""

from __future__ import annotations

import re

from evalbeam.schemas.limits import MAX_UID_CHARS

_ADDRESS = re.compile(r" at 0x[0-9A-Fa-f]+")


def reject(source: str, file: str, position: int | None, reason: str,
           datum_uid: str | None = None, position_name: str = "line") -> dict:
    """The record of one rejected input row, as written to rejected.jsonl. Memory addresses
    that library messages carry ("<_io.BytesIO object at 0x7f...>") are removed from the
    reason, so the same input gives the same rejected.jsonl in every run. A datum_uid longer
    than MAX_UID_CHARS characters is left out (such a row's reason gives its length), so no
    reader can write one out by passing it along."""
    record = {"source": source, "file": file, position_name: position,
              "reason": _ADDRESS.sub("", reason)}
    if datum_uid is not None and len(datum_uid) <= MAX_UID_CHARS:
        record["datum_uid"] = datum_uid
    return record
