"""Judge requests and responses: frozen, hashable, picklable value objects.

A `JudgeRequest` is everything that determines the judge's answer: the model, the messages,
the sampling parameters, the response schema and the template version. `request_hash` is the
sha256 of its canonical JSON and is the key of the journal / cache. It never includes the
server URL or the API key, so the same request against a different endpoint or with a rotated
key has the same hash (the endpoint is recorded separately, with `system_fingerprint`).

The template *name* is not hashed: renaming a template without changing its text must not
invalidate cached answers; the template *version* is, because a new version means new text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing

# Final statuses of one judge call.
OK = "ok"
INVALID_OUTPUT = "invalid_output"  # no JSON, or JSON failing the schema after the one repair
TRUNCATED = "truncated"  # finish_reason "length": the answer was cut, never parsed
TIMEOUT = "timeout"  # per-attempt timeouts exhausted the retries, or the call's deadline passed
RATE_LIMITED = "rate_limited"  # 429 (not quota) still failing after the retries
QUOTA_EXCEEDED = "quota_exceeded"  # 429 with error code insufficient_quota: billing, never retried
HTTP_ERROR = "http_error"  # permanent 4xx, or 5xx / connection errors after the retries
REFUSED = "refused"  # message.refusal, finish_reason content_filter, or a content-filter 400
STATUSES = (OK, INVALID_OUTPUT, TRUNCATED, TIMEOUT, RATE_LIMITED, QUOTA_EXCEEDED, HTTP_ERROR, REFUSED)


def canonical_json(value: typing.Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
    """One chat completion to ask a judge.

    `messages` may be given as any sequence of (role, content) pairs (or {"role", "content"}
    dicts); it is stored as a tuple of tuples. `response_schema` may be given as a dict; it is
    stored as canonical JSON text so the dataclass stays hashable. Use `.schema` to get the dict.
    """

    model: str
    messages: tuple[tuple[str, str], ...]
    temperature: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    response_schema: str | None = None
    template: str = ""
    template_version: str = ""
    # "chat": POST /chat/completions; "embedding": POST /embeddings, the one message's content
    # is the input text (role "input") and the response content is the vector; "logprobs":
    # POST /completions with echo, the one message's content is the prompt (role "prompt") and
    # the response content is its tokens' log-probabilities (PromptLogprobs fields);
    # "classify": a text classifier on the workers (local_classifier.py), messages ("text", t)
    # and optionally ("text_pair", p), content {"labels", "probabilities"}; "tokens": a text
    # encoder on the workers (local_encoder.py), message ("text", t), content {"vectors"}
    kind: str = "chat"
    # top_logprobs wanted with the answer (chat only; None: no logprobs asked)
    logprobs: int | None = None

    def __post_init__(self):
        if self.kind not in ("chat", "embedding", "logprobs", "classify", "tokens"):
            raise ValueError(f"unknown judge request kind {self.kind!r}")
        pairs = []
        for message in self.messages:
            if isinstance(message, dict):
                message = (message["role"], message["content"])
            role, content = message
            pairs.append((str(role), str(content)))
        if not pairs:
            raise ValueError("a judge request needs at least one message")
        # frozen: __setattr__ is blocked, normalising in place is the documented way around it
        object.__setattr__(self, "messages", tuple(pairs))
        if self.response_schema is not None and not isinstance(self.response_schema, str):
            object.__setattr__(self, "response_schema", canonical_json(self.response_schema))
        elif isinstance(self.response_schema, str):
            # re-canonicalise text too, so {"a":1} and { "a": 1 } hash the same
            object.__setattr__(self, "response_schema", canonical_json(json.loads(self.response_schema)))

    @property
    def schema(self) -> dict | None:
        return None if self.response_schema is None else json.loads(self.response_schema)


def request_hash(req: JudgeRequest) -> str:
    """sha256 hex of the canonical JSON of what determines the answer (no URL, no key, no name)."""
    payload = {
        "model": req.model,
        "messages": [list(pair) for pair in req.messages],
        "temperature": req.temperature,
        "seed": req.seed,
        "max_tokens": req.max_tokens,
        "response_schema": req.schema,
        "template_version": req.template_version,
    }
    # added only when set, so the hashes of plain chat requests stay what they were
    if req.kind != "chat":
        payload["kind"] = req.kind
    if req.logprobs is not None:
        payload["logprobs"] = req.logprobs
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def empty_usage() -> dict:
    return {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "reasoning_tokens": 0}


def parse_usage(raw: typing.Any) -> dict:
    """The four counters from an OpenAI `usage` object; missing or malformed fields count 0.

    DeepSeek's `prompt_cache_hit_tokens` stands in for `prompt_tokens_details.cached_tokens`.
    """
    usage = empty_usage()
    if not isinstance(raw, dict):
        return usage

    def number(value):
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0

    usage["prompt_tokens"] = number(raw.get("prompt_tokens"))
    usage["completion_tokens"] = number(raw.get("completion_tokens"))
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None
    usage["cached_tokens"] = number(cached if cached is not None else raw.get("prompt_cache_hit_tokens"))
    if isinstance(completion_details, dict):
        usage["reasoning_tokens"] = number(completion_details.get("reasoning_tokens"))
    return usage


def add_usage(a: dict, b: dict) -> dict:
    return {key: a.get(key, 0) + b.get(key, 0) for key in empty_usage()}


@dataclasses.dataclass(frozen=True)
class JudgeResponse:
    """The final outcome of one judge call (after retries, fallbacks and the one repair).

    `content` is the parsed JSON object when the request had a schema and the status is ok,
    the answer text when it had none, the vector (list of floats) for an embedding request, and
    None otherwise. `raw_text` is the last answer text
    received (also for invalid_output / truncated, so the journal keeps the evidence).
    `usage` sums every attempt that returned a body, the repair included. `attempts` counts
    HTTP requests sent (format fallbacks and the repair included). `error` is short and
    redacted: it never contains the API key.
    """

    hash: str
    status: str
    content: typing.Any = dataclasses.field(default=None, hash=False)
    raw_text: str | None = None
    usage: dict = dataclasses.field(default_factory=empty_usage, hash=False)
    latency_s: float = 0.0
    attempts: int = 0
    model: str | None = None
    system_fingerprint: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    # choices[0].logprobs.content when logprobs were asked and the server sent them
    logprobs: typing.Any = dataclasses.field(default=None, hash=False)

    @property
    def ok(self) -> bool:
        return self.status == OK


def embedding_request(model: str, text: str) -> JudgeRequest:
    """The request for the embedding of one text (one text per request, so that each text is
    journaled and reused on its own, e.g. a question shared by several metrics and models)."""
    return JudgeRequest(model=model, messages=(("input", text),), kind="embedding")


def logprob_request(model: str, prompt: str) -> JudgeRequest:
    """The request for the log-probability of every token of `prompt` under a completions model
    (POST /completions with echo and logprobs; one generated token is asked for and dropped).
    The answer's content: {"tokens": [str], "token_logprobs": [float | None], "text_offset":
    [int]} over the prompt's tokens only; the first token's log-probability is None (nothing
    conditions it)."""
    return JudgeRequest(model=model, messages=(("prompt", prompt),), kind="logprobs")


def classify_request(model: str, text: str, pair: str | None = None) -> JudgeRequest:
    """The request for a classifier's label probabilities of one text, or of a (text, pair)
    pair (a cross-encoder such as HHEM: context, answer); model is the classifier's folder."""
    messages = (("text", text),) if pair is None else (("text", text), ("text_pair", pair))
    return JudgeRequest(model=model, messages=messages, kind="classify")


def token_vectors_request(model: str, text: str) -> JudgeRequest:
    """The request for the contextual embeddings of a text's tokens (BERTScore); model is the
    encoder's folder."""
    return JudgeRequest(model=model, messages=(("text", text),), kind="tokens")
