"""Metrics that ask a model rather than a judge for a verdict: embedding similarities (an
/embeddings endpoint), log-likelihoods (a /completions endpoint with echoed prompt
log-probabilities, or a causal LM on the workers) and classifiers (a model on the workers or a
scoring endpoint). Programs of the judge engine like the LLM-judge metrics (transforms/judge/
program.py); the catalogue of every metric is in transforms/judge/metrics.py.

Conventions (one per metric; the configurable ones are JudgeMetricConfig fields):
  AnswerSemanticSimilarity   cos(emb(response), emb(reference)), max over references.
  AnswerRelevanceSimilarity  max over the answer's sentences of cos(emb(question), emb(sentence)).
  GroundednessSimilarity     min over answer sentences of max over context sentences of the cosine.
  ContextRecallSimilarity / ContextPrecisionSimilarity   per context, the max over its sentences
                      of cos(emb(question), emb(sentence)); then max (recall) or mean (precision).
  Perplexity         exp of the average negative log-likelihood of the response's tokens under
                      the completions model (config.lm_model; `Judge.logprobs`): >= 1, lower is
                      better; a response of fewer than two tokens is not_applicable. The whole
                      response in one request (no sliding window: it must fit the model's context).
  ToxicityClassifier one record per label of the model (config.json): the label's probability,
                      max over the response's sentences (detoxify's way); an answer without a
                      sentence is 0. Lower is better.
  FairnessBias       the probability of the model's bias label ("Biased"/"Bias" by name, else
                      label 1) for the response (first 512 tokens). Lower is better.
  HHEM               factual consistency of the response with a context, max over contexts:
                      the sigmoid of a one-output pair classifier, else the probability of the
                      label "consistent" (by name), else of label 1. Higher is better;
                      no contexts field or [] -> not_applicable.
  BERTScore          one record per component (precision, recall, f1): greedy cosine matching
                      of the response's and a reference's token embeddings from the encoder
                      (kernels/bertscore.py: special tokens matched, not averaged, as in
                      bert-score), max over references per component; optionally
                      idf-weighted (the dataset's references' idf, Judge.idf) and rescaled
                      with the model's baseline. No references -> not_applicable.
  GPTScore<form>     one record per aspect (transforms/judge/gptscore.py): the average negative
                      log-likelihood of the target's tokens after the aspect's prompt, lower is
                      better; the reference forms average both directions and take the best
                      (lowest) reference.
"""

from __future__ import annotations

from evalbeam.transforms.judge import gptscore
from evalbeam.transforms.judge.program import (Datum, Failed, Judge, JudgeMetricConfig,
                                               NotApplicable, Score, all_of, need)
from evalbeam.transforms.judge.requests import INVALID_OUTPUT
from evalbeam.transforms.kernels import bertscore as bs
from evalbeam.transforms.kernels import judge_scores as ks
from evalbeam.transforms.kernels import log_likelihood as ll


async def _vectors(j: Judge, texts: list[str]) -> list:
    return list(await all_of(*(j.embed(t) for t in texts)))


def _similarity(value, what: str) -> Score:
    return Score(value, "ok" if value is not None else "no_statements", {"empty": what} if value is None else {})


async def answer_semantic_similarity(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    references = need(d.references, "references")
    if not references:
        raise NotApplicable("references")
    response, *refs = await _vectors(j, [need(d.response, "response"), *references])
    return _similarity(ks.answer_similarity(response, refs), "vectors")


async def answer_relevance_similarity(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    question = need(d.question, "question")
    sentences = ks.split_sentences(need(d.response, "response"))
    query, *vectors = await _vectors(j, [question, *sentences])
    return _similarity(ks.sentence_relevancy(query, vectors), "answer sentences")


async def groundedness_similarity(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    contexts = need(d.contexts, "contexts")
    answer = ks.split_sentences(need(d.response, "response"))
    context = [s for ctx in contexts for s in ks.split_sentences(ctx)]
    vectors = await _vectors(j, answer + context)
    return _similarity(ks.groundedness(vectors[:len(answer)], vectors[len(answer):]), "sentences")


async def _chunk_relevancy(j: Judge, d: Datum) -> tuple:
    question = need(d.question, "question")
    chunks = [ks.split_sentences(ctx) for ctx in need(d.contexts, "contexts")]
    query = await j.embed(question)
    vectors = await all_of(*(_vectors(j, chunk) for chunk in chunks))
    return ks.context_relevancy(query, list(vectors))


async def context_recall_similarity(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    return _similarity((await _chunk_relevancy(j, d))[0], "contexts")


async def context_precision_similarity(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    return _similarity((await _chunk_relevancy(j, d))[1], "contexts")


# ---------------------------------------------------------------- log-likelihood metrics

async def perplexity(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    tokens = await j.logprobs(need(d.response, "response"))
    value = ll.perplexity(tokens["token_logprobs"])
    if value is None:
        raise NotApplicable("a response of two tokens or more")
    return Score(value)


async def _target_nll(j: Judge, prefix: str, target: str) -> float:
    """ANLL of the target's tokens after the prefix (kernels/log_likelihood.py mean_nll)."""
    prompt = prefix + target
    tokens = await j.logprobs(prompt)
    value = ll.mean_nll(tokens["token_logprobs"], tokens["text_offset"], len(prefix), len(prompt))
    if value is None:
        raise Failed(INVALID_OUTPUT, "no log-probability for the scored tokens")
    return value


def gptscore_program(form: str, aspect: str):
    """The program of one GPTScore form and aspect (transforms/judge/gptscore.py)."""

    async def program(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
        response = need(d.response, "response")
        if form == "GPTScoreQA":
            return Score(await _target_nll(j, *gptscore.qa_prompt(aspect, need(d.question, "question"), response)))
        if form == "GPTScoreSummarizationNoReference":
            return Score(await _target_nll(j, *gptscore.summary_prompt(aspect, need(d.question, "question"),
                                                                         response)))
        references = need(d.references, "references")
        if not references:
            raise NotApplicable("references")
        both = await all_of(*(_target_nll(j, *gptscore.rewrite_prompt(form, aspect, a, b))
                              for reference in references
                              for a, b in ((reference, response), (response, reference))))
        return Score(min((both[i] + both[i + 1]) / 2 for i in range(0, len(both), 2)))

    return program


# ---------------------------------------------------------------- classifier metrics

def probability_of(answer: dict, label: str, index: int | None = None) -> float:
    """The probability of `label` (by name) in a classifier's answer. index None: the label
    must be there (it was read from the model before the run), else the answer is
    invalid_output; an index: a model that does not name `label` gives the probability of
    label `index` instead (the last label when there are fewer; HHEM's rule)."""
    labels, values = answer["labels"], answer["probabilities"]
    if label in labels:
        return float(values[labels.index(label)])
    if index is None:
        raise Failed(INVALID_OUTPUT, f"the classifier's answer has no label {label!r} (it names "
                                     f"{', '.join(map(str, labels[:10]))})")
    return float(values[min(index, len(values) - 1)])


def bias_label(labels) -> str:
    """The label FairnessBias reports: the one named biased/bias, else label 1 (HF's positive
    class), else the only one."""
    named = [name for name in labels if name.lower() in ("biased", "bias")]
    return named[0] if named else labels[min(1, len(labels) - 1)]


def toxicity_program(model: str, label: str):
    async def program(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
        sentences = ks.split_sentences(need(d.response, "response"))
        if not sentences:
            return Score(0.0)
        answers = await all_of(*(j.classify(model, sentence) for sentence in sentences))
        return Score(max(probability_of(answer, label) for answer in answers))

    return program


def fairness_bias_program(model: str, label: str):
    async def program(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
        return Score(probability_of(await j.classify(model, need(d.response, "response")), label))

    return program


def hhem_program(model: str):
    async def program(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
        response = need(d.response, "response")
        contexts = need(d.contexts, "contexts")
        if not contexts:
            raise NotApplicable("contexts")
        answers = await all_of(*(j.classify(model, context, response) for context in contexts))
        return Score(max(probability_of(answer, "consistent", 1) for answer in answers))

    return program


BERTSCORE_COMPONENTS = ("precision", "recall", "f1")


def bertscore_program(model: str, component: str):
    index = BERTSCORE_COMPONENTS.index(component)

    async def program(j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
        references = need(d.references, "references")
        if not references:
            raise NotApplicable("references")
        response, *refs = await all_of(*(j.token_vectors(model, text)
                                         for text in [need(d.response, "response"), *references]))

        def weights(tokens):
            return None if j.idf is None else bs.idf(tokens["ids"], *j.idf)

        value = bs.best([bs.scores(response["vectors"], ref["vectors"], weights(response), weights(ref),
                                   response["special"], ref["special"]) for ref in refs])[index]
        if c.bertscore_baseline is not None:
            value = bs.rescale(value, c.bertscore_baseline[index])
        return Score(value)

    return program


def classifier_programs(name: str, config: JudgeMetricConfig) -> list[tuple[str, dict, object]]:
    """[(record type, parameters, program)] of one classifier metric: ToxicityClassifier one
    per label of its model."""
    model, labels = next((uri, tuple(labels)) for metric, uri, labels in config.classifiers if metric == name)
    if name == "ToxicityClassifier":
        return [(name, {"label": label}, toxicity_program(model, label)) for label in labels]
    if name == "FairnessBias":
        label = bias_label(labels)
        return [(name, {"label": label}, fairness_bias_program(model, label))]
    if name == "BERTScore":
        return [(name, {"component": component}, bertscore_program(model, component))
                for component in BERTSCORE_COMPONENTS]
    return [(name, {}, hhem_program(model))]
