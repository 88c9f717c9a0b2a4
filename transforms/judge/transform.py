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
from dataclasses import dataclass

import apache_beam as beam

from evalbeam.transforms.judge.session import DRY_RUN, NOT_SENT, response_record  # noqa: F401 (re-exported)
from evalbeam.transforms.judge.session import merge_counters


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
    # Requests are sent in batches, all of a batch at once, and a worker runs its batches one
    # after another, each lasting as long as its slowest retry chain (exponential backoff): a few
    # large batches keep a run short. None: 2 per worker.
    batches: int | None = None
    max_calls: int | None = None            # requests sent at most (all workers together)
    max_cost: float | None = None           # estimated cost at most, in the prices' currency
    price_prompt_1k: float = 0.0            # price of 1,000 prompt tokens
    price_completion_1k: float = 0.0        # price of 1,000 completion tokens
    dry_run: bool = False                   # count calls, tokens and cost; send nothing
    # a causal LM on the workers answers the prompt log-probability requests (local_lm.py)
    lm_uri: str | None = None
    lm_batch_size: int = 128                # and of the classifiers and encoders (--model_uri)
    model_threads: int | None = None        # ONNX Runtime threads per process (None: its choice)
    # the variable holding the key of the scoring endpoints (--model_uri METRIC=URL); "" none
    model_api_key_env: str = ""
    model_rpm: float | None = None          # their requests per minute, all workers (None: no limit)

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        return (prompt_tokens * self.price_prompt_1k + completion_tokens * self.price_completion_1k) / 1000.0


TAG_JUDGE_STATS = "judge_stats"


class CallJudge(beam.DoFn):
    """(batch key, [(hash, request)]) -> (hash, record) through one JudgeSession per DoFn
    instance (session.py: journal hits served, in-flight duplicates awaited, misses sent within
    the worker's share of the budget, appended to the journal as they arrive). TAG_JUDGE_STATS:
    the session's counters of each batch (session.merge_counters adds them up)."""

    def __init__(self, settings: JudgeSettings, journal_root: str):
        self.settings = settings
        self.journal_root = journal_root

    def setup(self):
        from evalbeam.transforms.judge.session import JudgeSession

        self.session = JudgeSession(self.settings, self.journal_root)
        self.session.open()

    def process(self, element):
        _, items = element
        items = sorted(items, key=lambda item: item[0])
        records = self.session.run(_call_all(self.session, [request for _, request in items]))
        for (h, _), record in zip(items, records):
            yield h, record
        # the per-template "@" counters are left out: here they would only repeat the totals by
        # template name, which the caller already knows
        counters = {k: v for k, v in self.session.take_stats().items() if "@" not in k}
        yield beam.pvalue.TaggedOutput(TAG_JUDGE_STATS, counters)

    def teardown(self):
        self.session.close()


async def _call_all(session, requests) -> list:
    return list(await asyncio.gather(*(session.call(r, r.template) for r in requests)))


class JudgeCalls(beam.PTransform):
    """PCollection of JudgeRequest -> PCollection of (request hash, response record) with one
    element per distinct request (see the module docstring). with_stats=True returns (records,
    stats) where stats is a PCollection of one dict of counters (session.merge_counters: sums,
    and the min/max of the first send and last answer times)."""

    def __init__(self, settings: JudgeSettings, journal_root: str, with_stats: bool = False):
        super().__init__()
        self.settings = settings
        self.journal_root = journal_root
        self.with_stats = with_stats

    def expand(self, requests):
        from evalbeam.transforms.judge.requests import request_hash

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
        stats = results[TAG_JUDGE_STATS] | "MergeStats" >> beam.CombineGlobally(merge_counters)
        return results.records, stats
