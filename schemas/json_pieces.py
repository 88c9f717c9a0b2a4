"""Where a JSON document can be cut into pieces that parse alone: a COCO results file (one JSON
array of detections), or the "annotations" array of a COCO instances file (an object).

Parsing such a file whole is serial: one worker builds the whole tree, in time and memory that
grow with the file, then checks every row. array_pieces
scans the bytes once, block by block, with numpy over the structure bytes only (brackets, braces,
quotes and commas), and cuts the array at commas that separate its elements, about every
piece_bytes bytes. Each piece is then parsed on its own, by any worker, as "[" + its bytes + "]"
(the first piece keeps the array's "[", the last its "]"), and knows the index of its first
element in the whole array.

A member array (array_pieces' member): the scan also keeps the offsets of the top-level strings'
quotes and of the arrays and objects that are top-level values; the member's name is read back
from the file (json.loads of its quoted bytes, so an escaped name is found too), and its array
follows the name's colon. The rest of the document, with that array replaced by "[]", is small
(an instances file's images and categories) and is parsed whole by one worker.

Why the pieces hold the same elements as the whole document: a cut is a comma between the
array's elements, outside every string, so each piece holds whole elements, in order. The scan
does not check that the document is valid JSON. It does not need to: if every piece parses to a
non-empty array, the array is those arrays' elements joined by the commas that were cut, which
is valid (and so is an object document whose rest parses with "[]" in the array's place); if
the document is not valid, some piece (or the rest) does not parse or holds no element (two
commas in a row, a trailing comma), and the reader then parses the document whole for its error
message.

Escapes: every backslash and the byte after it (the two bytes of an escape inside a string, so
an escaped quote ends no string) are scanned as two neutral bytes, which keeps byte offsets; a
backslash at the end of a block escapes the first byte of the next. Compressed RLE masks hold
backslashes; their quotes are still found exactly.

The scan returns None (read the document whole, as before) when:
- a NUL byte occurs: a UTF-16 or UTF-32 document, which json.loads reads but pieces cut at byte
  offsets would not be (UTF-8 JSON has no raw NUL);
- the first byte after a UTF-8 byte order mark and whitespace is not "[" (an array document) or
  "{" (a member's), the document closes before its end (more than one document) or never
  closes, or a bracket closes nothing;
- the member's name is not exactly one of the document's top-level strings (repeated, json.loads
  keeps the last), no array follows it, or the document has more than MAX_MEMBERS arrays and
  objects at the member's depth, or MAX_MEMBERS top-level strings;
- it nests deeper than max_depth (the whole read names that error);
- the array has fewer than two pieces' worth of elements.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

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
# bytes.translate table: 1 for a structure byte, 0 for any other (read as numpy bools)
_STRUCTURE = bytes(int(b in b'[]{}",') for b in range(256))
MAX_MEMBERS = 1024            # arrays and objects at the cut depth; more: read whole
GAP_BYTES = 4096              # most bytes read between a member's name and its "["
_MEMBER_VALUE = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*\[")


@dataclass(frozen=True)
class ArrayPieces:
    """pieces: [(start, end, index of the piece's first element)], byte ranges in file order.
    span: the bytes of the array that was cut: the whole document for an array document (a byte
    order mark and whitespace included), from "[" to "]" for a member's array. The first piece
    starts at span[0], every other one just after the comma that ends the piece before, and the
    last ends at span[1]; the commas at cuts belong to no piece. head: the byte range of the
    array's first element (between the "[" and the first separating comma)."""

    pieces: list[tuple[int, int, int]]
    head: tuple[int, int]
    span: tuple[int, int]


@dataclass
class _Container:
    """An array or object opened at the scanned depth, and the cuts made in it so far."""

    opening: int                  # offset of its "[" or "{"
    is_array: bool
    target: int                   # the next cut: the first separator at or after this offset
    closing: int = -1             # offset of its "]" or "}"
    head_end: int = -1            # offset of its first separator
    count: int = 0                # separators seen
    cuts: list = field(default_factory=list)   # (offset of the comma, index of the next element)

    def separate(self, separator: np.ndarray, piece_bytes: int) -> None:
        """Cut an array at the first of these separators (file offsets, in order) at or after
        each piece_bytes boundary."""
        if not self.is_array:
            return
        if self.head_end < 0:
            self.head_end = int(separator[0])
        while separator.size and self.target <= separator[-1]:
            j = int(np.searchsorted(separator, self.target))
            self.cuts.append((int(separator[j]), self.count + j + 1))
            self.target = int(separator[j]) + piece_bytes
        self.count += separator.size


def array_pieces(stream, piece_bytes: int, max_depth: int,
                 member: str | None = None) -> ArrayPieces | None:
    """The pieces, each about piece_bytes long, of the JSON array document in stream (a binary
    file object, read block by block), or with member, of the array that is the value of the
    top-level member of that name of an object document (a COCO instances file's
    "annotations"; stream must seek too); None when it should be read whole (module
    docstring)."""
    level, opener = (1, b"[") if member is None else (2, b"{")
    offset = depth = parity = deepest = 0
    closes, closed_at, last_content = 0, -1, -1
    containers: list[_Container] = []    # every array or object opened at `level`, in order
    quotes: list[int] = []               # offsets of the quotes of top-level strings
    first, escaped = True, False
    while True:
        block = stream.read(BLOCK_BYTES)
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
            if not body.lstrip(WHITESPACE).startswith(opener):
                return None
            first = False
        content = len(block.rstrip(WHITESPACE))
        if content:
            last_content = offset + content - 1
        buf = np.frombuffer(block, dtype=np.uint8)
        # a C translate and a bool view, cheaper than a numpy lookup table
        where = np.flatnonzero(np.frombuffer(block.translate(_STRUCTURE), dtype=np.bool_))
        if where.size:
            kept = buf[where]
            inside, step = depth_steps(kept, parity)
            parity = int(inside[-1])
            running = depth + np.cumsum(step, dtype=np.int32)   # |sum| <= block size
            if running.min() < 0:
                return None                       # a bracket that closes nothing
            deepest = max(deepest, int(running.max()))
            if deepest > max_depth:
                return None
            closing = np.flatnonzero((running == 0) & (step != 0))
            if closing.size:
                closes += closing.size
                closed_at = offset + int(where[closing[-1]])
            # arrays and objects opening or closing at `level` split the separators among them
            events = np.flatnonzero(((step == 1) & (running == level))
                                    | ((step == -1) & (running == level - 1)))
            if level == 2:
                quoted = offset + where[(kept == ord('"')) & (running == 1)]
                # not the few members of a COCO file: read whole, before holding them all
                if events.size > 2 * MAX_MEMBERS or len(quotes) + quoted.size > 2 * MAX_MEMBERS:
                    return None
                quotes += quoted.tolist()
            separator = np.flatnonzero((kept == ord(",")) & (inside == 0) & (running == level))
            done = 0
            for i in events.tolist() + [kept.size]:
                j = int(np.searchsorted(separator, i))
                if j > done:     # separators at `level` lie in the container open there
                    containers[-1].separate(offset + where[separator[done:j]], piece_bytes)
                done = j
                if i == kept.size:
                    break
                at = offset + int(where[i])
                if step[i] == 1:
                    base = 0 if level == 1 else at     # a piece's bytes count from its start
                    containers.append(_Container(at, kept[i] == ord("["), base + piece_bytes))
                else:
                    containers[-1].closing = at
            if len(containers) > MAX_MEMBERS:
                return None
            depth = int(running[-1])
        offset += len(block)
    # one array or object, closed by the last byte that is not whitespace
    if closes != 1 or closed_at != last_content or parity:
        return None
    if member is None:
        array, span = containers[0], (0, offset)
    else:
        array = _member_array(stream, containers, quotes, member)
        if array is None:
            return None
        span = (array.opening, array.closing + 1)
    if not array.cuts:
        return None
    starts = [span[0]] + [comma + 1 for comma, _ in array.cuts]
    ends = [comma for comma, _ in array.cuts] + [span[1]]
    firsts = [0] + [element for _, element in array.cuts]
    return ArrayPieces(list(zip(starts, ends, firsts)), (array.opening + 1, array.head_end), span)


def depth_steps(structure: np.ndarray, parity: int) -> tuple[np.ndarray, np.ndarray]:
    """(inside, step) of structure bytes uint8[n] (brackets, braces, quotes, maybe commas) with
    no escape among them: inside uint8[n] is 1 at and after an opening quote up to its closing
    one (a running xor of quotes, starting from parity, the inside flag before the first byte);
    step int8[n] is +1 for "[" or "{" and -1 for "]" or "}" outside strings, else 0. A running
    sum of step is the depth after each byte; inside[-1] is the parity to carry on."""
    inside = np.bitwise_xor.accumulate((structure == ord('"')).view(np.uint8)) ^ parity
    return inside, BRACKET_STEP[structure] * (1 - inside).view(np.int8)


def _member_array(stream, containers: list[_Container], quotes: list[int],
                  name: str) -> _Container | None:
    """The array that is the value of the top-level member `name`, from the quotes of the
    top-level strings; None unless exactly one top-level string is `name` (json.loads keeps the
    last of repeated members: a document that repeats it is read whole) and an array follows
    its colon."""
    longest = 6 * len(name) + 2        # its quotes and every character escaped (\uXXXX)
    named = []
    for opening, closing in zip(quotes[::2], quotes[1::2]):
        if closing - opening < longest:
            stream.seek(opening)
            try:
                text = json.loads(stream.read(closing - opening + 1))
            except ValueError:
                return None
            if text == name:
                named.append(closing + 1)
    if len(named) != 1:
        return None
    stream.seek(named[0])
    value = _MEMBER_VALUE.match(stream.read(GAP_BYTES))
    if value is None:
        return None
    opening = named[0] + value.end() - 1
    return next((c for c in containers if c.opening == opening and c.is_array), None)


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
