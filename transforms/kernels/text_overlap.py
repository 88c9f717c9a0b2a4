"""ROUGE and BLEU of one response against its references, equal to the reference packages.

ROUGE is rouge-score's: its tokenizer (lower case, [a-z0-9] runs, optional Porter stemming of
tokens longer than 3 characters), its n-gram and summary-level LCS scoring, and score_multi's rule
for several references (per ROUGE type, the reference with the highest F-measure; the first one on
ties). Two things are done once instead of once per reference and per type: tokenising the
response, and the LCS table: rougeL only needs the LCS *length*, computed here bit-parallel
(Hyyro's algorithm, exact), and a rougeLsum whose two texts are single lines equals rougeL (one
sentence each: the union LCS is the LCS). Multi-line rougeLsum is the summary-level union LCS,
written here (summary_level_lcs) so that a run without stemming never imports nltk.
Sentences for rougeLsum are the text's lines (rouge-score's default rule, no downloaded data).

Sentence BLEU is nltk's sentence_bleu without smoothing, on Valor's tokens (the regular expression
\\w+|\\$[\\d]+|[^\\s\\.]+), with Valor's rule that a score below 1e-9 is 0; the arithmetic below
repeats nltk's (clipped counts, closest reference length, brevity penalty, fsum of weighted logs,
float_info.min for an order without matches) so that it runs without nltk's Fraction overhead.

Corpus BLEU is sacreBLEU's corpus_bleu (13a tokenizer, exp smoothing, closest reference length)
from per-response statistics that add up across shards: [hyp_len, ref_len, correct_1..4,
total_1..4].
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from functools import lru_cache

import numpy as np

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
BLEU_ORDER = 4
_VALOR_TOKENS = re.compile(r"\w+|\$[\d]+|[^\s\.]+")


class _UnstemmedTokenizer:
    """rouge-score's DefaultTokenizer(use_stemmer=False): its own tokenize function without a
    stemmer. rouge_score.tokenizers imports nltk for the Porter stemmer, and nltk imports scipy
    and scikit-learn when they are installed: seconds of imports per worker process, paid by
    every run that asks for ROUGE without stemming, which is the default."""

    def __init__(self):
        from rouge_score.tokenize import tokenize

        self._tokenize = tokenize

    def tokenize(self, text: str) -> list[str]:
        return self._tokenize(text, None)


@lru_cache(maxsize=2)
def _rouge_tokenizer(use_stemmer: bool):
    if not use_stemmer:
        return _UnstemmedTokenizer()
    from rouge_score.tokenizers import DefaultTokenizer

    return DefaultTokenizer(use_stemmer)


def lcs_length(a: list, b: list) -> int:
    """Length of the longest common subsequence of two token lists, bit-parallel: bit j of v is
    0 where the LCS of the prefix of a and b[:j+1] grows; O(len(a) * len(b) / word) with Python's
    big integers (Hyyro 2004, "Bit-parallel LCS-length computation revisited")."""
    if not a or not b:
        return 0
    masks: dict = {}
    for j, token in enumerate(b):
        masks[token] = masks.get(token, 0) | (1 << j)
    full = (1 << len(b)) - 1
    v = full
    for token in a:
        u = v & masks.get(token, 0)
        v = ((v + u) | (v - u)) & full
    return len(b) - bin(v).count("1")


def _fmeasure(precision: float, recall: float) -> float:
    # rouge-score's scoring.fmeasure, repeated for identical floats
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def _ngrams(tokens: list, n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


class _Text:
    """A text's tokens, prepared once for every ROUGE type and reference."""

    def __init__(self, text: str, tokenizer, rouge_types):
        self.text = text
        self.tokens = tokenizer.tokenize(text)
        self.ngrams = {int(t[5:]): _ngrams(self.tokens, int(t[5:]))
                       for t in rouge_types if t not in ("rougeL", "rougeLsum")}
        self.multiline = "\n" in text
        self.tokenizer = tokenizer

    def sentences(self) -> list[list]:
        return [self.tokenizer.tokenize(s) for s in self.text.split("\n") if len(s)]


def _lcs_positions(a: list, b: list) -> list[int]:
    """The positions in `a` of one longest common subsequence of a and b: the one found by
    walking the LCS table back from its last cell, taking a token pair when the tokens are
    equal, else stepping along b when that keeps a longer LCS than stepping along a, and along a
    otherwise (the path rouge-score's summary-level LCS takes, which decides which tokens of a
    the union below counts). O(len(a) len(b)) time and memory: sentences are short."""
    rows, cols = len(a), len(b)
    table = [[0] * (cols + 1) for _ in range(rows + 1)]
    for i in range(1, rows + 1):
        above, here, token = table[i - 1], table[i], a[i - 1]
        for j in range(1, cols + 1):
            here[j] = above[j - 1] + 1 if token == b[j - 1] else max(above[j], here[j - 1])
    positions, i, j = [], rows, cols
    while i > 0 and j > 0:
        if a[i - 1] == b[j - 1]:
            positions.append(i - 1)
            i, j = i - 1, j - 1
        elif table[i][j - 1] > table[i - 1][j]:
            j -= 1
        else:
            i -= 1
    return positions[::-1]


def summary_level_lcs(references: list[list], candidates: list[list]) -> tuple[float, float, float]:
    """rougeLsum of two multi-sentence texts (lists of token lists), Lin (2004) section 3.2:
    for each reference sentence r, the union over candidate sentences c of the tokens of r in
    LCS(r, c); a token of the union is a hit while both texts still have an unused occurrence
    of it (each occurrence counts once). P = hits / candidate tokens, R = hits / reference
    tokens, F their harmonic mean; zeros when either text has no token. Equal, value for value,
    to rouge-score's summary-level LCS (tests/text/test_text_overlap.py), without importing
    rouge_score.rouge_scorer, which imports nltk."""
    m = sum(len(r) for r in references)
    n = sum(len(c) for c in candidates)
    if not m or not n:
        return 0.0, 0.0, 0.0
    left_r = Counter(t for r in references for t in r)
    left_c = Counter(t for c in candidates for t in c)
    hits = 0
    for r in references:
        union = sorted(set().union(*(_lcs_positions(r, c) for c in candidates)))
        for token in (r[i] for i in union):
            if left_r[token] > 0 and left_c[token] > 0:
                hits += 1
                left_r[token] -= 1
                left_c[token] -= 1
    precision, recall = hits / n, hits / m
    return precision, recall, _fmeasure(precision, recall)


def _score(target: _Text, prediction: _Text, rouge_type: str) -> tuple[float, float, float]:
    if rouge_type == "rougeLsum" and (target.multiline or prediction.multiline):
        return summary_level_lcs(target.sentences(), prediction.sentences())
    if rouge_type in ("rougeL", "rougeLsum"):
        if not target.tokens or not prediction.tokens:
            return 0.0, 0.0, 0.0
        lcs = lcs_length(target.tokens, prediction.tokens)
        precision, recall = lcs / len(prediction.tokens), lcs / len(target.tokens)
        return precision, recall, _fmeasure(precision, recall)
    n = int(rouge_type[5:])
    t, p = target.ngrams[n], prediction.ngrams[n]
    overlap = sum(min(count, p[gram]) for gram, count in t.items())
    precision = overlap / max(sum(p.values()), 1)
    recall = overlap / max(sum(t.values()), 1)
    return precision, recall, _fmeasure(precision, recall)


def rouge(prediction: str, references: list[str], rouge_types=ROUGE_TYPES,
          use_stemmer: bool = False) -> dict[str, tuple[float, float, float]]:
    """{rouge type: (precision, recall, F-measure)} of the best reference per type (highest
    F-measure, first on ties), as rouge-score's RougeScorer(rouge_types, use_stemmer)
    .score_multi(references, prediction). rouge types: rougeN (N >= 1), rougeL, rougeLsum.
    No references: zeros."""
    for rouge_type in rouge_types:
        if rouge_type not in ("rougeL", "rougeLsum") and not re.fullmatch(r"rouge[1-9]", rouge_type):
            raise ValueError(f"unknown ROUGE type {rouge_type!r} (rouge1..rouge9, rougeL, rougeLsum)")
    tokenizer = _rouge_tokenizer(use_stemmer)
    pred = _Text(prediction, tokenizer, rouge_types)
    targets = [_Text(r, tokenizer, rouge_types) for r in references]
    out = {}
    for rouge_type in rouge_types:
        best = (0.0, 0.0, 0.0)
        for i, target in enumerate(targets):
            score = _score(target, pred, rouge_type)
            if i == 0 or score[2] > best[2]:
                best = score
        out[rouge_type] = best
    return out


def valor_tokens(text: str) -> list[str]:
    """Valor's BLEU tokens: words, $amounts and other non-space runs, periods dropped."""
    return _VALOR_TOKENS.findall(text)


def sentence_bleu(prediction: str, references: list[str],
                  weights: tuple[float, ...] = (0.25, 0.25, 0.25, 0.25)) -> float:
    """nltk's sentence_bleu(references, prediction, weights) on Valor's tokens, no smoothing,
    0 below 1e-9 (Valor's rule).

    p_n = clipped n-gram matches / max(1, prediction n-grams) (clipping by the largest count in
    any one reference); BP = 1 if len(pred) > r else exp(1 - r / len(pred)) (0 for an empty
    prediction), r the reference length closest to len(pred) (the shorter on ties); BLEU =
    BP * exp(sum w_n log p_n), where an order with no match contributes log(float_info.min), and
    no unigram match at all gives 0."""
    if not weights:
        raise ValueError("BLEU needs at least one weight")
    hyp = valor_tokens(prediction)
    refs = [valor_tokens(r) for r in references]
    if not refs:
        return 0.0
    p = []
    for n in range(1, len(weights) + 1):
        counts = _ngrams(hyp, n) if len(hyp) >= n else Counter()
        best: dict = {}
        for ref in refs:
            ref_counts = _ngrams(ref, n) if len(ref) >= n else Counter()
            for gram in counts:
                c = ref_counts[gram]
                if c > best.get(gram, 0):
                    best[gram] = c
        clipped = sum(min(c, best.get(gram, 0)) for gram, c in counts.items())
        p.append((clipped, max(1, sum(counts.values()))))
    if p[0][0] == 0:
        return 0.0
    r = min((len(ref) for ref in refs), key=lambda length: (abs(length - len(hyp)), length))
    c = len(hyp)
    bp = 1.0 if c > r else (0.0 if c == 0 else math.exp(1 - r / c))
    logs = (w * math.log(num / den if num else sys.float_info.min) for w, (num, den) in zip(weights, p))
    score = bp * math.exp(math.fsum(logs))
    return score if score >= 1e-9 else 0.0


@lru_cache(maxsize=1)
def _sacrebleu_tokenizer():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


def corpus_bleu_stats(prediction: str, references: list[str]) -> np.ndarray:
    """int64[2 + 2 * 4]: [hypothesis length, closest reference length, correct n-grams for
    n = 1..4, total hypothesis n-grams for n = 1..4], as sacreBLEU counts them (13a tokens of
    the right-stripped text; clipping by the largest count in any reference; closest reference
    length, the shorter on ties). Statistics of many responses add up; corpus_bleu() turns the
    sum into sacreBLEU's corpus score. No references: zeros (the response does not count)."""
    from sacrebleu.metrics.helpers import extract_all_word_ngrams

    out = np.zeros(2 + 2 * BLEU_ORDER, dtype=np.int64)
    if not references:
        return out
    tokenize = _sacrebleu_tokenizer()
    ref_ngrams: Counter = Counter()
    ref_lens = []
    for ref in references:
        grams, length = extract_all_word_ngrams(tokenize(ref.rstrip()), 1, BLEU_ORDER)
        ref_lens.append(length)
        for gram, count in grams.items():
            if count > ref_ngrams[gram]:
                ref_ngrams[gram] = count
    grams, hyp_len = extract_all_word_ngrams(tokenize(prediction.rstrip()), 1, BLEU_ORDER)
    closest_diff, closest = -1, -1
    for length in ref_lens:
        diff = abs(hyp_len - length)
        if closest_diff == -1 or diff < closest_diff or (diff == closest_diff and length < closest):
            closest_diff, closest = diff, length
    out[0], out[1] = hyp_len, closest
    for gram, count in grams.items():
        n = len(gram) - 1
        out[2 + BLEU_ORDER + n] += count
        out[2 + n] += min(count, ref_ngrams.get(gram, 0))
    return out


def corpus_bleu(stats: np.ndarray) -> dict:
    """sacreBLEU's corpus score from summed corpus_bleu_stats: {"score" (0-100, sacreBLEU's
    scale), "precisions" (per order, %), "bp", "sys_len", "ref_len"}."""
    from sacrebleu.metrics.bleu import BLEU

    stats = [int(v) for v in stats]
    result = BLEU.compute_bleu(correct=stats[2:2 + BLEU_ORDER], total=stats[2 + BLEU_ORDER:],
                               sys_len=stats[0], ref_len=stats[1], smooth_method="exp")
    return {"score": float(result.score), "precisions": [float(p) for p in result.precisions],
            "bp": float(result.bp), "sys_len": int(result.sys_len), "ref_len": int(result.ref_len)}
