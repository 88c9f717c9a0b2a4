"""Classification: per-shard matching, mergeable partial state and final metrics (pure numpy).
This module gathers the names the plumbing, the task declaration and the tests import; the
code lives, by stage, in (all under transforms/kernels/):
- classification_state.py: ClassificationConfig (the whole configuration, the metric types),
  KeyState (one label key's partial state) and ClassificationState (the KeyStates of one
  (model, slice), merged key by key);
- classification_match.py: match_key fills one label key's KeyState from one shard;
  datum_correct; the counting primitives by score threshold (levels, counts_above,
  counts_from);
- classification_replicates.py: the bootstrap replicates' part of a KeyState (ReplicateState,
  RocEntries) and the weighted sums that fill it;
- classification_records.py: state_records turns a merged state into metric records
  (key_metrics, one label key).

Vocabulary. For each model, each label key k has a sorted vocabulary of label values (the union of
the ground truth's values and that model's predicted values over the whole input, never another
model's: a model's results do not depend on the other models of a run); value index i is the i-th
string in sorted order, so "smallest index" means "lexicographically smallest value". Shards
share the vocabulary, so merging partial states is addition.

Population. For a model and key k, the population is every datum that has a ground-truth value for
k or at least one prediction for k. A datum in the population without a ground-truth value for k
(only predictions) is a negative for every value; its positive predictions are hallucinations.
A datum with a ground truth for k and no prediction for k scores 0 for every value (a miss).

Predicted positive. A prediction (d, v, s) is positive at score threshold t when s >= t and s > 0
(a score of 0 is "not predicted", as in Valor). With hardmax, only the datum's top-scoring value
for the key can be positive; ties in score go to the lexicographically smallest value.

Per value v at threshold t (one-vs-rest):
    tp = #datums with ground truth v and v positive     fp = #datums without ground truth v and v positive
    fn = #datums with ground truth v and v not positive  tn = n_pop - tp - fp - fn
    precision = tp / (tp + fp), recall = tp / (tp + fn), F1 = 2 tp / (2 tp + fp + fn),
each 0 when its denominator is 0 (scikit-learn's zero_division=0).
Accuracy(k, t) = sum_v tp / #datums with a ground truth for k (0 when there are none).
ROC AUC(v): sklearn.metrics.roc_auc_score(gt == v, score_v) over the population, computed exactly
from score histograms; undefined (None) without positives or negatives.

Bootstrap replicates (issue 16). Given weights uint8[R, n] (kernels.bootstrap: datum d weighs
w[r, d] in replicate r), match_key also fills a ReplicateState: n_pop, n_gt, n_pred, tp and fp
with every datum counted w[r, d] times, and for ROC AUC the entries' datum hashes and score bins
(RocEntries), from which the records step rebuilds the binned weighted score histograms
(ranking.ReplicateHistogram) a block of replicates at a time, drawing the weights again (R
histograms in the state would take 16 R bytes per occupied bin). Replicate r's Precision,
Recall, F1 and Accuracy are the formulas above on its counts, i.e. the metrics of the dataset
where datum d appears w[r, d] times;
its ROC AUC ranks the scores by bin (exact unless a bin holds two distinct scores; error bound
in ranking.replicate_roc_auc). Every step that holds replicates works on blocks of them
(kernels.bootstrap.replicate_blocks), so memory beyond the counts does not grow with R.
key_metrics puts the replicate values on each scalar record (kernels.bootstrap.REPLICATES:
None where the replicate's dataset has no such record or the value is undefined) and
[successes, trials] on the proportions (PROPORTION): Accuracy [sum_v tp, datums with a ground
truth], Precision [tp, tp + fp], Recall [tp, tp + fn].

Calibration (ECE, MCE, BrierScore, reliability diagrams) is kernels.calibration's, kept per key
beside the rest when config.metrics asks for it.
"""

from __future__ import annotations

from evalbeam.transforms.kernels.classification_match import (counts_above, counts_from,
                                                              datum_correct, levels, match_key)
from evalbeam.transforms.kernels.classification_records import key_metrics, state_records
from evalbeam.transforms.kernels.classification_state import (ALL_METRIC_TYPES,
                                                              DEFAULT_PR_THRESHOLDS, DETAILED,
                                                              DEFAULT_METRIC_TYPES,
                                                              STATE_BUDGET_BYTES,
                                                              ClassificationConfig,
                                                              ClassificationState, KeyState)

__all__ = [
    # configuration and state (classification_state)
    "ALL_METRIC_TYPES", "DEFAULT_METRIC_TYPES", "DEFAULT_PR_THRESHOLDS", "DETAILED",
    "STATE_BUDGET_BYTES", "ClassificationConfig", "ClassificationState", "KeyState",
    # matching (classification_match)
    "match_key", "datum_correct", "levels", "counts_above", "counts_from",
    # records (classification_records)
    "key_metrics", "state_records",
]
