"""The one bounded line reader: a byte stream cut into whole lines, with line numbers, in bounded
memory whatever the input.

line_blocks is the reader; every reader of lines in evalbeam is one of its views:
- schemas.formats.jsonl_blocks: its blocks as they are, for Arrow's JSON reader;
- schemas.safe_json.iter_lines: its lines one at a time (None for a line too long);
- transforms.input_files.iter_lines: the non-blank lines of a settings or output file (a line
  too long refuses the file).

The rules they share:
- a line is the bytes before a newline ("\\n"); the stream's last line may have none;
- a line longer than max_line_bytes (newline not counted) is never held in memory: as soon as
  the reader knows it is too long it yields a SkippedLine in its place, and it reads the rest of
  the line and drops it. Memory stays within about chunk_size + max_line_bytes, a line of 1 GB
  without a newline included;
- a UTF-8 byte order mark (BOM) at byte 0 of a file (a stream whose first line is line 1) is
  dropped, as editors write one; a BOM anywhere else is data, left to the parsers
  (schemas.safe_json.loads_row rejects a line that starts with one).
"""

from __future__ import annotations

from typing import BinaryIO, Iterator

import numpy as np

BOM = b"\xef\xbb\xbf"


class SkippedLine(bytes):
    """Yielded by line_blocks in place of a line longer than its limit: an empty block (so a
    parser of blocks sees no bytes) that carries the limit it broke."""

    limit: int


def skipped(limit: int) -> SkippedLine:
    """The SkippedLine of a line longer than limit bytes."""
    out = SkippedLine(b"")
    out.limit = limit
    return out


def too_long_reason(limit: int) -> str:
    """The rejection reason of a row whose line is longer than limit bytes (a SkippedLine)."""
    return f"line longer than {limit:,} bytes"


def line_blocks(stream: BinaryIO, max_line_bytes: int, chunk_size: int,
                first_line: int = 1) -> Iterator[tuple[bytes, int]]:
    """(block, number of its first line) for every line of a stream, in order. A block is one
    or more whole lines, each ending in a newline, read chunk_size bytes at a time; a line
    longer than max_line_bytes comes alone as a SkippedLine; the stream's last line, when it has
    no newline (and is not empty), comes alone without one. first_line: the number of the
    stream's first line (a span of a file, transforms/line_spans.py); the file's BOM is only
    looked for when it is 1.

    Memory: one chunk, the start of a line not yet ended (at most max_line_bytes) and the
    block made of the two."""
    number = first_line
    rest = b""          # the start of a line whose end has not been read yet
    skipping = False    # inside a line already yielded as a SkippedLine
    at_file_start = first_line == 1
    while True:
        chunk = stream.read(chunk_size)
        if not chunk:
            break
        if at_file_start:
            chunk, at_file_start = _without_bom(chunk, stream, chunk_size), False
        if skipping:
            end = chunk.find(b"\n")
            if end < 0:
                continue
            number += 1
            chunk, skipping = chunk[end + 1:], False
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        block, rest = data[:cut], data[cut:]
        del data, chunk
        if block:
            yield from _without_long_lines(block, number, max_line_bytes)
            number += block.count(b"\n")
        if len(rest) > max_line_bytes:
            yield skipped(max_line_bytes), number
            rest, skipping = b"", True
    if rest:
        yield rest, number


def numbered_lines(block: bytes, first_line: int) -> Iterator[tuple[int, bytes]]:
    """(number, line without its newline) of every line of a line_blocks block, one at a time
    (a block may hold millions of short lines: they are never all held as objects at once)."""
    start, number = 0, first_line
    while start < len(block):
        end = block.find(b"\n", start)
        if end < 0:
            end = len(block)
        yield number, block[start:end]
        start, number = end + 1, number + 1


def _without_bom(chunk: bytes, stream: BinaryIO, chunk_size: int) -> bytes:
    """The stream's first chunk without a leading BOM; a chunk shorter than the BOM that could
    be its start is read on until the BOM is settled (or the stream ends)."""
    while len(chunk) < len(BOM) and BOM.startswith(chunk):
        more = stream.read(chunk_size)
        if not more:
            break
        chunk += more
    return chunk[len(BOM):] if chunk.startswith(BOM) else chunk


def _without_long_lines(block: bytes, first_line: int, limit: int) -> Iterator[tuple[bytes, int]]:
    """The block as (bytes, first line) pieces with every line longer than limit replaced by a
    SkippedLine (only a block longer than limit can hold one). The line ends are found by one
    numpy pass, so a block of many short lines costs no Python step per line."""
    if len(block) <= limit + 1:
        yield block, first_line
        return
    ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n"))
    starts = np.r_[0, ends[:-1] + 1]
    start = 0
    for i in np.flatnonzero(ends - starts > limit).tolist():
        if starts[i] > start:
            yield block[start:starts[i]], first_line + int(np.count_nonzero(ends < start))
        yield skipped(limit), first_line + i
        start = int(ends[i]) + 1
    if start < len(block):
        yield block[start:], first_line + int(np.count_nonzero(ends < start))
