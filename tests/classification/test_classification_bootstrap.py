"""Bootstrap replicates of classification (issue 16): kernel and pipeline.

A replicate's metric must equal the metric of the dataset in which each datum appears w times
(w its Poisson weight in that replicate). The oracle is test_classification_kernel's
oracle_records (scikit-learn) run on that duplicated dataset, datum by datum, replicate by
replicate; the pipeline tests then check that the intervals in metrics.jsonl are numpy's
percentiles of replicate values recomputed here, and that they do not depend on shards, input
order or runner.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
import tracemalloc
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from helpers import read_jsonl, run_classification, write_jsonl
from sklearn import metrics as skm
from test_classification_kernel import KeyData, make_key, oracle_records, random_key

import evalbeam.transforms.classification as classification_plumbing
import evalbeam.transforms.kernels.bootstrap as bootstrap_kernel
from evalbeam.pipelines.launch.common import local_pipeline
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.transforms.kernels.bootstrap import PROPORTION, REPLICATES, Bootstrap, wilson_interval
from evalbeam.transforms.kernels.calibration import CALIBRATION_TYPES
from evalbeam.transforms.kernels.classification import (ClassificationConfig, datum_correct,
                                                        key_metrics, match_key)
from evalbeam.transforms.kernels.ranking import ROC_BINS, replicate_roc_auc, roc_bins

TOL = 1e-12
SCALAR = ("Precision", "Recall", "F1", "Accuracy", "ROCAUC", "mROCAUC")
THRESHOLDS = (0.0, 0.3, 0.35, 0.7, 1.0)


def record_id(record: dict) -> str:
    return record["type"] + " " + json.dumps(record["parameters"], sort_keys=True)


def kernel(data: KeyData, config: ClassificationConfig, bootstrap: Bootstrap | None):
    """match_key's state with bootstrap's weights (config's bootstrap set to it: the ROC AUC
    replicates draw their weights again from it)."""
    weights = None if bootstrap is None else bootstrap.weights(data.hashes)
    if bootstrap is not None:
        config = with_bootstrap(config, bootstrap)
    return match_key(data.gt, data.hashes, pa.array(data.uids, pa.string()), data.datum,
                     data.value, data.score, len(data.vocab), config, weights)


def with_bootstrap(config: ClassificationConfig, bootstrap: Bootstrap) -> ClassificationConfig:
    return dataclasses.replace(config, bootstrap=bootstrap)


def duplicated(data: KeyData, w: np.ndarray) -> KeyData:
    """The dataset in which datum i appears w[i] times (copies get their own uids)."""
    rows = np.repeat(np.arange(data.gt.size), w.astype(np.int64))
    S, E = data.dense()
    uids = [f"{data.uids[i]}#{j}" for j, i in enumerate(rows)]
    return make_key(data.gt[rows], uids, S[rows], E[rows], data.vocab)


def replicate_oracle(data: KeyData, w: np.ndarray, config: ClassificationConfig) -> dict | None:
    """{record id: value} of the scalar records of the duplicated dataset; None when its
    population is empty (the pipeline then has no state, hence no record, for the key)."""
    dup = duplicated(data, w)
    S, E = dup.dense()
    if not ((dup.gt >= 0) | E.any(axis=1)).any():
        return None
    records = oracle_records(dup.gt, S, E, dup.uids, dup.hashes, dup.vocab, "class", config)
    return {record_id(r): r["value"] for r in records}


def assert_replicates_match_oracle(data: KeyData, config: ClassificationConfig,
                                   bootstrap: Bootstrap) -> list[dict]:
    """Every scalar record's REPLICATES equals the oracle on each duplicated dataset (None where
    the duplicated dataset has no such record or an undefined value). Returns the records."""
    records = key_metrics(kernel(data, config, bootstrap), "class", data.vocab,
                          with_bootstrap(config, bootstrap))
    weights = bootstrap.weights(data.hashes)
    scalar = [r for r in records if isinstance(r["value"], float)]
    assert scalar and all(REPLICATES in r for r in scalar)
    assert all(REPLICATES not in r for r in records if not isinstance(r["value"], float))
    for r in range(bootstrap.replicates):
        expected = replicate_oracle(data, weights[r], config) or {}
        for record in scalar:
            got, want = record[REPLICATES][r], expected.get(record_id(record))
            assert (got is None) == (want is None), (record_id(record), r, got, want)
            if want is not None:
                assert isinstance(got, float) and abs(got - want) <= TOL, (record_id(record), r, got, want)
        # the oracle has no record the point state lacks (replicates only reweight datums)
        assert set(expected) <= {record_id(x) for x in records}
    return records


# ----------------------------------------------------------------------------- kernel vs oracle

@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("hardmax", [True, False], ids=["hardmax", "no_hardmax"])
def test_replicates_equal_sklearn_on_duplicated_datasets(seed, hardmax):
    # scores with 1-2 decimals: many ties, and every ROC bin holds a single distinct score
    n, V = [(1, 1), (4, 2), (60, 3), (400, 5), (900, 8), (250, 12)][seed]
    data = random_key(np.random.default_rng(100 + seed), n, V)
    config = ClassificationConfig(score_thresholds=THRESHOLDS, hardmax=hardmax,
                                  metrics=frozenset(SCALAR))
    records = assert_replicates_match_oracle(data, config, Bootstrap(7, seed=seed))
    # proportions: Accuracy over datums with a ground truth, Precision / Recall over datums
    for record in records:
        if record["type"] in ("Precision", "Recall", "Accuracy"):
            successes, trials = record[PROPORTION]
            assert record["value"] == (successes / trials if trials else 0.0)
        else:
            assert PROPORTION not in record


def test_weights_of_zero_leave_values_out_and_empty_replicates_have_no_record():
    # 3 datums, 40 replicates: some replicates drop a value or every datum
    gt = np.array([0, 1, -1])
    S = np.array([[0.8, 0.1], [0.3, 0.6], [0.0, 0.5]])
    data = make_key(gt, ["a", "b", "c"], S, S > 0, ["cat", "dog"])
    config = ClassificationConfig(score_thresholds=(0.0, 0.5), metrics=frozenset(SCALAR))
    bootstrap = Bootstrap(40, seed=2)      # 5 of its replicates draw no datum
    weights = bootstrap.weights(data.hashes)
    assert (weights.sum(axis=0) > 0).all() and (weights == 0).any()
    empty = np.flatnonzero(weights.sum(axis=1) == 0)
    assert empty.size, "want a replicate without any datum"
    records = assert_replicates_match_oracle(data, config, bootstrap)
    for record in records:
        assert all(record[REPLICATES][r] is None for r in empty)


def test_degenerate_keys():
    config = ClassificationConfig(score_thresholds=(0.0, 0.5), metrics=frozenset(SCALAR))
    bootstrap = Bootstrap(9, seed=2)
    rng = np.random.default_rng(4)
    n = 50
    gt = rng.integers(0, 3, n)
    # every score equal; no prediction at all; a value nobody has as ground truth (no AUC
    # positives); one value that is everybody's ground truth (no AUC negatives)
    cases = [np.full((n, 3), 0.5), np.zeros((n, 3)), np.c_[rng.random((n, 2)).round(2), np.full(n, 0.4)]]
    for S in cases:
        data = make_key(gt, [f"u{i}" for i in range(n)], S, S > 0, ["a", "b", "c"])
        assert_replicates_match_oracle(data, config, bootstrap)
    data = make_key(np.zeros(n, int), [f"u{i}" for i in range(n)], rng.random((n, 2)).round(2),
                    np.ones((n, 2), bool), ["a", "b"])
    records = assert_replicates_match_oracle(data, config, bootstrap)
    auc = [r for r in records if r["type"] == "ROCAUC"]
    assert all(r["value"] is None and REPLICATES not in r for r in auc)


@pytest.mark.parametrize("seed", range(3))
def test_merged_replicates_do_not_depend_on_split_or_order(seed):
    rng = np.random.default_rng(seed)
    data = random_key(rng, 700, 6)
    config = ClassificationConfig(score_thresholds=THRESHOLDS, hardmax=bool(seed % 2))
    bootstrap = Bootstrap(12, seed=seed)
    whole = key_metrics(kernel(data, config, bootstrap), "class", data.vocab,
                        with_bootstrap(config, bootstrap))
    part = rng.integers(0, 5, data.gt.size)
    states = [kernel(data.subset(np.flatnonzero(part == j)), config, bootstrap) for j in range(5)]
    order = rng.permutation(5)
    merged = states[order[0]].copy()
    for j in order[1:]:
        merged.merge(states[j], config)
    split = key_metrics(merged, "class", data.vocab, with_bootstrap(config, bootstrap))
    assert split == whole     # exact: integer counts
    shuffled = data.subset(rng.permutation(data.gt.size))
    assert key_metrics(kernel(shuffled, config, bootstrap), "class", data.vocab,
                       with_bootstrap(config, bootstrap)) == whole


def test_bootstrap_off_changes_nothing():
    data = random_key(np.random.default_rng(8), 500, 5)
    config = ClassificationConfig(score_thresholds=THRESHOLDS)
    plain = key_metrics(kernel(data, config, None), "class", data.vocab, config)
    assert all(REPLICATES not in r and PROPORTION not in r for r in plain)
    with_reps = key_metrics(kernel(data, config, Bootstrap(5)), "class", data.vocab,
                            with_bootstrap(config, Bootstrap(5)))
    stripped = [{k: v for k, v in r.items() if k not in (REPLICATES, PROPORTION)} for r in with_reps]
    assert json.dumps(stripped) == json.dumps(plain)
    state = kernel(data, config, None)
    with pytest.raises(ValueError, match="bootstrap replicates"):
        state.merge(kernel(data, config, Bootstrap(5)), config)


@pytest.mark.parametrize("V", [3, 40])
def test_roc_auc_replicates_with_many_distinct_scores_stay_within_the_stated_bound(V):
    """Continuous scores: several distinct scores share a bin, so the replicate AUC is an
    approximation; its distance to sklearn on the duplicated data is within the bound that
    replicate_roc_auc states, and the point value stays exact. 40 values get 1,024 bins."""
    rng = np.random.default_rng(11)
    n = 3000 if V == 3 else 1500
    bins = roc_bins(V)
    assert bins == (ROC_BINS if V == 3 else 1024)
    gt = rng.integers(0, V, n)
    S = np.clip(rng.random((n, V)) * 0.6 + 0.4 * (gt[:, None] == np.arange(V)), 0, 1).round(9)
    vocab = [f"v{i:02d}" for i in range(V)]
    data = make_key(gt, [f"d{i}" for i in range(n)], S, np.ones((n, V), bool), vocab)
    config = ClassificationConfig(metrics=frozenset({"ROCAUC"}))
    bootstrap = Bootstrap(6, seed=1)
    state = kernel(data, config, bootstrap)
    records = key_metrics(state, "class", data.vocab, with_bootstrap(config, bootstrap))
    hist = state.replicates.histogram(bootstrap)
    weights = bootstrap.weights(data.hashes)
    worst_bound = 0.0
    for v, record in enumerate(records[:3]):
        assert abs(record["value"] - skm.roc_auc_score(gt == v, S[:, v])) <= TOL   # point: exact
        auc, bound = replicate_roc_auc(*hist.segment(v, bins))
        assert (bound > 0).all() and (bound < 2.0 / bins).all()
        worst_bound = max(worst_bound, float(bound.max()))
        for r in range(bootstrap.replicates):
            rows = np.repeat(np.arange(n), weights[r])
            exact = skm.roc_auc_score(gt[rows] == v, S[rows, v])
            assert record[REPLICATES][r] == auc[r]
            assert abs(auc[r] - exact) <= bound[r] + TOL
    assert worst_bound > 1e-5   # the case really is approximate


def test_roc_bins_shrink_with_the_vocabulary():
    assert [roc_bins(V) for V in (1, 16, 17, 100, 1000, 5742, 1 << 16, 1 << 17)] == \
        [4096, 4096, 2048, 512, 64, 8, 1, 1]


def _continuous_key(n: int, V: int, seed: int) -> KeyData:
    """n datums, V values, 9-decimal scores for every value: most of the 4,097 score bins of
    every value hold a datum (the dense case of the replicate histograms)."""
    rng = np.random.default_rng(seed)
    gt = rng.integers(0, V, n)
    S = np.clip(rng.random((n, V)) * 0.6 + 0.4 * (gt[:, None] == np.arange(V)), 0, 1).round(9)
    return make_key(gt, [f"d{i}" for i in range(n)], S, np.ones((n, V), bool),
                    [f"v{i}" for i in range(V)])


ROC_ONLY = ClassificationConfig(metrics=frozenset({"ROCAUC", "mROCAUC"}))


def test_roc_auc_replicate_state_does_not_grow_with_the_replicates():
    """Issue 39: the state kept R weighted score histograms (16 R bytes per occupied (value,
    bin): 5.9 GB in all for 20,000 datums x 3 classes at R = 10,000). It keeps the entries'
    hashes and bins instead, so a state's pickle grows with R only by its replicate counts
    (n_pop, n_gt, n_pred, tp, fp: 8 R (1 + 2V + 2TV) bytes)."""
    data = _continuous_key(3000, 3, seed=12)
    size = {R: len(pickle.dumps(kernel(data, ROC_ONLY, Bootstrap(R, seed=1)))) for R in (10, 400)}
    V, T = 3, 1
    counts = 8 * (400 - 10) * (1 + 2 * V + 2 * T * V)        # 40,560 bytes
    assert size[400] - size[10] <= counts + 2_000, size      # the histograms: about 38 MB


def test_roc_auc_replicates_in_blocks_are_those_of_all_replicates_at_once(monkeypatch):
    """The records step rebuilds the replicate histograms a block of replicates at a time
    (kernels.bootstrap.REPLICATE_BLOCK_BYTES, here 1 MiB): its peak stays near the block while
    the histogram of all 300 replicates takes 29 MB, and every value is that of the histogram
    of all replicates at once (what the state held before issue 39), bit for bit."""
    R, V = 300, 3
    data = _continuous_key(3000, V, seed=13)
    bootstrap = Bootstrap(R, seed=4)
    config = with_bootstrap(ROC_ONLY, bootstrap)
    state = kernel(data, config, bootstrap)
    hist = state.replicates.histogram(bootstrap)
    whole = [replicate_roc_auc(*hist.segment(v, roc_bins(V)))[0].tolist() for v in range(V)]
    assert 16 * R * len(hist) > 29_000_000
    del hist
    monkeypatch.setattr(bootstrap_kernel, "REPLICATE_BLOCK_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        records = key_metrics(state, "class", data.vocab, config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    aucs = [r for r in records if r["type"] == "ROCAUC"]
    assert [r[REPLICATES] for r in aucs] == whole    # continuous scores: defined everywhere
    assert peak < 3 << 20, peak        # 9.7 MB before issue 39, beside the 29 MB state


def test_match_key_draws_the_weights_in_blocks_when_given_the_bootstrap(monkeypatch):
    """Given the Bootstrap instead of its weights (as MatchClassification does when a shard's
    weights would take more than SHARED_WEIGHTS_BYTES), match_key draws them a block of
    replicates at a time, and so do the calibration replicates: the records are those made
    from the weights of all replicates, bit for bit, in blocks of any size."""
    data = random_key(np.random.default_rng(31), 600, 5)
    bootstrap = Bootstrap(23, seed=6)
    config = with_bootstrap(ClassificationConfig(
        score_thresholds=THRESHOLDS, metrics=frozenset(SCALAR) | frozenset(CALIBRATION_TYPES)),
        bootstrap)
    uids = pa.array(data.uids, pa.string())

    def records(weights):
        state = match_key(data.gt, data.hashes, uids, data.datum, data.value, data.score,
                          len(data.vocab), config, weights)
        return key_metrics(state, "class", data.vocab, config)

    whole = records(bootstrap.weights(data.hashes))
    assert any(REPLICATES in r for r in whole if r["type"] == "ECE")
    assert records(bootstrap) == whole
    monkeypatch.setattr(bootstrap_kernel, "REPLICATE_BLOCK_BYTES", 4096)   # blocks of 1-3
    assert records(bootstrap) == whole
    assert records(bootstrap.weights(data.hashes)) == whole
    with pytest.raises(ValueError, match="config.bootstrap"):
        match_key(data.gt, data.hashes, uids, data.datum, data.value, data.score,
                  len(data.vocab), config, Bootstrap(23, seed=7))
    with pytest.raises(ValueError, match="not config.bootstrap's"):
        match_key(data.gt, data.hashes, uids, data.datum, data.value, data.score,
                  len(data.vocab), config, Bootstrap(23, seed=7).weights(data.hashes))


def test_roc_bins_are_exact_when_every_bin_holds_one_score():
    rng = np.random.default_rng(3)
    n = 2000
    gt = rng.integers(0, 2, n)
    S = np.c_[rng.integers(0, 1001, n) / 1000, rng.integers(0, 1001, n) / 1000]  # 3 decimals
    data = make_key(gt, [f"d{i}" for i in range(n)], S, np.ones((n, 2), bool), ["x", "y"])
    config = ClassificationConfig(metrics=frozenset({"ROCAUC"}))
    state = kernel(data, config, Bootstrap(4, seed=9))
    hist = state.replicates.histogram(Bootstrap(4, seed=9))
    for v in range(2):
        _, bound = replicate_roc_auc(*hist.segment(v, roc_bins(2)))
        assert (bound == 0).all()
    assert_replicates_match_oracle(data, config, Bootstrap(4, seed=9))


@pytest.mark.parametrize("hardmax", [True, False], ids=["hardmax", "no_hardmax"])
def test_datum_correct_is_what_accuracy_counts(hardmax):
    data = random_key(np.random.default_rng(21), 400, 5)
    config = ClassificationConfig(score_thresholds=THRESHOLDS, hardmax=hardmax,
                                  metrics=frozenset({"Accuracy"}))
    correct = datum_correct(data.gt, data.datum, data.value, data.score, config)
    S, E = data.dense()
    winner = np.argmax(S, axis=1)
    for t, threshold in enumerate(THRESHOLDS):
        positive = (S >= threshold) & (S > 0)
        if hardmax:
            positive &= np.arange(S.shape[1])[None, :] == winner[:, None]
        brute = np.array([g >= 0 and bool(positive[i, g]) for i, g in enumerate(data.gt)])
        assert (correct[t] == brute).all()
    records = key_metrics(kernel(data, config, None), "class", data.vocab, config)
    labelled = data.gt >= 0
    for t, record in enumerate(records):
        assert record["value"] == correct[t, labelled].sum() / labelled.sum()


# ----------------------------------------------------------------------------- pipeline

CLASSES = ["bird", "cat", "dog"]
REGIONS = ["north", "south"]
MODELS = ("model_a", "model_b")


def _dataset(folder: Path) -> dict:
    """240 datums, 3 classes, 2-decimal scores (exact replicate ROC AUC), a region, two models
    that miss some datums, a datum with a second key only in model_b's rows."""
    rng = np.random.default_rng(5)
    n = 240
    truth = rng.integers(0, 3, n)
    gts, preds = [], {m: [] for m in MODELS}
    for i in range(n):
        gts.append({"datum_uid": f"img-{i}", "metadata": {"region": REGIONS[i % 2]},
                    "labels": [{"key": "class", "value": CLASSES[truth[i]]}]})
        for skill, model in zip((2.0, 0.7), MODELS):
            if rng.random() < 0.05:
                continue     # no prediction for this datum
            raw = rng.random(3) + skill * (np.arange(3) == truth[i])
            scores = np.round(raw / raw.sum(), 2)
            preds[model].append({"datum_uid": f"img-{i}", "labels": [
                {"key": "class", "value": c, "score": float(s)} for c, s in zip(CLASSES, scores)]})
    paths = {"groundtruths": write_jsonl(folder / "gt.jsonl", gts)}
    for model in MODELS:
        paths[model] = write_jsonl(folder / f"{model}.jsonl", preds[model])
    return paths


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("boot"))


def _run(paths: dict, out: Path, *extra) -> list[dict]:
    args = ["--groundtruths", paths["groundtruths"], "--output", out, "--quiet",
            "--slice", "region", "--score_thresholds", "0.0,0.5", *extra]
    for name in MODELS:
        args += ["--predictions", f"{name}={paths[name]}"]
    assert run_classification(args) == 0
    return (out / "metrics.jsonl").read_bytes()


BOOT = ("--bootstrap", "20", "--bootstrap_seed", "3")


@pytest.fixture(scope="module")
def reference(small, tmp_path_factory):
    return _run(small, tmp_path_factory.mktemp("ref") / "out", *BOOT, "--num_shards", "1")


def test_intervals_do_not_depend_on_shards_or_input_order(small, reference, tmp_path):
    assert _run(small, tmp_path / "s7", *BOOT, "--num_shards", "7") == reference
    rng = random.Random(2)
    shuffled = {}
    for name, path in small.items():
        lines = Path(path).read_text().splitlines()
        rng.shuffle(lines)
        shuffled[name] = write_jsonl(tmp_path / "shuf" / Path(path).name, lines)
    assert _run(shuffled, tmp_path / "shuf-out", *BOOT, "--num_shards", "4") == reference


# The multi-process runner's intervals: tests/test_golden.py runs classification_bootstrap on it.


def test_states_that_draw_their_own_weights_give_the_same_intervals(small, reference, tmp_path,
                                                                    monkeypatch):
    """A shard whose weights would take more than SHARED_WEIGHTS_BYTES (here: any) lets each
    state draw its own, in blocks of replicates (here a few at a time): the same bytes."""
    monkeypatch.setattr(classification_plumbing, "SHARED_WEIGHTS_BYTES", 0)
    monkeypatch.setattr(bootstrap_kernel, "REPLICATE_BLOCK_BYTES", 4096)
    assert _run(small, tmp_path / "drawn", *BOOT, "--num_shards", "2") == reference


def test_point_values_are_the_run_without_bootstrap(small, reference, tmp_path):
    plain = _run(small, tmp_path / "plain")
    stripped = []
    for line in reference.splitlines():
        record = json.loads(line)
        record.pop("interval", None)
        record.pop("wilson", None)
        stripped.append(json.dumps(record))
    assert stripped == [json.dumps(json.loads(line)) for line in plain.splitlines()]
    records = [json.loads(line) for line in reference.splitlines()]
    with_interval = {r["type"] for r in records if "interval" in r}
    assert with_interval == set(SCALAR)
    assert {r["type"] for r in records if "wilson" in r} == {"Precision", "Recall", "Accuracy"}
    assert not [r for r in records if r["type"] in SCALAR and r["value"] is not None
                and "interval" not in r]


def _truth_and_scores(paths: dict):
    gts = read_jsonl(paths["groundtruths"])
    uids = [row["datum_uid"] for row in gts]
    index = {u: i for i, u in enumerate(uids)}
    gt = np.array([CLASSES.index(row["labels"][0]["value"]) for row in gts])
    region = np.array([row["metadata"]["region"] for row in gts])
    dense = {}
    for model in MODELS:
        S = np.zeros((len(uids), 3))
        E = np.zeros((len(uids), 3), bool)
        for row in read_jsonl(paths[model]):
            for label in row["labels"]:
                S[index[row["datum_uid"]], CLASSES.index(label["value"])] = label["score"]
                E[index[row["datum_uid"]], CLASSES.index(label["value"])] = True
        dense[model] = (S, E)
    return uids, gt, region, dense


def test_intervals_are_percentiles_of_replicates_recomputed_with_sklearn(small, reference):
    """Recompute every scalar metric of every replicate from the files (weights from the
    datum_uids' FNV-1a hashes, sklearn on the duplicated datasets), then numpy's percentiles."""
    uids, gt, region, dense = _truth_and_scores(small)
    hashes = fnv1a_64(pa.array(uids))
    weights = Bootstrap(20, 0.95, 3).weights(hashes)
    records = [json.loads(line) for line in reference.splitlines()]
    config = ClassificationConfig(score_thresholds=(0.0, 0.5), metrics=frozenset(SCALAR))
    checked = 0
    for model in MODELS:
        S, E = dense[model]
        for slice_value, rows in (({}, np.arange(len(uids))),
                                  ({"region": "south"}, np.flatnonzero(region == "south"))):
            data = make_key(gt[rows], [uids[i] for i in rows], S[rows], E[rows], CLASSES)
            per_replicate = [replicate_oracle(data, weights[r, rows], config) for r in range(20)]
            for record in records:
                if record["model"] != model or record["slice"] != slice_value or "interval" not in record:
                    continue
                values = [p[record_id(record)] for p in per_replicate if p and p.get(record_id(record)) is not None]
                low, high = np.percentile(values, [2.5, 97.5])
                interval = record["interval"]
                assert interval["replicates"] == len(values)
                assert abs(interval["low"] - low) <= TOL and abs(interval["high"] - high) <= TOL, record
                assert interval["unit"] == "datum" and interval["confidence"] == 0.95
                checked += 1
    # 2 models x 2 slices x (3 values x 2 thresholds x P/R/F1 + 2 Accuracy + 3 ROCAUC + mROCAUC)
    assert checked == 2 * 2 * (3 * 2 * 3 + 2 + 3 + 1)


def test_wilson_counts_are_datums(reference):
    records = [json.loads(line) for line in reference.splitlines()]
    counts = {(r["model"], json.dumps(r["slice"]), json.dumps(r["parameters"], sort_keys=True)): r["value"]
              for r in records if r["type"] == "Counts"}
    for record in records:
        if record["type"] not in ("Precision", "Recall"):
            continue
        c = counts[(record["model"], json.dumps(record["slice"]),
                    json.dumps(record["parameters"], sort_keys=True))]
        trials = c["tp"] + (c["fp"] if record["type"] == "Precision" else c["fn"])
        assert (record["wilson"]["successes"], record["wilson"]["trials"]) == (c["tp"], trials)
        assert record["wilson"]["low"] <= record["value"] <= record["wilson"]["high"]


@pytest.fixture(scope="module")
def compared(small, tmp_path_factory):
    return _run(small, tmp_path_factory.mktemp("cmp") / "out", *BOOT, "--compare_to", "model_a")


def test_compare_to_counts_discordant_datums_and_missing_predictions(small, compared):
    records = [json.loads(line) for line in compared.splitlines()]
    uids, gt, region, dense = _truth_and_scores(small)

    def correct(model, threshold):
        S, E = dense[model]
        winner = np.argmax(S, axis=1)
        top = S[np.arange(len(gt)), winner]
        return (winner == gt) & (top >= threshold) & (top > 0)

    has_row = {model: {row["datum_uid"] for row in read_jsonl(small[model])} for model in MODELS}

    found = 0
    for record in records:
        if record["type"] != "Comparison":
            continue
        assert record["model"] == "model_b" and record["parameters"]["baseline"] == "model_a"
        rows = np.arange(len(gt)) if not record["slice"] else np.flatnonzero(region == record["slice"]["region"])
        comparison = record["comparison"]
        assert comparison["datums"] == rows.size
        assert comparison["model_lacks"] == sum(uids[i] not in has_row["model_b"] for i in rows)
        assert comparison["baseline_lacks"] == sum(uids[i] not in has_row["model_a"] for i in rows)
        if record["parameters"]["metric"] == "Accuracy":
            t = record["parameters"]["metric_parameters"]["score_threshold"]
            b, a = correct("model_b", t)[rows], correct("model_a", t)[rows]
            assert comparison["test"] == "McNemar exact"
            assert comparison["discordant"] == {"model_only": int((b & ~a).sum()),
                                                "baseline_only": int((a & ~b).sum()),
                                                "datums": int(rows.size)}
            found += 1
    assert found == 2 * 3   # 2 thresholds x (all, north, south)


@pytest.mark.parametrize("compare_to", [None, "model_a"])
def test_rows_api_gives_the_command_line_records(small, reference, compared, tmp_path, compare_to):
    from evalbeam.transforms.classification import EvaluateClassification

    config = ClassificationConfig(score_thresholds=(0.0, 0.5))
    out = tmp_path / "rows.jsonl"
    with local_pipeline() as pipeline:
        inputs = {name: pipeline | f"Read {name}" >> beam.Create(read_jsonl(path))
                  for name, path in small.items()}
        records = inputs | EvaluateClassification(config, slices=[("region",)], num_shards=3,
                                                  bootstrap=Bootstrap(20, 0.95, 3),
                                                  compare_to=compare_to)
        _ = (records | beam.combiners.ToList()
             | beam.Map(lambda rs: out.write_text("\n".join(json.dumps(r, sort_keys=True) for r in rs))))
    got = sorted(out.read_text().splitlines())
    expected = reference if compare_to is None else compared
    want = sorted(json.dumps(json.loads(line), sort_keys=True) for line in expected.splitlines())
    assert got == want


def test_accuracy_interval_covers_the_true_accuracy():
    """Coverage, through the kernel: 1,000 independent datasets of 300 datums over 3 classes
    whose top prediction is right with probability 0.75; the 95% bootstrap interval of
    Accuracy (200 replicates) and its Wilson interval each cover 0.75 in 93.5-96.5% of them."""
    truth, n, V, datasets = 0.75, 300, 3, 1000
    config = ClassificationConfig(metrics=frozenset({"Accuracy"}))
    rng = np.random.default_rng(16)
    covered = wilson_covered = 0
    for i in range(datasets):
        gt = rng.integers(0, V, n)
        right = rng.random(n) < truth
        top = np.where(right, gt, (gt + rng.integers(1, V, n)) % V)
        S = np.full((n, V), 0.1)
        S[np.arange(n), top] = 0.8
        uids = [f"d{i}-{j}" for j in range(n)]
        data = make_key(gt, uids, S, np.ones((n, V), bool), ["a", "b", "c"])
        records = key_metrics(kernel(data, config, Bootstrap(200, 0.95, i)), "class", data.vocab, config)
        accuracy = next(r for r in records if r["type"] == "Accuracy")
        assert accuracy["value"] == right.mean()
        low, high = np.percentile(accuracy[REPLICATES], [2.5, 97.5])
        covered += low <= truth <= high
        w_low, w_high = wilson_interval(*accuracy[PROPORTION], 0.95)
        wilson_covered += w_low <= truth <= w_high
    assert 0.935 <= covered / datasets <= 0.965, covered
    assert 0.935 <= wilson_covered / datasets <= 0.965, wilson_covered
