"""What one segmentation row of RLE segments may cost (issue 39): overlaps are found from the
runs (never by decoding each segment over the whole image), RLE segments are painted in one pass
however many there are, compressed RLE strings are parsed with numpy, and the mask files of a
row are bounded. Each against the decoded pixels (pycocotools) or the Python parser it replaces."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from evalbeam.schemas.coco import iter_rle_run_arrays, iter_rle_runs, rle_problem
from evalbeam.transforms.kernels.segmentation import label_ids, overlap_pixels, rle_set_runs
from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from test_hostile_segmentation import compressed_rle, run_bounded


def runs_of(mask: np.ndarray) -> list[int]:
    """The run lengths of a bool mask, column-major, unset pixels first (COCO's RLE)."""
    flat = mask.ravel(order="F").astype(np.int8)
    change = np.flatnonzero(np.diff(np.r_[0, flat, 1 - flat[-1]]))
    return np.diff(np.r_[0, change]).tolist()


def counts_of(mask: np.ndarray, form: str):
    """The counts of a mask's RLE: "string" (pycocotools' compressed string), "list", or
    "padded" (a list with empty runs inserted: zero-length unset runs join set runs that touch)."""
    if form == "string":
        return mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode()
    runs = runs_of(mask)
    if form == "padded":
        runs = [piece for run in runs for piece in ([run] if run < 2 else [run - 1, 0, 1])]
    return runs


def random_segments(rng, h: int, w: int, n: int, overlapping: bool) -> list[np.ndarray]:
    """n masks of an h x w image: a random partition of the pixels (so segments touch but do not
    overlap: runs of one segment end where another's begin), with empty and full-image segments
    among them; overlapping: then some masks grow into their neighbours."""
    owner = rng.integers(-1, n, (h, w))
    if rng.random() < 0.5:      # blocky maps: long runs, and runs that cross columns
        coarse = rng.integers(-1, n, (h // 3 + 1, w // 3 + 1))
        owner = np.kron(coarse, np.ones((3, 3), int))[:h, :w]
    masks = [owner == i for i in range(n)]
    masks[int(rng.integers(n))][:] = False                 # an empty segment
    if rng.random() < 0.3:                                 # a segment covers the whole image
        full = int(rng.integers(n))
        masks = [np.ones((h, w), bool) if i == full else m if overlapping else np.zeros((h, w), bool)
                 for i, m in enumerate(masks)]
    if overlapping:
        for i in rng.choice(n, size=max(1, n // 3), replace=False):
            masks[i] = masks[i] | (rng.random((h, w)) < rng.choice([0.01, 0.3]))
    return masks


def decoded_answer(masks: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """(ids, pixels covered more than once) painting decoded masks one after the other, as the
    segment path did before issue 39: mask i paints i + 1, the last one wins."""
    ids = np.zeros(masks[0].shape, np.uint8 if len(masks) < 255 else np.uint16)
    covered = np.zeros(masks[0].shape, np.uint16)
    for i, mask in enumerate(masks):
        ids[mask] = i + 1
        covered += mask
    return ids, int((covered > 1).sum())


@pytest.mark.parametrize("seed", range(8))
def test_overlap_from_runs_equals_the_decoded_pixels(seed):
    """overlap_pixels on RLE runs counts the pixels that decoded masks cover more than once,
    and label_ids paints the same ids, for every counts form and both of its ways (from the runs
    alone, and painting a coverage count), with masks given as files mixed in: random masks,
    segments that touch without overlapping, empty and full-image segments."""
    rng = np.random.default_rng(seed)
    for case in range(12):
        h, w = (int(v) for v in rng.integers(1, 30, 2))
        n = int(rng.integers(1, 9)) if case % 6 else 300     # uint16 ids too
        masks = random_segments(rng, h, w, n, overlapping=case % 2 == 1)
        expected_ids, expected_overlap = decoded_answer(masks)
        for form in ("string", "list", "padded"):
            rles = {i: counts_of(m, form) for i, m in enumerate(masks)}
            for i, counts in rles.items():      # every form is an RLE pycocotools decodes to m
                size = {"size": [h, w], "counts": counts}
                rle = size if form == "string" else mask_utils.frPyObjects(size, h, w)
                assert np.array_equal(mask_utils.decode(rle).astype(bool), masks[i])
                assert rle_problem(size) is None
            runs = [tuple(np.concatenate(c) for c in zip(*rle_set_runs(counts, chunk=3)))
                    for counts in rles.values()]
            assert overlap_pixels(runs) == expected_overlap, (seed, case, form)
            files = set(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False).tolist())
            for sweep_runs, mixed in ((None, set()), (0, set()), (None, files)):
                ids, overlap = label_ids((h, w), {i: c for i, c in rles.items() if i not in mixed},
                                         ((i, masks[i]) for i in sorted(mixed)), n, sweep_runs)
                assert overlap == expected_overlap, (seed, case, form, sweep_runs, mixed)
                if expected_overlap:
                    assert ids is None
                else:
                    assert ids.dtype == expected_ids.dtype and np.array_equal(ids, expected_ids)


def test_overlap_pixels_by_hand():
    """Touching runs (one ends where the next begins) do not overlap; a pixel under three runs
    counts once; empty segments and no segments count nothing."""
    def seg(*runs):
        return np.array([s for s, _ in runs], np.int64), np.array([e for _, e in runs], np.int64)

    assert overlap_pixels([]) == 0
    assert overlap_pixels([seg(), seg((0, 5))]) == 0
    assert overlap_pixels([seg((0, 5), (5, 9)), seg((9, 12)), seg((12, 20))]) == 0
    assert overlap_pixels([seg((0, 5)), seg((4, 9))]) == 1
    assert overlap_pixels([seg((0, 10)), seg((2, 8)), seg((3, 4))]) == 6
    assert overlap_pixels([seg((0, 100)), seg((0, 100)), seg((0, 100))]) == 100


def python_rle_problem(counts: str, pixels: int) -> str | None:
    """rle_problem's reason for a string as it was before issue 39: the Python parser, run by run."""
    total, wrong = 0, f"RLE run lengths must be non-negative and add up to height * width = {pixels}"
    try:
        for run in iter_rle_runs(counts):
            total += run
            if run < 0 or total > pixels:
                return wrong
    except ValueError:
        return 'RLE "counts" is not a valid compressed COCO RLE string'
    return None if total == pixels else wrong


@pytest.mark.parametrize("seed", range(4))
def test_numpy_rle_parser_equals_the_python_one(seed):
    """iter_rle_run_arrays gives iter_rle_runs' runs, chunk after chunk (deltas two runs back and
    the sign bit carried across chunk ends), and on a malformed string the same runs before the
    same error; so rle_problem gives the same reason as the run-by-run parser."""
    rng = np.random.default_rng(seed)
    for trial in range(200):
        runs = rng.integers(0, [3, 40, 5000, 2**31][trial % 4], int(rng.integers(0, 60))).tolist()
        text = compressed_rle(runs)
        if trial % 3 == 1 and text:   # a bad character, a cut, an overlong run, a non-ASCII one
            i = int(rng.integers(len(text)))
            text = (text[:i] + str(rng.choice(["/", "p", "é", "\ud800", "Q" * 9, "", "O"]))
                    + text[i + int(rng.integers(0, 2)):])
        expected, error = [], False
        try:
            for run in iter_rle_runs(text):
                expected.append(run)
        except ValueError:
            error = True
        for chunk in (1, 8, 9, 13, 1 << 20):
            found = []
            with pytest.raises(ValueError) if error else _nothing():
                for array in iter_rle_run_arrays(text, chunk):
                    found.extend(array.tolist())
            assert found == expected, (text, chunk)
        pixels = max(0, int(sum(runs)) + int(rng.integers(-1, 2)))   # right, or one off
        assert (rle_problem({"size": [1, pixels], "counts": text}, max_pixels=1 << 62)
                == python_rle_problem(text, pixels)), text


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_long_compressed_string_is_checked_quickly():
    """A valid RLE string of 4 million one-pixel runs took 4.8 s to check run by run in Python;
    numpy chunks take a fraction of a second (the bound is generous for a loaded machine)."""
    text = "111" + "0" * (4_000_000 - 3)              # runs 1, 1, 1, then deltas of 0
    started = time.perf_counter()
    assert rle_problem({"size": [4000, 1000], "counts": text}) is None
    assert time.perf_counter() - started < 1.5
    runs = [tuple(np.concatenate(c) for c in zip(*rle_set_runs(text)))]
    assert runs[0][0].size == 2_000_000 and overlap_pixels(runs) == 0


def test_many_mask_files_are_bounded_when_the_row_is_read():
    """A row's mask files are decoded whole, one after another: their pixels in all (files x
    height x width) are at most 40 x --max_image_pixels, checked when the row is read (no file
    opened); RLE segments, however many, are not counted."""
    from evalbeam.schemas.segmentation_rows import segment_rows

    def row(uid, n_files, n_rles=0):
        segments = ([{"label": f"f{i}", "mask_uri": "same.png"} for i in range(n_files)]
                    + [{"label": f"r{i}", "rle": {"size": [10, 10], "counts": [100]}} for i in range(n_rles)])
        return {"datum_uid": uid, "shape": [10, 10], "segments": segments}

    rows = [row("at-limit", 400, 5_000), row("beyond", 401), row("rles", 0, 65_535)]
    good, bad = segment_rows(rows, [1, 2, 3], "/data/gt.jsonl", 0, [], max_pixels=1000)
    assert [r.uid for r in good] == ["at-limit", "rles"]
    assert bad == [(2, "beyond", "the row's 401 mask files of 10 x 10 pixels are 40,100 pixels to "
                    "decode, more than the limit of 40,000 per row (40 x --max_image_pixels): give "
                    "the segments as RLEs, or the row as one label map")]


def test_piled_up_rle_segments_are_rejected_without_decoding(tmp_path):
    """Issue 39: 40 RLE segments of one 65,535 x 65,535 image (4.3 billion pixels, allowed by
    --max_image_pixels), all covering the same area, took minutes when each was decoded (142 s
    at 10,000 x 10,000); they are rejected from their runs. The run has at most 6 GiB of address
    space per process, so decoding even one of them (4.3 GB) or painting the image would fail
    it: the exact overlap in the reason comes from the runs alone. The other rows, and a
    prediction whose segments overlap the same way (its datum then counts as predicted no
    label), are evaluated as usual; multi-process, in a subprocess."""
    side = 65_535
    pixels = side * side
    area = 3_000_000_000

    def piled(i):
        return {"label": "a" if i % 2 else "b",
                "rle": {"size": [side, side], "counts": compressed_rle([1000 + i, area, pixels - area - 1000 - i])}}

    square = {"label": "a", "rle": {"size": [4, 4], "counts": [0, 2, 2, 2, 2, 2, 2, 2, 2]}}
    hostile = {"datum_uid": "piled", "shape": [side, side], "segments": [piled(i) for i in range(40)]}
    assert len(json.dumps(hostile)) < 4_000          # a 3 KB row
    ok = {"datum_uid": "ok", "shape": [4, 4], "segments": [square]}
    gt = write_jsonl(tmp_path / "gt.jsonl", [ok, hostile, {"datum_uid": "ok2", "shape": [4, 4], "segments": [square]}])
    pd = write_jsonl(tmp_path / "pd.jsonl", [ok, {"datum_uid": "ok2", "shape": [4, 4], "segments": [square, square]}])
    started = time.perf_counter()
    done = run_bounded(["segmentation", "--groundtruths", gt, "--predictions", f"m={pd}", "--output",
                        tmp_path / "out", "--max_image_pixels", pixels, "--quiet", *MULTIPROCESS], timeout=240)
    elapsed = time.perf_counter() - started
    assert done.returncode == 1, done.stderr[-3000:]
    found = {(r["source"], r["datum_uid"]): r["reason"] for r in read_jsonl(tmp_path / "out" / "rejected.jsonl")}
    # segment i covers [1000 + i, 1000 + i + area): all of their union [1000, 1039 + area) but its
    # first pixel (segment 0 alone) and its last (segment 39 alone) is covered twice or more
    overlap = area + 37
    assert found == {("groundtruths", "piled"): f"ground-truth segments overlap on {overlap} pixels "
                                                "(each pixel takes one label)",
                     ("m", "ok2"): "prediction segments overlap on 8 pixels (each pixel takes one label)"}
    records = {(r["type"], r["parameters"].get("label")): r["value"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")}
    assert records[("Accuracy", None)] == 0.75 and records[("Recall", "a")] == 0.5
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"]["groundtruths"] == {"rows_read": 3, "rows_evaluated": 2, "rows_rejected": 1}
    print(f"run with the piled-up row: {elapsed:.1f} s")


@pytest.mark.parametrize("chunk", [7, 1 << 22])
def test_pair_counts_take_either_memory_order(chunk):
    """RLE segments give column-major id maps, label maps and mask files row-major ones:
    pair_counts (and so pixel_confusion) counts the same pairs for every mix of the two, whole
    or a chunk at a time."""
    from evalbeam.transforms.kernels.segmentation import pair_counts

    rng = np.random.default_rng(3)
    g = rng.integers(0, 5, (13, 17)).astype(np.uint8)
    p = rng.integers(0, 4, (13, 17)).astype(np.uint8)
    expected = pair_counts(g, p, chunk=g.size)
    for gt in (g, np.asfortranarray(g)):
        for pd in (p, np.asfortranarray(p), None):
            found = pair_counts(gt, pd, chunk=chunk)
            want = expected if pd is not None else pair_counts(g, None, chunk=g.size)
            order = np.lexsort((found[1], found[0]))
            assert all(np.array_equal(a[order], b) for a, b in zip(found, want))
