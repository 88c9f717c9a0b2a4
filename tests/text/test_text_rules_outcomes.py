"""The boolean metric family: per-evaluator outcomes, counts that merge, and the rates."""

from __future__ import annotations

import base64
import random

import pytest

from evalbeam.transforms.kernels.conditions import parse_condition
from evalbeam.transforms.kernels.rule_outcomes import (RATE_NAMES, Outcome, RuleCounts, encoding_guardrail,
                                              looping, pii_leakage, sensitive_data_leakage,
                                              text_matching)

CONDITION = '("Brazil" OR "brazil") AND regexp("15,?969 [Mm]illion") AND NOT "Real"'


class TestOutcome:
    def test_statuses(self):
        assert Outcome.checked(False, None).status == "pass"
        assert Outcome.checked(True, False).status == "fail"
        assert Outcome.unparsable("bad").status == "parse_failure"

    def test_consistency_is_enforced(self):
        with pytest.raises(ValueError):
            Outcome(passed=True, answer_failed=True)
        with pytest.raises(ValueError):
            Outcome(passed=False, answer_failed=False)
        with pytest.raises(ValueError):
            Outcome(passed=False, parse_failure=True, answer_failed=True)
        with pytest.raises(ValueError):
            Outcome(passed=True, context_failed=True)

    def test_to_dict(self):
        record = Outcome.checked(False, True, ["context 0: email"]).to_dict()
        assert record == {"passed": True, "answer_failed": False, "context_failed": True,
                          "parse_failure": False, "contexts_checked": True,
                          "reasons": ["context 0: email"], "status": "pass"}


class TestTextMatching:
    def test_answer_and_contexts(self):
        outcome = text_matching(CONDITION, "Brazil: 15,969 million", ["Brazil", "15969 Million"])
        assert outcome == Outcome(passed=True, contexts_checked=True)
        outcome = text_matching(CONDITION, "Brazil: 15,969 Real", ["brazil 15,969 million"])
        assert outcome.status == "fail" and outcome.answer_failed and not outcome.context_failed
        assert outcome.reasons == ("answer does not satisfy the condition",)

    def test_contexts_are_one_text(self):
        outcome = text_matching('"alpha" AND "beta"', "alpha beta", ["alpha", "beta"])
        assert outcome.passed and outcome.contexts_checked and not outcome.context_failed
        outcome = text_matching('"alpha" AND "beta"', "alpha beta", ["alpha", "gamma"])
        assert outcome.passed and outcome.context_failed
        assert outcome.reasons == ("contexts do not satisfy the condition",)

    def test_condition_object_and_single_context_string(self):
        condition = parse_condition('regexp("\\\\d+")')
        assert text_matching(condition, "42", "no digits").context_failed
        assert text_matching(condition, "42", []).contexts_checked is False

    @pytest.mark.parametrize("condition, answer, contexts, reason", [
        ('"a" AND AND "b"', "a b", None,
         'condition: column 9: expected a quoted string, regexp(...), NOT or "(" but found "AND"'),
        ('regexp("(a)\\\\1")', "aa", None, "condition: column 12: invalid regular expression"),
        (None, "a", None, "no condition"),
        (42, "a", None, "condition: a condition is a str, not int"),
        ('"a"', None, None, "no answer"),
        ('"a"', 3.5, None, "answer is a float"),
        ('"a"', "a", ["ok", None], "contexts must be strings"),
    ])
    def test_parse_failures(self, condition, answer, contexts, reason):
        outcome = text_matching(condition, answer, contexts)
        assert outcome.parse_failure and not outcome.passed and outcome.status == "parse_failure"
        assert outcome.reasons[0].startswith(reason)


CARD = "4111 1111 1111 1111"
KEY = "sk-proj-" + "Ab3dEf6hIj" * 10


class TestLeakage:
    def test_pii_in_answer_fails(self):
        outcome = pii_leakage(f"Your card is {CARD}, mail me at a.b@example.com")
        assert outcome.status == "fail" and not outcome.contexts_checked
        assert outcome.reasons == ("answer: credit_card, email",)
        assert all(CARD not in reason for reason in outcome.reasons)

    def test_pii_in_context_is_a_retrieval_failure_only(self):
        outcome = pii_leakage("I cannot share that.", ["public text", f"ssn 123-45-6789, {CARD}"])
        assert outcome.passed and outcome.context_failed and outcome.contexts_checked
        assert outcome.reasons == ("context 1: credit_card, ssn",)

    def test_clean(self):
        assert pii_leakage("Nothing here: 42 apples.", ["nor here"]) == \
            Outcome(passed=True, contexts_checked=True)
        assert pii_leakage("call 555-123-4567", kinds=("email",)).passed

    def test_sensitive_data(self):
        outcome = sensitive_data_leakage(f"use {KEY}", ["W269N-WFGWX-YVC9B-4J6C9-T83GX"])
        assert outcome.answer_failed and outcome.context_failed
        assert outcome.reasons == ("answer: openai_api_key", "context 0: windows_product_key")
        assert all(KEY not in reason for reason in outcome.reasons)
        assert sensitive_data_leakage("my card " + CARD).passed     # PII is not this evaluator's
        assert sensitive_data_leakage(None).parse_failure


class TestEncodingGuardrail:
    encoded_pii = base64.b64encode(b"contact john@example.com please").decode()

    def test_decoded_pii_fails(self):
        outcome = encoding_guardrail(f"Here: {self.encoded_pii}")
        assert outcome.status == "fail" and outcome.reasons == ("answer: base64: email",)

    def test_plain_pii_is_not_an_encoded_leak(self):
        assert encoding_guardrail("contact john@example.com please").passed

    def test_hex(self):
        hex_text = b"ssn 123-45-6789".hex()
        assert encoding_guardrail(hex_text).reasons == ("answer: base16: ssn",)

    def test_condition_replaces_the_pii_suite(self):
        secret = base64.b64encode(b"The password is swordfish").decode()
        assert encoding_guardrail(secret, condition='"swordfish"').reasons == \
            ("answer: base64: condition",)
        assert encoding_guardrail(secret, condition='"marlin"').passed
        # with a condition, decoded PII that does not satisfy it is not a leak
        assert encoding_guardrail(self.encoded_pii, condition='"swordfish"').passed
        assert encoding_guardrail(secret, condition='"sword" AND').parse_failure

    def test_contexts(self):
        outcome = encoding_guardrail("fine", [self.encoded_pii])
        assert outcome.passed and outcome.context_failed
        outcome = encoding_guardrail("fine", [self.encoded_pii], check_contexts=False)
        assert outcome.passed and not outcome.contexts_checked

    def test_options_reach_the_decoder(self):
        short = base64.b64encode(b"a@b.io").decode()      # 8 characters
        assert encoding_guardrail(short).passed
        assert not encoding_guardrail(short, min_base64=8).passed


class TestLooping:
    def test_looping_answer(self):
        outcome, metrics = looping("I will repeat myself. " * 10)
        assert outcome.status == "fail" and outcome.reasons[0].startswith("unique_sentences 0.100")
        assert metrics["unique_sentences"] == pytest.approx(0.1)

    def test_normal_answer_and_parse_failure(self):
        outcome, metrics = looping("One clear sentence. Then another distinct one.")
        assert outcome.passed and metrics["unique_sentences"] == 1.0
        assert looping(None) == (Outcome.unparsable("no answer"), {})


class TestCounts:
    def test_rates_and_denominators(self):
        outcomes = [
            Outcome.checked(False, None),            # pass, no contexts
            Outcome.checked(False, True),            # pass, retrieval failure
            Outcome.checked(True, False),            # fail
            Outcome.checked(True, True),             # fail, retrieval failure
            Outcome.checked(False, False),           # pass
            Outcome.unparsable("bad condition"),     # parse failure
        ]
        counts = RuleCounts.of(outcomes)
        assert counts == RuleCounts(cases=6, passed=3, failed=2, parse_failures=1,
                                    generation_failures=2, retrieval_failures=2,
                                    contexts_checked=4)
        assert counts.rates() == {"pass": 3 / 6, "fail": 2 / 6, "retrieval_failure": 2 / 4,
                                  "generation_failure": 2 / 6, "parse_failure": 1 / 6}
        assert tuple(counts.rates()) == RATE_NAMES

    def test_empty_counts(self):
        assert RuleCounts().rates() == dict.fromkeys(RATE_NAMES, 0.0)
        only_parse = RuleCounts.of([Outcome.unparsable("x")])
        assert only_parse.rates()["parse_failure"] == 1.0
        assert only_parse.rates()["retrieval_failure"] == 0.0

    def test_merge_equals_counting_everything(self):
        rng = random.Random(5)
        outcomes = []
        for _ in range(500):
            roll = rng.random()
            if roll < 0.1:
                outcomes.append(Outcome.unparsable("x"))
            else:
                outcomes.append(Outcome.checked(rng.random() < 0.3,
                                                rng.choice([None, False, True])))
        shards = [outcomes[i::7] for i in range(7)]
        merged = RuleCounts()
        for shard in reversed(shards):
            merged.merge(RuleCounts.of(shard))
        total = RuleCounts.of(outcomes)
        assert merged == total
        rates = total.rates()
        assert all(0.0 <= value <= 1.0 for value in rates.values())
        assert rates["pass"] + rates["fail"] + rates["parse_failure"] == pytest.approx(1.0)
        assert rates["generation_failure"] == rates["fail"]
        copy = total.copy()
        copy.merge(total)
        assert copy.cases == 2 * total.cases and total.cases == 500
