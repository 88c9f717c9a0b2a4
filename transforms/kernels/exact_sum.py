"""Float sums that do not depend on the order of addition, for states merged across shards.

A plain float sum rounds after every addition, so shards adding the same values in another order
give a mean that differs in the last bits. ExactSum keeps Shewchuk's non-overlapping partials
(the representation math.fsum uses): their exact sum is the exact sum of every value added, and
value() rounds it once. Adding, merging and copying are O(number of partials), a handful for
values of similar magnitude.
"""

from __future__ import annotations

import math

import numpy as np


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
    exponent, mantissa, weights = exponent[order], mantissa[order], weights[:, order].astype(np.int64)
    bounds = np.r_[0, np.flatnonzero(np.diff(exponent)) + 1, exponent.size]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        part = weights[:, start:stop]
        high = part @ (mantissa[start:stop] >> 26)
        low = part @ (mantissa[start:stop] & ((1 << 26) - 1))
        e = int(exponent[start])
        for r in range(part.shape[0]):
            total = (int(high[r]) << 26) + int(low[r])
            if total:
                out[r][e] = total
    return out
