"""Benchmark: `evalbeam retrieval` end to end against ranx on the same TREC files.

Data (made once, cached in --workdir): Q queries; qrels with 1-20 judged documents per query
(levels 0-3, about half relevant); a run of 100 documents per query with distinct scores within a
query (so every tool ranks the same way), a quarter of the judged documents among them.

Sides, each in a fresh process, in the same run:
- evalbeam: `evalbeam retrieval` from reading the files to writing metrics.jsonl (in-process
  DirectRunner, and multi_processing with 2 workers);
- ranx: Qrels.from_file + Run.from_file (kind "trec") + evaluate() with the same measures
  (its numba functions compile on first use, which is part of what a user waits for).
The script prints wall times and the ratio, and checks the measures both compute.

    pip install -e ".[test,bench]"
    python tests/benchmarks/bench_retrieval.py                     # 100,000 queries x 100 docs
    python tests/benchmarks/bench_retrieval.py --n_queries 10000 --repeats 1
    python tests/benchmarks/bench_retrieval.py --bootstrap 100 --skip "ranx;evalbeam, multi_processing, 2 workers"

With --bootstrap R, one more side runs the in-process evalbeam with `--bootstrap R` on the same
files; the script prints its time over the time without it (target <= 1.5x at R = 100) and
checks that the point values are the same. --skip leaves sides out (names separated by ";").
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_classification import machine_info, measure, read_json, write_json  # noqa: E402

DEPTH = 100
# evalbeam record (type, k) -> ranx metric name
MEASURES = {("MAP", None): "map", ("MRR", None): "mrr", ("Precision", 10): "precision@10",
            ("Recall", 100): "recall@100", ("NDCG", 10): "ndcg@10", ("Hit", 10): "hit_rate@10",
            ("RPrecision", None): "r-precision", ("F1", 10): "f1@10", ("MAP", 100): "map@100"}


def ensure_dataset(workdir: str, n_queries: int, seed: int = 0) -> dict:
    import numpy as np

    folder = os.path.join(workdir, f"data_q{n_queries}_s{seed}")
    done = os.path.join(folder, "done.json")
    if read_json(done):
        print(f"reusing data in {folder}", file=sys.stderr)
        return read_json(done)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    started = time.time()
    qrels_path, run_path = os.path.join(folder, "qrels.trec"), os.path.join(folder, "run.trec")
    with open(qrels_path, "w") as qrels, open(run_path, "w") as run:
        for start in range(0, n_queries, 10_000):
            n = min(10_000, n_queries - start)
            judged = rng.integers(1, 21, n)
            q_lines, r_lines = [], []
            for i in range(n):
                q = f"q{start + i}"
                docs = rng.choice(1_000_000, judged[i] + DEPTH, replace=False)
                levels = rng.choice(4, judged[i], p=[0.5, 0.25, 0.15, 0.1])
                q_lines.extend(f"{q} 0 d{d} {lv}\n" for d, lv in zip(docs[:judged[i]], levels))
                # a quarter of the judged docs are retrieved, the rest of the 100 are unjudged
                picked = docs[:judged[i]][rng.random(judged[i]) < 0.25]
                retrieved = np.concatenate([picked, docs[judged[i]:]])[:DEPTH]
                scores = rng.permutation(DEPTH)[:retrieved.size] / DEPTH + rng.random() * 0.001
                r_lines.extend(f"{q} Q0 d{d} {r + 1} {s:.6f} bench\n"
                               for r, (d, s) in enumerate(zip(retrieved, scores)))
            qrels.writelines(q_lines)
            run.writelines(r_lines)
            print(f"  {start + n:,} queries ({time.time() - started:.0f} s)", file=sys.stderr)
    info = {"qrels": qrels_path, "run": run_path, "n_queries": n_queries,
            "run_mb": os.path.getsize(run_path) / 1e6}
    write_json(done, info)
    return info


def run_ranx(qrels_path: str, run_path: str, output: str) -> None:
    """ranx on the same files (child process); writes its means to output/ranx.json."""
    started = time.perf_counter()
    from ranx import Qrels, Run, evaluate

    qrels = Qrels.from_file(qrels_path, kind="trec")
    run = Run.from_file(run_path, kind="trec")
    result = evaluate(qrels, run, sorted(MEASURES.values()))
    os.makedirs(output, exist_ok=True)
    write_json(os.path.join(output, "ranx.json"), {k: float(v) for k, v in result.items()})
    write_json(os.path.join(output, "peer.json"), {"timed_s": time.perf_counter() - started})


def evalbeam_command(data: dict, output: str, beam_args: str) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "evalbeam")
    base = [exe] if os.path.exists(exe) else [sys.executable, "-m", "evalbeam.pipelines.cli"]
    return base + ["retrieval", "--groundtruths", data["qrels"], "--predictions", f"run={data['run']}",
                   "--output", output, "--quiet", *shlex.split(beam_args)]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--_ranx"]:
        run_ranx(*argv[1:4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_queries", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=os.path.join("/tmp", "evalbeam-bench", "retrieval"))
    parser.add_argument("--bootstrap", type=int, default=0, metavar="R",
                        help="also time evalbeam (in-process) with --bootstrap R and print the ratio")
    parser.add_argument("--skip", default="", help='sides not to run, separated by ";"')
    args = parser.parse_args(argv)
    data = ensure_dataset(args.workdir, args.n_queries)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    sides = {
        "evalbeam, in-process": lambda out: evalbeam_command(data, out, ""),
        "evalbeam, multi_processing, 2 workers": lambda out: evalbeam_command(
            data, out, "--direct_running_mode multi_processing --direct_num_workers 2"),
        "ranx": lambda out: [sys.executable, os.path.abspath(__file__), "--_ranx", data["qrels"],
                             data["run"], out],
    }
    booted = f"evalbeam, in-process, --bootstrap {args.bootstrap}"
    if args.bootstrap:
        sides[booted] = lambda out: evalbeam_command(data, out, f"--bootstrap {args.bootstrap}")
    skip = {s.strip() for s in args.skip.split(";") if s.strip()}
    sides = {k: v for k, v in sides.items() if k not in skip}
    runs: dict = {k: [] for k in sides}
    runs_dir = os.path.join(args.workdir, f"runs_q{args.n_queries}")
    os.makedirs(runs_dir, exist_ok=True)
    for repeat in range(1, args.repeats + 1):
        for i, (key, make) in enumerate(sides.items()):
            output = os.path.join(runs_dir, f"side{i}_r{repeat}")
            shutil.rmtree(output, ignore_errors=True)
            cmd = make(output)
            print(f"[{repeat}/{args.repeats}] {key}: {shlex.join(cmd)}", file=sys.stderr)
            result = measure(cmd, output + ".log")
            if result["returncode"] != 0:
                with open(result["stderr"], encoding="utf-8", errors="replace") as f:
                    sys.stderr.write(f.read()[-5000:])
                return 1
            result["output"] = output
            print(f"    {result['wall_s']:.2f} s, tree {result['peak_tree_kb'] / 1024:.0f} MB", file=sys.stderr)
            runs[key].append(result)
    def measures_of(key: str) -> dict:
        out = {}
        with open(os.path.join(runs[key][-1]["output"], "metrics.jsonl")) as f:
            for r in map(json.loads, f):
                name = MEASURES.get((r["type"], r["parameters"].get("k")))
                if name and r["model"] == "run" and r["slice"] == {}:
                    out[name] = r["value"]
        return out

    ours = measures_of("evalbeam, in-process") if "evalbeam, in-process" in runs else {}
    theirs = read_json(os.path.join(runs["ranx"][-1]["output"], "ranx.json")) if "ranx" in runs else {}
    print("### Machine")
    print("\n".join(machine_info(("apache-beam", "ranx", "numba", "numpy", "pyarrow"))))
    print(f"- load average at the start: {load}; at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"\n### Retrieval: {args.n_queries:,} queries x {DEPTH} docs ({data['run_mb']:.0f} MB run), "
          f"median of {args.repeats} run(s)\n")
    print("| side | wall time median (s) | all runs (s) | peak PSS, process tree (MB) |")
    print("|---|---:|---|---:|")
    median = {}
    for key, items in runs.items():
        median[key] = statistics.median(r["wall_s"] for r in items)
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in items)
        print(f"| {key} | {median[key]:.1f} | {walls} | {max(r['peak_tree_kb'] for r in items) / 1024:.0f} |")
    two = "evalbeam, multi_processing, 2 workers"
    if "ranx" in median and "evalbeam, in-process" in median:
        print(f"\n**evalbeam (in-process) / ranx: {median['evalbeam, in-process'] / median['ranx']:.2f}x**"
              + (f", 2 workers: {median[two] / median['ranx']:.2f}x" if two in median else "")
              + " (target <= 0.25)")
    if booted in median and "evalbeam, in-process" in median:
        print(f"\n**--bootstrap {args.bootstrap} / without: "
              f"{median[booted] / median['evalbeam, in-process']:.2f}x** (target <= 1.5)")
        if measures_of(booted) != ours:
            print("!!! the point values differ with --bootstrap")
            return 1
    if not theirs:
        return 0
    print("\n| measure | evalbeam | ranx |\n|---|---:|---:|")
    worst = 0.0
    for name in sorted(theirs):
        worst = max(worst, abs(ours[name] - theirs[name]))
        print(f"| {name} | {ours[name]:.6f} | {theirs[name]:.6f} |")
    print(f"\nmax abs difference {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
