"""Classification kernels (no Beam) against scikit-learn and brute force, on random data.

The oracle here (`oracle_records`) works on dense score matrices and is shared with
test_classification_oracle.py.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from evalbeam.schemas.classification_rows import LabelRows
from evalbeam.schemas.ordering import grouped_order
from evalbeam.transforms.kernels.classification import (
    DEFAULT_PR_THRESHOLDS,
    ClassificationConfig,
    key_metrics,
    match_key,
)
from evalbeam.transforms.kernels.examples import ExampleSet, first_k, record_layers
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.transforms.kernels.ranking import ScoreHistogram, counts_at_thresholds, roc_auc

NONE = "__none__"
TOL = 1e-12
SCORE_THRESHOLDS = (0.0, 0.3, 0.35, 0.7, 1.0)
PR_THRESHOLDS = (0.0, 0.1, 0.3, 0.35, 0.5, 0.7, 1.0)
NAME_POOL = ["10", "9", "Ant", "Zebra", "apple", "b", "ca", "cat", "cat2", "dog", "z", "ß", "é",
             "猫"]


# ----------------------------------------------------------------------------- reference code

def fnv1a_py(text: str) -> int:
    """FNV-1a 64-bit over the UTF-8 bytes, one byte at a time."""
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _ratio(num, den) -> float:
    return float(num) / float(den) if den > 0 else 0.0


def _tkey(t: float) -> str:
    return repr(float(t))


def _prfs_multilabel(Y: np.ndarray, P: np.ndarray):
    """sklearn precision_recall_fscore_support on indicator matrices, per column. A constant
    dummy column keeps sklearn in multilabel mode when there is a single column."""
    ones = np.ones((Y.shape[0], 1), dtype=int)
    Y2 = np.hstack([Y.astype(int), ones])
    P2 = np.hstack([P.astype(int), ones])
    p, r, f, _ = skm.precision_recall_fscore_support(Y2, P2, average=None, zero_division=0)
    mcm = skm.multilabel_confusion_matrix(Y2, P2)
    return p[:-1], r[:-1], f[:-1], mcm[:-1]


def oracle_records(gt, S, E, uids, hashes, vocab, key, config) -> list[dict]:
    """Expected key_metrics records from dense inputs over n datums and V values.

    gt int[n] (-1: no ground truth), S float[n, V] scores (0 where E is False), E bool[n, V]
    (the datum has a prediction entry for the value), uids str[n], hashes int[n]."""
    gt = np.asarray(gt, dtype=np.int64)
    V = len(vocab)
    pop = (gt >= 0) | E.any(axis=1)
    gt, S, E = gt[pop], S[pop], E[pop]
    uids = [u for u, keep in zip(uids, pop) if keep]
    hashes = [int(h) for h, keep in zip(hashes, pop) if keep]
    n = gt.size
    has_gt = gt >= 0
    n_gt = np.bincount(gt[has_gt], minlength=V)
    present = np.flatnonzero((n_gt > 0) | E.any(axis=0))
    names = [vocab[v] for v in present]
    k = config.max_examples
    # examples: the datums with the smallest (hash, uid)
    rank = np.empty(n, dtype=np.int64)
    rank[sorted(range(n), key=lambda i: (hashes[i], uids[i]))] = np.arange(n)

    def examples(datums, scores=None) -> list[dict]:
        datums = sorted(datums, key=lambda d: rank[d])[:k]
        if scores is None:
            return [{"datum_uid": uids[d]} for d in datums]
        return [{"datum_uid": uids[d], "score": float(scores[d])} for d in datums]

    winner = np.argmax(S, axis=1) if V else np.zeros(n, dtype=np.int64)  # ties: smallest index
    y_true = np.array([vocab[g] if g >= 0 else NONE for g in gt], dtype=object)
    Y = gt[:, None] == np.arange(V)[None, :]
    records: list[dict] = []
    positive = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in config.score_thresholds:
            pos = (S >= t) & (S > 0)
            if config.hardmax:
                pos &= np.arange(V)[None, :] == winner[:, None]
            positive[t] = pos
            if present.size and config.hardmax:
                y_pred = np.array([vocab[w] if pos[i, w] else NONE for i, w in enumerate(winner)],
                                  dtype=object)
                p, r, f, _ = skm.precision_recall_fscore_support(
                    y_true, y_pred, labels=names, average=None, zero_division=0)
                mcm = skm.multilabel_confusion_matrix(y_true, y_pred, labels=names)
                accuracy = skm.accuracy_score(y_true[has_gt], y_pred[has_gt]) if has_gt.any() else 0.0
            elif present.size:
                p, r, f, mcm = _prfs_multilabel(Y[:, present], pos[:, present])
                accuracy = float(pos[has_gt, gt[has_gt]].mean()) if has_gt.any() else 0.0
            else:
                accuracy = 0.0
            for i, v in enumerate(present):
                params = {"label": {"key": key, "value": vocab[v]}, "score_threshold": t,
                          "hardmax": config.hardmax}
                (tn, fp), (fn, tp) = mcm[i]
                records.append({"type": "Counts", "parameters": params, "value": {
                    "tp": int(tp), "fp": int(fp), "fn": int(fn), "tn": int(tn)}})
                records.append({"type": "Precision", "parameters": params, "value": float(p[i])})
                records.append({"type": "Recall", "parameters": params, "value": float(r[i])})
                records.append({"type": "F1", "parameters": params, "value": float(f[i])})
            records.append({"type": "Accuracy", "value": float(accuracy), "parameters": {
                "label_key": key, "score_threshold": t, "hardmax": config.hardmax}})

        aucs = []
        for v in present:
            y = gt == v
            auc = float(skm.roc_auc_score(y, S[:, v])) if 0 < y.sum() < n else None
            aucs.append(auc)
            records.append({"type": "ROCAUC", "value": auc,
                            "parameters": {"label": {"key": key, "value": vocab[v]}}})
    defined = [a for a in aucs if a is not None]
    records.append({"type": "mROCAUC", "value": float(np.mean(defined)) if defined else None,
                    "parameters": {"label_key": key}})

    curve = {}
    for v in present:
        y = gt == v
        curve[vocab[v]] = {}
        for th in config.pr_curve_thresholds:
            hit = (S[:, v] >= th) & (S[:, v] > 0)
            tp, fp = int((hit & y).sum()), int((hit & ~y).sum())
            fn, tn = int((~hit & y).sum()), int((~hit & ~y).sum())
            curve[vocab[v]][_tkey(th)] = {
                "tp": tp, "fp": fp, "fn": fn, "tn": tn, "precision": _ratio(tp, tp + fp),
                "recall": _ratio(tp, tp + fn), "f1_score": _ratio(2 * tp, 2 * tp + fp + fn)}
    records.append({"type": "PrecisionRecallCurve", "value": curve, "parameters": {"label_key": key}})

    for t in config.score_thresholds:
        pos = positive[t]
        cells: dict = {}
        for d in range(n):
            row = vocab[gt[d]] if gt[d] >= 0 else NONE
            cols = np.flatnonzero(pos[d])
            for c in cols:
                cells.setdefault((row, vocab[c]), []).append(d)
            if gt[d] >= 0 and not cols.size:
                cells.setdefault((row, NONE), []).append(d)
        if config.hardmax and present.size:  # the brute force agrees with sklearn's matrix
            y_pred = np.array([vocab[w] if pos[i, w] else NONE for i, w in enumerate(winner)], dtype=object)
            matrix = skm.confusion_matrix(y_true, y_pred, labels=names + [NONE])
            for i, row in enumerate(names + [NONE]):
                for j, col in enumerate(names + [NONE]):
                    if (row, col) != (NONE, NONE):
                        assert matrix[i, j] == len(cells.get((row, col), []))
        value = {"confusion_matrix": {}, "unmatched_ground_truths": {}, "unmatched_predictions": {}}
        for (row, col), datums in cells.items():
            if col == NONE:
                value["unmatched_ground_truths"][row] = {"count": len(datums), "examples": examples(datums)}
            else:
                cell = {"count": len(datums), "examples": examples(datums, S[:, vocab.index(col)])}
                if row == NONE:
                    value["unmatched_predictions"][col] = cell
                else:
                    value["confusion_matrix"].setdefault(row, {})[col] = cell
        records.append({"type": "ConfusionMatrix", "value": value, "parameters": {
            "label_key": key, "score_threshold": t, "hardmax": config.hardmax,
            "max_examples": config.max_examples}})

    detailed = {}
    for v in present:
        y = gt == v
        detailed[vocab[v]] = {}
        for th in config.pr_curve_thresholds:
            hit = (S >= th) & (S > 0)
            any_hit = hit.any(axis=1)

            def obs(mask, scores=None):
                datums = np.flatnonzero(mask).tolist()
                return {"count": len(datums), "examples": examples(datums, scores)}

            tp = obs(y & hit[:, v], S[:, v])
            fp_mis = obs(has_gt & ~y & hit[:, v], S[:, v])
            fp_hal = obs(~has_gt & hit[:, v], S[:, v])
            fn_mis = obs(y & ~hit[:, v] & any_hit)
            fn_none = obs(y & ~any_hit)
            detailed[vocab[v]][_tkey(th)] = {
                "tp": {"total": tp["count"], "observations": {"all": tp}},
                "fp": {"total": fp_mis["count"] + fp_hal["count"], "observations": {
                    "misclassifications": fp_mis, "hallucinations": fp_hal}},
                "fn": {"total": fn_mis["count"] + fn_none["count"], "observations": {
                    "misclassifications": fn_mis, "no_predictions": fn_none}}}
    records.append({"type": "DetailedPrecisionRecallCurve", "value": detailed, "parameters": {
        "label_key": key, "max_examples": config.max_examples}})
    return [r for r in records if r["type"] in config.metrics]


def assert_same(actual, expected, where="") -> None:
    """Equal JSON-like values, floats within TOL (a float must stay a float, None None)."""
    if isinstance(expected, float):
        assert isinstance(actual, float), f"{where}: {actual!r} is not a float ({expected!r})"
        assert abs(actual - expected) <= TOL, f"{where}: {actual!r} != {expected!r}"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r}"
        assert sorted(actual) == sorted(expected), f"{where}: keys {sorted(actual)} != {sorted(expected)}"
        for name in expected:
            assert_same(actual[name], expected[name], f"{where}.{name}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        assert actual == expected and type(actual) is type(expected), f"{where}: {actual!r} != {expected!r}"


def record_id(record: dict) -> str:
    return record["type"] + " " + json.dumps(record["parameters"], sort_keys=True)


def assert_records(actual: list[dict], expected: list[dict], where="") -> None:
    """Same records (matched by type and parameters), values compared by assert_same."""
    got = {record_id(r): r for r in actual}
    want = {record_id(r): r for r in expected}
    assert len(got) == len(actual), f"{where}: duplicate records"
    assert sorted(got) == sorted(want), f"{where}: {sorted(set(got) ^ set(want))[:5]}"
    for name, record in want.items():
        assert_same(got[name]["value"], record["value"], f"{where} {name}")


# ----------------------------------------------------------------------------- random data

@dataclass
class KeyData:
    """One label key of one model: n datums, m prediction entries (sparse) over vocab."""

    gt: np.ndarray       # int32[n], -1 when no ground truth
    uids: list
    hashes: np.ndarray   # uint64[n]
    datum: np.ndarray    # int64[m]
    value: np.ndarray    # int32[m]
    score: np.ndarray    # float64[m]
    vocab: list

    def dense(self):
        n, V = self.gt.size, len(self.vocab)
        S = np.zeros((n, V))
        E = np.zeros((n, V), dtype=bool)
        S[self.datum, self.value] = self.score
        E[self.datum, self.value] = True
        return S, E

    def subset(self, rows: np.ndarray) -> KeyData:
        """The datums `rows` (in that order) and their entries, renumbered."""
        new = np.full(self.gt.size, -1, dtype=np.int64)
        new[rows] = np.arange(rows.size)
        keep = new[self.datum] >= 0
        return KeyData(self.gt[rows], [self.uids[i] for i in rows], self.hashes[rows],
                       new[self.datum[keep]], self.value[keep], self.score[keep], self.vocab)


def make_key(gt, uids, S, E, vocab, rng=None, hashes=None) -> KeyData:
    d, v = np.nonzero(E)
    if rng is not None:
        perm = rng.permutation(d.size)
        d, v = d[perm], v[perm]
    if hashes is None:
        hashes = fnv1a_64(pa.array(uids, pa.string()))
    return KeyData(np.asarray(gt, dtype=np.int32), list(uids), np.asarray(hashes, dtype=np.uint64),
                   d.astype(np.int64), v.astype(np.int32), S[d, v].astype(np.float64), list(vocab))


def random_key(rng, n: int, V: int) -> KeyData:
    """Random key with ties (1-2 decimals), zero scores, datums without any prediction and
    datums without ground truth (some of them with predictions: hallucinations)."""
    decimals = int(rng.integers(1, 3))
    gt = np.where(rng.random(n) < rng.uniform(0.5, 1.0), rng.integers(0, V, n), -1)
    predicted = rng.random(n) < rng.uniform(0.5, 1.0)
    E = rng.random((n, V)) < rng.uniform(0.1, 1.0)
    rows = np.flatnonzero(gt >= 0)
    E[rows, gt[rows]] |= rng.random(rows.size) < 0.5
    E &= predicted[:, None]
    raw = rng.random((n, V)) ** 1.5
    raw[rows, gt[rows]] += rng.uniform(0, 1.5) * rng.random(rows.size)
    S = np.round(np.clip(raw, 0, 1), decimals)
    S[rng.random((n, V)) < 0.05] = 0.0
    S[~E] = 0.0
    uids = [("d", "ü-", "图")[i % 3] + str(i) for i in range(n)]
    vocab = sorted(rng.choice(NAME_POOL, size=V, replace=False).tolist()) if V <= len(NAME_POOL) \
        else [f"v{i:02d}" for i in range(V)]
    return make_key(gt, uids, S, E, vocab, rng)


def kernel(data: KeyData, config: ClassificationConfig, arrow_uids=True):
    uids = pa.array(data.uids, pa.string()) if arrow_uids else np.array(data.uids, dtype=object)
    return match_key(data.gt, data.hashes, uids, data.datum, data.value, data.score,
                     len(data.vocab), config)


def kernel_records(data: KeyData, config: ClassificationConfig, key="class", arrow_uids=True):
    return key_metrics(kernel(data, config, arrow_uids), key, data.vocab, config)


def expected_records(data: KeyData, config: ClassificationConfig, key="class"):
    S, E = data.dense()
    return oracle_records(data.gt, S, E, data.uids, data.hashes, data.vocab, key, config)


def merged_state(data: KeyData, part: np.ndarray, n_parts: int, config: ClassificationConfig,
                 tree=False):
    """match_key on each part (part[i] = part of datum i; parts may be empty), then merge."""
    states = [kernel(data.subset(np.flatnonzero(part == j)), config) for j in range(n_parts)]
    if tree:
        while len(states) > 1:
            states = [states[i].merge(states[i + 1], config) if i + 1 < len(states) else states[i]
                      for i in range(0, len(states), 2)]
        return states[0]
    out = states[0]
    for state in states[1:]:
        out.merge(state, config)
    return out


# seed -> (n datums, V values, max_examples, PR thresholds)
CASES = {
    0: (1, 1, 1, PR_THRESHOLDS),
    1: (5, 3, 2, DEFAULT_PR_THRESHOLDS),
    2: (40, 12, 3, PR_THRESHOLDS),
    3: (300, 5, 1, DEFAULT_PR_THRESHOLDS),
    4: (1200, 8, 2, PR_THRESHOLDS),
    5: (2000, 12, 1, DEFAULT_PR_THRESHOLDS),
    6: (3, 2, 0, PR_THRESHOLDS),
    7: (800, 10, 4, DEFAULT_PR_THRESHOLDS),
}


def case(seed: int, hardmax: bool):
    n, V, k, pr = CASES[seed]
    config = ClassificationConfig(score_thresholds=SCORE_THRESHOLDS, hardmax=hardmax,
                                  pr_curve_thresholds=pr, max_examples=k)
    return random_key(np.random.default_rng(seed), n, V), config


# ----------------------------------------------------------------------------- match_key + key_metrics

@pytest.mark.parametrize("hardmax", [True, False], ids=["hardmax", "no_hardmax"])
@pytest.mark.parametrize("seed", sorted(CASES))
def test_random_keys_match_sklearn_and_brute_force(seed, hardmax):
    """Every record type of a random key equals the sklearn / brute-force oracle."""
    data, config = case(seed, hardmax)
    assert_records(kernel_records(data, config), expected_records(data, config), f"seed {seed}")


@pytest.mark.parametrize("seed", [2, 3, 4, 7])
def test_hardmax_changes_results_where_it_should(seed):
    """Sanity of the oracle inputs: hardmax matters on these data (so both modes are tested)."""
    data, _ = case(seed, True)
    on = kernel_records(*case(seed, True))
    off = kernel_records(*case(seed, False))
    fp_on = sum(r["value"]["fp"] for r in on if r["type"] == "Counts")
    fp_off = sum(r["value"]["fp"] for r in off if r["type"] == "Counts")
    assert fp_off > fp_on
    hallucinations = (data.gt[data.datum] < 0) & (data.score > 0)
    assert hallucinations.any() and (data.gt >= 0).any()
    assert np.setdiff1d(np.arange(data.gt.size), data.datum).size > 0  # datums without predictions


@pytest.mark.parametrize("parts", [1, 2, 7])
@pytest.mark.parametrize("seed", [1, 3, 4, 7])
def test_merging_random_splits_gives_the_same_records(seed, parts):
    """States of a random split merged (sequentially or as a tree) == the state of the whole."""
    for hardmax in (True, False):
        data, config = case(seed, hardmax)
        whole = json.dumps(kernel_records(data, config))
        part = np.random.default_rng(seed + 100 * parts).integers(0, parts, data.gt.size)
        for tree in (False, True):
            state = merged_state(data, part, parts, config, tree)
            assert json.dumps(key_metrics(state, "class", data.vocab, config)) == whole


def test_merge_of_many_small_shards_compacts_histograms_exactly():
    """40 shards (> 32 pending histograms) of ties-heavy data: same records as the whole."""
    data, config = case(5, True)
    part = np.random.default_rng(9).integers(0, 40, data.gt.size)
    state = merged_state(data, part, 40, config)
    assert len(state.hist_parts) <= 32
    assert json.dumps(key_metrics(state, "class", data.vocab, config)) == json.dumps(
        kernel_records(data, config))


def test_copy_is_independent_and_vocabularies_must_agree():
    data, config = case(3, True)
    state = kernel(data, config)
    before = json.dumps(key_metrics(state, "class", data.vocab, config))
    copy = state.copy()
    copy.merge(kernel(data, config), config)
    assert json.dumps(key_metrics(state, "class", data.vocab, config)) == before
    doubled = key_metrics(copy, "class", data.vocab, config)
    counts = [r["value"]["tp"] for r in doubled if r["type"] == "Counts"]
    assert counts == [2 * r["value"]["tp"] for r in json.loads(before) if r["type"] == "Counts"]
    other = random_key(np.random.default_rng(0), 10, 4)
    with pytest.raises(ValueError):
        state.merge(kernel(other, config), config)


@pytest.mark.parametrize("seed", [2, 4, 7])
def test_records_do_not_depend_on_input_order(seed):
    """Permuted datums and shuffled entries give byte-identical records; key_metrics is
    repeatable on one state."""
    for hardmax in (True, False):
        data, config = case(seed, hardmax)
        whole = json.dumps(kernel_records(data, config))
        rng = np.random.default_rng(seed)
        shuffled = data.subset(rng.permutation(data.gt.size))
        perm = rng.permutation(shuffled.datum.size)
        shuffled.datum, shuffled.value, shuffled.score = (
            shuffled.datum[perm], shuffled.value[perm], shuffled.score[perm])
        assert json.dumps(kernel_records(shuffled, config, arrow_uids=False)) == whole
        state = kernel(data, config)
        first = json.dumps(key_metrics(state, "class", data.vocab, config))
        assert json.dumps(key_metrics(state, "class", data.vocab, config)) == first == whole


def test_record_order_is_thresholds_then_values():
    """Records come in a fixed order: per threshold, per value Counts/Precision/Recall/F1, then
    Accuracy; then ROCAUC per value, mROCAUC, curves, matrices per threshold, detailed curve."""
    data, config = case(1, True)
    records = kernel_records(data, config)
    _, E = data.dense()
    present = [data.vocab[v] for v in np.flatnonzero((data.gt[:, None] == np.arange(len(data.vocab))).any(0) | E.any(0))]
    expected = []
    for t in config.score_thresholds:
        for value in present:
            expected += [("Counts", value, t), ("Precision", value, t), ("Recall", value, t), ("F1", value, t)]
        expected.append(("Accuracy", None, t))
    expected += [("ROCAUC", value, None) for value in present]
    expected += [("mROCAUC", None, None), ("PrecisionRecallCurve", None, None)]
    expected += [("ConfusionMatrix", None, t) for t in config.score_thresholds]
    expected.append(("DetailedPrecisionRecallCurve", None, None))
    got = [(r["type"], r["parameters"].get("label", {}).get("value"),
            r["parameters"].get("score_threshold")) for r in records]
    assert got == expected


def test_metrics_selection_limits_the_records():
    data, _ = case(3, True)
    config = ClassificationConfig(score_thresholds=(0.0, 0.5), metrics=frozenset({"F1", "ROCAUC"}))
    records = kernel_records(data, config)
    assert {r["type"] for r in records} == {"F1", "ROCAUC"}
    assert_records(records, expected_records(data, config))


# ----------------------------------------------------------------------------- hand-made cases

def hand_case():
    """vocab a < b < c. d0: gt a, a .6 b .6 (tie: a wins). d1: gt b, c .9. d2: no gt, b .4
    (hallucination). d3: gt c, no prediction. d4: neither (outside the population)."""
    vocab = ["a", "b", "c"]
    gt = [0, 1, -1, 2, -1]
    S = np.array([[.6, .6, 0], [0, 0, .9], [0, .4, 0], [0, 0, 0], [0, 0, 0]])
    return make_key(gt, ["d0", "d1", "d2", "d3", "d4"], S, S > 0, vocab)


def _by(records, type_, value=None, t=None):
    out = [r for r in records if r["type"] == type_
           and (value is None or r["parameters"]["label"]["value"] == value)
           and (t is None or r["parameters"]["score_threshold"] == t)]
    assert len(out) == 1, (type_, value, t)
    return out[0]["value"]


def test_hand_made_case_hardmax():
    config = ClassificationConfig(score_thresholds=(0.0, 0.5), hardmax=True, max_examples=2)
    records = kernel_records(hand_case(), config)
    assert _by(records, "Counts", "a", 0.5) == {"tp": 1, "fp": 0, "fn": 0, "tn": 3}
    assert _by(records, "Counts", "b", 0.5) == {"tp": 0, "fp": 0, "fn": 1, "tn": 3}
    assert _by(records, "Counts", "b", 0.0) == {"tp": 0, "fp": 1, "fn": 1, "tn": 2}
    assert _by(records, "Counts", "c", 0.5) == {"tp": 0, "fp": 1, "fn": 1, "tn": 2}
    assert _by(records, "Accuracy", t=0.5) == pytest.approx(1 / 3)
    assert _by(records, "Precision", "c", 0.0) == 0.0
    assert _by(records, "ROCAUC", "a") == 1.0
    assert _by(records, "ROCAUC", "b") == pytest.approx(1 / 6)
    assert _by(records, "ROCAUC", "c") == pytest.approx(1 / 3)
    cm = _by(records, "ConfusionMatrix", t=0.0)
    assert cm == {
        "confusion_matrix": {"a": {"a": {"count": 1, "examples": [{"datum_uid": "d0", "score": 0.6}]}},
                             "b": {"c": {"count": 1, "examples": [{"datum_uid": "d1", "score": 0.9}]}}},
        "unmatched_ground_truths": {"c": {"count": 1, "examples": [{"datum_uid": "d3"}]}},
        "unmatched_predictions": {"b": {"count": 1, "examples": [{"datum_uid": "d2", "score": 0.4}]}}}
    assert_records(records, expected_records(hand_case(), config))


def test_hand_made_case_without_hardmax():
    config = ClassificationConfig(score_thresholds=(0.5,), hardmax=False, pr_curve_thresholds=(0.5,))
    records = kernel_records(hand_case(), config)
    assert _by(records, "Counts", "b", 0.5) == {"tp": 0, "fp": 1, "fn": 1, "tn": 2}
    cm = _by(records, "ConfusionMatrix")
    assert cm["confusion_matrix"]["a"] == {"a": {"count": 1, "examples": [{"datum_uid": "d0", "score": 0.6}]},
                                           "b": {"count": 1, "examples": [{"datum_uid": "d0", "score": 0.6}]}}
    detailed = _by(records, "DetailedPrecisionRecallCurve")
    assert detailed["b"]["0.5"]["fp"]["observations"]["misclassifications"]["count"] == 1
    assert detailed["b"]["0.5"]["fn"]["observations"]["misclassifications"]["count"] == 1  # d1: c .9
    assert detailed["c"]["0.5"]["fn"]["observations"]["no_predictions"] == {
        "count": 1, "examples": [{"datum_uid": "d3"}]}
    assert_records(records, expected_records(hand_case(), config))


# ----------------------------------------------------------------------------- degenerate cases

def test_value_without_positives_has_no_auc():
    vocab = ["a", "b", "z"]
    S = np.array([[.9, .1, .5], [.2, .8, .5], [.3, .3, 0]])
    data = make_key([0, 1, 0], ["x", "y", "w"], S, S > 0, vocab)
    config = ClassificationConfig()
    records = kernel_records(data, config)
    assert _by(records, "ROCAUC", "z") is None
    assert _by(records, "ROCAUC", "a") == 1.0
    assert _by(records, "mROCAUC") == pytest.approx(np.mean([1.0, skm.roc_auc_score([0, 1, 0], S[:, 1])]))
    assert_records(records, expected_records(data, config))


def test_value_that_is_every_datums_ground_truth_has_no_auc():
    S = np.array([[.9], [.1]])
    data = make_key([0, 0], ["x", "y"], S, S > 0, ["a"])
    records = kernel_records(data, ClassificationConfig())
    assert _by(records, "ROCAUC", "a") is None
    assert _by(records, "mROCAUC") is None


@pytest.mark.parametrize("hardmax", [True, False])
def test_all_scores_equal(hardmax):
    """Every datum scores every value 0.5: AUC 0.5; with hardmax the smallest value wins."""
    rng = np.random.default_rng(5)
    n, vocab = 60, ["a", "b", "c", "d"]
    gt = rng.integers(-1, 4, n)
    gt[:4] = [0, 1, 2, 3]
    S = np.full((n, 4), 0.5)
    data = make_key(gt, [f"u{i}" for i in range(n)], S, S > 0, vocab, rng)
    config = ClassificationConfig(score_thresholds=(0.0, 0.5, 0.6), hardmax=hardmax)
    records = kernel_records(data, config)
    for value in vocab:
        assert _by(records, "ROCAUC", value) == 0.5
    if hardmax:
        assert _by(records, "Counts", "a", 0.5)["fp"] == int((gt != 0).sum())
        assert _by(records, "Counts", "b", 0.5)["fp"] == 0
    else:
        assert _by(records, "Recall", "d", 0.5) == 1.0
    assert _by(records, "Counts", "a", 0.6)["tp"] == 0
    assert_records(records, expected_records(data, config))


def test_key_without_any_prediction():
    rng = np.random.default_rng(11)
    gt = rng.integers(-1, 3, 50)
    gt[:3] = [0, 1, 2]
    data = make_key(gt, [f"u{i}" for i in range(50)], np.zeros((50, 3)), np.zeros((50, 3), bool), ["a", "b", "c"])
    config = ClassificationConfig(score_thresholds=(0.0, 0.5))
    records = kernel_records(data, config)
    for value, v in zip(data.vocab, range(3)):
        assert _by(records, "Counts", value, 0.0) == {"tp": 0, "fp": 0, "fn": int((gt == v).sum()),
                                                      "tn": int(((gt >= 0) & (gt != v)).sum())}
        assert _by(records, "Precision", value, 0.0) == 0.0
        assert _by(records, "ROCAUC", value) == 0.5
    assert _by(records, "Accuracy", t=0.0) == 0.0
    cm = _by(records, "ConfusionMatrix", t=0.0)
    assert cm["confusion_matrix"] == {} and cm["unmatched_predictions"] == {}
    assert sum(c["count"] for c in cm["unmatched_ground_truths"].values()) == int((gt >= 0).sum())
    assert_records(records, expected_records(data, config))


@pytest.mark.parametrize("n", [0, 4])
def test_empty_population(n):
    """No datum has a ground truth or a prediction: no per-value record, Accuracy 0."""
    data = make_key(np.full(n, -1), [f"u{i}" for i in range(n)], np.zeros((n, 3)),
                    np.zeros((n, 3), bool), ["a", "b", "c"])
    config = ClassificationConfig(score_thresholds=(0.0, 0.5))
    state = kernel(data, config)
    assert state.n_pop == 0
    records = key_metrics(state, "class", data.vocab, config)
    assert [r["type"] for r in records] == [
        "Accuracy", "Accuracy", "mROCAUC", "PrecisionRecallCurve", "ConfusionMatrix",
        "ConfusionMatrix", "DetailedPrecisionRecallCurve"]
    assert [r["value"] for r in records[:3]] == [0.0, 0.0, None]
    assert records[3]["value"] == {} and records[6]["value"] == {}
    assert records[4]["value"] == {"confusion_matrix": {}, "unmatched_ground_truths": {},
                                   "unmatched_predictions": {}}
    assert_records(records, expected_records(data, config))


def test_zero_scores_are_never_positive_but_join_the_population():
    """A datum whose only prediction scores 0 is in the population (a negative) and never a
    positive, even at threshold 0."""
    S = np.array([[0.0, 0.0], [0.7, 0.0], [0.0, 0.0]])
    E = np.array([[True, False], [True, False], [False, False]])
    data = make_key([-1, 0, 1], ["x", "y", "w"], S, E, ["a", "b"])
    config = ClassificationConfig(score_thresholds=(0.0,))
    records = kernel_records(data, config)
    assert _by(records, "Counts", "a", 0.0) == {"tp": 1, "fp": 0, "fn": 0, "tn": 2}
    assert _by(records, "Counts", "b", 0.0) == {"tp": 0, "fp": 0, "fn": 1, "tn": 2}
    assert_records(records, expected_records(data, config))


def test_examples_with_colliding_hashes_do_not_depend_on_input_order():
    """Datums sharing a 64-bit hash: the uid breaks the tie (as ExampleSet documents), so the
    chosen examples are the same whatever the datum order.

    Fails as of writing (product bug): match_key orders datums by hash alone, so first_k keeps
    the colliding datum that comes first in the input before ExampleSet.reduce can compare uids."""
    n = 30
    S = np.zeros((n, 2))
    S[:, 0] = 0.9
    uids = [f"u{i:02d}" for i in range(n)]
    hashes = np.full(n, 7, dtype=np.uint64)  # every datum collides
    data = make_key(np.zeros(n, dtype=int), uids, S, S > 0, ["a", "b"], hashes=hashes)
    config = ClassificationConfig(max_examples=2, metrics=frozenset({"ConfusionMatrix"}))
    expected = [{"datum_uid": "u00", "score": 0.9}, {"datum_uid": "u01", "score": 0.9}]
    for seed in range(4):
        order = np.random.default_rng(seed).permutation(n)
        cm = _by(kernel_records(data.subset(order), config), "ConfusionMatrix")
        assert cm["confusion_matrix"]["a"]["a"]["examples"] == expected, f"permutation {seed}"


# ----------------------------------------------------------------------------- hypothesis

SCORE_CHOICES = [0.0, 0.1, 0.35, 0.5, 0.7, 1.0]


@st.composite
def small_keys(draw):
    V = draw(st.integers(1, 4))
    n = draw(st.integers(0, 25))
    gt = draw(st.lists(st.integers(-1, V - 1), min_size=n, max_size=n))
    cells = draw(st.lists(st.lists(st.one_of(st.none(), st.sampled_from(SCORE_CHOICES)),
                                   min_size=V, max_size=V), min_size=n, max_size=n))
    part = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    S = np.array([[0.0 if c is None else c for c in row] for row in cells]).reshape(n, V)
    E = np.array([[c is not None for c in row] for row in cells], dtype=bool).reshape(n, V)
    data = make_key(gt, [f"d{i}" for i in range(n)], S, E, ["a", "b", "c", "d"][:V])
    return data, np.array(part, dtype=np.int64)


@settings(max_examples=50, deadline=None)
@given(small_keys(), st.booleans())
def test_property_small_keys_match_oracle_and_merge_exactly(key_and_parts, hardmax):
    data, part = key_and_parts
    config = ClassificationConfig(score_thresholds=(0.0, 0.35, 0.7), hardmax=hardmax,
                                  pr_curve_thresholds=(0.0, 0.35, 0.5, 1.0), max_examples=2)
    whole = kernel_records(data, config)
    assert_records(whole, expected_records(data, config))
    merged = merged_state(data, part, 4, config)
    assert json.dumps(key_metrics(merged, "class", data.vocab, config)) == json.dumps(whole)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.1, 0.2, 0.5, 0.9, 1.0])),
                min_size=1, max_size=40))
def test_property_roc_auc_equals_sklearn(rows):
    labels = np.array([r[0] for r in rows])
    scores = np.array([r[1] for r in rows])
    hist = ScoreHistogram.build(np.zeros(len(rows), np.int32), scores, labels.astype(np.int64),
                                (~labels).astype(np.int64))
    _, pos, neg = hist.segment(0)
    auc = roc_auc(pos, neg)
    if labels.all() or not labels.any():
        assert auc is None
    else:
        assert auc == pytest.approx(skm.roc_auc_score(labels, scores), abs=TOL)


@pytest.mark.parametrize("seed", range(8))
def test_grouped_order_is_the_stable_argsort(seed):
    """Entries in runs per datum (one run each, or a datum split over several runs, or no runs
    at all): grouped_order gives np.argsort(kind="stable")'s permutation exactly."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        datums = rng.permutation(n) if seed % 2 else rng.integers(0, max(1, n // 3), n)
        keys = np.repeat(datums, rng.integers(1, 7, n)).astype(np.int64)
        if seed % 4 == 3:                      # short runs: the plain sort's branch
            keys = rng.integers(0, 6, int(rng.integers(0, 30))).astype(np.int64)
        assert np.array_equal(grouped_order(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("scored", [False, True])
def test_partition_is_a_take_per_shard(seed, scored):
    """LabelRows.partition orders the labels once for every shard; each piece must be what
    take(the shard's rows) gives, field for field (rows without labels, rows of many)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    per_row = rng.integers(0, 5, n)
    k = int(per_row.sum())
    rows = LabelRows(
        uid=pa.array([f"d{i}" for i in range(n)]), position=np.arange(n, dtype=np.int64) + 1,
        file_id=rng.integers(0, 3, n).astype(np.int32),
        hash=rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64),
        label_row=np.repeat(np.arange(n), per_row).astype(np.int32),
        key_code=rng.integers(0, 2, k).astype(np.int32), key_names=["a", "b"],
        value_code=rng.integers(0, 4, k).astype(np.int32), value_names=["w", "x", "y", "z"],
        label_score=rng.random(k) if scored else None,
        slices={"region": pa.array([f"r{i % 3}" for i in range(n)])})
    shards = int(rng.integers(1, 40))
    shard = (rows.hash % np.uint64(shards)).astype(np.int64)
    pieces = rows.partition(shards)
    assert sorted(pieces) == sorted(set(shard.tolist()))
    for s, piece in pieces.items():
        expected = rows.take(np.flatnonzero(shard == s))
        for field in dataclasses.fields(LabelRows):
            got, want = getattr(piece, field.name), getattr(expected, field.name)
            if field.name == "slices":
                assert {key: v.to_pylist() for key, v in got.items()} == \
                    {key: v.to_pylist() for key, v in want.items()}
            elif isinstance(want, pa.Array):
                assert got.equals(want)
            elif isinstance(want, np.ndarray):
                assert got.dtype == want.dtype and np.array_equal(got, want)
            else:
                assert got == want


# ----------------------------------------------------------------------------- ranking

@pytest.mark.parametrize("seed", range(6))
def test_histogram_auc_and_counts_equal_sklearn_and_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, V = int(rng.integers(1, 3000)), int(rng.integers(1, 6))
    value = rng.integers(0, V, n).astype(np.int32)
    score = np.round(rng.random(n), int(rng.integers(1, 3)))
    score[rng.random(n) < 0.1] = 0.0
    label = rng.random(n) < rng.uniform(0.05, 0.95)
    hist = ScoreHistogram.build(value, score, label.astype(np.int64), (~label).astype(np.int64))
    # merging histograms of a split is the histogram of the whole
    split = rng.integers(0, 3, n)
    parts = [ScoreHistogram.build(value[split == j], score[split == j], label[split == j].astype(np.int64),
                                  (~label[split == j]).astype(np.int64)) for j in range(3)]
    merged = ScoreHistogram.merge(parts)
    for field in ("value", "score", "pos", "neg"):
        np.testing.assert_array_equal(getattr(merged, field), getattr(hist, field))
    thresholds = np.array([0.0, 0.05, 0.1, 0.3, 0.35, 0.5, 0.7, 0.99, 1.0])
    for v in range(V):
        scores, pos, neg = hist.segment(v)
        assert np.all(np.diff(scores) > 0)
        mine = value == v
        y, s = label[mine], score[mine]
        auc = roc_auc(pos, neg)
        if y.size and 0 < y.sum() < y.size:
            assert auc == pytest.approx(skm.roc_auc_score(y, s), abs=TOL)
        else:
            assert auc is None
        tp, fp = counts_at_thresholds(scores, pos, neg, thresholds)
        hit = (s[None, :] >= thresholds[:, None]) & (s[None, :] > 0)
        np.testing.assert_array_equal(tp, (hit & y[None, :]).sum(axis=1))
        np.testing.assert_array_equal(fp, (hit & ~y[None, :]).sum(axis=1))


def test_counts_at_thresholds_edge_cases():
    scores, pos, neg = np.array([0.0, 0.5, 1.0]), np.array([3, 1, 2]), np.array([4, 5, 0])
    tp, fp = counts_at_thresholds(scores, pos, neg, np.array([0.0, 0.5, 0.50001, 1.0]))
    assert tp.tolist() == [3, 3, 2, 2] and fp.tolist() == [5, 5, 0, 0]
    tp, fp = counts_at_thresholds(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), np.array([0.0, 1.0]))
    assert tp.tolist() == [0, 0] and fp.tolist() == [0, 0]


def test_roc_auc_exact_values():
    assert roc_auc(np.array([0, 1]), np.array([1, 0])) == 1.0
    assert roc_auc(np.array([1, 0]), np.array([0, 1])) == 0.0
    assert roc_auc(np.array([2]), np.array([3])) == 0.5
    assert roc_auc(np.array([0, 0]), np.array([1, 1])) is None
    assert roc_auc(np.array([1, 2]), np.array([0, 0])) is None


# ----------------------------------------------------------------------------- examples

def brute_first_k(groups, k):
    seen: dict = {}
    out = []
    for i, g in enumerate(groups.tolist()):
        if seen.get(g, 0) < k:
            seen[g] = seen.get(g, 0) + 1
            out.append(i)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_first_k_and_record_layers_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 5, 60, 1000]))
    n_groups = int(rng.integers(1, 12))
    groups = rng.integers(0, n_groups, n).astype(np.int64)
    levels = rng.integers(0, int(rng.integers(1, 8)), n).astype(np.int64)
    for k in (0, 1, 2, 5):
        chosen = first_k(groups, k, n_groups)
        assert chosen.tolist() == brute_first_k(groups, k)
        layers = record_layers(groups, levels, k)
        assert layers.tolist() == sorted(set(layers.tolist()))
        kept = set(layers.tolist())
        for p in range(int(levels.max()) + 1 if n else 1):
            eligible = np.flatnonzero(levels > p)
            needed = eligible[brute_first_k(groups[eligible], k)]
            assert set(needed.tolist()) <= kept, (k, p)


def test_record_layers_prunes_dominated_items():
    groups = np.zeros(6, dtype=np.int64)
    levels = np.array([3, 1, 2, 3, 0, 4])
    assert record_layers(groups, levels, 1).tolist() == [0, 5]
    assert record_layers(groups, levels, 2).tolist() == [0, 1, 2, 3, 5]


@pytest.mark.parametrize("seed", range(5))
def test_example_set_reduce_keeps_smallest_hash_then_uid(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    group = rng.integers(0, 6, n).astype(np.int64)
    hashes = rng.integers(0, 20, n).astype(np.uint64)  # many collisions
    uids = np.array([f"u{i}" for i in rng.permutation(n)], dtype=object)
    score = rng.random(n)
    full = ExampleSet(group, hashes, uids, score)
    for k in (1, 3):
        reduced = full.reduce(k)
        expected = []
        for g in sorted(set(group.tolist())):
            rows = sorted(np.flatnonzero(group == g), key=lambda i: (int(hashes[i]), uids[i]))[:k]
            expected += [(g, uids[i], score[i]) for i in rows]
        assert list(zip(reduced.group.tolist(), reduced.uid.tolist(), reduced.score.tolist())) == expected
        # reducing reduced parts of a random split gives the same set
        split = rng.integers(0, 3, n)
        parts = [full.take(np.flatnonzero(split == j)).reduce(k) for j in range(3)]
        again = ExampleSet.concat(parts).reduce(k)
        assert again.uid.tolist() == reduced.uid.tolist()
    assert len(full.reduce(0)) == 0


# ----------------------------------------------------------------------------- hashing

def test_fnv1a_known_value():
    assert int(fnv1a_64(pa.array(["a"]))[0]) == 0xAF63DC4C8601EC8C
    assert int(fnv1a_64(pa.array([""]))[0]) == 0xCBF29CE484222325


def _random_strings(rng, n):
    alphabet = ["a", "Z", "0", " ", "é", "ß", "图", "😀", "\u0301", "\x00"]
    return ["".join(rng.choice(alphabet, size=int(rng.integers(0, 12)))) for _ in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_fnv1a_matches_pure_python(seed):
    rng = np.random.default_rng(seed)
    strings = _random_strings(rng, 300) + ["", "", "d1", "ü-2", "图3"]
    with_nulls = [None if rng.random() < 0.1 else s for s in strings]
    expected = [fnv1a_py(s or "") for s in with_nulls]
    for type_ in (pa.string(), pa.large_string()):
        array = pa.array(with_nulls, type_)
        assert fnv1a_64(array).tolist() == expected
        for start, stop in ((0, 0), (3, 40), (17, len(strings)), (len(strings) - 1, len(strings))):
            assert fnv1a_64(array.slice(start, stop - start)).tolist() == expected[start:stop]
    chunked = pa.chunked_array([pa.array(with_nulls[:100]), pa.array(with_nulls[100:])])
    assert fnv1a_64(chunked).tolist() == expected
    assert fnv1a_64(pa.chunked_array([], pa.string())).tolist() == []
    assert fnv1a_64(chunked.slice(50, 120)).tolist() == expected[50:170]


def test_fnv1a_edge_arrays():
    assert fnv1a_64(pa.array([], pa.string())).dtype == np.uint64
    assert fnv1a_64(pa.array(["", "", ""])).tolist() == [fnv1a_py("")] * 3
    assert fnv1a_64(pa.array([None, None], pa.string())).tolist() == [fnv1a_py("")] * 2
    sliced_empty_tail = pa.array(["long string here", "", ""]).slice(1)
    assert fnv1a_64(sliced_empty_tail).tolist() == [fnv1a_py("")] * 2
    with pytest.raises(TypeError):
        fnv1a_64(pa.array([1, 2]))


def test_fnv1a_of_long_strings_is_bounded_and_still_sees_every_byte():
    """Strings past FNV_BYTES: FNV-1a of the first FNV_BYTES bytes, mixed with BLAKE2b of all
    of them; a 20 MB id (one numpy step per byte: hours at 50 MB before) takes well under a second."""
    import hashlib
    import time

    from evalbeam.schemas.hashing import FNV_BYTES

    def long_hash(s: str) -> int:
        data = s.encode("utf-8")
        h = 0xCBF29CE484222325
        for byte in data[:FNV_BYTES]:
            h = ((h ^ byte) * 0x100000001B3) % 2 ** 64
        tail = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
        return ((h ^ tail) * 0x100000001B3) % 2 ** 64

    edge = ["x" * (FNV_BYTES - 1), "x" * FNV_BYTES, "x" * (FNV_BYTES + 1), "é" * FNV_BYTES]
    assert fnv1a_64(pa.array(edge)).tolist() == [fnv1a_py(edge[0]), fnv1a_py(edge[1]),
                                                 long_hash(edge[2]), long_hash(edge[3])]
    big = "u" * 20_000_000
    strings = ["a", big, big[:-1] + "v", "b" * 5000, None]
    started = time.perf_counter()
    for type_ in (pa.string(), pa.large_string()):
        got = fnv1a_64(pa.array(strings, type_)).tolist()
        assert got[0] == fnv1a_py("a") and got[4] == fnv1a_py("")
        assert got[3] == long_hash("b" * 5000) and got[1] != got[2]      # the last byte counts
        assert fnv1a_64(pa.array(strings, type_).slice(1, 2)).tolist() == got[1:3]
    assert time.perf_counter() - started < 10
