"""JudgeSession: one worker's judge engine, shared by every DoFn that calls the judge.

    session = JudgeSession(settings, journal_root)
    session.open()                                   # DoFn.setup: loop, journal, client
    records = session.run(coroutine)                 # DoFn.process: run async work to its end
    stats = session.take_stats()                     # counters since the last take
    session.close()                                  # DoFn.teardown

`await session.call(request, metric)` gives the final record of one request (a dict, as the
journal keeps it, plus "cached"):
- a hash already in the journal (read at open, grown by every reusable answer since) is served
  from it and costs nothing;
- a hash already in flight in this worker is awaited, not sent again (metrics share requests:
  the statements of an answer serve AnswerCorrectness, AnswerRelevance and Faithfulness);
- otherwise it is sent within the worker's share of the budget (max_calls / workers,
  max_cost / workers, the estimate reserved before sending and settled from the usage after),
  and appended to the journal as soon as it is final. Past the budget: status "not_sent".
- dry run: nothing is sent. The answer is simulated locally by fixed word rules
  (transforms/judge/simulated.py, which the stand-in judge server answers with too) so that
  multi-step metrics go on to their later steps and those calls are counted too; records have status "dry_run" with the simulated content, and the
  estimate of tokens is ceil(chars / 4) of the prompt plus that of the simulated answer.

Counters (take_stats): requests, cached, shared, sent, status:<status>, prompt_tokens,
completion_tokens, cost, send_seconds, and per metric requests@<metric>, sent@<metric>,
cost@<metric>, dry_run@<metric> (a request shared by two metrics counts for the one that asked
first); min:first_send and max:last_done (epoch seconds) give the achieved request rate when
the counters of several workers are merged (min and max, not sums); sample:<status> holds the
error text (redacted by the client) of one failed request of that status, the least in text
order when merged, so the sample does not depend on timing or workers.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time

from evalbeam.transforms.judge.journal import REUSABLE, JournalWriter, endpoint_host, read_journal
from evalbeam.transforms.judge.requests import request_hash
from evalbeam.transforms.judge.scoring import is_endpoint, parse_endpoint
from evalbeam.transforms.judge.simulated import simulated_content

NOT_SENT = "not_sent"      # a budget was reached before this request was sent
DRY_RUN = "dry_run"        # --judge_dry_run: counted, not sent


def response_record(response, request, settings, url: str | None = None) -> dict:
    """The journal's record of one final response (no key, host only); url: the endpoint
    that answered, when not the judge's (a scoring endpoint)."""
    from dataclasses import asdict

    record = asdict(response) if hasattr(response, "__dataclass_fields__") else dict(response)
    record.update(endpoint_host=endpoint_host(url or settings.url), template=request.template,
                  template_version=request.template_version, kind=request.kind,
                  sampling={"temperature": request.temperature, "max_tokens": request.max_tokens,
                            "seed": request.seed, "logprobs": request.logprobs})
    return record


def merge_counters(parts) -> dict:
    """The counters of several take_stats() dicts (workers, bundles) in one: "min:", "max:" and
    "sample:" keys by min, max and min, every other counter summed. Associative, so it serves as a
    CombineGlobally function (it is also given its own partial results)."""
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if key not in out:
                out[key] = value
            elif key.startswith("min:"):
                out[key] = min(out[key], value)
            elif key.startswith("max:"):
                out[key] = max(out[key], value)
            elif key.startswith("sample:"):
                out[key] = min(out[key], value)
            else:
                out[key] += value
    return out


class JudgeSession:
    def __init__(self, settings, journal_root: str):
        self.settings = settings
        self.journal_root = journal_root
        self.loop = None
        self.client = None

    # ---------------------------------------------------------------- lifecycle
    def open(self) -> None:
        s = self.settings
        workers = max(1, s.workers)
        self.loop = asyncio.new_event_loop()
        self.known = read_journal(self.journal_root)
        self.writer = JournalWriter(self.journal_root)
        self.inflight: dict = {}
        self.simulated: dict = {}   # dry run: hash -> simulated record
        self.stats: collections.Counter = collections.Counter()
        self.calls_left = None if s.max_calls is None else s.max_calls / workers
        self.cost_left = None if s.max_cost is None else s.max_cost / workers
        self.local = None
        self.models: dict = {}       # (request kind, folder) -> a model on this worker
        self.scorers: dict = {}      # scoring endpoint URL -> its client on this worker
        if s.lm_uri:
            from evalbeam.transforms.judge.local_lm import LocalLM

            self.local = LocalLM(s.lm_uri, s.lm_batch_size, s.model_threads)
        if not s.dry_run and s.url:   # no URL: only the local model answers
            self.client = self._new_client(s.url, s.api_key_env, s.rpm, s.tpm)
            self.loop.run_until_complete(self.client.__aenter__())

    def _new_client(self, url: str, key_env: str, rpm: float | None, tpm: float | None):
        """A client with this worker's share of the limits (rpm and tpm over the workers; None:
        a bucket too large to ever wait), the settings' concurrency share, timeouts and
        attempts, and the key of the variable key_env ("" for none)."""
        from evalbeam.transforms.judge.client import JudgeClient

        s = self.settings
        workers = max(1, s.workers)

        def share(limit):
            return max(1, int(limit / workers)) if limit else 10 ** 12

        return JudgeClient(url, os.environ.get(key_env, "") if key_env else "", rpm=share(rpm),
                           tpm=share(tpm), concurrency=max(1, s.concurrency // workers),
                           timeout_s=s.timeout_s, deadline_s=s.deadline_s, max_attempts=s.max_attempts)

    def close(self) -> None:
        if self.loop is None:
            return
        self.writer.flush()
        for client in [self.client, *self.scorers.values()]:
            if client is not None:
                self.loop.run_until_complete(client.__aexit__(None, None, None))
        self.client = None
        self.scorers = {}
        self.loop.close()
        self.loop = None

    def run(self, coroutine):
        """Run async work on the session's loop; the journal is flushed afterwards."""
        started = time.monotonic()
        try:
            return self.loop.run_until_complete(coroutine)
        finally:
            self.stats["send_seconds"] += time.monotonic() - started
            self.writer.flush()

    def take_stats(self) -> dict:
        out = dict(self.stats)
        self.stats.clear()
        return out

    # ---------------------------------------------------------------- one request
    def _estimate(self, request) -> tuple[int, int]:
        from evalbeam.transforms.judge.limits import estimate_tokens

        prompt = estimate_tokens(request.messages, 0)
        completion = request.max_tokens or 0
        return prompt, completion

    async def call(self, request, metric: str = "") -> dict:
        h = request_hash(request)
        self.stats["requests"] += 1
        self.stats[f"requests@{metric}"] += 1
        if h in self.known:
            self.stats["cached"] += 1
            return dict(self.known[h], cached=True)
        if h in self.simulated:     # dry run: asked before, counted once
            self.stats["shared"] += 1
            return dict(self.simulated[h], cached=True)
        if h in self.inflight:
            self.stats["shared"] += 1
            return dict(await asyncio.shield(self.inflight[h]), cached=True)
        future = self.loop.create_future()
        self.inflight[h] = future
        try:
            record = await self._resolve(h, request, metric)
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved: no "never retrieved" warning when nobody shares it
            raise
        finally:
            del self.inflight[h]
        future.set_result(record)
        return record

    async def _resolve(self, h, request, metric) -> dict:
        from evalbeam.transforms.judge.limits import estimate_tokens

        s = self.settings
        if request.kind == "logprobs" and self.local is not None:
            return await self._local(h, request, metric, self.local.ask(request.messages[0][1]))
        scored = request.kind == "classify" and is_endpoint(request.model)
        if request.kind in ("tokens", "classify") and not scored:
            text = request.messages[0][1] if len(request.messages) == 1 else \
                (request.messages[0][1], request.messages[1][1])
            return await self._local(h, request, metric, self._model(request).ask(text))
        # a scoring endpoint's answer is not priced: it is the user's own server
        price = (lambda prompt, completion: 0.0) if scored else s.cost
        prompt, completion = self._estimate(request)
        if s.dry_run:
            content, text = simulated_content(request)
            completion = estimate_tokens([("assistant", text)], 0) if text else 0
            self._count(metric, DRY_RUN, prompt, completion, price(prompt, completion))
            record = {"hash": h, "status": DRY_RUN, "content": content, "cached": False,
                      "estimated_prompt_tokens": prompt, "estimated_completion_tokens": completion}
            self.simulated[h] = record
            return record
        reserve = price(prompt, completion)
        if ((self.calls_left is not None and self.calls_left < 1)
                or (self.cost_left is not None and self.cost_left < reserve)):
            self.stats[f"status:{NOT_SENT}"] += 1
            return {"hash": h, "status": NOT_SENT, "content": None, "cached": False,
                    "estimated_prompt_tokens": prompt, "estimated_completion_tokens": completion}
        if self.calls_left is not None:
            self.calls_left -= 1
        if self.cost_left is not None:
            self.cost_left -= reserve
        now = time.time()
        self.stats["min:first_send"] = min(self.stats.get("min:first_send", now), now)
        client = await self._scoring_client(request.model) if scored else self.client
        response = await client.judge(request)
        now = time.time()
        self.stats["max:last_done"] = max(self.stats.get("max:last_done", now), now)
        record = client.scrubbed(dict(response_record(response, request, s, client.url), cached=False))
        self.writer.append(record)
        if record["status"] in REUSABLE:
            self.known[h] = record
        usage = response.usage or {}
        used_prompt, used_completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        cost = price(used_prompt, used_completion)
        if self.cost_left is not None:
            self.cost_left += reserve - cost
        self.stats["sent"] += 1
        self.stats[f"sent@{metric}"] += 1
        self._count(metric, response.status, used_prompt, used_completion, cost)
        if response.status != "ok" and response.error:
            key = f"sample:{response.status}"
            self.stats[key] = min(self.stats.get(key, response.error), response.error)
        return record

    async def _scoring_client(self, uri: str):
        """The client of one scoring endpoint (scoring.py) on this worker, opened on first use:
        the judge's concurrency and retries, --model_rpm (default no limit), the key of
        --model_api_key_env."""
        endpoint = parse_endpoint(uri)
        if endpoint.url not in self.scorers:
            # a self-hosted classifier is bounded by the concurrency, not by a quota: no token
            # bucket, and a rate only with --model_rpm
            client = self._new_client(endpoint.url, self.settings.model_api_key_env,
                                      self.settings.model_rpm, None)
            self.scorers[endpoint.url] = client
            await client.__aenter__()
        return self.scorers[endpoint.url]

    def _model(self, request):
        """The model on this worker of a "tokens" (encoder) or "classify" request's folder."""
        key = (request.kind, request.model)
        if key not in self.models:
            if request.kind == "tokens":
                from evalbeam.transforms.judge.local_encoder import LocalEncoder as kind
            else:
                from evalbeam.transforms.judge.local_classifier import LocalClassifier as kind
            self.models[key] = kind(request.model, self.settings.lm_batch_size, self.settings.model_threads)
        return self.models[key]

    async def _local(self, h, request, metric, answer) -> dict:
        """A request answered by a model on this worker (local_lm.py, local_classifier.py; answer:
        the model's coroutine): nothing is sent, journaled or priced; a dry run does not run the
        model."""
        from evalbeam.transforms.judge.local_models import MODEL_ERROR, ModelError

        self.stats["local"] += 1
        self.stats[f"local@{metric}"] += 1
        if self.settings.dry_run:
            answer.close()
            content, _ = simulated_content(request)
            self._count(metric, DRY_RUN, 0, 0, 0.0)
            return {"hash": h, "status": DRY_RUN, "content": content, "cached": False}
        try:
            content = await answer
        except ModelError as error:
            self._count(metric, MODEL_ERROR, 0, 0, 0.0)
            key = f"sample:{MODEL_ERROR}"
            self.stats[key] = min(self.stats.get(key, str(error)), str(error))
            return {"hash": h, "status": MODEL_ERROR, "content": None, "cached": False,
                    "error": str(error)[:500]}
        self._count(metric, "ok", 0, 0, 0.0)
        return {"hash": h, "status": "ok", "content": content, "cached": False}

    def _count(self, metric, status, prompt, completion, cost):
        self.stats[f"status:{status}"] += 1
        self.stats["prompt_tokens"] += prompt
        self.stats["completion_tokens"] += completion
        self.stats["cost"] += cost
        self.stats[f"cost@{metric}"] += cost
        if status == DRY_RUN:
            self.stats[f"dry_run@{metric}"] += 1
