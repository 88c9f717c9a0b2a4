"""Benchmark: `evalbeam sweep` of M models x D datasets against the same work done as one run and
as D*M separate runs, on the same files, in the same process of measurement.

This is a standalone timing script, not a test. Run it from the repository root:

    python tests/benchmarks/bench_sweep.py                       # 10 x 10 x 10,000 datums
    python tests/benchmarks/bench_sweep.py --datasets 3 --models 3 --n_datums 2000 --repeats 1
    python tests/benchmarks/bench_sweep.py --one_by_one_sample 20   # time 20 of the 100 cells alone

Data: D datasets of N classification datums (pipelines.synthetic, 10 classes, seed = dataset
index), M models per dataset (skills from 0.5 to 3.0), written under --workdir once (params.json
last marks it complete). For the single run the D ground truths and each model's D files are
concatenated with the datum uids prefixed by the dataset, so it reads the same D*M*N prediction
rows (and D*N ground-truth rows) as the sweep.

Sides, each a fresh process, timed from start to exit (interpreter, imports, reading, computing,
writing), run one after the other, never at once:

* sweep: `evalbeam sweep SWEEP.toml --output OUT --quiet` into an empty OUT (D*M cells);
* rerun: the same command again on the finished OUT (every cell skipped);
* single: `evalbeam classification --groundtruths ALL --predictions m0=ALL_m0 ... --output OUT`;
* one by one: `evalbeam classification` once per cell (all D*M, or a random sample of K cells
  with --one_by_one_sample K, whose mean is scaled to D*M; said so in the output).

Printed: median wall times over --repeats (one by one: once), and the ratios the issue sets
targets for: sweep / single (<= 1.5), sweep / one by one (<= 0.25), rerun / sweep (<= 0.10).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time

EVALBEAM = [sys.executable, "-m", "evalbeam.pipelines.cli"]


def make_data(folder: str, datasets: int, models: int, n: int) -> dict:
    from evalbeam.pipelines.demo.synthetic import write_classification_dataset

    params = {"datasets": datasets, "models": models, "n_datums": n, "version": 1}
    marker = os.path.join(folder, "params.json")
    names = [f"m{j}" for j in range(models)]
    if os.path.exists(marker) and json.load(open(marker)) == params:
        return {"names": names}
    shutil.rmtree(folder, ignore_errors=True)
    skills = {name: 0.5 + 2.5 * j / max(1, models - 1) for j, name in enumerate(names)}
    for d in range(datasets):
        write_classification_dataset(os.path.join(folder, f"d{d}"), n_datums=n, n_classes=10,
                                     models=skills, seed=d)
    combined = os.path.join(folder, "all")
    os.makedirs(combined, exist_ok=True)
    for name in ["groundtruths"] + names:
        with open(os.path.join(combined, f"{name}.jsonl"), "w") as out:
            for d in range(datasets):
                with open(os.path.join(folder, f"d{d}", f"{name}.jsonl")) as stream:
                    for line in stream:
                        row = json.loads(line)
                        row["datum_uid"] = f"d{d}-{row['datum_uid']}"
                        out.write(json.dumps(row) + "\n")
    manifest = ["[[dataset]]\nname = \"d%d\"\ntask = \"classification\"\n"
                "groundtruths = \"%s/{dataset}/groundtruths.jsonl\"\n" % (d, folder) for d in range(datasets)]
    manifest += ["[[model]]\nname = \"%s\"\npredictions = \"%s/{dataset}/{model}.jsonl\"\n" % (name, folder)
                 for name in names]
    with open(os.path.join(folder, "sweep.toml"), "w") as stream:
        stream.write("\n".join(manifest))
    with open(marker, "w") as stream:
        json.dump(params, stream)
    return {"names": names}


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=int, default=10)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--n_datums", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one_by_one_sample", type=int, default=None, metavar="K")
    parser.add_argument("--workdir", default="/tmp/evalbeam-bench-sweep")
    parser.add_argument("--beam_args", default="", help="Beam options for every evalbeam command")
    args = parser.parse_args()
    beam = args.beam_args.split()
    data = os.path.join(args.workdir, f"data-{args.datasets}x{args.models}x{args.n_datums}")
    names = make_data(data, args.datasets, args.models, args.n_datums)["names"]
    out = os.path.join(args.workdir, "out")
    manifest = os.path.join(data, "sweep.toml")
    sweep_cmd = EVALBEAM + ["sweep", manifest, "--output", out, "--quiet"] + beam
    single_cmd = EVALBEAM + ["classification", "--groundtruths", f"{data}/all/groundtruths.jsonl"]
    for name in names:
        single_cmd += ["--predictions", f"{name}={data}/all/{name}.jsonl"]
    single_cmd += ["--output", out + "-single", "--quiet", "--overwrite"] + beam

    times: dict[str, list[float]] = {"sweep": [], "rerun": [], "single": []}
    for _ in range(args.repeats):
        shutil.rmtree(out, ignore_errors=True)
        times["sweep"].append(timed(sweep_cmd))
        times["rerun"].append(timed(sweep_cmd))
        times["single"].append(timed(single_cmd))
    cells = [(d, name) for d in range(args.datasets) for name in names]
    sample = cells
    if args.one_by_one_sample and args.one_by_one_sample < len(cells):
        sample = random.Random(0).sample(cells, args.one_by_one_sample)
    alone = []
    for d, name in sample:
        alone.append(timed(EVALBEAM + ["classification", "--groundtruths", f"{data}/d{d}/groundtruths.jsonl",
                                       "--predictions", f"{name}={data}/d{d}/{name}.jsonl",
                                       "--output", f"{out}-alone/d{d}/{name}", "--quiet", "--overwrite"] + beam))
    one_by_one = statistics.mean(alone) * len(cells)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"data: {args.datasets} datasets x {args.models} models x {args.n_datums:,} datums "
          f"({len(cells)} cells, {len(cells) * args.n_datums:,} prediction rows); beam args: {beam or 'none'}")
    print(f"sweep       {med['sweep']:8.1f} s   (median of {args.repeats}: {', '.join(f'{t:.1f}' for t in times['sweep'])})")
    print(f"rerun       {med['rerun']:8.1f} s   (finished sweep again, every cell skipped)")
    print(f"single run  {med['single']:8.1f} s   (one evalbeam classification over the same rows)")
    print(f"one by one  {one_by_one:8.1f} s   ({len(sample)} of {len(cells)} cells timed"
          + (f", mean {statistics.mean(alone):.2f} s scaled to {len(cells)}" if len(sample) < len(cells) else "") + ")")
    print(f"ratios: sweep/single {med['sweep'] / med['single']:.2f}x (target <= 1.5), "
          f"sweep/one-by-one {med['sweep'] / one_by_one:.2f}x (target <= 0.25), "
          f"rerun/sweep {med['rerun'] / med['sweep']:.2f}x (target <= 0.10)")


if __name__ == "__main__":
    main()
