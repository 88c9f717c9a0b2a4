"""Async OpenAI-compatible judge client: one aiohttp session, rate limits, retries, structured output.

    async with JudgeClient(url, api_key, rpm=60, tpm=100_000) as client:
        responses = await client.run(requests)        # one JudgeResponse per request, in order

Nothing raises for a failed call: every failure becomes a status (see requests.py).

Per call:
- POST {url}/chat/completions, `Authorization: Bearer <key>` (the key lives only in that header),
  with model, messages, temperature, seed, max_tokens (when set) and, when the request has a
  schema, `response_format`.
- Response format modes, tried in order, remembered per client (never upgraded again):
  json_schema -> json_object -> text. A downgrade happens when the server answers 400 and the
  error text names the format ("response_format", "json_schema" or "json_object") together with
  "support", "unknown", "unrecognized" or "not allowed". In json_object and text modes a system
  message with the schema is appended so the model knows to answer JSON. The answer is read with
  json.loads, else the first balanced {...} object in the text is extracted, then validated with
  jsonschema. Format downgrades are sent at once and do not use up the retry budget.
- Invalid JSON (or schema violation) -> ONE repair request: the messages, the previous answer as
  the assistant turn, and a user turn with the validation error asking for corrected JSON only.
  Still invalid -> invalid_output.
- finish_reason "length" -> truncated (not parsed); "content_filter" or a `refusal` -> refused.
- Retries (tenacity): only transient errors - 408, 409, 429 unless error code insufficient_quota,
  5xx, connection errors (resets included) and per-attempt timeouts - up to `max_attempts` HTTP
  attempts per request (the repair has its own budget). Wait: `retry-after-ms` (ms), else
  `Retry-After` (seconds, floats allowed, or an HTTP date) when 0 < delay <= max_retry_after_s;
  a larger server delay means fail at once; otherwise full jitter: uniform(0, min(backoff_max_s,
  backoff_base_s * 2 ** (attempt - 1))). A 429 also pauses the shared limiter for that delay.
- Permanent: 400/401/403/404 (and other 4xx) -> http_error after 1 attempt, or refused when the
  error looks like a content filter (code content_filter / content_policy_violation, or the text
  "content management policy" / "content filter"); 429 insufficient_quota -> quota_exceeded.
- Timeouts: `timeout_s` per attempt (connect capped at 5 s); `deadline_s` per call counted from
  when its first attempt is sent (queueing for a slot and behind the limiter before that does
  not count), covering everything after: retries, backoff sleeps, waits for a free request slot
  and for the limiter, the repair, and the request in flight (its timeout is cut to what is left).
  A retry whose wait would cross the deadline is not made. Deadline -> timeout. A call ends within
  a few milliseconds of its deadline (aiohttp's rounding of timeouts to whole seconds is off).
- Rate limits (limits.py): the concurrency semaphore is taken first, then the rpm/tpm limiter,
  so requests waiting for a slot cannot bank rate and burst later. Usage corrects the token
  estimate; x-ratelimit-* headers may pause the limiter.
- Embedding requests (request.kind "embedding") POST {url}/embeddings with {"model", "input"} and
  end ok with the vector as content; the same retries, limits and deadline apply.
- Log-probability requests (kind "logprobs") POST {url}/completions with {"model", "prompt",
  "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0} (OpenAI's legacy completions,
  vLLM, llama.cpp's server) and end ok with the prompt's tokens, their log-probabilities and
  character offsets as content (the generated token dropped); an answer without them, or with
  malformed ones (prompt_logprobs), is invalid_output.
- Classify requests (kind "classify") whose model is a scoring endpoint's URL (scoring.py)
  POST that URL (the client's url is the route) with the route's body, and end ok with
  {"labels", "probabilities"}; an answer without them is invalid_output.
- logprobs: a request with `logprobs=k` asks `logprobs: true, top_logprobs: k` and the response
  keeps choices[0].logprobs.content; a 400 naming logprobs drops them for the rest of the client's
  life (like a format fallback: at once, free).
- `on_response(response)` is called once per request, as soon as it is final; an exception in
  it is logged (redacted) and swallowed, so it cannot lose other results.
- An answer body over MAX_BODY_BYTES (64 MiB) is not read: http_error at once.
- The API key is redacted (replaced by "***") from every error text and log line; the client's
  repr does not show it. `scrubbed(record)` does the same in every string of an answer's
  record, which the session applies before journaling: a server that echoes the key cannot
  put it in the journal or the scores.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import json
import logging
import math
import random
import time
import typing

import aiohttp
import jsonschema
from tenacity import AsyncRetrying, retry_if_exception_type

from evalbeam.transforms.judge import requests as rq
from evalbeam.transforms.judge import scoring
from evalbeam.transforms.judge.limits import RateLimiter, estimate_tokens

log = logging.getLogger("evalbeam.judge")

MODES = ("json_schema", "json_object", "text")
TRANSIENT_STATUS = {408, 409, 429}
MAX_ERROR_CHARS = 300
# the largest answer read: a long prompt's echoed log-probabilities are ~1 MB, an embedding
# ~100 KB; a body past this is a broken or hostile server, not an answer
MAX_BODY_BYTES = 64 << 20
# the request kinds answered by one POST (no repair): the _Reply field holding the content, and
# the error when the answer lacks it (invalid_output)
ANSWER_FIELDS = {
    "embedding": ("vector", "no embedding in the answer"),
    "classify": ("classified", "no label probabilities in the answer"),
    "logprobs": ("prompt_logprobs", "no prompt log-probabilities in the answer (echo and logprobs "
                                    "on /completions)"),
}


class _Transient(Exception):
    """A retryable failure. `status` is the final status if the retries run out."""

    def __init__(self, status: str, message: str, retry_after: float | None = None,
                 give_up: bool = False):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.give_up = give_up  # e.g. Retry-After beyond max_retry_after_s


class _FormatFallback(Exception):
    """The server rejected the response_format: retry at once in the next mode."""


class _Reply(typing.NamedTuple):
    """A 200 answer, reduced to what the client needs."""

    text: str | None
    finish_reason: str | None
    refusal: str | None
    usage: dict
    model: str | None
    fingerprint: str | None
    logprobs: typing.Any = None     # choices[0].logprobs.content, when sent
    vector: typing.Any = None       # data[0].embedding of an embedding request
    prompt_logprobs: typing.Any = None  # the prompt's tokens of a logprobs request
    classified: typing.Any = None   # {"labels", "probabilities"} of a scoring endpoint's answer


class _CallState:
    """Mutable bookkeeping of one judge call (attempts, usage, deadline)."""

    def __init__(self):
        self.attempts = 0
        self.budget_attempts = 0  # attempts that count against max_attempts (not format fallbacks)
        self.usage = rq.empty_usage()
        self.deadline: float | None = None
        self.last: _Reply | None = None


def parse_retry_after(headers: typing.Mapping[str, str], now: float | None = None) -> float | None:
    """Server-suggested delay in seconds: retry-after-ms, else Retry-After seconds or HTTP date."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return float(value) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return when.timestamp() - (time.time() if now is None else now)


def extract_json_object(text: str) -> typing.Any:
    """json.loads(text), else the first balanced {...} in the text that parses; raises ValueError.

    The scan respects strings (braces inside "..." do not count), so prose around the object
    and code fences are tolerated.
    """
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        pass
    if not isinstance(text, str):
        raise ValueError("no text")
    start = text.find("{")
    while start != -1:
        depth, in_string, escaped = 0, False, False
        for index in range(start, len(text)):
            char = text[index]
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
            elif char == '"':
                in_string = True
            elif char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    try:
                        return json.loads(text[start:index + 1])
                    except ValueError:
                        break
        start = text.find("{", start + 1)
    raise ValueError("no JSON object found in the answer")


class JudgeClient:
    """See the module docstring for the rules. Use as an async context manager.

    Its settings, each used as the module docstring says: the endpoint (url, api_key); its
    limits (rpm, tpm, concurrency; or a shared `limiter`, window_s scaling the limiter's minute
    down in tests); its time (timeout_s per attempt, deadline_s per call); its retries
    (max_attempts, backoff_base_s, backoff_max_s, max_retry_after_s); and on_response. They are
    flat keywords with defaults that suit a hosted endpoint, so that a caller names only what it
    changes (the session: the limits and times of its worker's share; tests: timings of
    milliseconds), as aiohttp's own client settings are; the ones after `*` are keyword-only."""

    def __init__(self, url: str, api_key: str | None, rpm: int = 60, tpm: int = 100_000,
                 concurrency: int = 8, timeout_s: float = 60.0, deadline_s: float = 300.0,
                 max_attempts: int = 4, *, on_response: typing.Callable[[rq.JudgeResponse], None] | None = None,
                 backoff_base_s: float = 0.5, backoff_max_s: float = 8.0, max_retry_after_s: float = 120.0,
                 window_s: float = 60.0, limiter: RateLimiter | None = None):
        self.url = url.rstrip("/")
        self._api_key = api_key or ""
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.max_attempts = max(1, max_attempts)
        self.on_response = on_response
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_retry_after_s = max_retry_after_s
        # window_s < 60 scales time for tests: rpm/tpm then mean "per window_s seconds"
        self.limiter = limiter or RateLimiter(rpm, tpm, window_s=window_s)
        self.mode_index = 0  # index into MODES; only ever increases
        self.logprobs_ok = True  # False once the server rejected logprobs (then never sent again)
        self.max_body_bytes = MAX_BODY_BYTES
        self._session: aiohttp.ClientSession | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"JudgeClient(url={self.url!r}, concurrency={self.concurrency}, mode={MODES[self.mode_index]!r})"

    @property
    def mode(self) -> str:
        return MODES[self.mode_index]

    async def __aenter__(self) -> "JudgeClient":
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._session = aiohttp.ClientSession(headers=headers)
        self._semaphore = asyncio.Semaphore(self.concurrency)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def redact(self, text: typing.Any) -> str:
        text = str(text)
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text[:MAX_ERROR_CHARS]

    def scrubbed(self, value: typing.Any) -> typing.Any:
        """value (an answer's record: dicts, lists, strings, numbers) with the API key replaced
        by "***" in every string, keys included: a server that echoes the Authorization header
        into its answer cannot put the key in the journal, the scores or the outputs."""
        if not self._api_key:
            return value
        if isinstance(value, str):
            return value.replace(self._api_key, "***")
        if isinstance(value, dict):
            return {self.scrubbed(k): self.scrubbed(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.scrubbed(v) for v in value]
        return value

    # ---------------------------------------------------------------- public
    async def run(self, requests: typing.Sequence[rq.JudgeRequest]) -> list[rq.JudgeResponse]:
        """Judge all requests concurrently (bounded by the limits); results in input order."""
        return list(await asyncio.gather(*(self.judge(req) for req in requests)))

    async def judge(self, req: rq.JudgeRequest) -> rq.JudgeResponse:
        """One request to its final JudgeResponse. Never raises (except on cancellation)."""
        if self._session is None:
            raise RuntimeError("use `async with JudgeClient(...)`")
        started = time.monotonic()
        state = _CallState()
        try:
            response = await self._judge(req, state, started)
        except Exception as exc:  # a bug or an unexpected server shape must not lose the row
            response = self._failure(req, state, started, rq.HTTP_ERROR, f"{type(exc).__name__}: {exc}")
        log.info("judge %s %s attempts=%d %.3fs", response.hash[:12], response.status,
                 response.attempts, response.latency_s)
        if self.on_response is not None:
            try:
                self.on_response(response)
            except Exception as exc:  # the journal failing must not lose the other results
                log.error("on_response failed: %s", self.redact(exc))
        return response

    # ---------------------------------------------------------------- one call
    async def _judge(self, req: rq.JudgeRequest, state: _CallState, started: float) -> rq.JudgeResponse:
        schema = req.response_schema  # canonical JSON text, or None
        messages = [{"role": role, "content": content} for role, content in req.messages]
        if req.kind in ANSWER_FIELDS:     # one POST; its answer's field is the content
            field, missing = ANSWER_FIELDS[req.kind]
            try:
                reply = await self._complete(req, messages, state)
            except _Transient as exc:
                return self._failure(req, state, started, exc.status, exc.message)
            content = getattr(reply, field)
            if not content:
                return self._failure(req, state, started, rq.INVALID_OUTPUT, missing, reply)
            return self._success(req, state, started, reply, content)
        final, reply = await self._reply(req, messages, state, started, schema)
        if final is not None:
            return final
        try:
            value = extract_json_object(reply.text)
            validate_answer(value, req.response_schema)
            return self._success(req, state, started, reply, value)
        except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError) as exc:
            problem = _describe(exc)
        log.info("judge %s invalid output, repairing: %s", rq.request_hash(req)[:12], self.redact(problem))
        repair = messages + [
            {"role": "assistant", "content": reply.text or ""},
            {"role": "user", "content": (
                "Your previous answer was not valid JSON for the required schema: " + problem
                + "\nReply with the corrected JSON object only.")},
        ]
        state.budget_attempts = 0  # the repair has its own retry budget
        final, reply = await self._reply(req, repair, state, started, schema)
        if final is not None:
            return final
        try:
            value = extract_json_object(reply.text)
            validate_answer(value, req.response_schema)
        except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError) as exc:
            return self._failure(req, state, started, rq.INVALID_OUTPUT, "after repair: " + _describe(exc), reply)
        return self._success(req, state, started, reply, value)

    async def _reply(self, req, messages: list[dict], state: _CallState, started, schema):
        """One completion, retries included: (the final response, reply) when that ends the call
        (a failure, or what _finish settles), else (None, reply) with a text to parse."""
        try:
            reply = await self._complete(req, messages, state)
        except _Transient as exc:
            return self._failure(req, state, started, exc.status, exc.message), None
        return self._finish(req, state, started, reply, schema), reply

    def _finish(self, req, state, started, reply: _Reply, schema) -> rq.JudgeResponse | None:
        """The final response when no parsing is needed (or allowed); None to go on parsing."""
        if reply.refusal:
            return self._failure(req, state, started, rq.REFUSED, "refusal: " + reply.refusal, reply)
        if reply.finish_reason == "content_filter":
            return self._failure(req, state, started, rq.REFUSED, "finish_reason content_filter", reply)
        if reply.finish_reason == "length":
            return self._failure(req, state, started, rq.TRUNCATED, "finish_reason length", reply)
        if reply.text is None:
            return self._failure(req, state, started, rq.INVALID_OUTPUT, "no message content", reply)
        if schema is None:
            return self._success(req, state, started, reply, reply.text)
        return None

    def _success(self, req, state, started, reply: _Reply, content) -> rq.JudgeResponse:
        return rq.JudgeResponse(
            hash=rq.request_hash(req), status=rq.OK, content=content, raw_text=reply.text,
            usage=dict(state.usage), latency_s=time.monotonic() - started, attempts=state.attempts,
            model=reply.model, system_fingerprint=reply.fingerprint, finish_reason=reply.finish_reason,
            logprobs=reply.logprobs)

    def _failure(self, req, state, started, status: str, error: str, reply: _Reply | None = None) -> rq.JudgeResponse:
        reply = reply or state.last
        return rq.JudgeResponse(
            hash=rq.request_hash(req), status=status, content=None,
            raw_text=reply.text if reply else None, usage=dict(state.usage),
            latency_s=time.monotonic() - started, attempts=state.attempts,
            model=reply.model if reply else None, system_fingerprint=reply.fingerprint if reply else None,
            finish_reason=reply.finish_reason if reply else None, error=self.redact(error))

    # ---------------------------------------------------------------- retries
    async def _complete(self, req: rq.JudgeRequest, messages: list[dict], state: _CallState) -> _Reply:
        """One chat completion with retries; raises _Transient (final) on failure."""

        def stop(retry_state) -> bool:
            exc = retry_state.outcome.exception()
            if isinstance(exc, _FormatFallback):
                return False
            if isinstance(exc, _Transient) and exc.give_up:
                return True
            if state.budget_attempts >= self.max_attempts:
                return True
            remaining = self._remaining(state)
            return remaining is not None and retry_state.upcoming_sleep >= remaining

        def wait(retry_state) -> float:
            exc = retry_state.outcome.exception()
            if isinstance(exc, _FormatFallback):
                return 0.0
            if isinstance(exc, _Transient) and exc.retry_after is not None:
                return exc.retry_after
            ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** max(state.budget_attempts - 1, 0))
            return random.uniform(0.0, ceiling)  # full jitter

        def before_sleep(retry_state) -> None:
            exc = retry_state.outcome.exception()
            log.info("judge %s retry in %.3fs after: %s", rq.request_hash(req)[:12],
                     retry_state.upcoming_sleep, self.redact(exc))

        retrying = AsyncRetrying(stop=stop, wait=wait, before_sleep=before_sleep, reraise=True,
                                 retry=retry_if_exception_type((_Transient, _FormatFallback)))
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._attempt(req, messages, state)
        except _FormatFallback:  # cannot happen: text mode never falls back; keep it total anyway
            raise _Transient(rq.HTTP_ERROR, "response_format rejected in every mode") from None
        except _Transient as exc:
            remaining = self._remaining(state)
            if remaining is not None and remaining <= 0 or (
                    not exc.give_up and state.budget_attempts < self.max_attempts):
                # stopped because the next wait would cross the deadline
                raise _Transient(rq.TIMEOUT, f"deadline {self.deadline_s}s; last error: {exc.message}") from None
            raise
        raise AssertionError("unreachable")

    def _remaining(self, state: _CallState) -> float | None:
        return None if state.deadline is None else state.deadline - time.monotonic()

    # ---------------------------------------------------------------- one attempt
    async def _attempt(self, req: rq.JudgeRequest, messages: list[dict], state: _CallState) -> _Reply:
        mode_index = self.mode_index
        if req.kind == "embedding":
            body = {"model": req.model, "input": messages[0]["content"]}
            endpoint = "embeddings"
            estimate = estimate_tokens([("user", body["input"])], 0)
        elif req.kind == "logprobs":
            body = {"model": req.model, "prompt": messages[0]["content"], "echo": True,
                    "logprobs": 1, "max_tokens": 1, "temperature": 0}
            endpoint = "completions"
            estimate = estimate_tokens([("user", body["prompt"])], 1)
        elif req.kind == "classify":
            scorer = scoring.parse_endpoint(req.model)
            body = scoring.request_body(scorer, messages[0]["content"],
                                        messages[1]["content"] if len(messages) > 1 else None)
            endpoint = None     # the client's URL is the route itself
            estimate = estimate_tokens([(m["role"], m["content"]) for m in messages], 0)
        else:
            body = self._payload(req, messages, MODES[mode_index])
            endpoint = "chat/completions"
            estimate = estimate_tokens(((m["role"], m["content"]) for m in body["messages"]), req.max_tokens)
        assert self._semaphore is not None and self._session is not None
        remaining = self._remaining(state)
        if remaining is not None and remaining <= 0:
            raise _Transient(rq.TIMEOUT, "deadline passed", give_up=True)
        try:
            # Once the call has started, waiting for a slot counts against its deadline: a retry
            # queued behind other calls' slow attempts would otherwise overrun it by up to
            # timeout_s.
            await asyncio.wait_for(self._semaphore.acquire(), remaining)
        except asyncio.TimeoutError:
            raise _Transient(rq.TIMEOUT, "deadline passed waiting for a free request slot",
                             give_up=True) from None
        try:
            remaining = self._remaining(state)
            try:
                # the limiter wait counts against the deadline only once the call has started
                await asyncio.wait_for(self.limiter.acquire(estimate), remaining)
            except asyncio.TimeoutError:
                raise _Transient(rq.TIMEOUT, "deadline passed waiting for the rate limiter", give_up=True) from None
            if state.deadline is None:
                state.deadline = time.monotonic() + self.deadline_s
            state.attempts += 1
            state.budget_attempts += 1
            per_attempt = min(self.timeout_s, max(self._remaining(state), 0.001))
            # ceil_threshold: aiohttp rounds timeouts above it (5 s by default) up to the next whole
            # second to share timers; a call's last attempt must end at its deadline, not 1 s after
            timeout = aiohttp.ClientTimeout(total=per_attempt, connect=min(5.0, per_attempt),
                                            ceil_threshold=math.inf)
            try:
                target = self.url if endpoint is None else f"{self.url}/{endpoint}"
                async with self._session.post(target, json=body, timeout=timeout) as resp:
                    status = resp.status
                    headers = resp.headers
                    text = await self._body(resp)
            except asyncio.TimeoutError:
                raise _Transient(rq.TIMEOUT, f"attempt timed out after {per_attempt:.3g}s") from None
            except (aiohttp.ClientError, OSError) as exc:
                raise _Transient(rq.HTTP_ERROR, f"connection error: {type(exc).__name__}: {exc}") from None
        finally:
            self._semaphore.release()
        self.limiter.observe_headers(headers)
        if status == 200:
            if req.kind == "embedding":
                return self._read_embedding(text, state, estimate)
            if req.kind == "logprobs":
                return self._read_logprobs(text, state, estimate, body["prompt"])
            if req.kind == "classify":
                return self._read_classified(text, state, scorer)
            return self._read_ok(text, state, estimate)
        self._raise_for_error(status, headers, text, mode_index, state, bool(body.get("logprobs")))
        raise AssertionError("unreachable")

    async def _body(self, resp) -> str:
        """The answer's text, read in chunks and refused past max_body_bytes: a broken or
        hostile server cannot make a worker hold an unbounded body (a permanent http_error)."""
        chunks, size = [], 0
        async for chunk in resp.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _Transient(rq.HTTP_ERROR, f"HTTP {resp.status} answer larger than "
                                 f"{self.max_body_bytes:,} bytes: not read", give_up=True)
            chunks.append(chunk)
        return b"".join(chunks).decode(resp.charset or "utf-8", "replace")

    def _payload(self, req: rq.JudgeRequest, messages: list[dict], mode: str) -> dict:
        body: dict = {"model": req.model, "messages": list(messages), "temperature": req.temperature}
        if req.seed is not None:
            body["seed"] = req.seed
        if req.max_tokens is not None:
            body["max_tokens"] = req.max_tokens
        if req.logprobs is not None and self.logprobs_ok:
            body["logprobs"] = True
            body["top_logprobs"] = req.logprobs
        schema = req.schema
        if schema is None:
            return body
        if mode == "json_schema":
            name = (req.template or "judge")[:64]
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": name, "schema": schema, "strict": True}}
            return body
        if mode == "json_object":
            body["response_format"] = {"type": "json_object"}
        # without json_schema the model must be told about JSON, or json_object may stream whitespace
        body["messages"] = list(messages) + [{"role": "system", "content": (
            "Answer with a single JSON object that matches this JSON schema, and nothing else:\n"
            + rq.canonical_json(schema))}]
        return body

    def _read_ok(self, text: str, state: _CallState, estimate: int) -> _Reply:
        try:
            data = json.loads(text)
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _Transient(rq.HTTP_ERROR, "malformed 200 body: " + text[:120]) from None
        usage = rq.parse_usage(data.get("usage"))
        state.usage = rq.add_usage(state.usage, usage)
        self.limiter.correct_tokens(estimate, usage["prompt_tokens"] + usage["completion_tokens"])
        content = message.get("content")
        logprobs = choice.get("logprobs")
        logprobs = logprobs.get("content") if isinstance(logprobs, dict) else None
        reply = _Reply(text=content if isinstance(content, str) else None,
                       finish_reason=choice.get("finish_reason"), refusal=message.get("refusal") or None,
                       usage=usage, model=data.get("model"), fingerprint=data.get("system_fingerprint"),
                       logprobs=logprobs if isinstance(logprobs, list) else None)
        state.last = reply
        return reply

    def _read_logprobs(self, text: str, state: _CallState, estimate: int, prompt: str) -> _Reply:
        """A 200 answer of /completions with echo: choices[0].logprobs' tokens, token_logprobs and
        text_offset, cut to the tokens that start inside the prompt. prompt_logprobs stays None
        when they are missing or malformed."""
        try:
            data = json.loads(text)
            choice = data["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Transient(rq.HTTP_ERROR, "malformed 200 body: " + text[:120]) from None
        usage = rq.parse_usage(data.get("usage"))
        state.usage = rq.add_usage(state.usage, usage)
        self.limiter.correct_tokens(estimate, usage["prompt_tokens"] + usage["completion_tokens"])
        reply = _Reply(text=None, finish_reason=choice.get("finish_reason") if isinstance(choice, dict) else None,
                       refusal=None, usage=usage, model=data.get("model"),
                       fingerprint=data.get("system_fingerprint"),
                       prompt_logprobs=prompt_logprobs(choice, prompt))
        state.last = reply
        return reply

    def _read_classified(self, text: str, state: _CallState, scorer) -> _Reply:
        """A 200 answer of a scoring route (scoring.py): the labels and their probabilities
        (classified None when the answer does not hold them)."""
        try:
            data = json.loads(text)
        except ValueError:
            raise _Transient(rq.HTTP_ERROR, "malformed 200 body: " + text[:120]) from None
        usage = rq.parse_usage(data.get("usage")) if isinstance(data, dict) else rq.empty_usage()
        state.usage = rq.add_usage(state.usage, usage)
        reply = _Reply(text=None, finish_reason=None, refusal=None, usage=usage,
                       model=data.get("model") if isinstance(data, dict) else None, fingerprint=None,
                       classified=scoring.read_answer(scorer, data))
        state.last = reply
        return reply

    def _read_embedding(self, text: str, state: _CallState, estimate: int) -> _Reply:
        """A 200 answer of /embeddings: data[0].embedding (numbers only) and usage."""
        try:
            data = json.loads(text)
            vector = data["data"][0]["embedding"]
            if not isinstance(vector, list) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector):
                raise TypeError("embedding is not a list of numbers")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _Transient(rq.HTTP_ERROR, "malformed 200 body: " + text[:120]) from None
        usage = rq.parse_usage(data.get("usage"))
        state.usage = rq.add_usage(state.usage, usage)
        self.limiter.correct_tokens(estimate, usage["prompt_tokens"])
        reply = _Reply(text=None, finish_reason=None, refusal=None, usage=usage, model=data.get("model"),
                       fingerprint=None, vector=[float(x) for x in vector])
        state.last = reply
        return reply

    def _raise_for_error(self, status: int, headers, text: str, mode_index: int, state: _CallState,
                         sent_logprobs: bool = False) -> None:
        code, message = _error_fields(text)
        summary = f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
        lowered = f"{code} {message}".lower()
        if status == 429 and code == "insufficient_quota":
            raise _Transient(rq.QUOTA_EXCEEDED, summary, give_up=True)
        if status == 429 or status in TRANSIENT_STATUS or status >= 500:
            delay = parse_retry_after(headers)
            give_up = delay is not None and delay > self.max_retry_after_s
            if delay is not None and not 0 < delay <= self.max_retry_after_s:
                delay = None
            if status == 429:
                # slow everybody down, not only this call
                self.limiter.pause(delay if delay is not None else self.backoff_base_s)
            raise _Transient(rq.RATE_LIMITED if status == 429 else rq.HTTP_ERROR, summary, delay, give_up)
        if status == 400 and mode_index < len(MODES) - 1 and _format_unsupported(lowered):
            if self.mode_index == mode_index:
                self.mode_index = mode_index + 1
                log.warning("server rejected response_format %s; using %s from now on",
                            MODES[mode_index], MODES[self.mode_index])
            state.budget_attempts -= 1  # fallbacks are free
            raise _FormatFallback(summary)
        if status == 400 and sent_logprobs and "logprobs" in lowered:
            if self.logprobs_ok:
                self.logprobs_ok = False
                log.warning("server rejected logprobs; asking without them from now on")
            state.budget_attempts -= 1  # like a format fallback: free
            raise _FormatFallback(summary)
        if _content_filtered(code, lowered):
            raise _Transient(rq.REFUSED, summary, give_up=True)
        raise _Transient(rq.HTTP_ERROR, summary, give_up=True)


def _error_fields(text: str) -> tuple[str | None, str]:
    """(error.code or error.type, error.message) from an OpenAI error body, else (None, text[:200])."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return None, (text or "")[:200]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        return (str(code) if code else None), str(error.get("message") or "")[:200]
    if isinstance(error, str):
        return None, error[:200]
    return None, (text or "")[:200]


def _format_unsupported(lowered: str) -> bool:
    names_format = any(word in lowered for word in ("response_format", "json_schema", "json_object"))
    says_unsupported = any(word in lowered for word in ("support", "unknown", "unrecognized", "not allowed"))
    return names_format and says_unsupported


def _content_filtered(code: str | None, lowered: str) -> bool:
    return code in ("content_filter", "content_policy_violation") or any(
        phrase in lowered for phrase in ("content management policy", "content filter", "content_filter"))


@functools.lru_cache(maxsize=512)
def _validator(schema_json: str):
    """One checked validator per distinct schema: jsonschema.validate would check the schema
    against its metaschema on every call, which cost more than the rest of a call together."""
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)  # SchemaError is raised (and not cached) for a bad schema
    return cls(schema)


def validate_answer(value, schema_json: str) -> None:
    """jsonschema.validate(value, schema) with the validator cached per canonical schema text:
    raises the best-matching ValidationError, or SchemaError for a bad schema."""
    error = jsonschema.exceptions.best_match(_validator(schema_json).iter_errors(value))
    if error is not None:
        raise error


def _describe(exc: Exception) -> str:
    if isinstance(exc, jsonschema.ValidationError):
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"at {where}: {exc.message}"
    return str(exc)


def prompt_logprobs(choice, prompt: str) -> dict | None:
    """{"tokens", "token_logprobs", "text_offset"} of the tokens of `prompt` in an echoed
    completion choice (those whose character offset lies inside the prompt), or None when the
    choice does not hold them: three lists of equal length, offsets starting at 0 and never
    decreasing, log-probabilities finite and <= 0 (None allowed for the first token only).
    Tokens are not required to spell the prompt: a tokenizer may show partial UTF-8 characters
    as "bytes:..." or add a start token at offset 0."""
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    if not isinstance(logprobs, dict):
        return None
    tokens, values, offsets = (logprobs.get("tokens"), logprobs.get("token_logprobs"),
                               logprobs.get("text_offset"))
    if not (isinstance(tokens, list) and isinstance(values, list) and isinstance(offsets, list)
            and len(tokens) == len(values) == len(offsets)):
        return None
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        return None
    inside = sum(1 for offset in offsets if offset < len(prompt))
    tokens, values, offsets = tokens[:inside], values[:inside], offsets[:inside]
    if not all(isinstance(t, str) for t in tokens):
        return None
    if offsets and (offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:]))):
        return None
    for i, value in enumerate(values):
        if value is None and i == 0:
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value > 0):
            return None
    return {"tokens": tokens, "token_logprobs": [None if v is None else float(v) for v in values],
            "text_offset": offsets}
