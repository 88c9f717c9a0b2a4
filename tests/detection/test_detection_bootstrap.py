"""Bootstrap intervals of `evalbeam detection` (issue 16).

Replicate r of a dataset is the dataset in which every image appears w times, w its Poisson
weight in r (kernels.bootstrap.Bootstrap.weights of FNV-1a 64 of the image's datum_uid; for COCO
files the decimal image id). The oracle builds that dataset literally: copy c of image i gets
the id 20 i + c (weights stop at 18), so copies follow their image in pycocotools' tie order
(image id, then rank), with new annotation ids; pycocotools' COCOeval on it must give the
replicate's arrays bit for bit and its 12 statistics (overall and per category) to 1e-12. The
valor protocol's replicate records must equal the records evalbeam's own point path (itself
checked against valor-lite and pycocotools) makes of the duplicated dataset. Through the CLI:
intervals are numpy's percentiles of the replicate statistics the test recomputes with
pycocotools, point values equal the run without --bootstrap, and metrics.jsonl is byte
identical for 1 and 7 shards, shuffled inputs and the multi-process runner.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow as pa
import pytest
from helpers import MULTIPROCESS, read_jsonl, run_cli_subprocess
from test_detection_oracle import (_gt_only, bbox_results, first_has_bbox, make_case,
                                   make_detections, make_grid_case, make_groundtruth, oracle)

from evalbeam.schemas.coco_rows import box_rows, image_rows
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.transforms.detection import shard_state
from evalbeam.transforms.uncertainty import finish_record
import evalbeam.transforms.kernels.bootstrap as bootstrap_kernel
from evalbeam.transforms.kernels.bootstrap import REPLICATES, Bootstrap, attach_replicates
from evalbeam.transforms.kernels.detection import (
    SUMMARY_NAMES, CocoState, DetectionConfig, DetectionState, Protocol, _identity, _valor_records,
    _valor_replicate_records, accumulate_replicates, coco_summary_replicates, state_records,
    summarize_replicates)

COPY_STRIDE = 20      # > kernels.bootstrap.MAX_WEIGHT: copies of image i get ids 20 i .. 20 i + 18


# ----------------------------------------------------------------------------------------------
# helpers

def image_weights(dataset: dict, bootstrap: Bootstrap) -> tuple[list, np.ndarray]:
    """(image ids, uint8[R, I]): the weights evalbeam draws for COCO images (hash of str(id))."""
    ids = [im["id"] for im in dataset["images"]]
    return ids, bootstrap.weights(fnv1a_64(pa.array([str(i) for i in ids], pa.string())))


def duplicated(dataset: dict, results: list, weight: dict) -> tuple[dict, list]:
    """The dataset with image i present weight[i] times: ids 20 i + c, every annotation and
    result copied onto each copy (file order kept), annotation ids renumbered from 1."""
    images = [dict(im, id=im["id"] * COPY_STRIDE + c) for im in dataset["images"]
              for c in range(weight[im["id"]])]
    annotations = []
    for ann in dataset["annotations"]:
        for c in range(weight[ann["image_id"]]):
            annotations.append(dict(ann, id=len(annotations) + 1,
                                    image_id=ann["image_id"] * COPY_STRIDE + c))
    copies = [dict(r, image_id=r["image_id"] * COPY_STRIDE + c) for r in results
              for c in range(weight[r["image_id"]])]
    return dict(dataset, images=images, annotations=annotations), copies


def state_of(dataset: dict, results: list, iou_type: str, bootstrap=None,
             protocol: Protocol = Protocol()) -> CocoState:
    segm = iou_type == "segm"
    images, bad_images = image_rows(dataset["images"], [])
    gts, bad_gts = box_rows(dataset["annotations"], detections=False, need_segmentation=segm)
    dts, bad_dts = box_rows(results, detections=True, need_segmentation=segm)
    assert bad_images == bad_gts == bad_dts == []
    category_id = np.array(sorted(c["id"] for c in dataset["categories"]), dtype=np.int64)
    out = shard_state(images, gts, dts, category_id, iou_type, first_has_bbox(results), protocol,
                      bootstrap)
    return out[0] if isinstance(out, tuple) else out


def stats_array(stats: dict) -> np.ndarray:
    values = np.array([stats[n] for n in SUMMARY_NAMES], dtype=float)
    return np.where(values == -1, np.nan, values)


def assert_same(mine: np.ndarray, theirs: np.ndarray, what: str, tol: float = 1e-12):
    assert np.array_equal(np.isnan(mine), np.isnan(theirs)), (what, mine, theirs)
    ok = ~np.isnan(mine)
    assert np.all(np.abs(mine[ok] - theirs[ok]) <= tol), (what, mine, theirs)


def check_against_pycocotools(dataset, results, iou_type, bootstrap, what):
    """Every replicate: the full precision and recall arrays equal pycocotools' on the
    duplicated dataset, and the 12 statistics (overall and per category) to 1e-12."""
    state = state_of(dataset, results, iou_type, bootstrap)
    precision_sum, recall, valid, table = accumulate_replicates(state, bootstrap, full=True)
    overall, per_category = summarize_replicates(precision_sum, recall, valid)
    summary_only = summarize_replicates(*accumulate_replicates(state, bootstrap, precision_at=(2,)))
    ids, weights = image_weights(dataset, bootstrap)
    for r in range(bootstrap.replicates):
        data, res = duplicated(dataset, results, dict(zip(ids, weights[r].tolist())))
        reference = oracle(data, res, iou_type)
        label = f"{what} replicate {r}"
        assert np.array_equal(table[r], reference["precision"]), label
        assert np.array_equal(recall[r].transpose(3, 0, 1, 2), reference["recall"]), label
        assert_same(overall[r], stats_array(reference["stats"]), label)
        assert_same(summary_only[0][r], stats_array(reference["stats"]), label + " (summary)")
        for k, stats in enumerate(reference["per_class"]):
            assert_same(per_category[r, k], stats_array(stats), f"{label} category {k}")
    return state, weights


# ----------------------------------------------------------------------------------------------
# replicate = pycocotools on the duplicated dataset

@pytest.mark.parametrize("iou_type", ["bbox", "segm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replicates_equal_pycocotools_on_duplicated_images(seed, iou_type):
    """Random datasets (ties in score, crowd regions, an empty category, images without
    detections or annotations, > 100 detections of a category in an image)."""
    dataset, results = make_case(seed, iou_type)
    _, weights = check_against_pycocotools(dataset, results, iou_type,
                                           Bootstrap(4, 0.9, seed + 7), f"seed {seed} {iou_type}")
    assert (weights == 0).any() and (weights >= 2).any()       # images dropped and repeated


@pytest.mark.parametrize("seed", range(4))
def test_replicates_on_crowded_integer_grids(seed):
    """Tiny images full of integer boxes: IoUs on the thresholds, equal IoUs, crowd regions,
    areas on the range boundaries, 4 distinct scores (tie blocks with true and false positives
    of one image, whose copies interleave in pycocotools' order)."""
    dataset, dets = make_grid_case(seed)
    check_against_pycocotools(dataset, bbox_results(dets), "bbox", Bootstrap(5, 0.95, seed),
                              f"grid {seed}")


@pytest.mark.parametrize("seed", [31, 32])
def test_replicates_with_every_score_tied(seed):
    dataset, results = make_case(seed, "bbox", n_images=15)
    tied = [dict(r, score=0.5) for r in results]
    check_against_pycocotools(dataset, tied, "bbox", Bootstrap(5, 0.95, 3), f"tied {seed}")


def interpolated_ap(sequence: str, n_gt: int) -> float:
    """COCO's 101-point AP of one ranked sequence of "t" (true) and "f" (false positives)."""
    tp = np.cumsum([c == "t" for c in sequence]).astype(float)
    fp = np.cumsum([c == "f" for c in sequence]).astype(float)
    precision = tp / (fp + tp + np.spacing(1))
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    index = np.searchsorted(tp / n_gt, np.linspace(0, 1, 101), side="left")
    return float(np.mean([envelope[i] if i < len(sequence) else 0.0 for i in index]))


def test_tie_order_of_copies_matters():
    """Image 1 holds a tied true and false positive, image 2 a false positive with the same
    score. With weights (2, 1) pycocotools ranks the copies t f t f, then image 2's f; counting
    each row twice in place (t t f f f) would give another AP. The kernel gives pycocotools'."""
    dataset = {"images": [{"id": 1, "height": 100, "width": 100}, {"id": 2, "height": 100, "width": 100}],
               "categories": [{"id": 1, "name": "a"}],
               "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 40, 40],
                                "area": 1600.0, "iscrowd": 0},
                               {"id": 2, "image_id": 2, "category_id": 1, "bbox": [0, 0, 40, 40],
                                "area": 1600.0, "iscrowd": 0}]}
    results = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 40, 40], "score": 0.9},
               {"image_id": 1, "category_id": 1, "bbox": [60, 60, 30, 30], "score": 0.9},
               {"image_id": 2, "category_id": 1, "bbox": [60, 60, 30, 30], "score": 0.9}]
    for seed in range(500):          # a seed that weighs image 1 twice and image 2 once
        bootstrap = Bootstrap(1, 0.95, seed)
        _, weights = image_weights(dataset, bootstrap)
        if weights[0].tolist() == [2, 1]:
            break
    else:
        pytest.fail("no seed gives weights (2, 1)")
    state = state_of(dataset, results, "bbox", bootstrap)
    overall, _ = summarize_replicates(*accumulate_replicates(state, bootstrap))
    reference = oracle(*duplicated(dataset, results, {1: 2, 2: 1}), "bbox")["stats"]["AP50"]
    assert reference == pytest.approx(interpolated_ap("tftff", 3), abs=1e-12)
    assert overall[0, SUMMARY_NAMES.index("AP50")] == pytest.approx(reference, abs=1e-12)
    assert abs(interpolated_ap("ttfff", 3) - reference) > 0.1


def test_degenerate_cases():
    """No detections at all; detections only on images without ground truth; one image."""
    dataset, _ = make_case(11, "bbox", n_images=12)
    state = state_of(dataset, [], "bbox", Bootstrap(3, 0.95, 1))
    overall, per_category = summarize_replicates(*accumulate_replicates(state, Bootstrap(3, 0.95, 1)))
    ids, weights = image_weights(dataset, Bootstrap(3, 0.95, 1))
    for r in range(3):
        data, _ = duplicated(dataset, [], dict(zip(ids, weights[r].tolist())))
        assert_same(overall[r], stats_array(oracle(data, [], "bbox")["stats"]), "no detections")
    dataset, results = make_case(12, "bbox", n_images=20)
    with_gt = {a["image_id"] for a in dataset["annotations"]}
    empty = [im["id"] for im in dataset["images"] if im["id"] not in with_gt]
    moved = [dict(r, image_id=empty[i % len(empty)]) for i, r in enumerate(results)]
    check_against_pycocotools(dataset, moved, "bbox", Bootstrap(3, 0.95, 2), "dets on empty images")
    check_against_pycocotools(dict(dataset, annotations=[]), moved, "bbox", Bootstrap(2, 0.95, 2),
                              "no ground truth")
    for seed in (21, 22):
        dataset, results = make_case(seed, "bbox", n_images=1)
        check_against_pycocotools(dataset, results, "bbox", Bootstrap(6, 0.95, seed), f"one image {seed}")


def test_merged_shard_states_give_the_same_replicates():
    """Replicate parts merge exactly: states of random image groups, merged in any order, give
    the same replicate arrays as one state of all images."""
    dataset, results = make_case(5, "bbox")
    bootstrap = Bootstrap(8, 0.95, 4)
    whole = accumulate_replicates(state_of(dataset, results, "bbox", bootstrap), bootstrap)
    rng = np.random.default_rng(5)
    ids = [im["id"] for im in dataset["images"]]
    group = rng.permutation(np.arange(len(ids)) % 4)
    states = []
    for g in range(4):
        chosen = {i for i, gg in zip(ids, group) if gg == g}
        part = {"images": [im for im in dataset["images"] if im["id"] in chosen],
                "annotations": [a for a in dataset["annotations"] if a["image_id"] in chosen],
                "categories": dataset["categories"]}
        states.append(state_of(part, [r for r in results if r["image_id"] in chosen], "bbox", bootstrap))
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        merged = states[order[0]].copy()
        for g in order[1:]:
            merged = merged.merge(states[g].copy())
        for mine, theirs in zip(accumulate_replicates(merged, bootstrap), whole):
            assert np.array_equal(mine, theirs)


def test_bootstrap_off_leaves_the_state_and_records_alone():
    dataset, results = make_case(6, "bbox")
    plain = state_of(dataset, results, "bbox")
    off = state_of(dataset, results, "bbox", Bootstrap(0))
    assert plain.image_hash is None and plain.n_gt_replicates is None
    assert off.image_hash is None and off.n_gt_replicates is None
    categories = {"id": sorted(c["id"] for c in dataset["categories"]),
                  "name": [f"cat{c}" for c in sorted(c["id"] for c in dataset["categories"])]}
    records = list(state_records(DetectionState(plain), DetectionConfig(), categories))
    assert all(REPLICATES not in r for r in records)
    on = state_of(dataset, results, "bbox", Bootstrap(3, 0.95, 1))
    with_replicates = list(state_records(DetectionState(on),
                                         DetectionConfig(bootstrap=Bootstrap(3, 0.95, 1)), categories))
    assert [{k: v for k, v in r.items() if k != REPLICATES} for r in with_replicates] == records
    # the summaries carry replicates, the curves (not scalars) none
    curves = [r for r in with_replicates if r["type"] == "InterpolatedPrecisionRecallCurve"]
    assert curves and all(REPLICATES not in r for r in curves)
    assert all(set(r[REPLICATES]) == set(SUMMARY_NAMES) for r in with_replicates if r not in curves)


def _valor_with_replicates(state, categories, bootstrap) -> list[dict]:
    return attach_replicates(list(_valor_records(state, categories, VALOR_TEST)),
                             _valor_replicate_records(state, categories, VALOR_TEST, bootstrap),
                             _identity)


def test_replicates_in_blocks_are_those_of_all_replicates_at_once(monkeypatch):
    """The records step computes the replicates a block of replicates at a time (issue 39:
    all at once, a state's weights alone took one byte per detection and replicate, 2.8 GB for
    281,230 detections at R = 10,000, beside 154 KB of the coco protocol's arrays per
    replicate): every statistic is that of all replicates at once, bit for bit, in both
    protocols, here with one replicate per block."""
    dataset, results = make_case(5, "bbox")
    bootstrap = Bootstrap(9, 0.95, 2)
    categories = {"id": sorted(c["id"] for c in dataset["categories"]),
                  "name": [f"cat{c}" for c in sorted(c["id"] for c in dataset["categories"])]}
    coco = state_of(dataset, results, "bbox", bootstrap)
    whole = summarize_replicates(*accumulate_replicates(coco, bootstrap, precision_at=(2,)))
    valor = state_of(dataset, results, "bbox", bootstrap, VALOR_TEST)
    valor_whole = _valor_with_replicates(valor, categories, bootstrap)
    monkeypatch.setattr(bootstrap_kernel, "REPLICATE_BLOCK_BYTES", 1)
    for mine, theirs in zip(coco_summary_replicates(coco, bootstrap), whole):
        assert mine.shape == theirs.shape and np.array_equal(mine, theirs, equal_nan=True)
    assert sum(REPLICATES in r for r in valor_whole) > 50
    assert json.dumps(_valor_with_replicates(valor, categories, bootstrap)) == json.dumps(valor_whole)


# ----------------------------------------------------------------------------------------------
# valor protocol: replicate records = the records of the duplicated dataset

VALOR_TEST = Protocol("valor", (0.5, 0.75), (0.3, 0.6), pr_curve_iou_threshold=0.5)


@pytest.mark.parametrize("seed", [0, 3])
def test_valor_replicates_equal_the_records_of_the_duplicated_dataset(seed):
    dataset, results = make_case(seed, "bbox")
    bootstrap = Bootstrap(4, 0.95, seed + 1)
    categories = {"id": sorted(c["id"] for c in dataset["categories"]),
                  "name": [f"cat{c}" for c in sorted(c["id"] for c in dataset["categories"])]}
    state = state_of(dataset, results, "bbox", bootstrap, VALOR_TEST)
    replicates = list(_valor_replicate_records(state, categories, VALOR_TEST, bootstrap))
    ids, weights = image_weights(dataset, bootstrap)
    n_compared = 0
    for r in range(bootstrap.replicates):
        data, res = duplicated(dataset, results, dict(zip(ids, weights[r].tolist())))
        expected = {json.dumps([x["type"], x["parameters"]], sort_keys=True): x["value"]
                    for x in _valor_records(state_of(data, res, "bbox", None, VALOR_TEST),
                                            categories, VALOR_TEST)
                    if isinstance(x["value"], float)}
        mine = {json.dumps([x["type"], x["parameters"]], sort_keys=True): x["value"]
                for x in replicates[r]}
        assert sorted(mine) == sorted(expected)
        for key, value in expected.items():
            assert mine[key] == pytest.approx(value, abs=1e-12), (r, key)
            n_compared += 1
    assert n_compared > 100


# ----------------------------------------------------------------------------------------------
# through the CLI

def _write(path, obj) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


def _cli(args: list) -> None:
    result = run_cli_subprocess(["detection", *map(str, args), "--quiet"])
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def cli_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("detection_bootstrap")
    raw = make_groundtruth(404, n_images=30)
    dataset = _gt_only(raw)
    models = {"alpha": bbox_results(make_detections(raw, 404)),
              "beta": bbox_results(make_detections(raw, 505))}
    # another input order: images, annotations and results of different images reordered; the
    # order within an image stays (it decides pycocotools' ties, so it is part of the data)
    shuffled = copy.deepcopy(dataset)
    rng = np.random.default_rng(1)
    rank = {im["id"]: float(x) for im, x in zip(dataset["images"], rng.random(len(dataset["images"])))}

    def reorder(rows, key):
        return sorted(rows, key=lambda row: rank[row[key]])

    shuffled["images"] = reorder(shuffled["images"], "id")
    shuffled["annotations"] = reorder(shuffled["annotations"], "image_id")
    args = {"plain": ["--groundtruths", _write(root / "instances.json", dataset)],
            "shuffled": ["--groundtruths", _write(root / "shuffled" / "instances.json", shuffled)]}
    for name, results in models.items():
        args["plain"] += ["--predictions", f"{name}={_write(root / f'{name}.json', results)}"]
        args["shuffled"] += ["--predictions",
                             f"{name}={_write(root / 'shuffled' / f'{name}.json', reorder(results, 'image_id'))}"]
    boot = ["--bootstrap", "20", "--bootstrap_seed", "3", "--confidence", "0.9"]
    _cli(args["plain"] + boot + ["--output", root / "one", "--num_shards", "1"])
    return {"root": root, "dataset": dataset, "models": models, "args": args, "boot": boot}


def test_cli_intervals_are_percentiles_of_pycocotools_replicates(cli_case):
    records = read_jsonl(cli_case["root"] / "one" / "metrics.jsonl")
    bootstrap = Bootstrap(20, 0.9, 3)
    dataset = cli_case["dataset"]
    ids, weights = image_weights(dataset, bootstrap)
    for model, results in cli_case["models"].items():
        replicate_stats = [oracle(*duplicated(dataset, results, dict(zip(ids, weights[r].tolist()))), "bbox")
                           for r in range(bootstrap.replicates)]
        point = oracle(dataset, results, "bbox")
        summary = next(r for r in records if r["model"] == model and r["type"] == "COCOSummary")
        classes = {r["parameters"]["category_id"]: r for r in records
                   if r["model"] == model and r["type"] == "COCOClassSummary"}
        for what, record, pick in [("summary", summary, lambda ref: ref["stats"])] + [
                (f"category {cid}", classes[cid], lambda ref, k=k: ref["per_class"][k])
                for k, cid in enumerate(point["cat_ids"])]:
            assert_same(stats_array(record["value"]), stats_array(pick(point)), f"{model} {what} point")
            for name in SUMMARY_NAMES:
                values = np.array([pick(ref)[name] for ref in replicate_stats])
                values = values[values != -1]
                interval = record["interval"][name]
                assert interval["unit"] == "image" and interval["confidence"] == 0.9
                assert interval["replicates"] == values.size, (model, what, name)
                if values.size:
                    low, high = np.percentile(values, [5.0, 95.0])
                    assert abs(interval["low"] - low) <= 1e-12 and abs(interval["high"] - high) <= 1e-12, (
                        model, what, name)
                else:
                    assert interval["low"] is None and interval["high"] is None


def test_cli_point_values_equal_the_run_without_bootstrap(cli_case):
    root = cli_case["root"]
    _cli(cli_case["args"]["plain"] + ["--output", root / "off", "--num_shards", "3"])
    off = read_jsonl(root / "off" / "metrics.jsonl")
    on = read_jsonl(root / "one" / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if k != "interval"} for r in on] == off
    assert all("interval" not in r for r in off)
    # every summary has intervals; the InterpolatedPrecisionRecallCurve, a curve, has none
    curve = "InterpolatedPrecisionRecallCurve"
    assert any(r["type"] == curve for r in on)
    assert all(("interval" in r) == (r["type"] != curve) for r in on)


def test_cli_bytes_identical_across_shards_and_input_order(cli_case):
    root = cli_case["root"]
    reference = (root / "one" / "metrics.jsonl").read_bytes()
    _cli(cli_case["args"]["plain"] + cli_case["boot"] + ["--output", root / "seven", "--num_shards", "7"])
    assert (root / "seven" / "metrics.jsonl").read_bytes() == reference
    _cli(cli_case["args"]["shuffled"] + cli_case["boot"] + ["--output", root / "shuffled_out", "--num_shards", "4"])
    assert (root / "shuffled_out" / "metrics.jsonl").read_bytes() == reference


@pytest.mark.multiprocess
def test_cli_multiprocess_bytes_identical(cli_case):
    root = cli_case["root"]
    _cli(cli_case["args"]["plain"] + cli_case["boot"] + ["--output", root / "multi", "--num_shards", "3",
                                                         *MULTIPROCESS])
    assert (root / "multi" / "metrics.jsonl").read_bytes() == (root / "one" / "metrics.jsonl").read_bytes()


def test_summary_intervals_are_percentiles_per_statistic():
    record = {"type": "COCOSummary", "value": {"AP": 0.5, "AR1": -1.0},
              REPLICATES: {"AP": [0.1, None, 0.3, 0.2], "AR1": [None, None, None, None]}}
    out = finish_record(record, Bootstrap(4, 0.8, 0), "image")
    assert REPLICATES not in out
    low, high = np.percentile([0.1, 0.3, 0.2], [10, 90])
    assert out["interval"]["AP"]["low"] == pytest.approx(low, abs=1e-12)
    assert out["interval"]["AP"]["high"] == pytest.approx(high, abs=1e-12)
    assert out["interval"]["AP"]["replicates"] == 3
    assert out["interval"]["AR1"]["low"] is None and out["interval"]["AR1"]["replicates"] == 0
    assert out["interval"]["AP"]["unit"] == "image"


# ----------------------------------------------------------------------------------------------
# native rows in a user's pipeline: intervals, comparisons and their coverage counts

def native_case(seed: int):
    rng = np.random.default_rng(seed)
    gt, a, b = [], [], []
    for i in range(40):
        anns = []
        for _ in range(int(rng.integers(0, 4))):
            x, y = (float(v) for v in rng.uniform(0, 50, 2))
            anns.append({"label": str(rng.choice(["cat", "dog"])), "bbox": [x, y, x + 20, y + 20]})
        gt.append({"datum_uid": f"img{i}", "annotations": anns})
        for rows, noise in ((a, 2.0), (b, 6.0)):
            if rows is b and i % 7 == 3:
                continue                                        # b has no row for 6 datums
            preds = []
            for ann in anns:
                x0, y0, x1, y1 = (v + float(rng.normal(0, noise)) for v in ann["bbox"])
                preds.append({"label": ann["label"], "score": round(float(rng.uniform(0.2, 1)), 1),
                              "bbox": [min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)]})
            rows.append({"datum_uid": f"img{i}", "annotations": preds})
    return gt, a, b


def _check_rows_api(records: list):
    scalars = [r for r in records if r["type"] in ("AP", "mAP", "AR", "mAR", "Precision", "Recall", "F1",
                                                   "APAveragedOverIOUs", "mAPAveragedOverIOUs")]
    assert scalars and all(r["interval"]["unit"] == "image" and r["interval"]["replicates"] == 25
                           for r in scalars)
    assert all("interval" not in r for r in records
               if r["type"] in ("Counts", "ConfusionMatrix", "PrecisionRecallCurve", "DetailedPrecisionRecallCurve"))
    assert all(not k.startswith("_") for r in records for k in r)
    comparisons = [r for r in records if r["type"] == "Comparison"]
    assert {r["model"] for r in comparisons} == {"b"}
    m_ap = next(r for r in comparisons if r["parameters"]["metric"] == "mAP"
                and r["parameters"]["metric_parameters"] == {"iou_threshold": 0.5})
    assert m_ap["comparison"]["datums"] == 40 and m_ap["comparison"]["model_lacks"] == 6
    assert m_ap["comparison"]["baseline_lacks"] == 0 and m_ap["comparison"]["datums_both"] == 34
    assert m_ap["value"] < 0 and m_ap["interval"]["high"] < 0


def test_rows_api_intervals_and_comparisons():
    """EvaluateDetection with bootstrap and compare_to: every scalar record has its interval (per
    image), curves, counts and confusion matrices none; model b (no row for 6 of the 40 datums)
    is compared with a, and the coverage counts say so."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from evalbeam.transforms.detection import EvaluateDetection

    gt, a, b = native_case(3)
    with beam.Pipeline() as p:
        records = ({"groundtruths": p | "G" >> beam.Create(gt), "a": p | "A" >> beam.Create(a),
                    "b": p | "B" >> beam.Create(b)}
                   | EvaluateDetection(DetectionConfig(protocol=Protocol("valor", (0.5, 0.75))),
                                       bootstrap=Bootstrap(25, 0.95, 2), compare_to="a"))
        assert_that(records, _check_rows_api)


def test_score_bins_with_bootstrap_is_a_usage_error(tmp_path):
    dataset, results = make_case(1, "bbox", n_images=5)
    result = run_cli_subprocess(["detection", "--groundtruths", _write(tmp_path / "gt.json", dataset),
                                 "--predictions", f"m={_write(tmp_path / 'dt.json', results)}",
                                 "--output", tmp_path / "out", "--score_bins", "100", "--bootstrap", "10"])
    assert result.returncode == 2 and "--score_bins and --bootstrap" in result.stderr


def test_rows_api_refuses_score_bins_with_bootstrap():
    from evalbeam.transforms.detection import EvaluateDetection

    with pytest.raises(ValueError, match="score_bins and bootstrap"):
        EvaluateDetection(DetectionConfig(protocol=Protocol("valor", score_bins=10)),
                          bootstrap=Bootstrap(5))
    EvaluateDetection(DetectionConfig(protocol=Protocol("valor", score_bins=10)), bootstrap=Bootstrap(0))
