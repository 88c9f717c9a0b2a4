"""BERTScore (Zhang et al. 2020, as the bert-score package computes it): greedy cosine matching
of contextual token embeddings. Pure numpy.

  scores(c, r, wc=None, wr=None, c_special=None, r_special=None)
                 c float[n, H]: the candidate's token embeddings, r float[m, H]: a reference's,
                 special tokens ([CLS], [SEP], <s>, </s>) included; c_special bool[n],
                 r_special bool[m] mark them (none when None); wc float[n], wr float[m]: token
                 weights (idf), all 1 when None. A special token weighs 0 whatever wc / wr say.
                 With unit rows, S = c r^T (cosines over every token), then
                   P = sum_j wc_j max_i S[j, i] / sum_j wc_j   each candidate token's best match
                   R = sum_i wr_i max_j S[j, i] / sum_i wr_i   each reference token's best match
                   F = 2 P R / (P + R)               (0 when P + R = 0)
                 so a special token is never averaged but can be a word's best match, as in
                 bert-score (its similarity matrix masks padding only; [CLS] and [SEP] have idf
                 weight 0). A side without a word (n or m = 0, or special tokens only: an
                 empty text) gives P = R = F = 0, as the package does; a side whose weights sum
                 to 0 otherwise (every word in every reference) gives its component 0
                 (bert-score: NaN).
  idf(ids, documents, df)  float64[len(ids)] weights of token ids: log((M + 1) / (df(t) + 1)),
                 M = documents (the references of the dataset), df(t) = how many of them hold
                 token t (0 for a token none holds: log(M + 1)), as bert-score's get_idf_dict.
  best(per_reference)   max over references of each component on its own (the package's rule
                 for several references).
  rescale(v, b)  (v - b) / (1 - b) with the baseline b of the component (the package's
                 rescale_with_baseline: b is the score of unrelated sentence pairs for that model
                 and layer); values can fall below 0.

Computed in float64 whatever the model's precision.
"""

from __future__ import annotations

import numpy as np


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1.0, norms)


def _weights(n: int, weights, special) -> np.ndarray:
    out = np.ones(n) if weights is None else np.array(weights, dtype=np.float64)
    if special is not None:
        out[np.asarray(special, dtype=bool)] = 0.0
    return out


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    total = weights.sum()
    return float(values @ weights / total) if total > 0 else 0.0


def _words(n: int, special) -> int:
    return n if special is None else int(n - np.count_nonzero(special))


def scores(candidate: np.ndarray, reference: np.ndarray, candidate_weights=None,
           reference_weights=None, candidate_special=None, reference_special=None) -> tuple[float, float, float]:
    if _words(len(candidate), candidate_special) == 0 or _words(len(reference), reference_special) == 0:
        return 0.0, 0.0, 0.0
    similarity = _unit(candidate) @ _unit(reference).T
    precision = _weighted_mean(similarity.max(axis=1),
                               _weights(len(candidate), candidate_weights, candidate_special))
    recall = _weighted_mean(similarity.max(axis=0),
                            _weights(len(reference), reference_weights, reference_special))
    f1 = 2 * precision * recall / (precision + recall) if precision + recall != 0 else 0.0
    return precision, recall, f1


def idf(ids, documents: int, df: dict) -> np.ndarray:
    return np.log((documents + 1.0) / (np.array([df.get(int(t), 0) for t in ids], dtype=np.float64) + 1.0))


def add_counts(parts) -> tuple[int, dict]:
    """(documents, {token id: documents holding it}) summed over parts of the same shape; an
    associative CombineGlobally function (it is also given its own results)."""
    documents, df = 0, {}
    for n, counts in parts:
        documents += n
        for token, count in counts.items():
            df[token] = df.get(token, 0) + count
    return documents, df


def best(per_reference: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return tuple(max(values) for values in zip(*per_reference))


def rescale(value: float, baseline: float) -> float:
    return (value - baseline) / (1.0 - baseline)
