"""The pieces every reader uses on untrusted input: schemas.safe_json (depth, surrogates, slice
values, bounded lines) and transforms.io.open_input (strict decompression, regular files only)."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import zlib

import pytest

from evalbeam.schemas.safe_json import (BOM, BOM_REASON, iter_lines, loads_row,
                                         lone_surrogate, nesting_depth, slice_value_problem,
                                         too_deep)
from evalbeam.transforms.io import ReadError, open_input, parse_rows


def naive_depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((naive_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((naive_depth(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize("text", [
    '{"a": [1, 2, {"b": []}]}', '[]', '"just a string"', '3', '{"s": "[[[[{{{{"}',
    '{"s": "]]]]}}}}", "t": [[[[1]]]]}', '{"q": "a \\" [ quote", "r": [[2]]}',
    '{"bs": "\\\\", "x": [[[]]]}', '{"bs": "\\\\\\"[[[[", "x": [1]}',
])
def test_nesting_depth_ignores_brackets_inside_strings(text):
    assert nesting_depth(text.encode()) == naive_depth(json.loads(text))


@pytest.mark.parametrize("seed", range(4))
def test_too_deep_answers_as_nesting_depth_does(seed):
    """too_deep's peeling shortcut (lines of many brackets and no backslash) gives
    nesting_depth's answer on every line: random bytes of brackets, quotes and backslashes
    (unbalanced, unpaired quotes, mixed kinds) and random JSON documents, at several limits."""
    import random

    rng = random.Random(seed)
    alphabet = list(b'[]{}"\\a,: ')
    for _ in range(5_000):      # x 4 seeds x 5 limits: 100,000 checks (20,000 took 30 s a seed)
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.6:
            raw = raw.replace(b"\\", b"")
        for limit in (0, 1, 2, 3, 5):
            assert too_deep(raw, limit) == (nesting_depth(raw) > limit), (raw, limit)

    def document(depth):
        if depth == 0:
            return rng.choice([1, "x[", "]{", None, '"'])
        if rng.random() < 0.5:
            return [document(depth - 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}": document(depth - 1) for i in range(rng.randint(0, 3))}

    for _ in range(500):
        raw = json.dumps(document(rng.randint(0, 12))).encode()
        for limit in (0, 1, 3, 6, 10):
            assert too_deep(raw, limit) == (nesting_depth(raw) > limit), (raw, limit)



@pytest.mark.parametrize("seed", range(4))
def test_json_value_is_json_loads(seed):
    """safe_json.json_value (orjson when it gives the same value) against json.loads: integers
    of 17 to 25 digits of both signs (orjson reads some of 19 and 20 digits as floats), long
    floats, NaN and Infinity, surrogates, duplicate keys, broken JSON, NUL bytes."""
    import math
    import random

    from evalbeam.schemas.safe_json import json_value

    rng = random.Random(seed)

    def token():
        kind = rng.randrange(8)
        if kind == 0:
            digits = rng.randint(17, 25)
            return rng.choice(["", "-"]) + str(rng.randint(1, 9)) + "".join(
                str(rng.randrange(10)) for _ in range(digits - 1))
        if kind == 1:
            return rng.choice(["9223372036854775807", "9223372036854775808", "-9223372036854775808",
                               "-9223372036854775809", "18446744073709551615", "18446744073709551616"])
        if kind == 2:
            return "0." + "".join(str(rng.randrange(10)) for _ in range(rng.randint(1, 30)))
        if kind == 3:
            return rng.choice(["NaN", "Infinity", "-Infinity", "1e400", "-0", "1E5", "tru"])
        if kind == 4:
            return rng.choice(['"\\ud800"', '"\\ud83d\\ude00"', '"a\\u0000b"', '"\\/"'])
        if kind == 5:
            return '{"k": 1, "k": ' + str(rng.randrange(9)) + "}"
        return str(rng.randrange(-1000, 1000))

    def same(a, b):
        if isinstance(a, float) and math.isnan(a):
            return isinstance(b, float) and math.isnan(b)
        return type(a) is type(b) and (a == b if not isinstance(a, list)
                                       else len(a) == len(b) and all(map(same, a, b)))

    for _ in range(500):
        raw = ("[" + ", ".join(token() for _ in range(rng.randint(1, 5))) + "]").encode()
        try:
            expected = json.loads(raw.decode())
        except ValueError:
            with pytest.raises(ValueError):
                json_value(raw, raw.decode())
            continue
        assert same(json_value(raw, raw.decode()), expected), raw
    # bytes json.loads would decode as UTF-32: with the text, they are not JSON
    with pytest.raises(ValueError):
        json_value("[1]".encode("utf-32-be"), "[1]".encode("utf-32-be").decode())


def test_an_id_just_below_int64_is_named_as_such_in_coco_files():
    """-9223372036854775809 has 19 digits: orjson would read it as a float ("must be an
    integer"); json reads the integer, which does not fit int64."""
    from evalbeam.schemas.coco_rows import box_rows, coco_document

    rows, reason = coco_document(b'[{"image_id": -9223372036854775809, "category_id": 1, '
                                 b'"bbox": [1, 2, 3, 4], "score": 0.5}]')
    assert reason is None and rows[0]["image_id"] == -9223372036854775809
    assert box_rows(rows, True, False)[1] == [
        (0, "image_id -9223372036854775809 does not fit a 64-bit integer")]

def test_hostile_depths_are_rejected_before_any_parser():
    for depth in (65, 2_000, 100_000):
        raw = ("[" * depth + "]" * depth).encode()
        assert too_deep(raw)
        value, reason = loads_row(raw)
        assert value is None and "nested deeper than 64" in reason
    # closing brackets hidden in a string do not hide the real nesting that follows
    raw = ('{"x": "' + "]" * 5000 + '", "y": ' + "[" * 5000 + "]" * 5000 + "}").encode()
    assert nesting_depth(raw) == 5001 and loads_row(raw)[0] is None
    ok = ('{"labels": [' + ", ".join(['{"k": [1, 2]}'] * 500) + "]}").encode()
    assert not too_deep(ok) and loads_row(ok)[1] is None     # many brackets, shallow


def test_lone_surrogates_are_rejected_and_pairs_are_text():
    value, reason = loads_row(b'{"response": "ok \\ud800 then"}')
    assert value is None and "'response'" in reason and "surrogate" in reason
    value, reason = loads_row(b'{"response": "smile \\ud83d\\ude00"}')
    assert reason is None and value["response"] == "smile \U0001F600"
    assert lone_surrogate({"a": ["x", {"b": "\udfff"}]}) == "the value of 'b'"
    assert lone_surrogate({"\ud800": 1}) == "a key of the row"
    # a BOM is dropped by the reader at byte 0 of a file only: one that starts a line is a bad row
    assert loads_row(BOM + b'{"a": 1}') == (None, BOM_REASON)
    assert loads_row('{"a": "\ufeffkept"}') == ({"a": "\ufeffkept"}, None)     # inside a string: text


def test_slice_values_must_be_finite():
    assert slice_value_problem("r", "north") is None
    assert slice_value_problem("r", {"a": [1, 2.5, None, True]}) is None
    assert "NaN" in slice_value_problem("r", float("nan")) or "nan" in slice_value_problem("r", float("nan"))
    assert "inf" in slice_value_problem("r", [1, float("-inf")])
    assert loads_row(b'{"metadata": {"r": NaN}}')[0]["metadata"]["r"] != 0   # parsed; checked later


def test_iter_lines_bounds_a_line_without_holding_it():
    lines = [b"a" * 10, b"b" * 5000, b"", b"c" * 7, b"d" * 3000]
    data = b"\n".join(lines)                       # the last line has no newline
    for chunk in (1, 7, 64, 1 << 20):
        out = list(iter_lines(io.BytesIO(data), 100, chunk_size=chunk))
        assert out == [(1, b"a" * 10), (2, None), (3, b""), (4, b"c" * 7), (5, None)], chunk


def test_every_line_reader_is_a_view_of_one_reader(tmp_path):
    """schemas.lines.line_blocks under iter_lines, jsonl_blocks and input_files.iter_lines: the
    same lines with the same numbers, a long line in the same place, and the file's byte order
    mark dropped whatever the read size (a read shorter than the mark too)."""
    from evalbeam.schemas.formats import jsonl_blocks
    from evalbeam.schemas.lines import SkippedLine
    from evalbeam.transforms.input_files import FileRefused, iter_lines as file_lines

    lines = [b'{"a": 1}', b"", b"x" * 150, b"  ", BOM + b'{"b": 2}', b'{"c": 3}']
    data = BOM + b"\n".join(lines)                  # the last line has no newline
    expected = [(1, lines[0]), (2, b""), (3, None), (4, b"  "), (5, lines[4]), (6, lines[5])]
    for chunk in (1, 2, 3, 5, 64, 1 << 20):
        assert list(iter_lines(io.BytesIO(data), 100, chunk_size=chunk)) == expected, chunk
        blocks = list(jsonl_blocks(io.BytesIO(data), chunk, max_line_bytes=100))
        numbered = sorted((first + i, line) for block, first in blocks if not isinstance(block, SkippedLine)
                          for i, line in enumerate(block.split(b"\n")[:-1]))
        skipped = [first for block, first in blocks if isinstance(block, SkippedLine)]
        assert skipped == [3], chunk
        # a block that starts with a BOM gets a blank line before it, numbered one lower
        assert [item for item in numbered if item[1].strip()] == [(1, lines[0]), (5, lines[4]),
                                                                 (6, lines[5])], chunk
    path = tmp_path / "lines.jsonl"
    path.write_bytes(data)
    with pytest.raises(FileRefused, match="line 3 is longer than 100 bytes"):
        list(file_lines(str(path), max_line_bytes=100))
    path.write_bytes(data.replace(b"x" * 150, b"x"))
    assert list(file_lines(str(path), max_line_bytes=100)) == [
        (1, lines[0]), (3, b"x"), (5, lines[4]), (6, lines[5])]


def test_a_file_with_two_long_lines_is_refused_for_the_first(tmp_path):
    """input_files.iter_lines names the first line too long, wherever the reads end (before the
    one reader, a read that ended inside a long line named that line before the earlier ones)."""
    from evalbeam.transforms.input_files import FileRefused, iter_lines as file_lines

    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"y" * 50 + b"\n{}\n" + b"z" * 50)
    with pytest.raises(FileRefused, match="line 2 is longer than 20 bytes"):
        list(file_lines(str(path), max_line_bytes=20))


COMPRESSORS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
               ".deflate": zlib.compress}


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_open_input_refuses_truncated_compressed_files(tmp_path, suffix):
    data = b"".join(b'{"datum_uid": "d%d"}\n' % i for i in range(20_000))
    whole = COMPRESSORS[suffix](data)
    (tmp_path / f"whole.jsonl{suffix}").write_bytes(whole)
    with open_input(str(tmp_path / f"whole.jsonl{suffix}")) as stream:
        assert stream.read() == data
    (tmp_path / f"cut.jsonl{suffix}").write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(ReadError, match="does not end as a complete compressed file"):
        with open_input(str(tmp_path / f"cut.jsonl{suffix}")) as stream:
            while stream.read(1 << 16):
                pass


def test_open_input_refuses_pipes_and_devices(tmp_path):
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        with pytest.raises(ReadError, match="not a regular file"):
            open_input(path)
    with pytest.raises(ReadError, match="cannot open"):
        open_input(str(tmp_path / "absent.jsonl"))


def test_parquet_rows_with_invalid_utf8_are_rejected_alone(tmp_path):
    """Arrow reads Parquet strings without checking UTF-8; the bytes of a lone surrogate made
    parse_rows raise UnicodeDecodeError (a traceback, exit 3) for the whole file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from evalbeam.transforms.io import parse_rows

    text = pa.array([b"good", b"\xed\xa0\x80 bad", b"fine"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"datum_uid": ["a", "b", "c"], "response": text}), tmp_path / "t.parquet")
    rows, positions, rejected = parse_rows(str(tmp_path / "t.parquet"))
    assert [r["datum_uid"] for r in rows] == ["a", "c"] and positions == [0, 2]
    assert len(rejected) == 1 and rejected[0][0] == 1 and "not valid UTF-8" in rejected[0][2]


def test_the_utf8_form_of_a_surrogate_is_not_text():
    """json.loads(bytes) decodes with surrogatepass: ED A0 80 became a lone surrogate."""
    value, reason = loads_row(b'{"response": "\xed\xa0\x80"}')
    assert value is None and "not valid UTF-8" in reason
    value, reason = loads_row(b'{"response": "caf\xc3\xa9"}')
    assert reason is None and value["response"] == "caf\u00e9"


def test_a_bom_is_dropped_at_byte_0_of_a_jsonl_file_only_however_it_is_split(tmp_path):
    """Before the fix loads_row dropped a BOM at the start of any line, so a line 3 that starts
    with one (files that each had one, joined) was a row. Now the file's own BOM (byte 0) is
    dropped and line 3 is rejected, the same for every split of the file into two spans."""
    lines = [BOM + b'{"id": 1}', b'{"id": 2}', BOM + b'{"id": 3}', b"{bad", BOM + BOM + b'{"id": 5}']
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / "rows.jsonl"
    path.write_bytes(data)
    expected = ([1, 2], [(3, BOM_REASON), (4, "malformed JSON"), (5, BOM_REASON)])
    assert [line for line, _ in iter_lines(io.BytesIO(data), 100)] == [1, 2, 3, 4, 5]
    for cut in [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")][:-1]:
        first = 1 + data.count(b"\n", 0, cut)
        spans = [(0, cut, 1), (cut, len(data), first)] if cut else [(0, None, 1)]
        ids, rejected = [], []
        for span in spans:
            rows, _, bad = parse_rows(str(path), span=span)
            ids += [row["id"] for row in rows]
            rejected += [(line, reason.split(":")[0]) for line, _, reason in bad]
        assert (ids, rejected) == expected, cut


def test_a_bom_line_inside_a_block_is_a_bad_row_on_the_arrow_fast_paths(monkeypatch):
    """Arrow's JSON reader drops a BOM at the start of each of its own inner blocks (4 MiB in
    the readers), not only of its buffer: a line 3 that starts with one was a row of the
    classification and retrieval fast paths when it began an inner block. Inner blocks of 64
    bytes make every line begin one; the block goes to the line-by-line reader, which rejects
    the line."""
    import pyarrow.json as pajson

    from evalbeam.schemas.classification_rows import CLASSIFICATION_GROUNDTRUTH, parse_jsonl_block
    from evalbeam.schemas.retrieval_rows import parse_qrels

    options = pajson.ReadOptions
    monkeypatch.setattr(pajson, "ReadOptions", lambda **kw: options(**{**kw, "block_size": 64}))
    qrels = [json.dumps({"query_id": f"q{i}", "doc_id": "d", "relevance": 1}).encode()
             for i in range(5)]
    labels = [json.dumps({"datum_uid": f"d{i}", "labels": [{"key": "k", "value": "v"}]}).encode()
              for i in range(5)]
    for rows in (qrels, labels):
        rows[2] = BOM + rows[2]
    columns, rejects = parse_qrels(b"\n".join(qrels) + b"\n", "jsonl")
    assert columns.query.to_pylist() == ["q0", "q1", "q3", "q4"] and rejects == [(3, BOM_REASON)]
    table, bad = parse_jsonl_block(b"\n".join(labels) + b"\n", 1, CLASSIFICATION_GROUNDTRUTH, [])
    assert table.column("datum_uid").to_pylist() == ["d0", "d1", "d3", "d4"]
    assert bad == [(3, BOM_REASON)]


def test_names_that_are_not_utf8_stop_the_run_before_any_work(tmp_path, capsys):
    """A file or folder name with bytes of another encoding (Python reads them as lone
    surrogates) cannot be written to run.json: an argument holding one, or a glob matching such
    a file, stops the run with exit 2 and one paragraph, nothing written (before, an output
    folder so named failed at the end with exit 3, a matched input with a message about the
    output folder)."""
    from helpers import run_cli_here, write_jsonl

    row = {"datum_uid": "a", "labels": [{"key": "k", "value": "x", "score": 1.0}]}
    good = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "labels": [{"key": "k", "value": "x"}]}])
    pred = write_jsonl(tmp_path / "pred.jsonl", [row])
    odd = os.fsdecode(bytes(tmp_path) + b"/odd\xff")
    common = ["classification", "--predictions", f"m={pred}", "--quiet"]
    done = run_cli_here([*common, "--groundtruths", good, "--output", odd], capsys)
    assert done.returncode == 2 and "is not UTF-8 text" in done.stderr and "Rename it" in done.stderr
    assert not os.path.exists(odd)
    with open(os.fsdecode(bytes(tmp_path) + b"/gt\xff.jsonl"), "w") as f:
        f.write(json.dumps({"datum_uid": "b", "labels": [{"key": "k", "value": "x"}]}) + "\n")
    done = run_cli_here([*common, "--groundtruths", str(tmp_path / "gt*.jsonl"), "--output",
                         tmp_path / "out"], capsys)
    assert done.returncode == 2 and "matched for groundtruths) is not UTF-8 text" in done.stderr
    assert not (tmp_path / "out").exists() and len(done.stderr.strip().splitlines()) == 1
