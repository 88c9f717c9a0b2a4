"""Worker scaling on one machine: every task on the multi-process DirectRunner with 1 and with 2
worker processes, on the same files, interleaved, and the ratio of the medians (time with 1
worker / time with 2). Sizes are where the work dominates the ~2.5 s of start-up and tail, the
README's table's (tests/benchmarks/README.md, 2026-11-27); detection from COCO files (read in
pieces) and from native rows (the same images as JSONL read in spans).

    pip install -e ".[test,bench]"
    python tests/benchmarks/bench_workers.py                     # every task, 3 repeats, ~50 min
    python tests/benchmarks/bench_workers.py --tasks retrieval --repeats 1
    python tests/benchmarks/bench_workers.py --tasks classification --sizes classification=1000000
    python tests/benchmarks/bench_workers.py --tasks ""                  # the machine's ceiling only
    python tests/benchmarks/bench_workers.py --corun    # and what the machine allows each task
    python tests/benchmarks/bench_workers.py --tasks classification --one_thread

A 2-core machine bounds the ratio by 2; the target is segmentation's 1.69x (issue 19). What the
machine itself allows comes first (machine_ceiling): how much more work two processes do than one
when each runs a pure-Python loop, parses JSON, or streams over arrays larger than the caches;
with --corun, per task: two 1-worker runs started at once, which share the machine as two
workers do, with no Beam between them.

A worker is a process, not a core: Arrow's readers parse on a thread pool, so a 1-worker run can
keep more than one core busy (the "cores busy" column: CPU seconds of the run's processes / wall
seconds), and on a 2-core machine that bounds the ratio below 2 however well the workers split the
work. --one_thread caps those pools at one thread (OMP_NUM_THREADS=1, which Arrow and the BLAS
read) in both runs, so the ratio measures what a second worker process adds; the defaults are
what a user gets.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_classification import machine_info  # noqa: E402
from scaling_study import run_one, task_command  # noqa: E402

SIZES = {"classification": 3_000_000, "detection": 150_000, "detection_native": 150_000,
         "segmentation": 10_000, "text": 300_000, "retrieval": 600_000}


def _python_loop() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(30_000_000):
        total += i & 7
    return time.perf_counter() - started


def _json_parse() -> float:
    text = json.dumps([{"image_id": i, "category_id": i % 80, "bbox": [1.5, 2.5, 30.25, 40.125],
                        "score": 0.5} for i in range(200_000)])
    started = time.perf_counter()
    for _ in range(5):
        json.loads(text)
    return time.perf_counter() - started


def _array_stream() -> float:
    import numpy as np

    values = np.ones(50_000_000)     # 400 MB, far beyond the caches; touched before timing
    values += 1.0
    started = time.perf_counter()
    for _ in range(10):
        np.multiply(values, 1.0000001, out=values)
        values += 1.0
    return time.perf_counter() - started


def corun(cmd: list[str], output: str) -> float:
    """Wall seconds of two copies of cmd (its output folder output + "-a") started at once, the
    second writing to output + "-b": the slower of the two."""
    import concurrent.futures

    other = [output + "-b" if part == output + "-a" else part for part in cmd]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda c: run_one(c, c[c.index("--output") + 1]), (cmd, other)))
    return max(run["wall_s"] for run in runs)


def machine_ceiling(repeats: int = 3) -> dict:
    """{kind of work: how much more work 2 processes do at once than 1 alone} (2.0: the cores
    are independent; 1.0: they share what limits it), the median of `repeats` rounds."""
    found = {}
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        for work in (_python_loop, _json_parse, _array_stream):
            alone = statistics.median(pool.apply(work) for _ in range(repeats))
            together = statistics.median(
                max(r.get() for r in [pool.apply_async(work) for _ in range(2)])
                for _ in range(repeats))
            found[work.__name__.strip("_")] = 2 * alone / together
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "evalbeam-bench"))
    parser.add_argument("--tasks", default=",".join(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="", help="overrides, e.g. segmentation=10000")
    parser.add_argument("--corun", action="store_true",
                        help="also run each task's 1-worker command twice at once: 2 x (time "
                             "alone) / (time of the two together) is what this machine allows "
                             "that task's work, whatever Beam does")
    parser.add_argument("--one_thread", action="store_true",
                        help="run every command with OMP_NUM_THREADS=1: one thread in Arrow's "
                             "and the BLAS pools, so each worker process keeps one core busy")
    args = parser.parse_args(argv)
    if args.one_thread:
        os.environ["OMP_NUM_THREADS"] = "1"     # inherited by the runs and their workers
    for item in filter(None, args.sizes.split(",")):
        task, n = item.split("=")
        SIZES[task] = int(n)
    output = os.path.join(args.workdir, "worker-runs", "run")
    ceiling = machine_ceiling()
    print("work of 2 processes at once / 1 alone: " + ", ".join(
        f"{kind} {ratio:.2f}x" for kind, ratio in ceiling.items()), file=sys.stderr)
    times: dict = {}
    for repeat in range(args.repeats):
        for task in filter(None, args.tasks.split(",")):
            for workers in (1, 2):
                cmd = task_command(task, args.workdir, SIZES[task], output) + [
                    "--direct_running_mode", "multi_processing", "--direct_num_workers", str(workers)]
                run = run_one(cmd, output)
                times.setdefault(task, {}).setdefault(workers, []).append(run["wall_s"])
                times[task].setdefault(f"cores_{workers}", []).append(run["cpu_s"] / run["wall_s"])
                print(f"repeat {repeat + 1}: {task} {workers} worker(s): {run['wall_s']:.1f} s, "
                      f"{run['cpu_s']:.1f} CPU-s", file=sys.stderr)
            if args.corun:
                together = corun(task_command(task, args.workdir, SIZES[task], output + "-a") + [
                    "--direct_running_mode", "multi_processing", "--direct_num_workers", "1"], output)
                times[task].setdefault("corun", []).append(together)
                print(f"repeat {repeat + 1}: {task} two 1-worker runs at once: {together:.1f} s",
                      file=sys.stderr)
    print("\n".join(machine_info()))
    print("- work of 2 processes at once / 1 alone (the machine's ceiling): " + ", ".join(
        f"{kind} {ratio:.2f}x" for kind, ratio in ceiling.items()))
    print(f"\nmedians of {args.repeats} runs, multi-process DirectRunner"
          + (", OMP_NUM_THREADS=1" if args.one_thread else "") + "\n")
    print("| task | size | 1 worker | cores busy | 2 workers | cores busy | 1 / 2 "
          "| two 1-worker runs at once | allowed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = {}
    for task, by_workers in times.items():
        one, two = statistics.median(by_workers[1]), statistics.median(by_workers[2])
        busy = [statistics.median(by_workers[f"cores_{w}"]) for w in (1, 2)]
        summary[task] = {"size": SIZES[task], "one_s": one, "two_s": two, "ratio": one / two,
                         "cores_busy": busy, "runs": by_workers}
        together = statistics.median(by_workers["corun"]) if "corun" in by_workers else None
        if together:
            summary[task].update(together_s=together, allowed=2 * one / together)
        print(f"| {task} | {SIZES[task]:,} | {one:.1f} s | {busy[0]:.2f} | {two:.1f} s | "
              f"{busy[1]:.2f} | **{one / two:.2f}x** | "
              + (f"{together:.1f} s | {2 * one / together:.2f}x |" if together else "| |"))
    os.makedirs(args.workdir, exist_ok=True)
    with open(os.path.join(args.workdir, "workers.json"), "w", encoding="utf-8") as f:
        json.dump({"ceiling": ceiling, "one_thread": args.one_thread, "tasks": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
