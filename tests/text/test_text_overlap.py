"""ROUGE and BLEU kernels against rouge-score, nltk and sacreBLEU, value for value."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest

from evalbeam.transforms.kernels.text_overlap import (ROUGE_TYPES, corpus_bleu, corpus_bleu_stats, lcs_length,
                                             rouge, sentence_bleu, valor_tokens)

WORDS = ["the", "a", "of", "cat", "cats", "running", "runs", "ran", "dog", "über", "naïve", "café",
         "東京", "$100", "3.14", "e.g.", "U.S.A", "don't", "state-of-the-art", "Revenue", "revenue",
         "was", "15,969", "million", "!", "?", "…", "😀", "x", "y", "z"]


def random_text(rng: random.Random, max_words: int = 40, lines: bool = True) -> str:
    n = rng.choice([0, 1, 2, rng.randint(3, max_words)])
    words = [rng.choice(WORDS) for _ in range(n)]
    if lines and n > 3 and rng.random() < 0.3:
        words.insert(rng.randint(1, n - 1), "\n")
    text = " ".join(words)
    return text + rng.choice(["", ".", " .", "\n", "  "])


def cases(seed: int, n: int = 300):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        references = [random_text(rng) for _ in range(rng.choice([1, 1, 2, 3, 6]))]
        base = rng.choice(references).split(" ")
        prediction = " ".join(w if rng.random() < 0.7 else rng.choice(WORDS) for w in base
                              if rng.random() < 0.9) if rng.random() < 0.8 else random_text(rng)
        out.append((prediction, references))
    out += [("", ["a b c"]), ("a b c", [""]), ("", [""]), ("x", ["x"]), ("x", ["y"]),
            ("the cat", ["the cat", "the cat"]), ("\n\n", ["a\n\nb"]), ("!!!", ["???"])]
    return out


def test_lcs_length_equals_dynamic_programming():
    rng = random.Random(0)
    for _ in range(500):
        a = [rng.choice("abcd") for _ in range(rng.randint(0, 30))]
        b = [rng.choice("abcd") for _ in range(rng.randint(0, 80))]   # > 64 bits too
        table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                table[i][j] = (table[i - 1][j - 1] + 1 if a[i - 1] == b[j - 1]
                               else max(table[i - 1][j], table[i][j - 1]))
        assert lcs_length(a, b) == table[-1][-1]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("use_stemmer", [False, True])
def test_rouge_equals_rouge_score(seed, use_stemmer):
    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)
    for prediction, references in cases(seed):
        ours = rouge(prediction, references, ROUGE_TYPES, use_stemmer)
        theirs = scorer.score_multi(references, prediction)
        for rouge_type in ROUGE_TYPES:
            s = theirs[rouge_type]
            assert ours[rouge_type] == (s.precision, s.recall, s.fmeasure), (rouge_type, prediction, references)


@pytest.mark.parametrize("seed", range(3))
def test_summary_level_lcs_equals_rouge_score_on_many_lines(seed):
    """Multi-line texts over three words: many equal-length LCS paths, so the walk back
    through the table must pick the same tokens as rouge-score's for the union to agree."""
    from rouge_score.rouge_scorer import _summary_level_lcs

    from evalbeam.transforms.kernels.text_overlap import summary_level_lcs

    rng = random.Random(seed)

    def sentences():
        return [[rng.choice("abc") for _ in range(rng.choice([0, 1, rng.randint(2, 12)]))]
                for _ in range(rng.choice([0, 1, rng.randint(2, 6)]))]

    for _ in range(400):
        references, candidates = sentences(), sentences()
        theirs = _summary_level_lcs(references, candidates)
        assert summary_level_lcs(references, candidates) == \
            (theirs.precision, theirs.recall, theirs.fmeasure), (references, candidates)


def test_rouge_without_stemming_does_not_import_nltk():
    """nltk (and through it scipy and scikit-learn, when installed) costs seconds per worker
    process; only --rouge_use_stemmer needs it."""
    import subprocess
    import sys

    code = ("import sys; from evalbeam.transforms.kernels.text_overlap import rouge; "
            "rouge('a b\\nc d', ['a c\\nb d', 'x']); print('nltk' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_rouge_without_references_and_bad_types():
    assert rouge("a b", []) == {t: (0.0, 0.0, 0.0) for t in ROUGE_TYPES}
    assert set(rouge("a b", ["a"], ("rouge3",))) == {"rouge3"}
    with pytest.raises(ValueError, match="unknown ROUGE type"):
        rouge("a", ["a"], ("rougeW",))


@pytest.mark.parametrize("weights", [(0.25, 0.25, 0.25, 0.25), (0.5, 0.5), (1.0,), (0.1, 0.3, 0.5, 0.1),
                                     (0.2,) * 5])
def test_sentence_bleu_equals_nltk_as_valor_calls_it(weights):
    from nltk.translate import bleu_score

    for prediction, references in cases(7, 200):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # nltk warns for every order without matches
            expected = float(bleu_score.sentence_bleu([valor_tokens(r) for r in references],
                                                      valor_tokens(prediction), weights=weights))
        expected = expected if expected >= 1e-9 else 0.0
        assert sentence_bleu(prediction, references, weights) == expected, (prediction, references)


def test_sentence_bleu_by_hand():
    # identical 4-token texts: every precision 1, BP 1
    assert sentence_bleu("the cat sat down", ["the cat sat down"]) == 1.0
    # no bigram match at all: nltk's float_info.min makes it ~1e-77, Valor's rule makes it 0
    assert sentence_bleu("the cat", ["cat the"]) == 0.0
    assert sentence_bleu("", ["a"]) == 0.0 and sentence_bleu("a", []) == 0.0
    with pytest.raises(ValueError):
        sentence_bleu("a", ["a"], ())


@pytest.mark.parametrize("seed", range(3))
def test_corpus_bleu_equals_sacrebleu(seed):
    import sacrebleu

    data = cases(seed + 10, 150)
    width = max(len(refs) for _, refs in data)
    streams = [[refs[i] if i < len(refs) else None for _, refs in data] for i in range(width)]
    expected = sacrebleu.corpus_bleu([p for p, _ in data], streams)
    stats = sum(corpus_bleu_stats(p, refs) for p, refs in data)
    # shards: statistics of parts add up to the same score
    parts = [sum(corpus_bleu_stats(p, refs) for p, refs in data[i::3]) for i in range(3)]
    assert np.array_equal(sum(parts), stats)
    ours = corpus_bleu(stats)
    assert ours["score"] == pytest.approx(expected.score, abs=1e-12)
    assert ours["precisions"] == pytest.approx(expected.precisions, abs=1e-12)
    assert ours["bp"] == pytest.approx(expected.bp, abs=1e-12)
    assert (ours["sys_len"], ours["ref_len"]) == (expected.sys_len, expected.ref_len)


def test_corpus_bleu_degenerate():
    assert corpus_bleu(np.zeros(10, np.int64))["score"] == 0.0
    assert corpus_bleu_stats("a b", []).sum() == 0
    perfect = corpus_bleu(corpus_bleu_stats("the cat sat on the mat .", ["the cat sat on the mat ."]))
    assert perfect["score"] == pytest.approx(100.0)


def test_exact_sum_is_independent_of_order_and_merging():
    import math

    from evalbeam.transforms.kernels.exact_sum import ExactSum

    rng = random.Random(4)
    values = [rng.random() * 10 ** rng.randint(-8, 8) * rng.choice([1, -1]) for _ in range(2000)]
    expected = math.fsum(values)
    for _ in range(5):
        rng.shuffle(values)
        parts = [ExactSum() for _ in range(rng.randint(1, 7))]
        for i, v in enumerate(values):
            parts[i % len(parts)].add(v)
        total = parts[0]
        for part in parts[1:]:
            total.merge(part)
        assert total.value() == expected and total.n == len(values)
    assert ExactSum().mean() == 0.0 and ExactSum().add(2.0).add(4.0).mean() == 3.0


def test_exact_totals_equal_fsum_in_any_split():
    import math

    from evalbeam.transforms.kernels.exact_sum import exact_totals, merge_totals, total_value

    rng = np.random.default_rng(3)
    values = rng.random(10_000) * 10.0 ** rng.integers(-12, 12, 10_000) * rng.choice([-1, 1], 10_000)
    values[:50] = 0.0
    expected = math.fsum(values.tolist())
    for parts in (1, 3, 16):
        shuffled = rng.permutation(values)
        totals = {}
        for chunk in np.array_split(shuffled, parts):
            totals = merge_totals(totals, exact_totals(chunk))
        assert total_value(totals) == expected
    assert total_value(exact_totals(np.array([1e308, 1e308, -1e308]))) == 1e308
    assert total_value({}) == 0.0
