"""Reading one large line-based file with several workers: the file is cut into byte spans,
and each span is read by its own reader element.

A line belongs to the span in which it starts: a span [start, end) holds every line whose
first byte is at a position p with start <= p < end. Its reader therefore skips the end of the
line that crosses `start` (unless byte start - 1 is a newline), and reads past `end` to the
newline of the line that crosses it. Every line is read by exactly one span, whatever the
span size, including lines longer than a span (the spans they cover hold no line start and read
nothing but the bytes up to `end`).

Line numbers stay those of the whole file (rejected.jsonl points at the same line either way):
a counting step reads every span once in parallel (count_newlines), and span k's first line is
1 + the newlines before `start`, + 1 when byte start - 1 is not a newline (the first line of
the span then starts after the next newline). Reading costs one extra pass over the bytes,
spread over the workers, instead of each span counting its whole prefix.

Only uncompressed line-based inputs split (JSONL, TREC): a compressed stream cannot be entered
in the middle, and a Parquet or COCO JSON file is one structure.

Elements: (source name, file id) for a file read whole, (source name, file id, start, end,
first line) for a span; span_of() reads both.
"""

from __future__ import annotations

from typing import BinaryIO

SPLIT_BYTES = 64 << 20      # Beam's own text source splits at about this size
MIN_SPLIT_BYTES = 8 << 20
SPANS_WANTED = 32
_CHUNK = 8 << 20


def span_of(element) -> tuple:
    """(name, file id, start, end, first line) of a reader element; end is None for a file read
    whole (start 0, first line 1)."""
    if len(element) == 2:
        return element[0], element[1], 0, None, 1
    return tuple(element)


def auto_split_bytes(total: int) -> int:
    """The span size when --input_split_bytes is not given: the read's splittable bytes in
    SPANS_WANTED spans, but spans of MIN_SPLIT_BYTES to SPLIT_BYTES.

    Why not always SPLIT_BYTES: a runner hands a step's elements to its workers in equal
    numbers, not equal bytes, and the grouping after the reading waits for the last span, so a
    few large spans leave a run's time to which worker gets the odd one out; many small spans
    even the work out. The upper bound keeps the pieces of a cluster-sized input (one per span
    and shard) few: 73 GB is 1,100 spans of 64 MiB."""
    wanted = -(-total // SPANS_WANTED)
    return max(MIN_SPLIT_BYTES, min(SPLIT_BYTES, wanted))


def plan_spans(size: int, split_bytes: int) -> list[tuple[int, int]]:
    """Byte spans [start, end) of a file of `size` bytes: one span (0, size) when it is not
    larger than split_bytes (or split_bytes <= 0), else spans of split_bytes with a shorter
    last one."""
    if split_bytes <= 0 or size <= split_bytes:
        return [(0, size)]
    return [(start, min(start + split_bytes, size)) for start in range(0, size, split_bytes)]


def count_newlines(raw: BinaryIO, start: int, end: int) -> tuple[int, bool]:
    """(newlines in bytes [start, end), whether byte end - 1 is a newline) of a seekable stream.
    A file shorter than `end` counts up to its end."""
    raw.seek(start)
    count, last, position = 0, b"", start
    while position < end:
        chunk = raw.read(min(_CHUNK, end - position))
        if not chunk:
            break
        count += chunk.count(b"\n")
        last = chunk[-1:]
        position += len(chunk)
    return count, last == b"\n"


def first_lines(counts: list) -> dict:
    """{(name, file id, start): first line number} from [((name, file id, start), (newlines,
    ends with a newline))] of every span of the files (count_newlines)."""
    by_file: dict = {}
    for (name, file_id, start), value in counts:
        by_file.setdefault((name, file_id), []).append((start, value))
    numbers = {}
    for (name, file_id), spans in by_file.items():
        line, ends_line = 1, True
        for start, (newlines, ends_with_newline) in sorted(spans):
            # after a span that ends inside a line, the next span starts at the next newline
            numbers[(name, file_id, start)] = line + (0 if start == 0 or ends_line else 1)
            line += newlines
            ends_line = ends_with_newline
    return numbers


class LineSpan:
    """A read-only stream of the lines of `raw` (seekable, uncompressed) that start in bytes
    [start, end), newlines included; see the module docstring. Memory: one read's size, also
    for a line longer than the span."""

    def __init__(self, raw: BinaryIO, start: int, end: int):
        self.raw = raw
        self.end = end
        self.position = start
        self.done = False
        self.tail = False        # past `end`, inside the line that crosses it
        if start > 0:
            raw.seek(start - 1)
            self.position = start - 1
            self._skip_partial_line()
        else:
            raw.seek(0)
        self.done = self.position >= end

    def _skip_partial_line(self) -> None:
        """Move to just after the first newline at or after start - 1, or to `end` if there is
        none before it: the bytes skipped belong to a line that an earlier span reads."""
        while self.position < self.end:
            chunk = self.raw.read(min(_CHUNK, self.end - self.position))
            if not chunk:
                self.position = self.end
                return
            cut = chunk.find(b"\n")
            if cut >= 0:
                self.position += cut + 1
                self.raw.seek(self.position)
                return
            self.position += len(chunk)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            parts = []
            while True:
                part = self.read(_CHUNK)
                if not part:
                    return b"".join(parts)
                parts.append(part)
        if self.done or size == 0:
            return b""
        if not self.tail:
            data = self.raw.read(min(size, self.end - self.position))
            if not data:
                self.done = True
                return b""
            self.position += len(data)
            if self.position >= self.end:
                if data.endswith(b"\n"):
                    self.done = True
                else:
                    self.tail = True
            return data
        data = self.raw.read(size)
        if not data:
            self.done = True
            return b""
        cut = data.find(b"\n")
        if cut >= 0:
            data = data[:cut + 1]
            self.done = True
        self.position += len(data)
        return data

    def close(self) -> None:
        self.raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
