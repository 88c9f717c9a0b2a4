"""A metric program of the judge engine: what it is given, what it may ask, what it returns.

A program is an async function (judge, datum, config) -> Score, run on one datum by
score_metric. It asks through its `Judge`, bound to the worker's JudgeSession and to the
metric's name: `ask(template, values)` (one chat request from a versioned template, see
templates.py), `embed(text)` (one /embeddings request), `logprobs(prompt)` (one /completions
request with echo), `classify` and `token_vectors` (a model on the workers or a scoring
endpoint). A call that does not end "ok" raises `Failed`, which score_metric turns into the
datum's status (the datum is counted, never averaged as a number); a missing required input
raises `NotApplicable` (status "not_applicable"). Requests shared by several metrics (the
statements of an answer serve AnswerCorrectness, AnswerRelevance, Faithfulness and RAGAS) are
sent once: the session serves them from the journal or from the request in flight.

Inputs of a datum: question (ground truth "query"), references (ground truth "references"),
response and contexts (prediction). None = absent; an empty list is present but empty.

The programs: transforms/judge/metrics.py (LLM-judge metrics, and the catalogue of every
metric) and transforms/judge/model_metrics.py (embedding, log-likelihood and classifier
metrics).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from evalbeam.transforms.judge.requests import (JudgeRequest, classify_request, embedding_request,
                                                logprob_request, token_vectors_request)
from evalbeam.transforms.judge.session import DRY_RUN


@dataclass(frozen=True)
class JudgeMetricConfig:
    model: str
    embedding_model: str = "text-embedding-3-small"
    lm_model: str = "gpt2-medium"                # completions model of the log-likelihood metrics
    temperature: float = 0.0
    seed: int | None = None
    top_logprobs: int = 5
    similarity_weight: float = 0.0               # AnswerCorrectness blend (RAGAS: 0.25)
    both_empty: float | None = 1.0               # AnswerCorrectness without statements (RAGAS)
    no_statements_relevance: float | None = 1.0  # AnswerRelevance without statements (DeepEval)
    no_claims_faithfulness: float | None = None  # Faithfulness without claims (RAGAS: NaN)
    byop: tuple = ()                             # Templates from users' files (templates.load_byop)
    # (metric, model folder, its label names) of the classifier metrics (local_classifier.py)
    # and of BERTScore (local_encoder.py; no labels)
    classifiers: tuple = ()
    bertscore_baseline: tuple | None = None      # (P, R, F) baselines: rescaled BERTScore
    bertscore_idf: bool = False                  # idf-weighted BERTScore (the references' idf)


@dataclass
class Datum:
    question: str | None
    references: list | None
    response: str | None
    contexts: list | None


@dataclass
class Score:
    value: float | None
    status: str = "ok"
    details: dict = field(default_factory=dict)


class Failed(Exception):
    """A judge call that did not end ok, or an answer that does not fit: ends the metric."""

    def __init__(self, status: str, message: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message


class NotApplicable(Exception):
    """A required input of the metric is absent for this datum."""


class Judge:
    """What a metric program may ask, bound to one session and one metric name."""

    def __init__(self, session, config: JudgeMetricConfig, metric: str, idf=None):
        self.session = session
        self.config = config
        self.metric = metric
        self.dry = False
        # (documents, {token id: df}) of the dataset's references, with --bertscore_idf
        self.idf = idf

    def _template(self, template):
        from evalbeam.transforms.judge.templates import load_template

        return load_template(template) if isinstance(template, str) else template

    async def ask(self, template, values: dict, logprobs: int | None = None) -> dict:
        """The record of one chat request; raises Failed unless ok (or a dry run)."""
        from evalbeam.transforms.judge.templates import render_messages, request_schema

        t = self._template(template)
        request = JudgeRequest(model=self.config.model, messages=render_messages(t, values),
                               temperature=self.config.temperature, seed=self.config.seed,
                               max_tokens=t.max_tokens, response_schema=request_schema(t, values),
                               template=t.name, template_version=t.version, logprobs=logprobs)
        return self._checked(await self.session.call(request, self.metric))

    async def embed(self, text: str) -> list:
        record = self._checked(await self.session.call(
            embedding_request(self.config.embedding_model, text), self.metric))
        return record["content"]

    async def logprobs(self, prompt: str) -> dict:
        """The prompt's tokens, their log-probabilities and offsets under config.lm_model (one
        /completions request with echo; requests.logprob_request)."""
        record = self._checked(await self.session.call(
            logprob_request(self.config.lm_model, prompt), self.metric))
        return record["content"]

    async def classify(self, model: str, text: str, pair: str | None = None) -> dict:
        """{"labels", "probabilities"} of a classifier on the workers (requests.classify_request)."""
        record = self._checked(await self.session.call(classify_request(model, text, pair), self.metric))
        return record["content"]

    async def token_vectors(self, model: str, text: str) -> dict:
        """{"vectors": float[n, H], "ids": int[n], "special": bool[n]} of the text's tokens,
        the special ones marked (local_encoder.py)."""
        record = self._checked(await self.session.call(token_vectors_request(model, text), self.metric))
        return record["content"]

    def _checked(self, record: dict) -> dict:
        status = record.get("status")
        if status == DRY_RUN:
            self.dry = True
        elif status != "ok":
            raise Failed(status, record.get("error") or "")
        return record


async def all_of(*awaitables) -> list:
    """Like asyncio.gather, but every awaitable runs to its end and the first exception in
    argument order (not in time) is raised: a datum's status does not depend on timing."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)


def need(value, what: str):
    if value is None:
        raise NotApplicable(what)
    return value


async def score_metric(session, config: JudgeMetricConfig, metric: str, program, datum: Datum,
                       idf=None) -> Score:
    """Run one program on one datum: its Score, with the status of a failure or of a missing
    input; in a dry run the status is dry_run (the simulated answers are no result). idf:
    BERTScore's table (Judge.idf), or None."""
    j = Judge(session, config, metric, idf)
    score = await outcome(program, j, datum, config)
    if j.dry and score.status != "not_applicable":
        score = Score(None, DRY_RUN, {})
    return score


async def outcome(program, j: Judge, d: Datum, c: JudgeMetricConfig) -> Score:
    """The Score of one program on one datum, a Failed or a NotApplicable as its status (the
    error or the missing input in the details)."""
    try:
        return await program(j, d, c)
    except Failed as failure:
        return Score(None, failure.status, {"error": failure.message})
    except NotApplicable as missing:
        return Score(None, "not_applicable", {"missing": str(missing)})
