"""BERTScore (Zhang et al. 2020, as the bert-score package computes it): greedy cosine matching
of contextual token embeddings. Pure numpy.

  scores(c, r)   c float[n, H]: the candidate's token embeddings, r float[m, H]: a reference's
                 (special tokens such as [CLS] and [SEP] left out by the caller). With unit
                 rows, S = c r^T (cosines), then
                   P = (1/n) sum_j max_i S[j, i]     each candidate token's best reference token
                   R = (1/m) sum_i max_j S[j, i]     each reference token's best candidate token
                   F = 2 P R / (P + R)               (0 when P + R = 0)
                 An empty side (n = 0 or m = 0) gives P = R = F = 0.
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


def scores(candidate: np.ndarray, reference: np.ndarray) -> tuple[float, float, float]:
    if len(candidate) == 0 or len(reference) == 0:
        return 0.0, 0.0, 0.0
    similarity = _unit(candidate) @ _unit(reference).T
    precision = float(similarity.max(axis=1).mean())
    recall = float(similarity.max(axis=0).mean())
    f1 = 2 * precision * recall / (precision + recall) if precision + recall != 0 else 0.0
    return precision, recall, f1


def best(per_reference: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return tuple(max(values) for values in zip(*per_reference))


def rescale(value: float, baseline: float) -> float:
    return (value - baseline) / (1.0 - baseline)
