"""Each judge metric's arithmetic from chosen verdicts: the stand-in server answers with what the
test picks (StandInServer(answer=...)), the metric program runs on a real JudgeSession."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from evalbeam.pipelines.runners.judge_server import StandInServer
from evalbeam.transforms.judge.metrics import PROGRAMS, byop_program
from evalbeam.transforms.judge.program import Datum, JudgeMetricConfig, score_metric
from evalbeam.transforms.judge.session import JudgeSession
from evalbeam.transforms.judge.simulated import EMBEDDING_DIM, embed
from evalbeam.transforms.judge.templates import load_byop, load_template, template_names
from evalbeam.transforms.judge.transform import JudgeSettings
from evalbeam.transforms.kernels import judge_scores as ks


def template_of(body: dict) -> str:
    """The bundled template a request was rendered from (schema name, else its system text)."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return fmt["json_schema"]["name"]
    system = body["messages"][0]["content"]
    for name in template_names():
        if load_template(name).system == system:
            return name
    return "?"


def last_user(body: dict) -> str:
    return [m["content"] for m in body["messages"] if m["role"] == "user"][-1]


def verdict_items(key: str, texts: list, verdicts: list) -> dict:
    return {"verdicts": [{key: t, "reason": "because", "verdict": v} for t, v in zip(texts, verdicts)]}


class Script:
    """answer(body): per template, a function (user text) -> answer object or text."""

    def __init__(self, **rules):
        self.rules = rules
        self.asked: list[str] = []

    def __call__(self, body):
        name = template_of(body)
        self.asked.append(name)
        rule = self.rules.get(name)
        if rule is None:
            return None
        answer = rule(last_user(body))
        return answer if isinstance(answer, str) else json.dumps(answer)


def run_metric(tmp_path, script, metric, datum, config=None, model="judge", program=None):
    config = config or JudgeMetricConfig(model=model)
    with StandInServer(answer=script) as server:
        settings = JudgeSettings(url=server.url, api_key_env="EVALBEAM_TEST_NO_KEY", rpm=100_000,
                                 concurrency=4, timeout_s=10, max_attempts=2)
        session = JudgeSession(settings, str(tmp_path / "journal"))
        session.open()
        try:
            return session.run(score_metric(session, config, metric, program or PROGRAMS[metric], datum))
        finally:
            session.close()


RAG = Datum(question="Where is Lumo and what is it known for?",
            references=["Lumo lies in Estova. Lumo is known for a glass tower."],
            response="Lumo lies in Estova. Lumo has a port. Lumo is known for a glass tower.",
            contexts=["Lumo lies in Estova.", "Lumo is known for a glass tower.", "Weather is mild."])


def test_faithfulness_shares_claims_and_follows_the_no_claims_convention(tmp_path):
    claims = ["Lumo lies in Estova.", "Lumo has a port.", "Lumo is known for a glass tower."]
    script = Script(statements=lambda text: {"statements": claims},
                    faithfulness_verdicts=lambda text: verdict_items("claim", claims, ["yes", "no", "yes"]))
    score = run_metric(tmp_path / "a", script, "Faithfulness", RAG)
    assert score.status == "ok" and score.value == pytest.approx(2 / 3)
    empty = Script(statements=lambda text: {"statements": []})
    assert run_metric(tmp_path / "b", empty, "Faithfulness", RAG).status == "no_statements"
    one = run_metric(tmp_path / "c", empty, "Faithfulness", RAG,
                     JudgeMetricConfig(model="judge", no_claims_faithfulness=1.0))
    assert (one.status, one.value) == ("ok", 1.0)
    # no contexts field: not applicable, nothing asked
    quiet = Script()
    missing = run_metric(tmp_path / "d", quiet, "Faithfulness", Datum(RAG.question, RAG.references, RAG.response, None))
    assert missing.status == "not_applicable" and quiet.asked == []


def test_answer_correctness_takes_the_best_reference(tmp_path):
    refs = ["Lumo lies in Estova.", "Lumo lies in Estova. Lumo is old."]
    answer = ["Lumo lies in Estova.", "Lumo has a port."]

    def statements(text):
        if "Lumo is old" in text:
            return {"statements": ["Lumo lies in Estova.", "Lumo is old."]}
        if "has a port" in text:
            return {"statements": answer}
        return {"statements": ["Lumo lies in Estova."]}

    def verdicts(text):
        two = "Lumo is old" in text
        return {"answer_verdicts": [{"statement": s, "reason": "r", "verdict": v}
                                    for s, v in zip(answer, ["yes", "yes"] if two else ["yes", "no"])],
                "reference_verdicts": [{"statement": s, "reason": "r", "verdict": v}
                                       for s, v in (zip(["a", "b"], ["yes", "no"]) if two else [("a", "yes")])]}

    script = Script(statements=statements, answer_correctness_verdicts=verdicts)
    datum = Datum(RAG.question, refs, "Lumo lies in Estova. Lumo has a port.", None)
    score = run_metric(tmp_path, script, "AnswerCorrectness", datum)
    # reference 1: tp 1, fp 1, fn 0 -> 1 / 1.5; reference 2: tp 2, fp 0, fn 1 -> 2 / 2.5
    assert score.details["f1_per_reference"] == pytest.approx([1 / 1.5, 0.8])
    assert score.value == pytest.approx(0.8)


def test_answer_correctness_empty_statement_lists(tmp_path):
    script = Script(statements=lambda text: {"statements": []})
    datum = Datum("q", ["ref"], "", None)
    assert run_metric(tmp_path / "a", script, "AnswerCorrectness", datum).value == 1.0
    none = run_metric(tmp_path / "b", script, "AnswerCorrectness", datum,
                      JudgeMetricConfig(model="judge", both_empty=None))
    assert none.status == "no_statements"
    one_side = Script(statements=lambda text: {"statements": ["x"]} if "ref" in text.split("Text")[-1] else {"statements": []})
    assert run_metric(tmp_path / "c", one_side, "AnswerCorrectness", datum).value == 0.0
    assert "answer_correctness_verdicts" not in one_side.asked


def test_bias_and_toxicity(tmp_path):
    opinions = ["It is a dull city.", "Its people are rude."]
    script = Script(opinions=lambda text: {"opinions": opinions},
                    bias_verdicts=lambda text: verdict_items("opinion", opinions, ["no", "no"]),
                    toxicity_verdicts=lambda text: verdict_items("opinion", opinions, ["no", "yes"]))
    assert run_metric(tmp_path / "a", script, "Bias", RAG).value == 0.0
    assert run_metric(tmp_path / "b", script, "Toxicity", RAG).value == 0.5
    none = Script(opinions=lambda text: {"opinions": []})
    score = run_metric(tmp_path / "c", none, "Toxicity", RAG)
    assert (score.status, score.value) == ("ok", 0.0) and "toxicity_verdicts" not in none.asked


def test_context_precision_ors_verdicts_over_references(tmp_path):
    contexts = ["c1 alpha", "c2 beta", "c3 gamma", "c4 delta"]
    yes = {("ref one", "c1 alpha"), ("ref two", "c4 delta")}

    def verdict(text):
        ctx = next(c for c in contexts if c in text)
        ref = "ref one" if "ref one" in text else "ref two"
        return {"reason": "r", "verdict": "yes" if (ref, ctx) in yes else "no"}

    script = Script(context_precision_verdict=verdict)
    datum = Datum("q", ["ref one", "ref two"], "answer", contexts)
    score = run_metric(tmp_path, script, "ContextPrecision", datum)
    # OR over references: [yes, no, no, yes] -> (1 + 2/4) / 2
    assert score.value == pytest.approx(0.75)
    all_no = Script(context_precision_verdict=lambda text: {"reason": "r", "verdict": "no"})
    assert run_metric(tmp_path / "b", all_no, "ContextPrecision", datum).value == 0.0
    empty = run_metric(tmp_path / "c", all_no, "ContextPrecision", Datum("q", ["r"], "a", []))
    assert (empty.status, empty.value) == ("ok", 0.0)


def test_context_recall_relevance_and_hallucination(tmp_path):
    script = Script(statements=lambda text: {"statements": ["s1", "s2", "s3"]},
                    context_recall_verdicts=lambda text: verdict_items("statement", ["s1", "s2", "s3"],
                                                                       ["yes", "no", "yes"]),
                    context_relevance_verdict=lambda text: {"reason": "r", "verdict": "no" if "Weather" in text else "yes"},
                    hallucination_verdict=lambda text: {"reason": "r", "verdict": "yes" if "Weather" in text else "no"})
    assert run_metric(tmp_path / "a", script, "ContextRecall", RAG).value == pytest.approx(2 / 3)
    assert run_metric(tmp_path / "b", script, "Hallucination", RAG).value == pytest.approx(1 / 3)
    relevance = run_metric(tmp_path / "c", script, "ContextRelevance", RAG)
    assert relevance.value == pytest.approx(2 / 3) and relevance.details["verdicts"] == ["yes", "yes", "no"]


def test_nvidia_ratings_fall_back_to_the_valid_template(tmp_path):
    def script_for(first, second):
        return Script(nv_answer_accuracy_1=lambda text: first, nv_answer_accuracy_2=lambda text: second)

    datum = Datum("q", ["reference"], "answer", None)
    assert run_metric(tmp_path / "a", script_for("4", "2"), "AnswerAccuracy", datum).value == pytest.approx(0.75)
    assert run_metric(tmp_path / "b", script_for("4.0", "3"), "AnswerAccuracy", datum).value == 1.0
    assert run_metric(tmp_path / "c", script_for("maybe", "2"), "AnswerAccuracy", datum).value == 0.5
    both = run_metric(tmp_path / "d", script_for("2 or 4", "five"), "AnswerAccuracy", datum)
    assert (both.status, both.value) == ("invalid_output", None)
    grounded = Script(nv_groundedness_1=lambda text: "2", nv_groundedness_2=lambda text: "1")
    assert run_metric(tmp_path / "e", grounded, "ResponseGroundedness", RAG).value == pytest.approx(0.75)
    relevance = Script(nv_context_relevance_1=lambda text: "0", nv_context_relevance_2=lambda text: "x")
    assert run_metric(tmp_path / "f", relevance, "ContextRelevanceRating", RAG).value == 0.0
    # short circuit: the context is part of the question
    short = run_metric(tmp_path / "g", Script(), "ContextRelevanceRating",
                       Datum("Is Lumo in Estova? yes", None, "a", ["Lumo in Estova"]))
    assert short.value == 0.0 and short.details["short_circuit"]


def test_summary_coherence_weights_by_logprobs(tmp_path):
    script = Script(summary_coherence=lambda text: "4")
    score = run_metric(tmp_path / "a", script, "SummaryCoherence", RAG)
    assert score.status == "ok" and score.details["method"] == "logprobs"
    assert 3.0 < score.value < 5.0 and score.value != 4.0
    plain = run_metric(tmp_path / "b", script, "SummaryCoherence", RAG,
                       JudgeMetricConfig(model="judge", top_logprobs=0))
    assert (plain.value, plain.details["method"]) == (4.0, "integer")


def test_h2o_judge_evaluators(tmp_path):
    script = Script(contact_information=lambda text: {"reason": "r", "verdict": "present"},
                    language_mismatch=lambda text: {"reason": "r", "verdict": "same"},
                    sexism=lambda text: {"reason": "r", "verdict": "no"},
                    stereotypes=lambda text: {"reason": "r", "score": 3},
                    summarization=lambda text: {"reason": "r", "verdict": "good"})
    values = {m: run_metric(tmp_path / m, script, m, RAG).value
              for m in ("ContactInformation", "LanguageMismatch", "Sexism", "Stereotypes", "SummarizationJudge")}
    assert values == {"ContactInformation": 1.0, "LanguageMismatch": 0.0, "Sexism": 0.0,
                      "Stereotypes": 0.3, "SummarizationJudge": 1.0}


def test_ragas_harmonic_mean_of_its_components(tmp_path):
    claims = ["Lumo lies in Estova.", "Lumo has a port.", "Lumo is known for a glass tower."]
    script = Script(statements=lambda text: {"statements": claims},
                    faithfulness_verdicts=lambda text: verdict_items("claim", claims, ["yes", "no", "yes"]),
                    answer_relevance_verdicts=lambda text: verdict_items("statement", claims, ["yes", "yes", "idk"]),
                    context_precision_verdict=lambda text: {"reason": "r", "verdict": "yes"},
                    context_recall_verdicts=lambda text: verdict_items("statement", claims, ["yes", "yes", "no"]))
    score = run_metric(tmp_path, script, "RAGAS", RAG)
    parts = [2 / 3, 1.0, 1.0, 2 / 3]
    assert score.value == pytest.approx(4 / sum(1 / p for p in parts))


def test_byop_templates(tmp_path):
    path = tmp_path / "polite.toml"
    path.write_text('name = "polite"\nversion = "2"\nverdict = "pass_fail"\n'
                    'user = """Is this answer polite?\\nQuestion: {{question}}\\nAnswer: {{answer}}"""\n')
    template = load_byop(str(path))
    script = Script(polite=lambda text: {"reason": "r", "verdict": "pass" if "please" in text else "fail"})
    polite = Datum("q", None, "Yes, please come in.", None)
    assert run_metric(tmp_path / "a", script, "BYOP", polite, program=byop_program(template)).value == 1.0
    rude = Datum("q", None, "Go away.", None)
    assert run_metric(tmp_path / "b", script, "BYOP", rude, program=byop_program(template)).value == 0.0
    numeric = tmp_path / "depth.toml"
    numeric.write_text('name = "depth"\nversion = "1"\nverdict = "numeric"\nmin = 0\nmax = 5\n'
                       'user = """Rate the depth of: {{answer}} given {{contexts}}"""\n')
    depth = load_byop(str(numeric))
    script = Script(depth=lambda text: {"reason": "r", "score": 3.5})
    assert run_metric(tmp_path / "c", script, "BYOP", RAG, program=byop_program(depth)).value == 3.5
    no_contexts = run_metric(tmp_path / "d", script, "BYOP", polite, program=byop_program(depth))
    assert no_contexts.status == "not_applicable"


def _cos(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_embedding_metrics_against_hand_computed_cosines(tmp_path):
    e = lambda text: embed(text, EMBEDDING_DIM)  # noqa: E731 - the stand-in's vectors
    datum = Datum("Where is Lumo?", ["Lumo lies in Estova.", "Lumo is in the north."],
                  "Lumo lies in Estova. It has a glass tower.",
                  ["Lumo lies in Estova. Lumo is old.", "Glass towers are tall."])
    sentences = ["Lumo lies in Estova.", "It has a glass tower."]
    context_sentences = [["Lumo lies in Estova.", "Lumo is old."], ["Glass towers are tall."]]
    got = {m: run_metric(tmp_path / m, Script(), m, datum).value for m in
           ("AnswerSemanticSimilarity", "AnswerRelevanceSimilarity", "GroundednessSimilarity",
            "ContextRecallSimilarity", "ContextPrecisionSimilarity")}
    flat = [s for chunk in context_sentences for s in chunk]
    chunk_rel = [max(_cos(e(datum.question), e(s)) for s in chunk) for chunk in context_sentences]
    expected = {
        "AnswerSemanticSimilarity": max(_cos(e(datum.response), e(r)) for r in datum.references),
        "AnswerRelevanceSimilarity": max(_cos(e(datum.question), e(s)) for s in sentences),
        "GroundednessSimilarity": min(max(_cos(e(a), e(c)) for c in flat) for a in sentences),
        "ContextRecallSimilarity": max(chunk_rel),
        "ContextPrecisionSimilarity": sum(chunk_rel) / len(chunk_rel),
    }
    assert ks.split_sentences(datum.response) == sentences
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
        assert not math.isnan(got[name])


def test_failures_become_statuses_never_numbers(tmp_path):
    score = run_metric(tmp_path / "a", Script(), "Faithfulness", RAG, model="fail-401")
    assert (score.status, score.value) == ("http_error", None)
    bad = Script(statements=lambda text: {"statements": ["a", "b"]},
                 faithfulness_verdicts=lambda text: verdict_items("claim", ["a", "b"], ["yes", "perhaps"]))
    score = run_metric(tmp_path / "b", bad, "Faithfulness", RAG)
    assert (score.status, score.value) == ("invalid_output", None)
