"""Calibration kernel (transforms/kernels/calibration.py) against hand formulas, scikit-learn
and a dense numpy reference on datasets where each datum is repeated w times."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss

from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.transforms.kernels.bootstrap import REPLICATES, Bootstrap
from evalbeam.transforms.kernels.calibration import (
    CALIBRATION_TYPES,
    CalibrationConfig,
    calibration_records,
    cell_sums,
    match_calibration,
    quantile_edges,
    split_exact,
)

TOL = 1e-12


# ----------------------------------------------------------------------------- data

class Data:
    """A dense dataset: gt int[n] (-1: no ground truth), scores float[n, V], present bool[n, V]
    (which (datum, value) pairs are prediction entries), uids."""

    def __init__(self, gt, scores, present, uids=None):
        self.gt = np.asarray(gt, dtype=np.int32)
        self.scores = np.asarray(scores, dtype=np.float64)
        self.present = np.asarray(present, dtype=bool)
        self.scores = np.where(self.present, self.scores, 0.0)
        n = self.gt.size
        self.uids = list(uids) if uids is not None else [f"d{i}" for i in range(n)]
        self.hashes = fnv1a_64(pa.array(self.uids, pa.string()))

    @property
    def V(self):
        return self.scores.shape[1]

    def entries(self, rows=None, rng=None):
        rows = np.arange(self.gt.size) if rows is None else np.asarray(rows)
        local_d, v = np.nonzero(self.present[rows])
        order = np.arange(local_d.size)
        if rng is not None:
            order = rng.permutation(local_d.size)
        local_d, v = local_d[order], v[order]
        return local_d.astype(np.int64), v.astype(np.int32), self.scores[rows][local_d, v]

    def state(self, config, rows=None, rng=None, weights=None):
        rows = np.arange(self.gt.size) if rows is None else np.asarray(rows)
        ed, ev, es = self.entries(rows, rng)
        return match_calibration(self.gt[rows], self.hashes[rows], ed, ev, es, self.V, config,
                                 weights=weights)

    def repeat(self, w):
        """The dataset where datum i appears w[i] times."""
        idx = np.repeat(np.arange(self.gt.size), np.asarray(w, dtype=np.int64))
        return Data(self.gt[idx], self.scores[idx], self.present[idx], [self.uids[i] for i in idx])


def random_data(seed, n=300, V=4, grid=None, p_gt=0.9, p_entry=0.8, normalized=True):
    rng = np.random.default_rng(seed)
    gt = np.where(rng.random(n) < p_gt, rng.integers(0, V, n), -1)
    scores = rng.dirichlet(np.ones(V) * 0.7, n) if normalized else rng.random((n, V))
    if grid:
        # coarse scores: many ties, values on bin edges, and exact 0s and 1s
        scores = np.round(scores * grid) / grid
    present = rng.random((n, V)) < p_entry
    return Data(gt, scores, present)


def records_of(data, config, **kw):
    state = data.state(config, **kw)
    return calibration_records(state, "k", [f"v{i}" for i in range(data.V)], config)


def find(records, type_, binning=None, value=None):
    for rec in records:
        p = rec["parameters"]
        if rec["type"] != type_:
            continue
        if binning is not None and p.get("binning") != binning:
            continue
        if value is not None and p["label"]["value"] != value:
            continue
        return rec
    raise KeyError((type_, binning, value))


# ----------------------------------------------------------------------------- reference

def ref_top(data):
    """(confidence, correct, brier term) of the population, straight from the dense matrix."""
    pop = data.gt >= 0
    gt = data.gt[pop]
    S, P = data.scores[pop], data.present[pop]
    masked = np.where(P, S, -1.0)
    conf = np.where(P.any(axis=1), masked.max(axis=1), 0.0)
    top = np.argmax(masked, axis=1)          # first (smallest index) of the maxima
    correct = P.any(axis=1) & (top == gt) & (conf > 0)
    Y = np.zeros_like(S)
    Y[np.arange(gt.size), gt] = 1.0
    brier = ((S - Y) ** 2).sum(axis=1)
    return conf, correct, brier


def ref_bins(x, B, binning):
    if binning == "equal_width":
        edges = np.linspace(0.0, 1.0, B + 1)
    else:
        edges = np.percentile(x, np.linspace(0, 1, B + 1) * 100)
    return edges, np.searchsorted(edges[1:-1], x)


def ref_calibration(data, B, binning):
    """ECE, MCE, Brier and the diagram (count, mean confidence, accuracy per bin) in floats."""
    conf, correct, brier = ref_top(data)
    N = conf.size
    if not N:
        return None, None, None, []
    edges, ids = ref_bins(conf, B, binning)
    ece, mce, diagram = 0.0, 0.0, []
    for b in range(B):
        sel = ids == b
        nb = int(sel.sum())
        if nb:
            acc, mean = correct[sel].mean(), conf[sel].mean()
            ece += nb / N * abs(acc - mean)
            mce = max(mce, abs(acc - mean))
            diagram.append((edges[b], edges[b + 1], nb, mean, acc))
        else:
            diagram.append((edges[b], edges[b + 1], 0, None, None))
    return ece, mce, brier.mean(), diagram


def close(a, b, tol=TOL):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol


def check_against_reference(records, data, B, binnings):
    for binning in binnings:
        ece, mce, brier, diagram = ref_calibration(data, B, binning)
        assert close(find(records, "ECE", binning)["value"], ece), (binning, ece)
        assert close(find(records, "MCE", binning)["value"], mce), (binning, mce)
        assert close(find(records, "BrierScore")["value"], brier)
        got = find(records, "ReliabilityDiagram", binning)["value"]["bins"]
        assert len(got) == len(diagram)
        for g, (lo, hi, nb, mean, acc) in zip(got, diagram):
            assert g["lower"] == lo and g["upper"] == hi and g["count"] == nb
            assert close(g["confidence"], mean) and close(g["accuracy"], acc)


# ----------------------------------------------------------------------------- hand cases

def test_hand_formulas_with_ties_and_empty_bins():
    # 4 datums, 2 values, 4 bins of width 0.25; bins: [0, .25], (.25, .5], (.5, .75], (.75, 1]
    scores = [[0.9, 0.1], [0.5, 0.5], [0.25, 0.75], [0.0, 0.0]]
    present = [[1, 1], [1, 1], [1, 1], [0, 0]]
    data = Data([0, 1, 1, 0], scores, present)
    config = CalibrationConfig(bins=4, binnings=("equal_width",))
    recs = records_of(data, config)
    # confidences .9 (correct), .5 (tie: value 0 wins, wrong), .75 (correct), 0 (no prediction)
    # bins: 0 -> {0}, 1 -> {.5}, 2 -> {.75} (0.75 is on the edge: lower bin), 3 -> {.9}
    bins = find(recs, "ReliabilityDiagram", "equal_width")["value"]["bins"]
    assert [b["count"] for b in bins] == [1, 1, 1, 1]
    assert [b["accuracy"] for b in bins] == [0.0, 0.0, 1.0, 1.0]
    assert [b["confidence"] for b in bins] == [0.0, 0.5, 0.75, 0.9]
    ece = (abs(0 - 0) + abs(0 - 0.5) + abs(1 - 0.75) + abs(1 - 0.9)) / 4
    assert find(recs, "ECE", "equal_width")["value"] == pytest.approx(ece, abs=TOL)
    assert find(recs, "MCE", "equal_width")["value"] == pytest.approx(0.5, abs=TOL)
    brier = ((0.1 ** 2 + 0.1 ** 2) + (0.25 + 0.25) + (0.25 ** 2 + 0.25 ** 2) + 1.0) / 4
    assert find(recs, "BrierScore")["value"] == pytest.approx(brier, abs=TOL)

    # empty bins: all confidences in one bin of ten
    data = Data([0, 0, 1], [[0.95, 0], [0.97, 0], [0.99, 0]], [[1, 0]] * 3)
    recs = records_of(data, CalibrationConfig(bins=10, binnings=("equal_width",)))
    bins = find(recs, "ReliabilityDiagram", "equal_width")["value"]["bins"]
    assert [b["count"] for b in bins] == [0] * 9 + [3]
    assert bins[0]["confidence"] is None and bins[0]["accuracy"] is None
    mean = (0.95 + 0.97 + 0.99) / 3
    assert find(recs, "ECE", "equal_width")["value"] == pytest.approx(abs(2 / 3 - mean), abs=TOL)
    assert find(recs, "MCE", "equal_width")["value"] == pytest.approx(abs(2 / 3 - mean), abs=TOL)


def test_one_bin_is_the_overall_gap():
    data = random_data(3, n=200, V=3)
    conf, correct, _ = ref_top(data)
    for binning in ("equal_width", "equal_mass"):
        recs = records_of(data, CalibrationConfig(bins=1, binnings=(binning,)))
        gap = abs(correct.mean() - conf.mean())
        assert find(recs, "ECE", binning)["value"] == pytest.approx(gap, abs=TOL)
        assert find(recs, "MCE", binning)["value"] == pytest.approx(gap, abs=TOL)
        assert len(find(recs, "ReliabilityDiagram", binning)["value"]["bins"]) == 1


def test_all_correct_with_certainty_and_no_predictions():
    data = Data([0, 1, 2], np.eye(3), np.ones((3, 3)))
    recs = records_of(data, CalibrationConfig(bins=5))
    for binning in ("equal_width", "equal_mass"):
        assert find(recs, "ECE", binning)["value"] == 0.0
        assert find(recs, "MCE", binning)["value"] == 0.0
    assert find(recs, "BrierScore")["value"] == 0.0

    # no prediction at all: confidence 0, never correct, Brier term 1 each
    data = Data([0, 1, 2], np.zeros((3, 3)), np.zeros((3, 3)))
    recs = records_of(data, CalibrationConfig(bins=5))
    assert find(recs, "BrierScore")["value"] == 1.0
    for binning in ("equal_width", "equal_mass"):
        assert find(recs, "ECE", binning)["value"] == 0.0
        bins = find(recs, "ReliabilityDiagram", binning)["value"]["bins"]
        assert bins[0]["count"] == 3 and bins[0]["accuracy"] == 0.0 and bins[0]["confidence"] == 0.0


def test_score_zero_is_not_a_correct_prediction():
    # the ground-truth value is the top (smallest index among the 0 ties) but scores 0
    data = Data([0], [[0.0, 0.0]], [[1, 1]])
    recs = records_of(data, CalibrationConfig(bins=2, binnings=("equal_width",)))
    assert find(recs, "ReliabilityDiagram", "equal_width")["value"]["bins"][0]["accuracy"] == 0.0
    assert find(recs, "BrierScore")["value"] == 1.0


def test_population_is_the_datums_with_a_ground_truth():
    # the second datum has only predictions: it is left out of every metric
    data = Data([1, -1], [[0.2, 0.8], [0.9, 0.1]], [[1, 1], [1, 1]])
    recs = records_of(data, CalibrationConfig(bins=10))
    assert find(recs, "ECE", "equal_width")["value"] == pytest.approx(0.2, abs=TOL)
    assert find(recs, "BrierScore")["value"] == pytest.approx(0.04 + 0.04, abs=TOL)
    # no population at all: undefined values, empty equal-mass diagram
    data = Data([-1, -1], [[0.2, 0.8], [0.9, 0.1]], [[1, 1], [1, 1]])
    config = CalibrationConfig(bins=10, bootstrap=Bootstrap(5, 0.9, 1))
    recs = records_of(data, config)
    for rec in recs:
        if rec["type"] in ("ECE", "MCE", "BrierScore"):
            assert rec["value"] is None and REPLICATES not in rec
    assert find(recs, "ReliabilityDiagram", "equal_mass")["value"] == {"bins": []}
    assert [b["count"] for b in find(recs, "ReliabilityDiagram", "equal_width")["value"]["bins"]] == [0] * 10
    assert not [r for r in recs if r["type"] == "ClasswiseReliabilityDiagram"]


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), float("inf")])
def test_scores_outside_the_unit_interval_are_refused(bad):
    data = Data([0], [[0.5, 0.5]], [[1, 1]])
    ed, ev, es = data.entries()
    es = es.copy()
    es[1] = bad
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        match_calibration(data.gt, data.hashes, ed, ev, es, 2, CalibrationConfig())


def test_config_checks():
    with pytest.raises(ValueError):
        CalibrationConfig(bins=0)
    with pytest.raises(ValueError):
        CalibrationConfig(binnings=("equal_height",))
    with pytest.raises(ValueError):
        CalibrationConfig(binnings=())
    with pytest.raises(ValueError):
        CalibrationConfig(metrics=frozenset({"ECE", "Sharpness"}))
    assert CalibrationConfig(binnings=("equal_mass", "equal_width")).binnings == ("equal_width", "equal_mass")


def test_record_shapes_and_metric_subsets():
    data = random_data(1, n=50, V=3)
    recs = records_of(data, CalibrationConfig(bins=4))
    types = [r["type"] for r in recs]
    assert types[:7] == ["BrierScore", "ECE", "MCE", "ReliabilityDiagram", "ECE", "MCE", "ReliabilityDiagram"]
    assert types.count("ClasswiseReliabilityDiagram") == 2 * 3
    assert find(recs, "ECE", "equal_mass")["parameters"] == {"label_key": "k", "bins": 4, "binning": "equal_mass"}
    assert find(recs, "ClasswiseReliabilityDiagram", "equal_width", "v1")["parameters"] == {
        "label": {"key": "k", "value": "v1"}, "bins": 4, "binning": "equal_width"}
    json.dumps(recs, allow_nan=False)
    only = CalibrationConfig(bins=4, metrics=frozenset({"BrierScore", "ECE"}), binnings=("equal_mass",))
    state = data.state(only)
    assert state.classwise is None and not state.class_parts
    assert [r["type"] for r in calibration_records(state, "k", ["a", "b", "c"], only)] == ["BrierScore", "ECE"]


# ----------------------------------------------------------------------------- references

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("bins", [1, 3, 10, 15])
@pytest.mark.parametrize("grid", [None, 10, 4])
def test_against_dense_reference(seed, bins, grid):
    data = random_data(seed, n=257, V=5, grid=grid, normalized=grid is None)
    recs = records_of(data, CalibrationConfig(bins=bins))
    check_against_reference(recs, data, bins, ("equal_width", "equal_mass"))


def sk_curve(y, p, B, strategy):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return calibration_curve(y, p, n_bins=B, strategy=strategy)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("V", [2, 4])
@pytest.mark.parametrize("grid", [None, 10])
@pytest.mark.parametrize("bins", [3, 10])
def test_classwise_equals_sklearn_calibration_curve(seed, V, grid, bins):
    data = random_data(seed, n=301, V=V, grid=grid)
    recs = records_of(data, CalibrationConfig(bins=bins))
    pop = data.gt >= 0
    for v in range(V):
        y = (data.gt[pop] == v).astype(int)
        p = data.scores[pop, v]
        for binning, strategy in (("equal_width", "uniform"), ("equal_mass", "quantile")):
            prob_true, prob_pred = sk_curve(y, p, bins, strategy)
            bins_ = find(recs, "ClasswiseReliabilityDiagram", binning, f"v{v}")["value"]["bins"]
            nonempty = [b for b in bins_ if b["count"]]
            assert sum(b["count"] for b in bins_) == y.size
            assert len(nonempty) == len(prob_true)
            np.testing.assert_allclose([b["accuracy"] for b in nonempty], prob_true, rtol=0, atol=TOL)
            np.testing.assert_allclose([b["confidence"] for b in nonempty], prob_pred, rtol=0, atol=TOL)


def test_binary_brier_is_twice_sklearns_and_multiclass_equals_it():
    rng = np.random.default_rng(7)
    n = 400
    p1 = np.round(rng.random(n), 3)
    data = Data(rng.integers(0, 2, n), np.column_stack([1 - p1, p1]), np.ones((n, 2)))
    rec = find(records_of(data, CalibrationConfig()), "BrierScore")
    assert rec["value"] == pytest.approx(2 * brier_score_loss(data.gt, p1), abs=TOL)
    V = 5
    probs = rng.dirichlet(np.ones(V), n)
    data = Data(rng.integers(0, V, n), probs, np.ones((n, V)))
    rec = find(records_of(data, CalibrationConfig()), "BrierScore")
    expected = brier_score_loss(data.gt, probs, labels=list(range(V)), scale_by_half=False)
    assert rec["value"] == pytest.approx(expected, abs=TOL)


def test_binary_calibration_curve_on_the_positive_class():
    # the classwise diagram of the positive value of a binary key is sklearn's usual call
    rng = np.random.default_rng(11)
    n = 500
    p1 = np.round(rng.random(n), 2)
    y = rng.integers(0, 2, n)
    data = Data(y, np.column_stack([1 - p1, p1]), np.ones((n, 2)))
    recs = records_of(data, CalibrationConfig(bins=8))
    for binning, strategy in (("equal_width", "uniform"), ("equal_mass", "quantile")):
        prob_true, prob_pred = sk_curve(y, p1, 8, strategy)
        nonempty = [b for b in find(recs, "ClasswiseReliabilityDiagram", binning, "v1")["value"]["bins"]
                    if b["count"]]
        np.testing.assert_allclose([b["accuracy"] for b in nonempty], prob_true, rtol=0, atol=TOL)
        np.testing.assert_allclose([b["confidence"] for b in nonempty], prob_pred, rtol=0, atol=TOL)


# ----------------------------------------------------------------------------- exact pieces

def test_quantile_edges_are_numpys_bit_for_bit():
    rng = np.random.default_rng(5)
    cases = [rng.random(n) for n in (1, 2, 3, 7, 100, 1001)]
    cases.append(np.round(rng.random(500), 1))                       # heavy ties
    cases.append(0.5 + np.arange(40) * np.spacing(0.5))               # neighbours one ulp apart
    cases.append(np.r_[np.zeros(30), 1e-300, 5e-324, np.ones(30)])   # extremes
    for x in cases:
        for B in (1, 2, 3, 7, 10, 15, 64):
            values, counts = np.unique(x, return_counts=True)
            got = quantile_edges(values, np.cumsum(counts), B)
            expected = np.percentile(x, np.linspace(0, 1, B + 1) * 100)
            assert np.array_equal(got, expected), (x.size, B)
            # integer weights: the expanded data
            w = rng.integers(0, 4, values.size)
            w[rng.integers(values.size)] = 1
            got = quantile_edges(values, np.cumsum(w), B)
            expected = np.percentile(np.repeat(values, w), np.linspace(0, 1, B + 1) * 100)
            assert np.array_equal(got, expected), (x.size, B, "weighted")


def test_split_exact_and_cell_sums_are_exact():
    from fractions import Fraction

    rng = np.random.default_rng(9)
    x = np.r_[rng.random(500), 0.0, 1.0, 5e-324, 1e-300, 2.0 ** -10, 2.0 ** -11, 7.5, 1 - 2 ** -53]
    band, parts = split_exact(x)
    for value, b, p in zip(x, band, parts):
        assert (p >= 0).all() and (p < 2 ** 21).all()
        total = Fraction((int(p[0]) << 42) + (int(p[1]) << 21) + int(p[2])) * Fraction(2) ** (11 * int(b) - 62)
        assert total == Fraction(float(value))
    assert (np.diff(band[np.argsort(x, kind="stable")]) >= 0).all()
    cells = rng.integers(0, 3, x.size)
    ints = np.column_stack([np.ones(x.size, dtype=np.int64), rng.integers(0, 2, x.size)])
    w = rng.integers(0, 19, (4, x.size)).astype(np.uint8)
    weighted = cell_sums(cells, 3, ints, x[:, None], w)
    for r in range(4):
        point = cell_sums(np.repeat(cells, w[r]), 3, np.repeat(ints, w[r], axis=0), np.repeat(x, w[r])[:, None])
        assert np.array_equal(weighted.ints[r], point.ints[0])
        for c in range(3):
            exact = sum((Fraction(float(v)) * int(k) for v, k, cc in zip(x, w[r], cells) if cc == c), Fraction(0))
            assert weighted.exact(0)[r, c] == exact == point.exact(0)[0, c]


# ----------------------------------------------------------------------------- merging

def shard_records(data, config, n_shards, seed):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(data.gt.size)
    pieces = np.array_split(perm, n_shards)
    states = [data.state(config, rows=rows, rng=rng) for rows in pieces]
    order = rng.permutation(len(states))
    merged = states[order[0]].copy()
    for i in order[1:]:
        merged.merge(states[i])
    merged.compact()
    return calibration_records(merged, "k", [f"v{i}" for i in range(data.V)], config)


@pytest.mark.parametrize("bootstrap", [None, Bootstrap(6, 0.9, 4)])
def test_merge_is_exact_across_shards_and_order(bootstrap):
    data = random_data(21, n=700, V=6, grid=20)
    config = CalibrationConfig(bins=7, bootstrap=bootstrap)
    whole = json.dumps(records_of(data, config), sort_keys=True)
    for n_shards, seed in ((1, 0), (7, 1), (7, 2), (40, 3)):
        assert json.dumps(shard_records(data, config, n_shards, seed), sort_keys=True) == whole


def test_merge_leaves_the_other_state_untouched():
    data = random_data(4, n=100, V=3)
    config = CalibrationConfig(bins=5, bootstrap=Bootstrap(3, 0.9, 0))
    a, b = data.state(config, rows=np.arange(50)), data.state(config, rows=np.arange(50, 100))
    before = json.dumps(calibration_records(b.copy(), "k", ["a", "b", "c"], config))
    a.merge(b)
    assert json.dumps(calibration_records(b, "k", ["a", "b", "c"], config)) == before


# ----------------------------------------------------------------------------- bootstrap

@pytest.mark.parametrize("seed", [0, 3, 17])
@pytest.mark.parametrize("grid", [None, 10])
def test_replicates_equal_the_metric_of_the_repeated_dataset(seed, grid):
    data = random_data(seed + 100, n=150, V=4, grid=grid)
    R, B = 7, 6
    bootstrap = Bootstrap(R, 0.95, seed)
    config = CalibrationConfig(bins=B, bootstrap=bootstrap)
    recs = records_of(data, config)
    W = bootstrap.weights(data.hashes)
    for r in range(R):
        repeated = data.repeat(W[r])
        for binning in ("equal_width", "equal_mass"):
            ece, mce, brier, _ = ref_calibration(repeated, B, binning)
            assert close(find(recs, "ECE", binning)[REPLICATES][r], ece), (r, binning)
            assert close(find(recs, "MCE", binning)[REPLICATES][r], mce), (r, binning)
        assert close(find(recs, "BrierScore")[REPLICATES][r], brier)


def test_replicates_with_no_weight_on_the_population_are_undefined():
    data = Data([0, -1], [[0.7, 0.3], [0.1, 0.9]], [[1, 1], [1, 1]])
    bootstrap = Bootstrap(40, 0.95, 2)
    recs = records_of(data, CalibrationConfig(bins=3, bootstrap=bootstrap))
    w = bootstrap.weights(data.hashes[:1])[:, 0]
    assert (w == 0).any() and (w > 0).any()
    for rec in recs:
        if rec["type"] in ("ECE", "MCE", "BrierScore"):
            reps = rec[REPLICATES]
            assert [x is None for x in reps] == list(w == 0)
            assert all(close(x, rec["value"]) for x in reps if x is not None)


def test_bootstrap_changes_no_point_value_and_passed_weights_are_used():
    data = random_data(8, n=120, V=3, grid=8)
    off = records_of(data, CalibrationConfig(bins=5))
    bootstrap = Bootstrap(5, 0.95, 9)
    on = records_of(data, CalibrationConfig(bins=5, bootstrap=bootstrap))
    assert [{k: v for k, v in r.items() if k != REPLICATES} for r in on] == off
    assert all(REPLICATES not in r for r in off)
    assert {r["type"] for r in on if REPLICATES in r} == {"ECE", "MCE", "BrierScore"}
    given = records_of(data, CalibrationConfig(bins=5, bootstrap=bootstrap),
                       weights=bootstrap.weights(data.hashes))
    assert given == on
    with pytest.raises(ValueError, match="weights"):
        records_of(data, CalibrationConfig(bins=5, bootstrap=bootstrap),
                   weights=np.ones((4, data.gt.size), dtype=np.uint8))


def test_state_keeps_per_datum_arrays_only_for_equal_mass_replicates():
    data = random_data(2, n=80, V=3)
    assert not data.state(CalibrationConfig()).datum_parts
    assert not data.state(CalibrationConfig(binnings=("equal_width",), bootstrap=Bootstrap(4))).datum_parts
    state = data.state(CalibrationConfig(bootstrap=Bootstrap(4)))
    (conf, correct, hashes), = state.datum_parts
    assert conf.size == int((data.gt >= 0).sum())
    assert state.top_replicates.ints.shape == (4, 15, 2)
    assert CALIBRATION_TYPES == ("ECE", "MCE", "BrierScore", "ReliabilityDiagram", "ClasswiseReliabilityDiagram")


def test_negative_zero_scores_are_zero():
    # -0.0 and 0.0 tie; whichever comes first, the diagrams print 0.0
    a = Data([0, 1, 1], [[-0.0, 0.4], [0.0, 0.6], [0.5, 0.5]], np.ones((3, 2)))
    b = Data([0, 1, 1], [[0.0, 0.4], [-0.0, 0.6], [0.5, 0.5]], np.ones((3, 2)))
    config = CalibrationConfig(bins=3)
    ra, rb = json.dumps(records_of(a, config)), json.dumps(records_of(b, config))
    assert ra == rb and "-0.0" not in ra


@pytest.mark.parametrize("n, bins, counts", [(23, 5, [5, 4, 5, 4, 5]), (101, 10, [11] + [10] * 9),
                                             (9, 4, [3, 2, 2, 2])])
def test_equal_mass_counts_follow_the_documented_rule(n, bins, counts):
    rng = np.random.default_rng(n)
    conf = np.sort(rng.uniform(0.3, 0.9, n))
    data = Data(np.zeros(n, dtype=int), np.column_stack([conf, 1 - conf]), np.ones((n, 2)))
    recs = records_of(data, CalibrationConfig(bins=bins, binnings=("equal_mass",)))
    assert [b["count"] for b in find(recs, "ReliabilityDiagram", "equal_mass")["value"]["bins"]] == counts


def test_equal_mass_follows_numpy_rounding_of_positions():
    # (N - 1) q is 1.9999999999999996 for N = 4, B = 6, b = 4: numpy's edge falls just below
    # x_2, which moves up a bin; the kernel does exactly what numpy.percentile does
    conf = np.array([0.60679653168861700, 0.6514983856626386, 0.8658336633434207, 0.8857462234246225])
    data = Data(np.zeros(4, dtype=int), np.column_stack([conf, 1 - conf]), np.ones((4, 2)))
    recs = records_of(data, CalibrationConfig(bins=6, binnings=("equal_mass",)))
    bins = find(recs, "ReliabilityDiagram", "equal_mass")["value"]["bins"]
    assert [b["count"] for b in bins] == [1, 1, 0, 0, 1, 1]
    assert [b["upper"] for b in bins] == list(np.percentile(conf, np.linspace(0, 1, 7) * 100)[1:])
