"""Where a JSON array document (a COCO results file) can be cut into pieces that parse alone.

A COCO results file is one JSON array of detections, and parsing it whole is serial: one worker
builds the whole tree (a 240 MB file of 2.8 M detections: about 1.5 s and 2 GB of objects, then
2 s more to check its rows). array_pieces scans the bytes once, block by block, with numpy over
the structure bytes only (brackets, braces, quotes and commas), and cuts the array at commas
that separate its elements, about every piece_bytes bytes. Each piece is then parsed on its own,
by any worker, as "[" + its bytes + "]" (the first piece keeps the document's "[", the last its
"]"), and knows the index of its first element in the whole array.

Why the pieces hold the same elements as the whole document: a cut is a comma at depth 1 outside
every string, so each piece holds whole elements, in order. The scan does not check that the
document is valid JSON. It does not need to: if every piece parses to a non-empty array, the
document is those arrays' elements joined by the commas that were cut, which is valid; if the
document is not valid, some piece does not parse or holds no element (two commas in a row, a
trailing comma), and the reader then parses the document whole for its error message.

Escapes: every backslash and the byte after it (the two bytes of an escape inside a string, so
an escaped quote ends no string) are scanned as two neutral bytes, which keeps byte offsets; a
backslash at the end of a block escapes the first byte of the next. Compressed RLE masks hold
backslashes; their quotes are still found exactly.

The scan returns None (read the document whole, as before) when:
- a NUL byte occurs: a UTF-16 or UTF-32 document, which json.loads reads but pieces cut at byte
  offsets would not be (UTF-8 JSON has no raw NUL);
- the first byte after a UTF-8 byte order mark and whitespace is not "[", the array closes before
  its end (more than one document) or never closes, or a bracket closes nothing;
- it nests deeper than max_depth (the whole read names that error);
- the array has fewer than two pieces' worth of elements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from evalbeam.schemas.safe_json import BOM

BLOCK_BYTES = 4 << 20         # bytes scanned at a time: memory stays bounded whatever the file
WHITESPACE = b" \t\n\r"

# an escape: a backslash and the byte after it
ESCAPE = re.compile(rb"\\.", re.DOTALL)
# the depth step of each byte: +1 opens an array or object, -1 closes one
BRACKET_STEP = np.zeros(256, dtype=np.int8)
BRACKET_STEP[list(b"[{")] = 1
BRACKET_STEP[list(b"]}")] = -1
_STRUCTURE = np.zeros(256, dtype=bool)
_STRUCTURE[list(b'[]{}",')] = True


@dataclass(frozen=True)
class ArrayPieces:
    """pieces: [(start, end, index of the piece's first element)], byte ranges in file order.
    The first piece starts at byte 0 (the document's "[" and any byte order mark are in it),
    every other one just after the comma that ends the piece before, and the last ends at the
    end of the document; the commas at cuts belong to no piece. head: the byte range of the
    array's first element (between the "[" and the first separating comma)."""

    pieces: list[tuple[int, int, int]]
    head: tuple[int, int]


def array_pieces(read: Callable[[int], bytes], piece_bytes: int,
                 max_depth: int) -> ArrayPieces | None:
    """The pieces, each about piece_bytes long, of the JSON array document that read(n) returns
    block by block (a file's read), or None when it should be read whole (module docstring)."""
    offset = depth = parity = deepest = separators = 0
    opening = head_end = -1
    closes, closed_at, last_content = 0, -1, -1
    cuts: list[tuple[int, int]] = []      # (byte offset of the comma, index of the next element)
    target = piece_bytes
    first, escaped = True, False
    while True:
        block = read(BLOCK_BYTES)
        if not block:
            break
        if b"\0" in block:
            return None
        if escaped or b"\\" in block:
            block = _neutral_escapes(block, escaped)
            escaped = block.endswith(b"\\")
            if escaped:
                block = block[:-1] + b"_"
        if first:
            body = block[len(BOM):] if block.startswith(BOM) else block
            stripped = body.lstrip(WHITESPACE)
            if not stripped.startswith(b"["):
                return None
            opening = len(block) - len(stripped)
            first = False
        content = len(block.rstrip(WHITESPACE))
        if content:
            last_content = offset + content - 1
        buf = np.frombuffer(block, dtype=np.uint8)
        where = np.flatnonzero(_STRUCTURE[buf])
        if where.size:
            kept = buf[where]
            # inside a string: at or after an odd number of quotes (no backslash: every quote
            # opens or closes one); uint8 sums wrap, the parity survives
            inside = (np.cumsum(kept == ord('"'), dtype=np.uint8) + parity) & 1
            parity = int(inside[-1])
            step = BRACKET_STEP[kept] * (1 - inside).view(np.int8)
            running = depth + np.cumsum(step, dtype=np.int64)
            if running.min() < 0:
                return None                       # a bracket that closes nothing
            deepest = max(deepest, int(running.max()))
            if deepest > max_depth:
                return None
            closing = np.flatnonzero((running == 0) & (step != 0))
            if closing.size:
                closes += closing.size
                closed_at = offset + int(where[closing[-1]])
            separator = offset + where[(kept == ord(",")) & (inside == 0) & (running == 1)]
            if separator.size and head_end < 0:
                head_end = int(separator[0])
            while separator.size and target <= separator[-1]:
                j = int(np.searchsorted(separator, target))
                cuts.append((int(separator[j]), separators + j + 1))
                target = int(separator[j]) + piece_bytes
            separators += separator.size
            depth = int(running[-1])
        offset += len(block)
    # one array, closed by the last byte that is not whitespace
    if closes != 1 or closed_at != last_content or parity or not cuts:
        return None
    starts = [0] + [comma + 1 for comma, _ in cuts]
    ends = [comma for comma, _ in cuts] + [offset]
    firsts = [0] + [element for _, element in cuts]
    return ArrayPieces(list(zip(starts, ends, firsts)), (opening + 1, head_end))


def _neutral_escapes(block: bytes, escaped: bool) -> bytes:
    """block with every escape (a backslash and the byte after it) as "__", and its first byte
    as "_" when the block before ended in an unpaired backslash; a last unpaired backslash is
    left for the caller. The length is the block's."""
    if escaped:
        block = b"_" + block[1:]
    return ESCAPE.sub(b"__", block)


def piece_text(raw: bytes, first: bool, last: bool) -> bytes:
    """The bytes of a piece as a JSON array of its own: "[" before all but the first piece,
    "]" after all but the last; a byte order mark before the first is dropped."""
    if first and raw.startswith(BOM):
        raw = raw[len(BOM):]
    return (b"" if first else b"[") + raw + (b"" if last else b"]")
