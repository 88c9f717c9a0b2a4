"""Looping detection: three repetition metrics of one answer and a pass/fail rule (pure Python/numpy).

Sentences (split_sentences). A sentence boundary is a run of whitespace that either contains a
line break, or follows a terminator . ! ? or … (optionally followed by one closing quote or
bracket: " ' ” ’ ) ]). Sentences are the pieces between boundaries with their whitespace runs
collapsed to one space. This is a plain rule, no downloaded model: "e.g. this" splits after
"e.g.", while "3.14" and "example.com" do not split (no whitespace after the dot).

Metrics (looping_metrics):
- unique_sentences = #distinct sentences / #sentences, over the sentences of at least 10
  characters (shorter ones are ignored: "Yes." repeated is not a loop). Sentences are compared
  exactly (case-sensitive, after whitespace collapsing). A text with no sentence of 10 or more
  characters scores 1.0: there is nothing repeated. Higher is better.
- longest_repeated_substring = len(S) * count(S) / len(text), on characters (code points), where S
  is the longest substring of the text that occurs at least twice without overlapping, and
  count(S) is the largest number of non-overlapping occurrences of S (greedy from the left, which
  is optimal for one pattern). Among several longest substrings, the one with the most
  occurrences, then the leftmost, is S. Non-overlapping occurrences keep the value in [0, 1]
  ("abababab": S = "abab", count 2, value 1.0). 0.0 when no character repeats, and for the empty
  text. Lower is better. Computed in O(n log n): a suffix array by prefix doubling (numpy sorts),
  Kasai's LCP array, then a binary search on the length L, each step an O(n) numpy pass asking
  whether some block of suffixes sharing a prefix of length L spans positions at least L apart.
- compression_ratio = len(zlib.compress(utf8, 9)) / len(utf8) in bytes. Repetitive text
  compresses well and scores low. 1.0 for the empty text; it can exceed 1 for short texts (zlib's
  header and checksum are 6 bytes). Higher is better.

Pass/fail (looping_verdict). The answer loops (fails) when unique_sentences < 0.75 or
longest_repeated_substring > 0.75, the thresholds of the reference evaluator. The compression ratio
is reported but does not decide: with its documented threshold (0.75, higher is better) almost
every ordinary English text would fail, since zlib compresses prose well below 0.75 (measured on
this repository's README: 0.70 for the first 200 characters, 0.59 for 1,000, 0.47 for 5,000).
"""

from __future__ import annotations

import re
import zlib

import numpy as np

__all__ = [
    "MIN_SENTENCE_CHARS", "THRESHOLDS", "split_sentences", "unique_sentences",
    "longest_repeated_substring", "lrs_ratio", "compression_ratio", "looping_metrics",
    "looping_verdict",
]

MIN_SENTENCE_CHARS = 10
# metric -> (threshold, higher is better); a value on the wrong side fails.
THRESHOLDS = {"unique_sentences": (0.75, True), "longest_repeated_substring": (0.75, False)}

_WHITESPACE = re.compile(r"\s+")
_TERMINATORS = ".!?…"
_CLOSERS = "\"'”’)]"


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` (see the module docstring), empty ones dropped."""
    sentences = []
    start = 0
    # One pass over the whitespace runs; each run is tested by looking at most two characters
    # back, so the split is linear (a regex with look-behind around \s* could be quadratic on
    # long whitespace runs).
    for run in _WHITESPACE.finditer(text):
        left = run.start()
        boundary = "\n" in run.group() or "\r" in run.group()
        if not boundary and left > 0:
            last = text[left - 1]
            boundary = last in _TERMINATORS or (
                last in _CLOSERS and left > 1 and text[left - 2] in _TERMINATORS)
        if boundary:
            sentences.append(text[start:left])
            start = run.end()
    sentences.append(text[start:])
    return [" ".join(piece.split()) for piece in sentences if piece.strip()]


def unique_sentences(text: str, min_chars: int = MIN_SENTENCE_CHARS) -> float:
    """#distinct / #sentences over sentences of at least min_chars characters (1.0 if none)."""
    sentences = [s for s in split_sentences(text) if len(s) >= min_chars]
    if not sentences:
        return 1.0
    return len(set(sentences)) / len(sentences)


def _suffix_array(codes: np.ndarray) -> np.ndarray:
    """Suffix array of an int array by prefix doubling: O(n log n) numpy sorts (log n rounds at
    most, fewer when ranks become distinct early)."""
    n = codes.size
    _, rank = np.unique(codes, return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    order = np.argsort(rank, kind="stable")
    step = 1
    while step < n:
        second = np.full(n, -1, dtype=np.int64)
        second[:n - step] = rank[step:]
        order = np.lexsort((second, rank))
        first_sorted, second_sorted = rank[order], second[order]
        changed = np.empty(n, dtype=np.int64)
        changed[0] = 0
        changed[1:] = (first_sorted[1:] != first_sorted[:-1]) | (second_sorted[1:] != second_sorted[:-1])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(changed)
        if rank[order[-1]] == n - 1:
            break
        step *= 2
    return order


def _lcp_array(text: str, suffixes: np.ndarray) -> np.ndarray:
    """lcp[k] = longest common prefix of suffixes[k-1] and suffixes[k] (lcp[0] = 0); Kasai's
    algorithm, O(n): h drops by at most 1 per step, so the inner loop runs O(n) times in all."""
    n = len(text)
    sa = suffixes.tolist()
    rank = [0] * n
    for position, suffix in enumerate(sa):
        rank[suffix] = position
    lcp = [0] * n
    h = 0
    for i in range(n):
        r = rank[i]
        if r == 0:
            h = 0
            continue
        j = sa[r - 1]
        while i + h < n and j + h < n and text[i + h] == text[j + h]:
            h += 1
        lcp[r] = h
        if h:
            h -= 1
    return np.asarray(lcp, dtype=np.int64)


def _blocks(lcp: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Start indices (into the suffix array) and sizes of the maximal blocks of suffixes that
    share a prefix of `length` characters."""
    joined = lcp >= length          # joined[k]: suffix k shares the prefix with suffix k-1
    joined[0] = False
    starts = np.flatnonzero(~joined)
    sizes = np.diff(np.append(starts, lcp.size))
    return starts, sizes


def _spread(suffixes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """max - min position within each block."""
    return np.maximum.reduceat(suffixes, starts) - np.minimum.reduceat(suffixes, starts)


def longest_repeated_substring(text: str) -> tuple[int, int, int]:
    """(start, length, count): the leftmost first occurrence and length of the longest substring
    with two non-overlapping occurrences, and its number of non-overlapping occurrences. (0, 0, 0)
    when there is none. Ties in length go to the larger count, then to the leftmost."""
    n = len(text)
    if n < 2:
        return 0, 0, 0
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    suffixes = _suffix_array(codes)
    lcp = _lcp_array(text, suffixes)

    def feasible(length: int) -> bool:
        starts, sizes = _blocks(lcp, length)
        return bool(np.any((sizes > 1) & (_spread(suffixes, starts) >= length)))

    # feasible() is monotone: a repeat of length L gives repeats of every shorter length.
    low, high = 0, n // 2
    while low < high:
        middle = (low + high + 1) // 2
        if feasible(middle):
            low = middle
        else:
            high = middle - 1
    if low == 0:
        return 0, 0, 0
    starts, sizes = _blocks(lcp, low)
    candidates = np.flatnonzero((sizes > 1) & (_spread(suffixes, starts) >= low))
    best = (0, 0, 0)   # (count, -first position, first position)
    for block in candidates.tolist():
        positions = np.sort(suffixes[starts[block]:starts[block] + sizes[block]]).tolist()
        count, last_end = 0, -1
        for position in positions:
            if position >= last_end:
                count += 1
                last_end = position + low
        key = (count, -positions[0], positions[0])
        if key > best:
            best = key
    return best[2], low, best[0]


def lrs_ratio(text: str) -> float:
    """len(S) * count(S) / len(text) for the longest repeated substring S (0.0 for no repeat)."""
    if not text:
        return 0.0
    _, length, count = longest_repeated_substring(text)
    return length * count / len(text)


def compression_ratio(text: str) -> float:
    """len(zlib.compress(utf8, 9)) / len(utf8); 1.0 for the empty text."""
    data = text.encode("utf-8", "surrogatepass")
    if not data:
        return 1.0
    return len(zlib.compress(data, 9)) / len(data)


def looping_metrics(text: str) -> dict[str, float]:
    """{"unique_sentences", "longest_repeated_substring", "compression_ratio"} of one text."""
    return {
        "unique_sentences": unique_sentences(text),
        "longest_repeated_substring": lrs_ratio(text),
        "compression_ratio": compression_ratio(text),
    }


def looping_verdict(metrics: dict[str, float], thresholds: dict | None = None) -> tuple[bool, tuple[str, ...]]:
    """(passed, reasons): fails when a deciding metric is on the wrong side of its threshold
    (strictly below for higher-is-better, strictly above for lower-is-better)."""
    reasons = []
    for name, (threshold, higher_is_better) in (thresholds or THRESHOLDS).items():
        value = metrics[name]
        if (value < threshold) if higher_is_better else (value > threshold):
            side = "<" if higher_is_better else ">"
            reasons.append(f"{name} {value:.3f} {side} {threshold}")
    return not reasons, tuple(reasons)
