"""The shared uncertainty pieces: Poisson weights, intervals, paired tests (kernels/bootstrap.py),
weighted exact sums, and the Uncertainty step (transforms/uncertainty.py) on hand-made records."""

from __future__ import annotations

import json
import math
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest

import evalbeam.transforms.kernels.bootstrap as bootstrap_kernel
from evalbeam.transforms.kernels.bootstrap import (
    _POISSON_CDF, MAX_WEIGHT, PROPORTION, REPLICATES, Bootstrap, attach_replicates,
    benjamini_hochberg, bootstrap_p_value, mcnemar_exact, percentile_interval, poisson_weights,
    record_identity, replicate_blocks, weighted_sums, weights_of_draws, wilson_interval,
)
from evalbeam.transforms.kernels.exact_sum import total_value, weighted_exact_totals, weighted_totals

statsmodels = pytest.importorskip("statsmodels", reason="the paired-test oracles need statsmodels")


# --- weights ------------------------------------------------------------------------------

def test_weights_follow_poisson_one():
    w = poisson_weights(np.arange(200_000, dtype=np.uint64), 20, seed=5)
    assert w.shape == (20, 200_000) and w.dtype == np.uint8
    freq = np.bincount(w.ravel(), minlength=8)[:8] / w.size
    pmf = np.array([math.exp(-1) / math.factorial(k) for k in range(8)])
    # 4M draws: the standard error of each frequency is below 2.5e-4
    assert np.abs(freq - pmf).max() < 1.5e-3
    assert abs(w.mean() - 1.0) < 2e-3 and abs(w.var() - 1.0) < 5e-3
    assert w.max() <= MAX_WEIGHT
    # replicates and datums are uncorrelated
    assert abs(np.corrcoef(w[0].astype(float), w[1].astype(float))[0, 1]) < 0.01


def test_weights_depend_only_on_hash_replicate_and_seed():
    rng = np.random.default_rng(0)
    h = rng.integers(0, 2 ** 63, 5000, dtype=np.int64).astype(np.uint64)
    w = poisson_weights(h, 7, seed=11)
    order = rng.permutation(h.size)
    assert np.array_equal(poisson_weights(h[order], 7, seed=11), w[:, order])
    # shards drawn apart give the columns of the whole
    assert np.array_equal(np.concatenate([poisson_weights(h[:1234], 7, 11),
                                          poisson_weights(h[1234:], 7, 11)], axis=1), w)
    # fewer replicates are a prefix of more
    assert np.array_equal(poisson_weights(h, 3, seed=11), w[:3])
    assert not np.array_equal(poisson_weights(h, 7, seed=12), w)


def _splitmix64(x: int) -> int:
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def _documented_weight(h: int, r: int, seed: int) -> int:
    """The generator as kernels/bootstrap.py's docstring states it, in plain Python integers and
    exact rationals: a change of the generator (which would change every published interval)
    fails here."""
    mask = (1 << 64) - 1
    key = _splitmix64(h ^ _splitmix64(seed))
    u = _splitmix64((key + (r + 1) * 0x9E3779B97F4A7C15) & mask)
    uniform = Fraction(u >> 11, 1 << 53)
    cdf, k = Fraction(0), 0
    while k < MAX_WEIGHT:
        cdf += Fraction(math.exp(-1.0) / math.factorial(k))   # the float pmf, summed exactly
        if uniform < cdf:
            return k
        k += 1
    return MAX_WEIGHT


@pytest.mark.parametrize("seed", [0, 1, 2 ** 62 + 5])
def test_weights_are_the_documented_generator(seed):
    h = [0, 1, 2 ** 64 - 1] + [int(x) for x in np.random.default_rng(seed % 97).integers(
        0, 2 ** 63, 300, dtype=np.int64)]
    w = poisson_weights(np.array(h, dtype=np.uint64), 5, seed)
    expected = [[_documented_weight(x, r, seed) for x in h] for r in range(5)]
    assert w.tolist() == expected


def test_weights_near_every_bound_of_the_cdf_are_the_cdf_search():
    """weights_of_draws reads most weights from a table of the draws' top 16 bits; on both
    sides of every bound of the CDF (and across the 2^-16 intervals holding one), it must give
    what searching the CDF for every draw gives."""
    near = []
    for bound in _POISSON_CDF:
        top = int(bound * (1 << 53))
        near.append(np.arange(max(0, top - 5000), min(1 << 53, top + 5000), dtype=np.uint64))
        start = (top >> 37) << 37        # the whole 2^-16 interval around the bound, sparsely
        near.append(np.arange(start, start + (1 << 37), 1 << 20, dtype=np.uint64))
    top53 = np.concatenate(near + [np.random.default_rng(1).integers(0, 1 << 53, 200_000).astype(np.uint64)])
    for low_bits in (0, 2047):   # the 11 bits below the uniform's 53 do not matter
        u = (top53 << np.uint64(11)) | np.uint64(low_bits)
        searched = np.searchsorted(_POISSON_CDF, top53.astype(np.float64) / (1 << 53), side="right")
        assert np.array_equal(weights_of_draws(u), searched)


def test_blocks_of_replicates_are_the_rows_of_the_whole():
    h = np.random.default_rng(3).integers(0, 2 ** 63, 777, dtype=np.int64).astype(np.uint64)
    bootstrap = Bootstrap(50, seed=9)
    whole = bootstrap.weights(h)
    blocks = replicate_blocks(50, bytes_per_replicate=777, budget=777 * 7)
    assert blocks == [(i, min(i + 7, 50)) for i in range(0, 50, 7)]
    assert np.array_equal(np.concatenate([bootstrap.weights(h, a, b) for a, b in blocks]), whole)
    assert np.array_equal(poisson_weights(h, 5, 9, first=45), whole[45:])
    assert bootstrap.weights(h, 20, 20).shape == (0, 777)
    # at least one replicate per block, whatever it costs; none without replicates
    assert replicate_blocks(3, bytes_per_replicate=10 ** 12) == [(0, 1), (1, 2), (2, 3)]
    assert replicate_blocks(0, 100) == []
    with pytest.raises(ValueError, match="not within"):
        bootstrap.weights(h, 40, 51)


def test_bootstrap_checks_its_arguments():
    with pytest.raises(ValueError):
        Bootstrap(-1)
    with pytest.raises(ValueError):
        Bootstrap(10, confidence=1.0)
    with pytest.raises(ValueError):
        Bootstrap(10, seed=-3)
    assert not Bootstrap().enabled and Bootstrap(5).enabled
    assert Bootstrap(0).weights(np.arange(3, dtype=np.uint64)).shape == (0, 3)


# --- intervals ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_percentile_interval_is_numpy_percentile(seed):
    v = np.random.default_rng(seed).normal(size=101)
    low, high, kept = percentile_interval(list(v) + [None, float("nan")], 0.9)
    assert kept == 101
    assert (low, high) == tuple(np.percentile(v, [5.0, 95.0]))
    assert percentile_interval([None, None], 0.95) == (None, None, 0)


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (3, 10), (1, 1), (0, 1), (517, 1000), (1, 100000)])
@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_wilson_matches_statsmodels(k, n, confidence):
    from statsmodels.stats.proportion import proportion_confint

    low, high = wilson_interval(k, n, confidence)
    ref_low, ref_high = proportion_confint(k, n, alpha=1 - confidence, method="wilson")
    assert low == pytest.approx(ref_low, abs=1e-12) and high == pytest.approx(ref_high, abs=1e-12)
    assert 0.0 <= low <= k / n <= high <= 1.0
    if k in (0, n):
        assert high - low > 0       # does not collapse at 0% or 100%
    assert wilson_interval(0, 0, confidence) == (None, None)


# --- paired tests -------------------------------------------------------------------------

def test_mcnemar_matches_statsmodels():
    from statsmodels.stats.contingency_tables import mcnemar

    rng = np.random.default_rng(3)
    cases = [(0, 0), (0, 1), (5, 5), (0, 30), (7, 15)] + \
        [tuple(int(x) for x in rng.integers(0, 400, 2)) for _ in range(40)]
    for b, c in cases:
        expected = mcnemar([[11, b], [c, 4]], exact=True).pvalue
        assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300), (b, c)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_benjamini_hochberg_matches_statsmodels(seed):
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(seed)
    p = np.round(rng.uniform(size=60) ** 3, 2)      # rounding makes ties
    p[:5] = [0.0, 1.0, 0.01, 0.01, 0.5]
    expected = multipletests(p, method="fdr_bh")[1]
    got = benjamini_hochberg(list(p))
    assert np.allclose(got, expected, rtol=0, atol=1e-15)
    with_none = benjamini_hochberg([None, 0.01, None, 0.04])
    assert with_none[0] is None and with_none[2] is None
    assert with_none[1:4:2] == pytest.approx(list(multipletests([0.01, 0.04], method="fdr_bh")[1]))


def test_bootstrap_p_value_counts_both_tails():
    d = [-1.0, 0.5, 1.0, 2.0, 3.0, None]
    # 1 of 5 at or below 0, 4 at or above: 2 * (1 + 1) / 6
    assert bootstrap_p_value(d) == pytest.approx(2 * 2 / 6)
    assert bootstrap_p_value([0.0] * 9) == 1.0
    assert bootstrap_p_value([1.0] * 99) == pytest.approx(2 / 100)
    assert bootstrap_p_value([None]) is None


# --- coverage -----------------------------------------------------------------------------

def test_bootstrap_interval_covers_a_known_proportion():
    """1,000 independent datasets of 400 datums, each correct with probability 0.8: the 95%
    percentile interval of 400 replicates covers 0.8 in 93.5-96.5% of them (kernel level)."""
    truth, n, datasets, replicates = 0.8, 400, 1000, 400
    rng = np.random.default_rng(20261124)
    covered = wilson_covered = 0
    for i in range(datasets):
        correct = (rng.uniform(size=n) < truth).astype(np.float64)
        hashes = rng.integers(0, 2 ** 63, n, dtype=np.int64).astype(np.uint64)
        w = poisson_weights(hashes, replicates, seed=i).astype(np.float64)
        values = (w @ correct) / w.sum(axis=1)
        low, high, _ = percentile_interval(values, 0.95)
        covered += low <= truth <= high
        w_low, w_high = wilson_interval(int(correct.sum()), n, 0.95)
        wilson_covered += w_low <= truth <= w_high
    assert 0.935 <= covered / datasets <= 0.965, covered
    assert 0.935 <= wilson_covered / datasets <= 0.965, wilson_covered


# --- weighted exact sums -----------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
def test_weighted_exact_totals_are_exact(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=500) * 10.0 ** rng.integers(-8, 8, 500)
    x[:10] = 0.0
    w = poisson_weights(rng.integers(0, 2 ** 63, 500, dtype=np.int64).astype(np.uint64), 4, seed)
    for r, totals in enumerate(weighted_exact_totals(x, w)):
        exact = sum(Fraction(float(a)) * int(b) for a, b in zip(x, w[r]))
        assert total_value(totals) == float(exact)
    with pytest.raises(ValueError):
        weighted_exact_totals(x, w[:, :10])


def test_weighted_sums_in_blocks_of_replicates_are_those_of_all_at_once(monkeypatch):
    """The replicates' weighted sums (exact_sum.weighted_totals, weighted_exact_totals,
    bootstrap.weighted_sums) convert the weights to float64 or int64 a block of replicates at a
    time: 8 bytes per datum and replicate for all R at once was 16 MB here (400 x 5,000) and
    grows with R x datums per shard. Same sums, bit for bit, with blocks of one replicate, and
    a peak below the converted matrix."""
    rng = np.random.default_rng(7)
    n, R = 5000, 400
    weights = poisson_weights(rng.integers(0, 2 ** 63, n, dtype=np.int64).astype(np.uint64), R, 2)
    values = np.c_[rng.random(n), rng.random(n) * 2.0 ** rng.integers(-3, 3, n),
                   -rng.random(n)]                      # the last column: the slow path
    counts = rng.integers(0, 50, (n, 3))
    columns = rng.permutation(n)[: n // 2]

    def sums():
        return (weighted_totals(values, weights), weighted_exact_totals(values[:, 1], weights),
                weighted_sums(weights, columns, counts[columns]).tolist())

    whole = sums()
    assert whole[2] == (weights[:, columns].astype(np.int64) @ counts[columns]).tolist()
    monkeypatch.setattr(bootstrap_kernel, "REPLICATE_BLOCK_BYTES", 1)
    assert sums() == whole
    monkeypatch.setattr(bootstrap_kernel, "REPLICATE_BLOCK_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        weighted_totals(values[:, :2], weights)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * n * R / 2, peak


# --- records ------------------------------------------------------------------------------

def test_attach_replicates_matches_by_identity():
    def ident(r):
        return record_identity(r["type"], r["parameters"])

    point = [{"type": "A", "value": 0.5, "parameters": {"k": 1}},
             {"type": "Curve", "value": [1, 2], "parameters": {}}]
    reps = [[{"type": "A", "value": 0.4, "parameters": {"k": 1}}],
            [{"type": "A", "value": float("nan"), "parameters": {"k": 1}}], []]
    out = attach_replicates(point, reps, ident)
    assert out[0][REPLICATES] == [0.4, None, None]
    assert REPLICATES not in out[1]

    # a generator of the replicates' lists (detection's valor protocol makes them one at a time)
    point = [{"type": "A", "value": 0.5, "parameters": {"k": 1}}]
    assert attach_replicates(point, iter(reps), ident)[0][REPLICATES] == [0.4, None, None]


# --- the Beam step ------------------------------------------------------------------------

def _records():
    """Two models and a baseline over one slice; replicate values chosen by hand."""
    def rec(model, value, reps, proportion=None, t="Accuracy"):
        r = {"type": t, "value": value, "parameters": {"label_key": "k"}, "model": model,
             "slice": {}, REPLICATES: reps}
        if proportion:
            r[PROPORTION] = proportion
        return r

    return [rec("base", 0.5, [0.5, 0.4, 0.6, 0.5], [5, 10]),
            rec("a", 0.7, [0.7, 0.6, 0.9, 0.4], [7, 10]),
            rec("b", 0.5, [0.5, 0.4, 0.6, 0.5], [5, 10]),
            rec("base", 2.0, [1.0, 2.0, 3.0, None], t="Score"),
            rec("a", 1.0, [1.0, 1.0, 1.0, 1.0], t="Score"),
            {"type": "Curve", "value": [0, 1], "parameters": {}, "model": "a", "slice": {}}]


def _presence():
    gt = np.arange(10, dtype=np.uint64)
    return [("{}", ("groundtruths", gt[:6])), ("{}", ("groundtruths", gt[6:])),
            ("{}", ("base", gt)), ("{}", ("a", gt[:8])), ("{}", ("b", gt[2:]))]


def _outcomes():
    ident = record_identity("Accuracy", {"label_key": "k"})
    gt = np.arange(10, dtype=np.uint64)
    base = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0], bool)
    a = np.array([1, 1, 1, 1, 1, 1, 1, 0, 0, 0], bool)
    return [((ident, "{}"), ("base", gt[::-1], base[::-1])),
            ((ident, "{}"), ("a", gt[:5], a[:5])), ((ident, "{}"), ("a", gt[5:], a[5:]))]


def _run_uncertainty(folder, records, presence, outcomes, options=()):
    """The Uncertainty step on the given elements; its output records as sorted JSON texts."""
    import glob
    import os

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from evalbeam.transforms.uncertainty import Uncertainty

    prefix = os.path.join(str(folder), f"out{len(os.listdir(folder))}")
    with beam.Pipeline(options=PipelineOptions(list(options))) as p:
        _ = (Uncertainty.inputs(p | "R" >> beam.Create(records), p | "P" >> beam.Create(presence),
                                p | "O" >> beam.Create(outcomes))
             | Uncertainty(Bootstrap(4, 0.5, 0), "datum", "base")
             | beam.Map(json.dumps, sort_keys=True)
             | beam.io.WriteToText(prefix))
    lines = []
    for path in glob.glob(prefix + "*"):
        with open(path, encoding="utf-8") as f:
            lines += f.read().splitlines()
    return sorted(lines)


def test_uncertainty_step_attaches_intervals_and_compares(tmp_path):
    got = [json.loads(x) for x in _run_uncertainty(tmp_path, _records(), _presence(), _outcomes())]
    assert all(REPLICATES not in r and PROPORTION not in r for r in got)
    by = {(r["type"], r["model"], r["parameters"].get("metric")): r for r in got}
    acc = by[("Accuracy", "a", None)]
    assert acc["interval"]["low"] == np.percentile([0.7, 0.6, 0.9, 0.4], 25)
    assert acc["interval"]["high"] == np.percentile([0.7, 0.6, 0.9, 0.4], 75)
    assert acc["interval"]["replicates"] == 4 and acc["interval"]["unit"] == "datum"
    assert acc["wilson"]["successes"] == 7 and acc["wilson"]["trials"] == 10
    assert "interval" not in by[("Curve", "a", None)]

    c = by[("Comparison", "a", "Accuracy")]
    assert c["value"] == pytest.approx(0.2)
    diffs = [0.2, 0.2, 0.3, -0.1]
    assert c["interval"]["low"] == pytest.approx(np.percentile(diffs, 25))
    cmp = c["comparison"]
    # accuracy has per-datum outcomes: McNemar on 10 shared datums, a right twice where base is not
    assert cmp["test"] == "McNemar exact"
    assert cmp["discordant"] == {"model_only": 2, "baseline_only": 0, "datums": 10}
    assert cmp["p_value"] == pytest.approx(0.5)
    assert (cmp["datums"], cmp["datums_both"], cmp["model_lacks"], cmp["baseline_lacks"]) == (10, 8, 2, 0)

    s = by[("Comparison", "a", "Score")]
    assert s["value"] == -1.0 and s["comparison"]["test"] == "paired bootstrap"
    assert s["interval"]["replicates"] == 3           # replicate 4 of the baseline is undefined
    assert s["comparison"]["p_value"] == pytest.approx(bootstrap_p_value([0.0, -1.0, -2.0]))

    b = by[("Comparison", "b", "Accuracy")]
    assert b["value"] == 0.0 and b["comparison"]["model_lacks"] == 2
    assert "discordant" not in b["comparison"]        # no outcomes for b: bootstrap p-value
    comparisons = [r for r in got if r["type"] == "Comparison"]
    assert len(comparisons) == 3
    adjusted = benjamini_hochberg([r["comparison"]["p_value"] for r in sorted(
        comparisons, key=lambda r: (r["model"], json.dumps(r["parameters"], sort_keys=True)))])
    assert sorted(r["comparison"]["p_value_adjusted"] for r in comparisons) == sorted(adjusted)


def test_uncertainty_step_ignores_arrival_order(tmp_path):
    first = _run_uncertainty(tmp_path, _records(), _presence(), _outcomes())
    second = _run_uncertainty(tmp_path, _records()[::-1], _presence()[::-1], _outcomes()[::-1])
    assert first == second


@pytest.mark.multiprocess
def test_uncertainty_step_on_the_multi_process_runner(tmp_path):
    from helpers import MULTIPROCESS

    assert _run_uncertainty(tmp_path, _records(), _presence(), _outcomes(), MULTIPROCESS) == \
        _run_uncertainty(tmp_path, _records(), _presence(), _outcomes())


def test_without_bootstrap_the_records_are_only_cleaned():
    from evalbeam.transforms.uncertainty import finish_record

    record = _records()[0]
    assert finish_record(record, Bootstrap(0), "datum") == {
        k: v for k, v in record.items() if k not in (REPLICATES, PROPORTION)}


def test_records_with_object_values_get_one_interval_and_comparison_per_field(tmp_path):
    def rec(model, value, reps, proportion):
        return {"type": "TextMatching", "value": value, "parameters": {}, "model": model,
                "slice": {"lang": "en"}, REPLICATES: reps, PROPORTION: proportion}

    records = [rec("base", {"pass": 0.5, "fail": 0.5, "datums": 4},
                   {"pass": [0.5, 0.25, 0.75, 0.5], "fail": [0.5, 0.75, 0.25, 0.5]},
                   {"pass": [2, 4], "fail": [2, 4]}),
               rec("a", {"pass": 1.0, "fail": 0.0, "datums": 4},
                   {"pass": [1.0, 1.0, 1.0, 1.0], "fail": [0.0, 0.0, 0.0, 0.0]},
                   {"pass": [4, 4], "fail": [0, 4]})]
    got = [json.loads(x) for x in _run_uncertainty(tmp_path, records, [], [])]
    a = next(r for r in got if r["type"] == "TextMatching" and r["model"] == "a")
    assert set(a["interval"]) == {"pass", "fail"} and a["interval"]["pass"]["low"] == 1.0
    assert a["wilson"]["fail"]["successes"] == 0 and a["wilson"]["fail"]["high"] > 0
    comparisons = {r["parameters"]["metric_parameters"]["field"]: r for r in got if r["type"] == "Comparison"}
    assert set(comparisons) == {"pass", "fail"}
    assert comparisons["pass"]["value"] == 0.5
    assert comparisons["pass"]["interval"]["low"] == np.percentile([0.5, 0.75, 0.25, 0.5], 25)
    assert comparisons["fail"]["comparison"]["p_value"] == bootstrap_p_value([-0.5, -0.75, -0.25, -0.5])


def test_comparisons_come_last_in_the_order_of_their_records():
    from evalbeam.transforms.retrieval import record_sort_key
    from evalbeam.transforms.uncertainty import with_comparisons_last

    def comparison(k, slice_value, field=None):
        params = {"k": k} if field is None else {"k": k, "field": field}
        return {"type": "Comparison", "value": 0.0, "model": "b", "slice": slice_value,
                "parameters": {"metric": "DCG", "metric_parameters": params, "baseline": "a"}}

    records = [comparison(1000, {}), comparison(10, {"kind": "x"}), comparison(100, {}),
               comparison(10, {}), {"type": "DCG", "value": 1.0, "parameters": {"k": 10},
                                    "model": "b", "slice": {}}]
    ordered = sorted(records, key=with_comparisons_last(record_sort_key))
    assert ordered[0]["type"] == "DCG"
    assert [(r["parameters"]["metric_parameters"]["k"], r["slice"]) for r in ordered[1:]] == \
        [(10, {}), (100, {}), (1000, {}), (10, {"kind": "x"})]


@pytest.mark.parametrize("task, args", [
    ("classification", ["--groundtruths", "classification/groundtruths.jsonl",
                        "--predictions", "a=classification/model_a.jsonl",
                        "--predictions", "b=classification/model_b.jsonl",
                        "--max_rejected_fraction", "0.1"]),
    ("retrieval", ["--groundtruths", "retrieval/qrels.jsonl", "--predictions", "a=retrieval/run_a.jsonl",
                   "--predictions", "b=retrieval/run_b.jsonl", "--max_rejected_fraction", "0.1"]),
])
def test_the_printed_summary_shows_intervals_and_comparisons(tmp_path, task, args):
    """Not --quiet: the task's table ignores the Comparison records, and a table of the
    comparisons follows (this once failed after the outputs were published)."""
    from helpers import ROOT, run_cli_subprocess

    inputs = ROOT / "tests" / "golden" / "inputs"
    args = [str(inputs / a) if a.endswith(".jsonl") and "=" not in a else
            (a.split("=")[0] + "=" + str(inputs / a.split("=")[1]) if a.endswith(".jsonl") else a)
            for a in args]
    done = run_cli_subprocess([task, *args, "--output", tmp_path / "out", "--bootstrap", "50",
                               "--compare_to", "a"])
    assert done.returncode == 0, done.stderr
    assert "Intervals: every scalar metric in metrics.jsonl has an \"interval\" (95%, 50" in done.stdout
    assert "Comparisons with a: " in done.stdout and "adjusted p" in done.stdout
    records = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl", encoding="utf-8")]
    kinds = [r["type"] == "Comparison" for r in records]
    assert any(kinds) and kinds == sorted(kinds)        # the comparisons come last
    assert all(r["model"] == "b" for r in records if r["type"] == "Comparison")
