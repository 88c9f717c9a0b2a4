"""Semantic segmentation against hostile and mistaken input (issue 14): what one row may cost
(image sizes claimed by RLEs, shapes, PNG and .npy headers; bytes read per mask file; FIFOs and
devices), rejection reasons that are the same in every run, slice values JSON cannot carry,
label vocabularies that cannot match, and inputs that must stop the run before it starts.

No test here allocates the sizes it claims: every claim is refused from a header or a field
before any pixel is decoded. The one multi-process run is a subprocess with a time limit (a FIFO
that is opened blocks forever) and an address-space limit (a device read to its end never ends)."""

from __future__ import annotations

import gzip
import io
import json
import os
import resource
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from helpers import MULTIPROCESS, ROOT, read_jsonl, write_jsonl

HUGE = 1_000_000           # a claimed side: 10^12 pixels, far beyond any memory


def run_segmentation(*args) -> int:
    from evalbeam.pipelines.tasks.segmentation import run

    return run([str(a) for a in args])


def run_bounded(args: list, timeout: float = 180) -> subprocess.CompletedProcess:
    """`evalbeam ARGS` in a fresh interpreter with at most 6 GiB of address space per process
    (the Beam workers inherit it), so a reader that does not stop fails instead of filling the
    machine's memory."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "evalbeam.pipelines.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(ROOT), preexec_fn=limit_memory)


def compressed_rle(runs: list[int]) -> str:
    """COCO's compressed RLE string of run lengths (the inverse of schemas.coco.rle_runs)."""
    out = []
    for i, x in enumerate(runs):
        if i > 2:
            x -= runs[i - 2]
        more = True
        while more:
            c, x = x & 0x1F, x >> 5
            more = x != -1 if c & 0x10 else x != 0
            out.append(chr((c | (0x20 if more else 0)) + 48))
    return "".join(out)


def png_header_only(width: int, height: int, bit_depth: int = 8) -> bytes:
    """A PNG whose header claims width x height grey pixels, followed by almost no pixel data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def npy_header_only(shape: tuple, dtype: str = "|u1", data: bytes = b"\0" * 16) -> bytes:
    """A .npy file whose header claims `shape` and which holds only `data` after it."""
    from numpy.lib import format as npy

    stream = io.BytesIO()
    npy.write_array_header_1_0(stream, {"descr": dtype, "fortran_order": False, "shape": shape})
    return stream.getvalue() + data


def square(label: str) -> dict:
    """A segment covering the top half of a 4 x 4 image (column-major runs: each column starts
    with 2 set pixels and ends with 2 unset)."""
    return {"label": label, "rle": {"size": [4, 4], "counts": [0, 2, 2, 2, 2, 2, 2, 2, 2]}}


def hostile_inputs(folder):
    """(ground-truth path, prediction path, {datum_uid: expected reason}) of the hostile run."""
    folder.mkdir()
    (folder / "huge.png").write_bytes(png_header_only(HUGE, HUGE))
    (folder / "huge.npy").write_bytes(npy_header_only((HUGE, HUGE)))
    (folder / "short.npy").write_bytes(npy_header_only((100, 100)))
    (folder / "corrupt.png").write_bytes(b"\x89PNG but then nothing an image reader understands")
    os.mkfifo(folder / "fifo.png")

    def seg(uid, segments, **extra):
        return {"datum_uid": uid, "shape": [4, 4], "segments": segments, **extra}

    deep = '{"datum_uid": "deep", "metadata": {"s": ' + "[" * 2000 + "]" * 2000 + '}}'
    where = f"{folder}{os.sep}"
    beyond = "pixels exceeds the limit of 100,000,000 pixels per row (--max_image_pixels raises it)"
    expected = {
        "rle-huge": f"rle: RLE of {HUGE} x {HUGE} = 1,000,000,000,000 {beyond}",
        "shape-huge": f"shape of {HUGE} x {HUGE} = 1,000,000,000,000 {beyond}",
        "png-huge": f"label_map_uri {where}huge.png of {HUGE} x {HUGE} = 1,000,000,000,000 {beyond}",
        "npy-huge": f"segment 0 (a): mask_uri {where}huge.npy of {HUGE} x {HUGE} = 1,000,000,000,000 {beyond}",
        "npy-short": (f"segment 0 (a): mask_uri {where}short.npy is cut short: its header claims "
                      "[100, 100] uint8 values (10,000 bytes) but 16 bytes follow"),
        "dev-zero": ("segment 0 (a): mask_uri: /dev/zero is not a regular file (a pipe, device or "
                     "socket cannot be read as an input)"),
        "fifo": (f"segment 0 (a): mask_uri: {where}fifo.png is not a regular file (a pipe, device "
                 "or socket cannot be read as an input)"),
        "corrupt": (f"segment 0 (a): mask_uri {where}corrupt.png is not a PNG or .npy image (nor "
                    "another image format Pillow reads)"),
        "nan": ("metadata 's' is nan: a slice value must be a string, a finite number, a boolean or "
                "null"),
        "infinity": ("metadata 's' is -inf: a slice value must be a string, a finite number, a "
                     "boolean or null"),
        "many-segments": "a row holds at most 65,535 segments (one per label); this one has 65,536",
        None: "JSON nested deeper than 64 levels",
    }
    one_pixel = {"label": "a", "rle": {"size": [4, 4], "counts": [16]}}
    groundtruth = [
        deep,    # the first line: the launcher's own look at the file must not choke on it either
        seg("ok", [square("a")], metadata={"s": "x"}),
        seg("ok2", [square("b")], metadata={"s": "y"}),
        seg("rle-huge", [{"label": "a", "rle": {"size": [HUGE, HUGE], "counts": compressed_rle([HUGE * HUGE])}}]),
        {"datum_uid": "shape-huge", "shape": [HUGE, HUGE], "segments": []},
        {"datum_uid": "png-huge", "label_map_uri": "huge.png"},
        seg("npy-huge", [{"label": "a", "mask_uri": "huge.npy"}]),
        seg("npy-short", [{"label": "a", "mask_uri": "short.npy"}]),
        seg("dev-zero", [{"label": "a", "mask_uri": "/dev/zero"}]),
        seg("fifo", [{"label": "a", "mask_uri": "fifo.png"}]),
        seg("corrupt", [{"label": "a", "mask_uri": "corrupt.png"}]),
        '{"datum_uid": "nan", "metadata": {"s": NaN}, "shape": [4, 4], "segments": []}',
        '{"datum_uid": "infinity", "metadata": {"s": [1, {"t": -Infinity}]}, "shape": [4, 4], "segments": []}',
        seg("many-segments", [one_pixel] * 65_536),
    ]
    predictions = [
        seg("ok", [square("a")]),
        seg("ok2", [{"label": "b", "mask_uri": "fifo.png"}]),     # a prediction that is a FIFO
    ]
    return (write_jsonl(folder / "gt.jsonl", groundtruth), write_jsonl(folder / "pd.jsonl", predictions),
            expected)


def release_fifo(path) -> None:
    """Give a reader blocked on the FIFO (only code that opens it would be) its end of file."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:   # no reader is waiting: nothing to release
        pass


def test_hostile_rows_cost_bounded_work_and_give_the_same_rejections_every_run(tmp_path):
    """Issue 14: a row claiming a size beyond memory (RLE, shape, PNG header, .npy header), a
    mask that is /dev/zero or a FIFO, a corrupt PNG, NaN and Infinity slice values, JSON 2,000
    deep and 65,536 segments are each a rejected row with its reason (no traceback, no hang, no
    allocation); the rest is evaluated, and two runs (multi-process and in-process) write the
    same bytes (no memory address in a reason)."""
    gt, pd, expected = hostile_inputs(tmp_path / "in")
    common = ["--groundtruths", gt, "--predictions", f"m={pd}", "--slice", "s", "--label_names", "0=a,1=b"]
    try:
        first = run_bounded(["segmentation", *common, "--output", tmp_path / "multi", *MULTIPROCESS], timeout=240)
    finally:
        release_fifo(tmp_path / "in" / "fifo.png")
    assert first.returncode == 1, first.stderr[-3000:]
    assert "Traceback" not in first.stderr
    rejected = read_jsonl(tmp_path / "multi" / "rejected.jsonl")
    found = {r.get("datum_uid"): r["reason"] for r in rejected if r["source"] == "groundtruths"}
    assert found == expected
    assert [(r["datum_uid"], r["reason"]) for r in rejected if r["source"] == "m"] == [
        ("ok2", f"segment 0 (b): mask_uri: {tmp_path / 'in' / 'fifo.png'} is not a regular file (a "
                "pipe, device or socket cannot be read as an input)")]
    assert not any(" at 0x" in r["reason"] or "object>" in r["reason"] for r in rejected)
    info = json.loads((tmp_path / "multi" / "run.json").read_text())
    assert info["status"] == "complete_with_rejections"
    assert info["counts"]["groundtruths"] == {"rows_read": 14, "rows_evaluated": 2, "rows_rejected": 12}
    records = {(r["type"], json.dumps(r["slice"]), r["parameters"].get("label")): r["value"]
               for r in read_jsonl(tmp_path / "multi" / "metrics.jsonl")}
    assert records[("Accuracy", '{"s": "x"}', None)] == 1.0         # "ok": a predicted exactly
    # "ok2", whose prediction was rejected, counts as predicted "no label"
    assert records[("Recall", '{"s": "y"}', "b")] == 0.0 and records[("Accuracy", '{"s": "y"}', None)] == 0.5

    second = run_segmentation(*common, "--output", tmp_path / "single", "--quiet")
    assert second == 1
    for name in ("rejected.jsonl", "metrics.jsonl"):
        assert (tmp_path / "single" / name).read_bytes() == (tmp_path / "multi" / name).read_bytes(), name


def test_the_pixel_and_byte_bounds_follow_their_options(tmp_path):
    """--max_image_pixels 12000000: a 3000 x 4000 label map (exactly at the bound) is evaluated,
    one of 3001 x 4000 is rejected; --max_mask_bytes 65536: a larger mask file is rejected."""
    ids = np.zeros((3001, 4000), np.uint8)
    ids[1500:] = 1                                       # ids 0 (top half) and 1 (bottom half)
    Image.fromarray(ids[:3000]).save(tmp_path / "at_limit.png")
    Image.fromarray(ids).save(tmp_path / "beyond.png")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (4, 30_000), dtype=np.uint8)).save(tmp_path / "noise.png")
    assert (tmp_path / "at_limit.png").stat().st_size < 65_536 < (tmp_path / "noise.png").stat().st_size
    rows = [{"datum_uid": "at-limit", "label_map_uri": "at_limit.png"},
            {"datum_uid": "beyond", "label_map_uri": "beyond.png"},
            {"datum_uid": "big-file", "shape": [4, 30_000], "segments": [{"label": "a", "mask_uri": "noise.png"}]}]
    write_jsonl(tmp_path / "gt.jsonl", rows)
    write_jsonl(tmp_path / "pd.jsonl", rows[:1])
    assert run_segmentation("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                            "--output", tmp_path / "out", "--quiet", "--label_names", "0=a,1=b",
                            "--max_image_pixels", "12000000", "--max_mask_bytes", "65536") == 1
    found = {r["datum_uid"]: r["reason"] for r in read_jsonl(tmp_path / "out" / "rejected.jsonl")}
    assert found == {
        "beyond": (f"label_map_uri {tmp_path / 'beyond.png'} of 3001 x 4000 = 12,004,000 pixels exceeds "
                   "the limit of 12,000,000 pixels per row (--max_image_pixels raises it)"),
        "big-file": (f"segment 0 (a): mask_uri {tmp_path / 'noise.png'} holds more than 65,536 bytes, the "
                     "limit per mask or label-map file (--max_mask_bytes raises it)")}
    records = {(r["type"], r["parameters"].get("label")): r["value"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")}
    assert records[("Accuracy", None)] == 1.0 and records[("IOU", "b")] == 1.0
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["options"]["max_image_pixels"] == 12_000_000 and info["options"]["max_mask_bytes"] == 65_536


def test_rle_sizes_are_bounded_for_detection_and_coco_too():
    """schemas.coco.rle_problem bounds the size an RLE claims before its runs are parsed, so the
    detection rasters and COCO segmentations that it checks are covered as well."""
    from evalbeam.schemas.coco import rle_problem
    from evalbeam.schemas.detection_rows import raster_of

    huge = {"size": [HUGE, 50_000], "counts": [HUGE * 50_000]}       # an RLE list, as COCO writes crowds
    assert rle_problem(huge) == ("RLE of 1000000 x 50000 = 50,000,000,000 pixels exceeds the limit of "
                                 "100,000,000 pixels per row (--max_image_pixels raises it)")
    assert raster_of({"size": [50_000, 50_000], "counts": compressed_rle([50_000 ** 2])}) == (
        "raster: RLE of 50000 x 50000 = 2,500,000,000 pixels exceeds the limit of 100,000,000 "
        "pixels per row (--max_image_pixels raises it)")
    assert rle_problem({"size": [10_000, 10_000], "counts": compressed_rle([10_000 ** 2])}) is None
    assert rle_problem({"size": [2, 3], "counts": [6]}, max_pixels=5).startswith("RLE of 2 x 3 = 6 pixels")
    # one run written with 300,000 "more follows" characters: decoding it as a number took time
    # quadratic in its length (seconds here, hours for a row of a few MB); no run needs 8
    started = time.perf_counter()
    assert rle_problem({"size": [4, 4], "counts": "Q" * 300_000 + "0"}) == (
        'RLE "counts" is not a valid compressed COCO RLE string')
    assert time.perf_counter() - started < 1.0


def test_png_above_pillows_own_bound_opens_when_the_limit_allows(tmp_path):
    """Pillow refuses images over 178,956,970 pixels by itself (a "decompression bomb"); with
    --max_image_pixels raised, evalbeam's bound is the one that holds. A 1-bit PNG of 13,500 x
    13,500 (182 megapixels, 23 MB of pixel rows, a few hundred kB on disk) keeps this fast."""
    from evalbeam.schemas.limits import ImageLimits
    from evalbeam.schemas.mask_files import MaskFileError
    from evalbeam.transforms.mask_files import read_array

    side = 13_500
    row = b"\0" + b"\xff" * (side // 8) + b"\xf0"         # filter byte, 13,500 set bits
    rows = zlib.compress(row * side, 1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
           + chunk(b"IDAT", rows) + chunk(b"IEND", b""))
    (tmp_path / "big.png").write_bytes(png)
    with pytest.raises(MaskFileError, match=r"182,250,000 pixels exceeds the limit of 100,000,000"):
        read_array(str(tmp_path / "big.png"))
    mask = read_array(str(tmp_path / "big.png"), ImageLimits(max_pixels=side * side))
    assert mask.shape == (side, side) and mask.dtype == bool and bool(mask[-1, -1]) and bool(mask[0, 0])


def test_label_names_that_differ_between_the_sides_make_the_run_incomplete(tmp_path, capsys):
    """A model whose labels never occur in the ground truth ("Car" against "car") cannot be
    right anywhere: the run is "incomplete" (exit 4), the finding in run.json and on stderr; a
    model that shares labels with the ground truth is not named."""
    top, bottom = square("car"), {"label": "road", "rle": {"size": [4, 4], "counts": [2, 2, 2, 2, 2, 2, 2, 2]}}

    def renamed(segment, label):
        return dict(segment, label=label)

    write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "shape": [4, 4], "segments": [top, bottom]}])
    write_jsonl(tmp_path / "renamed.jsonl", [{"datum_uid": "a", "shape": [4, 4],
                                              "segments": [renamed(top, "Car"), renamed(bottom, "Road")]}])
    write_jsonl(tmp_path / "good.jsonl", [{"datum_uid": "a", "shape": [4, 4], "segments": [top]}])
    code = run_segmentation("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "renamed.jsonl",
                            "--predictions", tmp_path / "good.jsonl", "--output", tmp_path / "out", "--quiet")
    assert code == 4
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["status"] == "incomplete"
    assert [(p["severity"], p["code"]) for p in info["problems"]] == [("error", "label_values_disjoint")]
    assert "'renamed'" in info["problems"][0]["message"] and "'Car', 'Road'" in info["problems"][0]["message"]
    assert "incomplete" in capsys.readouterr().err
    assert (tmp_path / "out" / "metrics.jsonl").stat().st_size > 0     # the numbers are still written


def test_too_many_labels_stop_the_run_with_an_input_error(tmp_path, capsys):
    """Each (model, slice) keeps a (labels + 1)^2 pixel matrix: a run naming more labels than
    --max_labels stops (exit 2, one paragraph, run.json "failed") instead of allocating it."""
    segments = [{"label": name, "rle": {"size": [1, 3], "counts": [i, 1, 2 - i]}} for i, name in enumerate("abc")]
    write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "shape": [1, 3], "segments": segments}])
    write_jsonl(tmp_path / "pd.jsonl", [{"datum_uid": "a", "shape": [1, 3], "segments": segments}])
    code = run_segmentation("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                            "--output", tmp_path / "out", "--quiet", "--max_labels", "2")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "the segments and --label_names name 3 distinct labels, more than --max_labels 2" in err
    assert "Traceback" not in err
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "failed"
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_inputs_that_stop_the_run_before_it_starts(tmp_path, capsys):
    """A truncated .jsonl.gz, a detection file given to segmentation, a FIFO as --label_names and
    out-of-range limits are input or usage errors (exit 2) that change nothing on disk."""
    rows = [{"datum_uid": f"u{i}", "shape": [4, 4], "segments": [square("a")]} for i in range(3000)]
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    (tmp_path / "gt.jsonl.gz").write_bytes(data[: len(data) // 2])
    good = write_jsonl(tmp_path / "pd.jsonl", rows[:1])
    detection = write_jsonl(tmp_path / "boxes.jsonl", [{"datum_uid": "a", "annotations": [
        {"label": "car", "bbox": [0, 0, 1, 1]}]}])
    os.mkfifo(tmp_path / "names.json")
    cases = [
        (["--groundtruths", tmp_path / "gt.jsonl.gz", "--predictions", good],
         "gt.jsonl.gz does not end as a complete compressed file"),
        (["--groundtruths", detection, "--predictions", good], "evaluate it with 'evalbeam detection'"),
        (["--groundtruths", good, "--predictions", good, "--label_names", tmp_path / "names.json"],
         "names.json: not a regular file"),
        (["--groundtruths", good, "--predictions", good, "--max_image_pixels", "0"],
         "--max_image_pixels must lie in [1, 4294967295]"),
        (["--groundtruths", good, "--predictions", good, "--max_mask_bytes", "0"],
         "--max_mask_bytes must be 1 or more"),
    ]
    # code that opens the FIFO would block this process: unblock it after a while, so such code
    # fails the test instead of hanging it
    unblock = threading.Timer(30, release_fifo, [tmp_path / "names.json"])
    unblock.start()
    try:
        for args, message in cases:
            assert run_segmentation(*args, "--output", tmp_path / "out") == 2, message
            err = capsys.readouterr().err
            assert message in err and "Traceback" not in err, err
            assert not (tmp_path / "out").exists()
    finally:
        unblock.cancel()
