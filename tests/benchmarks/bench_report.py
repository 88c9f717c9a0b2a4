"""Benchmark: the HTML report's size, the time it adds to a run, and how fast a headless browser
renders it, for a 1,000,000-datum classification run and a 100-cell sweep.

This is a standalone timing script, not a test. Run it from the repository root (needs Debian's
chromium, as the browser tests do):

    python tests/benchmarks/bench_report.py                    # both workloads
    python tests/benchmarks/bench_report.py --n_datums 100000 --skip_sweep --run_repeats 3

Workloads:
* classification: N datums x 10 classes (pipelines.synthetic, seed 0), two models ("a" skill
  2.0, "b" skill 1.0), --slice region (4 values), --bootstrap 100, --compare_to b, calibration
  (ECE, ReliabilityDiagram) on top of the default metrics: 10 model/slice sections, each with
  its per-label table, F1 bars, PR curves, confusion heatmap and reliability diagram. Timed
  with and without --report, each a fresh process, one after the other.
* sweep: tests/benchmarks/bench_sweep.py's data (10 datasets x 10 models x 10,000 datums, 100
  cells), `evalbeam sweep --report`, then the page alone again with `evalbeam report DIR`.

Medians over --run_repeats runs (default 1) and --browser_repeats page loads (default 3).

Browser: tests/browser.py loads the page from disk in headless chromium (a fresh profile each
time) and records the time from navigation to the load event, to the charts on the first
screen drawn, and to every chart of the page drawn (window.evalbeamDrawAll(), all sections
opened); plus the console errors and network requests (both must be none).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))         # tests/, for browser.py
sys.path.insert(0, HERE)
EVALBEAM = [sys.executable, "-m", "evalbeam.pipelines.cli"]
FIRST_SCREEN = ("Array.from(document.querySelectorAll('div.chart')).filter(function (d) {"
                " var r = d.getBoundingClientRect(); return r.top < window.innerHeight && r.bottom > 0 &&"
                " d.offsetParent !== null; }).every(function (d) { return d.classList.contains('drawn'); })")
DRAW_ALL = "window.evalbeamDrawAll().then(function (n) { return n + 1; })"


def timed(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1, 5):
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed, done.returncode


def browse(path: str, repeats: int) -> dict:
    from browser import load_page

    first, everything, loads, charts = [], [], [], 0
    for _ in range(repeats):
        page = load_page(path, wait_js=FIRST_SCREEN, timeout=120, width=1400, height=900)
        assert not page.errors and not page.requests, (page.errors, page.requests)
        first.append(page.ready_ms)
        loads.append(page.load_ms)
        page = load_page(path, wait_js=DRAW_ALL, timeout=300, width=1400, height=900,
                         probes={"charts": "document.querySelectorAll('div.chart.drawn').length"})
        assert not page.errors and not page.requests, (page.errors, page.requests)
        everything.append(page.ready_ms)
        charts = page.probes["charts"]
    return {"load_ms": statistics.median(loads), "first_screen_ms": statistics.median(first),
            "all_charts_ms": statistics.median(everything), "charts": charts}


def classification(args) -> None:
    from evalbeam.pipelines.demo.synthetic import write_classification_dataset

    folder = os.path.join(args.workdir, f"clf-{args.n_datums}")
    marker = os.path.join(folder, "params.json")
    params = {"n": args.n_datums, "version": 1}
    if not (os.path.exists(marker) and json.load(open(marker)) == params):
        shutil.rmtree(folder, ignore_errors=True)
        print(f"generating {args.n_datums:,} datums ...", file=sys.stderr)
        write_classification_dataset(folder, n_datums=args.n_datums, n_classes=10,
                                     models={"a": 2.0, "b": 1.0}, seed=0)
        json.dump(params, open(marker, "w"))
    out = os.path.join(args.workdir, "clf-out")
    base = EVALBEAM + ["classification", "--groundtruths", f"{folder}/groundtruths.jsonl",
                       "--predictions", f"a={folder}/a.jsonl", "--predictions", f"b={folder}/b.jsonl",
                       "--slice", "region", "--bootstrap", "100", "--compare_to", "b",
                       "--metrics", "Counts,Precision,Recall,F1,Accuracy,ROCAUC,mROCAUC,PrecisionRecallCurve,"
                                    "ConfusionMatrix,DetailedPrecisionRecallCurve,ECE,ReliabilityDiagram",
                       "--output", out, "--quiet", "--overwrite"]
    without, with_report = [], []
    for _ in range(args.run_repeats):
        without.append(timed(base)[0])
        with_report.append(timed(base + ["--report"])[0])
    page = os.path.join(out, "report.html")
    size = os.path.getsize(page)
    started = time.perf_counter()
    subprocess.run(EVALBEAM + ["report", out, "-o", os.path.join(args.workdir, "clf-page.html")],
                   check=True, stderr=subprocess.DEVNULL)
    alone = time.perf_counter() - started
    shown = browse(page, args.browser_repeats)
    print(f"classification, {args.n_datums:,} datums x 10 classes, 2 models, 4 regions, bootstrap 100:")
    print(f"  run without --report {statistics.median(without):6.1f} s, with {statistics.median(with_report):6.1f} s "
          f"(+{statistics.median(with_report) - statistics.median(without):.1f} s); "
          f"`evalbeam report` alone {alone:.1f} s")
    print(f"  report.html {size / 1e6:.2f} MB (limit 5 MB); browser: load event {shown['load_ms']:.0f} ms, "
          f"first screen drawn {shown['first_screen_ms']:.0f} ms, all {shown['charts']} charts drawn "
          f"{shown['all_charts_ms']:.0f} ms (limit 3,000 ms)")


def sweep(args) -> None:
    from bench_sweep import make_data

    data = os.path.join(args.workdir, "sweep-data")
    make_data(data, 10, 10, 10_000)
    out = os.path.join(args.workdir, "sweep-out")
    shutil.rmtree(out, ignore_errors=True)
    took, _ = timed(EVALBEAM + ["sweep", os.path.join(data, "sweep.toml"), "--output", out, "--quiet",
                                "--report"])
    page = os.path.join(out, "report.html")
    started = time.perf_counter()
    subprocess.run(EVALBEAM + ["report", out, "-o", os.path.join(args.workdir, "sweep-page.html")],
                   check=True, stderr=subprocess.DEVNULL)
    alone = time.perf_counter() - started
    shown = browse(page, args.browser_repeats)
    print("sweep, 10 datasets x 10 models x 10,000 datums (100 cells):")
    print(f"  sweep with --report {took:.1f} s; `evalbeam report` alone {alone:.1f} s")
    print(f"  report.html {os.path.getsize(page) / 1e6:.2f} MB (limit 5 MB); browser: load event "
          f"{shown['load_ms']:.0f} ms, first screen drawn {shown['first_screen_ms']:.0f} ms, all "
          f"{shown['charts']} charts drawn {shown['all_charts_ms']:.0f} ms (limit 3,000 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_datums", type=int, default=1_000_000)
    parser.add_argument("--run_repeats", type=int, default=1,
                        help="runs with and without --report (medians; a 1M-datum run takes minutes)")
    parser.add_argument("--browser_repeats", type=int, default=3, help="page loads (medians)")
    parser.add_argument("--workdir", default="/tmp/evalbeam-bench-report")
    parser.add_argument("--skip_sweep", action="store_true")
    parser.add_argument("--skip_classification", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if not args.skip_classification:
        classification(args)
    if not args.skip_sweep:
        sweep(args)


if __name__ == "__main__":
    main()
