"""Linear-time evidence: each scan on an input 4x larger must take less than 8x the time (a
quadratic scan takes about 16x). Growth ratios, not absolute times, so that a slow or busy
machine does not fail them; each ratio gets three attempts before it counts as a failure."""

from __future__ import annotations

import random
import time

import pytest

from evalbeam.transforms.kernels.conditions import parse_condition
from evalbeam.transforms.kernels.leakage import find_encoded, find_pii, find_sensitive_data
from evalbeam.transforms.kernels.looping import longest_repeated_substring, looping_metrics, split_sentences

GROWTH = 4
LIMIT = 8.0
FLOOR = 0.002   # seconds: below this, timer noise dominates the small run


def best_time(function, argument, repeat: int = 2) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function(argument)
        best = min(best, time.perf_counter() - start)
    return best


def assert_linear(function, make, size: int) -> None:
    small, large = make(size), make(size * GROWTH)
    ratios = []
    for _ in range(3):
        ratio = best_time(function, large) / max(best_time(function, small), FLOOR)
        ratios.append(ratio)
        if ratio < LIMIT:
            return
    pytest.fail(f"{getattr(function, '__name__', function)}: x{GROWTH} input took "
                f"x{min(ratios):.1f} time (attempts {[round(r, 1) for r in ratios]})")


def repeat_to(unit: str):
    return lambda size: (unit * (size // len(unit) + 1))[:size]


def scan_all(text: str) -> None:
    find_pii(text)
    find_sensitive_data(text)
    find_encoded(text)
    split_sentences(text)


# The brief's own examples at 50k -> 200k characters.
@pytest.mark.parametrize("unit", ["7", "@", "QUJD"], ids=["digits", "at-signs", "base64-run"])
def test_adversarial_200k(unit):
    assert_linear(scan_all, repeat_to(unit), 50_000)


ADVERSARIAL = {
    "dashes": "-", "spaces": " ", "newlines": "\n", "dots": ".", "a@": "a@", "x@y.": "x@y.",
    "emails": "a@b.co ", "spaced-digits": "4 ", "dashed-digits": "1-", "plus-one": "+1 ",
    "parens": "(555) ", "ssn-chain": "123-45-", "cards": "4111 1111 1111 1111 ",
    "pem-headers": "-----BEGIN PRIVATE KEY-----\n", "sk-": "sk-", "url-colons": "a://b:",
    "url-userinfo": "a://:b@", "hex": "ab", "hex-pairs": "4a ", "key-groups": "BCDFG-",
    "akia": "AKIA", "aws-label": "aws_secret_access_key=", "base64-url": "QU-_",
}


@pytest.mark.parametrize("unit", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_adversarial_scans(unit):
    assert_linear(scan_all, repeat_to(unit), 25_000)


def test_truncated_pem_with_huge_body():
    def make(size):
        return "-----BEGIN RSA PRIVATE KEY-----\n" + "A" * size + " tail"
    assert_linear(scan_all, make, 50_000)


def test_condition_on_one_megabyte():
    condition = parse_condition('("Brazil" OR "brazil") AND regexp("15,?969 [Mm]illion") '
                                'OR regexp("(a|b)*c") OR regexp("(x+x+)+y") OR NOT "zz"')
    rng = random.Random(3)
    base = "".join(rng.choice("ab x") for _ in range(1 << 18))

    def make(size):
        return (base * (size // len(base) + 1))[:size]
    assert_linear(condition.matches, make, 250_000)


def test_condition_with_thousands_of_terms():
    text = "lorem ipsum " * 2_000

    def run(n_terms):
        condition = parse_condition(" OR ".join(
            f'"w{i}x" AND NOT regexp("v{i}[0-9]")' for i in range(n_terms)))
        condition.matches(text)

    assert_linear(run, lambda size: size, 1_000)


def test_deep_nesting_parses_in_linear_time():
    def run(depth):
        parse_condition("(" * depth + "NOT " * depth + '"a"' + ")" * depth).matches("b")

    assert_linear(run, lambda size: size, 2_500)


@pytest.mark.parametrize("kind", ["random", "looping", "one-letter"])
def test_longest_repeated_substring_is_near_linear(kind):
    rng = random.Random(7)

    def make(size):
        if kind == "random":
            return "".join(rng.choice("abcdefghij klmnop") for _ in range(size))
        if kind == "looping":
            return ("The quick brown fox jumps over the lazy dog. " * (size // 45 + 1))[:size]
        return "a" * size
    assert_linear(longest_repeated_substring, make, 25_000)


def test_looping_metrics_on_100k():
    text = "".join(random.Random(2).choice(["Ok. ", "Right then.\n", "x" * 30 + " "])
                   for _ in range(4_000))
    assert_linear(looping_metrics, lambda size: text[:size], 25_000)
