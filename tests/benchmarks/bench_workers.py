"""Worker scaling on one machine: every task on the multi-process DirectRunner with 1 and with 2
worker processes, on the same files, interleaved, and the ratio of the medians (time with 1
worker / time with 2). Sizes are where the work dominates the ~2.5 s of start-up and tail
(tests/benchmarks/README.md, 2026-11-27); detection also from native rows (the same images as
JSONL read in spans: a COCO .json is one document that one worker parses).

    pip install -e ".[test,bench]"
    python tests/benchmarks/bench_workers.py                     # every task, 3 repeats, ~30 min
    python tests/benchmarks/bench_workers.py --tasks retrieval --repeats 1
    python tests/benchmarks/bench_workers.py --tasks classification --sizes classification=1000000

A 2-core machine bounds the ratio by 2; the target is segmentation's 1.69x (issue 19).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_classification import machine_info  # noqa: E402
from scaling_study import run_one, task_command  # noqa: E402

SIZES = {"classification": 3_000_000, "detection": 10_000, "detection_native": 50_000,
         "segmentation": 10_000, "text": 100_000, "retrieval": 300_000}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "evalbeam-bench"))
    parser.add_argument("--tasks", default=",".join(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="", help="overrides, e.g. segmentation=10000")
    args = parser.parse_args(argv)
    for item in filter(None, args.sizes.split(",")):
        task, n = item.split("=")
        SIZES[task] = int(n)
    output = os.path.join(args.workdir, "worker-runs", "run")
    times: dict = {}
    for repeat in range(args.repeats):
        for task in args.tasks.split(","):
            for workers in (1, 2):
                cmd = task_command(task, args.workdir, SIZES[task], output) + [
                    "--direct_running_mode", "multi_processing", "--direct_num_workers", str(workers)]
                run = run_one(cmd, output)
                times.setdefault(task, {}).setdefault(workers, []).append(run["wall_s"])
                print(f"repeat {repeat + 1}: {task} {workers} worker(s): {run['wall_s']:.1f} s",
                      file=sys.stderr)
    print("\n".join(machine_info()))
    print(f"\nmedians of {args.repeats} runs, multi-process DirectRunner\n")
    print("| task | size | 1 worker | 2 workers | 1 / 2 |")
    print("|---|---:|---:|---:|---:|")
    summary = {}
    for task, by_workers in times.items():
        one, two = statistics.median(by_workers[1]), statistics.median(by_workers[2])
        summary[task] = {"size": SIZES[task], "one_s": one, "two_s": two, "ratio": one / two,
                         "runs": by_workers}
        print(f"| {task} | {SIZES[task]:,} | {one:.1f} s | {two:.1f} s | **{one / two:.2f}x** |")
    with open(os.path.join(args.workdir, "workers.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
