"""Calibration of classification scores: ECE, MCE, multiclass Brier score and reliability
diagrams, as a mergeable per-shard state (pure numpy, no Beam).

API (what the classification plumbing calls)
--------------------------------------------
    config = CalibrationConfig(bins=15, binnings=("equal_width", "equal_mass"),
                               metrics=CALIBRATION_TYPES, bootstrap=None)
    state = match_calibration(gt_value, datum_hash, entry_datum, entry_value, entry_score,
                              n_values, config, weights=None)      # one key, one shard
    state.merge(other)          # add another shard's state of the same key (other untouched)
    state.copy(); state.compact()
    records = calibration_records(state, key, vocabulary, config)

The arguments of match_calibration are those of classification.match_key: gt_value int32[n]
(ground-truth value index of each datum, -1 without one for this key), datum_hash uint64[n]
(schemas.hashing.fnv1a_64 of the datum_uid), prediction entries (entry_datum int64[m],
entry_value int32[m], entry_score float64[m]; at most one entry per (datum, value), any order),
n_values V (the size of the key's global vocabulary). weights uint8[R, n] is
config.bootstrap.weights(datum_hash), drawn here a block of replicates at a time when omitted
(memory that does not grow with R); pass it when it is at hand already. With config.bootstrap None or of 0 replicates nothing about replicates is computed or
kept, and the records carry no internal field.

Population and per-datum quantities (per label key, model and slice)
--------------------------------------------------------------------
The population is the N datums with a ground-truth value for the key (datums with predictions
only are left out: calibration needs a label). For datum d with ground truth g_d:
- top-label confidence c_d: its highest predicted score for the key, 0 without a prediction;
- its top value: the value of that score, ties to the smallest value index (as hardmax);
- correct_d: the top value is g_d and c_d > 0 (a score of 0 is "not predicted", as everywhere
  in evalbeam, so a datum whose scores are all 0 is never correct);
- Brier term b_d = sum_v (s_dv - 1[v == g_d])^2 over the key's vocabulary, s_dv the score of
  value v (0 when absent): the sum of (s - y)^2 over d's entries in value order, plus 1 when g_d
  has no entry.
Scores must be finite and in [0, 1] (the row format already rejects any other): a score outside
raises ValueError rather than being clipped into a bin silently.

Bins (one rule, scikit-learn's calibration_curve, for both diagrams and both binnings)
--------------------------------------------------------------------------------------
Edges e_0 <= ... <= e_B and bin(x) = #{interior edges e_1..e_{B-1} strictly below x}
(numpy.searchsorted(edges[1:-1], x), side "left"): bin 0 is [e_0, e_1], bin b > 0 is
(e_b, e_{b+1}]; a value on an interior edge belongs to the lower bin.
- equal_width: edges = numpy.linspace(0, 1, B + 1), so 0 is in bin 0 and 1 in bin B - 1
  (with B = 10 the edge after 0.3 is 0.30000000000000004, so 0.3 is in bin 2).
- equal_mass: edges are numpy.percentile of the population's values at 100 b / B, b = 0..B,
  with numpy's default linear method (scikit-learn's strategy="quantile"): over the sorted
  values x_0..x_{N-1}, e_b interpolates between x_i and x_{i+1} at position (N - 1) b / B.
  Without ties (and up to float rounding: q and (N-1) q are not exact for every B, e.g.
  N = 4, B = 6 gives position 3 q_4 = 1.9999999999999996, so e_4 falls one ulp below x_2 and
  x_2 moves up to bin 4, in numpy as here; an interpolated edge may also round onto a value),
  bin 0 holds the floor((N-1)/B) + 1 smallest values and bin b > 0 those at sorted positions j
  with b (N-1)/B < j <= (b+1) (N-1)/B: every bin holds (N-1)/B values rounded down or up, bin 0
  one more (N = 23, B = 5: 5, 4, 5, 4, 5). A tie is never split: equal values share one bin,
  so with many ties some bins hold more and others are empty (repeated edges). The edges are computed here with the same
  float operations as numpy 2.x ((N - 1) q, floor, and numpy's two-sided lerp), so they are
  bit-identical to numpy.percentile over the expanded data.
Empty bins are reported (count 0, no mean) and are left out of ECE and MCE.

Metrics (records; value None when N = 0)
----------------------------------------
With n_b datums in bin b, k_b of them correct and S_b the sum of their confidences:
    ECE = sum_b (n_b / N) |k_b / n_b - S_b / n_b| = (1 / N) sum_b |k_b - S_b|
    MCE = max over non-empty bins of |k_b - S_b| / n_b
    BrierScore = (1 / N) sum_d b_d      (the multiclass sum, in [0, 2] when scores sum to 1;
                 scikit-learn's binary brier_score_loss is half of it for two classes whose
                 scores sum to 1, and brier_score_loss(..., scale_by_half=False) equals it)
k_b and n_b are integers and S_b is an exact sum (below), so ECE, MCE and the means are exact
rationals rounded once to float.

Records ({"type", "value", "parameters"}, like classification.key_metrics):
- {"type": "ECE" | "MCE", "value": float | None,
   "parameters": {"label_key": k, "bins": B, "binning": "equal_width" | "equal_mass"}}
- {"type": "BrierScore", "value": float | None, "parameters": {"label_key": k}}
- {"type": "ReliabilityDiagram", "parameters": {"label_key", "bins", "binning"},
   "value": {"bins": [{"lower": e_b, "upper": e_{b+1}, "count": n_b,
                       "confidence": S_b / n_b | None, "accuracy": k_b / n_b | None}, ...]}}
   all B bins in order (equal_mass with N = 0: "bins": []).
- {"type": "ClasswiseReliabilityDiagram",
   "parameters": {"label": {"key": k, "value": v}, "bins": B, "binning": ...},
   "value": like ReliabilityDiagram} per value v of the vocabulary that is some population
   datum's ground truth or has an entry on one: one-vs-rest over the population, p = s_dv,
   y = 1[g_d == v]; "confidence" is the mean p and "accuracy" the fraction with y = 1 in the
   bin. On its non-empty bins it equals sklearn.calibration.calibration_curve(y, p, n_bins=B,
   strategy="uniform" | "quantile") (prob_true = accuracy, prob_pred = confidence).

Mergeable state (exact, so shards, bundling and input order never change a bit)
-------------------------------------------------------------------------------
Counts are int64. A sum of floats is kept exactly as integers: x >= 0 is M * 2^(11 L - 62)
with band L = floor((e + 9) / 11) (frexp exponent e) and an integer M < 2^63 split in three
21-bit parts; per (band, cell) the parts are added in int64 (products with bootstrap weights in
float64 matrix products of at most 2^16 columns, every partial sum an integer below 2^53, so
exact). Distributions needed by equal_mass are ScoreHistograms (kernels.ranking: sorted
distinct values with counts), merged exactly.
Cost of one key's state with B bins, V values, R replicates, and b bands (1-3 in practice):
- equal-width top-label and Brier: (1 + R) * B * (2 + 6 b) int64;
- classwise equal-width: V * B * (2 + 3 b) int64;
- equal_mass top-label: a histogram of the distinct confidences, 28 bytes each;
- classwise equal_mass: a histogram of the distinct (value, score) pairs of the population's
  entries, plus one 0-score row per value, 28 bytes each (as large as classification's ROC AUC
  histogram: leave "equal_mass" out of binnings or ClasswiseReliabilityDiagram out of metrics
  when that is too much);
- with bootstrap and equal_mass ECE/MCE: 17 bytes per population datum (confidence, correct,
  hash): 17 MB for 1M datums, whatever R.

Bootstrap replicates (records get "_replicates" for ECE, MCE and BrierScore)
----------------------------------------------------------------------------
Replicate r weights datum d by w = weights[r, d] (kernels.bootstrap, Poisson(1) keyed by the
datum hash) and its metric is the metric of the dataset where d appears w times, exactly:
- equal_width and Brier: per-bin weighted counts and exact weighted sums, accumulated per
  shard as [R, B] arrays (a gather of the weight columns in bin order and one small matrix
  product per bin; no loop over datums or replicates);
- equal_mass: the bins are recomputed in each replicate as the weighted data's own quantile
  edges (numpy.percentile of the expanded data, as above), so this is exact too. For that the
  state keeps each population datum's (confidence, correct, hash) and the records step draws
  the weights again from the hashes (config.bootstrap.weights), a block of replicates of at
  most bootstrap.REPLICATE_BLOCK_BYTES (256 MiB) at a time, whatever R is, in a loop over the R
  replicates of O(N) work each.
A replicate whose weights are all 0 on the population has no value (None).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from evalbeam.transforms.kernels.bootstrap import (Bootstrap, attach_replicates, record_identity,
                                                   replicate_blocks)
from evalbeam.transforms.kernels.ranking import ScoreHistogram

CALIBRATION_TYPES = ("ECE", "MCE", "BrierScore", "ReliabilityDiagram", "ClasswiseReliabilityDiagram")
BINNINGS = ("equal_width", "equal_mass")
DEFAULT_BINS = 15

# Exact sums: band width in binary exponents, the offset that puts [2^-10, 2) in band 0, the
# band given to zeros (below every real band, so bands grow with the value), and the part width.
_BAND = 11
_BAND_OFFSET = 9
_ZERO_BAND = -98          # the smallest real band is (-1073 + 9) // 11 = -97
_PART = 21
_PART_MASK = (1 << _PART) - 1
_SCALE = 62               # x = M * 2^(11 L - 62)
# Columns per float64 matrix product: 255 * 2^21 * 2^16 < 2^53, so every product is exact.
_CHUNK = 1 << 16


@dataclass(frozen=True)
class CalibrationConfig:
    """bins: B >= 1; binnings: a non-empty subset of BINNINGS; metrics: the record types to
    compute (a subset of CALIBRATION_TYPES); bootstrap: replicates to compute (None: none)."""

    bins: int = DEFAULT_BINS
    binnings: tuple[str, ...] = BINNINGS
    metrics: frozenset[str] = frozenset(CALIBRATION_TYPES)
    bootstrap: Bootstrap | None = None

    def __post_init__(self):
        if int(self.bins) != self.bins or self.bins < 1:
            raise ValueError(f"bins must be a whole number >= 1, not {self.bins!r}")
        object.__setattr__(self, "bins", int(self.bins))
        binnings = tuple(b for b in BINNINGS if b in set(self.binnings))
        if not binnings or set(self.binnings) - set(BINNINGS):
            raise ValueError(f"binnings must be a non-empty subset of {BINNINGS}, not {self.binnings!r}")
        object.__setattr__(self, "binnings", binnings)
        metrics = frozenset(self.metrics)
        if metrics - set(CALIBRATION_TYPES):
            raise ValueError(f"unknown calibration metrics {sorted(metrics - set(CALIBRATION_TYPES))}")
        object.__setattr__(self, "metrics", metrics)

    @property
    def replicates(self) -> int:
        return self.bootstrap.replicates if self.bootstrap is not None else 0

    @property
    def needs_top_histogram(self) -> bool:
        return "equal_mass" in self.binnings and bool(self.metrics & {"ECE", "MCE", "ReliabilityDiagram"})

    @property
    def needs_datums(self) -> bool:
        """Per-datum arrays for the equal_mass replicates."""
        return self.replicates > 0 and "equal_mass" in self.binnings and bool(self.metrics & {"ECE", "MCE"})

    @property
    def needs_classwise(self) -> bool:
        return "ClasswiseReliabilityDiagram" in self.metrics


# ----------------------------------------------------------------------------- exact sums

def split_exact(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(band int64[n], parts int64[n, 3]) with values[i] == (p0 * 2^42 + p1 * 2^21 + p2)
    * 2^(11 band - 62) exactly, each part in [0, 2^21). values: finite, >= 0. Zeros get
    _ZERO_BAND and zero parts, so band is non-decreasing in the value."""
    values = np.asarray(values, dtype=np.float64)
    fraction, exponent = np.frexp(values)
    mantissa = (fraction * float(1 << 53)).astype(np.int64)     # exact: 53 significant bits
    exponent = exponent.astype(np.int64) + _BAND_OFFSET
    band = exponent // _BAND
    big = mantissa << (exponent - _BAND * band)                   # shift 0..10: below 2^63
    band[values == 0] = _ZERO_BAND
    parts = np.stack([big >> (2 * _PART), (big >> _PART) & _PART_MASK, big & _PART_MASK], axis=1)
    return band, parts


def _band_scale(band: int) -> Fraction:
    exponent = _BAND * band - _SCALE
    return Fraction(1 << exponent) if exponent >= 0 else Fraction(1, 1 << -exponent)


def _parts_value(parts) -> int:
    return (int(parts[0]) << (2 * _PART)) + (int(parts[1]) << _PART) + int(parts[2])


@dataclass
class CellSums:
    """Exact weighted sums over C cells for K weightings (K = 1: the point; K = R: replicates).

    ints int64[K, C, J]: sums of weight * integer column j (e.g. 1, correct);
    sums {(q, band): int64[K, C, 3]}: sums of weight * the parts of float column q in that band.
    Merging adds arrays; values are exact Fractions."""

    ints: np.ndarray
    sums: dict = field(default_factory=dict)

    def copy(self) -> "CellSums":
        return CellSums(self.ints.copy(), {k: v.copy() for k, v in self.sums.items()})

    @staticmethod
    def stacked(parts: list["CellSums"]) -> "CellSums":
        """The weightings of parts one after the other (K = the sum of theirs): a sum some
        part lacks (all its weighted sums 0, so cell_sums left it out) is 0 in its rows."""
        keys = sorted({key for part in parts for key in part.sums})
        sums = {}
        for key in keys:
            blocks = []
            for part in parts:
                value = part.sums.get(key)
                blocks.append(value if value is not None else
                              np.zeros(part.ints.shape[:2] + (3,), dtype=np.int64))
            sums[key] = np.concatenate(blocks)
        return CellSums(np.concatenate([part.ints for part in parts]), sums)

    def merge(self, other: "CellSums") -> "CellSums":
        self.ints += other.ints
        for key, value in other.sums.items():
            if key in self.sums:
                self.sums[key] += value
            else:
                self.sums[key] = value.copy()
        return self

    def exact(self, q: int) -> np.ndarray:
        """object[K, C] of Fractions: the exact sum of float column q in each cell."""
        K, C = self.ints.shape[:2]
        total = np.full((K, C), Fraction(0), dtype=object)
        for (column, band), parts in sorted(self.sums.items()):
            if column != q:
                continue
            p = parts.astype(object)
            numerators = (p[..., 0] * (1 << (2 * _PART))) + (p[..., 1] * (1 << _PART)) + p[..., 2]
            total = total + numerators * _band_scale(band)
        return total


def _band_codes(band: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct bands ascending, code int64[n] = position of each band among them), in O(n):
    bands span at most about a hundred values, so a lookup table replaces a sort."""
    low = int(band.min())
    offset = band - low
    present = np.flatnonzero(np.bincount(offset))
    table = np.zeros(present[-1] + 1, dtype=np.int64)
    table[present] = np.arange(present.size)
    return present + low, table[offset]


def cell_sums(cells: np.ndarray, n_cells: int, ints: np.ndarray, floats: np.ndarray,
              weights: np.ndarray | None = None) -> CellSums:
    """CellSums of n items: cells int[n] in [0, n_cells), ints int64[n, J], floats float64[n, Q]
    (finite, >= 0). weights None: K = 1, each item once; weights [R, n] small non-negative
    integers (<= 255): K = R, row r weighting item i by weights[r, i].

    Point: bincounts (float64 sums of integers below 2^53 for up to 2^32 items, exact).
    Replicates: items sorted by (cell, bands), weight columns gathered in that order once, one
    float64 product [R, L] @ [L, J + 3Q] per run of equal keys, L <= 2^16 (exact, see _CHUNK)."""
    cells = np.asarray(cells, dtype=np.int64)
    n = cells.size
    ints = np.asarray(ints, dtype=np.int64)
    floats = np.asarray(floats, dtype=np.float64)
    ints = ints[:, None] if ints.ndim == 1 else ints
    floats = floats[:, None] if floats.ndim == 1 else floats
    J, Q = ints.shape[1], floats.shape[1]
    K = 1 if weights is None else int(weights.shape[0])
    out = CellSums(np.zeros((K, n_cells, J), dtype=np.int64))
    if not n:
        return out
    split = [split_exact(floats[:, q]) for q in range(Q)]
    band_codes = [_band_codes(band) for band, _ in split]
    if weights is None:
        for j in range(J):
            out.ints[0, :, j] = np.rint(np.bincount(cells, weights=ints[:, j], minlength=n_cells))
        for q, ((uniq, code), (_, parts)) in enumerate(zip(band_codes, split)):
            key = code * n_cells + cells
            size = uniq.size * n_cells
            per = np.stack([np.bincount(key, weights=parts[:, i], minlength=size) for i in range(3)],
                           axis=-1).reshape(uniq.size, n_cells, 3)
            for u, band in enumerate(uniq.tolist()):
                if per[u].any():
                    out.sums[(q, band)] = np.rint(per[u]).astype(np.int64)[None]
        return out

    weights = np.asarray(weights)
    if weights.shape != (K, n):
        raise ValueError(f"weights must be [R, {n}], not {weights.shape}")
    # One composite key per item: (cell, band code of each float column).
    key = cells.copy()
    radix = n_cells
    for uniq, code in band_codes:
        key = key + code * radix
        radix *= uniq.size
    order = np.argsort(key, kind="stable")
    key = key[order]
    columns = np.concatenate([ints[order].astype(np.float64)]
                             + [parts[order].astype(np.float64) for _, parts in split], axis=1)
    gathered = weights[:, order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    stops = np.r_[starts[1:], n]
    results = np.zeros((K, starts.size, J + 3 * Q), dtype=np.int64)
    for s, (a, b) in enumerate(zip(starts.tolist(), stops.tolist())):
        for lo in range(a, b, _CHUNK):
            hi = min(b, lo + _CHUNK)
            block = gathered[:, lo:hi].astype(np.float64) @ columns[lo:hi]
            results[:, s] += np.rint(block).astype(np.int64)
    first = order[starts]
    seg_cells = cells[first]
    np.add.at(out.ints, (slice(None), seg_cells), results[:, :, :J])
    for q, ((uniq, code), (band, _)) in enumerate(zip(band_codes, split)):
        seg_bands = band[first]
        for b in np.unique(seg_bands).tolist():
            chosen = np.flatnonzero(seg_bands == b)
            acc = np.zeros((K, n_cells, 3), dtype=np.int64)
            np.add.at(acc, (slice(None), seg_cells[chosen]),
                      results[:, chosen, J + 3 * q: J + 3 * q + 3])
            if acc.any():
                out.sums[(q, b)] = acc
    return out


# ----------------------------------------------------------------------------- bins

def uniform_edges(bins: int) -> np.ndarray:
    """float64[B + 1]: numpy.linspace(0, 1, B + 1), scikit-learn's strategy="uniform"."""
    return np.linspace(0.0, 1.0, bins + 1)


def quantile_edges(values: np.ndarray, cumulative: np.ndarray, bins: int) -> np.ndarray:
    """float64[B + 1]: numpy.percentile(expanded, 100 b / B) for b = 0..B, bit for bit, where
    expanded repeats values[j] (sorted ascending) cumulative[j] - cumulative[j - 1] times
    (cumulative: inclusive running total of the integer weights, last entry > 0).

    As numpy 2.x's "linear" method: q = (linspace(0, 1, B + 1) * 100) / 100 (scikit-learn's
    call), virtual index v = (n - 1) q, i = floor(v), g = v - i, a = x_i, b = x_{i+1} (both the
    last value when v >= n - 1), edge = a + (b - a) g, or b - (b - a)(1 - g) when g >= 0.5."""
    n = int(cumulative[-1])
    q = np.true_divide(np.linspace(0.0, 1.0, bins + 1) * 100, 100)
    virtual = (n - 1) * q
    previous = np.floor(virtual)
    above = virtual >= n - 1
    gamma = virtual - previous
    low = previous.astype(np.int64)
    high = low + 1
    low[above] = n - 1
    high[above] = n - 1
    gamma[above] = 0.0
    a = values[np.searchsorted(cumulative, low, side="right")]
    b = values[np.searchsorted(cumulative, high, side="right")]
    diff = b - a
    edges = a + diff * gamma
    upper = gamma >= 0.5
    edges[upper] = (b - diff * (1 - gamma))[upper]
    return edges


def bin_index(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each value: the number of interior edges strictly below it (scikit-learn)."""
    return np.searchsorted(edges[1:-1], values, side="left")


@dataclass
class BinStats:
    """Per bin: count n_b (int), hits k_b (int: correct datums, or positives) and the exact sum
    S_b (Fraction) of the binned values, with the edges (float64[B + 1])."""

    edges: np.ndarray
    count: list
    hits: list
    total: list

    @property
    def n(self) -> int:
        return int(sum(self.count))

    def ece(self):
        n = self.n
        if not n:
            return None
        return float(sum(abs(k - s) for k, s in zip(self.hits, self.total)) / n)

    def mce(self):
        gaps = [abs(k - s) / c for c, k, s in zip(self.count, self.hits, self.total) if c]
        return float(max(gaps)) if gaps else None

    def diagram(self) -> dict:
        out = []
        for b, (c, k, s) in enumerate(zip(self.count, self.hits, self.total)):
            out.append({"lower": float(self.edges[b]), "upper": float(self.edges[b + 1]),
                        "count": int(c),
                        "confidence": float(s / c) if c else None,
                        "accuracy": int(k) / int(c) if c else None})
        return {"bins": out}


def binned_sorted(values: np.ndarray, columns: np.ndarray, bands: np.ndarray, edges: np.ndarray,
                  weights: np.ndarray | None = None) -> BinStats:
    """BinStats of sorted values with bins given by edges.

    values float64[J] ascending; columns int64[J, 5]: (count, hits, parts of value x count)
    per row, or with weights int64[J] (a replicate's weights) (1, correct, parts) per datum;
    bands int64[J] (split_exact's, non-decreasing). The rows of one bin and band are a
    contiguous run: its sums are one reduceat, or one integer product weights @ columns."""
    B = edges.size - 1
    J = values.size
    interior = np.maximum.accumulate(edges[1:-1]) if B > 1 else edges[1:-1]
    bin_starts = np.searchsorted(values, interior, side="right")
    band_starts = np.flatnonzero(np.r_[True, bands[1:] != bands[:-1]]) if J else np.zeros(0, np.int64)
    bounds = np.unique(np.r_[0, bin_starts, band_starts, J]).astype(np.int64)
    count = [0] * B
    hits = [0] * B
    total = [Fraction(0)] * B
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if b <= a:
            continue
        if weights is None:
            seg = columns[a:b].sum(axis=0)
        else:
            seg = weights[a:b] @ columns[a:b]
        where = int(np.searchsorted(bin_starts, a, side="right"))
        count[where] += int(seg[0])
        hits[where] += int(seg[1])
        total[where] += _parts_value(seg[2:5]) * _band_scale(int(bands[a]))
    return BinStats(edges, count, hits, total)


def _histogram_stats(scores: np.ndarray, pos: np.ndarray, neg: np.ndarray, bins: int,
                     binning: str) -> BinStats | None:
    """BinStats of a histogram segment (distinct scores ascending, pos/neg counts): hits are
    the pos counts. None when the segment is empty (equal_mass has no edges then)."""
    count = pos + neg
    keep = count > 0
    scores, pos, count = scores[keep], pos[keep], count[keep]
    if binning == "equal_width":
        edges = uniform_edges(bins)
    elif not scores.size:
        return None
    else:
        edges = quantile_edges(scores, np.cumsum(count), bins)
    bands, parts = split_exact(scores)
    columns = np.column_stack([count, pos, parts * count[:, None]]).astype(np.int64)
    return binned_sorted(scores, columns, bands, edges)


def _cells_stats(sums: CellSums, row: int, cells: slice, edges: np.ndarray, exact=None) -> BinStats:
    exact = sums.exact(0) if exact is None else exact
    return BinStats(edges, [int(x) for x in sums.ints[row, cells, 0]],
                    [int(x) for x in sums.ints[row, cells, 1]], list(exact[row, cells]))


# ----------------------------------------------------------------------------- state

@dataclass
class CalibrationKeyState:
    """Mergeable calibration state of one label key (V values, B bins, R replicates).

    n int: population size N; n_gt int64[V]: population datums with ground truth v;
    n_entries int64[V]: population entries with value v;
    top: CellSums over the B equal-width bins of the confidence (K = 1), ints (count, correct),
    floats (confidence, Brier term): the equal-width point estimates and the Brier sum;
    top_replicates: the same with K = R (None without bootstrap);
    classwise: CellSums over V * B cells (v * B + equal-width bin of s_dv), ints (count,
    positives), floats (s_dv), absent values counted in bin 0 (None without classwise);
    top_parts: ScoreHistograms of the confidence (value 0, pos = correct, neg = incorrect);
    class_parts: ScoreHistograms (value v, score s_dv, pos = 1[g == v], neg) over the population;
    datum_parts: [(confidence float64, correct bool, hash uint64)] per population datum, for
    the equal_mass replicates."""

    n_values: int
    bins: int
    n: int
    n_gt: np.ndarray
    n_entries: np.ndarray
    top: CellSums
    top_replicates: CellSums | None = None
    classwise: CellSums | None = None
    top_parts: list = field(default_factory=list)
    class_parts: list = field(default_factory=list)
    datum_parts: list = field(default_factory=list)

    def copy(self) -> "CalibrationKeyState":
        """A copy that can be merged into without touching self (histograms and datum arrays
        are never modified in place, so they are shared)."""
        return CalibrationKeyState(
            self.n_values, self.bins, self.n, self.n_gt.copy(), self.n_entries.copy(),
            self.top.copy(), None if self.top_replicates is None else self.top_replicates.copy(),
            None if self.classwise is None else self.classwise.copy(),
            list(self.top_parts), list(self.class_parts), list(self.datum_parts))

    def merge(self, other: "CalibrationKeyState") -> "CalibrationKeyState":
        """Add other into self (same key, vocabulary, bins and config); returns self."""
        if (other.n_values, other.bins) != (self.n_values, self.bins):
            raise ValueError("cannot merge calibration states of different vocabularies or bins")
        self.n += other.n
        self.n_gt += other.n_gt
        self.n_entries += other.n_entries
        self.top.merge(other.top)
        if self.top_replicates is not None and other.top_replicates is not None:
            self.top_replicates.merge(other.top_replicates)
        if self.classwise is not None and other.classwise is not None:
            self.classwise.merge(other.classwise)
        self.top_parts = _merge_lazily(self.top_parts + other.top_parts)
        self.class_parts = _merge_lazily(self.class_parts + other.class_parts)
        self.datum_parts = self.datum_parts + other.datum_parts
        if len(self.datum_parts) > 32:
            self.datum_parts = [_concat_datums(self.datum_parts)]
        return self

    def compact(self) -> "CalibrationKeyState":
        """Merge pending histograms and datum arrays (before the state is shipped or read)."""
        self.top_parts = [h for h in [ScoreHistogram.merge(self.top_parts)] if len(h)]
        self.class_parts = [h for h in [ScoreHistogram.merge(self.class_parts)] if len(h)]
        if len(self.datum_parts) > 1:
            self.datum_parts = [_concat_datums(self.datum_parts)]
        return self


def _merge_lazily(parts: list) -> list:
    # As classification's KeyState: merge pending histograms once they outweigh the largest,
    # so each row is re-sorted O(log #parts) times in all.
    if len(parts) < 2:
        return parts
    sizes = sorted(len(p) for p in parts)
    if sum(sizes[:-1]) >= sizes[-1] or len(parts) > 32:
        merged = ScoreHistogram.merge(parts)
        return [merged] if len(merged) else []
    return parts


def _concat_datums(parts: list) -> tuple:
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def match_calibration(gt_value: np.ndarray, datum_hash: np.ndarray, entry_datum: np.ndarray,
                      entry_value: np.ndarray, entry_score: np.ndarray, n_values: int,
                      config: CalibrationConfig, weights: np.ndarray | None = None
                      ) -> CalibrationKeyState:
    """The calibration state of one label key over one shard (module docstring for the
    arguments). Work: O(m log m) to order the entries by (datum, value), O(n + m) otherwise;
    with R replicates O(R n) more (the weight gather and matrix products)."""
    V, B = int(n_values), config.bins
    gt_value = np.asarray(gt_value, dtype=np.int64)
    datum_hash = np.asarray(datum_hash, dtype=np.uint64)
    entry_datum = np.asarray(entry_datum, dtype=np.int64)
    entry_value = np.asarray(entry_value, dtype=np.int64)
    # + 0.0 turns -0.0 into 0.0, so a tie of the two cannot make a histogram's kept score
    # (and an equal_mass edge) depend on the input order
    entry_score = np.asarray(entry_score, dtype=np.float64) + 0.0
    if entry_score.size and not (np.isfinite(entry_score).all() and entry_score.min() >= 0.0
                                 and entry_score.max() <= 1.0):
        raise ValueError("calibration needs finite scores in [0, 1]")
    R = config.replicates
    if R and weights is not None and weights.shape != (R, gt_value.size):
        raise ValueError(f"weights must be [{R}, {gt_value.size}], not {weights.shape}")

    population = np.flatnonzero(gt_value >= 0)
    N = population.size
    index = np.full(gt_value.size, -1, dtype=np.int64)
    index[population] = np.arange(N)
    gt = gt_value[population]
    keep = index[entry_datum] >= 0
    ed, ev, es = index[entry_datum[keep]], entry_value[keep], entry_score[keep]
    # (datum, value) order: the top value's tie rule and a Brier sum that does not depend on
    # the order of the labels in a row.
    entry_key = ed * max(V, 1) + ev
    if entry_key.size > 1 and not (entry_key[1:] > entry_key[:-1]).all():
        order = np.argsort(entry_key, kind="stable")
        ed, ev, es = ed[order], ev[order], es[order]
    m = ed.size
    match = ev == gt[ed]

    confidence = np.zeros(N)
    correct = np.zeros(N, dtype=bool)
    brier = np.ones(N)
    if m:
        starts = np.flatnonzero(np.r_[True, ed[1:] != ed[:-1]])
        owners = ed[starts]
        top_score = np.maximum.reduceat(es, starts)
        segment = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, m]))
        # first entry at the top score: values are ascending within a datum
        first = np.minimum.reduceat(np.where(es == top_score[segment], np.arange(m), m), starts)
        confidence[owners] = top_score
        correct[owners] = match[first] & (top_score > 0)
        terms = (es - match) ** 2
        matched = np.zeros(N, dtype=bool)
        matched[ed[match]] = True
        brier[owners] = np.add.reduceat(terms, starts)
        brier[owners] += np.where(matched[owners], 0.0, 1.0)

    ew = bin_index(confidence, uniform_edges(B))
    ints = np.column_stack([np.ones(N, dtype=np.int64), correct.astype(np.int64)])
    floats = np.column_stack([confidence, brier])
    state = CalibrationKeyState(
        V, B, N, np.bincount(gt, minlength=V).astype(np.int64),
        np.bincount(ev, minlength=V).astype(np.int64), cell_sums(ew, B, ints, floats))
    if R:
        # a block of replicates at a time (their weights drawn here when not given), so that
        # the weights' copies and products do not grow with R; each replicate's sums are its own
        def block(first, stop):
            w = config.bootstrap.weights(datum_hash, first, stop) if weights is None \
                else weights[first:stop]
            return w if N == gt_value.size else w[:, population]

        # per replicate: the weights, their copies in cell_sums, and one float64 product row
        per_replicate = 3 * gt_value.size + 8 * min(N, _CHUNK) + 8 * 8 * B
        state.top_replicates = CellSums.stacked([
            cell_sums(ew, B, ints, floats, block(first, stop))
            for first, stop in replicate_blocks(R, per_replicate)])
    if config.needs_top_histogram and N:
        state.top_parts = [ScoreHistogram.build(
            np.zeros(N, dtype=np.int32), confidence, correct.astype(np.int64),
            (~correct).astype(np.int64))]
    if config.needs_datums and N:
        state.datum_parts = [(confidence, correct, datum_hash[population])]
    if config.needs_classwise:
        entry_bins = bin_index(es, uniform_edges(B))
        state.classwise = cell_sums(ev * B + entry_bins, V * B,
                                    np.column_stack([np.ones(m, dtype=np.int64), match.astype(np.int64)]),
                                    es[:, None])
        # datums without an entry for v score 0 for it: bin 0
        absent = N - state.n_entries
        absent_pos = state.n_gt - np.bincount(ev[match], minlength=V)
        state.classwise.ints[0, np.arange(V) * B, 0] += absent
        state.classwise.ints[0, np.arange(V) * B, 1] += absent_pos
        if "equal_mass" in config.binnings and N:
            values = np.arange(V, dtype=np.int32)
            rows = np.r_[ev.astype(np.int32), values]
            pos = np.r_[match.astype(np.int64), absent_pos]
            neg = np.r_[(~match).astype(np.int64), absent - absent_pos]
            nonzero = (pos + neg) > 0
            state.class_parts = [ScoreHistogram.build(
                rows[nonzero], np.r_[es, np.zeros(V)][nonzero], pos[nonzero], neg[nonzero])]
    return state


# ----------------------------------------------------------------------------- records

def _top_stats(state: CalibrationKeyState, binning: str, config: CalibrationConfig) -> BinStats | None:
    if binning == "equal_width":
        return _cells_stats(state.top, 0, slice(None), uniform_edges(config.bins))
    hist = ScoreHistogram.merge(state.top_parts)
    if not len(hist):
        return None
    return _histogram_stats(hist.score, hist.pos, hist.neg, config.bins, binning)


def _replicate_values(state: CalibrationKeyState, config: CalibrationConfig) -> dict:
    """{(type, binning): [R values]} of ECE and MCE per binning and {("BrierScore", None): [R]}."""
    R, B = config.replicates, config.bins
    out: dict = {}
    reps = state.top_replicates
    exact = reps.exact(0)
    brier = reps.exact(1).sum(axis=1)
    counts = reps.ints[:, :, 0].sum(axis=1)
    out[("BrierScore", None)] = [float(brier[r] / int(counts[r])) if counts[r] else None
                                 for r in range(R)]
    if "equal_width" in config.binnings:
        edges = uniform_edges(B)
        stats = [_cells_stats(reps, r, slice(None), edges, exact) for r in range(R)]
        out[("ECE", "equal_width")] = [s.ece() for s in stats]
        out[("MCE", "equal_width")] = [s.mce() for s in stats]
    if config.needs_datums:
        ece, mce = [None] * R, [None] * R
        if state.datum_parts:
            confidence, correct, hashes = _concat_datums(state.datum_parts)
            order = np.argsort(confidence, kind="stable")
            values = confidence[order]
            bands, parts = split_exact(values)
            columns = np.column_stack([np.ones(values.size, dtype=np.int64),
                                       correct[order].astype(np.int64), parts])
            hashes = hashes[order]
            # the weights of a block of replicates at a time (one byte per datum and replicate):
            # all R at once would hold R x N bytes, 10 GB for 1 M datums at R = 10,000
            for first, stop in replicate_blocks(R, values.size):
                weights = config.bootstrap.weights(hashes, first, stop)
                for r in range(first, stop):
                    w = weights[r - first].astype(np.int64)
                    cumulative = np.cumsum(w)
                    if not cumulative.size or cumulative[-1] == 0:
                        continue
                    edges = quantile_edges(values, cumulative, B)
                    stats = binned_sorted(values, columns, bands, edges, w)
                    ece[r], mce[r] = stats.ece(), stats.mce()
                del weights
        out[("ECE", "equal_mass")] = ece
        out[("MCE", "equal_mass")] = mce
    return out


def calibration_records(state: CalibrationKeyState, key: str, vocabulary: list[str],
                        config: CalibrationConfig) -> list[dict]:
    """The records of one label key (module docstring), in this order: BrierScore, then per
    binning ECE, MCE, ReliabilityDiagram, then the classwise diagrams by binning and value.
    With replicates, ECE, MCE and BrierScore carry "_replicates" (kernels.bootstrap)."""
    wanted, B = config.metrics, config.bins
    records: list[dict] = []
    N = state.n
    if "BrierScore" in wanted:
        total = state.top.exact(1)[0].sum()
        records.append({"type": "BrierScore", "value": float(total / N) if N else None,
                        "parameters": {"label_key": key}})
    for binning in config.binnings:
        params = {"label_key": key, "bins": B, "binning": binning}
        stats = _top_stats(state, binning, config) if wanted & {"ECE", "MCE", "ReliabilityDiagram"} else None
        if "ECE" in wanted:
            records.append({"type": "ECE", "value": stats.ece() if stats else None, "parameters": params})
        if "MCE" in wanted:
            records.append({"type": "MCE", "value": stats.mce() if stats else None, "parameters": params})
        if "ReliabilityDiagram" in wanted:
            records.append({"type": "ReliabilityDiagram",
                            "value": stats.diagram() if stats else {"bins": []},
                            "parameters": dict(params)})
    if "ClasswiseReliabilityDiagram" in wanted and state.classwise is not None:
        present = np.flatnonzero((state.n_gt > 0) | (state.n_entries > 0)).tolist()
        hist = ScoreHistogram.merge(state.class_parts) if "equal_mass" in config.binnings else None
        exact = state.classwise.exact(0)
        for binning in config.binnings:
            for v in present:
                if binning == "equal_width":
                    stats = _cells_stats(state.classwise, 0, slice(v * B, (v + 1) * B),
                                         uniform_edges(B), exact)
                else:
                    stats = _histogram_stats(*hist.segment(v), B, binning)
                records.append({"type": "ClasswiseReliabilityDiagram",
                                "value": stats.diagram() if stats else {"bins": []},
                                "parameters": {"label": {"key": key, "value": vocabulary[v]},
                                               "bins": B, "binning": binning}})
    if config.replicates and state.top_replicates is not None:
        values = _replicate_values(state, config)
        replicate_lists = [[] for _ in range(config.replicates)]
        for record in records:
            found = values.get((record["type"], record["parameters"].get("binning")))
            if found is None:
                continue
            for r, value in enumerate(found):
                replicate_lists[r].append({"type": record["type"], "parameters": record["parameters"],
                                           "value": value})
        scalar = [rec for rec in records if (rec["type"], rec["parameters"].get("binning")) in values]
        attach_replicates(scalar, replicate_lists,
                          lambda rec: record_identity(rec["type"], rec["parameters"]))
    return records


def state_records(by_key: dict[str, CalibrationKeyState], vocab: dict[str, list[str]],
                  config: CalibrationConfig) -> list[dict]:
    """calibration_records of each label key, keys in sorted order."""
    records = []
    for key in sorted(by_key):
        records.extend(calibration_records(by_key[key], key, vocab[key], config))
    return records
