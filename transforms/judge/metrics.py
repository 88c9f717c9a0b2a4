"""The LLM-judge metrics of one datum, and the catalogue of every judge-engine metric.

Each metric is a program (transforms/judge/program.py: an async function (judge, datum,
config) -> Score): it asks the judge through `Judge.ask(template, values)` (one chat request
from a versioned template, see templates.py) and does its arithmetic with the pure kernels of
transforms/kernels/judge_scores.py. The metrics that ask a model instead (embeddings,
log-likelihoods, classifiers) are in transforms/judge/model_metrics.py; the catalogue below
(PROGRAMS, JUDGE_METRICS, metric_programs, parameters_of) names them all.

Conventions (one per metric; the configurable ones are JudgeMetricConfig fields):
  AnswerCorrectness   F1 = tp / (tp + (fp + fn) / 2) per reference, max over references; tp = 0
                      gives 0; no statements on either side gives `both_empty` (RAGAS: 1.0);
                      optional blend with AnswerSemanticSimilarity (similarity_weight, RAGAS 0.25).
  AnswerRelevance     share of the answer's statements judged relevant ("idk" counts as relevant,
                      DeepEval); no statements -> `no_statements_relevance` (DeepEval: 1.0).
  Bias, Toxicity      share of opinions judged biased/toxic; no opinions -> 0.0 (Valor).
  ContextPrecision    one verdict per (context, reference), OR over references, then average
                      precision over the verdicts in retrieval order; none useful -> 0.0; [] -> 0.0.
  ContextRecall       share of a reference's statements attributable to the contexts, max over
                      references; a reference without statements is skipped (RAGAS: NaN); none
                      left -> status no_statements; [] contexts -> 0.0.
  ContextRelevance    share of contexts judged relevant (one call per context); [] -> 0.0.
  Faithfulness        share of the answer's claims implied by the contexts (unrelated claims count
                      against, RAGAS); no claims -> `no_claims_faithfulness` (None: status
                      no_statements, RAGAS; DeepEval would give 1.0); [] contexts -> 0.0.
  Hallucination       share of contexts the answer contradicts (one call per context); [] -> 0.0.
  SummaryCoherence    1-5, G-Eval expectation over the score token's top logprobs when the server
                      sends them (mass >= 0.5), else the plain integer; source = the question.
  AnswerAccuracy      NVIDIA: two templates (roles swapped in the second), 0/2/4 scaled by 4; the
                      mean of the valid ratings, the single valid one, else invalid_output; max
                      over references.
  ContextRelevanceRating  NVIDIA: 0/1/2 scaled by 2, same fallback; 0.0 when the question or the
                      joined contexts are empty, equal, or the contexts are part of the question.
  ResponseGroundedness    NVIDIA: 0/1/2 scaled by 2, same fallback; 0.0 for an empty response or
                      empty contexts.
  ContactInformation 1 when concrete contact data is present (lower is better).
  LanguageMismatch   1 when the answer's language differs from the question's (lower is better).
  Sexism             1 when sexist (lower is better). Stereotypes: score / 10 (lower is better).
  SummarizationJudge 1 when the summary of the question (the source) is good (higher is better).
  BYOP               a user's template: pass_fail -> 1 for pass; numeric -> the score.
  RAGAS              harmonic mean of Faithfulness, AnswerRelevance, ContextPrecision and
                      ContextRecall (0 if any is 0; any component not ok -> its status).
The conventions of the model metrics are in transforms/judge/model_metrics.py.
"""

from __future__ import annotations

from evalbeam.transforms.judge import gptscore
from evalbeam.transforms.judge.model_metrics import (answer_relevance_similarity,
                                                     answer_semantic_similarity, classifier_programs,
                                                     context_precision_similarity,
                                                     context_recall_similarity, gptscore_program,
                                                     groundedness_similarity, perplexity)
from evalbeam.transforms.judge.program import (Datum, Failed, Judge, JudgeMetricConfig,
                                               NotApplicable, Score, all_of, need, outcome)
from evalbeam.transforms.kernels import judge_scores as ks


def _items(record: dict, key: str, count: int | None = None) -> list:
    """content[key] as a list (of the expected length when count is given), else Failed."""
    content = record.get("content")
    items = content.get(key) if isinstance(content, dict) else None
    if not isinstance(items, list) or (count is not None and len(items) != count):
        raise Failed("invalid_output", f"expected {count if count is not None else 'a list of'} "
                                       f"{key} in the judge's answer")
    return items


def _verdicts(items: list) -> list:
    out = [ks.verdict_of(item.get("verdict") if isinstance(item, dict) else None) for item in items]
    if any(v is None for v in out):
        raise Failed("invalid_output", "a verdict is not yes, no or idk")
    return out


def _reasons(items: list) -> list:
    return [item.get("reason") for item in items if isinstance(item, dict)]


def _valid(value: float | None, what: str) -> float:
    if value is None:
        raise Failed("invalid_output", what)
    return value


# ---------------------------------------------------------------- shared steps

async def statements(j: Judge, question: str | None, text: str) -> list[str]:
    record = await j.ask("statements", {"question": question or "", "text": text})
    return [s.strip() for s in _items(record, "statements") if isinstance(s, str) and s.strip()]


async def opinion_share(j: Judge, text: str, template: str) -> Score:
    record = await j.ask("opinions", {"text": text})
    opinions = [s.strip() for s in _items(record, "opinions") if isinstance(s, str) and s.strip()]
    if not opinions:
        return Score(0.0, details={"opinions": 0})
    items = _items(await j.ask(template, {"opinions": opinions}), "verdicts", len(opinions))
    verdicts = _verdicts(items)
    return Score(_valid(ks.share(verdicts), "verdicts"),
                 details={"opinions": len(opinions), "verdicts": verdicts, "reasons": _reasons(items)})


async def single_verdict(j: Judge, template: str, values: dict) -> tuple[str, str | None]:
    record = await j.ask(template, values)
    content = record.get("content")
    verdict = content.get("verdict") if isinstance(content, dict) else None
    if verdict is None:
        raise Failed("invalid_output", "no verdict in the judge's answer")
    return verdict, content.get("reason")


async def yes_no(j: Judge, template: str, values: dict) -> tuple[str, str | None]:
    verdict, reason = await single_verdict(j, template, values)
    normal = ks.verdict_of(verdict)
    if normal not in ("yes", "no"):
        raise Failed("invalid_output", "a verdict is not yes or no")
    return normal, reason


# ---------------------------------------------------------------- Valor's metrics

async def answer_correctness(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    references = need(d.references, "references") or []
    if not references:
        raise NotApplicable("references")
    response = need(d.response, "response")
    answer = await statements(j, d.question, response)

    async def one(reference):
        truth = await statements(j, d.question, reference)
        if not answer and not truth:
            return c.both_empty, None
        if not answer or not truth:
            return 0.0, None
        items = await j.ask("answer_correctness_verdicts", {
            "question": d.question or "", "answer_statements": answer, "reference_statements": truth})
        a = _verdicts(_items(items, "answer_verdicts", len(answer)))
        r = _verdicts(_items(items, "reference_verdicts", len(truth)))
        return ks.answer_correctness(a, r, c.both_empty), {"answer": a, "reference": r}

    results = await all_of(*(one(r) for r in references))
    f1 = ks.max_over_references([value for value, _ in results])
    details = {"f1_per_reference": [value for value, _ in results],
               "verdicts": [v for _, v in results], "answer_statements": len(answer)}
    if f1 is None:
        return Score(None, "no_statements", details)
    if c.similarity_weight > 0:
        similarity = (await answer_semantic_similarity(j, d, c)).value
        details["similarity"] = similarity
        f1 = ks.answer_correctness_blend(f1, similarity, (1.0 - c.similarity_weight, c.similarity_weight))
    return Score(_valid(f1, "blend"), details=details)


async def answer_relevance(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    question = need(d.question, "question")
    found = await statements(j, question, need(d.response, "response"))
    if not found:
        if c.no_statements_relevance is None:
            return Score(None, "no_statements")
        return Score(c.no_statements_relevance, details={"statements": 0})
    items = _items(await j.ask("answer_relevance_verdicts", {"question": question, "statements": found}),
                   "verdicts", len(found))
    verdicts = _verdicts(items)
    return Score(_valid(ks.share(verdicts, positive=("yes", "idk")), "verdicts"),
                 details={"statements": len(found), "verdicts": verdicts, "reasons": _reasons(items)})


async def bias(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    return await opinion_share(j, need(d.response, "response"), "bias_verdicts")


async def toxicity(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    return await opinion_share(j, need(d.response, "response"), "toxicity_verdicts")


async def context_precision(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    references = need(d.references, "references")
    contexts = need(d.contexts, "contexts")
    if not references:
        raise NotApplicable("references")
    if not contexts:
        return Score(0.0, details={"contexts": 0})
    per_reference = await all_of(*(
        all_of(*(yes_no(j, "context_precision_verdict",
                        {"question": d.question or "", "context": ctx, "reference": ref})
                 for ctx in contexts))
        for ref in references))
    verdicts = [[v for v, _ in row] for row in per_reference]
    return Score(_valid(ks.context_precision(verdicts), "verdicts"),
                 details={"verdicts": verdicts})


async def context_recall(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    references = need(d.references, "references")
    contexts = need(d.contexts, "contexts")
    if not references:
        raise NotApplicable("references")

    async def one(reference):
        found = await statements(j, d.question, reference)
        if not found:
            return None, None
        if not contexts:
            return 0.0, None
        items = _items(await j.ask("context_recall_verdicts", {"contexts": contexts, "statements": found}),
                       "verdicts", len(found))
        verdicts = _verdicts(items)
        return ks.share(verdicts), verdicts

    results = await all_of(*(one(r) for r in references))
    value = ks.max_over_references([v for v, _ in results])
    details = {"recall_per_reference": [v for v, _ in results], "verdicts": [v for _, v in results]}
    return Score(value, "ok" if value is not None else "no_statements", details)


async def _share_of_contexts(j: Judge, template: str, contexts: list, inputs) -> Score:
    """One yes/no verdict per context (inputs(context) -> the template's inputs): the share of
    yes, 0.0 without contexts."""
    if not contexts:
        return Score(0.0, details={"contexts": 0})
    answers = await all_of(*(yes_no(j, template, inputs(ctx)) for ctx in contexts))
    verdicts = [v for v, _ in answers]
    return Score(ks.share(verdicts), details={"verdicts": verdicts, "reasons": [r for _, r in answers]})


async def context_relevance(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    question = need(d.question, "question")
    return await _share_of_contexts(j, "context_relevance_verdict", need(d.contexts, "contexts"),
                                    lambda ctx: {"question": question, "context": ctx})


async def faithfulness(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    contexts = need(d.contexts, "contexts")
    claims = await statements(j, d.question, need(d.response, "response"))
    if not claims:
        if c.no_claims_faithfulness is None:
            return Score(None, "no_statements", {"claims": 0})
        return Score(c.no_claims_faithfulness, details={"claims": 0})
    if not contexts:
        return Score(0.0, details={"claims": len(claims), "contexts": 0})
    items = _items(await j.ask("faithfulness_verdicts", {"contexts": contexts, "claims": claims}),
                   "verdicts", len(claims))
    verdicts = _verdicts(items)
    return Score(_valid(ks.share(verdicts), "verdicts"),
                 details={"claims": len(claims), "verdicts": verdicts, "reasons": _reasons(items)})


async def hallucination(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    contexts, response = need(d.contexts, "contexts"), need(d.response, "response")
    return await _share_of_contexts(j, "hallucination_verdict", contexts,
                                    lambda ctx: {"context": ctx, "text": response})


async def summary_coherence(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    source = need(d.question, "question (the source text)")
    record = await j.ask("summary_coherence", {"source": source, "summary": need(d.response, "response")},
                         logprobs=c.top_logprobs or None)
    text = record.get("content") if isinstance(record.get("content"), str) else None
    value, method, mass = ks.geval_score(record.get("logprobs"), text=text)
    if value is None and not j.dry:
        raise Failed("invalid_output", "no 1-5 rating in the judge's answer")
    return Score(value, details={"method": method, "mass": mass, "answer": text})


# ---------------------------------------------------------------- NVIDIA's metrics

async def _rating(j: Judge, template: str, values: dict, allowed: tuple) -> tuple[int | None, str | None]:
    """(rating or None, failure status or None): a failed call counts as an invalid rating."""
    try:
        record = await j.ask(template, values)
    except Failed as failure:
        return None, failure.status
    content = record.get("content")
    rating = ks.parse_rating(content, allowed)
    return rating, None if rating is not None else "invalid_output"


async def _two_ratings(j: Judge, name: str, first: dict, second: dict, allowed: tuple, scale: int) -> Score:
    (r1, s1), (r2, s2) = await all_of(_rating(j, f"{name}_1", first, allowed),
                                      _rating(j, f"{name}_2", second, allowed))
    value = ks.nv_combine(r1, r2, scale)
    details = {"ratings": [r1, r2]}
    if value is None and not j.dry:
        # both invalid: report the first template's failure (a transport status beats invalid_output)
        status = next((s for s in (s1, s2) if s not in (None, "invalid_output")), "invalid_output")
        return Score(None, status, details)
    return Score(value, details=details)


async def answer_accuracy(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    references = need(d.references, "references")
    if not references:
        raise NotApplicable("references")
    response = need(d.response, "response")
    scores = await all_of(*(
        _two_ratings(j, "nv_answer_accuracy",
                     {"question": d.question or "", "answer": response, "reference": ref},
                     {"question": d.question or "", "answer": ref, "reference": response}, (0, 2, 4), 4)
        for ref in references))
    best = ks.max_over_references([s.value for s in scores])
    details = {"ratings": [s.details["ratings"] for s in scores]}
    if best is None and not j.dry:
        return Score(None, scores[0].status, details)
    return Score(best, details=details)


async def context_relevance_rating(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    question = need(d.question, "question")
    contexts = need(d.contexts, "contexts")
    joined = "\n".join(contexts)
    if not question.strip() or not joined.strip() or question == joined or joined in question:
        return Score(0.0, details={"short_circuit": True})
    values = {"question": question, "contexts": contexts}
    return await _two_ratings(j, "nv_context_relevance", values, values, (0, 1, 2), 2)


async def response_groundedness(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    response = need(d.response, "response")
    contexts = need(d.contexts, "contexts")
    if not response.strip() or not "\n".join(contexts).strip():
        return Score(0.0, details={"short_circuit": True})
    values = {"response": response, "contexts": contexts}
    return await _two_ratings(j, "nv_groundedness", values, values, (0, 1, 2), 2)


# ---------------------------------------------------------------- H2O Sonar's judge evaluators

async def _flag(j: Judge, template: str, values: dict, flagged: str, options: tuple) -> Score:
    verdict, reason = await single_verdict(j, template, values)
    verdict = str(verdict).strip().lower()
    if verdict not in options:
        raise Failed("invalid_output", f"verdict is not one of {', '.join(options)}")
    return Score(float(verdict == flagged), details={"verdict": verdict, "reason": reason})


async def contact_information(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    return await _flag(j, "contact_information", {"text": need(d.response, "response")},
                       "present", ("present", "absent"))


async def language_mismatch(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    return await _flag(j, "language_mismatch", {"question": need(d.question, "question"),
                                                "text": need(d.response, "response")},
                       "different", ("same", "different"))


async def sexism(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    verdict, reason = await yes_no(j, "sexism", {"question": d.question or "",
                                                  "text": need(d.response, "response")})
    return Score(float(verdict == "yes"), details={"verdict": verdict, "reason": reason})


async def stereotypes(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    record = await j.ask("stereotypes", {"question": d.question or "", "text": need(d.response, "response")})
    content = record.get("content")
    score = content.get("score") if isinstance(content, dict) else None
    if not isinstance(score, (int, float)) or isinstance(score, bool) or not 0 <= score <= 10:
        raise Failed("invalid_output", "score is not a number from 0 to 10")
    return Score(score / 10.0, details={"score": score, "reason": content.get("reason")})


async def summarization_judge(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    return await _flag(j, "summarization", {"source": need(d.question, "question (the source text)"),
                                            "summary": need(d.response, "response")},
                       "good", ("good", "bad"))


def byop_program(template):
    """The program of one user template (templates.load_byop): placeholders question, answer,
    references, contexts; a datum without one of them is not_applicable."""

    async def byop(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
        available = {"question": d.question, "answer": d.response, "references": d.references,
                     "contexts": d.contexts}
        values = {name: need(available[name], name) for name in template.inputs}
        record = await j.ask(template, values)
        content = record.get("content") if isinstance(record.get("content"), dict) else {}
        if "verdict" in template.schema.get("properties", {}):
            verdict = content.get("verdict")
            return Score(float(verdict == "pass"), details={"verdict": verdict, "reason": content.get("reason")})
        return Score(float(content.get("score")), details={"reason": content.get("reason")})

    return byop


async def ragas(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    for value, what in ((d.question, "question"), (d.references, "references"), (d.contexts, "contexts")):
        need(value, what)
    if not d.references:
        raise NotApplicable("references")
    parts = await all_of(*(outcome(program, j, d, c) for program in
                           (faithfulness, answer_relevance, context_precision, context_recall)))
    names = ("faithfulness", "answer_relevance", "context_precision", "context_recall")
    details = {name: score.value for name, score in zip(names, parts)}
    for score in parts:
        if score.status != "ok":
            return Score(None, score.status, details)
    return Score(_valid(ks.harmonic_mean([s.value for s in parts]), "components"), details=details)


# ---------------------------------------------------------------- the catalogue

PROGRAMS = {
    "AnswerCorrectness": answer_correctness,
    "AnswerRelevance": answer_relevance,
    "Bias": bias,
    "Toxicity": toxicity,
    "ContextPrecision": context_precision,
    "ContextRecall": context_recall,
    "ContextRelevance": context_relevance,
    "Faithfulness": faithfulness,
    "Hallucination": hallucination,
    "SummaryCoherence": summary_coherence,
    "AnswerAccuracy": answer_accuracy,
    "ContextRelevanceRating": context_relevance_rating,
    "ResponseGroundedness": response_groundedness,
    "ContactInformation": contact_information,
    "LanguageMismatch": language_mismatch,
    "Sexism": sexism,
    "Stereotypes": stereotypes,
    "SummarizationJudge": summarization_judge,
    "RAGAS": ragas,
    "AnswerSemanticSimilarity": answer_semantic_similarity,
    "AnswerRelevanceSimilarity": answer_relevance_similarity,
    "GroundednessSimilarity": groundedness_similarity,
    "ContextRecallSimilarity": context_recall_similarity,
    "ContextPrecisionSimilarity": context_precision_similarity,
    "Perplexity": perplexity,
}
LIKELIHOOD_METRICS = ("Perplexity",) + gptscore.FORMS
CLASSIFIER_METRICS = ("ToxicityClassifier", "FairnessBias", "HHEM", "BERTScore")
JUDGE_METRICS = tuple(PROGRAMS) + gptscore.FORMS + CLASSIFIER_METRICS + ("BYOP",)
EMBEDDING_METRICS = ("AnswerSemanticSimilarity", "AnswerRelevanceSimilarity", "GroundednessSimilarity",
                     "ContextRecallSimilarity", "ContextPrecisionSimilarity")


def metric_programs(metrics, config: JudgeMetricConfig) -> list[tuple[str, dict, object]]:
    """[(record type, record parameters, program)] of the wanted judge metrics, in catalogue
    order; BYOP gives one entry per user template (parameters name it)."""
    out = []
    for name in JUDGE_METRICS:
        if name not in metrics:
            continue
        if name == "BYOP":
            for template in config.byop:
                out.append(("BYOP", {"template": template.name, "template_version": template.version},
                            byop_program(template)))
            continue
        if name in gptscore.FORMS:
            for aspect in gptscore.ASPECTS[name]:
                out.append((name, {"aspect": aspect}, gptscore_program(name, aspect)))
            continue
        if name in CLASSIFIER_METRICS:
            out += classifier_programs(name, config)
            continue
        out.append((name, {}, PROGRAMS[name]))
    return out


TEMPLATES_OF = {
    "AnswerCorrectness": ("statements", "answer_correctness_verdicts"),
    "AnswerRelevance": ("statements", "answer_relevance_verdicts"),
    "Bias": ("opinions", "bias_verdicts"),
    "Toxicity": ("opinions", "toxicity_verdicts"),
    "ContextPrecision": ("context_precision_verdict",),
    "ContextRecall": ("statements", "context_recall_verdicts"),
    "ContextRelevance": ("context_relevance_verdict",),
    "Faithfulness": ("statements", "faithfulness_verdicts"),
    "Hallucination": ("hallucination_verdict",),
    "SummaryCoherence": ("summary_coherence",),
    "AnswerAccuracy": ("nv_answer_accuracy_1", "nv_answer_accuracy_2"),
    "ContextRelevanceRating": ("nv_context_relevance_1", "nv_context_relevance_2"),
    "ResponseGroundedness": ("nv_groundedness_1", "nv_groundedness_2"),
    "ContactInformation": ("contact_information",),
    "LanguageMismatch": ("language_mismatch",),
    "Sexism": ("sexism",),
    "Stereotypes": ("stereotypes",),
    "SummarizationJudge": ("summarization",),
    "RAGAS": ("statements", "faithfulness_verdicts", "answer_relevance_verdicts",
              "context_precision_verdict", "context_recall_verdicts"),
}


def parameters_of(kind: str, extra: dict, config: JudgeMetricConfig) -> dict:
    """The parameters of a metric's records: the judge model and template versions (or the
    embedding model), and the conventions that change its value."""
    from evalbeam.transforms.judge.templates import load_template

    if kind in EMBEDDING_METRICS:
        return {"embedding_model": config.embedding_model, **extra}
    if kind == "Perplexity":
        return {"lm_model": config.lm_model, **extra}
    if kind in gptscore.FORMS:
        return {"lm_model": config.lm_model, "prompt_version": gptscore.PROMPT_VERSION, **extra}
    if kind in CLASSIFIER_METRICS:
        from evalbeam.transforms.judge.scoring import shown_model

        model = shown_model(next(uri for metric, uri, _ in config.classifiers if metric == kind))
        if kind == "BERTScore":
            return {"model_uri": model, "rescaled": config.bertscore_baseline is not None,
                    "idf": config.bertscore_idf, **extra}
        return {"model_uri": model, **extra}
    if kind == "BYOP":
        return {"judge_model": config.model, **extra}
    names = TEMPLATES_OF[kind]
    parameters = {"judge_model": config.model,
                  "template_version": ",".join(f"{n}@{load_template(n).version}" for n in names)}
    if kind == "AnswerCorrectness":
        parameters.update(both_empty=config.both_empty, similarity_weight=config.similarity_weight)
        if config.similarity_weight > 0:
            parameters["embedding_model"] = config.embedding_model
    elif kind in ("AnswerRelevance", "RAGAS"):
        parameters["no_statements"] = config.no_statements_relevance
    if kind in ("Faithfulness", "RAGAS"):
        parameters["no_claims"] = config.no_claims_faithfulness
    if kind == "SummaryCoherence":
        parameters["top_logprobs"] = config.top_logprobs
    return parameters
