"""Input formats: which format a file is in, and JSONL split into blocks of lines, safely.

JSONL is read a block of whole lines at a time (jsonl_blocks); a task's rows module turns each
block into a normalised table (schemas.arrow_tables), e.g. schemas.classification_rows.parse_jsonl_block
with Arrow's multi-threaded JSON reader. Arrow must never see a line nested deeper than
schemas.safe_json.MAX_NESTING (its reader overflows its stack, a segfault, near 20,000 levels):
deep_lines measures every line of a block first, so that a block with such a line is parsed the
slow way. A line longer than the reader's limit is never held in memory: jsonl_blocks skips it
(a SkippedLine) and the block's parser rejects it.
"""

from __future__ import annotations

from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa

from evalbeam.schemas.lines import BOM, SkippedLine, line_blocks
from evalbeam.schemas.safe_json import MAX_NESTING, MAX_ROW_BYTES

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.gz", ".ndjson.gz", ".json.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")
WHITESPACE = np.array([ord(c) for c in " \t\r\n"], dtype=np.uint8)


def format_of(path: str) -> str | None:
    """'jsonl', 'parquet' or None, from the file name."""
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return None


def position_name(path: str) -> str:
    """How rows of this file are located in rejected.jsonl: "row" (0-based) for Parquet, else
    "line" (1-based)."""
    return "row" if format_of(path) == "parquet" else "line"


def jsonl_blocks(stream: BinaryIO, block_size: int = 16 << 20, max_line_bytes: int | None = None,
                 first_line: int = 1) -> Iterator[tuple[bytes, int]]:
    """Split a stream into blocks of whole lines: yields (bytes, number of the block's first line),
    every block ending in a newline. The reader is schemas.lines.line_blocks (its rules: a line
    longer than max_line_bytes, default schemas.safe_json.MAX_ROW_BYTES, comes alone as a
    SkippedLine and is never held in memory; the file's byte order mark is dropped); a last line
    without a newline gets one, and is left out when blank. first_line: the number of the
    stream's first line (a span of a file, transforms/line_spans.py).

    A line after the first that starts with a byte order mark is a bad row
    (schemas.safe_json.loads_row), but Arrow's JSON reader drops a BOM at the start of its
    buffer: a block that starts with such a line is yielded with a blank line before it (and a
    first line one lower), so that the reader refuses the block and it is parsed line by line,
    as it is wherever else the line falls."""
    if max_line_bytes is None:
        max_line_bytes = MAX_ROW_BYTES
    for block, line in line_blocks(stream, max_line_bytes, block_size, first_line):
        if isinstance(block, SkippedLine):
            yield block, line
        elif block.endswith(b"\n"):
            yield _bom_inside(block, line)
        elif block.strip():
            yield _bom_inside(block + b"\n", line)


def _bom_inside(block: bytes, line: int) -> tuple[bytes, int]:
    """(block, first line), or for a block that starts with a byte order mark a blank line then
    the block (see jsonl_blocks)."""
    return (b"\n" + block, line - 1) if block.startswith(BOM) else (block, line)


# Bytes that shape the nesting of JSON text: _exactly_deep drops every other byte at C speed.
_STRUCTURE = b'{[}]"\n'
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(_STRUCTURE)))


def scan_lines(block: bytes, piece: int = 1 << 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(block as uint8, offset of each line's end, opening brackets '{' '[' per line).

    One numpy pass over 1 MiB pieces finds newlines and opening brackets together (cache-sized
    pieces, no temporary as large as the block): about as cheap as finding the newlines alone,
    which the reader needs anyway. A last line without a newline ends at the block's end."""
    buf = np.frombuffer(block, dtype=np.uint8)
    size = min(piece, buf.size)
    folded, hit, newline = (np.empty(size, dtype=np.uint8), np.empty(size, dtype=bool),
                            np.empty(size, dtype=bool))
    found = [np.zeros(0, dtype=np.int64)]
    for start in range(0, buf.size, piece):
        part = buf[start:start + piece]
        n = part.size
        np.bitwise_or(part, 0x20, out=folded[:n])           # '[' | 0x20 is '{'
        np.equal(folded[:n], ord("{"), out=hit[:n])
        np.equal(part, ord("\n"), out=newline[:n])
        np.logical_or(hit[:n], newline[:n], out=hit[:n])
        found.append(np.flatnonzero(hit[:n]) + start)
    found = np.concatenate(found)
    is_end = np.flatnonzero(buf[found] == ord("\n"))       # indices into found
    ends = found[is_end]
    if buf.size and buf[-1] != ord("\n"):
        ends = np.r_[ends, buf.size]
        is_end = np.r_[is_end, found.size]
    per_line = np.diff(np.r_[-1, is_end]) - 1               # brackets between line ends
    return buf, ends, per_line


def deep_lines(block: bytes, limit: int = MAX_NESTING, scanned=None) -> np.ndarray:
    """0-based indices of the lines of `block` that nest deeper than `limit`, by the rule of
    schemas.safe_json.nesting_depth (brackets inside strings do not count; a quote after an odd
    run of backslashes is escaped), for a whole block at once. `scanned`: scan_lines(block).

    Depth never exceeds the count of opening brackets, so the count per line settles normal rows
    (a few brackets each); only lines with more than `limit` opening brackets (rows with many
    labels, or hostile ones) are measured exactly."""
    _, ends, per_line = scan_lines(block) if scanned is None else scanned
    candidates = np.flatnonzero(per_line > limit)
    if not candidates.size:
        return candidates
    if 2 * candidates.size > ends.size:    # most lines (wide rows): measure the block as it is
        text = block if block.endswith(b"\n") else block + b"\n"
        return _exactly_deep(text, limit)
    starts = np.r_[0, ends[:-1] + 1]
    text = b"\n".join(block[starts[i]:ends[i]] for i in candidates.tolist()) + b"\n"
    return candidates[_exactly_deep(text, limit)]


def _exactly_deep(text: bytes, limit: int) -> np.ndarray:
    """Indices of the lines of `text` (each ending in a newline) nesting deeper than limit.

    Byte passes at C speed reduce the text to its structure: escaped backslashes and escaped
    quotes go first (escapes pair from the left, as in JSON), then every byte but brackets,
    quotes and newlines. A bracket is inside a string when an odd number of quotes precede it
    on its line; as the structure holds only quotes, brackets and newlines, the quotes before the
    k-th other byte, at offset p, number p - k: numpy works on brackets and newlines only. When
    every line has an even number of quotes and returns to depth 0 (valid rows), counts over the
    whole text are the per-line counts; otherwise each line's counts are taken from its start."""
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = np.frombuffer(text.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    offset = np.flatnonzero(structure != ord('"'))
    kind = structure[offset]
    quotes_before = offset - np.arange(offset.size)
    line_end = np.flatnonzero(kind == ord("\n"))
    folded = kind | 0x20
    opening, closing = folded == ord("{"), folded == ord("}")
    if not (quotes_before[line_end] & 1).any():
        outside = (quotes_before & 1) == 0
        depth = np.cumsum((opening & outside).astype(np.int64) - (closing & outside))
        if not depth[line_end].any():
            return np.unique(np.searchsorted(line_end, np.flatnonzero(depth > limit)))
    line = np.searchsorted(line_end, np.arange(offset.size))       # the line of each byte
    outside = ((quotes_before - np.r_[0, quotes_before[line_end]][line]) & 1) == 0
    depth = np.cumsum((opening & outside).astype(np.int64) - (closing & outside))
    depth -= np.r_[0, depth[line_end]][line]
    return np.unique(line[depth > limit])


def nonblank_line_numbers(block: bytes, first_line: int, scanned=None) -> np.ndarray:
    """Line numbers of the lines of `block` (ending in newline) that hold a non-space byte.
    `scanned`: scan_lines(block)."""
    buf, ends, _ = scan_lines(block) if scanned is None else scanned
    if not ends.size:
        return np.zeros(0, dtype=np.int64)
    starts = np.r_[0, ends[:-1] + 1]
    # A line that starts with a non-space byte is not blank: the usual case, decided by one
    # look at each line's first byte instead of a scan of every byte.
    if starts[-1] < buf.size and not np.isin(buf[starts], WHITESPACE).any():
        return first_line + np.arange(ends.size)
    solid = np.r_[0, np.cumsum(~np.isin(buf, WHITESPACE))]   # solid bytes before each offset
    per_line = solid[ends] - solid[starts]
    return first_line + np.flatnonzero(per_line > 0)


def is_utf8(data: bytes) -> bool:
    """Whether bytes are valid UTF-8 (encoded surrogates are not): ASCII, the usual case, is
    settled by one C-speed scan, other text by Arrow's vectorised validation (faster than
    Python's decoder, and it builds no string)."""
    if data.isascii():
        return True
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64).tobytes())
    text = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)])
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def not_utf8_reason(data: bytes, what: str = "the line") -> str | None:
    """Why bytes are not UTF-8 text, or None. Python's json parses bytes with the surrogatepass
    handler, so the UTF-8 form of a lone surrogate (ED A0 80) would pass it: checked here."""
    if data.isascii():
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        return (f"{what} holds text that is not valid UTF-8 ({error.reason} at byte "
                f"{error.start})")
    return None
