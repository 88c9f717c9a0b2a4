"""Retrieval measures per query, trec_eval compatible, vectorised over all queries at once.

Inputs are integer codes (see encode_ids): qrels rows (query, doc, relevance level) and run rows
(query, doc, score), each (query, doc) pair at most once per input (the pipeline rejects every
copy of a repeated pair in the shard, where all rows of a query meet: transforms/retrieval.py).
evaluate() returns, per evaluated query, one float64 value per measure, so a pipeline that
shards by query can concatenate shards' rows and average them (or add them up, for the counts
in SUMMED) exactly like trec_eval's `all` line.

Conventions (trec_eval 9, `trec_eval -q [-c] [-l L] [-M N]`):
- Ranking. The rank column of a run is ignored. A query's documents are ordered by score
  descending, ties broken by doc id in DESCENDING byte-wise order (trec_eval's qsort comparator),
  which is why doc codes must sort like the ids. Then only the first `max_docs_per_query` (1000 by
  default, None for no cut) are kept; the cut happens after the tie break.
  Note: trec_eval 9 itself does not cut unless given -M; 1000 is the TREC convention.
- Relevance. Relevant means level >= relevance_level L (trec_eval -l, default 1). A judged doc
  with 0 <= level < L is judged non-relevant; a judged doc with a negative level is, as in
  trec_eval, "in the pool but unjudged": non-relevant for every measure, and not counted as
  judged non-relevant by bpref and num_nonrel_judged_ret. A retrieved doc absent from the qrels is
  non-relevant and unjudged.
- Gains (dcg_cut, ndcg, ndcg_cut, ndcg_rel) are the relevance levels themselves, whatever L:
  gain = level when level > 0, else 0 (negative and unjudged docs gain nothing). With -l2 a doc
  of level 1 is non-relevant for P or map but still gains 1 in nDCG; this is trec_eval's rule.
  Discount of rank r (1-based): 1 / log2(r + 1).
- Queries. Only queries present in the qrels are evaluated; run queries absent from the qrels are
  dropped. By default a qrels query absent from the run is not evaluated either; with
  complete=True (trec_eval -c) it is evaluated as an empty ranking: every measure is 0 except
  num_rel, and it counts in averages. A qrels query without any relevant document is evaluated
  normally (its recall, map, ... are 0; its nDCG can be > 0 when levels below L exist).

Measures, for one query with ranked docs d_1..d_n (n = num_ret after the cut), rel_i = 1 when
d_i is relevant, R = num_rel (relevant docs in the qrels), N = judged non-relevant docs in the
qrels, relret(k) = sum_{i <= min(k, n)} rel_i, g_i = gain of d_i, and IDCG@k the DCG of the
query's judged gains sorted descending, cut at k (no cut for IDCG):
    num_ret = n; num_rel = R; num_rel_ret = relret(n);
    num_nonrel_judged_ret = #{i: 0 <= level(d_i) < L}
    P_k = relret(k) / k                          (k counts even when n < k)
    recall_k = relret(k) / R                     (0 when R = 0)
    F1_k = 2 P_k recall_k / (P_k + recall_k)     (0 when both are 0; not in trec_eval)
    success_k = 1 if relret(k) > 0 else 0        (Hit@k)
    recip_rank = 1 / min{i: rel_i = 1}           (0 when nothing relevant is retrieved)
    map = sum_{i: rel_i} (relret(i) / i) / R     (0 when R = 0)
    map_cut_k = sum_{i <= k, rel_i} (relret(i) / i) / R
    Rprec = relret(R) / R                        (0 when R = 0)
    dcg_cut_k = sum_{i <= k} g_i / log2(i + 1)   (not in trec_eval)
    ndcg_cut_k = dcg_cut_k / IDCG@k              (0 when IDCG@k = 0)
    ndcg = dcg_cut_n / IDCG                      (every judged gain in the ideal, even past n)
    bpref = (1 / R) sum_{i: rel_i} (1 - min(nb_i, R) / min(N, R)), the term being 1 when
            nb_i = 0, where nb_i = judged non-relevant docs ranked above d_i
    iprec_at_recall_p: with K = round_half_up(p R) (see RetrievalConfig.iprec_rounding),
            0 when K > relret(n), else
            max_{j >= max(K, 1)} j / rank of the j-th relevant retrieved doc
            (the interpolated precision, 0 when nothing relevant is retrieved)
    ndcg_rel = (1 / P) [sum_{i: g_i > 0} DCG@i / IDCG@min(i, P) + (P - Pret) DCG@n / IDCG],
            0 when that sum is 0, where P = judged docs with a positive gain and Pret those
            retrieved (trec_eval's nDCG averaged over the positive-gain docs).

Shapes and cost: evaluate() takes m qrels rows and n run rows and returns Q per-query values per
measure. It sorts the run once (often only by query: runs are usually written in rank order),
joins it to the qrels with one binary search per row, then touches only the relevant, judged
and positive-gain rows; there is no Python loop over queries. encode_ids adds one argsort of
the doc ids' 8-byte words.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalbeam.schemas.retrieval_rows import (MAX_ID_WORDS, as_strings, iter_string_words,
                                             string_chunks, string_layout, string_lengths)
from evalbeam.transforms.kernels.exact_sum import (exact_totals, merge_totals, total_value,
                                                   weighted_totals)

DEFAULT_KS = (1, 3, 5, 10, 20, 100, 1000)
DEFAULT_RECALL_POINTS = tuple(round(0.1 * i, 1) for i in range(11))
# Counts: their `all` value is the sum over queries, every other measure's is the mean.
SUMMED = frozenset({"num_ret", "num_rel", "num_rel_ret", "num_nonrel_judged_ret"})
# Level of a retrieved document that the qrels do not mention. Below any relevance level and any
# judged level, so it is neither relevant, nor judged, nor a gain.
NOT_JUDGED = np.iinfo(np.int64).min


@dataclass(frozen=True)
class RetrievalConfig:
    """ks: rank cutoffs of P, recall, F1, success, map_cut, dcg_cut and ndcg_cut (positive ints).
    relevance_level: L, the smallest relevant level (>= 0). max_docs_per_query: the cut after
    ranking, None for none. recall_points: recall levels of iprec_at_recall, in [0, 1].
    iprec_rounding: how iprec_at_recall turns the recall level p into a number of relevant docs
    K: "nearest" rounds p R half up (trec_eval 9.0.8 and later, and the reference outputs);
    "legacy" truncates p R + 0.9 (older trec_eval, and the one inside pytrec_eval 0.5).
    complete, per_query: the command's --complete and --per_query."""

    ks: tuple[int, ...] = DEFAULT_KS
    relevance_level: int = 1
    max_docs_per_query: int | None = 1000
    recall_points: tuple[float, ...] = DEFAULT_RECALL_POINTS
    iprec_rounding: str = "nearest"
    # complete: average over every query of the qrels, a query missing from a run scoring 0
    # (trec_eval -c); per_query: also write per_query.jsonl
    complete: bool = False
    per_query: bool = False

    def __post_init__(self):
        if self.iprec_rounding not in ("nearest", "legacy"):
            raise ValueError("iprec_rounding must be 'nearest' or 'legacy'")
        ks = tuple(sorted({int(k) for k in self.ks}))
        if any(k < 1 for k in ks):
            raise ValueError(f"rank cutoffs must be positive integers, got {self.ks}")
        object.__setattr__(self, "ks", ks)
        points = tuple(sorted({float(p) for p in self.recall_points}))
        if any(not 0.0 <= p <= 1.0 for p in points):
            raise ValueError(f"recall points must be in [0, 1], got {self.recall_points}")
        object.__setattr__(self, "recall_points", points)
        if int(self.relevance_level) < 0:
            raise ValueError("relevance_level must be >= 0")
        object.__setattr__(self, "relevance_level", int(self.relevance_level))
        if self.max_docs_per_query is not None and int(self.max_docs_per_query) < 1:
            raise ValueError("max_docs_per_query must be positive (or None)")


def measure_names(config: RetrievalConfig = RetrievalConfig()) -> list[str]:
    """Names of evaluate()'s measures, trec_eval's where trec_eval has the measure."""
    names = ["num_ret", "num_rel", "num_rel_ret", "num_nonrel_judged_ret", "map", "Rprec", "bpref",
             "recip_rank", "ndcg", "ndcg_rel"]
    for family in ("P", "recall", "F1", "success", "map_cut", "dcg_cut", "ndcg_cut"):
        names += [f"{family}_{k}" for k in config.ks]
    names += [f"iprec_at_recall_{p:.2f}" for p in config.recall_points]
    return names


# ---------------------------------------------------------------------------------------------
# Id encoding

@dataclass
class EncodedIds:
    """Shared integer codes of the ids of one qrels and one run.

    Query codes index query_ids (an Arrow string array, sorted byte-wise); doc codes are in
    [0, n_docs) and sort like the doc ids compared byte-wise (memcmp, shorter prefix first).
    Equal strings get equal codes across the qrels and the run."""

    qrels_query: np.ndarray
    qrels_doc: np.ndarray
    run_query: np.ndarray
    run_doc: np.ndarray
    query_ids: pa.Array
    n_docs: int


def _flat(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks else pa.array([], values.type)
    return values


def common_prefix(parts) -> int:
    """Length of the longest byte prefix shared by every string of every part.

    Compares blocks of bytes of every string with the first string's, a block twice as long as
    the one before (at most about 64 MiB of bytes at a time), so the cost is linear in the bytes
    compared: one 50 MB id shared by a qrels and a run costs a few numpy compares, not one
    Python step per 8 bytes."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return 0
    shortest = min(string_lengths(p)[0] for p in parts)
    offsets, data = string_layout(string_chunks(as_strings(parts[0]))[0])
    reference = data[int(offsets[0]): int(offsets[0]) + shortest]
    rows = sum(len(p) for p in parts)
    prefix, block = 0, 8
    while prefix < shortest:
        block = min(block, shortest - prefix, max(8, (64 << 20) // rows))
        # Every string holds at least `shortest` bytes, so no window passes the end of its data.
        first_differing = block
        for part in parts:
            for chunk in string_chunks(as_strings(part)):
                offsets, data = string_layout(chunk)
                windows = np.lib.stride_tricks.sliding_window_view(data, block)
                starts = offsets[:-1].astype(np.int64) + prefix
                differ = (windows[starts] != reference[prefix: prefix + block]).any(axis=0)
                if differ.any():
                    first_differing = min(first_differing, int(differ.argmax()))
        prefix += first_differing
        if first_differing < block:
            break
        block *= 2
    return min(prefix, shortest)


def _dense_rank(keys: np.ndarray) -> np.ndarray:
    """int64 ranks 0..u-1 of the u distinct values of keys (non-negative ints), ascending."""
    n = keys.size
    if n == 0:
        return np.zeros(0, np.int64)
    index_bits = max(1, (n - 1).bit_length())
    if int(keys.max()).bit_length() + index_bits <= 64:
        # numpy sorts plain integers several times faster than it argsorts them: sort
        # (key, index) packed in one uint64.
        packed = (keys.astype(np.uint64) << np.uint64(index_bits)) | np.arange(n, dtype=np.uint64)
        packed.sort()
        order = (packed & np.uint64((1 << index_bits) - 1)).astype(np.int64)
        packed >>= np.uint64(index_bits)
        ordered = packed
    else:
        order = np.argsort(keys)
        ordered = keys[order]
    step = np.empty(n, np.int64)
    step[0] = 0
    np.cumsum(ordered[1:] != ordered[:-1], out=step[1:])
    ranks = np.empty_like(step)
    ranks[order] = step
    return ranks


def _rank_word_tuples(words: list[np.ndarray], used_bytes: list[int]) -> np.ndarray:
    """Dense ranks of the tuples (words[0][i], words[1][i], ...) in lexicographic order.

    used_bytes[j]: how many leading bytes of words[j] can be non-zero (the rest are 0)."""
    n = words[0].size
    # Runs of equal consecutive tuples (a run file repeats its query id on every line) are
    # ranked once.
    new = np.ones(n, bool)
    if n > 1:
        new[1:] = False
        for word in words:
            new[1:] |= word[1:] != word[:-1]
    heads = np.flatnonzero(new)
    if heads.size > n // 2:
        heads = slice(None)  # too few repeats to be worth gathering
    ranks = _dense_rank(words[0][heads])
    # Most significant word first: the rank so far and the next word's used bytes make one
    # integer key when they fit in 64 bits (a short tail, as in "doc12345678"); otherwise the
    # next word is ranked alone first.
    for word, used in zip(words[1:], used_bytes[1:]):
        rank_bits = max(1, int(ranks.max(initial=0)).bit_length())
        if used == 0:
            continue
        if rank_bits + 8 * used <= 64:
            tail = word[heads] >> np.uint64(64 - 8 * used)
            ranks = _dense_rank((ranks.astype(np.uint64) << np.uint64(8 * used)) | tail)
        else:
            alone = _dense_rank(word[heads])
            shift = max(1, int(alone.max()).bit_length())  # both ranks < n: 2 log2(n) bits
            ranks = _dense_rank((ranks.astype(np.uint64) << np.uint64(shift)) | alone.astype(np.uint64))
    return ranks if isinstance(heads, slice) else ranks[np.cumsum(new) - 1]


def sorted_codes(*parts, first_index: bool = True) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Dense codes shared by several string arrays, ordered like the strings (byte-wise).

    Returns (codes per part, int64[u]: for each code, the index of its first occurrence in the
    concatenation of the parts; None unless first_index)."""
    parts = [as_strings(p) for p in parts]
    sizes = [len(p) for p in parts]
    total = sum(sizes)
    if total == 0:
        return [np.zeros(0, np.int64) for _ in parts], np.zeros(0, np.int64)
    longest = max(string_lengths(p)[1] for p in parts)
    # A prefix every id shares ("doc", "clueweb09-en") orders nothing: leaving it out often
    # saves a word per id.
    skip = common_prefix(parts) if longest > 8 else 0
    width = max(1, -(-(longest - skip) // 8))
    if width > MAX_ID_WORDS:
        # Ids this long as words would cost every row `width` words (one 50 MB id among a million
        # short ones: 50 TB): Arrow ranks them instead, by the same byte-wise order, each
        # comparison stopping at the first differing byte.
        both = [c.cast(pa.large_string()) for p in parts for c in string_chunks(p)]
        codes = pc.rank(pa.chunked_array(both, pa.large_string()), sort_keys="ascending",
                        tiebreaker="dense").to_numpy().astype(np.int64) - 1
    else:
        codes = _word_codes(parts, total, longest, skip, width)
    first = None
    if first_index:
        first = np.empty(int(codes.max()) + 1, np.int64)
        # Writing positions in reverse leaves each code's smallest position.
        first[codes[::-1]] = np.arange(total - 1, -1, -1, dtype=np.int64)
    bounds = np.cumsum([0] + sizes)
    return [codes[bounds[i]:bounds[i + 1]] for i in range(len(parts))], first


def _word_codes(parts, total: int, longest: int, skip: int, width: int) -> np.ndarray:
    """sorted_codes' dense codes of the concatenated parts from their ids' 8-byte words."""
    words = [np.empty(total, np.uint64) for _ in range(width)]
    lengths = np.empty(total, np.int64)
    has_nul = False
    lo = 0
    for part in parts:
        for a, b, chunk_words, chunk_lengths, chunk_nul in iter_string_words(part, width, skip):
            for word, chunk_word in zip(words, chunk_words):
                word[lo + a: lo + b] = chunk_word
            lengths[lo + a: lo + b] = chunk_lengths
            has_nul |= chunk_nul
        lo += len(part)
    used = [min(8, longest - skip - 8 * j) for j in range(width)]
    if has_nul:
        # "a" and "a\0" have the same words: the length decides, after every byte.
        words.append(lengths.astype(np.uint64))
        used.append(8)
    return _rank_word_tuples(words, used)


def encode_ids(qrels_query, qrels_doc, run_query, run_doc) -> EncodedIds:
    """Shared codes for the ids of a qrels and a run (Arrow string arrays, numpy arrays or lists).

    O(n log n) with numpy sorts of 8-byte words; never a Python loop per id."""
    qrels_query, run_query = as_strings(qrels_query), as_strings(run_query)
    (qq, rq), first = sorted_codes(qrels_query, run_query)
    (qd, rd), _ = sorted_codes(qrels_doc, run_doc, first_index=False)
    both = [c for part in (qrels_query, run_query) for c in string_chunks(part)]
    if len({c.type for c in both}) > 1:
        both = [c.cast(pa.large_string()) for c in both]
    query_ids = _flat(pa.chunked_array(both, both[0].type if both else pa.string())
                      .take(pa.array(first, pa.int64())))
    n_docs = int(max(qd.max(initial=-1), rd.max(initial=-1))) + 1
    return EncodedIds(qq, qd, rq, rd, query_ids, n_docs)


# ---------------------------------------------------------------------------------------------
# Ranking

def _stable_order(keys: np.ndarray) -> np.ndarray:
    """Indices sorting non-negative int keys, equal keys in input order.

    Packs (key, index) into one int64 when it fits, because numpy sorts plain int64 values
    several times faster than it argsorts them."""
    n = keys.size
    if n == 0:
        return np.zeros(0, np.int64)
    index_bits = max(1, (n - 1).bit_length())
    if int(keys.min()) >= 0 and int(keys.max()).bit_length() + index_bits <= 62:
        packed = (keys.astype(np.int64) << index_bits) | np.arange(n, dtype=np.int64)
        packed.sort()
        return packed & ((1 << index_bits) - 1)
    return np.argsort(keys, kind="stable")


def rank_run(query: np.ndarray, doc: np.ndarray, score: np.ndarray,
             max_docs: int | None = 1000) -> tuple[np.ndarray, np.ndarray]:
    """trec_eval's ranking of every query at once.

    query, doc: int64[n] codes (doc codes ordered like the ids); score: float64[n], finite.
    Returns (order, rank): indices into the run of the kept rows, sorted by query code
    ascending, then score descending, then doc code descending, and each row's 1-based rank
    within its query; rows ranked past max_docs are dropped (None keeps all)."""
    query = np.asarray(query, np.int64)
    doc = np.asarray(doc, np.int64)
    score = np.asarray(score, np.float64)
    n = query.size
    # Runs are usually written in rank order: grouping by query with a stable sort then
    # often leaves nothing to sort by score.
    order = _stable_order(query)
    q, s = query[order], score[order]
    same_query = q[1:] == q[:-1]
    if np.any(same_query & (s[1:] > s[:-1])):
        by_score = np.argsort(-score)  # ties are ordered by doc below
        order = by_score[_stable_order(query[by_score])]
        q, s = query[order], score[order]
        same_query = q[1:] == q[:-1]
    tied = same_query & (s[1:] == s[:-1])
    if tied.any():
        in_tie = np.zeros(n, bool)
        in_tie[:-1] |= tied
        in_tie[1:] |= tied
        group = np.cumsum(np.r_[True, ~tied])
        at = np.flatnonzero(in_tie)
        within = np.lexsort((-doc[order[at]], group[at]))
        order = order.copy()
        order[at] = order[at[within]]
    starts = np.flatnonzero(np.r_[True, ~same_query]) if n else np.zeros(0, np.int64)
    rank = np.arange(1, n + 1, dtype=np.int64) - np.repeat(starts, np.diff(np.r_[starts, n]))
    if max_docs is not None:
        keep = rank <= max_docs
        if not keep.all():
            order, rank = order[keep], rank[keep]
    return order, rank


# ---------------------------------------------------------------------------------------------
# Per-query helpers. The ranked rows of query slot s are positions [start[s], start[s] + n[s]).

def _segment_sums(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """sum(values[lo[s]:hi[s]]) per s, added in row order (as trec_eval adds in rank order);
    0 for empty ranges. lo, hi: int64 with lo <= hi <= values.size."""
    return _segment_reduce(np.add, values, lo, hi)


def _segment_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[s]:hi[s]]) per s, 0 for empty ranges (values >= 0)."""
    return _segment_reduce(np.maximum, values, lo, hi)


def _segment_reduce(ufunc, values, lo, hi) -> np.ndarray:
    out = np.zeros(lo.size, np.float64)
    nonempty = hi > lo
    if not nonempty.any():
        return out
    # reduceat over the interleaved bounds (lo0, hi0, lo1, hi1, ...): even results are the
    # wanted ranges. The trailing 0 makes hi == values.size a valid index.
    padded = np.r_[values.astype(np.float64), 0.0]
    bounds = np.empty(2 * int(nonempty.sum()), np.int64)
    bounds[0::2], bounds[1::2] = lo[nonempty], hi[nonempty]
    out[nonempty] = ufunc.reduceat(padded, bounds)[0::2]
    return out


def _segmented_cumsum(values: np.ndarray, first: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Running sums of values that restart at each segment (segment s starts at first[s];
    segment[i] is the segment of entry i). Accumulated in extended precision so that removing
    the earlier segments' total loses nothing visible at float64."""
    running = np.cumsum(values.astype(np.longdouble))
    before = np.r_[np.longdouble(0), running][first]
    return (running - before[segment]).astype(np.float64)


def _ratio(numerator, denominator) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0."""
    numerator = np.asarray(numerator, np.float64)
    denominator = np.asarray(denominator, np.float64)
    return np.divide(numerator, denominator, out=np.zeros(np.broadcast(numerator, denominator).shape),
                     where=denominator != 0)


def _round_half_up(x: np.ndarray) -> np.ndarray:
    """C's lround for x >= 0 (half away from zero), exactly: x - floor(x) is exact in floats."""
    whole = np.floor(x)
    return (whole + (x - whole >= 0.5)).astype(np.int64)


class _Marked:
    """The ranked rows of some kind (relevant, judged non-relevant, positive gain), as sorted
    positions, grouped by query: entries [first[s], first[s] + count[s]) of `position` are
    query s's, in rank order. Only these rows are ever looked at, never all ranked rows."""

    def __init__(self, position: np.ndarray, start: np.ndarray, n: np.ndarray):
        self.position = position
        self.start, self.n = start, n
        self.first = np.searchsorted(position, start)
        self.count = np.searchsorted(position, start + n) - self.first
        self.slot = np.repeat(np.arange(start.size), self.count)
        self.rank = position - start[self.slot] + 1
        # 1-based index of each entry among its query's entries.
        self.index = np.arange(1, position.size + 1) - self.first[self.slot]

    def count_within(self, k) -> np.ndarray:
        """Entries ranked <= k per query (k scalar or per query)."""
        return np.searchsorted(self.position, self.start + np.minimum(k, self.n)) - self.first

    def sums(self, values: np.ndarray, count: np.ndarray | None = None) -> np.ndarray:
        """Per query, the sum of values over its first `count` entries (all by default)."""
        return _segment_sums(values, self.first, self.first + (self.count if count is None else count))


# ---------------------------------------------------------------------------------------------
# Evaluation

def judged_queries(qrels_query: np.ndarray) -> np.ndarray:
    """Sorted distinct query codes of the qrels: the query set of an average with -c."""
    return np.unique(np.asarray(qrels_query, np.int64))


def evaluate(qrels_query, qrels_doc, qrels_rel, run_query, run_doc, run_score,
             config: RetrievalConfig = RetrievalConfig()) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per-query values of every measure of measure_names(config).

    qrels_*: int64[m] query codes, doc codes, relevance levels (any int; negative = unjudged);
    run_*: int64[n] query codes, doc codes, float64[n] finite scores. Codes from encode_ids:
    shared between qrels and run, doc codes ordered like the doc ids. Each (query, doc) pair at
    most once in each input (ValueError for the qrels; the run's duplicates are the caller's).
    config.complete: also evaluate qrels queries absent from the run (trec_eval -c).
    Returns (query codes int64[Q] ascending, {measure: float64[Q]}). Q = 0 when no query has
    both qrels and run rows (trec_eval would refuse to print anything).
    """
    qrels_query = np.asarray(qrels_query, np.int64)
    qrels_doc = np.asarray(qrels_doc, np.int64)
    qrels_rel = np.asarray(qrels_rel, np.int64)
    run_query = np.asarray(run_query, np.int64)
    run_doc = np.asarray(run_doc, np.int64)
    level_cut = config.relevance_level

    order, _ = rank_run(run_query, run_doc, run_score, config.max_docs_per_query)
    row_query = run_query[order]
    n_rows = row_query.size
    heads = np.flatnonzero(np.r_[True, row_query[1:] != row_query[:-1]]) if n_rows else order[:0]
    head_query = row_query[heads]
    judged = judged_queries(qrels_query)
    queries = judged if config.complete else np.intersect1d(judged, head_query, assume_unique=True)
    n_queries = queries.size

    # Query slot s owns ranked rows [start[s], start[s] + num_ret[s]); none when not in the run.
    start = np.zeros(n_queries, np.int64)
    num_ret = np.zeros(n_queries, np.int64)
    if heads.size:
        at = np.minimum(np.searchsorted(head_query, queries), heads.size - 1)
        ranked = head_query[at] == queries
        start[ranked] = heads[at[ranked]]
        num_ret[ranked] = np.diff(np.r_[heads, n_rows])[at[ranked]]

    # Every judged row belongs to an evaluated query: its query is in the qrels and in the run.
    level = _levels(qrels_query, qrels_doc, qrels_rel, row_query, run_doc[order])
    relevant = _Marked(np.flatnonzero(level >= level_cut), start, num_ret)
    nonrel = _Marked(np.flatnonzero((level >= 0) & (level < level_cut)), start, num_ret)
    gains = _Marked(np.flatnonzero(level > 0), start, num_ret)
    gain = level[gains.position].astype(np.float64)
    del level

    qslot = np.searchsorted(queries, qrels_query)
    known = qslot < n_queries
    known[known] = queries[qslot[known]] == qrels_query[known]
    qslot, qlevel = qslot[known], qrels_rel[known]
    num_rel = np.bincount(qslot[qlevel >= level_cut], minlength=n_queries)
    num_nonrel = np.bincount(qslot[(qlevel >= 0) & (qlevel < level_cut)], minlength=n_queries)
    ideal = _ideal(qslot, qlevel, n_queries)

    values: dict[str, np.ndarray] = {
        "num_ret": num_ret.astype(np.float64),
        "num_rel": num_rel.astype(np.float64),
        "num_rel_ret": relevant.count.astype(np.float64),
        "num_nonrel_judged_ret": nonrel.count.astype(np.float64),
    }
    # Precision at each relevant row: relevant rows so far / rank.
    precision = relevant.index / relevant.rank
    values["map"] = _ratio(relevant.sums(precision), num_rel)
    values["Rprec"] = _ratio(relevant.count_within(num_rel), num_rel)

    # bpref: judged non-relevant rows ranked above each relevant row, capped at R.
    above = np.searchsorted(nonrel.position, relevant.position) - nonrel.first[relevant.slot]
    r_row = num_rel[relevant.slot].astype(np.float64)
    n_row = num_nonrel[relevant.slot].astype(np.float64)
    values["bpref"] = _ratio(relevant.sums(1.0 - _ratio(np.minimum(above, r_row), np.minimum(n_row, r_row))),
                             num_rel)

    found = relevant.count > 0
    recip_rank = np.zeros(n_queries)
    recip_rank[found] = 1.0 / relevant.rank[relevant.first[found]]
    values["recip_rank"] = recip_rank

    discounted = gain / np.log2(gains.rank + 1.0)
    dcg_all = gains.sums(discounted)
    values["ndcg"] = _ratio(dcg_all, ideal.dcg(None))
    values["ndcg_rel"] = _ndcg_rel(gains, discounted, dcg_all, ideal)

    for k in config.ks:
        hits = relevant.count_within(k)
        p_at_k = hits / k
        recall = _ratio(hits, num_rel)
        values[f"P_{k}"] = p_at_k
        values[f"recall_{k}"] = recall
        values[f"F1_{k}"] = _ratio(2 * p_at_k * recall, p_at_k + recall)
        values[f"success_{k}"] = (hits > 0).astype(np.float64)
        values[f"map_cut_{k}"] = _ratio(relevant.sums(precision, hits), num_rel)
        dcg = gains.sums(discounted, gains.count_within(k))
        values[f"dcg_cut_{k}"] = dcg
        values[f"ndcg_cut_{k}"] = _ratio(dcg, ideal.dcg(k))

    values.update(_interpolated_precision(relevant, precision, num_rel, config))
    return queries, {name: values[name] for name in measure_names(config)}


def _levels(qrels_query, qrels_doc, qrels_rel, query, doc) -> np.ndarray:
    """The qrels level of each (query, doc) run row, NOT_JUDGED when the qrels lack the pair."""
    n_docs = int(max(qrels_doc.max(initial=-1), doc.max(initial=-1))) + 1
    n_q = int(max(qrels_query.max(initial=-1), query.max(initial=-1))) + 1
    if n_docs * n_q >= 2 ** 63:
        raise ValueError("codes too large to combine; use dense codes from encode_ids")
    qrels_key = qrels_query * n_docs + qrels_doc
    by_key = np.argsort(qrels_key)
    qrels_key = qrels_key[by_key]
    if np.any(qrels_key[1:] == qrels_key[:-1]):
        raise ValueError("the qrels judge some (query, doc) pair twice")
    qrels_rel = qrels_rel[by_key]
    key = query * n_docs
    key += doc
    at = np.searchsorted(qrels_key, key)
    found = at < qrels_key.size
    found[found] = qrels_key[at[found]] == key[found]
    level = np.full(key.size, NOT_JUDGED, np.int64)
    level[found] = qrels_rel[at[found]]
    return level


@dataclass
class _Ideal:
    """Each query's positive judged gains sorted descending: query s owns entries
    [start[s], start[s] + count[s]) of discounted (gain / log2(position + 1))."""

    start: np.ndarray
    count: np.ndarray
    discounted: np.ndarray
    slot: np.ndarray

    def dcg(self, k) -> np.ndarray:
        """IDCG@k per query (k None: every judged gain)."""
        hi = self.start + (self.count if k is None else np.minimum(self.count, k))
        return _segment_sums(self.discounted, self.start, hi)


def _ideal(qslot, qlevel, n_queries) -> _Ideal:
    positive = qlevel > 0
    slot, gain = qslot[positive], qlevel[positive]
    by = np.lexsort((-gain, slot))
    slot, gain = slot[by], gain[by].astype(np.float64)
    count = np.bincount(slot, minlength=n_queries)
    start = np.r_[0, np.cumsum(count)[:-1]].astype(np.int64)
    position = np.arange(1, slot.size + 1, dtype=np.int64) - start[slot]
    return _Ideal(start, count, gain / np.log2(position + 1.0), slot)


def _ndcg_rel(gains: _Marked, discounted: np.ndarray, dcg_all: np.ndarray, ideal: _Ideal) -> np.ndarray:
    """trec_eval's ndcg_rel (see the module docstring), per query slot."""
    ideal_so_far = _segmented_cumsum(ideal.discounted, ideal.start, ideal.slot)
    dcg_so_far = _segmented_cumsum(discounted, gains.first, gains.slot)
    # Past the last positive ideal position the ideal DCG stays at its total.
    depth = np.minimum(gains.rank, ideal.count[gains.slot])
    terms = dcg_so_far / ideal_so_far[ideal.start[gains.slot] + depth - 1]
    missing = (ideal.count - gains.count).astype(np.float64)
    total = gains.sums(terms) + _ratio(missing * dcg_all, ideal.dcg(None))
    return np.where(total > 0, _ratio(total, ideal.count), 0.0)


def _interpolated_precision(relevant: _Marked, precision: np.ndarray, num_rel: np.ndarray,
                            config: RetrievalConfig) -> dict[str, np.ndarray]:
    """iprec_at_recall_p per query slot (see the module docstring)."""
    end = relevant.first + relevant.count
    out = {}
    for p in config.recall_points:
        wanted = p * num_rel.astype(np.float64)
        needed = ((wanted + 0.9).astype(np.int64) if config.iprec_rounding == "legacy"
                  else _round_half_up(wanted))
        lo = np.where(needed <= relevant.count, relevant.first + np.maximum(needed, 1) - 1, end)
        out[f"iprec_at_recall_{p:.2f}"] = _segment_max(precision, lo, end)
    return out


def aggregate(values: dict[str, np.ndarray]) -> dict[str, float]:
    """trec_eval's `all` line from per-query values: the sum for SUMMED counts, else the mean
    (0 for no query)."""
    out = {}
    for name, column in values.items():
        if name in SUMMED:
            out[name] = float(np.sum(column))
        else:
            out[name] = float(np.mean(column)) if column.size else 0.0
    return out


# ---------------------------------------------------------------------------------------------
# State of one (model, slice) and its metric records

# record type and parameters of each measure family (trec_eval names)
FAMILIES = {"P": "Precision", "recall": "Recall", "F1": "F1", "success": "Hit", "map_cut": "MAP",
            "dcg_cut": "DCG", "ndcg_cut": "NDCG"}
SINGLE = {"recip_rank": "MRR", "map": "MAP", "Rprec": "RPrecision", "ndcg": "NDCG"}


def record_of(measure: str):
    """(record type, parameters) of a measure name, or None for measures not reported."""
    if measure in SINGLE:
        return SINGLE[measure], {}
    family, _, k = measure.rpartition("_")
    if family in FAMILIES and k.isdigit():
        return FAMILIES[family], {"k": int(k)}
    return None


def reported_measures(names) -> list[str]:
    """The measures of `names` that become records (record_of), in name order: the ones the
    replicates are computed for."""
    return [name for name in sorted(names) if record_of(name) is not None]


@dataclass
class RetrievalState:
    """Per (model, slice): the number of queries evaluated and the exact totals of each measure
    (transforms/kernels/exact_sum.py: {exponent: integer sum}), so that merging is exact and
    order-free and the averages are the same for any sharding.

    With bootstrap replicates: replicate_queries int64[R], the sum of the queries' weights in
    each replicate (its number of queries), and replicate_totals {measure: [R exact totals]}, the
    weighted sums of the reported measures (weighted_totals); None without bootstrap."""

    queries: int = 0
    totals: dict = field(default_factory=dict)
    replicate_queries: np.ndarray | None = None
    replicate_totals: dict | None = None

    def add_queries(self, values: dict[str, np.ndarray], index: np.ndarray,
                    weights: np.ndarray | None = None) -> "RetrievalState":
        """Add the queries at positions `index` of evaluate()'s per-query values; weights: None,
        or the [R, Q] bootstrap weights of all of evaluate()'s queries (Bootstrap.weights of
        their query ids' FNV-1a hashes)."""
        self.queries += int(index.size)
        for name, column in values.items():
            self.totals[name] = merge_totals(self.totals.get(name, {}), exact_totals(column[index]))
        if weights is not None and weights.shape[0]:
            names = reported_measures(values)
            part = weights[:, index]
            counts = part.sum(axis=1, dtype=np.int64)
            matrix = np.stack([values[name][index] for name in names], axis=1) if names else \
                np.zeros((index.size, 0))
            sums = weighted_totals(matrix, part)
            self._add_replicates(counts, dict(zip(names, sums)))
        return self

    def _add_replicates(self, counts: np.ndarray, totals: dict) -> None:
        if self.replicate_totals is None:
            self.replicate_queries = np.array(counts, dtype=np.int64)
            self.replicate_totals = {name: [dict(t) for t in per] for name, per in totals.items()}
            return
        self.replicate_queries = self.replicate_queries + counts
        for name, per in totals.items():
            mine = self.replicate_totals.get(name)
            if mine is None:
                self.replicate_totals[name] = [dict(t) for t in per]
            else:
                self.replicate_totals[name] = [merge_totals(a, b) for a, b in zip(mine, per)]

    def merge(self, other: "RetrievalState") -> "RetrievalState":
        self.queries += other.queries
        for name, total in other.totals.items():
            self.totals[name] = merge_totals(self.totals.get(name, {}), total)
        if other.replicate_totals is not None:
            self._add_replicates(other.replicate_queries, other.replicate_totals)
        return self

    def copy(self) -> "RetrievalState":
        out = RetrievalState(self.queries, {k: dict(v) for k, v in self.totals.items()})
        if self.replicate_totals is not None:
            out.replicate_queries = self.replicate_queries.copy()
            out.replicate_totals = {k: [dict(t) for t in v] for k, v in self.replicate_totals.items()}
        return out


def state_records(state: RetrievalState, config: RetrievalConfig, side=None):
    """Averages (sums for the counts in SUMMED) of the reported measures, as trec_eval's `all`
    line: a "Queries" record (the number of queries averaged over, with the settings that
    decide it), then one record per measure in name order. Records have "type", "value",
    "parameters"; transforms.merge.records_of adds "model" and "slice".

    With replicates (bootstrap), each measure record also carries kernels.bootstrap.REPLICATES:
    replicate r's weighted mean over the queries, sum_q w(q, r) v_q / sum_q w(q, r) (the mean
    over the dataset in which query q appears w(q, r) times), None when no query has a positive
    weight; and the Hit records (success_k, a 0/1 value per query) PROPORTION [queries with a
    hit, queries]. The Queries record, a count, gets neither."""
    from evalbeam.transforms.kernels.bootstrap import PROPORTION, REPLICATES

    settings = {"relevance_level": config.relevance_level, "max_docs": config.max_docs_per_query,
                "complete": config.complete}
    yield {"type": "Queries", "value": state.queries, "parameters": settings}
    for name in sorted(state.totals):
        found = record_of(name)
        if found is None:
            continue
        kind, parameters = found
        total = total_value(state.totals[name])
        value = total if name in SUMMED else (total / state.queries if state.queries else 0.0)
        record = {"type": kind, "value": value, "parameters": parameters}
        if state.replicate_totals is not None and name not in SUMMED:
            per = state.replicate_totals.get(name, [{}] * len(state.replicate_queries))
            record[REPLICATES] = [total_value(t) / int(q) if q else None
                                  for t, q in zip(per, state.replicate_queries.tolist())]
            if kind == "Hit":
                record[PROPORTION] = [int(total), state.queries]
        yield record
