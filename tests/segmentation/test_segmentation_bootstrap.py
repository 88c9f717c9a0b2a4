"""Segmentation intervals (issue 16): each bootstrap replicate's metrics equal the metrics of the
dataset in which every datum appears w times (scikit-learn's confusion matrix on the repeated
pixels, then the task's formulas), the replicates add exactly across shards, and the command's
intervals are numpy's percentiles of those replicate values, the same for any shard count,
input order and runner mode, with the point values of the run without --bootstrap."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from sklearn.metrics import confusion_matrix

from evalbeam.pipelines.launch.common import local_pipeline
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.transforms.kernels.bootstrap import REPLICATES, Bootstrap
from evalbeam.transforms.kernels.segmentation import (IGNORED, UNLABELED, SegmentationState,
                                                      datum_statistics, pixel_confusion,
                                                      state_records)
from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from test_segmentation import LABELS, brute_force, random_maps, write_inputs

SCALARS = ("Accuracy", "mIOU", "IOU", "Precision", "Recall", "F1")


def codes_matrix(gt: np.ndarray, pd: np.ndarray, K: int) -> np.ndarray:
    """pixel_confusion of label-code maps (-2 ignored, -1 no label, 0..K-1 labels)."""
    table = np.array([IGNORED, UNLABELED, *range(K)], dtype=np.int32)
    return pixel_confusion((gt + 2).astype(np.uint8), (pd + 2).astype(np.uint8), table, table, K)


def random_datums(seed: int, n: int, K: int):
    """[(uid, gt codes, pd codes, declared codes)]: random shapes, ignored and unlabeled pixels,
    labels often absent from a datum, and some labels only declared (an empty segment). With
    K > 1, label K - 1 occurs in the last datum only and label K - 2 is only declared by the
    first, so replicates without those datums lack the label (and mIOU averages fewer labels)."""
    rng = np.random.default_rng(seed)
    common = K - 2 if K > 2 else K
    out = []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(1, 12, 2))
        used = rng.choice(common, size=int(rng.integers(1, common + 1)), replace=False)
        if K > 1 and i == n - 1:
            used = np.r_[used, K - 1]
        gt = rng.choice(np.r_[-2, -1, used], (h, w))
        pd = rng.choice(np.r_[-1, used], (h, w))
        declared = sorted({int(k) for k in rng.choice(common, int(rng.integers(0, 3)))})
        if K > 2 and i == 0:
            declared.append(K - 2)
        out.append((f"img-{seed}-{i}", gt, pd, declared))
    return out


def kernel_state(datums, K: int, bootstrap: Bootstrap) -> SegmentationState:
    """The state Match builds: the datums added, their statistics weighed at once."""
    state = SegmentationState.empty(K)
    rows = []
    for _, gt, pd, declared in datums:
        matrix = codes_matrix(gt, pd, K)
        state.add_datum(matrix, declared + sorted({int(k) for k in np.unique(pd) if k >= 0}))
        rows.append(datum_statistics(matrix, declared + sorted({int(k) for k in np.unique(pd) if k >= 0})))
    hashes = fnv1a_64(pa.array([uid for uid, *_ in datums], pa.string()))
    state.add_replicates(bootstrap.weights(hashes), np.stack(rows))
    return state


def repeated_records(datums, weights: np.ndarray, K: int, labels: list[str]) -> dict:
    """{(type, label): value} of the dataset where datum i appears weights[i] times, from
    scikit-learn's confusion matrix over every repeated pixel; {} when no datum is left."""
    gts = [gt.ravel() for (_, gt, _, _), w in zip(datums, weights) for _ in range(int(w))]
    pds = [pd.ravel() for (_, _, pd, _), w in zip(datums, weights) for _ in range(int(w))]
    if not gts:
        return {}
    gt, pd = np.concatenate(gts), np.concatenate(pds)
    keep = gt != -2
    matrix = confusion_matrix(gt[keep], pd[keep], labels=list(range(-1, K))).astype(np.int64)
    declared = np.zeros(K, bool)
    for (_, _, pd_codes, codes), w in zip(datums, weights):
        if w:
            declared[codes + [int(k) for k in np.unique(pd_codes) if k >= 0]] = True
    state = SegmentationState(matrix, declared)
    return {(r["type"], r["parameters"].get("label")): r["value"] for r in state_records(state, None, labels)
            if r["type"] in SCALARS}


@pytest.mark.parametrize("seed", range(5))
def test_replicates_equal_the_metrics_of_the_repeated_dataset(seed):
    K = [1, 2, 4, 6, 5][seed]
    labels = [f"l{k}" for k in range(K)]
    datums = random_datums(seed, n=[1, 3, 9, 14, 25][seed], K=K)
    bootstrap = Bootstrap(30, seed=seed * 7 + 1)
    state = kernel_state(datums, K, bootstrap)
    records = list(state_records(state, None, labels))
    plain = list(state_records(SegmentationState(state.matrix, state.declared), None, labels))
    # the point records are those without bootstrap, field for field
    assert [{k: v for k, v in r.items() if k != REPLICATES} for r in records] == plain
    weights = bootstrap.weights(fnv1a_64(pa.array([uid for uid, *_ in datums], pa.string())))
    checked_absent = 0
    for r in range(bootstrap.replicates):
        expected = repeated_records(datums, weights[r], K, labels)
        for record in records:
            if record["type"] not in SCALARS:
                assert REPLICATES not in record
                continue
            value = record[REPLICATES][r]
            want = expected.get((record["type"], record["parameters"].get("label")))
            if want is None:
                assert value is None, (r, record["type"])
                checked_absent += 1
            else:
                assert value == pytest.approx(want, abs=1e-12, rel=0), (r, record["type"])
    # replicates without a datum, or without the datum of a rare label, have no such value
    assert checked_absent or len(datums) == 1 and not (weights == 0).any()


def test_replicates_merge_exactly_in_any_split_and_order():
    K = 4
    datums = random_datums(11, n=20, K=K)
    bootstrap = Bootstrap(25, seed=5)
    whole = kernel_state(datums, K, bootstrap)
    rng = np.random.default_rng(0)
    for parts in (2, 3, 7):
        cut = np.sort(rng.choice(np.arange(1, len(datums)), parts - 1, replace=False))
        order = rng.permutation(len(datums))
        states = [kernel_state([datums[i] for i in chunk], K, bootstrap)
                  for chunk in np.split(order, cut)]
        merged = states[-1].copy()
        for state in states[-2::-1]:
            merged.merge(state)
        assert np.array_equal(merged.replicates, whole.replicates)
        assert np.array_equal(merged.matrix, whole.matrix)


def test_datum_without_counted_pixels_and_no_bootstrap():
    """A datum whose pixels are all ignored still counts as a datum (its replicate is defined,
    with accuracy 0 as the point value); without bootstrap the state has no replicates and the
    records no internal field."""
    K = 2
    gt = np.full((3, 3), -2)
    pd = np.zeros((3, 3), int)
    datums = [("only-ignored", gt, pd, [1])]
    state = kernel_state(datums, K, Bootstrap(8, seed=2))
    weights = Bootstrap(8, seed=2).weights(fnv1a_64(pa.array(["only-ignored"])))[:, 0]
    accuracy = next(r for r in state_records(state, None, ["a", "b"]) if r["type"] == "Accuracy")
    assert accuracy["value"] == 0.0
    assert accuracy[REPLICATES] == [None if w == 0 else 0.0 for w in weights]
    plain = SegmentationState.empty(K)
    plain.add_datum(codes_matrix(gt, pd, K), [1])
    assert plain.replicates is None
    assert all(REPLICATES not in r for r in state_records(plain, None, ["a", "b"]))


# ----------------------------------------------------------------------------- the command


def run_segmentation(*args) -> int:
    from evalbeam.pipelines.tasks.segmentation import run

    return run([str(a) for a in args])


def replicate_values(maps, bootstrap: Bootstrap, model: str, site: str | None) -> dict:
    """{(type, label): [R values]} recomputed here: the brute-force metrics of the maps of the
    slice, each map repeated by its weight; None where a label or every datum is absent."""
    uids = sorted(uid for uid, (_, _, s) in maps.items() if site in (None, s))
    weights = bootstrap.weights(fnv1a_64(pa.array(uids, pa.string())))
    out: dict = {}
    for r in range(bootstrap.replicates):
        repeated = {f"{uid}#{j}": maps[uid] for uid, w in zip(uids, weights[r]) for j in range(int(w))}
        if not repeated:
            for values in out.values():
                values.append(None)
            continue
        m = brute_force(repeated, model)
        gt = np.concatenate([g.ravel() for g, _, _ in repeated.values()])
        pd = np.concatenate([p[model].ravel() for _, p, _ in repeated.values()])
        # the labels present in the repeated dataset: rows name every label with pixels on either side
        present = {k for k in range(len(LABELS)) if (gt == k).any() or (pd == k).any()}
        values = {("Accuracy", None): m["accuracy"],
                  ("mIOU", None): float(np.mean([m["IOU"][k] for k in sorted(present)]))}
        for k, label in enumerate(LABELS):
            for kind, name in (("IOU", "IOU"), ("Precision", "precision"), ("Recall", "recall"), ("F1", "f1")):
                values[(kind, label)] = float(m[name][k]) if k in present else None
        for key, value in values.items():
            out.setdefault(key, [None] * r).append(value)
    return out


@pytest.mark.multiprocess
def test_command_intervals_are_percentiles_and_do_not_depend_on_sharding(tmp_path):
    maps = random_maps(3, n=10)
    folder = write_inputs(tmp_path / "in", maps, "png")
    rows = read_jsonl(folder / "groundtruths.jsonl")
    write_jsonl(folder / "gt_reversed.jsonl", rows[::-1])
    common = ["--predictions", f"good={folder / 'good.jsonl'}", "--predictions",
              f"noisy={folder / 'noisy.jsonl'}", "--quiet", "--slice", "site"]
    boot = ["--bootstrap", "20", "--bootstrap_seed", "3"]
    outputs = []
    for name, gt, extra in (("a", "groundtruths.jsonl", ["--num_shards", "1", *boot]),
                            ("b", "gt_reversed.jsonl", ["--num_shards", "7", *boot]),
                            ("c", "groundtruths.jsonl", ["--num_shards", "3", *boot, *MULTIPROCESS]),
                            ("off", "groundtruths.jsonl", [])):
        assert run_segmentation("--groundtruths", folder / gt, "--output", tmp_path / name,
                                *common, *extra) == 0
        outputs.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    with_intervals = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    without = read_jsonl(tmp_path / "off" / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if k not in ("interval", "wilson")} for r in with_intervals] == without
    bootstrap = Bootstrap(20, seed=3)
    checked = 0
    for model in ("good", "noisy"):
        for site in (None, "a", "b"):
            expected = replicate_values(maps, bootstrap, model, site)
            for record in with_intervals:
                if record["model"] != model or record["slice"] != ({} if site is None else {"site": site}):
                    continue
                if record["type"] not in SCALARS:
                    assert "interval" not in record
                    continue
                assert "wilson" not in record        # pixel ratios are not proportions of datums
                interval = record["interval"]
                assert interval["unit"] == "image" and interval["confidence"] == 0.95
                values = np.array([v for v in expected[(record["type"], record["parameters"].get("label"))]
                                   if v is not None])
                assert interval["replicates"] == values.size
                low, high = np.percentile(values, [2.5, 97.5])
                assert interval["low"] == pytest.approx(low, abs=1e-12, rel=0)
                assert interval["high"] == pytest.approx(high, abs=1e-12, rel=0)
                checked += 1
    assert checked == 2 * 3 * (2 + 4 * len(LABELS))


def test_rows_api_gives_the_command_records_and_comparisons(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from evalbeam.transforms.segmentation import EvaluateSegmentation

    maps = random_maps(4, n=8)
    folder = write_inputs(tmp_path / "in", maps, "rle")
    gt_rows = read_jsonl(folder / "groundtruths.jsonl")
    good = read_jsonl(folder / "good.jsonl")
    noisy = read_jsonl(folder / "noisy.jsonl")[:-2]          # noisy lacks two datums
    write_jsonl(folder / "noisy_short.jsonl", noisy)
    assert run_segmentation("--groundtruths", folder / "groundtruths.jsonl", "--predictions",
                            f"good={folder / 'good.jsonl'}", "--predictions",
                            f"noisy={folder / 'noisy_short.jsonl'}", "--output", tmp_path / "out",
                            "--quiet", "--bootstrap", "12", "--bootstrap_seed", "9",
                            "--compare_to", "good") == 0
    expected = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    comparisons = [r for r in expected if r["type"] == "Comparison"]
    assert comparisons and {r["model"] for r in comparisons} == {"noisy"}
    miou = next(r for r in comparisons if r["parameters"]["metric"] == "mIOU")
    assert miou["comparison"]["model_lacks"] == 2 and miou["comparison"]["baseline_lacks"] == 0
    assert miou["comparison"]["datums"] == 8 and miou["comparison"]["datums_both"] == 6

    def canonical(records):
        return sorted(json.dumps(r, sort_keys=True) for r in records)

    with local_pipeline() as p:
        records = ({"groundtruths": p | "G" >> beam.Create(gt_rows), "good": p | "A" >> beam.Create(good),
                    "noisy": p | "B" >> beam.Create(noisy)}
                   | EvaluateSegmentation(num_shards=5, bootstrap=Bootstrap(12, seed=9), compare_to="good"))

        def same_as_command(found):
            assert canonical(found) == canonical(expected)

        assert_that(records, same_as_command)


def test_datums_weighed_in_batches_give_the_same_intervals(tmp_path, monkeypatch):
    """A shard weighs its datums' statistics REPLICATE_BATCH at a time (bounded memory): any
    batch size gives the same bytes."""
    import evalbeam.transforms.segmentation as segmentation

    maps = random_maps(7, n=9)
    folder = write_inputs(tmp_path / "in", maps, "rle")
    outputs = []
    for name, batch in (("big", 256), ("small", 2)):
        monkeypatch.setattr(segmentation, "REPLICATE_BATCH", batch)
        assert run_segmentation("--groundtruths", folder / "groundtruths.jsonl", "--predictions",
                                f"good={folder / 'good.jsonl'}", "--output", tmp_path / name, "--quiet",
                                "--num_shards", "1", "--slice", "site", "--bootstrap", "10") == 0
        outputs.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert outputs[0] == outputs[1] and b'"interval"' in outputs[0]
