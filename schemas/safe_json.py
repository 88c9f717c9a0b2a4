"""Untrusted JSON rows, parsed so that one hostile row costs bounded work and never crashes a run.

What a row may not do, and what each reader does instead (reject the row with the reason):
- nest deeper than MAX_NESTING levels. Rows of every task are at most about 8 levels deep
  (a multipolygon inside an annotation inside a row); Python's json raises RecursionError near
  1,000 levels and Arrow's JSON reader overflows its stack (a segfault) near 20,000, so depth is
  checked on the raw bytes before either parser sees them;
- be longer than the reader's line limit (schemas.lines: the rest of the line is skipped, not
  held in memory);
- hold a lone UTF-16 surrogate (`"\\ud800"`): valid JSON, but not text, so it could be neither
  written to UTF-8 outputs nor matched by the regular expressions of the rule metrics;
- start with a UTF-8 byte order mark (BOM) anywhere but at byte 0 of its file. The readers drop
  the file's own BOM before any line is parsed (schemas.lines.line_blocks, under iter_lines and
  schemas.formats.jsonl_blocks; schemas.retrieval_rows), so whether a line is a row never
  depends on how the file is split; a BOM further on (files that each had one, joined) is a
  bad row (BOM_REASON);
- slice on a value that is not finite (NaN, Infinity): JSON outputs cannot carry it
  (slice_value_problem), or on a value longer than MAX_SLICE_CHARS characters as JSON
  (schemas/limits.py: every record of the slice would carry it).

All checks are pure functions of bytes or parsed values; nothing here imports Beam.
"""

from __future__ import annotations

import json
import math
import re
from typing import BinaryIO, Iterator

import numpy as np

try:
    import orjson
except ImportError:   # an optional speed-up: json.loads gives the same values
    orjson = None

from evalbeam.schemas.lines import BOM, SkippedLine, line_blocks, numbered_lines
from evalbeam.schemas.slices import slice_length_problem

MAX_NESTING = 64
# The longest input line a reader holds in memory; a longer one is rejected as a row (and
# skipped without being read into memory whole).
MAX_ROW_BYTES = 64 << 20
BOM_REASON = ("the line starts with a UTF-8 byte order mark (U+FEFF), which is dropped only at "
              "the start of a file (were files that each had one joined together?)")
_OPEN = (ord("{"), ord("["))
_CLOSE = (ord("}"), ord("]"))
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def nesting_depth(raw: bytes) -> int:
    """Deepest nesting of objects and arrays in one line of JSON text, brackets inside strings
    not counted (a quote preceded by an odd run of backslashes is escaped). For text that is not
    valid JSON the number is still defined and bounded by the count of opening brackets."""
    buf = np.frombuffer(raw, dtype=np.uint8)
    if not buf.size:
        return 0
    backslash = buf == ord("\\")
    index = np.arange(buf.size)
    # length of the run of backslashes ending just before each position
    last_other = np.maximum.accumulate(np.where(backslash, -1, index))
    run_before = np.r_[0, (index - last_other)[:-1]]
    quote = (buf == ord('"')) & (run_before % 2 == 0)
    inside = (np.cumsum(quote) - quote) % 2 == 1       # strictly inside a string
    step = np.zeros(buf.size, dtype=np.int64)
    step[np.isin(buf, _OPEN) & ~inside] = 1
    step[np.isin(buf, _CLOSE) & ~inside] = -1
    return int(max(0, np.cumsum(step).max()))


# brackets of both kinds as one (nesting_depth counts them alike) and quotes kept, all else dropped
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b'[]{}"')


def too_deep(raw: bytes, limit: int = MAX_NESTING) -> bool:
    """True when the line nests deeper than limit (nesting_depth(raw) > limit). Counting
    opening brackets first (a C-speed scan) settles most lines: depth can never exceed their
    number. A line with more (a detection row: a few brackets per box) and no backslash is cut
    down to its brackets outside strings (without escapes a string holds no quote), all of one
    kind, and peeled: each replace() of "[]" removes the pairs with nothing inside, so a
    well-nested line is gone after as many passes as it is deep. That answers "not too deep" in
    C-speed passes, where nesting_depth takes several numpy passes over every byte; anything else (a backslash, unbalanced brackets, more than limit passes) goes to
    nesting_depth, so the answer is always nesting_depth's, and the passes are bounded by
    limit."""
    if raw.count(b"{") + raw.count(b"[") <= limit:
        return False
    if b"\\" not in raw:
        # every other piece between quotes is outside strings (after an unpaired last quote
        # nothing is, as nesting_depth counts it)
        shape = b"".join(raw.translate(_ONE_KIND, _NOT_BRACKETS).split(b'"')[0::2])
        for _ in range(limit):
            if not shape:
                return False
            peeled = shape.replace(b"[]", b"")
            if len(peeled) == len(shape):
                break                         # unbalanced: nesting_depth decides
            shape = peeled
        if not shape:
            return False
    return nesting_depth(raw) > limit


def lone_surrogate(value) -> str | None:
    """Where a parsed JSON value holds a lone surrogate ("the value of 'response'"), or None."""
    stack = [(value, "the row")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            for key, inner in item.items():
                if _LONE_SURROGATE.search(key):
                    return f"a key of {where}"
                stack.append((inner, f"the value of {key!r}"))
        elif isinstance(item, list):
            stack.extend((inner, where) for inner in item)
    return None


def surrogate_reason(where: str) -> str:
    """The rejection reason of a row whose text at `where` (see lone_surrogate) holds a lone
    surrogate."""
    return (f"{where} holds a lone UTF-16 surrogate (an escape such as \\ud800 without its "
            "pair): not valid Unicode text")


# Every byte as "1" (a digit) or "0": an integer of 19 digits or more may lie outside what orjson
# reads as an integer (below -2**63 or above 2**64 - 1), and orjson reads it as a float. (A
# translate and a substring search: C speed, unlike a regex.)
_DIGIT_MAP = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_LONG_DIGITS = b"1" * 19


def fast_value(raw: bytes) -> tuple[bool, object]:
    """(True, the value) when orjson reads raw and gives the value json.loads would: the same
    correctly rounded floats, the same last-key-wins objects; else (False, None), for whatever
    orjson refuses (NaN, lone surrogates, broken JSON, or orjson not installed) or might read
    differently (a run of 19 digits or more: -9223372036854775809 is a float to orjson, an int
    to json). orjson is the faster parser (tests/benchmarks/README.md, "Measurements behind the
    design"); json.loads stays the reference, whose values and errors the callers expect."""
    if orjson is not None and _LONG_DIGITS not in raw.translate(_DIGIT_MAP):
        try:
            return True, orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return False, None


def json_value(raw: bytes, text: str | None = None):
    """json.loads(text) (json.loads(raw) without text), by orjson when it gives the same value
    (fast_value). text, the strict UTF-8 decoding of raw, keeps json.loads from guessing an
    encoding (bytes that start with NUL bytes would be read as UTF-16 or UTF-32)."""
    found, value = fast_value(raw)
    if found:
        return value
    return json.loads(raw if text is None else text)


def surrogate_in(raw: bytes, value) -> str | None:
    """Where the parsed value of the JSON text raw holds a lone surrogate (lone_surrogate), or
    None. Only an escape (\\uD800 to \\uDFFF) in the text can make one, so the value is
    walked only when the bytes hold such an escape: rows almost never do."""
    return lone_surrogate(value) if SURROGATE_ESCAPE.search(raw) else None


def loads_row(raw: bytes | str, limit: int = MAX_NESTING):
    """Parse one untrusted JSON line: (value, None), or (None, reason) for a line that starts
    with a byte order mark (the reader has dropped the file's own), is not UTF-8 or not JSON,
    nests deeper than `limit`, or holds a lone surrogate. Blank input is not a row; the callers
    skip it before.

    The bytes are decoded strictly first: json.loads(bytes) decodes with "surrogatepass", which
    lets the UTF-8 form of a surrogate (ED A0 80) through as a lone surrogate."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if raw.startswith(BOM):
        return None, BOM_REASON
    if too_deep(raw, limit):
        return None, f"JSON nested deeper than {limit} levels"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"not valid UTF-8 text ({error.reason} at byte {error.start})"
    try:
        value = json_value(raw, text)
    except RecursionError:   # unreachable after too_deep; kept so no parse can ever crash
        return None, f"JSON nested deeper than {limit} levels"
    except ValueError as error:
        return None, f"malformed JSON: {error}"
    where = surrogate_in(raw, value)
    if where is not None:
        return None, surrogate_reason(where)
    return value, None


def slice_value_problem(key: str, value) -> str | None:
    """Why a metadata value cannot name a slice, or None: it holds NaN or an infinity (JSON
    outputs cannot carry them; checked first), or its canonical JSON is longer than
    MAX_SLICE_CHARS characters (schemas.slices.slice_length_problem: every record of the slice
    would carry it). Strings, finite numbers, booleans, null, lists and objects of them are fine
    within that length."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return (f"metadata {key!r} is {item!r}: a slice value must be a string, a finite "
                    "number, a boolean or null")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return slice_length_problem(key, value)


def metadata_problem(metadata, keys) -> str | None:
    """The first slice_value_problem of the values of the --slice `keys` in a row's metadata, or
    None; metadata that is not an object holds no values (each is None, which is fine)."""
    if not isinstance(metadata, dict):
        return None
    return next(filter(None, (slice_value_problem(k, metadata.get(k)) for k in keys)), None)


def iter_lines(stream: BinaryIO, max_line_bytes: int, chunk_size: int = 8 << 20,
               first_line: int = 1) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line bytes without the newline) of every line of a stream, blank ones
    included; None instead of the bytes for a line longer than max_line_bytes, which is never
    held in memory. The reader is schemas.lines.line_blocks (the file's byte order mark dropped;
    first_line: the number of the stream's first line, a span of a file)."""
    for block, number in line_blocks(stream, max_line_bytes, chunk_size, first_line):
        if isinstance(block, SkippedLine):
            yield number, None
        else:
            yield from numbered_lines(block, number)
