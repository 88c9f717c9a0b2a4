"""JudgeCalls: judge requests in, responses out, each distinct request paid for at most once.

    requests (JudgeRequest) -> key by request_hash -> one per hash -> batches by hash
      -> CallJudge: journal hits are served, misses sent by one JudgeClient per worker
         (aiohttp session and event loop live from setup to teardown), every final response
         appended to the journal as it arrives -> (hash, response record)

Rate limits are per worker: the DoFn gets the user's limits divided by `workers` (the number of
workers that call at once: --direct_num_workers locally, the worker count on a cluster), and each
worker's client slows down further on 429s and low x-ratelimit-remaining headers.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass

import apache_beam as beam

from transforms.judge.journal import JournalWriter, endpoint_host, read_journal


@dataclass(frozen=True)
class JudgeSettings:
    """Where and how to call. The API key is read from the environment variable api_key_env in
    each worker; it is never stored in the settings, the pipeline graph or any output."""

    url: str
    api_key_env: str = "OPENAI_API_KEY"
    rpm: float = 60.0
    tpm: float | None = None
    concurrency: int = 8
    timeout_s: float = 60.0
    deadline_s: float = 300.0
    max_attempts: int = 6
    workers: int = 1
    # Requests are sent in batches, one client.run per batch, and a worker runs its batches one
    # after another, each lasting as long as its slowest retry chain (exponential backoff): a few
    # large batches keep a run short. None: 2 per worker.
    batches: int | None = None
    max_calls: int | None = None            # requests sent at most (all workers together)
    max_cost: float | None = None           # estimated cost at most, in the prices' currency
    price_prompt_1k: float = 0.0            # price of 1,000 prompt tokens
    price_completion_1k: float = 0.0        # price of 1,000 completion tokens
    dry_run: bool = False                   # count calls, tokens and cost; send nothing

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        return (prompt_tokens * self.price_prompt_1k + completion_tokens * self.price_completion_1k) / 1000.0


def response_record(response, request, settings: JudgeSettings) -> dict:
    """The journal's record of one final response (no key, host only)."""
    record = asdict(response) if hasattr(response, "__dataclass_fields__") else dict(response)
    record.update(endpoint_host=endpoint_host(settings.url), template=request.template,
                  template_version=request.template_version,
                  sampling={"temperature": request.temperature, "max_tokens": request.max_tokens,
                            "seed": request.seed})
    return record


TAG_JUDGE_STATS = "judge_stats"
NOT_SENT = "not_sent"      # a budget was reached before this request was sent
DRY_RUN = "dry_run"        # --judge_dry_run: counted, not sent


class CallJudge(beam.DoFn):
    """(batch key, [(hash, request)]) -> (hash, record): journal hits as they are, misses sent
    within the budget. TAG_JUDGE_STATS: (counter, value) pairs to add up: "requests", "cached",
    "sent", "status:<status>", "prompt_tokens", "completion_tokens", "cost", "send_seconds".

    Budgets are per worker shares of the user's totals (max_calls / workers, max_cost / workers),
    spent in hash order within a batch; requests past the share come back as NOT_SENT. The dry run
    estimates tokens as the client does before sending (limits.estimate_tokens) and prices them."""

    def __init__(self, settings: JudgeSettings, journal_root: str):
        self.settings = settings
        self.journal_root = journal_root

    def setup(self):
        self.loop = asyncio.new_event_loop()
        self.known = read_journal(self.journal_root)
        self.writer = JournalWriter(self.journal_root)
        self.calls_left = (None if self.settings.max_calls is None
                           else self.settings.max_calls / max(1, self.settings.workers))
        self.cost_left = (None if self.settings.max_cost is None
                          else self.settings.max_cost / max(1, self.settings.workers))

    def _stat(self, name, value):
        return beam.pvalue.TaggedOutput(TAG_JUDGE_STATS, (name, value))

    def _unsent(self, h, request, status, prompt=0, completion=0):
        record = {"hash": h, "status": status, "content": None, "cached": False,
                  "estimated_prompt_tokens": prompt, "estimated_completion_tokens": completion}
        return h, record

    def process(self, element):

        from transforms.judge.limits import estimate_tokens

        _, items = element
        s = self.settings
        todo = []
        for h, request in sorted(items, key=lambda item: item[0]):
            yield self._stat("requests", 1)
            if h in self.known:
                yield self._stat("cached", 1)
                yield h, dict(self.known[h], cached=True)
                continue
            total = estimate_tokens(request.messages, request.max_tokens)
            completion = request.max_tokens if request.max_tokens is not None else total - estimate_tokens(request.messages, 0)
            prompt = total - completion
            if s.dry_run:
                yield self._stat(f"status:{DRY_RUN}", 1)
                yield self._stat("prompt_tokens", prompt)
                yield self._stat("completion_tokens", completion)
                yield self._stat("cost", s.cost(prompt, completion))
                yield self._unsent(h, request, DRY_RUN, prompt, completion)
            elif ((self.calls_left is not None and self.calls_left < 1)
                  or (self.cost_left is not None and self.cost_left < s.cost(prompt, completion))):
                yield self._stat(f"status:{NOT_SENT}", 1)
                yield self._unsent(h, request, NOT_SENT, prompt, completion)
            else:
                if self.calls_left is not None:
                    self.calls_left -= 1
                if self.cost_left is not None:   # reserve the estimate; settled from usage below
                    self.cost_left -= s.cost(prompt, completion)
                todo.append((h, request, s.cost(prompt, completion)))
        if todo:
            yield from self._send(todo)

    def _send(self, todo):
        from transforms.judge.client import JudgeClient

        import time

        s = self.settings
        api_key = os.environ.get(s.api_key_env, "")
        workers = max(1, s.workers)
        by_hash = {h: request for h, request, _ in todo}
        reserved = {h: cost for h, _, cost in todo}

        def journal(response):
            record = response_record(response, by_hash[response.hash], s)
            self.writer.append(record)
            if record["status"] in ("ok", "invalid_output", "truncated", "refused"):
                self.known[response.hash] = record

        async def call():
            async with JudgeClient(s.url, api_key, rpm=max(1, int(s.rpm / workers)),
                                   # no token limit given: a bucket too large to ever wait
                                   tpm=max(1, int(s.tpm / workers)) if s.tpm else 10 ** 12,
                                   concurrency=max(1, s.concurrency // workers), timeout_s=s.timeout_s,
                                   deadline_s=s.deadline_s, max_attempts=s.max_attempts,
                                   on_response=journal) as client:
                return await client.run([request for _, request, _ in todo])

        started = time.monotonic()
        responses = self.loop.run_until_complete(call())
        yield self._stat("send_seconds", time.monotonic() - started)
        self.writer.flush()
        for (h, request, _), response in zip(todo, responses):
            usage = response.usage or {}
            prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            cost = s.cost(prompt, completion)
            if self.cost_left is not None:
                self.cost_left += reserved[h] - cost
            yield self._stat("sent", 1)
            yield self._stat(f"status:{response.status}", 1)
            yield self._stat("prompt_tokens", prompt)
            yield self._stat("completion_tokens", completion)
            yield self._stat("cost", cost)
            yield h, dict(response_record(response, request, s), cached=False)

    def finish_bundle(self):
        self.writer.flush()

    def teardown(self):
        self.writer.flush()
        self.loop.close()


class JudgeCalls(beam.PTransform):
    """PCollection of JudgeRequest -> PCollection of (request hash, response record) with one
    element per distinct request (see the module docstring). with_stats=True returns (records,
    stats) where stats is a PCollection of {counter: total} (one dict, counters summed)."""

    def __init__(self, settings: JudgeSettings, journal_root: str, with_stats: bool = False):
        super().__init__()
        self.settings = settings
        self.journal_root = journal_root
        self.with_stats = with_stats

    def expand(self, requests):
        from transforms.judge.requests import request_hash

        batches = self.settings.batches or 2 * max(1, self.settings.workers)
        results = (requests
                | "Key" >> beam.Map(lambda r: (request_hash(r), r))
                | "OnePerHash" >> beam.CombinePerKey(lambda rs: next(iter(rs)))
                | "Batch" >> beam.Map(lambda kv: (int(kv[0][:8], 16) % batches, kv))
                | "GroupBatches" >> beam.GroupByKey()
                | "Call" >> beam.ParDo(CallJudge(self.settings, self.journal_root))
                .with_outputs(TAG_JUDGE_STATS, main="records"))
        if not self.with_stats:
            return results.records
        stats = (results[TAG_JUDGE_STATS]
                 | "SumStats" >> beam.CombinePerKey(sum)
                 | "StatsDict" >> beam.combiners.ToDict())
        return results.records, stats
