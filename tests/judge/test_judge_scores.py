"""Scoring kernels of the judge and embedding metrics: hand-computed values, Valor's documented
examples, the edge-case conventions, and context precision against a brute-force version."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from evalbeam.transforms.kernels import judge_scores as ks


def lp(p: float) -> float:
    return math.log(p)


def is_float(value) -> bool:
    return type(value) is float and not math.isnan(value)


# ---------------------------------------------------------------------------------------------
# verdicts and shares

@pytest.mark.parametrize("raw, normal", [
    ("yes", "yes"), ("  YES ", "yes"), ("No", "no"), ("IDK\n", "idk"), (True, "yes"), (False, "no"),
    (np.bool_(True), "yes"),
    ("y", None), ("yes.", None), ("maybe", None), ("", None), (None, None), (1, None), (0, None),
    (["yes"], None),
])
def test_verdict_of(raw, normal):
    assert ks.verdict_of(raw) == normal


def test_share_bias_and_toxicity_style():
    assert ks.share(["yes", "no", "no", "no"]) == 0.25
    assert ks.share([]) == 0.0                              # no opinions: not biased
    assert ks.share(["  YES ", "no"]) == 0.5                # case and whitespace
    assert ks.share(["yes", "idk", "no"]) == pytest.approx(1 / 3)   # idk is not "yes" by default
    assert ks.share([True, False, False, False, False]) == 0.2
    assert is_float(ks.share(["yes"]))


def test_share_answer_relevance_style():
    relevance = dict(positive=("yes", "idk"), empty=1.0)
    assert ks.share(["yes", "idk", "no", "no"], **relevance) == 0.5
    assert ks.share([], **relevance) == 1.0                 # no statements: relevant (DeepEval)
    assert ks.share(["no"], **relevance) == 0.0
    assert ks.share([], empty=None) is None


def test_share_invalid_verdict_is_none():
    assert ks.share(["yes", "perhaps"]) is None
    assert ks.share(["yes", None]) is None
    assert ks.share(["yes", 1]) is None
    assert ks.share(None) is None


# ---------------------------------------------------------------------------------------------
# answer correctness

def test_answer_correctness_values():
    # tp 2, fp 1, fn 1: 2 / (2 + 1) = 2/3
    assert ks.answer_correctness(["yes", "yes", "no"], ["yes", "no"]) == pytest.approx(2 / 3)
    # tp 3, fp 0, fn 0: 1
    assert ks.answer_correctness(["yes"] * 3, ["yes", "yes"]) == 1.0
    # tp 1, fp 2, fn 3: 1 / (1 + 2.5)
    assert ks.answer_correctness(["yes", "no", "no"], ["no", "no", "no", "yes"]) == pytest.approx(1 / 3.5)
    # idk is neither tp nor fp nor fn: tp 1, fp 0, fn 1 -> 1 / 1.5
    assert ks.answer_correctness(["yes", "idk"], ["no", "idk"]) == pytest.approx(2 / 3)
    # case and whitespace
    assert ks.answer_correctness([" Yes"], ["YES "]) == 1.0


def test_answer_correctness_edges():
    assert ks.answer_correctness(["no", "no"], ["yes"]) == 0.0        # tp = 0
    assert ks.answer_correctness(["idk"], ["no"]) == 0.0
    assert ks.answer_correctness([], ["yes", "no"]) == 0.0            # one side empty: tp = 0
    assert ks.answer_correctness(["yes"], []) == 1.0                  # tp 1, fp 0, fn 0
    assert ks.answer_correctness([], []) == 1.0                       # RAGAS
    assert ks.answer_correctness([], [], both_empty=None) is None
    assert ks.answer_correctness([], [], both_empty=0.0) == 0.0
    assert ks.answer_correctness(["yes", "sure"], ["yes"]) is None   # invalid verdict
    assert ks.answer_correctness(["yes"], ["nah"]) is None
    assert is_float(ks.answer_correctness(["yes"], ["yes"]))


def test_max_over_references():
    assert ks.max_over_references([0.25, None, 0.75, 0.5]) == 0.75
    assert ks.max_over_references([None, 0.0]) == 0.0
    assert ks.max_over_references([None, None]) is None
    assert ks.max_over_references([]) is None
    assert ks.max_over_references([float("nan"), 0.5]) == 0.5
    assert is_float(ks.max_over_references([np.float32(0.5)]))


# ---------------------------------------------------------------------------------------------
# context precision

def test_context_precision_valor_examples():
    assert ks.context_precision([["yes", "no", "no", "yes"]]) == 0.75
    assert ks.context_precision([["no", "yes", "no", "yes"]]) == 0.5


def test_context_precision_or_over_references():
    # aggregate verdicts: yes, yes, no, no -> (1 + 1) / 2 = 1
    assert ks.context_precision([["yes", "no", "no", "no"], ["no", "yes", "no", "no"]]) == 1.0
    # aggregate: no, yes, no, yes -> 0.5 (a single reference holding both "yes" would score the same)
    assert ks.context_precision([["no", "no", "no", "yes"], ["no", "yes", "no", "no"]]) == 0.5
    # not the max over references: alone they give 1.0 and 0.25; the OR (yes, no, no, yes) 0.75
    assert ks.context_precision([["yes", "no", "no", "no"]]) == 1.0
    assert ks.context_precision([["no", "no", "no", "yes"]]) == 0.25
    assert ks.context_precision([["yes", "no", "no", "no"], ["no", "no", "no", "yes"]]) == 0.75


def test_context_precision_edges():
    assert ks.context_precision([["no", "no", "idk"]]) == 0.0           # nothing useful
    assert ks.context_precision([["idk", "yes"]]) == 0.5                # idk counts as not useful
    assert ks.context_precision([["yes"]]) == 1.0                       # one context
    assert ks.context_precision([["no"]]) == 0.0
    assert ks.context_precision([[" YES ", True]]) == 1.0
    assert ks.context_precision([["yes", "maybe"]]) is None             # invalid verdict
    assert ks.context_precision([["yes", "no"], ["yes"]]) is None       # unequal lengths
    assert ks.context_precision([[]]) is None                           # no context
    assert ks.context_precision([]) is None                             # no reference
    assert is_float(ks.context_precision([["no", "yes", "yes"]]))
    # no, yes, yes: (1/2 + 2/3) / 2
    assert ks.context_precision([["no", "yes", "yes"]]) == pytest.approx((0.5 + 2 / 3) / 2)


def brute_context_precision(rows: list[list[str]]) -> Fraction | None:
    width = len(rows[0])
    useful = [1 if any(row[k] == "yes" for row in rows) else 0 for k in range(width)]
    ranks = [k for k in range(1, width + 1) if useful[k - 1]]
    if not ranks:
        return Fraction(0)
    total = Fraction(0)
    for k in ranks:
        hits = 0
        for i in range(1, k + 1):
            hits += useful[i - 1]
        total += Fraction(hits, k)
    return total / len(ranks)


@pytest.mark.parametrize("seed", range(5))
def test_context_precision_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        width = int(rng.integers(1, 12))
        references = int(rng.integers(1, 4))
        rows = [[str(v) for v in rng.choice(["yes", "no", "idk"], size=width, p=[0.2, 0.6, 0.2])]
                for _ in range(references)]
        got = ks.context_precision(rows)
        assert is_float(got)
        assert got == pytest.approx(float(brute_context_precision(rows)), abs=1e-12)


def test_context_precision_matches_average_precision():
    # all retrieved contexts ranked by position: AP over the ranking is the same quantity
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(7)
    for _ in range(50):
        width = int(rng.integers(1, 15))
        labels = rng.integers(0, 2, size=width)
        if labels.sum() == 0:
            continue
        row = ["yes" if v else "no" for v in labels]
        expected = sklearn_metrics.average_precision_score(labels, -np.arange(width))
        assert ks.context_precision([row]) == pytest.approx(expected, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# harmonic mean

def test_harmonic_mean():
    assert ks.harmonic_mean([0.5, 0.5]) == 0.5
    assert ks.harmonic_mean([1.0, 0.5]) == pytest.approx(2 / 3)           # 2 / (1 + 2)
    assert ks.harmonic_mean([1.0, 0.5, 0.25, 1.0]) == pytest.approx(4 / 8)  # 4 / (1 + 2 + 4 + 1)
    assert ks.harmonic_mean([0.8]) == pytest.approx(0.8)
    assert ks.harmonic_mean([0.9, 0.0, 0.7]) == 0.0
    assert ks.harmonic_mean([0.9, None, 0.7]) is None
    assert ks.harmonic_mean([0.0, None]) is None                         # None wins over 0
    assert ks.harmonic_mean([]) is None
    assert ks.harmonic_mean([0.5, float("nan")]) is None
    assert ks.harmonic_mean([0.5, -0.5]) is None
    assert is_float(ks.harmonic_mean([1, 1]))


# ---------------------------------------------------------------------------------------------
# ratings

FIVE = (1, 2, 3, 4, 5)
NV = (0, 2, 4)


@pytest.mark.parametrize("text, allowed, rating", [
    ("4", FIVE, 4),
    ("4.0", FIVE, 4),          # RAGAS's legacy scan read this as 0
    (" 4 ", FIVE, 4),
    ("4.", FIVE, 4),
    ("4.00\n", FIVE, 4),
    ("Rating: 2", NV, 2),
    ("**Score: 4**", NV, 4),
    ("4 (I said 4.0)", NV, 4),  # one distinct value
    ("score-4", NV, 4),         # a hyphen after a letter is not a sign
    ("+2", NV, 2),
    ("0", NV, 0),
    ("-0", NV, 0),             # decided: the sign of zero means nothing
    ("-0", FIVE, None),        # ... and 0 is not allowed here
    ("-2", NV, None),
    ("2.5", FIVE, None),
    (".5", FIVE, None),
    ("2 or 4", NV, None),
    ("0-2", (0, 1, 2), None),
    ("4/5", FIVE, None),
    ("H2O gets 4", NV, None),  # digits inside a word are tokens too
    ("3", NV, None),
    ("6", FIVE, None),
    ("", FIVE, None),
    ("four", FIVE, None),
    (None, FIVE, None),
    (4, FIVE, None),
    ({"rating": 4}, FIVE, None),
])
def test_parse_rating(text, allowed, rating):
    got = ks.parse_rating(text, allowed)
    assert got == rating
    assert got is None or type(got) is int


def test_nv_combine():
    assert ks.nv_combine(4, 2, 4) == 0.75
    assert ks.nv_combine(0, 0, 4) == 0.0
    assert ks.nv_combine(2, 1, 2) == 0.75
    # the same result whichever rating is invalid (the legacy max(nan, x) depended on the order)
    assert ks.nv_combine(None, 2, 4) == 0.5
    assert ks.nv_combine(2, None, 4) == 0.5
    assert ks.nv_combine(None, None, 4) is None
    # out of range, bools and floats are invalid ratings
    assert ks.nv_combine(5, 2, 4) == 0.5
    assert ks.nv_combine(True, 2, 4) == 0.5
    assert ks.nv_combine(2.0, None, 4) is None
    assert is_float(ks.nv_combine(np.int64(4), 4, 4))
    with pytest.raises(ValueError):
        ks.nv_combine(1, 1, 0)


# ---------------------------------------------------------------------------------------------
# G-Eval

def token(text: str, p: float, top: dict | None = None) -> dict:
    return {"token": text, "logprob": lp(p),
            "top_logprobs": [{"token": t, "logprob": lp(q)} for t, q in (top or {}).items()]}


def test_geval_expectation():
    logprobs = [token(" 4", 0.6, {"4": 0.6, "3": 0.3, "5": 0.1})]
    value, method, mass = ks.geval_score(logprobs)
    assert (method, value, mass) == ("logprobs", pytest.approx(3.8), pytest.approx(1.0))
    assert is_float(value) and is_float(mass)


def test_geval_listed_score_is_not_added_twice():
    # " 4" was chosen and "4" is listed: the listed one stands for 4, " 4" is not added on top
    logprobs = [token(" 4", 0.6, {"4": 0.5, " 3": 0.5})]
    value, method, mass = ks.geval_score(logprobs)
    assert (method, value, mass) == ("logprobs", pytest.approx(3.5), pytest.approx(1.0))


def test_geval_whitespace_tokens_add_up():
    # " 4" and "4" are different tokens for the same score; "\n5" is 5
    logprobs = [token(" 4", 0.5, {" 4": 0.5, "4": 0.1, " 2": 0.2, "\n5": 0.2})]
    value, method, mass = ks.geval_score(logprobs)
    assert method == "logprobs"
    assert mass == pytest.approx(1.0)
    assert value == pytest.approx(4 * 0.6 + 2 * 0.2 + 5 * 0.2)


def test_geval_ignores_other_tokens_and_renormalises():
    # "The", "four", "6" (not allowed), "04" and "4." are not scores: kept mass 0.6
    logprobs = [token("4", 0.4, {"4": 0.4, "The": 0.2, " 3": 0.2, "four": 0.05, "6": 0.05,
                                  "04": 0.05, "4.": 0.05})]
    value, method, mass = ks.geval_score(logprobs)
    assert method == "logprobs"
    assert mass == pytest.approx(0.6)
    assert value == pytest.approx((4 * 0.4 + 3 * 0.2) / 0.6)


def test_geval_first_score_token_and_own_token_added():
    # the prefix tokens are skipped; "10" is not an allowed score; the first score token is " 4",
    # missing from its own top_logprobs, so it is added: (4 * 0.5 + 3 * 0.25) / 0.75
    logprobs = [token("Score", 0.9), token(":", 0.9), token(" 10", 0.9, {" 10": 0.9}),
                token(" 4", 0.5, {"3": 0.25, "x": 0.25}), token(" 2", 0.9, {" 2": 0.9})]
    value, method, mass = ks.geval_score(logprobs)
    assert method == "logprobs"
    assert mass == pytest.approx(0.75)
    assert value == pytest.approx(2.75 / 0.75)


def test_geval_low_mass_falls_back_to_integer():
    logprobs = [token(" 4", 0.3, {" 4": 0.3, "A": 0.7})]
    value, method, mass = ks.geval_score(logprobs)
    assert (value, method) == (4.0, "integer")
    assert mass == pytest.approx(0.3)
    assert is_float(value)
    # a lower threshold accepts the same answer
    value, method, _ = ks.geval_score(logprobs, min_mass=0.2)
    assert (value, method) == (pytest.approx(4.0), "logprobs")


def test_geval_without_top_logprobs_uses_the_token():
    # the token alone, p = 0.9 >= 0.5: expectation over one score is that score
    value, method, mass = ks.geval_score([{"token": "3", "logprob": lp(0.9)}])
    assert (value, method, mass) == (3.0, "logprobs", pytest.approx(0.9))


def test_geval_fallback_to_text():
    assert ks.geval_score(None, text="Coherence: 4") == (4.0, "integer", 0.0)
    assert ks.geval_score([], text=" 2 ") == (2.0, "integer", 0.0)
    # logprobs without any score token: the text decides
    assert ks.geval_score([token("Good", 0.9)], text="5") == (5.0, "integer", 0.0)
    assert ks.geval_score(None, text="4.0") == (4.0, "integer", 0.0)
    assert ks.geval_score(None, text="3 or 4") == (None, "none", 0.0)
    assert ks.geval_score(None, text="7") == (None, "none", 0.0)
    assert ks.geval_score(None) == (None, "none", 0.0)
    assert ks.geval_score([token("Good", 0.9)]) == (None, "none", 0.0)


def test_geval_other_scale():
    logprobs = [token(" 2", 0.5, {" 2": 0.5, " 0": 0.25, " 1": 0.25})]
    value, method, _ = ks.geval_score(logprobs, allowed=(0, 1, 2))
    assert (value, method) == (pytest.approx(1.25), "logprobs")


# ---------------------------------------------------------------------------------------------
# cosines, sentences and embedding metrics

def test_cosine():
    assert ks.cosine([1, 0], [1, 1]) == pytest.approx(1 / math.sqrt(2))
    assert ks.cosine([1, 2, 3], [4, 5, 6]) == pytest.approx(32 / (math.sqrt(14) * math.sqrt(77)))
    assert ks.cosine([1, 0], [-1, 0]) == -1.0
    assert ks.cosine([0, 1], [1, 0]) == 0.0
    assert ks.cosine(np.array([3.0, 4.0]), [3, 4]) <= 1.0            # clipped
    assert ks.cosine([1e-3, 1e-3], [5.0, 5.0]) == pytest.approx(1.0)
    assert is_float(ks.cosine(np.array([1.0, 2.0]), np.array([2.0, 1.0])))


@pytest.mark.parametrize("seed", range(3))
def test_cosine_does_not_depend_on_the_order_of_addition(seed):
    """The sums are correctly rounded, so the cosine is the same whatever order they are added
    in: here any permutation of the coordinates; in practice the CPU's vector width, which
    changes the order numpy's dot adds in (AVX-512 and AVX2 machines gave different last bits).
    Each sum of the (rounded) elementwise products equals its exact value rounded once."""
    from fractions import Fraction

    rng = np.random.default_rng(seed)
    x = rng.normal(size=1536) * np.exp(rng.normal(size=1536) * 3)
    y = rng.normal(size=1536) * np.exp(rng.normal(size=1536) * 3)
    value = ks.cosine(x, y)
    for _ in range(5):
        perm = rng.permutation(x.size)
        assert ks.cosine(x[perm], y[perm]) == value
    def exact(products):
        return float(sum(Fraction(v) for v in products.tolist()))

    norm = math.sqrt(exact(x * x)) * math.sqrt(exact(y * y))
    assert value == min(1.0, max(-1.0, exact(x * y) / norm))


@pytest.mark.parametrize("a, b", [
    ([0, 0], [1, 1]), ([1, 1], [0.0, 0.0]), (None, [1, 0]), ([], []), ([1, 0], [1, 0, 0]),
    ([1, float("nan")], [1, 0]), ([[1, 0]], [[1, 0]]), ("ab", [1, 0]),
])
def test_cosine_not_computable(a, b):
    assert ks.cosine(a, b) is None


def test_split_sentences():
    assert ks.split_sentences("Hi there. How are you?\nFine!") == ["Hi there.", "How are you?", "Fine!"]
    # a stop needs whitespace after it: the decimal and the domain stay in their sentence
    assert ks.split_sentences("It costs 3.5 euros at shop.example.com today. Buy it!") == [
        "It costs 3.5 euros at shop.example.com today.", "Buy it!"]
    assert ks.split_sentences("Wait... what?!  Really.\r\n\n- \n...\n  ") == ["Wait...", "what?!", "Really."]
    assert ks.split_sentences("No stop at the end") == ["No stop at the end"]
    assert ks.split_sentences("e.g. this") == ["e.g.", "this"]
    assert ks.split_sentences("") == []
    assert ks.split_sentences(" . ! ") == []
    assert ks.split_sentences(None) == []


def test_answer_similarity_and_sentence_relevancy():
    response = [1.0, 0.0]
    refs = [[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]        # cosines 0, 1/sqrt2, None
    assert ks.answer_similarity(response, refs) == pytest.approx(1 / math.sqrt(2))
    assert ks.answer_similarity(response, []) is None
    assert ks.answer_similarity(response, [[0, 0]]) is None
    assert ks.answer_similarity(None, refs) is None
    query = [1.0, 0.0, 0.0]
    sentences = [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]   # 0, 1/sqrt2, 1/sqrt3
    assert ks.sentence_relevancy(query, sentences) == pytest.approx(1 / math.sqrt(2))
    assert ks.sentence_relevancy(query, []) is None


def test_groundedness_min_of_max():
    answer = [[1.0, 0.0], [0.0, 1.0]]
    context = [[1.0, 0.0], [1.0, 1.0]]
    # sentence 1: max(1, 1/sqrt2) = 1; sentence 2: max(0, 1/sqrt2) = 1/sqrt2; min = 1/sqrt2
    assert ks.groundedness(answer, context) == pytest.approx(1 / math.sqrt(2))
    # a third answer sentence opposite to everything: max(-1, -1/sqrt2) = -1/sqrt2 is the min
    assert ks.groundedness(answer + [[-1.0, 0.0]], context) == pytest.approx(-1 / math.sqrt(2))
    # an answer sentence without any computable cosine is left out
    assert ks.groundedness(answer + [[0.0, 0.0]], context) == pytest.approx(1 / math.sqrt(2))
    assert ks.groundedness([], context) is None
    assert ks.groundedness(answer, []) is None
    assert ks.groundedness([[0.0, 0.0]], context) is None


def test_context_relevancy_recall_and_precision():
    query = [1.0, 0.0]
    chunks = [
        [[1.0, 0.0], [0.0, 1.0]],       # best 1
        [[1.0, 1.0]],                   # best 1/sqrt2
        [],                             # skipped
        [[0.0, 1.0], [-1.0, 0.0]],      # best 0
    ]
    recall, precision = ks.context_relevancy(query, chunks)
    assert recall == 1.0
    assert precision == pytest.approx((1 + 1 / math.sqrt(2) + 0) / 3)
    assert ks.context_relevancy(query, [[], []]) == (None, None)
    assert ks.context_relevancy(query, []) == (None, None)
    assert ks.context_relevancy([0.0, 0.0], chunks) == (None, None)
    assert ks.context_relevancy(query, [[[0.5, 0.0]]]) == (1.0, 1.0)


def test_answer_correctness_blend():
    assert ks.answer_correctness_blend(0.8, 0.4) == pytest.approx(0.75 * 0.8 + 0.25 * 0.4)
    assert ks.answer_correctness_blend(0.8, 0.4, (1, 1)) == pytest.approx(0.6)
    assert ks.answer_correctness_blend(0.8, 0.4, (3, 1)) == pytest.approx(0.7)
    assert ks.answer_correctness_blend(0.8, None, (1, 0)) == 0.8
    assert ks.answer_correctness_blend(None, 0.4, (0, 1)) == 0.4
    assert ks.answer_correctness_blend(0.8, None) is None
    assert ks.answer_correctness_blend(None, 0.4) is None
    assert ks.answer_correctness_blend(None, None, (1, 0)) is None
    assert is_float(ks.answer_correctness_blend(1, 0))
    for weights in ((0, 0), (-1, 2)):
        with pytest.raises(ValueError):
            ks.answer_correctness_blend(0.5, 0.5, weights)
