"""The judge journal: every final judge response, kept so that no call is paid for twice.

Layout: JSONL files under one root URI (local path, gs://, s3://, through Beam's FileSystems),
named part-<writer id>-<sequence>.jsonl. Each writer (one per DoFn instance) has a random id, so
concurrent writers never write the same file, and it never rewrites a file: records are buffered
and each flush creates a new file (object stores cannot append). A crash loses at most the
unflushed buffer (flush_every records or flush_seconds); a file cut short by a kill loses its last
line, which readers skip. Records are one JSON object a line:

  {"hash", "status", "content", "raw_text", "usage": {...}, "latency_s", "attempts", "model",
   "endpoint_host", "template", "template_version", "sampling": {"temperature", "max_tokens",
   "seed"}, "system_fingerprint", "finish_reason", "error", "written_at"}

Only the endpoint's host is kept (never a URL's credentials, never an API key). When the same hash
appears more than once, the first record in (file name, line) order wins, so every reader agrees.
REUSABLE statuses are deterministic outcomes of the request and are served from the journal;
transient or configuration failures (timeout, rate_limited, quota_exceeded, http_error) are not,
so a later run retries them.
"""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import urlsplit

REUSABLE = frozenset({"ok", "invalid_output", "truncated", "refused"})
_PREFIX = "part-"


def endpoint_host(url: str) -> str:
    """host[:port] of a URL, without user, password, path or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{host}:{parts.port}" if parts.port else host


def _join(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


class JournalWriter:
    """Buffers records and writes them as new part files under root."""

    def __init__(self, root: str, flush_every: int = 50, flush_seconds: float = 2.0):
        self.root = root
        self.flush_every = flush_every
        self.flush_seconds = flush_seconds
        self.writer_id = uuid.uuid4().hex[:16]
        self.sequence = 0
        self.buffer: list[str] = []
        self.last_flush = time.monotonic()
        self.written = 0

    def append(self, record: dict) -> None:
        """Add one record; writes a file when the buffer is full or old enough."""
        record = dict(record)
        record.setdefault("written_at", time.time())
        self.buffer.append(json.dumps(record, ensure_ascii=False, sort_keys=True))
        if len(self.buffer) >= self.flush_every or time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        from apache_beam.io.filesystems import FileSystems

        path = _join(self.root, f"{_PREFIX}{self.writer_id}-{self.sequence:06d}.jsonl")
        with FileSystems.create(path) as out:
            out.write(("\n".join(self.buffer) + "\n").encode("utf-8"))
        self.sequence += 1
        self.written += len(self.buffer)
        self.buffer = []
        self.last_flush = time.monotonic()


def read_journal(root: str) -> dict[str, dict]:
    """{hash: record} of the reusable records under root (none when root does not exist yet).

    Each part file is read through transforms.input_files (a regular file of at most
    MAX_OUTPUT_BYTES, lines bounded): a part file that is a FIFO or a link to a device raises
    transforms.io.ReadError (an input error of the run, exit 2), never blocks or grows. A line
    that is not JSON or nests deeper than MAX_NESTING levels is skipped, as the last line of a
    file cut short by a kill is: its request is sent again."""
    from evalbeam.schemas.safe_json import too_deep
    from evalbeam.transforms.input_files import FileRefused, iter_lines
    from evalbeam.transforms.io import ReadError

    found: dict[str, dict] = {}
    for path in journal_files(root):
        try:
            for _, line in iter_lines(path, what=f"the judge journal's {path}"):
                if too_deep(line):
                    continue
                try:
                    record = json.loads(line)
                except ValueError:      # the last line of a file cut short by a kill
                    continue
                if isinstance(record, dict) and record.get("status") in REUSABLE:
                    found.setdefault(record.get("hash"), record)
        except FileRefused as error:
            raise ReadError(error.message) from None
    return found


def journal_files(root: str) -> list[str]:
    """The part files under root, in name order (none when root does not exist yet)."""
    from apache_beam.io.filesystems import FileSystems

    try:
        matches = FileSystems.match([_join(root, f"{_PREFIX}*.jsonl")])[0].metadata_list
    except Exception:           # no such folder yet: an empty journal
        return []
    return sorted(meta.path for meta in matches)


def check_journal(root: str) -> str | None:
    """Why the journal under root cannot be used, or None: root must be a folder (or absent),
    and every part file a regular file within transforms.input_files' bound (opened and closed, not read), so that a FIFO or a
    link to a device stops the run before it starts rather than on a worker."""
    import os

    from evalbeam.transforms.input_files import MAX_OUTPUT_BYTES, FileRefused, open_bounded

    if "://" not in root and os.path.lexists(root) and not os.path.isdir(root):
        # its part files are written inside it on the workers, where this failed the run
        return f"{root} is a file, not a folder: name a folder (it is created if needed)"
    for path in journal_files(root):
        try:
            with open_bounded(path, MAX_OUTPUT_BYTES, f"the judge journal's {path}"):
                pass
        except FileRefused as error:
            return error.message
    return None
