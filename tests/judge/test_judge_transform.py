"""JudgeCalls on the DirectRunner against the stand-in server (loopback, started by the test):
every request ends ok despite transient faults, a rerun sends nothing, both runner modes agree,
the key never reaches the journal or the results."""

from __future__ import annotations

import json

import pytest

from helpers import MULTIPROCESS
from evalbeam.pipelines.launch.common import local_pipeline
from evalbeam.pipelines.runners.judge_server import StandInServer, busiest_window
from evalbeam.transforms.judge.requests import JudgeRequest, request_hash
from evalbeam.transforms.judge.transform import JudgeCalls, JudgeSettings

KEY = "sk-test-" + "Zq9" * 10
SCHEMA = {"type": "object", "properties": {"verdict": {"type": "integer", "enum": [0, 1]},
                                           "reason": {"type": "string"}},
          "required": ["verdict", "reason"], "additionalProperties": False}


def requests(n: int) -> list[JudgeRequest]:
    out = []
    for i in range(n):
        messages = (("system", "You judge statements."),
                    ("user", f"Context: the sky over city {i % 37} is blue today.\n"
                             f"Statement: the sky over city {i % 37} is {'blue' if i % 3 else 'green'}."))
        out.append(JudgeRequest(model="judge-1", messages=messages, response_schema=SCHEMA,
                                template="test_verdict", template_version="1"))
    return out


def run_calls(reqs, settings, journal, extra=()):
    """[[hash, status, content, cached]] sorted, through a file (the pipeline's functions run on
    pickled copies, maybe in other processes)."""
    import os
    import tempfile

    import apache_beam as beam

    from evalbeam.transforms.io import write_jsonl

    out_path = os.path.join(tempfile.mkdtemp(), "results.jsonl")
    with local_pipeline(list(extra)) as p:
        out = p | beam.Create(reqs) | JudgeCalls(settings, journal)
        _ = (out | beam.Map(lambda kv: {"r": [kv[0], kv[1]["status"], kv[1]["content"], kv[1]["cached"]]})
             | beam.combiners.ToList() | beam.Map(write_jsonl, out_path))
    with open(out_path, encoding="utf-8") as f:
        return sorted(json.loads(line)["r"] for line in f)


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("EVALBEAM_TEST_JUDGE_KEY", KEY)
    return "EVALBEAM_TEST_JUDGE_KEY"


def test_faults_recovered_rerun_free_and_no_key_anywhere(tmp_path, key_env):
    reqs = requests(240)                      # 111 distinct requests (37 cities x 3 variants)
    distinct = {request_hash(r) for r in reqs}
    journal = str(tmp_path / "journal")
    with StandInServer(fault_rate=0.3, faults=("429", "500", "503", "reset"), seed=3) as server:
        settings = JudgeSettings(url=server.url, api_key_env=key_env, rpm=60_000, concurrency=8,
                                 timeout_s=5, deadline_s=60, max_attempts=8, batches=4)
        first = run_calls(reqs, settings, journal)
        sent = server.stats()["requests"]
        assert [r[1] for r in first] == ["ok"] * len(distinct)
        assert {r[0] for r in first} == distinct and not any(r[3] for r in first)
        assert sent >= len(distinct)                           # faults cost extra attempts
        second = run_calls(reqs, settings, journal, MULTIPROCESS)
        assert server.stats()["requests"] == sent              # nothing sent twice
        assert [r[:3] for r in second] == [r[:3] for r in first] and all(r[3] for r in second)
    for path in (tmp_path / "journal").iterdir():
        assert KEY not in path.read_text()


def test_permanent_errors_fail_fast(tmp_path, key_env):
    bad = [JudgeRequest(model="fail-401", messages=(("user", "x"),)),
           JudgeRequest(model="quota", messages=(("user", "y"),))]
    with StandInServer() as server:
        settings = JudgeSettings(url=server.url, api_key_env=key_env, rpm=6000, batches=1)
        results = run_calls(bad, settings, str(tmp_path / "j"))
        assert server.stats()["requests"] == 2
    assert sorted(r[1] for r in results) == ["http_error", "quota_exceeded"]


def distinct_requests(n: int) -> list[JudgeRequest]:
    return [JudgeRequest(model="judge-1", messages=(("user", f"Context: item {i} is red.\nStatement: item {i} is red."),),
                         response_schema=SCHEMA, template="t", template_version="1") for i in range(n)]


def run_with_stats(reqs, settings, journal):
    """(sorted [[hash, status, cached]], stats dict) through files."""
    import os
    import tempfile

    import apache_beam as beam

    from evalbeam.transforms.io import write_json, write_jsonl

    folder = tempfile.mkdtemp()
    with local_pipeline() as p:
        records, stats = p | beam.Create(reqs) | JudgeCalls(settings, journal, with_stats=True)
        _ = (records | beam.Map(lambda kv: {"r": [kv[0], kv[1]["status"], kv[1]["cached"]]})
             | "L" >> beam.combiners.ToList() | beam.Map(write_jsonl, os.path.join(folder, "r.jsonl")))
        _ = stats | beam.Map(write_json, os.path.join(folder, "stats.json"))
    with open(os.path.join(folder, "r.jsonl"), encoding="utf-8") as f:
        rows = sorted(json.loads(line)["r"] for line in f)
    with open(os.path.join(folder, "stats.json"), encoding="utf-8") as f:
        return rows, json.load(f)


def test_600_requests_at_15_percent_faults_within_the_rate_limit(tmp_path, key_env):
    """Every request ends ok; no 5-second window at the server above the limit + 5%; a second
    run sends nothing. (Injected 429s are left to the smaller test above: each pauses the whole
    client for the server's retry-after-ms, as a real rate limit must, which would make this one
    slow; the client's own tests cover the pause.) The retries' back-off paces this run more than
    the limit does (measured: ~110 arrivals a second against 400 allowed), so the limiter's own
    pacing is tested where it binds, in test_judge_client.py; 600 requests (2,000 until the suite
    neared its time budget) still make ~700 attempts through the Beam transform."""
    rpm = 24_000
    n = 600
    reqs = distinct_requests(n)
    journal = str(tmp_path / "journal")
    # each of the two batches lasts as long as its longest retry chain (full-jitter back-off from
    # 0.5 s, doubling): at 30% faults some request of 600 meets 5-6 in a row and each batch took
    # ~14 s; at 15% the longest chain is ~3 faults
    with StandInServer(fault_rate=0.15, faults=("500", "503", "reset"), seed=5) as server:
        settings = JudgeSettings(url=server.url, api_key_env=key_env, rpm=rpm, concurrency=16,
                                 timeout_s=5, deadline_s=120, max_attempts=10, batches=2)
        rows, stats = run_with_stats(reqs, settings, journal)
        seen = server.stats()
        assert [r[1] for r in rows] == ["ok"] * n
        assert stats["sent"] == n and stats["status:ok"] == n and stats.get("cached", 0) == 0
        assert sum(seen["faults"].values()) > 0.1 * n     # faults were injected and recovered
        # two batches: the times of first send and last answer merge by min and max, not summed
        assert 0 < stats["max:last_done"] - stats["min:first_send"] < 120
        assert busiest_window(seen["arrivals"], 5.0) <= rpm / 12 * 1.05
        again, stats2 = run_with_stats(reqs, settings, journal)
        assert server.stats()["requests"] == seen["requests"]
        assert stats2["cached"] == n and stats2.get("sent", 0) == 0


def test_dry_run_and_budgets(tmp_path, key_env):
    reqs = distinct_requests(20)
    with StandInServer() as server:
        dry = JudgeSettings(url=server.url, api_key_env=key_env, dry_run=True, price_prompt_1k=2.0,
                            price_completion_1k=4.0, batches=2)
        rows, stats = run_with_stats(reqs, dry, str(tmp_path / "j1"))
        assert server.stats()["requests"] == 0
        assert {r[1] for r in rows} == {"dry_run"} and stats["status:dry_run"] == 20
        assert stats["cost"] == pytest.approx((stats["prompt_tokens"] * 2 + stats["completion_tokens"] * 4) / 1000)
        capped = JudgeSettings(url=server.url, api_key_env=key_env, max_calls=7, batches=1)
        rows, stats = run_with_stats(reqs, capped, str(tmp_path / "j2"))
        assert server.stats()["requests"] == 7
        assert sorted(r[1] for r in rows) == ["not_sent"] * 13 + ["ok"] * 7
        assert stats["status:not_sent"] == 13 and stats["sent"] == 7


def test_a_killed_run_restarted_sends_only_what_the_journal_lacks(tmp_path, key_env):
    """A pipeline killed halfway, then run again: the server receives exactly the requests whose
    responses did not reach the journal (each once), and every request ends ok."""
    import os
    import subprocess
    import sys
    import time

    from evalbeam.transforms.judge.journal import read_journal

    n = 400
    journal = str(tmp_path / "journal")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with StandInServer(latency_ms=40) as server:
        script = (f"import sys; sys.path.insert(0, {tests!r}); sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                  "import apache_beam as beam\n"
                  "from evalbeam.pipelines.launch.common import local_pipeline\n"
                  "from evalbeam.transforms.judge.transform import JudgeCalls, JudgeSettings\n"
                  "from test_judge_transform import distinct_requests\n"
                  f"settings = JudgeSettings(url={server.url!r}, api_key_env={key_env!r}, rpm=6000, concurrency=8, batches=1)\n"
                  f"with local_pipeline() as p:\n"
                  f"    _ = p | beam.Create(distinct_requests({n})) | JudgeCalls(settings, {journal!r})\n")
        child = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while server.stats()["requests"] < n // 2 and time.time() < deadline and child.poll() is None:
            time.sleep(0.05)
        child.kill()
        child.wait()
        time.sleep(0.5)
        before = server.stats()["requests"]
        kept = len(read_journal(journal))
        assert 0 < before < n and kept <= before       # killed halfway; some responses journaled
        rows, stats = run_with_stats(distinct_requests(n), JudgeSettings(
            url=server.url, api_key_env=key_env, rpm=6000, concurrency=8), journal)
        after = server.stats()
    assert [r[1] for r in rows] == ["ok"] * n
    assert after["requests"] - before == n - kept == stats["sent"]
    assert stats["cached"] == kept
    assert after["duplicate_bodies"] == before - kept   # only the sent-but-unjournaled ones twice


def test_merge_counters_sums_counts_and_keeps_the_extreme_times():
    from evalbeam.transforms.judge.session import merge_counters

    parts = [{"sent": 3, "cost": 0.5, "min:first_send": 100.0, "max:last_done": 180.0},
             {"sent": 2, "status:ok": 2, "min:first_send": 90.0, "max:last_done": 150.0},
             {}]
    merged = merge_counters(parts)
    assert merged == {"sent": 5, "cost": 0.5, "status:ok": 2, "min:first_send": 90.0,
                      "max:last_done": 180.0}
    # associative: merging partial merges gives the same (CombineGlobally relies on it)
    assert merge_counters([merge_counters(parts[:1]), merge_counters(parts[1:])]) == merged
    assert merge_counters([]) == {}
