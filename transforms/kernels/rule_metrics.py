"""The rule evaluators (no LLM) as text metrics: per-datum score rows and mergeable counts.

Record types and what they run (transforms/kernels/rule_outcomes.py):
  TextMatching          the ground truth's condition on the response (and the contexts)
  PIILeakage            the PII suite (cards with Luhn, SSNs, e-mails, phones)
  SensitiveDataLeakage  PEM keys/certificates, API keys, product keys, passwords in URLs
  EncodingGuardrail     base64/base16 spans decoded, then the condition if the datum has one
                        (what it describes must not appear), else the PII suite
  LoopingDetection      unique sentences, longest repeated substring, compression ratio
A datum without a prediction row is scored as an empty response (status "missing_prediction");
TextMatching skips datums without a condition (status "no_condition", not counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from evalbeam.transforms.kernels.exact_sum import ExactSum

RULE_TYPES = ("TextMatching", "PIILeakage", "SensitiveDataLeakage", "EncodingGuardrail",
              "LoopingDetection")
LOOPING_METRICS = ("unique_sentences", "longest_repeated_substring", "compression_ratio")


@lru_cache(maxsize=4096)
def _condition(text: str):
    from evalbeam.transforms.kernels.conditions import parse_condition

    return parse_condition(text)


def condition_problem(text: str) -> str | None:
    """Why a condition does not parse (names the column), or None."""
    from evalbeam.transforms.kernels.conditions import ConditionError

    try:
        _condition(text)
    except ConditionError as error:
        return str(error)
    return None


# the RuleCounts fields in the order of a datum's count row (outcome_counts)
COUNT_FIELDS = ("cases", "passed", "failed", "parse_failures", "generation_failures",
                "retrieval_failures", "contexts_checked")
# rate name -> (numerator, denominator) of RuleCounts fields; every one a share of datums
RATE_PARTS = {"pass": ("passed", "cases"), "fail": ("failed", "cases"),
              "retrieval_failure": ("retrieval_failures", "contexts_checked"),
              "generation_failure": ("generation_failures", "cases"),
              "parse_failure": ("parse_failures", "cases")}


def outcome_counts(outcome) -> tuple[int, ...]:
    """What one outcome adds to each RuleCounts field (COUNT_FIELDS order)."""
    from evalbeam.transforms.kernels.rule_outcomes import RuleCounts

    counts = RuleCounts().add(outcome)
    return tuple(getattr(counts, name) for name in COUNT_FIELDS)


@dataclass
class RuleState:
    """Counts of one rule evaluator (RuleCounts) and, for LoopingDetection, exact sums of its
    three metrics over the datums evaluated.

    Bootstrap (kernels/judge_state.py describes the notes and seal): replicate_counts is
    int64[R, 7], the RuleCounts of each replicate (COUNT_FIELDS order), each datum's counts
    multiplied by its weight; looping holds the replicate sums of the three looping metrics
    over the datums that have them."""

    kind: str
    counts: object = None
    sums: dict = field(default_factory=dict)
    replicate_counts: object = None
    looping: object = None
    notes: list | None = None

    def __post_init__(self):
        if self.counts is None:
            from evalbeam.transforms.kernels.rule_outcomes import RuleCounts

            self.counts = RuleCounts()

    def add(self, outcome, metrics: dict, column: int | None = None) -> None:
        """One datum's outcome and looping metrics ({} for the other evaluators); column: its
        column in the shard's weight matrix when bootstrapping."""
        self.counts.add(outcome)
        for name, value in metrics.items():
            self.sums.setdefault(name, ExactSum()).add(value)
        if column is not None:
            if self.notes is None:
                self.notes = []
            looping = tuple(float(metrics[name]) for name in LOOPING_METRICS) if metrics else None
            self.notes.append((column, outcome_counts(outcome), looping))

    def seal(self, weights) -> None:
        """The notes of a shard into replicate counts and sums, with its weights uint8[R, n]."""
        import numpy as np

        from evalbeam.transforms.kernels.bootstrap import weighted_sums
        from evalbeam.transforms.kernels.judge_state import ReplicateSums, merge_optional

        notes, self.notes = self.notes or [], None
        replicates = weights.shape[0]
        counts = np.zeros((replicates, len(COUNT_FIELDS)), np.int64)
        if notes:
            columns = np.array([c for c, _, _ in notes], np.int64)
            rows = np.array([n for _, n, _ in notes], np.int64)
            counts = weighted_sums(weights, columns, rows)
        self.replicate_counts = counts if self.replicate_counts is None else self.replicate_counts + counts
        if self.kind == "LoopingDetection":
            kept = [(c, m) for c, _, m in notes if m is not None]
            part = (ReplicateSums.of(weights[:, np.array([c for c, _ in kept], np.int64)],
                                     np.array([m for _, m in kept]))
                    if kept else ReplicateSums.empty(replicates, len(LOOPING_METRICS)))
            self.looping = merge_optional(self.looping, part)

    def merge(self, other: "RuleState") -> "RuleState":
        self.counts.merge(other.counts)
        for name, total in other.sums.items():
            if name in self.sums:
                self.sums[name].merge(total)
            else:
                self.sums[name] = total.copy()
        if other.replicate_counts is not None:
            self.replicate_counts = (other.replicate_counts.copy() if self.replicate_counts is None
                                     else self.replicate_counts + other.replicate_counts)
        if other.looping is not None:
            self.looping = other.looping.copy() if self.looping is None else self.looping.merge(other.looping)
        return self

    def copy(self) -> "RuleState":
        return RuleState(self.kind, self.counts.copy(), {k: v.copy() for k, v in self.sums.items()},
                         None if self.replicate_counts is None else self.replicate_counts.copy(),
                         None if self.looping is None else self.looping.copy())

    def records(self) -> list[dict]:
        """One record: the rates, the datums and the looping means. When bootstrapped, the
        internal fields REPLICATES {rate or looping metric: [R values]} (a rate is None in a
        replicate whose denominator is 0, a looping mean where no datum has the metric) and
        PROPORTION {rate: [numerator, denominator]}, both for the rates whose denominator is
        above 0 (a rate of no datum is 0 by convention: no interval)."""
        value = dict(self.counts.rates())
        value["datums"] = self.counts.cases
        for name in LOOPING_METRICS:
            if name in self.sums:
                value[name] = self.sums[name].mean()
        record = {"type": self.kind, "value": value, "parameters": {}}
        if self.replicate_counts is not None:
            from evalbeam.transforms.kernels.bootstrap import PROPORTION, REPLICATES

            column = {name: self.replicate_counts[:, i].tolist() for i, name in enumerate(COUNT_FIELDS)}
            replicates, proportions = {}, {}
            for rate, (top, bottom) in RATE_PARTS.items():
                n = getattr(self.counts, bottom)
                if n:
                    replicates[rate] = [k / m if m else None for k, m in zip(column[top], column[bottom])]
                    proportions[rate] = [getattr(self.counts, top), n]
            if self.looping is not None:
                for name, means in zip(LOOPING_METRICS, self.looping.means()):
                    if name in value:
                        replicates[name] = means
            record[REPLICATES] = replicates
            record[PROPORTION] = proportions
        return [record]


def _evaluate(kind: str, truth, response: str, contexts):
    """(Outcome, looping metrics or {}) of one evaluator on one datum."""
    from evalbeam.transforms.kernels import rule_outcomes as rules

    if kind == "TextMatching":
        return rules.text_matching(_condition(truth.condition), response, contexts), {}
    if kind == "PIILeakage":
        return rules.pii_leakage(response, contexts), {}
    if kind == "SensitiveDataLeakage":
        return rules.sensitive_data_leakage(response, contexts), {}
    if kind == "EncodingGuardrail":
        condition = _condition(truth.condition) if truth.condition is not None else None
        return rules.encoding_guardrail(response, contexts, condition=condition), {}
    return rules.looping(response)


def score_rules(config, truth, prediction, model: str, states: list, column: int | None = None) -> list[dict]:
    """Score rows of the configured rule evaluators for one datum; counts added to every state
    (column: the datum's column in the shard's bootstrap weights, None when not bootstrapping)."""
    rows = []
    response = prediction.response if prediction is not None else ""
    contexts = prediction.contexts if prediction is not None else None
    for kind in RULE_TYPES:
        if kind not in config.metrics:
            continue
        row = {"datum_uid": truth.uid, "model": model, "metric": kind, "parameters": {}}
        if kind == "TextMatching" and truth.condition is None:
            rows.append({**row, "value": None, "status": "no_condition"})
            continue
        outcome, metrics = _evaluate(kind, truth, response, contexts)
        for state in states:
            rule = state.rules.get(kind)
            if rule is None:
                rule = state.rules[kind] = RuleState(kind)
            rule.add(outcome, metrics, column)
        status = outcome.status if prediction is not None else "missing_prediction"
        details = {"reasons": list(outcome.reasons), "answer_failed": outcome.answer_failed,
                   "context_failed": outcome.context_failed}
        details.update(metrics)
        rows.append({**row, "value": None if outcome.parse_failure else float(outcome.passed),
                     "status": status, "details": details})
    return rows
