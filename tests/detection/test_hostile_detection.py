"""Issue 14, object detection: hostile rows and files are rejected with a reason or stop the run
with a one-paragraph input error, never a traceback, a warning or a silent wrong number; the
summary shows all 12 COCO statistics; label vocabularies that cannot match make the run
incomplete; the valor protocol's documented difference from valor-lite, proven on a worked
example."""

from __future__ import annotations

import gzip
import json
import warnings

import numpy as np
import pytest

from helpers import MULTIPROCESS, read_jsonl, run_cli_subprocess, write_jsonl


def run_detection(*args) -> int:
    from evalbeam.pipelines.tasks.detection import run

    return run([str(a) for a in args])


def reasons(folder) -> list[tuple]:
    """(source, position, reason) of every rejected row, sorted."""
    return sorted((r["source"], r.get("line", r.get("row")), r["reason"])
                  for r in read_jsonl(folder / "rejected.jsonl"))


def by_key(records, kind) -> dict:
    return {json.dumps(r["parameters"], sort_keys=True): r["value"] for r in records if r["type"] == kind}


# ------------------------------------------------------------------ 1. geometry that overflows

def test_overflowing_geometries_are_rejected_and_large_finite_ones_are_exact():
    """1e300 boxes or polygons: their area overflows float64 (inf, and IoU inf/inf = nan: an
    identical pair scored AP 0, with RuntimeWarnings). They are rejected, naming the annotation;
    geometry at 1e100 is still evaluated, with the exact IoU."""
    from evalbeam.schemas.coco_rows import box_rows
    from evalbeam.schemas.detection_rows import native_rows
    from evalbeam.transforms.kernels.detection import pair_box_iou
    from evalbeam.transforms.kernels.masks import pair_polygon_iou

    good = {"label": "cat", "bbox": [0, 0, 1e100, 1e100]}
    rows = [{"datum_uid": "huge", "annotations": [good, {"label": "cat", "bbox": [1e300, 1e300, 3e300, 3e300]}]},
            {"datum_uid": "wide", "annotations": [{"label": "cat", "bbox": [-1e300, 0, 1e300, 1]}]},
            {"datum_uid": "poly", "annotations": [{"label": "cat",
                                                   "polygon": [[0, 0], [1e300, 0], [1e300, 1e300]]}]},
            {"datum_uid": "big", "annotations": [good]}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for geometry in ("bbox", "polygon"):
            images, boxes, bad = native_rows(rows, [1, 2, 3, 4], False, [], geometry=geometry)
            assert [(p, uid) for p, uid, _ in bad] == [(1, "huge"), (2, "wide"), (3, "poly")]
            assert bad[0][2].startswith("annotation 1: bbox has a coordinate of magnitude 3e+300")
            assert bad[2][2].startswith("annotation 0: polygon has a coordinate of magnitude 1e+300")
            assert all("would overflow 64-bit floats" in reason for _, _, reason in bad)
            assert images.uid == ["big"] and np.isfinite(boxes.value).all()

        # a COCO file: bbox [x, y, w, h], the "area" field (JSON 1e309 is inf), polygons (segm)
        text = json.dumps([
            {"image_id": 1, "category_id": 1, "bbox": [0, 0, 1e100, 1e100], "area": 1e200},
            {"image_id": 1, "category_id": 1, "bbox": [0, 0, 1e300, 1e300], "area": 1.0},
            {"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "area": "AREA"},
        ]).replace('"AREA"', "1e309")
        anns, bad = box_rows(json.loads(text), detections=False, need_segmentation=False)
        assert anns.position.tolist() == [0]
        assert bad == [(1, "bbox has a coordinate of magnitude 1e+300, beyond 1e+150: its area (or "
                           "its IoU with another geometry) would overflow 64-bit floats"),
                       (2, "area inf is not a finite number >= 0")]
        side = 5e5   # a square whose boundary is 2,000,000 pixels long
        segm = [{"image_id": 1, "category_id": 1, "score": 0.5, "segmentation": polygon}
                for polygon in ([[0, 0, 10, 0, 10, 10]], [[0, 0, 1e300, 0, 0, 1e300]],
                                [[0, 0, 1e9, 0, 0, 5]], [[0, 0, side, 0, side, side, 0, side]])]
        dts, bad = box_rows(segm, detections=True, need_segmentation=True)
        assert dts.position.tolist() == [0]
        assert [(p, r.split(",")[0]) for p, r in bad] == [
            (1, "segmentation: polygon has a coordinate of magnitude 1e+300"),
            (2, "segmentation: polygon has a coordinate of magnitude 1e+09"),
            (3, "segmentation: polygon boundary is 2")]

        # large but finite: IoU of [0, 0, 1e100, 1e100] and its lower half is 1/2
        xywh = np.array([[0, 0, 1e100, 1e100], [0, 0, 1e100, 5e99]])
        iou = pair_box_iou(xywh, xywh, np.zeros(2, bool))(np.array([1]), np.array([0]))
        assert iou == pytest.approx([0.5], rel=1e-12)
        import shapely

        shapes = [shapely.box(0, 0, 1e100, 1e100), shapely.box(0, 0, 1e100, 5e99)]
        assert pair_polygon_iou(shapes, shapes)(np.array([1]), np.array([0])) == pytest.approx([0.5], rel=1e-12)


def test_overflowing_pair_is_rejected_in_a_run_without_warnings(tmp_path):
    """Through the CLI with warnings as errors: the 1e300 pair is rejected (both sides), the
    1e100 pair has IoU 1/2 (a match at 0.5, not at 0.55), the small pair IoU 1."""
    gt = [{"datum_uid": "huge", "annotations": [{"label": "cat", "bbox": [1e300, 1e300, 3e300, 3e300]}]},
          {"datum_uid": "ok", "annotations": [{"label": "cat", "bbox": [0, 0, 10, 10]}]},
          {"datum_uid": "big", "annotations": [{"label": "cat", "bbox": [0, 0, 1e100, 1e100]}]}]
    preds = [{"datum_uid": "huge", "annotations": [{"label": "cat", "score": 0.95,
                                                    "bbox": [1e300, 1e300, 3e300, 3e300]}]},
             {"datum_uid": "ok", "annotations": [{"label": "cat", "score": 0.9, "bbox": [0, 0, 10, 10]}]},
             {"datum_uid": "big", "annotations": [{"label": "cat", "score": 0.8, "bbox": [0, 0, 1e100, 5e99]}]}]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code = run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                             "--output", out, "--quiet", "--iou_thresholds", "0.5,0.55")
    assert code == 1
    assert [(s, line, r.split(":")[0]) for s, line, r in reasons(out)] == [
        ("groundtruths", 1, "annotation 0"), ("m", 1, "annotation 0")]
    records = read_jsonl(out / "metrics.jsonl")
    ap = {r["parameters"]["iou_threshold"]: r["value"] for r in records if r["type"] == "AP"}
    assert ap[0.5] == pytest.approx(1.0, abs=1e-12)
    assert ap[0.55] == pytest.approx(51 / 101, abs=1e-12)     # recall 1/2 at precision 1
    counts = {r["parameters"]["iou_threshold"]: r["value"] for r in records if r["type"] == "Counts"}
    assert counts == {0.5: {"tp": 2, "fp": 0, "fn": 0}, 0.55: {"tp": 1, "fp": 1, "fn": 1}}


def test_hostile_coco_segm_rows_are_rejected_multiprocess(tmp_path):
    """A COCO segm run (multi-process, as a user runs it) with rows that crashed pycocotools
    (a 1e300 polygon: segfault; an image of negative height: OverflowError) or ids beyond int64:
    each is a rejected row with its reason, and the valid pair still scores AP 1."""
    square = [[10, 10, 30, 10, 30, 30, 10, 30]]
    gt = {"images": [{"id": 1, "height": 100, "width": 100}, {"id": 2, "height": -1, "width": 100},
                     {"id": 10**30, "height": 100, "width": 100}, {"id": 4}],
          "categories": [{"id": 1, "name": "cat"}],
          "annotations": [
              {"id": 1, "image_id": 1, "category_id": 1, "segmentation": square, "area": 400,
               "bbox": [10, 10, 20, 20], "iscrowd": 0},
              {"id": 2, "image_id": 1, "category_id": 1, "segmentation": [[0, 0, 1e300, 0, 0, 1e300]],
               "area": 5, "iscrowd": 0},
              {"id": 3, "image_id": 1, "category_id": 1, "segmentation": square, "area": "AREA",
               "iscrowd": 0},
              {"id": 4, "image_id": 2, "category_id": 1, "segmentation": square, "area": 400, "iscrowd": 0},
              {"id": 5, "image_id": 10**30, "category_id": 1, "segmentation": square, "area": 400,
               "iscrowd": 0}]}
    results = [{"image_id": 1, "category_id": 1, "segmentation": square, "score": 0.9},
               {"image_id": 1, "category_id": 1, "segmentation": [[0, 0, 4e9, 0, 4e9, 4e9]], "score": 0.8},
               {"image_id": 1, "category_id": 1, "segmentation": square, "bbox": [0, 0, 1e300, 1],
                "score": 0.7}]
    (tmp_path / "gt.json").write_text(json.dumps(gt).replace('"AREA"', "1e309"))
    (tmp_path / "dt.json").write_text(json.dumps(results))
    out = tmp_path / "out"
    result = run_cli_subprocess(["detection", "--groundtruths", tmp_path / "gt.json", "--predictions",
                                 f"m={tmp_path / 'dt.json'}", "--output", out, "--iou_type", "segm",
                                 "--quiet", *MULTIPROCESS])
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    overflow = "beyond 1e+150: its area (or its IoU with another geometry) would overflow 64-bit floats"
    assert reasons(out) == [
        ("groundtruths", 1, "image: --iou_type segm needs the image's height and width (non-negative "
                            "integers; masks are drawn at that size), got [-1, 100]"),
        ("groundtruths", 1, "segmentation: polygon has a coordinate of magnitude 1e+300, beyond 1e+08, "
                            "which pycocotools cannot rasterise"),
        ("groundtruths", 2, "area inf is not a finite number >= 0"),
        ("groundtruths", 2, "image: image id 1000000000000000000000000000000 does not fit a 64-bit integer"),
        ("groundtruths", 3, "image: --iou_type segm needs the image's height and width (non-negative "
                            "integers; masks are drawn at that size), got [None, None]"),
        ("groundtruths", 3, "image_id names an image that was rejected (see its entry in \"images\")"),
        ("groundtruths", 4, "image_id 1000000000000000000000000000000 does not fit a 64-bit integer"),
        ("m", 1, "segmentation: polygon has a coordinate of magnitude 4e+09, beyond 1e+08, which "
                 "pycocotools cannot rasterise"),
        ("m", 2, f"bbox has a coordinate of magnitude 1e+300, {overflow}"),
    ]
    summary = next(r for r in read_jsonl(out / "metrics.jsonl") if r["type"] == "COCOSummary")
    assert summary["value"]["AP"] == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------------------ 2. broken COCO files

def test_truncated_coco_file_is_an_input_error_multiprocess(tmp_path):
    """A COCO instances file cut mid-document: exit 2, one paragraph naming the file (raised in a
    worker process), run.json "failed", no metrics.jsonl."""
    gt = {"images": [{"id": i, "height": 10, "width": 10} for i in range(50)],
          "categories": [{"id": 1, "name": "cat"}],
          "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [1, 1, 5, 5], "area": 25,
                           "iscrowd": 0} for i in range(50)]}
    text = json.dumps(gt)
    (tmp_path / "gt.json").write_text(text[:len(text) * 2 // 3])
    (tmp_path / "dt.json").write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5],
                                                   "score": 0.5}]))
    out = tmp_path / "out"
    result = run_cli_subprocess(["detection", "--groundtruths", tmp_path / "gt.json", "--predictions",
                                 f"m={tmp_path / 'dt.json'}", "--output", out, "--quiet", *MULTIPROCESS])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{tmp_path / 'gt.json'} (given for groundtruths) ends in the middle of its JSON document" in lines[0]
    assert "cut short" in lines[0]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and not (out / "metrics.jsonl").exists()


def test_deep_truncated_gz_and_misnamed_coco_files_are_input_errors(tmp_path, capsys):
    """Nested 2,000 deep (Python's parser gives up at its recursion limit, which differs between
    runners: in-process it parsed): exit 2 by an explicit depth limit. A .json.gz COCO file cut
    short: exit 2 (it is read whole, so the cut shows). Native rows in a .json file: named."""
    results = [{"image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "score": 0.5}]
    gt = {"images": [{"id": 1, "height": 10, "width": 10}], "categories": [{"id": 1, "name": "cat"}],
          "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "area": 25}]}
    (tmp_path / "dt.json").write_text(json.dumps(results))
    deep = dict(gt, info="[" * 2000 + "]" * 2000)            # brackets inside a string count for nothing
    (tmp_path / "deep.json").write_text(json.dumps(deep)[:-1] + ', "x": ' + "[" * 2000 + "]" * 2000 + "}")
    assert run_detection("--groundtruths", tmp_path / "deep.json", "--predictions", tmp_path / "dt.json",
                         "--output", tmp_path / "o1", "--quiet") == 2
    err = capsys.readouterr().err
    assert "deep.json (given for groundtruths) nests JSON deeper than 66 levels" in err
    assert "Traceback" not in err

    whole = gzip.compress(json.dumps(dict(gt, images=[{"id": i, "height": 10, "width": 10}
                                                      for i in range(30000)])).encode())
    (tmp_path / "gt.json.gz").write_bytes(whole[:len(whole) // 2])
    assert run_detection("--groundtruths", tmp_path / "gt.json.gz", "--predictions", tmp_path / "dt.json",
                         "--output", tmp_path / "o2", "--quiet") == 2
    err = capsys.readouterr().err
    assert "gt.json.gz does not end as a complete compressed file" in err and "Traceback" not in err
    assert json.loads((tmp_path / "o2" / "run.json").read_text())["status"] == "failed"

    for name, broken, expected in (
            ("dup.json", dict(gt, categories=[{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]),
             "has category ids that are not unique"),
            ("shape.json", dict(gt, images=5), 'is not a COCO instances file: its "images" is not a '
                                               "JSON array")):
        (tmp_path / name).write_text(json.dumps(broken))   # crashed (ValueError, TypeError): exit 3
        assert run_detection("--groundtruths", tmp_path / name, "--predictions", tmp_path / "dt.json",
                             "--output", tmp_path / f"o-{name}", "--quiet") == 2
        assert expected in capsys.readouterr().err

    write_jsonl(tmp_path / "rows.json", [{"datum_uid": "a", "annotations": []}] * 2)
    assert run_detection("--groundtruths", tmp_path / "rows.json", "--predictions", tmp_path / "dt.json",
                         "--output", tmp_path / "o3", "--quiet") == 2
    assert "holds native detection rows" in capsys.readouterr().err
    assert not (tmp_path / "o3").exists()


def test_coco_document_rules():
    """The whole-document reader: depth counted outside strings (escapes included), limit
    exact, byte order mark skipped, cut documents, JSON lines and lone surrogates named."""
    from evalbeam.schemas.coco_rows import MAX_DOCUMENT_NESTING, coco_document, document_depth

    assert document_depth(b'{"a": "[[[{{", "b": [[1]], "c": "\\\\", "d": "\\"]]]"}') == 3
    limit = MAX_DOCUMENT_NESTING
    assert coco_document(("[" * limit + "]" * limit).encode())[1] is None
    assert "deeper than" in coco_document(("[" * (limit + 1) + "]" * (limit + 1)).encode())[1]
    assert coco_document(b'\xef\xbb\xbf[{"image_id": 1}]') == ([{"image_id": 1}], None)
    assert "ends in the middle" in coco_document(b'{"images": [1, 2')[1]
    assert "more than one JSON document" in coco_document(b'{"a": 1}\n{"a": 2}\n')[1]
    assert "is not valid JSON" in coco_document(b'{"a": tru, "b": 2}')[1]
    assert "lone UTF-16 surrogate" in coco_document(b'{"categories": [{"name": "\\ud800"}]}')[1]
    assert coco_document(b'{"name": "\\ud83d\\ude00"}') == ({"name": "\U0001F600"}, None)



@pytest.mark.parametrize("piece", [1, 3, 1 << 22])
def test_document_depth_agrees_with_nesting_depth_on_random_documents(monkeypatch, piece):
    """document_depth (brackets and quotes of a whole document, summed in int8 steps over
    pieces that carry the depth and the string parity across) gives safe_json.nesting_depth's
    answer on JSON documents whose strings hold brackets, quotes and backslashes, and on the
    empty and flat ones, whatever the piece size."""
    import random

    from evalbeam.schemas import coco_rows
    from evalbeam.schemas.coco_rows import document_depth
    from evalbeam.schemas.safe_json import nesting_depth

    monkeypatch.setattr(coco_rows, "_DEPTH_PIECE", piece)

    def value(rng, depth):
        kind = rng.randrange(5 if depth < 12 else 2)
        if kind == 0:
            return rng.choice([0, -1.5, True, None, 10 ** 20])
        if kind == 1:
            return "".join(rng.choice('[]{}"\\ab') for _ in range(rng.randrange(6)))
        if kind == 2:
            return [value(rng, depth + 1) for _ in range(rng.randrange(4))]
        return {str(rng.random())[:4] + rng.choice("[{"): value(rng, depth + 1)
                for _ in range(rng.randrange(4))}

    for seed in range(4):
        rng = random.Random(seed)
        for _ in range(400):
            raw = json.dumps(value(rng, 0), ensure_ascii=rng.random() < 0.5).encode()
            assert document_depth(raw) == nesting_depth(raw), raw
    assert document_depth(b"") == nesting_depth(b"") == 0
    assert document_depth(b'"[[["') == 0
    assert document_depth(b"[" * 300 + b"]" * 300) == 300

# ------------------------------------------------------------------ 3. byte order mark, NaN slices

def test_bom_coco_files_evaluate_like_plain_ones_and_nan_metadata_is_rejected(tmp_path):
    """A UTF-8 BOM before a COCO instances and results file changes nothing; an image whose
    --slice metadata is NaN or Infinity is a rejected row (it crashed WriteMetrics), and so are
    its annotations."""
    gt = {"images": [{"id": 1, "height": 50, "width": 50, "metadata": {"site": "a"}},
                     {"id": 2, "height": 50, "width": 50, "metadata": {"site": "b"}},
                     {"id": 3, "height": 50, "width": 50, "metadata": {"site": float("nan")}},
                     {"id": 4, "height": 50, "width": 50, "site": [1, float("inf")]}],
          "categories": [{"id": 1, "name": "cat"}],
          "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [5, 5, 20, 20], "area": 400,
                           "iscrowd": 0} for i in (1, 2, 3)]}
    results = [{"image_id": i, "category_id": 1, "bbox": [5 + i, 5, 20, 20], "score": 0.5 + i / 10}
               for i in (1, 2, 3, 4)]
    outputs = []
    for bom in (b"", b"\xef\xbb\xbf"):
        folder = tmp_path / f"bom{len(bom)}"
        folder.mkdir()
        (folder / "gt.json").write_bytes(bom + json.dumps(gt).encode())
        (folder / "dt.json").write_bytes(bom + json.dumps(results).encode())
        assert run_detection("--groundtruths", folder / "gt.json", "--predictions", f"m={folder / 'dt.json'}",
                             "--output", folder / "out", "--quiet", "--slice", "site") == 1
        outputs.append(((folder / "out" / "metrics.jsonl").read_bytes(), reasons(folder / "out")))
    assert outputs[0] == outputs[1]
    assert outputs[0][1] == [
        ("groundtruths", 2, "image: metadata 'site' is nan: a slice value must be a string, a finite "
                            "number, a boolean or null"),
        ("groundtruths", 2, "image_id names an image that was rejected (see its entry in \"images\")"),
        ("groundtruths", 3, "image: metadata 'site' is inf: a slice value must be a string, a finite "
                            "number, a boolean or null"),
        ("m", 2, "no ground-truth image with this image_id"),
        ("m", 3, "no ground-truth image with this image_id"),
    ]
    slices = {json.dumps(r["slice"]) for r in read_jsonl(tmp_path / "bom0" / "out" / "metrics.jsonl")}
    assert slices == {"{}", '{"site": "a"}', '{"site": "b"}'}


# ------------------------------------------------------------------ 4. hostile native rows

def test_deep_and_nan_native_rows_are_rejected_multiprocess(tmp_path):
    """Native rows: one nested 2,000 deep and ones whose --slice metadata is NaN or holds an
    Infinity are rejected rows (the others evaluated, exit 1), on the multi-process runner."""
    box = {"label": "cat", "bbox": [0, 0, 10, 10]}
    gt = [{"datum_uid": "a", "metadata": {"site": "x"}, "annotations": [box]},
          '{"datum_uid": "deep", "annotations": [], "metadata": {"site": ' + "[" * 2000 + "]" * 2000 + "}}",
          '{"datum_uid": "nan", "metadata": {"site": NaN}, "annotations": []}',
          '{"datum_uid": "inf", "metadata": {"site": {"v": [-Infinity]}}, "annotations": []}',
          {"datum_uid": "b", "metadata": {"site": "y"}, "annotations": [box]}]
    preds = [{"datum_uid": uid, "annotations": [dict(box, score=0.9)]}
             for uid in ("a", "deep", "nan", "inf", "b")]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    out = tmp_path / "out"
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                         "--output", out, "--quiet", "--slice", "site", "--iou_thresholds", "0.5",
                         *MULTIPROCESS) == 1
    suffix = "a slice value must be a string, a finite number, a boolean or null"
    assert reasons(out) == [
        ("groundtruths", 2, "JSON nested deeper than 64 levels"),
        ("groundtruths", 3, f"metadata 'site' is nan: {suffix}"),
        ("groundtruths", 4, f"metadata 'site' is -inf: {suffix}"),
        ("m", 2, "no valid ground truth for this datum_uid"),
        ("m", 3, "no valid ground truth for this datum_uid"),
        ("m", 4, "no valid ground truth for this datum_uid"),
    ]
    records = read_jsonl(out / "metrics.jsonl")
    assert {json.dumps(r["slice"]) for r in records} == {"{}", '{"site": "x"}', '{"site": "y"}'}
    assert all(r["value"] == pytest.approx(1.0, abs=1e-12) for r in records if r["type"] == "AP")


def test_truncated_native_gz_is_an_input_error(tmp_path, capsys):
    rows = [{"datum_uid": f"d{i}", "annotations": [{"label": "cat", "bbox": [0, 0, 10, 10]}]}
            for i in range(2000)]
    whole = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    (tmp_path / "gt.jsonl.gz").write_bytes(whole[:len(whole) // 2])
    write_jsonl(tmp_path / "m.jsonl", [{"datum_uid": "d0", "annotations": []}])
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl.gz", "--predictions", tmp_path / "m.jsonl",
                         "--output", tmp_path / "out", "--quiet") == 2
    err = capsys.readouterr().err
    assert "gt.jsonl.gz does not end as a complete compressed file" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


# ------------------------------------------------------------------ 5. the summary

def test_summary_shows_the_twelve_coco_statistics(tmp_path):
    """All 12 statistics (9 were shown), "-" for the undefined -1, lines that fit a terminal."""
    from evalbeam.pipelines.tasks.detection import detection_summary
    from evalbeam.transforms.kernels.detection import SUMMARY_NAMES

    values = dict(zip(SUMMARY_NAMES, [0.1234, 0.2345, 0.3456, 0.4567, -1.0, 0.5678,
                                      0.6789, 0.7891, 0.8912, 0.9123, -1.0, 0.0321]))
    write_jsonl(tmp_path / "metrics.jsonl", [
        {"type": "COCOSummary", "value": values, "parameters": {"iou_type": "bbox"},
         "model": "faster-rcnn-r50", "slice": {"site": "hospital-north"}}])
    counts = {"groundtruths": {"rows_read": 10, "rows_evaluated": 10, "rows_rejected": 0}}
    text = detection_summary(str(tmp_path / "metrics.jsonl"), counts)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model") and "AP50" in line)
    assert lines[header].split() == ["model", "slice", "AP", "AP50", "AP75", "APsmall", "APmedium", "APlarge"]
    assert lines[header + 2].split() == ["faster-rcnn-r50", "site=hospital-north", "0.1234", "0.2345",
                                         "0.3456", "0.4567", "-", "0.5678"]
    header = next(i for i, line in enumerate(lines) if line.startswith("model") and "AR10" in line)
    assert lines[header].split() == ["model", "slice", "AR1", "AR10", "AR100", "ARsmall", "ARmedium", "ARlarge"]
    assert lines[header + 2].split() == ["faster-rcnn-r50", "site=hospital-north", "0.6789", "0.7891",
                                         "0.8912", "0.9123", "-", "0.0321"]
    assert max(len(line) for line in lines) <= 100


# ------------------------------------------------------------------ 6. label vocabularies

def test_labels_that_never_occur_in_the_ground_truth(tmp_path, capsys):
    """Model "ids" predicts class ids where the ground truth has names: no prediction can be
    right, the run is incomplete (exit 4). Model "extra" also predicts a label no ground truth
    has: a warning, in run.json and on stderr."""
    box = [0, 0, 10, 10]
    gt = [{"datum_uid": f"d{i}", "annotations": [{"label": "cat", "bbox": box}, {"label": "dog", "bbox": box}]}
          for i in range(3)]
    ids = [{"datum_uid": f"d{i}", "annotations": [{"label": "1", "score": 0.9, "bbox": box}]} for i in range(3)]
    extra = [{"datum_uid": f"d{i}", "annotations": [{"label": "cat", "score": 0.9, "bbox": box},
                                                    {"label": "cow", "score": 0.8, "bbox": box}]}
             for i in range(3)]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "ids.jsonl", ids)
    write_jsonl(tmp_path / "extra.jsonl", extra)
    out = tmp_path / "out"
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "ids.jsonl",
                         "--predictions", tmp_path / "extra.jsonl", "--output", out, "--quiet",
                         "--iou_thresholds", "0.5") == 4
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "incomplete"
    assert [(p["severity"], p["code"]) for p in info["problems"]] == [
        ("error", "label_values_disjoint"), ("warning", "label_values_unmatched")]
    assert info["problems"][0]["message"].startswith("model 'ids': no value it predicts ('1') is a "
                                                     "ground-truth value ('cat', 'dog')")
    assert info["problems"][1]["message"].startswith("model 'extra' predicts labels that no ground "
                                                     "truth has ('cow')")
    err = capsys.readouterr().err
    assert "warning: model 'extra' predicts labels" in err and "incomplete" in err
    assert (out / "metrics.jsonl").exists()


# ------------------------------------------------------------------ 7. valor protocol vs valor-lite

def test_next_best_ground_truth_differs_from_valor_lite_as_documented(tmp_path):
    """The worked example of the detection reference (boxes 10 high, so IoU is the overlap of
    the x intervals): ground truths g1 [0, 10], g2 [5, 15]; detections p1 [0, 10] score 0.9,
    p2 [2, 12] score 0.8, all "cat".
    IoU(p1, g1) = 1, IoU(p1, g2) = 5/15; IoU(p2, g1) = 8/12 = 0.667, IoU(p2, g2) = 7/13 = 0.538.
    p1 takes g1. p2's best ground truth g1 is taken:
    - evalbeam (Valor's written rule, pycocotools): p2 takes the next best, g2, where its IoU
      reaches the threshold: at IoU 0.5 tp 2, fp 0, fn 0, AP 1; at 0.75 p2 matches nothing:
      tp 1, fp 1, fn 1, AP 51/101 (precision 1 up to recall 1/2).
    - valor-lite 0.37-0.39: p2 stays unmatched at every threshold: tp 1, fp 1, fn 1, AP 51/101.
    So AR (score 0.5, IoU 0.5 and 0.75) is (1 + 1/2) / 2 = 0.75 against 0.5. valor-lite's own
    ConfusionMatrix pairs p2 with g2 (cat -> cat 2 at IoU 0.5), as evalbeam's Counts do."""
    valor_lite = pytest.importorskip("valor_lite.object_detection",
                                     reason="valor-lite (a test extra) is the other side of the example")

    def box(x0, x1, **score):
        return {"label": "cat", "bbox": [x0, 0, x1, 10], **score}

    gt = [{"datum_uid": "d", "annotations": [box(0, 10), box(5, 15)]}]
    preds = [{"datum_uid": "d", "annotations": [box(0, 10, score=0.9), box(2, 12, score=0.8)]}]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    out = tmp_path / "out"
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "m.jsonl",
                         "--output", out, "--quiet", "--iou_thresholds", "0.5,0.75",
                         "--score_thresholds", "0.5", "--max_examples", "0") == 0
    ours = read_jsonl(out / "metrics.jsonl")

    def boxes(rows, scored):
        return [valor_lite.BoundingBox(uid=f"{i}", xmin=a["bbox"][0], xmax=a["bbox"][2], ymin=a["bbox"][1],
                                       ymax=a["bbox"][3], labels=[a["label"]],
                                       scores=[a["score"]] if scored else [])
                for i, a in enumerate(rows[0]["annotations"])]

    loader = valor_lite.Loader.in_memory()
    loader.add_bounding_boxes([valor_lite.Detection(uid="d", groundtruths=boxes(gt, False),
                                                    predictions=boxes(preds, True))])
    evaluator = loader.finalize()
    theirs = [m.to_dict() for ms in evaluator.compute_precision_recall([0.5, 0.75], [0.5]).values()
              for m in ms]
    matrices = [m.to_dict() for m in evaluator.compute_confusion_matrix([0.5, 0.75], [0.5])]

    half = 51 / 101
    for records, counts, ap, ar in (
            (ours, {0.5: (2, 0, 0), 0.75: (1, 1, 1)}, {0.5: 1.0, 0.75: half}, 0.75),
            (theirs, {0.5: (1, 1, 1), 0.75: (1, 1, 1)}, {0.5: half, 0.75: half}, 0.5)):
        assert {r["parameters"]["iou_threshold"]: (r["value"]["tp"], r["value"]["fp"], r["value"]["fn"])
                for r in records if r["type"] == "Counts"} == counts
        assert {r["parameters"]["iou_threshold"]: r["value"]
                for r in records if r["type"] == "AP"} == pytest.approx(ap, abs=1e-12)
        assert [r["value"] for r in records if r["type"] == "AR"] == pytest.approx([ar], abs=1e-12)
        assert [r["value"] for r in records if r["type"] == "mAPAveragedOverIOUs"] == pytest.approx(
            [(ap[0.5] + ap[0.75]) / 2], abs=1e-12)
    for records in (ours, matrices):
        assert {r["parameters"]["iou_threshold"]: r["value"] for r in records if r["type"] == "ConfusionMatrix"} == {
            0.5: {"confusion_matrix": {"cat": {"cat": 2}}, "unmatched_predictions": {"cat": 0},
                  "unmatched_ground_truths": {"cat": 0}},
            0.75: {"confusion_matrix": {"cat": {"cat": 1}}, "unmatched_predictions": {"cat": 1},
                   "unmatched_ground_truths": {"cat": 1}}}


def test_mask_size_bound_and_its_option(tmp_path):
    """A 130-byte raster claiming 50,000 x 50,000 pixels is rejected before anything is decoded,
    naming --max_image_pixels, which detection now has (and passes to native rows and COCO
    files alike)."""
    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.tasks.detection import TASK
    from evalbeam.pipelines.launch.launcher import parse_command
    from evalbeam.schemas.coco_rows import box_rows
    from evalbeam.schemas.detection_rows import native_rows

    claim = {"size": [50000, 50000], "counts": [2_500_000_000]}
    rows = [{"datum_uid": "a", "annotations": [{"label": "cat", "raster": claim}]}]
    _, _, bad = native_rows(rows, [1], False, [], geometry="polygon")
    assert bad[0][2].startswith("annotation 0: raster: RLE of 50000 x 50000 = 2,500,000,000 pixels "
                                "exceeds the limit of 100,000,000")
    assert "--max_image_pixels" in bad[0][2]
    _, _, bad = native_rows(rows, [1], False, [], geometry="polygon", max_pixels=2_500_000_000)
    assert bad == []
    _, bad = box_rows([{"image_id": 1, "category_id": 1, "score": 0.5, "segmentation": claim}],
                      detections=True, need_segmentation=True)
    assert "exceeds the limit of 100,000,000" in bad[0][1]

    common = ["--groundtruths", "gt.json", "--predictions", "m.json", "--output", "out"]
    args = parse_command(TASK, common + ["--max_image_pixels", "169000000"])[0]
    assert args.max_image_pixels == 169_000_000
    with pytest.raises(UsageError, match="--max_image_pixels must lie in"):
        parse_command(TASK, common + ["--max_image_pixels", "0"])


# ------------------------------------------------------------------ 8. dense images

def _pair_counts_by_loops(gt_image, gt_label, dt_image, dt_label, n_images, max_det):
    pairs, predictions = np.zeros(n_images, np.int64), np.zeros(n_images, np.int64)
    for i in range(n_images):
        if max_det is None:
            predictions[i] = (dt_image == i).sum()
            pairs[i] = predictions[i] * (gt_image == i).sum()
            continue
        for label in set(dt_label[dt_image == i].tolist()):
            kept = min(((dt_image == i) & (dt_label == label)).sum(), max_det)
            predictions[i] += kept
            pairs[i] += kept * ((gt_image == i) & (gt_label == label)).sum()
    return pairs, predictions


@pytest.mark.parametrize("seed", range(4))
def test_image_pair_counts_match_a_loop(seed):
    """The pairs matching would compute per image, counted before any IoU: every prediction with
    every ground truth of its image (valor), or per category the top max_det predictions with
    the category's ground truths (coco); images with only ground truths or only predictions,
    labels only predicted, and empty inputs."""
    from evalbeam.transforms.kernels.detection import image_pair_counts

    rng = np.random.default_rng(seed)
    n_images = int(rng.integers(1, 8))
    n_gt, n_dt = (0, 0) if seed == 3 else rng.integers(0, 60, 2)
    gt_image, gt_label = rng.integers(0, n_images, n_gt), rng.integers(0, 4, n_gt)
    dt_image, dt_label = rng.integers(0, n_images, n_dt), rng.integers(0, 5, n_dt)
    for max_det in (None, 1, 3, 100):
        got = image_pair_counts(gt_image, gt_label, dt_image, dt_label, n_images, max_det)
        want = _pair_counts_by_loops(gt_image, gt_label, dt_image, dt_label, n_images, max_det)
        assert [g.tolist() for g in got] == [w.tolist() for w in want], max_det


def _dense_rows():
    """Ground truths and one model's predictions of two datums: "dense" has 4 ground truths
    (cat, cat, cat, dog) and 152 predictions (150 cats, 2 dogs), "plain" one of each."""
    def box(i, score=None):
        out = {"bbox": [i % 13 * 7.0, i // 13 * 7.0, i % 13 * 7.0 + 9, i // 13 * 7.0 + 9]}
        return out if score is None else dict(out, score=score)

    gts = [{"datum_uid": "dense", "annotations": [dict(box(i), label=label) for i, label
                                                  in enumerate(["cat", "cat", "cat", "dog"])]},
           {"datum_uid": "plain", "annotations": [dict(box(0), label="cat")]}]
    preds = [{"datum_uid": "dense", "annotations": [
                 dict(box(i, round(0.3 + 0.004 * i, 3)), label="cat" if i < 150 else "dog")
                 for i in range(152)]},
             {"datum_uid": "plain", "annotations": [dict(box(0, 0.9), label="cat")]}]
    return gts, preds


@pytest.mark.parametrize("protocol, pairs, predictions", [("valor", 608, 152), ("coco", 302, 102)])
def test_an_image_with_too_many_pairs_rejects_the_models_row(tmp_path, protocol, pairs, predictions):
    """The dense datum makes 152 x 4 = 608 pairs under the valor protocol, and under the coco
    protocol min(150, 100) x 3 cats + 2 x 1 dog = 302 with 102 predictions taking part. At the
    limit the image is matched; one pair below it the model's row for the image is rejected with
    the counts and the option, the run fails unless rejected rows are accepted, and the metrics
    are those of the input without that row (its ground truths unmatched)."""
    gts, preds = _dense_rows()
    write_jsonl(tmp_path / "gt.jsonl", gts)
    write_jsonl(tmp_path / "m.jsonl", preds)
    write_jsonl(tmp_path / "without.jsonl", preds[1:])
    common = ["--groundtruths", tmp_path / "gt.jsonl", "--protocol", protocol,
              "--max_rejected_fraction", "1"]

    assert run_detection(*common, "--predictions", f"m={tmp_path / 'm.jsonl'}", "--output",
                         tmp_path / "at", "--max_image_pairs", pairs) == 0
    assert read_jsonl(tmp_path / "at" / "rejected.jsonl") == []
    assert run_detection(*common, "--predictions", f"m={tmp_path / 'm.jsonl'}", "--output",
                         tmp_path / "over", "--max_image_pairs", pairs - 1) == 0
    kept = " (the top 100 of each category)" if protocol == "coco" else ""
    hint = "" if protocol == "coco" else "; or keep each image's top-scoring predictions"
    assert reasons(tmp_path / "over") == [("m", 1, (
        f"the image's {predictions} predictions{kept} and 4 ground truths make {pairs} "
        f"(prediction, ground truth) pairs to match, more than the limit of {pairs - 1:,} per "
        f"image and model (--max_image_pairs raises it{hint})"))]
    info = json.loads((tmp_path / "over" / "run.json").read_text())
    assert info["counts"]["m"]["rows_rejected"] == 1 and info["counts"]["m"]["rows_evaluated"] == 1
    assert info["options"]["max_image_pairs"] == pairs - 1
    assert run_detection(*common, "--predictions", f"m={tmp_path / 'without.jsonl'}", "--output",
                         tmp_path / "without") == 0
    assert ((tmp_path / "over" / "metrics.jsonl").read_bytes()
            == (tmp_path / "without" / "metrics.jsonl").read_bytes())
    assert (tmp_path / "at" / "metrics.jsonl").read_bytes() != (tmp_path / "without" / "metrics.jsonl").read_bytes()

    # without --max_rejected_fraction the rejected row fails the run (exit 1), naming the option
    assert run_detection("--groundtruths", tmp_path / "gt.jsonl", "--protocol", protocol,
                         "--predictions", f"m={tmp_path / 'm.jsonl'}", "--output", tmp_path / "fail",
                         "--max_image_pairs", pairs - 1) == 1


def _coco_dense(tmp_path, detections_on_1: int):
    images = [{"id": 1, "width": 200, "height": 200}, {"id": 2, "width": 200, "height": 200}]
    annotations = [{"id": k + 1, "image_id": 1 + (k == 3), "category_id": 1, "iscrowd": 0,
                    "bbox": [10.0 * k, 10.0, 30.0, 30.0], "area": 900.0} for k in range(4)]
    (tmp_path / "gt.json").write_text(json.dumps({
        "images": images, "annotations": annotations,
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]}))
    dts = [{"image_id": 1, "category_id": 1 + (k % 7 == 0), "bbox": [k % 40 * 4.0, 12.0, 30.0, 30.0],
            "score": round(0.2 + 0.0005 * k, 4)} for k in range(detections_on_1)]
    dts.append({"image_id": 2, "category_id": 1, "bbox": [30.0, 10.0, 30.0, 30.0], "score": 0.8})
    (tmp_path / "all.json").write_text(json.dumps(dts))
    (tmp_path / "without.json").write_text(json.dumps(dts[-1:]))
    return len(dts)


@pytest.mark.parametrize("protocol, runner", [("coco", []), ("valor", MULTIPROCESS)])
def test_coco_file_image_with_too_many_pairs_multiprocess(tmp_path, protocol, runner):
    """A COCO results file: every detection of the crowded image is a rejected row, each naming
    the image, and the metrics are those of the results without them. Image 1 has 3 cats and
    no dogs in the ground truth, and 300 detections (43 dogs): coco counts min(257, 100) x 3 =
    300 pairs with 100 + 43 predictions taking part (dogs have no ground truth to pair with),
    valor 300 x 3 = 900."""
    n = _coco_dense(tmp_path, 300)
    pairs = {"coco": 300, "valor": 900}[protocol]
    common = ["--groundtruths", tmp_path / "gt.json", "--protocol", protocol,
              "--max_rejected_fraction", "1", *runner]
    assert run_detection(*common, "--predictions", f"m={tmp_path / 'all.json'}", "--output",
                         tmp_path / "over", "--max_image_pairs", pairs - 1) == 0
    rejected = reasons(tmp_path / "over")
    assert [position for _, position, _ in rejected] == list(range(n - 1))
    assert {reason.split(" predictions")[0] for _, _, reason in rejected} == {
        "image 1: the image's " + ("143" if protocol == "coco" else "300")}
    assert all(f"make {pairs} (prediction, ground truth) pairs" in r for _, _, r in rejected)
    info = json.loads((tmp_path / "over" / "run.json").read_text())
    assert (info["counts"]["m"]["rows_rejected"], info["counts"]["m"]["rows_evaluated"]) == (n - 1, 1)
    assert run_detection(*common, "--predictions", f"m={tmp_path / 'without.json'}", "--output",
                         tmp_path / "without") == 0
    assert ((tmp_path / "over" / "metrics.jsonl").read_bytes()
            == (tmp_path / "without" / "metrics.jsonl").read_bytes())
    assert run_detection(*common, "--predictions", f"m={tmp_path / 'all.json'}", "--output",
                         tmp_path / "at", "--max_image_pairs", pairs) == 0
    assert read_jsonl(tmp_path / "at" / "rejected.jsonl") == []


def test_a_dense_image_costs_bounded_memory(tmp_path):
    """One image of 4,000 ground truths and 4,000 predictions, all of one label and on one
    spot (every pair overlaps): 16M pairs, beyond the default 10M. Matching them took some
    150 bytes a pair (2.4 GB here; 30,000 a side killed a 24 GB machine); the row is rejected
    from its counts before any IoU, and the run stays small."""
    box = {"label": "cat", "bbox": [10, 10, 60, 60]}
    write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "dense", "annotations": [box] * 4000},
                                        {"datum_uid": "plain", "annotations": [box]}])
    write_jsonl(tmp_path / "m.jsonl", [{"datum_uid": "dense", "annotations": [dict(box, score=0.5)] * 4000},
                                       {"datum_uid": "plain", "annotations": [dict(box, score=0.5)]}])
    # the child's own high-water mark (VmHWM): ru_maxrss of a child started by vfork and exec
    # starts at its parent's peak, this test process's (1.38 GB once in the full suite)
    script = ("import sys\nfrom evalbeam.pipelines.tasks.detection import run\n"
              "code = run(sys.argv[1:])\n"
              "peak = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')]\n"
              "print(code, peak[0])\n")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script, "--groundtruths", str(tmp_path / "gt.jsonl"),
                           "--predictions", f"m={tmp_path / 'm.jsonl'}", "--output", str(tmp_path / "out"),
                           "--max_rejected_fraction", "1"], capture_output=True, text=True, timeout=600)
    code, peak_kb = map(int, done.stdout.split()[-2:])
    assert code == 0, done.stderr
    assert [r[1] for r in reasons(tmp_path / "out")] == [1]
    assert "16,000,000 (prediction, ground truth) pairs" in reasons(tmp_path / "out")[0][2]
    assert peak_kb < 1_000_000, peak_kb


def test_chunked_pair_kernels_are_exact(monkeypatch):
    """Box and polygon IoU computed a chunk of pairs at a time, polygons only where bounding boxes
    overlap, and the one-to-one walk a block at a time with its early stop, give the values of
    the one-shot computations: random boxes and triangles, identical ones, polygons whose
    boxes only touch, an empty polygon."""
    import shapely

    from evalbeam.transforms.kernels import detection, detection_confusion, detection_geometry, masks

    rng = np.random.default_rng(7)
    n_dt, n_gt = 23, 19
    xy = rng.uniform(0, 50, (n_dt + n_gt, 2))
    wh = rng.uniform(1, 20, (n_dt + n_gt, 2))
    boxes = np.c_[xy, wh]
    boxes[5] = boxes[n_dt + 2]                       # identical pair
    crowd = rng.random(n_gt) < 0.2
    d, g = np.repeat(np.arange(n_dt), n_gt), np.tile(np.arange(n_gt), n_dt)
    whole = detection.pair_box_iou(boxes[:n_dt], boxes[n_dt:], crowd)(d, g)
    monkeypatch.setattr(detection_geometry, "PAIR_CHUNK", 7)
    assert detection.pair_box_iou(boxes[:n_dt], boxes[n_dt:], crowd)(d, g).tobytes() == whole.tobytes()

    shapes = [shapely.Polygon([(x, y), (x + w, y), (x + w / 2, y + h)]) for x, y, w, h in boxes]
    shapes[n_dt + 3] = shapely.Polygon([(shapes[0].bounds[2], 0), (shapes[0].bounds[2] + 5, 0),
                                        (shapes[0].bounds[2] + 5, 60)])    # touches dt 0's box
    shapes[n_dt + 4] = shapely.Polygon()
    a, b = np.array(shapes[:n_dt], dtype=object)[d], np.array(shapes[n_dt:], dtype=object)[g]
    inter = shapely.area(shapely.intersection(a, b))
    union = shapely.area(a) + shapely.area(b) - inter
    want = np.divide(inter, union, out=np.zeros(d.size), where=union > 0)
    for chunk in (7, 1 << 20):
        monkeypatch.setattr(masks, "PAIR_CHUNK", chunk)
        got = masks.pair_polygon_iou(shapes[:n_dt], shapes[n_dt:])(d, g)
        assert got.tobytes() == want.tobytes()
    assert (want > 0).sum() > 10 and want[(d == 5) & (g == 2)] == 1.0

    def greedy(pair_dt, pair_gt, pair_iou, score):
        keep = np.flatnonzero(pair_iou > 1e-9)
        order = keep[np.lexsort((pair_dt[keep], pair_gt[keep], -pair_iou[keep], -score[pair_dt[keep]]))]
        used_d, used_g, taken = set(), set(), []
        for i in order:
            if pair_dt[i] not in used_d and pair_gt[i] not in used_g:
                used_d.add(pair_dt[i]), used_g.add(pair_gt[i]), taken.append(i)
        return sorted(taken)

    score = np.round(rng.random(n_dt), 1)               # ties
    for iou in (whole, np.ones(d.size)):
        for block in (3, 1 << 16):
            monkeypatch.setattr(detection_confusion, "WALK_BLOCK", block)
            assert detection_confusion.one_to_one(d, g, iou, score).tolist() == greedy(d, g, iou, score)


@pytest.mark.parametrize("geometry", ["polygon", "raster"])
def test_segm_ious_looked_up_equal_ious_computed(tmp_path, monkeypatch, geometry):
    """Under the valor protocol with --iou_type segm, each image's pair IoUs are computed once
    and looked up by matching: the records equal those of a run that computes every IoU it
    asks for (several images and labels, overlapping shapes, tied scores)."""
    from evalbeam.transforms import detection

    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(5)

    def shape(x, y, w, h):
        if geometry == "polygon":
            return {"polygon": [[x, y], [x + w, y], [x + w // 2, y + h]]}
        mask = np.zeros((64, 64), np.uint8)
        mask[y:y + h, x:x + w] = 1
        rle = mask_utils.encode(np.asfortranarray(mask))
        return {"raster": {"size": rle["size"], "counts": rle["counts"].decode()}}

    gts, preds = [], []
    for i in range(6):
        boxes = [[int(v) for v in rng.integers(0, 40, 2)] + [int(v) for v in rng.integers(4, 20, 2)]
                 for _ in range(int(rng.integers(0, 7)))]
        gts.append({"datum_uid": f"d{i}", "annotations": [
            dict(shape(*b), label=f"c{rng.integers(0, 3)}") for b in boxes]})
        # predictions: shifted copies of the ground truths (IoUs across the thresholds, some
        # with another label) and a few strays; scores tied in fifths
        near = [[b[0] + int(rng.integers(0, 3)), b[1] + int(rng.integers(0, 3)), b[2], b[3]] for b in boxes]
        stray = [[int(v) for v in rng.integers(0, 40, 2)] + [8, 8] for _ in range(int(rng.integers(0, 3)))]
        preds.append({"datum_uid": f"d{i}", "annotations": [
            dict(shape(*b), label=f"c{rng.integers(0, 3)}", score=float(rng.integers(1, 5)) / 5)
            for b in near + near[:2] + stray]})
    write_jsonl(tmp_path / "gt.jsonl", gts)
    write_jsonl(tmp_path / "m.jsonl", preds)
    common = ["--groundtruths", tmp_path / "gt.jsonl", "--predictions", f"m={tmp_path / 'm.jsonl'}",
              "--iou_type", "segm", "--max_examples", "3"]
    assert run_detection(*common, "--output", tmp_path / "looked_up") == 0
    monkeypatch.setattr(detection, "_looked_up", lambda d, g, iou, n: computed)
    computed = None

    real = detection.shard_state

    def shard_state(images, gts, dts, category_id, iou_type, *args, **kwargs):
        nonlocal computed
        if dts.segmentation and gts.segmentation:
            from evalbeam.transforms.kernels.masks import pair_geometry_iou
            computed = pair_geometry_iou(dts.segmentation, gts.segmentation)
        return real(images, gts, dts, category_id, iou_type, *args, **kwargs)

    monkeypatch.setattr(detection, "shard_state", shard_state)
    assert run_detection(*common, "--output", tmp_path / "computed") == 0
    records = read_jsonl(tmp_path / "computed" / "metrics.jsonl")
    assert any(r["type"] == "ConfusionMatrix" for r in records)
    assert (tmp_path / "looked_up" / "metrics.jsonl").read_bytes() == \
        (tmp_path / "computed" / "metrics.jsonl").read_bytes()


def test_evaluate_detection_ptransform_bounds_pairs():
    """EvaluateDetection(max_image_pairs=N) rejects the crowded prediction row as the CLI does."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from evalbeam.pipelines.launch.common import local_pipeline
    from evalbeam.transforms.detection import EvaluateDetection, users_default_config
    from evalbeam.transforms.kernels.detection import DetectionConfig

    gts, preds = _dense_rows()
    with pytest.raises(ValueError, match="max_image_pairs must be at least 1"):
        EvaluateDetection(DetectionConfig(max_image_pairs=0))
    with local_pipeline() as p:
        _, rejected, _, _ = ({"groundtruths": p | "G" >> beam.Create(gts), "m": p | "M" >> beam.Create(preds)}
                             | EvaluateDetection(users_default_config()._replace(max_image_pairs=607),
                                                 with_diagnostics=True))

        def one_reject(found):
            assert [(r["source"], r["datum_uid"], r["reason"].split(" (--")[0]) for r in found] == [
                ("m", "dense", "the image's 152 predictions and 4 ground truths make 608 "
                               "(prediction, ground truth) pairs to match, more than the limit of "
                               "607 per image and model")]

        assert_that(rejected, one_reject)


def test_junk_category_ids_keep_the_sizes_side_input_small():
    """A results piece of 200,000 detections with as many distinct category ids reports only its
    16 largest categories to the side input that decides which categories are split (they are
    rejected as unknown later); the largest come first, ties by the smaller id; merging pieces
    adds their counts per model."""
    from evalbeam.transforms.detection_reading import SIZED_CATEGORIES, DetectionSizes, detection_sizes

    ids = np.r_[np.arange(200_000), np.full(50, 7), np.full(30, 3), np.full(30, 99_999)]
    sizes = detection_sizes(np.random.default_rng(0).permutation(ids).astype(np.int64))
    assert len(sizes) == SIZED_CATEGORIES == 16
    assert list(sizes.items())[:3] == [(7, 51), (3, 31), (99_999, 31)]
    assert all(n == 1 for n in list(sizes.values())[3:])
    assert list(sizes)[3:] == [0, 1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14]
    combine = DetectionSizes()
    acc = combine.add_input(combine.create_accumulator(), ("m", {1: 5, 2: 1}))
    other = combine.add_input(combine.create_accumulator(), ("m", {1: 2}))
    other = combine.add_input(other, ("n", {1: 4}))
    assert combine.extract_output(combine.merge_accumulators([acc, other])) == {
        "m": {1: 7, 2: 1}, "n": {1: 4}}
    assert detection_sizes(np.zeros(0, np.int64)) == {}
