"""Float sums that do not depend on the order of addition, for states merged across shards.

A plain float sum rounds after every addition, so shards adding the same values in another order
give a mean that differs in the last bits. ExactSum keeps Shewchuk's non-overlapping partials
(the representation math.fsum uses): their exact sum is the exact sum of every value added, and
value() rounds it once. Adding, merging and copying are O(number of partials), a handful for
values of similar magnitude.

For bootstrap replicates (kernels.bootstrap): weighted_exact_totals sums one column of values
under R rows of integer weights exactly; weighted_totals does many columns at once with one
BLAS product (retrieval's measures, text's judge and overlap means).
"""

from __future__ import annotations

import math

import numpy as np

from evalbeam.transforms.kernels.bootstrap import replicate_blocks


class ExactSum:
    __slots__ = ("partials", "n")

    def __init__(self, partials: list | None = None, n: int = 0):
        self.partials = list(partials or [])
        self.n = n

    def add(self, x: float) -> "ExactSum":
        """Add x (finite); the partials stay non-overlapping and sum exactly to the total."""
        partials = self.partials
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]
        self.n += 1
        return self

    def merge(self, other: "ExactSum") -> "ExactSum":
        n = self.n + other.n
        for x in other.partials:
            self.add(x)
        self.n = n
        return self

    def copy(self) -> "ExactSum":
        return ExactSum(self.partials, self.n)

    def value(self) -> float:
        """The exact sum, rounded once."""
        return math.fsum(self.partials)

    def mean(self) -> float:
        """value() / n (0 when nothing was added)."""
        return self.value() / self.n if self.n else 0.0


def exact_totals(values: np.ndarray) -> dict[int, int]:
    """{e: S} with sum(values) == sum(S * 2**e) exactly, vectorised: each finite double is
    m * 2**e with an integer m of at most 53 bits (np.frexp), and the m of one exponent are added
    as two int64 halves of 27 and 26 bits (exact for up to 2**36 values)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    values = values[values != 0]
    if not values.size:
        return {}
    if not np.isfinite(values).all():
        raise ValueError("exact sums need finite values")
    fraction, exponent = np.frexp(values)
    mantissa = (fraction * float(1 << 53)).astype(np.int64)   # exact: 53 significant bits
    exponent = exponent.astype(np.int64) - 53
    order = np.argsort(exponent, kind="stable")
    exponent, mantissa = exponent[order], mantissa[order]
    starts = np.r_[0, np.flatnonzero(np.diff(exponent)) + 1]
    high = np.add.reduceat(mantissa >> 26, starts)
    low = np.add.reduceat(mantissa & ((1 << 26) - 1), starts)
    return {int(e): (int(h) << 26) + int(lo) for e, h, lo in zip(exponent[starts], high, low)}


def merge_totals(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    out = dict(a)
    for e, s in b.items():
        out[e] = out.get(e, 0) + s
    return out


def total_value(totals: dict[int, int]) -> float:
    """The exact sum of exact_totals' terms, rounded once (float of an exact Fraction)."""
    if not totals:
        return 0.0
    from fractions import Fraction

    low = min(totals)
    scaled = sum(s << (e - low) for e, s in totals.items())
    return float(Fraction(scaled) * Fraction(2) ** low)


def weighted_exact_totals(values: np.ndarray, weights: np.ndarray) -> list[dict[int, int]]:
    """[{e: S} for each row r of weights]: the exact_totals of sum_i weights[r, i] * values[i],
    for the integer weights of bootstrap replicates (kernels.bootstrap).

    values: float64[n], finite; weights: non-negative integers [R, n] (at most 255 each, as
    Bootstrap.weights gives). Each value is m * 2**e as in exact_totals; per exponent, the 27-
    and 26-bit halves of m are multiplied by the weights and summed in int64 (exact for
    n <= 2**27 values per call), so every replicate's sum is exact and order-free."""
    values = np.asarray(values, dtype=np.float64).ravel()
    weights = np.asarray(weights)
    if weights.ndim != 2 or weights.shape[1] != values.size:
        raise ValueError(f"weights must be [R, {values.size}], not {weights.shape}")
    if values.size > 1 << 27:
        raise ValueError("weighted_exact_totals sums at most 2**27 values per call")
    out: list[dict[int, int]] = [{} for _ in range(weights.shape[0])]
    keep = values != 0
    values, weights = values[keep], weights[:, keep]
    if not values.size:
        return out
    if not np.isfinite(values).all():
        raise ValueError("exact sums need finite values")
    fraction, exponent = np.frexp(values)
    mantissa = (fraction * float(1 << 53)).astype(np.int64)
    exponent = exponent.astype(np.int64) - 53
    order = np.argsort(exponent, kind="stable")
    exponent, mantissa = exponent[order], mantissa[order]
    bounds = np.r_[0, np.flatnonzero(np.diff(exponent)) + 1, exponent.size]
    # the int64 weights of a block of replicates at a time (8 bytes per value and replicate)
    for first, last in replicate_blocks(weights.shape[0], 9 * values.size):
        block = weights[first:last][:, order].astype(np.int64)
        for start, stop in zip(bounds[:-1], bounds[1:]):
            part = block[:, start:stop]
            high = part @ (mantissa[start:stop] >> 26)
            low = part @ (mantissa[start:stop] & ((1 << 26) - 1))
            e = int(exponent[start])
            for r in range(part.shape[0]):
                total = (int(high[r]) << 26) + int(low[r])
                if total:
                    out[first + r][e] = total
    return out


# Replicate sums: weights are at most MAX_WEIGHT (< 2^5), so a product of a weight and an integer
# below 2^B is below 2^(B + 5), and n of them add up below 2^(B + 5 + bits(n)): exact in float64
# as long as that stays within 53 bits.
_WEIGHT_BITS = 5
_MAX_PIECES = 6


def _one_blas_thread():
    """A context in which BLAS runs on one thread, when threadpoolctl is installed (it comes
    with scikit-learn); else one that changes nothing. Beam already runs a DoFn per core, and
    BLAS threads on top of that oversubscribe the cores: the product of weighted_totals is
    several times slower with OpenBLAS's threads than on one."""
    import contextlib

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def weighted_totals(values: np.ndarray, weights: np.ndarray) -> list[list[dict[int, int]]]:
    """Exact per-replicate weighted sums of several measures at once.

    values: float64[n, M] (the per-query values of M measures, finite); weights: float64 or
    integer [R, n], non-negative integers of at most MAX_WEIGHT (kernels.bootstrap.Bootstrap
    .weights). Returns, per measure j, [{e: S} for each replicate r] with sum_i weights[r, i] *
    values[i, j] == sum S * 2**e exactly (exact_sum.total_value reads it), like
    weighted_exact_totals (one column), and equal to it after total_value.

    How. Column j's non-zero values are m * 2**e (frexp, m < 2^53); with e0 the column's
    smallest e, each is the integer m << (e - e0) times 2**e0, cut into pieces of B bits (B = 48
    - bits(n)); the pieces of every column form one float64 [n, P] matrix, and one BLAS product
    weights @ pieces gives every replicate's piece sums at once. Each sum is an integer below
    2^53, so the product is exact whatever order BLAS adds in, and the result is the same for
    any split of the queries into shards. A column of negative values, or whose exponents span
    too much to be cut in at most _MAX_PIECES pieces, goes through weighted_exact_totals (the
    same result, slower). Cost: one [R, n] x [n, P] product, P about 2 M for per-datum
    values (a 53-bit mantissa and a span of a few binades fit in two pieces), on one BLAS
    thread."""
    values = np.asarray(values, dtype=np.float64)
    n, n_measures = values.shape
    replicates = weights.shape[0]
    out: list[list[dict[int, int]]] = [[{} for _ in range(replicates)] for _ in range(n_measures)]
    if not n or not replicates:
        return out
    if not np.isfinite(values).all():
        raise ValueError("exact sums need finite values")
    bits = 53 - _WEIGHT_BITS - int(n).bit_length()
    columns, plan, slow = [], [], []
    fraction, exponent = np.frexp(values)
    mantissa = (fraction * float(1 << 53)).astype(np.int64)   # exact: 53 significant bits
    exponent = exponent.astype(np.int64) - 53
    for j in range(n_measures):
        nonzero = mantissa[:, j] != 0
        if not nonzero.any():
            continue
        m, e = mantissa[:, j], exponent[:, j]
        if bits < 8 or (m < 0).any():
            slow.append(j)
            continue
        low = int(e[nonzero].min())
        shift = np.where(nonzero, e - low, 0)
        width = 53 + int(shift.max())
        pieces = -(-width // bits)
        if pieces > _MAX_PIECES:
            slow.append(j)
            continue
        m = m.astype(np.uint64)
        mask = np.uint64((1 << bits) - 1)
        for k in range(pieces):
            # piece k holds bits [k B, (k + 1) B) of m << shift; offset = k B - shift
            offset = k * bits - shift
            piece = np.zeros(n, dtype=np.uint64)
            right = offset >= 0           # m's bits from `offset` on (none past bit 52)
            piece[right] = (m[right] >> np.minimum(offset[right], 63).astype(np.uint64)) & mask
            left = ~right & (-offset < bits)   # m's low B - |offset| bits, moved up |offset|
            up = (-offset[left]).astype(np.uint64)
            piece[left] = (m[left] & ((np.uint64(1) << (np.uint64(bits) - up)) - np.uint64(1))) << up
            columns.append(piece.astype(np.float64))
        plan.append((j, low, pieces))
    if columns:
        pieces = np.stack(columns, axis=1)
        sums = []
        # float64 weights of a block of replicates at a time (8 bytes per query and replicate
        # for all R at once); each product row is one replicate's exact sums, whatever the block
        with _one_blas_thread():
            for first, stop in replicate_blocks(replicates, 8 * (n + pieces.shape[1])):
                block = np.asarray(weights[first:stop], dtype=np.float64) @ pieces
                sums.extend(block.astype(np.int64).tolist())
        at = 0
        for j, low, pieces in plan:
            for r in range(replicates):
                row = sums[r]
                total = 0
                for k in range(pieces):
                    total += row[at + k] << (k * bits)
                if total:
                    out[j][r] = {low: total}
            at += pieces
    for j in slow:
        out[j] = weighted_exact_totals(values[:, j], np.asarray(weights))
    return out
