"""COCO files read in pieces (schemas/json_pieces.py; ReadCocoFile.cut): a results file's array
and an instances file's "annotations" array. Every output a run writes is the one it writes
when the files are read whole (--input_split_bytes 0), for boxes and masks (areas from boxes or
from masks, which the first result decides), both protocols, tied scores, tied ground truths
and bad rows on both sides of the cuts (annotations of unknown, rejected or uncategorised
images too), and errors of a file that is not valid JSON, named as a whole read names them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers import MULTIPROCESS, run_cli_subprocess
from test_detection_oracle import make_case

COUNTS = ("counts", "rows_read", "rows_rejected", "first_rejections")
HOSTILE = [{"image_id": "7", "category_id": 1, "bbox": [1, 2, 3, 4], "score": 0.5},
           {"image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4], "score": 1.5},
           "not an object", [1, 2], {"image_id": 10 ** 30, "category_id": 1, "score": 0.1},
           {"image_id": 1, "category_id": 987654, "bbox": [1, 2, 3, 4], "score": 0.4},
           {"image_id": 1, "category_id": 1, "bbox": [1, 2, "3", 4], "score": 0.3,
            "note": "\\\"],[{\u00e9"}]
TIED_IMAGE = 434343
REPEATED_IMAGE = 424242     # two images have this id: both are rejected, and its annotations
HOSTILE_TRUTH = [{"id": 1, "image_id": 99999, "category_id": 1, "bbox": [1, 2, 3, 4], "area": 12},
                 {"id": 2, "image_id": REPEATED_IMAGE, "category_id": 1, "bbox": [1, 2, 3, 4],
                  "area": 12},
                 {"id": 3, "image_id": None, "category_id": 987654, "bbox": [1, 2, 3, 4]},
                 "not an object", {"id": 4, "image_id": 1, "category_id": 1, "bbox": [1, "2", 3, 4],
                                   "note": "\\\"],[{\u00e9"}]


def write_case(folder, seed: int, iou_type: str) -> tuple[str, str]:
    """instances.json and results.json of the oracle's random case, with copies of detections
    (same score, another box) next to them, bad rows spread over both arrays, and for boxes two
    ground truths at the two ends of the annotations whose order decides the matching."""
    gt, results = make_case(seed, iou_type)
    rng = random.Random(seed)
    rows = []
    for row in results:
        rows.append(row)
        if "bbox" in row and rng.random() < 0.3:
            rows.append(dict(row, bbox=[v + 1.0 for v in row["bbox"]]))
    for bad in HOSTILE:
        rows.insert(rng.randrange(1, len(rows)), bad)
    annotations = list(gt["annotations"])
    first = gt["images"][0]
    uncategorised = {"id": 5, "image_id": first["id"], "category_id": 987654, "bbox": [1, 2, 3, 4],
                     "area": 12}
    for bad in HOSTILE_TRUTH + [uncategorised]:
        annotations.insert(rng.randrange(1, len(annotations)), bad)
    images = gt["images"] + [dict(first, id=REPEATED_IMAGE), dict(first, id=REPEATED_IMAGE)]
    if iou_type == "bbox":
        # equal IoU (0.82) with the first detection: pycocotools gives it the later one, and
        # the second detection then matches the earlier one at 0.82 (in the other order, the
        # later one at 0.54 only: a false positive from IoU 0.55 up)
        images.append({"id": TIED_IMAGE, "file_name": "tie.jpg", "height": 100, "width": 100})
        tie = {"image_id": TIED_IMAGE, "category_id": gt["categories"][0]["id"]}
        annotations.insert(0, dict(tie, id=6, bbox=[0, 0, 10, 10], area=100.0, iscrowd=0))
        annotations.append(dict(tie, id=7, bbox=[2, 0, 10, 10], area=100.0, iscrowd=0))
        rows += [dict(tie, bbox=[1, 0, 10, 10], score=0.999),
                 dict(tie, bbox=[-1, 0, 10, 10], score=0.998)]
    # the annotations after the images, as COCO's own files have them
    gt = {**{k: v for k, v in gt.items() if k != "annotations"}, "images": images,
          "annotations": annotations}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "instances.json").write_text(json.dumps(gt, indent=rng.choice([None, 1])))
    (folder / "results.json").write_text(json.dumps(rows, indent=rng.choice([None, 1])))
    return str(folder / "instances.json"), str(folder / "results.json")


def run(folder, gt, results, out, *extra, model="m"):
    done = run_cli_subprocess(["detection", "--groundtruths", gt, "--predictions",
                               f"{model}={results}", "--output", folder / out, "--quiet",
                               "--max_rejected_fraction", "0.5", *extra])
    return done, folder / out


def outputs(folder) -> dict:
    run_json = json.loads((folder / "run.json").read_text())
    return {"metrics": (folder / "metrics.jsonl").read_bytes(),
            "rejected": (folder / "rejected.jsonl").read_bytes(),
            "counts": {key: run_json[key] for key in COUNTS}}


@pytest.mark.parametrize("seed, iou_type, protocol", [
    (0, "bbox", "coco"), (1, "bbox", "valor"), (2, "segm", "coco"), (3, "segm", "coco"),
    (4, "segm", "coco"), (5, "bbox", "coco")])
def test_pieces_write_what_a_whole_read_writes(tmp_path, seed, iou_type, protocol):
    gt, results = write_case(tmp_path / "in", seed, iou_type)
    extra = ["--iou_type", iou_type, "--protocol", protocol]
    whole, whole_out = run(tmp_path, gt, results, "whole", *extra, "--input_split_bytes", "0")
    assert whole.returncode == 0, whole.stderr[-2000:]
    # pieces of ~2 KB: tens of them, cut between copies with equal scores and around bad rows;
    # one run on two worker processes, which hand the pieces to the shards in any order
    runner = MULTIPROCESS if seed == 5 else []
    cut, cut_out = run(tmp_path, gt, results, "cut", *extra, "--input_split_bytes", "2000", *runner)
    assert cut.returncode == 0, cut.stderr[-2000:]
    assert outputs(cut_out) == outputs(whole_out)
    grouped = [json.loads((o / "run.json").read_text())["shuffles"]["GroupByShard"]["elements"]
               for o in (whole_out, cut_out)]
    assert grouped[1] > grouped[0] + 10, grouped      # it was read in pieces
    assert len(_reader(gt, results).cut("groundtruths", 0, gt, 2000)) > 3   # the instances too


def _reader(gt: str, results: str):
    from types import SimpleNamespace

    from evalbeam.transforms.detection_reading import ReadCocoFile

    sources = {"groundtruths": SimpleNamespace(files=[gt]), "m": SimpleNamespace(files=[results])}
    reader = ReadCocoFile(sources, "bbox", [], 1, True, 0.0)
    reader.setup()
    return reader


def test_the_mask_area_case_has_a_first_result_without_a_box(tmp_path):
    """pycocotools takes areas from masks when the first result has no bbox, and the pieces
    after the first learn it from the cut: seed 4 above checks that, since its results are
    "mixed" (the first has no bbox, some later ones have)."""
    gt, results = write_case(tmp_path / "in", 4, "segm")
    first = json.loads(open(results).read())[0]
    assert "bbox" not in first and "segmentation" in first
    assert sum("bbox" in r for r in json.loads(open(results).read())[1:] if isinstance(r, dict)) > 3


def fails_as_a_whole_read_fails(tmp_path, gt, results):
    """Read whole and in pieces of ~2 KB, the run stops with the same one-paragraph error,
    exit 2, no traceback and no metrics."""
    messages = []
    for split in ("0", "2000"):
        done, out = run(tmp_path, gt, results, f"out{split}", "--input_split_bytes", split)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        assert not (out / "metrics.jsonl").exists()
        messages += [line.split("Nothing of it was used")[0] for line in done.stderr.splitlines()
                     if "Nothing of it was used" in line]
    assert len(messages) == 2 and messages[0] == messages[1], messages


@pytest.mark.parametrize("broken", [
    "[ROWS, , {}]", "[ROWS, ]", "[ROWS, tru, ROWS]", "[ROWS, {\"a\": \"\\ud800\"}, ROWS]",
    "[ROWS, {\"image_id\": 1 \"category_id\": 2}, ROWS]", "[ROWS]]", "[ROWS, ROWS"])
def test_a_broken_file_fails_as_a_whole_read_fails(tmp_path, broken):
    """Pieces of a file that is not valid JSON: the run stops with the error a whole read gives
    (exit 2, one paragraph, no metrics), whichever piece found it."""
    gt, results = write_case(tmp_path / "in", 0, "bbox")
    rows = json.loads(open(results).read())
    text = ", ".join(json.dumps(r) for r in rows if isinstance(r, dict))
    with open(results, "w") as f:
        f.write(broken.replace("ROWS", text))
    fails_as_a_whole_read_fails(tmp_path, gt, results)


def test_pieces_in_any_order_make_the_file_s_state():
    """MatchDetection restores the file's order of a shard's pieces, whatever order the shuffle
    hands them in: ties of score are broken by that order (pycocotools' stable sort), and ties
    of IoU between ground truths too, so the detections with equal scores and the two tied
    ground truths of write_case make the states differ otherwise."""
    import pickle
    import tempfile

    from apache_beam.pvalue import TaggedOutput

    from evalbeam.transforms.detection import TAG_CATEGORIES, MatchDetection
    from evalbeam.transforms.graph import MatchContext
    from evalbeam.transforms.kernels.detection import DetectionConfig

    def shard_pieces(outputs):
        return [value for value in outputs if not isinstance(value, TaggedOutput)]

    with tempfile.TemporaryDirectory() as folder:
        gt, results = write_case(Path(folder), 0, "bbox")
        reader = _reader(gt, results)
        read = list(reader.process(("groundtruths", 0)))
        truth = shard_pieces(read)
        categories = next(o.value for o in read if isinstance(o, TaggedOutput) and o.tag == TAG_CATEGORIES)
        whole = shard_pieces(reader.process(("m", 0)))
        cuts = reader.cut("m", 0, results, 2000)
        pieces = [o for cut in cuts for o in shard_pieces(reader.process(cut))]
        truth_cuts = reader.cut("groundtruths", 0, gt, 2000)
        truth_pieces = [o for cut in truth_cuts for o in shard_pieces(reader.process(cut))]
        assert reader.cuttable("groundtruths", gt) and reader.cuttable("m", results)
    assert len(cuts) > 10 and len(pieces) == len(cuts)
    assert len(truth_cuts) > 5 and len(truth_pieces) == len(truth_cuts)
    files = {"groundtruths": [gt], "m": [results]}
    matcher = MatchDetection(DetectionConfig(), MatchContext(("m",), ((),), files))
    matcher.setup()

    def states(gts, dts):
        outputs = list(matcher.process((0, [value for _, value in gts + dts]), categories))
        return ([pickle.dumps(o[1].matches) for o in outputs if not isinstance(o, TaggedOutput)],
                sorted(str(o.value) for o in outputs if isinstance(o, TaggedOutput)))

    expected = states(truth, whole)
    assert expected[1]       # the rejects of the bad rows, and the counts
    assert states(truth_pieces, pieces) == expected
    assert states(truth_pieces[::-1], pieces[::-1]) == expected
    shuffled = random.Random(3)
    for _ in range(3):
        assert states(shuffled.sample(truth_pieces, len(truth_pieces)),
                      shuffled.sample(pieces, len(pieces))) == expected


@pytest.mark.parametrize("broken", [
    '{"images": [IMAGES], "categories": CATS, "annotations": [ANNS, , {}]}',
    '{"images": [IMAGES], "categories": CATS, "annotations": [ANNS, tru, ANNS]}',
    '{"images": [IMAGES], "categories": CATS, "annotations": [ANNS, {"a": "\\ud800"}, ANNS]}',
    '{"images": [IMAGES, tru], "categories": CATS, "annotations": [ANNS, ANNS]}',
    '{"images": [IMAGES], "categories": CATS, "annotations": [ANNS, ANNS] "x": 1}',
    '{"images": [IMAGES], "categories": CATS, "annotations": [ANNS]]}',
    '{"images": {"a": [IMAGES]}, "categories": CATS, "annotations": [ANNS, ANNS]}',
    '{"images": [IMAGES], "categories": CATS + CATS, "annotations": [ANNS, ANNS]}',
    '{"images": [IMAGES], "categories": CATS + CATS, "annotations": [ANNS, tru, ANNS]}'])
def test_a_broken_instances_file_fails_as_a_whole_read_fails(tmp_path, broken):
    """An instances file cut into its annotations' pieces and its rest that is not valid JSON
    (in a piece or in the rest) or not a usable instances file: the run stops with the error a
    whole read gives (exit 2, one paragraph, no metrics)."""
    gt, results = write_case(tmp_path / "in", 0, "bbox")
    document = json.loads(Path(gt).read_text())
    text = broken.replace("CATS + CATS", json.dumps(document["categories"] * 2))
    for key, part in (("IMAGES", "images"), ("ANNS", "annotations"), ("CATS", "categories")):
        text = text.replace(key, ", ".join(json.dumps(r) for r in document[part])
                            if key != "CATS" else json.dumps(document[part]))
    with open(gt, "w") as f:
        f.write(text)
    fails_as_a_whole_read_fails(tmp_path, gt, results)


def test_a_sweep_cuts_results_files_and_each_cell_equals_its_run_alone(tmp_path):
    """A sweep of two detection cells over one instances file: each results file is cut (its
    reading shared by the graph as any read), and each cell writes what its run alone writes
    reading the file whole."""
    gt, results = write_case(tmp_path / "in", 5, "bbox")
    rows = json.loads(open(results).read())
    second = tmp_path / "in" / "second.json"
    second.write_text(json.dumps([dict(r, score=round(r["score"] * 0.9, 6))
                                  if isinstance(r, dict) and isinstance(r.get("score"), float) else r
                                  for r in rows]))
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f"""
[sweep]
max_rejected_fraction = 0.5

[[dataset]]
name = "boxes"
task = "detection"
groundtruths = "{gt}"

[[model]]
name = "first"
predictions = "{results}"

[[model]]
name = "second"
predictions = "{second}"
""")
    done = run_cli_subprocess(["sweep", manifest, "--output", tmp_path / "sweep", "--quiet",
                               "--input_split_bytes", "2000"])
    assert done.returncode == 0, done.stderr[-3000:]
    for model, path in (("first", results), ("second", str(second))):
        alone, out = run(tmp_path, gt, path, f"alone-{model}", "--input_split_bytes", "0", model=model)
        assert alone.returncode == 0, alone.stderr[-2000:]
        cell = tmp_path / "sweep" / "cells" / "boxes" / model
        for name in ("metrics.jsonl", "rejected.jsonl"):
            got = (cell / name).read_text().replace(str(cell), "OUT")
            assert got == (out / name).read_text().replace(str(out), "OUT"), (model, name)
        shuffles = json.loads((cell / "run.json").read_text())["shuffles"]
        assert shuffles["GroupByShard"]["elements"] > 10, shuffles
