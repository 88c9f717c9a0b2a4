"""Uncertainty of metrics, pure numpy: Poisson bootstrap weights, intervals, paired tests.

Poisson bootstrap. Replicate r of a dataset gives datum d the integer weight
w(d, r) ~ Poisson(1), drawn by a counter-based generator from (h(d), r, seed) alone, where h is
the stable 64-bit hash of the datum_uid (schemas.hashing.fnv1a_64). A replicate's metric is the
metric of the dataset in which datum d appears w(d, r) times. Because a weight depends on nothing
but (datum, replicate, seed), every runner, worker count, shard count and input order sees the
same weights, and two models evaluated on the same datums share them: the difference of their
replicate values is a paired bootstrap of the difference. For large n, Poisson(1) weights behave
like the multinomial weights of the classical bootstrap (Hanley & MacGibbon 2006; Chamandy et
al. 2012), and they need no count of the datums in advance, so shards draw them independently.

Generator. u = splitmix64(splitmix64(h ^ splitmix64(seed)) + (r + 1) * 0x9E3779B97F4A7C15);
the top 53 bits of u give a uniform U in [0, 1); the weight is the smallest k with
U < P(Poisson(1) <= k). Weights stop at MAX_WEIGHT = 18: P(Poisson(1) > 18) < 1e-17, below the
2^-53 resolution of U, so no reachable U is lost.

Intervals. For a scalar metric with replicate values v_1..v_R (replicates where the metric is
undefined, e.g. ROC AUC without positives, are left out), the percentile interval at confidence
c is numpy.percentile(v, [100 (1 - c) / 2, 100 (1 + c) / 2]) with numpy's default (linear)
interpolation. A proportion k / n over independent datums also gets the Wilson score interval,
which stays inside (0, 1) and does not collapse to a point when k is 0 or n.

Paired comparisons. For model m against baseline b on the same datums, the difference
D = metric_m - metric_b has replicate values D_r = v_m,r - v_b,r (same weights on both sides);
its interval is the percentile interval of D_r, and its two-sided p-value is
min(1, 2 min((1 + #{D_r <= 0}) / (R' + 1), (1 + #{D_r >= 0}) / (R' + 1))), R' the replicates
where both sides are defined (the +1 keeps p above 0 with finitely many replicates). Per-datum
correctness is compared with McNemar's exact test: with b = #datums only m gets right and
c = #datums only the baseline gets right, p = min(1, 2 P(Binomial(b + c, 1/2) <= min(b, c))),
1 when b + c = 0. Benjamini-Hochberg adjusts the p-values of all comparisons of a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

MAX_WEIGHT = 18
# P(Poisson(1) <= k) for k = 0 .. MAX_WEIGHT - 1; a uniform at or above the last bound draws
# MAX_WEIGHT.
_POISSON_CDF = np.cumsum([math.exp(-1.0) / math.factorial(k) for k in range(MAX_WEIGHT)])
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)

# Internal fields a task may put on a metric record for transforms.uncertainty, which turns
# them into "interval" / "wilson" and removes them before anything is written.
REPLICATES = "_replicates"    # [R] replicate values of the record's scalar "value" (None: undefined)
PROPORTION = "_proportion"    # [successes, trials]: the value is a proportion over datums


# uint64 draws held at once by poisson_weights (8 MB)
_DRAW_BLOCK = 1 << 20

# The weight of each value of the top 16 bits of u: every uniform whose top 16 bits are b lies
# in [b 2^-16, (b + 1) 2^-16), and where that interval does not straddle a bound of
# _POISSON_CDF all of them draw the same weight. _AMBIGUOUS marks the (at most MAX_WEIGHT)
# intervals that do; their draws are settled by the CDF itself. Same weights as searching the
# CDF for every draw, in less time.
_TOP_BITS = 16
_AMBIGUOUS = 255


def _top_bits_table() -> np.ndarray:
    shift = 53 - _TOP_BITS
    low = np.arange(1 << _TOP_BITS, dtype=np.uint64) << np.uint64(shift)
    high = low + np.uint64((1 << shift) - 1)
    scale = 1.0 / (1 << 53)
    first = np.searchsorted(_POISSON_CDF, low.astype(np.float64) * scale, side="right")
    last = np.searchsorted(_POISSON_CDF, high.astype(np.float64) * scale, side="right")
    return np.where(first == last, first, _AMBIGUOUS).astype(np.uint8)


_WEIGHT_OF_TOP_BITS = _top_bits_table()

# Memory a replicate loop may hold at once (replicate_blocks): blocks of replicates of at most
# this many bytes of per-replicate arrays keep a step's peak the same whatever R is. Each block
# repeats its step's set-up (detection sorts its rows again), so blocks must stay large enough
# for that to be noise: at this size a step is as fast as with all replicates at once.
REPLICATE_BLOCK_BYTES = 256 << 20


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + _GOLDEN          # a new array: the steps below work in place on it
        shifted = np.empty_like(x)
        for shift, multiplier in ((30, _MIX1), (27, _MIX2)):
            np.right_shift(x, np.uint64(shift), out=shifted)
            x ^= shifted
            x *= multiplier
        np.right_shift(x, np.uint64(31), out=shifted)
        x ^= shifted
        return x


@dataclass(frozen=True)
class Bootstrap:
    """What uncertainty to compute.

    replicates: R, the number of Poisson bootstrap replicates (0: none, no intervals);
    confidence: the intervals' coverage, in (0, 1); seed: the generator's seed (any integer
    in [0, 2^63))."""

    replicates: int = 0
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if int(self.replicates) != self.replicates or self.replicates < 0:
            raise ValueError(f"replicates must be a whole number >= 0, not {self.replicates!r}")
        if not 0.0 < float(self.confidence) < 1.0:
            raise ValueError(f"confidence must be between 0 and 1, not {self.confidence!r}")
        if int(self.seed) != self.seed or not 0 <= self.seed < 2 ** 63:
            raise ValueError(f"seed must be a whole number in [0, 2^63), not {self.seed!r}")

    @property
    def enabled(self) -> bool:
        return self.replicates > 0

    def weights(self, datum_hashes, first: int = 0, stop: int | None = None) -> np.ndarray:
        """uint8[stop - first, n]: the weight of each datum (by its uint64 datum_uid hash) in
        replicates first .. stop - 1 (default: all R). Row i is replicate first + i; the same
        hash gets the same column everywhere, so blocks of rows drawn apart are the rows of the
        whole."""
        stop = self.replicates if stop is None else stop
        if not 0 <= first <= stop <= self.replicates:
            raise ValueError(f"replicates [{first}, {stop}) are not within [0, {self.replicates})")
        return poisson_weights(datum_hashes, stop - first, self.seed, first)


def poisson_weights(datum_hashes, replicates: int, seed: int = 0, first: int = 0) -> np.ndarray:
    """uint8[replicates, n] Poisson(1) weights of the datums with these uint64 hashes in
    replicates first .. first + replicates - 1; see the module docstring for the generator.
    Memory: one byte per (replicate, datum) plus at most _DRAW_BLOCK uint64 values being drawn.
    Replicates are drawn several rows at a time when n is small, so that a shard of a few
    hundred datums does not pay numpy's per-call cost per row."""
    hashes = np.asarray(datum_hashes, dtype=np.uint64).ravel()
    out = np.empty((replicates, hashes.size), dtype=np.uint8)
    if not hashes.size or not replicates:
        return out
    rows = max(1, _DRAW_BLOCK // hashes.size)
    with np.errstate(over="ignore"):
        key = splitmix64(hashes ^ splitmix64(np.uint64(seed)))
        for start in range(0, replicates, rows):
            stop = min(start + rows, replicates)
            counters = np.arange(first + start + 1, first + stop + 1, dtype=np.uint64)[:, None] * _GOLDEN
            out[start:stop] = weights_of_draws(splitmix64(key[None, :] + counters))
    return out


def weights_of_draws(u: np.ndarray) -> np.ndarray:
    """uint8 weights of uint64 draws u: the smallest k with U < P(Poisson(1) <= k), U the top
    53 bits of u over 2^53 (the module docstring), read from the top 16 bits of u where they
    settle it (_WEIGHT_OF_TOP_BITS), else from the CDF."""
    weights = _WEIGHT_OF_TOP_BITS[(u >> np.uint64(64 - _TOP_BITS)).view(np.int64)]
    unsettled = weights == _AMBIGUOUS
    if unsettled.any():
        uniform = (u[unsettled] >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        weights[unsettled] = np.searchsorted(_POISSON_CDF, uniform, side="right")
    return weights


def replicate_blocks(replicates: int, bytes_per_replicate: int,
                     budget: int | None = None) -> list[tuple[int, int]]:
    """[(first, stop), ...]: replicates 0 .. replicates - 1 in consecutive blocks of as many
    replicates as fit budget bytes (default REPLICATE_BLOCK_BYTES) at bytes_per_replicate each
    (at least one per block), for a loop whose arrays grow with the replicates it holds: its
    peak then stays about budget whatever the number of replicates."""
    budget = REPLICATE_BLOCK_BYTES if budget is None else budget
    rows = max(1, int(budget) // max(1, int(bytes_per_replicate)))
    return [(first, min(first + rows, replicates)) for first in range(0, replicates, rows)]


def weighted_sums(weights: np.ndarray, columns: np.ndarray, values: np.ndarray) -> np.ndarray:
    """int64[R, c]: weights[:, columns] @ values (weights uint8[R, n], columns int[m], values
    int64[m, c]), each replicate's exact weighted sums of the rows of values, computed a block of
    replicates at a time (replicate_blocks), so the int64 copy of the gathered weights holds
    one block, not R x m x 8 bytes."""
    values = np.asarray(values, dtype=np.int64)
    out = np.empty((weights.shape[0],) + values.shape[1:], dtype=np.int64)
    for first, stop in replicate_blocks(weights.shape[0], 9 * max(1, len(columns))):
        out[first:stop] = weights[first:stop][:, columns].astype(np.int64) @ values
    return out


def _defined(values) -> np.ndarray:
    v = np.array([np.nan if x is None else float(x) for x in values], dtype=np.float64)
    return v[np.isfinite(v)]


def percentile_interval(values, confidence: float) -> tuple[float | None, float | None, int]:
    """(low, high, R') of replicate values (None/NaN left out; R' values kept): numpy's
    percentiles at 100 (1 - c) / 2 and 100 (1 + c) / 2. (None, None, 0) when none is defined."""
    v = _defined(values)
    if not v.size:
        return None, None, 0
    alpha = 1.0 - confidence
    low, high = np.percentile(v, [50.0 * alpha, 100.0 - 50.0 * alpha])
    return float(low), float(high), int(v.size)


def wilson_interval(successes: int, trials: int, confidence: float) -> tuple[float | None, float | None]:
    """Wilson score interval of successes / trials: with z the normal quantile at (1 + c) / 2
    and p = k / n, centre (p + z^2 / 2n) / (1 + z^2 / n) and half-width
    z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n). (None, None) when trials is 0."""
    if trials <= 0:
        return None, None
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    n, p = float(trials), successes / float(trials)
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2.0 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n)) / denominator
    # At k = 0 (k = n) the bound is exactly 0 (1); rounding would leave it a hair inside.
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= trials else min(1.0, centre + half)
    return low, high


def bootstrap_p_value(differences) -> float | None:
    """Two-sided p-value of a zero difference from the replicate differences (module
    docstring); None when no replicate is defined."""
    d = _defined(differences)
    if not d.size:
        return None
    below = (1.0 + np.count_nonzero(d <= 0.0)) / (d.size + 1.0)
    above = (1.0 + np.count_nonzero(d >= 0.0)) / (d.size + 1.0)
    return float(min(1.0, 2.0 * min(below, above)))


def mcnemar_exact(only_model: int, only_baseline: int) -> float:
    """McNemar's exact two-sided p-value from the discordant counts b (only the model right)
    and c (only the baseline right): min(1, 2 P(Binomial(b + c, 1/2) <= min(b, c))); 1 when
    b + c = 0. Summed in log space, exact to float rounding for any n."""
    n, k = int(only_model) + int(only_baseline), min(int(only_model), int(only_baseline))
    if n == 0:
        return 1.0
    log_terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in range(k + 1)]
    top = max(log_terms)
    log_tail = top + math.log(sum(math.exp(t - top) for t in log_terms)) - n * math.log(2.0)
    return float(min(1.0, 2.0 * math.exp(log_tail)))


def benjamini_hochberg(p_values) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values (the step-up FDR procedure, as statsmodels'
    multipletests(method="fdr_bh")): with the m defined p-values sorted ascending,
    q_(i) = min_{j >= i} min(1, m p_(j) / j). None stays None and does not count in m."""
    p = [None if x is None else float(x) for x in p_values]
    index = [i for i, x in enumerate(p) if x is not None]
    out: list[float | None] = [None] * len(p)
    if not index:
        return out
    values = np.array([p[i] for i in index])
    order = np.argsort(values, kind="stable")
    m = values.size
    scaled = values[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    for rank, position in enumerate(order):
        out[index[position]] = float(adjusted[rank])
    return out


def is_scalar(value) -> bool:
    """True for a metric value that gets an interval: a real number (not a bool)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def attach_replicates(records: list[dict], replicate_records, identity) -> list[dict]:
    """Put REPLICATES on each scalar record of `records` (a state's point records): the values
    of the records with the same identity(record) in each list of replicate_records (the same
    records computed from replicate r's weighted state, in replicate order), None where
    replicate r has no such record or a non-scalar value. Returns records.

    replicate_records may be a generator: it is read once, one replicate's list at a time, so
    only that list is held beside the values gathered so far."""
    scalar = [(record, identity(record)) for record in records if is_scalar(record.get("value"))]
    gathered: list[list] = [[] for _ in scalar]
    for reps in replicate_records:
        found = {identity(rec): rec.get("value") for rec in reps}
        for values, (_, key) in zip(gathered, scalar):
            value = found.get(key)
            values.append(float(value) if is_scalar(value) and math.isfinite(float(value)) else None)
    for (record, _), values in zip(scalar, gathered):
        record[REPLICATES] = values
    return records


def record_identity(record_type: str, parameters: dict) -> str:
    """The text that names one metric record apart from its model and slice: canonical JSON of
    [type, parameters] (sorted keys, no spaces). Records of two models with the same identity
    and slice are compared with each other."""
    import json

    return json.dumps([record_type, parameters], sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)
