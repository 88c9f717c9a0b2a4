"""Byte spans of line-based files (transforms/line_spans.py): every line is read by exactly one
span, with the line number it has in the whole file, for any span size, including lines longer
than a span, empty lines, a last line without a newline, and CRLF line ends."""

from __future__ import annotations

import io
import random

import pytest

from evalbeam.schemas.formats import jsonl_blocks
from evalbeam.schemas.safe_json import iter_lines
from evalbeam.transforms.line_spans import (LineSpan, auto_split_bytes, count_newlines, first_lines,
                                            plan_spans)


def random_file(seed: int) -> bytes:
    rng = random.Random(seed)
    lines = []
    for _ in range(rng.randint(0, 60)):
        kind = rng.random()
        if kind < 0.1:
            lines.append(b"")
        elif kind < 0.15:
            lines.append(b"x" * rng.randint(50, 400))      # longer than the smallest spans
        else:
            lines.append(("%d " % rng.randint(0, 10**6)).encode() * rng.randint(1, 4))
    text = b"\n".join(lines)
    if rng.random() < 0.3:
        text = text.replace(b"\n", b"\r\n")
    if lines and rng.random() < 0.7:
        text += b"\n"
    return text


def spans_of(data: bytes, split: int):
    """[(first line number, bytes read)] of every span, numbered through first_lines."""
    cuts = plan_spans(len(data), split)
    counts = [(("s", 0, start), count_newlines(io.BytesIO(data), start, end)) for start, end in cuts]
    numbers = first_lines(counts)
    return [(numbers[("s", 0, start)], LineSpan(io.BytesIO(data), start, end).read())
            for start, end in cuts]


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("split", [1, 2, 3, 7, 64, 1000, 1 << 20])
def test_spans_cover_every_line_once_with_its_number(seed, split):
    data = random_file(seed)
    whole = list(iter_lines(io.BytesIO(data), 1 << 20))
    spans = spans_of(data, split)
    assert b"".join(read for _, read in spans) == data
    got = []
    for first, read in spans:
        got += list(iter_lines(io.BytesIO(read), 1 << 20, first_line=first))
    assert got == whole


@pytest.mark.parametrize("split", [1, 5, 100])
def test_block_numbers_match_the_whole_file(split):
    """jsonl_blocks numbers a span's blocks from the span's first line."""
    data = b"".join(b'{"i": %d}\n' % i if i % 7 else b"\n" for i in range(200))
    whole = [line for block, first in jsonl_blocks(io.BytesIO(data), block_size=64)
             for line in enumerate(block.split(b"\n")[:-1], start=first)]
    got = []
    for first, read in spans_of(data, split):
        got += [line for block, start in jsonl_blocks(io.BytesIO(read), block_size=64, first_line=first)
                for line in enumerate(block.split(b"\n")[:-1], start=start)]
    assert got == whole


def test_a_line_longer_than_every_span_is_read_once_and_in_bounded_reads():
    """A 3 MB line without a newline over 64 KB spans: the span where it starts reads it (in
    reads of the caller's size); the spans it covers read nothing and stop at their end."""
    data = b"a\n" + b"z" * (3 << 20) + b"\nb\n"
    spans = spans_of(data, 64 << 10)
    assert b"".join(read for _, read in spans) == data
    non_empty = [(first, read) for first, read in spans if read]
    assert [first for first, _ in non_empty] == [1, 3]
    assert non_empty[1][1] == b"b\n"

    class Counting(io.BytesIO):
        largest = 0

        def read(self, size=-1):
            out = super().read(size)
            Counting.largest = max(Counting.largest, len(out))
            return out

    span = LineSpan(Counting(data), 0, 64 << 10)
    total = 0
    while chunk := span.read(4096):
        total += len(chunk)
    assert total == len(data) - 2 and Counting.largest <= 4096   # "a\n", the long line, its newline
    middle = LineSpan(Counting(data), 1 << 20, (1 << 20) + (64 << 10))
    assert middle.read() == b""


def test_plan_spans():
    assert plan_spans(10, 0) == [(0, 10)]
    assert plan_spans(10, 10) == [(0, 10)]
    assert plan_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert plan_spans(0, 4) == [(0, 0)]


def test_auto_split_bytes_makes_about_32_spans_of_8_to_64_mib():
    """Without --input_split_bytes, a read's splittable bytes go in 32 spans (a runner gives
    workers equal numbers of spans, so many spans balance them), never smaller than 8 MiB
    (small inputs stay whole) nor larger than 64 MiB (cluster inputs stay few pieces)."""
    mib = 1 << 20
    assert auto_split_bytes(0) == 8 * mib
    assert auto_split_bytes(100 * mib) == 8 * mib                 # 13 spans of 8 MiB
    assert auto_split_bytes(270 * mib) == -(-270 * mib // 32)     # 32 spans
    assert len(plan_spans(270 * mib, auto_split_bytes(270 * mib))) == 32
    assert auto_split_bytes(73_000 * mib) == 64 * mib



def test_default_split_reads_a_large_file_in_spans_with_the_same_metrics(tmp_path):
    """Without --input_split_bytes, a run over 30 MB of JSONL reads the files in 8 MiB spans
    (more pieces cross GroupByShard than with 0, one file a piece) and writes the same metrics."""
    import json

    from helpers import run_cli_subprocess

    from evalbeam.pipelines.demo.synthetic import write_classification_dataset

    paths = write_classification_dataset(str(tmp_path / "data"), n_datums=90_000, n_classes=5,
                                         models={"m": 1.0})
    assert sum((tmp_path / "data" / name).stat().st_size
               for name in ("groundtruths.jsonl", "m.jsonl")) > 24 << 20
    elements, metrics = {}, {}
    for split in ("default", "0"):
        out = tmp_path / split
        args = ["classification", "--groundtruths", paths["groundtruths"], "--predictions",
                f"m={paths['m']}", "--output", out, "--quiet", "--num_shards", "2"]
        done = run_cli_subprocess(args + ([] if split == "default" else ["--input_split_bytes", "0"]))
        assert done.returncode == 0, done.stderr
        run = json.loads((out / "run.json").read_text())
        elements[split] = run["shuffles"]["GroupByShard"]["elements"]
        metrics[split] = (out / "metrics.jsonl").read_text()
    assert elements["default"] > elements["0"], elements
    assert metrics["default"] == metrics["0"]
