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


@dataclass
class RuleState:
    """Counts of one rule evaluator (RuleCounts) and, for LoopingDetection, exact sums of its
    three metrics over the datums evaluated."""

    kind: str
    counts: object = None
    sums: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.counts is None:
            from evalbeam.transforms.kernels.rule_outcomes import RuleCounts

            self.counts = RuleCounts()

    def merge(self, other: "RuleState") -> "RuleState":
        self.counts.merge(other.counts)
        for name, total in other.sums.items():
            if name in self.sums:
                self.sums[name].merge(total)
            else:
                self.sums[name] = total.copy()
        return self

    def copy(self) -> "RuleState":
        return RuleState(self.kind, self.counts.copy(), {k: v.copy() for k, v in self.sums.items()})

    def records(self) -> list[dict]:
        value = dict(self.counts.rates())
        value["datums"] = self.counts.cases
        for name in LOOPING_METRICS:
            if name in self.sums:
                value[name] = self.sums[name].mean()
        return [{"type": self.kind, "value": value, "parameters": {}}]


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


def score_rules(config, truth, prediction, model: str, states: list) -> list[dict]:
    """Score rows of the configured rule evaluators for one datum; counts added to every state."""
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
            rule.counts.add(outcome)
            for name, value in metrics.items():
                rule.sums.setdefault(name, ExactSum()).add(value)
        status = outcome.status if prediction is not None else "missing_prediction"
        details = {"reasons": list(outcome.reasons), "answer_failed": outcome.answer_failed,
                   "context_failed": outcome.context_failed}
        details.update(metrics)
        rows.append({**row, "value": None if outcome.parse_failure else float(outcome.passed),
                     "status": status, "details": details})
    return rows
