"""`evalbeam classification` end to end against scikit-learn / brute force, on random models.

One ground-truth file and four random models (one per seed, each with its own quirks) go through
the CLI in a few runs shared by all tests; every record of every model, slice and label key is
compared with the oracle of test_classification_kernel.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import MULTIPROCESS, read_jsonl, run_classification, write_jsonl
from test_classification_kernel import assert_records, fnv1a_py, oracle_records

from evalbeam.transforms.kernels.classification import (
    DEFAULT_PR_THRESHOLDS,
    ClassificationConfig,
)

N = 420
CLASSES = ["airplane", "bird", "boat", "bus", "car", "cat", "deer", "dog", "frog", "horse",
           "ship", "train", "truck", "Zeppelin", "émeu"]
COLORS = ["blue", "green", "red", "white"]
REGIONS = ["apac", "eu", "us"]
MODELS = ["model_s0", "model_s1", "model_s2", "model_s3"]
SCORE_THRESHOLDS = (0.0, 0.35, 0.7)
NO_HARDMAX_PR = (0.0, 0.2, 0.35, 0.5, 0.7, 0.9, 1.0)
STEP_SCORES = [0.0, 0.2, 0.35, 0.5, 0.7, 0.9, 1.0]


def _scores(rng, values, truth, decimals, skill):
    raw = rng.random(len(values)) ** 2
    if truth in values:
        raw[values.index(truth)] += skill * rng.random()
    return np.round(np.clip(raw, 0, 1), decimals).tolist()


def _model(seed, uids, truth):
    """{key: {uid: {value: score}}} and the prediction rows of model_s<seed>."""
    rng = np.random.default_rng(seed)
    preds = {"class": {}, "color": {}}
    rows = []
    for uid in uids:
        if rng.random() > (0.9, 0.6, 0.8, 0.85)[seed]:
            continue  # no prediction row at all
        labels = {}
        t_class, t_color = truth["class"].get(uid), truth["color"].get(uid)
        if seed == 0:  # every value, one decimal: many ties
            labels["class"] = dict(zip(CLASSES, _scores(rng, CLASSES, t_class, 1, 0.8)))
            labels["color"] = dict(zip(COLORS, _scores(rng, COLORS, t_color, 1, 0.8)))
        elif seed == 1:  # a few values, two decimals
            pool = rng.choice(CLASSES, size=int(rng.integers(1, 4)), replace=False).tolist()
            if t_class and t_class not in pool and rng.random() < 0.6:
                pool[0] = t_class
            labels["class"] = dict(zip(pool, _scores(rng, pool, t_class, 2, 1.0)))
            if rng.random() < 0.5:
                pool = rng.choice(COLORS, size=int(rng.integers(1, 3)), replace=False).tolist()
                labels["color"] = dict(zip(pool, _scores(rng, pool, t_color, 2, 1.0)))
        elif seed == 2:  # scores on the thresholds, zeros, and a value never in the ground truth
            for key, values, t in (("class", CLASSES + ["zebra"], t_class), ("color", COLORS, t_color)):
                pool = rng.choice(values, size=int(rng.integers(1, 5)), replace=False).tolist()
                labels[key] = {v: float(rng.choice(STEP_SCORES[3 if v == t else 0:])) for v in pool}
        else:  # class only; often every class at 0.5 (hardmax picks the smallest value)
            if rng.random() < 0.3:
                labels["class"] = {v: 0.5 for v in CLASSES}
            else:
                pool = rng.choice(CLASSES, size=int(rng.integers(2, 7)), replace=False).tolist()
                labels["class"] = dict(zip(pool, _scores(rng, pool, t_class, 2, 0.6)))
        if rng.random() < 0.03:
            labels = {}  # a prediction row without labels
        for key, scored in labels.items():
            preds[key][uid] = scored
        rows.append({"datum_uid": uid, "labels": [{"key": k, "value": v, "score": s}
                                                  for k, scored in labels.items()
                                                  for v, s in scored.items()]})
    order = rng.permutation(len(rows))
    return preds, [rows[i] for i in order]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Ground truth (two keys, slices by region, some datums without labels) and four models."""
    root = tmp_path_factory.mktemp("classification_oracle")
    rng = np.random.default_rng(2024)
    uids = [f"画像-{i:03d}" if i % 11 == 0 else f"img-{i:03d}" for i in range(N)]
    truth = {"class": {}, "color": {}}
    region = {}
    gt_rows = []
    class_p = 1.0 / np.arange(1, len(CLASSES) + 1)
    for uid in uids:
        labels = []
        if rng.random() < 0.85:
            truth["class"][uid] = str(rng.choice(CLASSES, p=class_p / class_p.sum()))
            labels.append({"key": "class", "value": truth["class"][uid]})
        if rng.random() < 0.7:
            truth["color"][uid] = str(rng.choice(COLORS))
            labels.append({"key": "color", "value": truth["color"][uid]})
        row = {"datum_uid": uid, "labels": labels}
        draw = rng.random()
        if draw < 0.08:
            row["metadata"] = {"camera": "x"}
        elif draw < 0.9:
            region[uid] = str(rng.choice(REGIONS))
            row["metadata"] = {"region": region[uid]}
        gt_rows.append(row)
    preds, paths = {}, []
    for seed, model in enumerate(MODELS):
        preds[model], rows = _model(seed, uids, truth)
        paths.append(write_jsonl(root / f"{model}.jsonl", rows))
    vocab = {key: sorted(set(truth[key].values()) | {v for m in preds.values()
                                                     for scored in m[key].values() for v in scored})
             for key in ("class", "color")}
    return {"root": root, "gt": write_jsonl(root / "groundtruths.jsonl", gt_rows), "preds_paths": paths,
            "uids": uids, "truth": truth, "region": region, "preds": preds, "vocab": vocab}


def _args(dataset, output, *extra):
    args = ["--groundtruths", dataset["gt"], "--output", dataset["root"] / output, "--quiet",
            "--slice", "region", *extra]
    for path in dataset["preds_paths"]:
        args += ["--predictions", path]
    return args


HARDMAX_ARGS = ("--score_thresholds", "0.0,0.35,0.7", "--max_examples", "2")
NO_HARDMAX_ARGS = ("--score_thresholds", "0.7,0.0,0.35", "--no_hardmax", "--max_examples", "3",
                   "--pr_curve_thresholds", ",".join(map(str, NO_HARDMAX_PR)))
CONFIGS = {
    "hardmax": ClassificationConfig(score_thresholds=SCORE_THRESHOLDS, hardmax=True,
                                    pr_curve_thresholds=DEFAULT_PR_THRESHOLDS, max_examples=2),
    "no_hardmax": ClassificationConfig(score_thresholds=SCORE_THRESHOLDS, hardmax=False,
                                       pr_curve_thresholds=NO_HARDMAX_PR, max_examples=3),
}


@pytest.fixture(scope="module")
def runs(dataset):
    """{mode: output folder} of the in-process runs."""
    out = {}
    for mode, extra in (("hardmax", HARDMAX_ARGS), ("no_hardmax", NO_HARDMAX_ARGS)):
        assert run_classification(_args(dataset, mode, *extra)) == 0, mode
        out[mode] = dataset["root"] / mode
    return out


def _groups(records):
    """{(model, slice JSON, label key): [records]}."""
    out: dict = {}
    for record in records:
        params = record["parameters"]
        key = params["label"]["key"] if "label" in params else params["label_key"]
        out.setdefault((record["model"], json.dumps(record["slice"], sort_keys=True), key), []).append(record)
    return out


def _expected(dataset, model, key, uids, config):
    """Oracle records of one model and key over the datums `uids`, or None (empty population)."""
    vocab = dataset["vocab"][key]
    index = {v: i for i, v in enumerate(vocab)}
    truth, preds = dataset["truth"][key], dataset["preds"][model][key]
    gt = np.array([index[truth[u]] if u in truth else -1 for u in uids], dtype=np.int64)
    S = np.zeros((len(uids), len(vocab)))
    E = np.zeros((len(uids), len(vocab)), dtype=bool)
    for row, uid in enumerate(uids):
        for value, score in preds.get(uid, {}).items():
            S[row, index[value]] = score
            E[row, index[value]] = True
    if not ((gt >= 0) | E.any(axis=1)).any():
        return None
    return oracle_records(gt, S, E, uids, [fnv1a_py(u) for u in uids], vocab, key, config)


def _slices(dataset):
    """{slice JSON: uids}: the whole dataset and one slice per region (null when absent)."""
    out = {"{}": dataset["uids"]}
    for value in REGIONS + [None]:
        out[json.dumps({"region": value})] = [u for u in dataset["uids"] if dataset["region"].get(u) == value]
    return out


def test_runs_complete_without_rejects(runs):
    for mode, folder in runs.items():
        info = json.loads((folder / "run.json").read_text())
        assert info["status"] == "complete", mode
        assert info["options"]["hardmax"] is (mode == "hardmax")
        assert read_jsonl(folder / "rejected.jsonl") == []


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("mode", ["hardmax", "no_hardmax"])
def test_every_record_matches_the_oracle(dataset, runs, mode, model):
    """Every slice x label key of the model: Counts, Precision, Recall, F1, Accuracy (sklearn),
    ROCAUC, mROCAUC, curves, confusion matrices with examples; no extra or missing group."""
    config = CONFIGS[mode]
    groups = {g: r for g, r in _groups(read_jsonl(runs[mode] / "metrics.jsonl")).items() if g[0] == model}
    expected_groups = set()
    for slice_json, uids in _slices(dataset).items():
        for key in ("class", "color"):
            expected = _expected(dataset, model, key, uids, config)
            if expected is None:
                continue
            expected_groups.add((model, slice_json, key))
            assert_records(groups.get((model, slice_json, key), []), expected,
                           f"{mode} {model} {slice_json} {key}")
    assert set(groups) == expected_groups
    assert len(expected_groups) == 10  # 5 slices x 2 keys


def test_data_exercise_the_edge_cases(dataset, runs):
    """The random models do contain what the oracle comparison is meant to cover."""
    records = read_jsonl(runs["hardmax"] / "metrics.jsonl")
    whole = [r for r in records if r["slice"] == {}]

    def find(model, type_, **params):
        return [r for r in whole if r["model"] == model and r["type"] == type_
                and all(r["parameters"].get(k) == v for k, v in params.items())]

    # a value that is only ever predicted: no AUC, and its predictions are false positives
    zebra = [r for r in find("model_s2", "ROCAUC") if r["parameters"]["label"]["value"] == "zebra"]
    assert len(zebra) == 1 and zebra[0]["value"] is None
    assert not [r for r in find("model_s0", "ROCAUC") if r["parameters"]["label"]["value"] == "zebra"]
    # model_s3 never predicts color: the key is still evaluated (all misses)
    color = find("model_s3", "Accuracy", label_key="color", score_threshold=0.0)
    assert len(color) == 1 and color[0]["value"] == 0.0
    # hallucinations: positive predictions on datums without a class ground truth
    cm = find("model_s1", "ConfusionMatrix", label_key="class", score_threshold=0.0)[0]["value"]
    assert sum(c["count"] for c in cm["unmatched_predictions"].values()) > 0
    assert sum(c["count"] for c in cm["unmatched_ground_truths"].values()) > 0
    # ties of model_s3 go to the smallest value ("Zeppelin" < "airplane")
    s3 = find("model_s3", "ConfusionMatrix", label_key="class", score_threshold=0.35)[0]["value"]
    tied = sum(1 for u, scored in dataset["preds"]["model_s3"]["class"].items()
               if len(scored) == len(CLASSES) and u in dataset["truth"]["class"])
    predicted_zeppelin = sum(row.get("Zeppelin", {}).get("count", 0)
                             for row in s3["confusion_matrix"].values())
    assert tied > 10 and predicted_zeppelin >= tied


@pytest.mark.multiprocess
def test_multiprocess_run_is_byte_identical(dataset, runs):
    """Two worker processes and another shard count write the same metrics.jsonl, byte for byte."""
    args = _args(dataset, "multiprocess", *HARDMAX_ARGS, "--num_shards", "5") + MULTIPROCESS
    assert run_classification(args) == 0
    mp = (dataset["root"] / "multiprocess" / "metrics.jsonl").read_bytes()
    assert len(mp) > 0
    assert mp == (runs["hardmax"] / "metrics.jsonl").read_bytes()
