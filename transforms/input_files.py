"""The one door for every file evalbeam reads besides input rows: settings (gate files, sweep
manifests, judge templates, label-name lists), an earlier run's outputs (run.json,
metrics.jsonl, gates.json of a --baseline folder or of `evalbeam report DIR`), and the files
of models (model.onnx, tokenizer.json, config.json).

Rows have their own readers (transforms.io.open_input and schemas.safe_json); these files are
read whole, or line by line, by the launcher before a run starts, so the rules are:
- a local path must be a regular file, checked on the opened descriptor (open with O_NONBLOCK,
  then fstat): a FIFO would block the launcher forever and /dev/zero never ends, and checking
  the path before opening it would let it be swapped in between. A symlink counts as what it
  points to. Object-store URIs (gs://, s3://) name objects, which are always regular;
- at most `limit` bytes are read, whatever the file claims: the size is checked before
  reading, and reading stops at limit + 1 bytes for a file that grows or lies about its size;
- text is strict UTF-8 (a leading byte order mark is dropped, as editors write one);
- parsed TOML and JSON nest at most MAX_NESTING levels (JSON is checked on its bytes before
  parsing; TOML's parser recurses, so its RecursionError is caught and the parsed value's depth
  is checked after), so no later step that walks the value can hit the recursion limit;
- JSON is strict: NaN and Infinity, which evalbeam never writes, and lone UTF-16 surrogates are
  refused.
Every refusal is a FileRefused (an InputError: exit 2 with its one-paragraph message at the
command line) naming what the file was for, the path, and the problem.

The bounds (bytes): see the constants below; each was chosen well above what evalbeam writes or
what the files are in practice, and small enough that reading one costs bounded memory.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
from typing import Iterator

from evalbeam.schemas.lines import BOM, SkippedLine, line_blocks, numbered_lines
from evalbeam.schemas.safe_json import (MAX_NESTING, MAX_ROW_BYTES, fast_value, surrogate_in,
                                         too_deep)

# A gate file, a sweep manifest, a judge template, a --label_names list, a model's config.json:
# hand-written settings of a few KiB (a manifest of 10,000 cells is about 1 MiB).
MAX_SETTINGS_BYTES = 4 << 20
# One output file of an earlier run read whole or record by record: metrics.jsonl (a detection
# run of 1,000 categories with examples writes some tens of MiB), run.json, gates.json,
# comparison.jsonl. Records are held in memory as Python objects (about 5 to 10 times their
# bytes), so 1 GiB of records is some GiB of memory: the most a launcher should take.
MAX_OUTPUT_BYTES = 1 << 30
# A Hugging Face tokenizer.json: large multilingual vocabularies are 10 to 35 MB.
MAX_TOKENIZER_BYTES = 256 << 20
# model.onnx: protobuf caps one ONNX file at 2 GiB (larger models keep their weights in
# external data files, which ONNX Runtime reads itself).
MAX_MODEL_BYTES = 2 << 30


class InputError(Exception):
    """An input that cannot be used at all: the run stops before it starts (exit 2). Defined
    here, the lowest module that raises it; transforms.io re-exports it."""


class FileRefused(InputError):
    """A file that cannot be used: its message is one paragraph for the user; .message too (as
    transforms.io.ReadError has)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class FileMissing(FileRefused, FileNotFoundError):
    """FileRefused for a path where no file is; a FileNotFoundError too, so callers that treat
    "absent" apart catch it as they would from open()."""


def _missing(what: str):
    raise FileMissing(f"{what}: no such file")


def _refuse(what: str, problem: str):
    raise FileRefused(f"{what}: {problem}")


def _size_problem(size: int, limit: int) -> str:
    return (f"it holds {size:,} bytes or more, more than the {limit:,} bytes such a file may have; "
            "is it the right file?")


@contextlib.contextmanager
def open_bounded(path: str, limit: int, what: str | None = None) -> Iterator[io.RawIOBase]:
    """A binary stream of a regular file (local) or an object (a URI) of at most `limit` bytes
    by its size; FileRefused otherwise (no such file, not a regular file, too large, unreadable).
    The stream itself may still be longer than its size said (a file growing while read): the
    readers below stop at limit + 1 bytes."""
    what = what or path
    if "://" in path:
        stream = _open_object(path, limit, what)
    else:
        stream = _open_local(path, limit, what)
    with stream:
        yield stream


def _open_local(path: str, limit: int, what: str):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        _missing(what)
    except IsADirectoryError:
        _refuse(what, "a folder, not a file")
    except OSError as error:
        _refuse(what, f"cannot be opened ({error.strerror or error})")
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            _refuse(what, "a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            _refuse(what, "not a regular file (a pipe, device or socket would block or never "
                          "end); name the file itself")
        if info.st_size > limit:
            _refuse(what, _size_problem(info.st_size, limit))
        # a regular file ignores O_NONBLOCK: reads below block and end as usual
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_object(path: str, limit: int, what: str):
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([path])[0].metadata_list
    except Exception as error:  # each file system raises its own types
        _refuse(what, f"cannot be listed ({type(error).__name__}: {str(error)[:200]})")
    if not found:
        _missing(what)
    if found[0].size_in_bytes > limit:
        _refuse(what, _size_problem(found[0].size_in_bytes, limit))
    try:
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except Exception as error:
        _refuse(what, f"cannot be opened ({type(error).__name__}: {str(error)[:200]})")


class _BoundedReads:
    """A stream's reads, refused (FileRefused) once they have given more than limit bytes in
    all or when one fails."""

    def __init__(self, stream, limit: int, what: str):
        self.stream, self.limit, self.what = stream, limit, what
        self.total = 0

    def read(self, size: int) -> bytes:
        try:
            data = self.stream.read(size)
        except OSError as error:
            _refuse(self.what, f"cannot be read ({error.strerror or error})")
        self.total += len(data)
        if self.total > self.limit:
            _refuse(self.what, _size_problem(self.total, self.limit))
        return data


def read_bytes(path: str, limit: int, what: str | None = None) -> bytes:
    """The whole content of a regular file of at most limit bytes (FileRefused otherwise)."""
    what = what or path
    with open_bounded(path, limit, what) as stream:
        return _BoundedReads(stream, limit, what).read(limit + 1)


def decode_text(data: bytes, what: str) -> str:
    """Strict UTF-8 text of data, its leading byte order mark dropped."""
    if data.startswith(BOM):
        data = data[len(BOM):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        _refuse(what, f"not UTF-8 text ({error.reason} at byte {error.start:,})")


def read_text(path: str, limit: int = MAX_SETTINGS_BYTES, what: str | None = None) -> str:
    """read_bytes, decoded as strict UTF-8 (a leading byte order mark dropped)."""
    what = what or path
    return decode_text(read_bytes(path, limit, what), what)


def depth_of(value) -> int:
    """Nesting depth of lists and dicts in a parsed value (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _too_deep_problem(limit: int) -> str:
    return f"nested deeper than {limit} levels of tables and arrays, far beyond any real settings"


def parse_toml(text: str, what: str, limit: int = MAX_NESTING) -> dict:
    """tomllib.loads(text), or FileRefused for text that is not TOML or nests deeper than
    `limit` levels (tomllib recurses once or more per level, so a few hundred levels raise
    RecursionError inside it; it is caught, and shallower nesting is refused after parsing)."""
    try:
        import tomllib
    except ModuleNotFoundError:    # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except RecursionError:
        _refuse(what, _too_deep_problem(limit))
    except tomllib.TOMLDecodeError as error:
        _refuse(what, f"not valid TOML ({error})")
    if depth_of(data) > limit:
        _refuse(what, _too_deep_problem(limit))
    return data


def load_toml(path: str, limit: int = MAX_SETTINGS_BYTES, what: str | None = None) -> tuple[dict, str]:
    """(parsed TOML, its text) of a settings file, through read_text and parse_toml."""
    what = what or path
    text = read_text(path, limit, what)
    return parse_toml(text, what), text


def _not_finite(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is out of range")
    return value


def json_problem(raw: bytes) -> tuple[object, str | None]:
    """(value, None) for strict JSON text in raw, else (None, why): not UTF-8, nested deeper
    than MAX_NESTING, not JSON, NaN or Infinity or a number out of range, a lone surrogate."""
    if raw.startswith(BOM):
        raw = raw[len(BOM):]
    if too_deep(raw):
        return None, f"JSON nested deeper than {MAX_NESTING} levels"
    # orjson refuses all that json_problem refuses (NaN, Infinity, 1e999, lone surrogates,
    # bytes that are not UTF-8); what it refuses is parsed again below for the reason
    found, value = fast_value(raw)
    if found:
        return value, None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"not UTF-8 text ({error.reason} at byte {error.start:,})"
    try:
        value = json.loads(text, parse_constant=_not_finite, parse_float=_finite_float)
    except RecursionError:   # unreachable after too_deep; kept so no parse can crash
        return None, f"JSON nested deeper than {MAX_NESTING} levels"
    except ValueError as error:
        return None, f"not JSON ({error})"
    where = surrogate_in(raw, value)
    if where is not None:
        return None, f"{where} holds a lone UTF-16 surrogate (not valid Unicode text)"
    return value, None


def load_json(path: str, limit: int = MAX_OUTPUT_BYTES, what: str | None = None):
    """The strict JSON value of a file (json_problem's rules), FileRefused otherwise."""
    what = what or path
    value, problem = json_problem(read_bytes(path, limit, what))
    if problem:
        _refuse(what, problem)
    return value


def iter_lines(path: str, limit: int = MAX_OUTPUT_BYTES, what: str | None = None,
               max_line_bytes: int = MAX_ROW_BYTES) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line without its newline) of each non-blank line of a regular file of
    at most limit bytes, read by schemas.lines.line_blocks (a leading byte order mark dropped);
    a line longer than max_line_bytes refuses the file without being held whole."""
    what = what or path
    with open_bounded(path, limit, what) as stream:
        for block, first in line_blocks(_BoundedReads(stream, limit, what), max_line_bytes, 1 << 20):
            if isinstance(block, SkippedLine):
                _refuse(what, f"line {first:,} is longer than {max_line_bytes:,} bytes")
            for number, line in numbered_lines(block, first):
                if line.strip():
                    yield number, line


def iter_json_lines(path: str, limit: int = MAX_OUTPUT_BYTES, what: str | None = None) -> Iterator[tuple[int, object]]:
    """(line number, strict JSON value) of each non-blank line (iter_lines, json_problem);
    FileRefused naming the first line that is not strict JSON."""
    what = what or path
    for number, line in iter_lines(path, limit, what):
        value, problem = json_problem(line)
        if problem:
            _refuse(what, f"line {number:,} is {problem}" if problem.startswith("not ")
                    else f"line {number:,}: {problem}")
        yield number, value
