"""The BERTScore kernel (transforms/kernels/bertscore.py) against a plain loop over the formula,
on random vectors and weights (several seeds, repeated vectors for ties), and its edges. The
bert-score package itself needs torch, which the test extras leave out; the end-to-end test in
test_log_likelihood.py checks the pipeline against ONNX Runtime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evalbeam.transforms.kernels import bertscore as bs


def loop_scores(c, r, wc, wr):
    def cos(a, b):
        return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    p = sum(w * max(cos(x, y) for y in r) for x, w in zip(c, wc)) / sum(wc)
    rec = sum(w * max(cos(x, y) for x in c) for y, w in zip(r, wr)) / sum(wr)
    return p, rec, 2 * p * rec / (p + rec)


@pytest.mark.parametrize("seed", range(6))
def test_weighted_scores_match_a_loop(seed):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(int(rng.integers(1, 9)), 5))
    r = rng.normal(size=(int(rng.integers(1, 9)), 5))
    r[0] = c[0] * 3.0                      # a tie at cosine 1
    ids_c, ids_r = rng.integers(0, 6, len(c)), rng.integers(0, 6, len(r))
    documents, df = 7, {int(t): int(rng.integers(0, 8)) for t in range(4)}
    wc, wr = bs.idf(ids_c, documents, df), bs.idf(ids_r, documents, df)
    want = [math.log(8 / (df.get(int(t), 0) + 1)) for t in ids_c]
    assert np.allclose(wc, want)
    for wc_, wr_ in ((None, None), (wc, wr)):
        if wc_ is not None and (wc.sum() == 0 or wr.sum() == 0):
            continue
        expect = loop_scores(c, r, np.ones(len(c)) if wc_ is None else wc_,
                             np.ones(len(r)) if wr_ is None else wr_)
        assert np.allclose(bs.scores(c, r, wc_, wr_), expect, rtol=1e-12)


def test_edges():
    c = np.eye(3)
    assert bs.scores(np.zeros((0, 3)), c) == (0.0, 0.0, 0.0)
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
