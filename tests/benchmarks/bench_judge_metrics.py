"""Benchmark: evalbeam's LLM-judge metrics against RAGAS 0.4 on the same data and the same judge.

Data: `pipelines/demo/synthetic_rag.py` datums that both tools can score (a question, one reference,
a non-empty answer and contexts), written once as evalbeam's JSONL; RAGAS reads the same files.
Judge: `evalbeam judge-server` in its own process, answering after --latency_ms, no rate limit.
It answers both tools' prompts by the same rules (RAGAS's schema-in-prompt JSON mode included).
Metrics, the seven both compute: Faithfulness, ContextRecall, ContextPrecision, AnswerCorrectness
(statement F1 only: RAGAS weights [1, 0]), AnswerAccuracy, ContextRelevanceRating (RAGAS's
ContextRelevance) and ResponseGroundedness.
Concurrency: at most --concurrency requests in flight on both sides: evalbeam's
--judge_concurrency; for RAGAS the (datum, metric) jobs run under a semaphore of that size, as its
evaluate() runs jobs with RunConfig.max_workers (each job's calls one after another). RAGAS is
called through its collections API (llm_factory on an AsyncOpenAI client), the one its docs
recommend; evaluate() takes only the legacy metrics.

Each side runs in a fresh process, timed from start to exit, and the server counts the requests
each sent. evalbeam then runs again with the same journal (a rerun, a retried job, a resumed
sweep): that costs no call.

RAGAS runs in its own virtual environment, because its langchain dependencies do not mix with
Beam's; it is made at first use (network to the package registry) under .bench-venvs/ragas, or
pass --ragas_python. Pinned: ragas==0.4.3, langchain-community<0.4 (0.4 removed a module that
ragas 0.4.3 imports).

    pip install -e ".[test,bench]"
    python tests/benchmarks/bench_judge_metrics.py                  # 300 datums, 200 ms, 16 in flight
    python tests/benchmarks/bench_judge_metrics.py --n 100 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

from stand_in import ROOT, server_stats, stand_in_server

RAGAS_PINS = ("ragas==0.4.3", "langchain-community<0.4")
EVALBEAM_METRICS = ("Faithfulness", "ContextRecall", "ContextPrecision", "AnswerCorrectness",
                    "AnswerAccuracy", "ContextRelevanceRating", "ResponseGroundedness")


# ---------------------------------------------------------------- RAGAS side (its own interpreter)

def ragas_child(url: str, groundtruths: str, predictions: str, concurrency: int, out: str) -> None:
    """Score every datum with RAGAS's seven metrics; per metric the values (None for NaN or an
    exception) to `out`. Imports nothing of evalbeam: this runs in RAGAS's environment."""
    import asyncio

    from openai import AsyncOpenAI
    from ragas.llms import llm_factory
    from ragas.metrics import collections as rc

    def rows(path):
        with open(path, encoding="utf-8") as f:
            return {r["datum_uid"]: r for r in map(json.loads, f)}

    truths, answers = rows(groundtruths), rows(predictions)
    # no client-side retries: the stand-in injects no faults here, and evalbeam sends each once too
    llm = llm_factory("judge-1", client=AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0))
    metrics = {
        "Faithfulness": (rc.Faithfulness(llm=llm),
                         lambda t, a: dict(user_input=t["query"], response=a["response"],
                                           retrieved_contexts=a["contexts"])),
        "ContextRecall": (rc.ContextRecall(llm=llm),
                          lambda t, a: dict(user_input=t["query"], retrieved_contexts=a["contexts"],
                                            reference=t["references"][0])),
        "ContextPrecision": (rc.ContextPrecision(llm=llm),
                             lambda t, a: dict(user_input=t["query"], reference=t["references"][0],
                                               retrieved_contexts=a["contexts"])),
        "AnswerCorrectness": (rc.AnswerCorrectness(llm=llm, weights=[1.0, 0.0]),
                              lambda t, a: dict(user_input=t["query"], response=a["response"],
                                                reference=t["references"][0])),
        "AnswerAccuracy": (rc.AnswerAccuracy(llm=llm),
                           lambda t, a: dict(user_input=t["query"], response=a["response"],
                                             reference=t["references"][0])),
        "ContextRelevanceRating": (rc.ContextRelevance(llm=llm),
                                   lambda t, a: dict(user_input=t["query"], retrieved_contexts=a["contexts"])),
        "ResponseGroundedness": (rc.ResponseGroundedness(llm=llm),
                                 lambda t, a: dict(response=a["response"], retrieved_contexts=a["contexts"])),
    }
    gate = asyncio.Semaphore(concurrency)

    async def job(metric, arguments):
        async with gate:
            try:
                value = (await metric.ascore(**arguments)).value
            except Exception:  # a failed sample is NaN in RAGAS's own evaluate()
                return None
        return None if value is None or (isinstance(value, float) and math.isnan(value)) else value

    async def everything():
        names, jobs = [], []
        for uid in sorted(truths):
            for name, (metric, arguments) in metrics.items():
                names.append(name)
                jobs.append(job(metric, arguments(truths[uid], answers[uid])))
        values = await asyncio.gather(*jobs)
        found: dict = {name: [] for name in metrics}
        for name, value in zip(names, values):
            found[name].append(value)
        return found

    with open(out, "w") as f:
        json.dump(asyncio.run(everything()), f)


def ragas_python(path: str | None) -> str:
    """The interpreter of RAGAS's environment, made at first use."""
    if path:
        return path
    venv = os.path.join(ROOT, ".bench-venvs", "ragas")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        print(f"making RAGAS's environment in {venv} ({', '.join(RAGAS_PINS)}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *RAGAS_PINS], check=True)
    return python


# ---------------------------------------------------------------- the comparison

def write_data(folder: str, n: int, seed: int) -> tuple[str, str]:
    """n datums both tools can score: question, one reference, an answer and contexts."""
    sys.path.insert(0, ROOT)
    from evalbeam.pipelines.demo.synthetic_rag import make_rag_datums

    truths, predictions = make_rag_datums(4 * n, seed=seed, models=("rag",))
    answers = {p["datum_uid"]: p for p in predictions["rag"]}
    kept_truths, kept_answers = [], []
    for truth in truths:
        answer = answers.get(truth["datum_uid"])
        if (answer and truth.get("query") and truth.get("references") and answer["response"].strip()
                and answer.get("contexts") and all(c.strip() for c in answer["contexts"])):
            kept_truths.append(dict(truth, references=truth["references"][:1]))
            kept_answers.append(answer)
        if len(kept_truths) == n:
            break
    os.makedirs(folder, exist_ok=True)
    paths = os.path.join(folder, "gt.jsonl"), os.path.join(folder, "rag.jsonl")
    for path, rows in zip(paths, (kept_truths, kept_answers)):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return paths


def timed(command: list[str], env: dict) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def evalbeam_command(url, groundtruths, predictions, out, journal, concurrency) -> list[str]:
    return [sys.executable, "-m", "evalbeam.pipelines.cli", "text", "--groundtruths", groundtruths,
            "--predictions", f"rag={predictions}", "--output", out, "--metrics", ",".join(EVALBEAM_METRICS),
            "--judge_url", url, "--judge_model", "judge-1", "--judge_api_key_env", "BENCH_JUDGE_KEY",
            "--judge_rpm", "1000000", "--judge_concurrency", str(concurrency),
            "--judge_journal", journal, "--quiet"]


def evalbeam_values(out: str) -> dict:
    found: dict = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for record in map(json.loads, f):
            if record["type"] in EVALBEAM_METRICS and record["slice"] == {}:
                found[record["type"]] = (record["value"], record["counts"].get("ok", 0))
    return found


def main(argv: list[str]) -> int:
    if argv[:1] == ["--_ragas"]:
        ragas_child(argv[1], argv[2], argv[3], int(argv[4]), argv[5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=300, help="datums (default 300)")
    parser.add_argument("--latency_ms", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--ragas_python", default=None, help="python of an environment with ragas 0.4")
    args = parser.parse_args(argv)
    python = ragas_python(args.ragas_python)
    work = tempfile.mkdtemp(prefix="bench-judge-metrics-")
    groundtruths, predictions = write_data(os.path.join(work, "data"), args.n, args.seed)
    # RAGAS_DO_NOT_TRACK: RAGAS's usage telemetry calls home on every metric; with no network
    # here each call waits for its timeout, which would measure the sandbox, not RAGAS
    env = dict(os.environ, BENCH_JUDGE_KEY="sk-bench", PYTHONPATH=ROOT, RAGAS_DO_NOT_TRACK="true")
    runs = {"evalbeam": [], "RAGAS": [], "evalbeam rerun": []}
    calls: dict = {name: [] for name in runs}
    with stand_in_server(args.latency_ms) as base:
        for repeat in range(args.repeats):
            out, journal = os.path.join(work, f"evalbeam-{repeat}"), os.path.join(work, f"journal-{repeat}")
            sides = (
                ("evalbeam", evalbeam_command(base + "/v1", groundtruths, predictions, out, journal,
                                              args.concurrency)),
                ("RAGAS", [python, os.path.abspath(__file__), "--_ragas", base + "/v1", groundtruths,
                           predictions, str(args.concurrency), os.path.join(work, f"ragas-{repeat}.json")]),
                ("evalbeam rerun", evalbeam_command(base + "/v1", groundtruths, predictions, out + "-again",
                                                    journal, args.concurrency)),
            )
            for name, command in sides:
                before = server_stats(base)["requests"]
                runs[name].append(timed(command, env))
                calls[name].append(server_stats(base)["requests"] - before)
                print(f"  {name}: {runs[name][-1]:.1f} s, {calls[name][-1]:,} requests", flush=True)

    ours = evalbeam_values(os.path.join(work, "evalbeam-0"))
    with open(os.path.join(work, "ragas-0.json")) as f:
        theirs = json.load(f)
    median = {name: statistics.median(walls) for name, walls in runs.items()}
    print(f"\n### Judge metrics: {args.n} RAG datums x 7 metrics, stand-in judge at {args.latency_ms} ms, "
          f"{args.concurrency} requests in flight, median of {args.repeats}\n")
    print("| run | wall time (s) | requests at the server |")
    print("|---|---:|---:|")
    for name in runs:
        print(f"| {name} | {median[name]:.1f} | {statistics.median(calls[name]):,.0f} |")
    print(f"\nevalbeam / RAGAS wall time: {median['evalbeam'] / median['RAGAS']:.2f}x; "
          f"requests {statistics.median(calls['evalbeam']) / statistics.median(calls['RAGAS']):.2f}x")
    print("\n| metric | evalbeam mean (datums ok) | RAGAS mean (datums scored) |")
    print("|---|---:|---:|")
    for name in EVALBEAM_METRICS:
        value, ok = ours.get(name, (None, 0))
        scored = [v for v in theirs.get(name, []) if v is not None]
        mean = sum(scored) / len(scored) if scored else None
        print(f"| {name} | {'-' if value is None else f'{value:.3f}'} ({ok}) | "
              f"{'-' if mean is None else f'{mean:.3f}'} ({len(scored)}) |")
    print("\n(the two sides' prompts differ, so their means are not expected to agree; they show "
          "that every datum was scored)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
