"""JudgeClient against a fake OpenAI-compatible server started here (aiohttp, 127.0.0.1, free port).

The server runs in a background thread with its own loop; each test drives the client with
asyncio.run. The first user message is the tag "scenario#unique" that tells the server what
to do; the server counts calls per tag so "fail once, then succeed" works per test.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time

import pytest
from aiohttp import web

from evalbeam.pipelines.runners.judge_server import busiest_window
from evalbeam.transforms.judge import requests as rq
from evalbeam.transforms.judge.client import JudgeClient, extract_json_object, parse_retry_after
from evalbeam.transforms.judge.limits import RateLimiter, TokenBucket, estimate_tokens, parse_reset_duration

KEY = "sk-test-SECRET-0123456789abcdef"
SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}},
          "required": ["score"], "additionalProperties": False}


class FakeServer:
    def __init__(self):
        self.counts = collections.Counter()
        self.formats = collections.defaultdict(list)
        self.arrivals = collections.defaultdict(list)
        self.auth = set()
        self.inflight = collections.Counter()  # per scenario: abandoned "hang" calls must not count
        self.max_inflight = collections.Counter()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self):
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def handle(self, request):
        body = await request.json()
        tag = next(m["content"] for m in body["messages"] if m["role"] == "user")
        scenario = tag.split("#")[0]
        self.inflight[scenario] += 1
        self.max_inflight[scenario] = max(self.max_inflight[scenario], self.inflight[scenario])
        try:
            return await self._handle(request, body)
        finally:
            self.inflight[scenario] -= 1

    async def _handle(self, request, body):
        self.auth.add(request.headers.get("Authorization"))
        tag = next(m["content"] for m in body["messages"] if m["role"] == "user")
        scenario = tag.split("#")[0]
        self.counts[tag] += 1
        n = self.counts[tag]
        self.arrivals[scenario].append(time.monotonic())
        fmt = (body.get("response_format") or {}).get("type", "text")
        self.formats[tag].append(fmt)
        repairing = body["messages"][-1]["role"] == "user" and any(
            m["role"] == "assistant" for m in body["messages"])

        def error(status, message, code=None, headers=None):
            return web.json_response({"error": {"message": message, "code": code, "type": "x"}},
                                     status=status, headers=headers)

        if scenario == "r429" and n == 1:
            return error(429, "slow down", "rate_limit_exceeded", {"Retry-After": "0.2"})
        if scenario == "r429ms" and n == 1:
            return error(429, "slow down", None, {"retry-after-ms": "150", "Retry-After": "30"})
        if scenario == "r429far":
            return error(429, "slow down", None, {"Retry-After": "500"})
        if scenario == "r500" and n == 1:
            return error(500, "boom")
        if scenario == "r503" and n <= 2:
            return error(503, "overloaded")
        if scenario == "always503":
            return error(503, "overloaded")
        if scenario == "reset" and n == 1:
            request.transport.abort()
            await asyncio.sleep(0.05)
            return web.Response()
        if scenario == "slow" and n == 1:
            await asyncio.sleep(2.0)
        if scenario == "hang":
            await asyncio.sleep(3.0)
        if scenario in ("e400", "e403", "e404"):
            return error(int(scenario[1:]), "bad request / forbidden / model not found")
        if scenario == "e401":
            # a hostile or careless server echoing the key back: the client must redact it
            return error(401, "Incorrect API key provided: " + request.headers.get("Authorization", ""))
        if scenario == "filtered400":
            return error(400, "The response was filtered due to the content management policy", "content_filter")
        if scenario == "quota":
            return error(429, "You exceeded your current quota", "insufficient_quota")
        if scenario.startswith("noschema") and fmt != "text":
            return error(400, f"response_format type {fmt} is not supported by this server")
        if scenario == "slowok":
            await asyncio.sleep(0.05)
        if scenario == "nologprobs" and body.get("logprobs"):
            return error(400, "logprobs is not supported for this model")

        content, finish, refusal, headers = '{"score": 4}', "stop", None, {}
        if "schema" not in tag and scenario in ("ok", "slowok", "fast", "low"):
            content = "plain answer"
        if scenario == "invalid_once":
            content = '{"score": 3}' if repairing else '{"score": "high"}'
        if scenario == "invalid_always":
            content = 'I think {"score": 9} is fair'
        if scenario.startswith("noschema"):
            content = 'Sure! Here it is:\n```json\n{"note": "a {brace} in a string", "score": 5}\n``` hope it helps'
            content = '{"score": 5} trailing' if "plain" in tag else content
        if scenario == "truncated":
            content, finish = '{"score": ', "length"
        if scenario == "refusal":
            content, refusal = None, "I can't help with that."
        if scenario == "low":
            headers = {"x-ratelimit-limit-requests": "100", "x-ratelimit-remaining-requests": "1",
                       "x-ratelimit-reset-requests": "300ms"}
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
            "system_fingerprint": "fp_test",
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content, "refusal": refusal}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                      "prompt_tokens_details": {"cached_tokens": 3},
                      "completion_tokens_details": {"reasoning_tokens": 2}},
        }, headers=headers)


@pytest.fixture(scope="module")
def server():
    fake = FakeServer().start()
    yield fake
    fake.stop()


_ids = iter(range(10**9))


def make(scenario, schema=None, **kw):
    return rq.JudgeRequest(model="judge-1", messages=(("system", "You judge."), ("user", f"{scenario}#{next(_ids)}")),
                           response_schema=schema, template="t", template_version="1", **kw)


def judge_all(server, reqs, **kw):
    options = dict(rpm=6000, tpm=10**8, concurrency=8, timeout_s=2.0, deadline_s=10.0, max_attempts=4,
                   backoff_base_s=0.01, backoff_max_s=0.05)
    options.update(kw)

    async def go():
        async with JudgeClient(server.url, KEY, **options) as client:
            return await client.run(reqs), client

    return asyncio.run(go())


# ------------------------------------------------------------------ requests


def test_request_normalised_hashable_and_hash_excludes_name():
    a = rq.JudgeRequest("m", [{"role": "user", "content": "hi"}], response_schema={"b": 1, "a": 2}, template="x")
    b = rq.JudgeRequest("m", (("user", "hi"),), response_schema='{ "a": 2, "b": 1 }', template="y")
    assert a.messages == (("user", "hi"),) and a.response_schema == '{"a":2,"b":1}'
    assert hash(a) != 0 and rq.request_hash(a) == rq.request_hash(b)
    assert rq.request_hash(a) != rq.request_hash(rq.JudgeRequest("m", (("user", "hi"),), seed=1))
    import pickle
    assert pickle.loads(pickle.dumps(a)) == a


# ------------------------------------------------------------------ content paths


def test_ok_plain_and_schema_with_usage_and_fingerprint(server):
    seen = []
    (plain, structured), _ = judge_all(server, [make("ok"), make("ok-schema", SCHEMA)], on_response=seen.append)
    assert plain.status == "ok" and plain.content == "plain answer" and plain.attempts == 1
    assert structured.status == "ok" and structured.content == {"score": 4}
    assert structured.usage == {"prompt_tokens": 10, "completion_tokens": 5, "cached_tokens": 3, "reasoning_tokens": 2}
    assert structured.system_fingerprint == "fp_test" and structured.model == "judge-1"
    assert structured.finish_reason == "stop" and structured.error is None
    assert sorted(r.hash for r in seen) == sorted([plain.hash, structured.hash])


def test_an_oversized_answer_is_not_read(server):
    """A body past max_body_bytes: http_error after one attempt, nothing retried; a body within
    it reads as before."""
    async def go(limit):
        async with JudgeClient(server.url, KEY, rpm=6000, max_attempts=4, backoff_base_s=0.01) as client:
            client.max_body_bytes = limit
            return (await client.run([make("ok")]))[0]

    small = asyncio.run(go(64))
    assert small.status == "http_error" and small.attempts == 1 and "64 bytes" in small.error
    assert asyncio.run(go(1 << 20)).status == "ok"


def test_invalid_then_repaired_and_still_invalid(server):
    (fixed, bad), _ = judge_all(server, [make("invalid_once", SCHEMA), make("invalid_always", SCHEMA)])
    assert fixed.status == "ok" and fixed.content == {"score": 3} and fixed.attempts == 2
    assert fixed.usage["prompt_tokens"] == 20  # both calls summed
    assert bad.status == "invalid_output" and bad.attempts == 2 and bad.content is None
    assert "after repair" in bad.error and "maximum" in bad.error and bad.raw_text.startswith("I think")


def test_schema_unsupported_falls_back_and_is_remembered(server):
    schema = {"type": "object", "properties": {"score": {"type": "integer"}, "note": {"type": "string"}},
              "required": ["score"]}
    first, second = make("noschema", schema), make("noschema-plain", schema)

    async def go():
        async with JudgeClient(server.url, KEY, rpm=6000, tpm=10**8) as client:
            a = await client.judge(first)
            b = await client.judge(second)
            return a, b, client.mode

    a, b, mode = asyncio.run(go())
    assert a.status == "ok" and a.content == {"note": "a {brace} in a string", "score": 5} and a.attempts == 3
    assert server.formats[first.messages[1][1]] == ["json_schema", "json_object", "text"]
    assert mode == "text" and b.status == "ok" and b.content == {"score": 5} and b.attempts == 1
    assert server.formats[second.messages[1][1]] == ["text"]


def test_truncated_and_refused(server):
    (cut, refused, filtered), _ = judge_all(server, [make("truncated", SCHEMA), make("refusal", SCHEMA),
                                                     make("filtered400")])
    assert cut.status == "truncated" and cut.attempts == 1 and cut.content is None and cut.finish_reason == "length"
    assert refused.status == "refused" and "can't help" in refused.error
    assert filtered.status == "refused" and filtered.attempts == 1


# ------------------------------------------------------------------ retries


def test_transient_faults_recovered_with_attempts_counted(server):
    reqs = [make("r429"), make("r429ms"), make("r500"), make("r503"), make("reset"), make("slow")]
    started = time.monotonic()
    out, _ = judge_all(server, reqs, timeout_s=0.4)
    assert [r.status for r in out] == ["ok"] * 6, [r.error for r in out]
    assert [r.attempts for r in out] == [2, 2, 2, 3, 2, 2]
    assert out[0].latency_s >= 0.2  # Retry-After honoured
    assert 0.15 <= out[1].latency_s < 5  # retry-after-ms wins over Retry-After: 30
    assert time.monotonic() - started < 5


def test_retries_exhausted_and_far_retry_after(server):
    (down, far), _ = judge_all(server, [make("always503"), make("r429far")], max_attempts=3)
    assert down.status == "http_error" and down.attempts == 3 and "503" in down.error
    assert far.status == "rate_limited" and far.attempts == 1  # Retry-After 500 s > 120 s: give up


@pytest.mark.parametrize("scenario", ["e400", "e401", "e403", "e404"])
def test_permanent_errors_fail_fast(server, scenario):
    (response,), _ = judge_all(server, [make(scenario, SCHEMA)])
    assert response.status == "http_error" and response.attempts == 1
    assert response.error.startswith(f"HTTP {scenario[1:]}")


def test_insufficient_quota_not_retried(server):
    (response,), _ = judge_all(server, [make("quota")])
    assert response.status == "quota_exceeded" and response.attempts == 1 and "quota" in response.error


def test_overall_deadline(server):
    started = time.monotonic()
    (response,), _ = judge_all(server, [make("hang")], timeout_s=0.3, deadline_s=1.0, max_attempts=50)
    elapsed = time.monotonic() - started
    assert response.status == "timeout" and 2 <= response.attempts <= 5
    assert 0.9 <= response.latency_s <= 1.6 and elapsed < 2.5


def test_deadline_holds_for_retries_queued_behind_other_calls():
    """Against a stand-in that never answers in time, with one request slot for three calls: a
    retry that waits for the slot must still end at its call's deadline (before, it waited for
    the slot whatever the deadline said and overran it by up to --judge_timeout: 365 s against
    300 s; here by 1.5 s against 1.5 s)."""
    from evalbeam.pipelines.runners.judge_server import StandInServer

    ends = []   # seconds past its deadline at which each call ended

    class Timed(JudgeClient):
        def _failure(self, req, state, started, status, error, reply=None):
            ends.append((status, time.monotonic() - state.deadline))
            return super()._failure(req, state, started, status, error, reply)

    async def go(url):
        async with Timed(url, KEY, rpm=60_000, tpm=10**9, concurrency=1, timeout_s=1.0, deadline_s=1.5,
                         max_attempts=50, backoff_base_s=0.01, backoff_max_s=0.02) as client:
            return await client.run([make(f"slow{i}") for i in range(3)])

    with StandInServer(fault_rate=1.0, faults=("timeout",), timeout_fault_s=30) as server:
        started = time.monotonic()
        responses = asyncio.run(go(server.url))
        elapsed = time.monotonic() - started
    assert [r.status for r in responses] == ["timeout"] * 3
    assert len(ends) == 3 and all(status == "timeout" for status, _ in ends)
    assert all(-0.05 <= late <= 0.4 for _, late in ends), ends
    # the calls start one after another (the slot is free at 0, 1 and 2 s): the last ends at 3.5 s
    assert elapsed < 4.5


# ------------------------------------------------------------------ limits


def test_bucket_windows_with_fake_clock():
    now = [0.0]
    bucket = TokenBucket(600, window_s=60.0, clock=lambda: now[0])
    assert bucket.burst == 1
    grants = []
    while now[0] < 180:
        wait = bucket.wait_time(1)
        if wait <= 0:
            bucket.take(1)
            grants.append(now[0])
        else:
            now[0] += wait + 1e-9
    assert busiest_window(grants, 60.0) <= 600
    assert busiest_window(grants, 5.0) <= 600 / 12 * 1.05
    assert len(grants) >= 600 * 3 * 0.98


def test_rate_limit_against_zero_latency_server(server):
    # time scaled by 5: rpm 600 per 12 s window; the "5 s windows" become 1 s windows. Scaling
    # more would scale the event loop's jitter between grant and arrival with it.
    limiter = RateLimiter(600, 10**9, window_s=12.0, record_grants=True)
    reqs = [make("fast") for _ in range(120)]
    started = time.monotonic()
    out, _ = judge_all(server, reqs, limiter=limiter, concurrency=64)
    elapsed = time.monotonic() - started
    assert all(r.status == "ok" for r in out)
    allowed = 600 / 12 * 1.05
    assert busiest_window(limiter.grants, 1.0) <= 1 + 599 / 12  # burst 1, then the refill rate
    assert busiest_window(server.arrivals["fast"], 1.0) <= allowed
    ideal = (120 - 1) / ((600 - 1) / 12.0)
    assert ideal * 0.95 <= elapsed <= ideal + 1.5


def test_concurrency_cap(server):
    out, _ = judge_all(server, [make("slowok") for _ in range(24)], concurrency=3)
    assert all(r.status == "ok" for r in out)
    assert server.max_inflight["slowok"] == 3


def test_low_remaining_header_pauses(server):
    async def go():
        async with JudgeClient(server.url, KEY, rpm=6000, tpm=10**8) as client:
            await client.judge(make("low"))
            await client.judge(make("low"))

    asyncio.run(go())
    first, second = server.arrivals["low"][-2:]
    assert second - first >= 0.28


def test_token_estimate_and_correction():
    assert estimate_tokens([("user", "abcde")], None) == 2 + 256
    assert estimate_tokens([("user", "abcd"), ("system", "")], 10) == 11
    limiter = RateLimiter(60, 2400)  # token burst 5
    limiter.tokens.take(100)
    level = limiter.tokens.level
    limiter.correct_tokens(100, 40)
    assert limiter.tokens.level == pytest.approx(min(5, level + 60), abs=0.1)
    assert parse_reset_duration("6m0s") == 360 and parse_reset_duration("12ms") == 0.012
    assert parse_reset_duration("1s") == 1 and parse_reset_duration("soon") is None


def test_retry_after_parsing_and_extraction():
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    from email.utils import formatdate
    assert 8 <= parse_retry_after({"retry-after": formatdate(time.time() + 10, usegmt=True)}) <= 10.5
    assert parse_retry_after({}) is None
    assert extract_json_object('x {"a": "}"} y {"b": 1}') == {"a": "}"}
    with pytest.raises(ValueError):
        extract_json_object("no json {here")


# ------------------------------------------------------------------ secrets


def test_api_key_never_leaks(server, caplog):
    caplog.set_level(logging.DEBUG)
    reqs = [make("e401"), make("reset"), make("invalid_always", SCHEMA), make("ok"), make("hang")]
    out, client = judge_all(server, reqs, timeout_s=0.2, deadline_s=0.5)
    assert f"Bearer {KEY}" in server.auth  # the key was sent, in the header
    assert out[0].status == "http_error" and "***" in out[0].error
    texts = [caplog.text, repr(client), repr(out)] + [json.dumps(r.__dict__, default=str) for r in out]
    for text in texts:
        assert KEY not in text


def test_logprobs_rejected_once_then_never_asked_again(server):
    async def go():
        async with JudgeClient(server.url, KEY, rpm=6000) as client:
            first = await client.judge(rq.JudgeRequest(model="m", messages=[("user", "nologprobs#1")], logprobs=5))
            second = await client.judge(rq.JudgeRequest(model="m", messages=[("user", "nologprobs#2")], logprobs=5))
            return first, second, client.logprobs_ok

    first, second, ok = asyncio.run(go())
    assert first.status == second.status == "ok" and not ok
    assert server.counts["nologprobs#1"] == 2 and server.counts["nologprobs#2"] == 1
    assert first.attempts == 2 and first.logprobs is None


def test_embeddings_and_logprobs_from_the_stand_in_server():
    from evalbeam.pipelines.runners.judge_server import StandInServer
    from evalbeam.transforms.judge.simulated import EMBEDDING_DIM, embed

    async def go(url):
        async with JudgeClient(url, KEY, rpm=6000) as client:
            vector = await client.judge(rq.embedding_request("emb", "Lumo lies in Estova."))
            rated = await client.judge(rq.JudgeRequest(model="m", messages=[("user", "Rate: answer: 4")],
                                                       logprobs=3))
            return vector, rated

    with StandInServer() as stand_in:
        vector, rated = asyncio.run(go(stand_in.url))
        assert stand_in.stats()["by_path"].get("/v1/embeddings") == 1
    assert vector.status == "ok" and vector.content == pytest.approx(embed("Lumo lies in Estova.", EMBEDDING_DIM))
    assert vector.usage["prompt_tokens"] > 0
    assert rated.status == "ok" and rated.logprobs and "top_logprobs" in rated.logprobs[0]
    # the embedding request hashes apart from a chat request with the same text
    assert rq.request_hash(rq.embedding_request("emb", "x")) != rq.request_hash(
        rq.JudgeRequest(model="emb", messages=[("input", "x")]))
