"""Looping detection: the sentence rule, the three metrics (the longest repeated substring against
a brute-force oracle) and the pass/fail rule."""

from __future__ import annotations

import random
import zlib

import pytest

from evalbeam.transforms.kernels.looping import (THRESHOLDS, compression_ratio, longest_repeated_substring,
                                        looping_metrics, looping_verdict, lrs_ratio,
                                        split_sentences, unique_sentences)

PROSE = ("Brazil reported revenue of 15,969 million in the last fiscal year. The growth came mostly "
         "from exports of soybeans and iron ore. Analysts expect a slower pace next year, citing "
         "weaker demand from China. The central bank kept its policy rate unchanged in March.")


@pytest.mark.parametrize("text, sentences", [
    ("", []),
    ("   \n ", []),
    ("One sentence without a stop", ["One sentence without a stop"]),
    ("First one. Second one! Third one? Fourth…", ["First one.", "Second one!", "Third one?", "Fourth…"]),
    ('He said "stop." Then left. (Really.) Yes', ['He said "stop."', "Then left.", "(Really.)", "Yes"]),
    ("line one\nline two\r\n\n  line three", ["line one", "line two", "line three"]),
    ("pi is 3.14 and example.com works. Next", ["pi is 3.14 and example.com works.", "Next"]),
    ("e.g. this splits", ["e.g.", "this splits"]),
    ("Wait...  what?!   Ok", ["Wait...", "what?!", "Ok"]),
    ("a   b\t c", ["a b c"]),
])
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_unique_sentences():
    assert unique_sentences(PROSE) == 1.0
    looped = "I am looping now. " * 3 + "This is something else."
    assert unique_sentences(looped) == pytest.approx(2 / 4)
    # Sentences shorter than 10 characters are ignored (both in the numerator and denominator).
    assert unique_sentences("Yes. Yes. Yes. Yes. A longer sentence here.") == 1.0
    assert unique_sentences("Ok. Ok. Sure.") == 1.0           # no qualifying sentence
    assert unique_sentences("") == 1.0
    assert unique_sentences("123456789. 123456789.") == 0.5    # 10 characters with the stop
    assert unique_sentences("12345678. 12345678.") == 1.0      # 9 characters: ignored
    assert unique_sentences("Same  words here.\nSame words   here.") == 0.5   # whitespace collapsed
    assert unique_sentences("Case Differs Here. case differs here.") == 1.0
    assert unique_sentences("Yes. Yes. Yes.", min_chars=1) == pytest.approx(1 / 3)


def brute_lrs(text: str) -> tuple[int, int, int]:
    n = len(text)
    for length in range(n // 2, 0, -1):
        best = None
        for i in range(n - length + 1):
            piece = text[i:i + length]
            if text.find(piece) != i:
                continue
            count, at = 0, 0
            while (at := text.find(piece, at)) >= 0:
                count += 1
                at += length
            if count >= 2 and (best is None or count > best[2]):
                best = (i, length, count)
        if best:
            return best
    return 0, 0, 0


def test_longest_repeated_substring_matches_brute_force():
    rng = random.Random(11)
    for _ in range(1500):
        alphabet = rng.choice(["ab", "abc", "abcdefgh", "aé😀 "])
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 28)))
        assert longest_repeated_substring(text) == brute_lrs(text), text


@pytest.mark.parametrize("text, expected, ratio", [
    ("", (0, 0, 0), 0.0),
    ("a", (0, 0, 0), 0.0),
    ("abcd", (0, 0, 0), 0.0),
    ("aa", (0, 1, 2), 1.0),
    ("abab", (0, 2, 2), 1.0),
    ("abababab", (0, 4, 2), 1.0),        # non-overlapping: "abab" twice, not "ababab" twice
    ("aaaaa", (0, 2, 2), 0.8),
    ("abcabcabc", (0, 3, 3), 1.0),
    ("xabcyabcz", (1, 3, 2), 6 / 9),
    ("ab ab cd cd", (0, 3, 2), 6 / 11),   # "ab " (first), tie with " cd" broken by count, then position
    ("😀é😀é", (0, 2, 2), 1.0),             # characters, not bytes
])
def test_lrs_examples(text, expected, ratio):
    assert longest_repeated_substring(text) == expected
    assert lrs_ratio(text) == pytest.approx(ratio)


def test_compression_ratio():
    assert compression_ratio("") == 1.0
    data = PROSE.encode()
    assert compression_ratio(PROSE) == len(zlib.compress(data, 9)) / len(data)
    assert compression_ratio("loop " * 2000) < 0.01
    assert compression_ratio("é") > 1                      # zlib overhead on tiny texts
    assert compression_ratio("東京") == len(zlib.compress("東京".encode(), 9)) / 6


def test_metrics_and_verdict():
    metrics = looping_metrics(PROSE)
    assert set(metrics) == {"unique_sentences", "longest_repeated_substring", "compression_ratio"}
    assert looping_verdict(metrics) == (True, ())
    looped = "The answer is 42. " * 30
    metrics = looping_metrics(looped)
    assert metrics["unique_sentences"] == pytest.approx(1 / 30)
    assert metrics["longest_repeated_substring"] > 0.9
    passed, reasons = looping_verdict(metrics)
    assert not passed
    assert reasons == ("unique_sentences 0.033 < 0.75",
                       f"longest_repeated_substring {metrics['longest_repeated_substring']:.3f} > 0.75")


def test_verdict_thresholds_are_inclusive_on_the_good_side():
    edge = {"unique_sentences": 0.75, "longest_repeated_substring": 0.75, "compression_ratio": 0.1}
    assert looping_verdict(edge) == (True, ())
    worse = {"unique_sentences": 0.7499, "longest_repeated_substring": 0.7501, "compression_ratio": 1}
    assert len(looping_verdict(worse)[1]) == 2
    assert looping_verdict(edge, {"compression_ratio": (0.75, True)})[0] is False
    assert set(THRESHOLDS) == {"unique_sentences", "longest_repeated_substring"}


def test_looping_inside_one_sentence_is_caught_by_lrs():
    text = "Sure, " + "and then " * 40 + "done."
    metrics = looping_metrics(text)
    assert metrics["unique_sentences"] == 1.0
    assert metrics["longest_repeated_substring"] > 0.75
    assert not looping_verdict(metrics)[0]
