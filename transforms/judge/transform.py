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
    batches: int = 16


def response_record(response, request, settings: JudgeSettings) -> dict:
    """The journal's record of one final response (no key, host only)."""
    record = asdict(response) if hasattr(response, "__dataclass_fields__") else dict(response)
    record.update(endpoint_host=endpoint_host(settings.url), template=request.template,
                  template_version=request.template_version,
                  sampling={"temperature": request.temperature, "max_tokens": request.max_tokens,
                            "seed": request.seed})
    return record


class CallJudge(beam.DoFn):
    """(batch key, [(hash, request)]) -> (hash, record): journal hits as they are, misses sent."""

    def __init__(self, settings: JudgeSettings, journal_root: str):
        self.settings = settings
        self.journal_root = journal_root

    def setup(self):
        self.loop = asyncio.new_event_loop()
        self.known = read_journal(self.journal_root)
        self.writer = JournalWriter(self.journal_root)

    def process(self, element):

        _, items = element
        todo = []
        for h, request in sorted(items, key=lambda item: item[0]):
            if h in self.known:
                yield h, dict(self.known[h], cached=True)
            else:
                todo.append((h, request))
        if todo:
            yield from self._send(todo)

    def _send(self, todo):
        from transforms.judge.client import JudgeClient

        s = self.settings
        api_key = os.environ.get(s.api_key_env, "")
        workers = max(1, s.workers)
        by_hash = dict(todo)

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
                return await client.run([request for _, request in todo])

        responses = self.loop.run_until_complete(call())
        self.writer.flush()
        for (h, request), response in zip(todo, responses):
            yield h, dict(response_record(response, request, s), cached=False)

    def finish_bundle(self):
        self.writer.flush()

    def teardown(self):
        self.writer.flush()
        self.loop.close()


class JudgeCalls(beam.PTransform):
    """PCollection of JudgeRequest -> PCollection of (request hash, response record) with one
    element per distinct request (see the module docstring)."""

    def __init__(self, settings: JudgeSettings, journal_root: str):
        super().__init__()
        self.settings = settings
        self.journal_root = journal_root

    def expand(self, requests):
        from transforms.judge.requests import request_hash

        batches = self.settings.batches
        return (requests
                | "Key" >> beam.Map(lambda r: (request_hash(r), r))
                | "OnePerHash" >> beam.CombinePerKey(lambda rs: next(iter(rs)))
                | "Batch" >> beam.Map(lambda kv: (int(kv[0][:8], 16) % batches, kv))
                | "GroupBatches" >> beam.GroupByKey()
                | "Call" >> beam.ParDo(CallJudge(self.settings, self.journal_root)))
