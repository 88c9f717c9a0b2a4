"""Float sums that do not depend on the order of addition, for states merged across shards.

A plain float sum rounds after every addition, so shards adding the same values in another order
give a mean that differs in the last bits. ExactSum keeps Shewchuk's non-overlapping partials
(the representation math.fsum uses): their exact sum is the exact sum of every value added, and
value() rounds it once. Adding, merging and copying are O(number of partials), a handful for
values of similar magnitude.
"""

from __future__ import annotations

import math


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
