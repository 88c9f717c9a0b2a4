"""Benchmark: JudgeCalls against the stand-in server at a rate limit.

The stand-in server (`evalbeam judge-server`, its own process) answers after 200 ms and allows
3,000 requests a minute (429 + Retry-After beyond). A pipeline (its own process, in-process
DirectRunner) sends 10,000 distinct judge requests through JudgeCalls with the same rpm, then a
second identical pipeline runs with the same journal. Reported: wall times, the achieved request
rate at the server (requests / (last - first arrival)), how many the server saw, distinct vs
duplicate bodies, 429s, and the second run's calls (target: rate >= 95% of the limit, none lost,
none duplicated, a free second run).

    pip install -e ".[test,bench]"
    python tests/benchmarks/bench_judge.py                 # 10,000 requests, ~3.5 minutes
    python tests/benchmarks/bench_judge.py --n 1000 --rpm 6000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from stand_in import ROOT, server_stats, stand_in_server


def pipeline(url: str, n: int, rpm: int, journal: str, out: str) -> None:
    """The child process: n distinct requests through JudgeCalls; counters to out."""
    sys.path.insert(0, ROOT)
    import apache_beam as beam

    from evalbeam.pipelines.launch.common import local_pipeline
    from evalbeam.transforms.io import write_json
    from evalbeam.transforms.judge.requests import JudgeRequest
    from evalbeam.transforms.judge.transform import JudgeCalls, JudgeSettings

    schema = {"type": "object", "properties": {"verdict": {"type": "integer", "enum": [0, 1]},
                                               "reason": {"type": "string"}},
              "required": ["verdict", "reason"], "additionalProperties": False}
    requests = [JudgeRequest(model="judge-1", messages=(("user", f"Context: item {i} is red.\n"
                                                                 f"Statement: item {i} is red."),),
                             response_schema=schema, template="bench", template_version="1")
                for i in range(n)]
    settings = JudgeSettings(url=url, api_key_env="BENCH_JUDGE_KEY", rpm=rpm, concurrency=32,
                             timeout_s=30, deadline_s=600, max_attempts=8)
    with local_pipeline() as p:
        records, counters = p | beam.Create(requests) | JudgeCalls(settings, journal, with_stats=True)
        _ = counters | beam.Map(write_json, out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--_pipeline"]:
        pipeline(argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rpm", type=int, default=3_000)
    parser.add_argument("--latency_ms", type=int, default=200)
    args = parser.parse_args(argv)
    with stand_in_server(args.latency_ms, args.rpm) as base:
        work = tempfile.mkdtemp()
        journal = os.path.join(work, "journal")
        env = dict(os.environ, BENCH_JUDGE_KEY="sk-bench", PYTHONPATH=ROOT)
        walls, counters = [], []
        for run in (1, 2):
            out = os.path.join(work, f"counters{run}.json")
            started = time.perf_counter()
            subprocess.run([sys.executable, os.path.abspath(__file__), "--_pipeline", base + "/v1",
                            str(args.n), str(args.rpm), journal, out], check=True, env=env)
            walls.append(time.perf_counter() - started)
            with open(out) as f:
                counters.append(json.load(f))
            if run == 1:
                first = server_stats(base)
        second = server_stats(base)
    arrivals = sorted(first["arrivals"])
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    rate = (len(arrivals) - 1) / span * 60 if span else 0.0
    print(f"### Judge engine: {args.n:,} requests, stand-in server with {args.latency_ms} ms latency "
          f"and {args.rpm:,} requests/minute\n")
    print("| run | wall time (s) | sent | cached | ok | server requests | distinct bodies | 429s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for i, (wall, c) in enumerate(zip(walls, counters), start=1):
        seen = first if i == 1 else {"requests": second["requests"] - first["requests"]}
        print(f"| {i} | {wall:.1f} | {c.get('sent', 0):,} | {c.get('cached', 0):,} | "
              f"{c.get('status:ok', 0) if i == 1 else c.get('cached', 0):,} | {seen['requests']:,} | "
              f"{first.get('distinct_bodies', '') if i == 1 else ''} | "
              f"{first.get('status_counts', {}).get('429', 0) if i == 1 else ''} |")
    print(f"\nachieved rate at the server: {rate:,.0f} requests/minute = {rate / args.rpm:.1%} of the limit")
    print(f"duplicate bodies at the server: {first.get('duplicate_bodies')}; "
          f"second run: {second['requests'] - first['requests']} requests sent")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
