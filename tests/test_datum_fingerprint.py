"""run.json's "datums": the count and fingerprint of the ground truth's datums evaluated, in
every task. The same datums give the same fingerprint whatever the order of the rows, the
shards or the runner; one datum renamed (same count) gives another, and a --baseline check
then reports the baseline as evaluated on other data, which row counts alone could not see.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from helpers import MULTIPROCESS, ROOT, read_jsonl, write_jsonl

INPUTS = ROOT / "tests" / "golden" / "inputs"

# task, ground truth, one model's predictions, the id field, extra options
CASES = {
    "classification": ("classification/groundtruths.jsonl", "classification/model_a.jsonl", "datum_uid", []),
    "detection": ("detection/groundtruths.jsonl", "detection/good.jsonl", "datum_uid", []),
    "segmentation": ("segmentation/groundtruths.jsonl", "segmentation/good.jsonl", "datum_uid", []),
    "text": ("text/groundtruths.jsonl", "text/good.jsonl", "datum_uid", []),
    "retrieval": ("retrieval/qrels.jsonl", "retrieval/run_a.jsonl", "query_id", []),
}


def run_task(task: str, *args) -> int:
    return importlib.import_module(f"evalbeam.pipelines.tasks.{task}").run([str(a) for a in args])


def lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def evaluate(task, folder, gt, pred, *extra) -> dict:
    code = run_task(task, "--groundtruths", gt, "--predictions", f"m={pred}", "--output", folder,
                    "--max_rejected_fraction", "1", "--quiet", *extra)
    info = json.loads((folder / "run.json").read_text())
    assert code == 0 and info["status"] == "complete", info["problems"]
    return info


@pytest.mark.parametrize("task", sorted(CASES))
def test_same_datums_same_fingerprint_other_datums_another(tmp_path, task):
    gt_name, pred_name, key, extra = CASES[task]
    gt, pred = INPUTS / gt_name, INPUTS / pred_name
    first = evaluate(task, tmp_path / "first", gt, pred, *extra)
    datums = first["datums"]
    assert len(datums["fingerprint"]) == 32 and int(datums["fingerprint"], 16)

    # each evaluated datum counted once: the distinct ids of the ground-truth rows not rejected
    rejected = {r.get("line") for r in read_jsonl(tmp_path / "first" / "rejected.jsonl")
                if r["source"] == "groundtruths"}
    ids = []
    for number, line in enumerate(lines(gt), 1):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if number not in rejected and isinstance(row, dict):
            ids.append(row[key])
    assert datums["evaluated"] == len(set(ids))

    # the rows in reverse order, in other shards (the multi-process runner for one task)
    (tmp_path / "in").mkdir()
    for name, source in (("gt.jsonl", gt), ("pred.jsonl", pred)):
        (tmp_path / "in" / name).write_text("".join(reversed(lines(source))), encoding="utf-8")
    runner = MULTIPROCESS if task == "text" else []
    again = evaluate(task, tmp_path / "again", tmp_path / "in" / "gt.jsonl", tmp_path / "in" / "pred.jsonl",
                     "--num_shards", "3", *runner, *extra)
    assert again["datums"] == datums

    # one evaluated datum renamed in the ground truth: as many datums, another fingerprint
    renamed = sorted(set(ids))[len(set(ids)) // 2]
    changed = []
    for line in lines(gt):
        try:
            row = json.loads(line)
        except ValueError:
            changed.append(line)
            continue
        if isinstance(row, dict) and row.get(key) == renamed:
            row[key] = renamed + "-renamed"
            line = json.dumps(row) + "\n"
        changed.append(line)
    (tmp_path / "in" / "renamed.jsonl").write_text("".join(changed), encoding="utf-8")
    other = evaluate(task, tmp_path / "other", tmp_path / "in" / "renamed.jsonl", pred, *extra,
                     "--baseline", tmp_path / "first")
    assert other["datums"]["evaluated"] == datums["evaluated"]
    assert other["datums"]["fingerprint"] != datums["fingerprint"]
    assert other["counts"]["groundtruths"]["rows_evaluated"] == first["counts"]["groundtruths"]["rows_evaluated"]
    differs = [p for p in other["problems"] if p["code"] == "baseline_data_differs"]
    assert len(differs) == 1
    assert (f"datums evaluated: fingerprint {datums['fingerprint']} ({datums['evaluated']} datums) "
            f"in the baseline, {other['datums']['fingerprint']} ({datums['evaluated']}) in this run"
            ) in differs[0]["message"]
    # against itself, nothing differs
    same = evaluate(task, tmp_path / "same", gt, pred, *extra, "--baseline", tmp_path / "first")
    assert not [p for p in same["problems"] if p["code"] == "baseline_data_differs"]


def test_coco_files_fingerprint_their_images(tmp_path):
    """COCO files: the datums are the images (an image without annotations included), named by
    their ids; the detections' order does not matter."""
    images = [{"id": i, "width": 100, "height": 100} for i in (3, 1, 7)]
    annotations = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400,
                    "iscrowd": 0},
                   {"id": 2, "image_id": 3, "category_id": 1, "bbox": [30, 30, 20, 20], "area": 400,
                    "iscrowd": 0}]
    dts = [{"image_id": 1, "category_id": 1, "bbox": [11, 10, 20, 20], "score": 0.9},
           {"image_id": 3, "category_id": 1, "bbox": [50, 50, 20, 20], "score": 0.4}]
    document = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "cat"}]}
    (tmp_path / "gt.json").write_text(json.dumps(document))
    (tmp_path / "a.json").write_text(json.dumps(dts))
    (tmp_path / "b.json").write_text(json.dumps(dts[::-1]))
    first = evaluate("detection", tmp_path / "first", tmp_path / "gt.json", tmp_path / "a.json")
    second = evaluate("detection", tmp_path / "second", tmp_path / "gt.json", tmp_path / "b.json")
    assert first["datums"] == second["datums"] and first["datums"]["evaluated"] == 3
    document["images"][2]["id"] = 8
    (tmp_path / "gt8.json").write_text(json.dumps(document))
    third = evaluate("detection", tmp_path / "third", tmp_path / "gt8.json", tmp_path / "a.json")
    assert third["datums"]["evaluated"] == 3 and third["datums"]["fingerprint"] != first["datums"]["fingerprint"]


def test_fingerprint_sums_split_and_order_free():
    """The sums of any split of a set add up to the sums of the set (mod 2^64), in any order;
    the mixer spreads nearby hashes (0, 1, 2, ...) over all 64 bits."""
    from evalbeam.schemas.hashing import fingerprint, fingerprint_sums

    rng = np.random.default_rng(3)
    hashes = rng.integers(0, 2**63, 1000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    whole = fingerprint(fingerprint_sums(hashes))
    for _ in range(3):
        cuts = np.sort(rng.integers(0, hashes.size, 4))
        parts = [fingerprint_sums(part) for part in np.split(rng.permutation(hashes), cuts)]
        assert fingerprint((sum(p[0] for p in parts), sum(p[1] for p in parts))) == whole
    assert fingerprint(fingerprint_sums(np.zeros(0, np.uint64))) == "0" * 32
    small = fingerprint_sums(np.arange(1, dtype=np.uint64))
    assert all(value > 2**40 for value in small)
    assert fingerprint(fingerprint_sums(hashes[1:])) != whole
