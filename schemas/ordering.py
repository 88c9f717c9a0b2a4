"""Orders of rows that numpy's general sorts find slowly.

Rows of one datum come together: a classification row's labels, a detection row's boxes. A
stable sort by datum then only has to order the runs, not the rows.
"""

from __future__ import annotations

import numpy as np


def grouped_order(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, kind="stable") for int keys that come in runs of equal values (each
    datum's prediction entries, read from its row, sit together): the runs are sorted instead of
    the entries, O(m) for m entries plus a sort of the runs. A key may appear in several runs;
    its runs then keep their input order, which is what a stable sort of the entries gives.
    Runs shorter than two entries on average do not pay: the plain stable sort is used."""
    m = keys.size
    if m < 2:
        return np.arange(m, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    if starts.size * 2 > m:            # runs too short to pay: the plain stable sort
        return np.argsort(keys, kind="stable")
    lengths = np.diff(np.r_[starts, m])
    runs = np.argsort(keys[starts], kind="stable")
    first, lengths = starts[runs], lengths[runs]
    # the output counts up by one inside a run and jumps to the next run's first index at
    # each run's start: steps summed in place (one array of m, not three)
    out = np.ones(m, dtype=np.int64)
    landing = np.cumsum(lengths) - lengths
    out[landing] = np.r_[first[0], first[1:] - (first[:-1] + lengths[:-1] - 1)]
    return np.cumsum(out, out=out)
