"""The BERTScore kernel (transforms/kernels/bertscore.py) against a plain loop over the formula,
on random vectors and weights (several seeds, repeated vectors for ties), and its edges. The
bert-score package itself needs torch, which the test extras leave out: test_reference_models.py
checks the pipeline against the package's values on a RoBERTa, and test_log_likelihood.py
against ONNX Runtime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evalbeam.transforms.kernels import bertscore as bs


def loop_scores(c, r, wc, wr, sc, sr):
    """Every token a candidate for the max, only the words (not special) averaged."""
    def cos(a, b):
        return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    words_c = [(x, w) for x, w, s in zip(c, wc, sc) if not s]
    words_r = [(y, w) for y, w, s in zip(r, wr, sr) if not s]
    p = sum(w * max(cos(x, y) for y in r) for x, w in words_c) / sum(w for _, w in words_c)
    rec = sum(w * max(cos(x, y) for x in c) for y, w in words_r) / sum(w for _, w in words_r)
    return p, rec, 2 * p * rec / (p + rec)


@pytest.mark.parametrize("seed", range(6))
def test_weighted_scores_match_a_loop(seed):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(int(rng.integers(3, 10)), 5))
    r = rng.normal(size=(int(rng.integers(3, 10)), 5))
    r[1] = c[1] * 3.0                      # a tie at cosine 1
    # [CLS] first and [SEP] last on both sides, as a BERT tokenizer adds them; the reference's
    # [SEP] is a copy of a candidate word, so that it is that word's best match
    sc = np.zeros(len(c), bool)
    sr = np.zeros(len(r), bool)
    sc[[0, -1]] = sr[[0, -1]] = True
    r[-1] = c[2]
    ids_c, ids_r = rng.integers(0, 6, len(c)), rng.integers(0, 6, len(r))
    documents, df = 7, {int(t): int(rng.integers(0, 8)) for t in range(4)}
    wc, wr = bs.idf(ids_c, documents, df), bs.idf(ids_r, documents, df)
    want = [math.log(8 / (df.get(int(t), 0) + 1)) for t in ids_c]
    assert np.allclose(wc, want)
    for wc_, wr_ in ((None, None), (wc, wr)):
        for sc_, sr_ in ((None, None), (sc, sr)):
            ones_c, ones_r = np.zeros(len(c), bool), np.zeros(len(r), bool)
            kc = np.ones(len(c)) if wc_ is None else wc_
            kr = np.ones(len(r)) if wr_ is None else wr_
            if (kc[~(ones_c if sc_ is None else sc_)].sum() == 0
                    or kr[~(ones_r if sr_ is None else sr_)].sum() == 0):
                continue
            expect = loop_scores(c, r, kc, kr, ones_c if sc_ is None else sc_, ones_r if sr_ is None else sr_)
            assert np.allclose(bs.scores(c, r, wc_, wr_, sc_, sr_), expect, rtol=1e-12)
    # the special tokens change the result: they are candidates of the max, not averaged
    with_special = bs.scores(c, r, None, None, sc, sr)
    assert not np.allclose(with_special, bs.scores(c[1:-1], r[1:-1]))
    assert not np.allclose(with_special, bs.scores(c, r))


def test_edges():
    c = np.eye(3)
    assert bs.scores(np.zeros((0, 3)), c) == (0.0, 0.0, 0.0)
    # an empty text is its special tokens alone: 0 for every component (bert-score's rule),
    # though its [CLS] and [SEP] match the other side's words
    specials = np.array([True, False, True])
    assert bs.scores(c[[0, 2]], c, None, None, [True, True], specials) == (0.0, 0.0, 0.0)
    assert bs.scores(c, c[[0, 2]], None, None, specials, [True, True]) == (0.0, 0.0, 0.0)
    # a special token's weight is 0 whatever the weights given say
    assert bs.scores(c, c, np.full(3, 5.0), None, specials, specials) == (1.0, 1.0, 1.0)
    # every token in every reference: idf 0 everywhere, the component is 0 (bert-score: NaN)
    zero = bs.idf([1, 2, 3], 4, {1: 4, 2: 4, 3: 4})
    assert zero.tolist() == [0.0, 0.0, 0.0]
    assert bs.scores(c, c, zero, np.ones(3)) == (0.0, 1.0, 0.0)
    # a token no reference holds weighs log(M + 1)
    assert bs.idf([9], 4, {})[0] == math.log(5)
    parts = [(2, {1: 2, 5: 1}), (0, {}), (3, {1: 1, 7: 3})]
    assert bs.add_counts(parts) == (5, {1: 3, 5: 1, 7: 3})
    assert bs.add_counts([bs.add_counts(parts[:2]), bs.add_counts(parts[2:])]) == bs.add_counts(parts)
    assert bs.add_counts([]) == (0, {})


def test_texts_are_encoded_as_bert_score_encodes_them():
    """Stripped; a byte-level BPE tokenizer (alone or in a sequence) gets a leading space."""
    tokenizers = pytest.importorskip("tokenizers", reason="needs evalbeam[models] (tokenizers)")
    from tokenizers import models, pre_tokenizers

    from evalbeam.transforms.judge.local_encoder import bert_score_text, byte_level

    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    nested = tokenizers.Tokenizer(models.BPE())
    nested.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(), pre_tokenizers.ByteLevel()])
    wordpiece = tokenizers.Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    assert byte_level(bpe) and byte_level(nested) and not byte_level(wordpiece)
    assert bert_score_text("  The tower. \n", True) == " The tower."
    assert bert_score_text("  The tower. \n", False) == "The tower."
    assert bert_score_text(" \n", True) == ""
