"""Benchmark: `evalbeam segmentation` end to end against valor-lite's semantic segmentation.

Data (made once, cached in --workdir): N datums of 512x512 PNG label maps, ground truth and one
model, 20 labels (ids 1..20; id 0 = no label, ~5% of the regions). A ground-truth map is a Voronoi
partition into 15-40 regions of random labels (irregular boundaries, as real label maps have);
the prediction moves every boundary (region centres jittered by ~6 px) and mislabels 10% of the
regions.

Sides, each in a fresh process, on the same files, in the same run (interleaved repeats):
- evalbeam (in-process DirectRunner), and with --direct_running_mode multi_processing and 1 or
  2 workers: the CLI from reading the JSONL to writing metrics.jsonl, PNG decoding included.
- valor-lite: reads the same JSONL, decodes the same PNGs with Pillow, adds Segmentation objects
  to `Loader.in_memory()` in batches of 50 (so memory stays bounded), `finalize()`,
  `compute_precision_recall_iou()`; timed end to end as a process, like evalbeam.
The script checks that mIOU, Accuracy and every IOU agree, and prints wall times, peak memory
(largest process and the whole process tree, PSS) and the ratios.

    pip install -e ".[test,bench]"
    python tests/benchmarks/bench_segmentation.py                  # 2,000 datums, 3 repeats
    python tests/benchmarks/bench_segmentation.py --n_datums 200 --repeats 1
    python tests/benchmarks/bench_segmentation.py --repeat_rows 5 --skip valor-lite,evalbeam
    python tests/benchmarks/bench_segmentation.py --bootstrap 100 --skip "valor-lite;evalbeam, multi_processing, 1 worker;evalbeam, multi_processing, 2 workers"

With --bootstrap R, one more side runs the in-process evalbeam with `--bootstrap R` on the same
files; the script prints its time over the time without it and checks that the point values
are the same.
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

SIZE = 512
N_LABELS = 20
LABELS = [f"class{k:02d}" for k in range(1, N_LABELS + 1)]
MODEL = "model"


# ------------------------------------------------------------------------------------------- data

def ensure_dataset(workdir: str, n_datums: int, seed: int = 0) -> dict:
    import numpy as np
    from PIL import Image

    folder = os.path.join(workdir, f"voronoi_n{n_datums}_s{seed}")
    done = os.path.join(folder, "done.json")
    if read_json(done):
        print(f"reusing data in {folder}", file=sys.stderr)
        return read_json(done)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "png"))
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)

    def regions(points: np.ndarray) -> np.ndarray:
        """Index of the nearest point of every pixel (a Voronoi partition)."""
        best = np.full((SIZE, SIZE), np.inf, dtype=np.float32)
        owner = np.zeros((SIZE, SIZE), dtype=np.int64)
        for i, (y, x) in enumerate(points):
            d = (yy - y) ** 2 + (xx - x) ** 2
            closer = d < best
            best[closer] = d[closer]
            owner[closer] = i
        return owner

    gt_rows, pd_rows = [], []
    started = time.time()
    for i in range(n_datums):
        uid = f"img-{i:06d}"
        n_regions = int(rng.integers(15, 40))
        points = rng.uniform(0, SIZE, (n_regions, 2)).astype(np.float32)
        region_label = rng.integers(1, N_LABELS + 1, n_regions)
        region_label[rng.random(n_regions) < 0.05] = 0
        # the prediction: boundaries moved (points jittered), 10% of the regions mislabelled
        guess = np.where(rng.random(n_regions) < 0.10, rng.integers(0, N_LABELS + 1, n_regions),
                         region_label)
        gt = region_label[regions(points)].astype(np.uint8)
        pd = guess[regions(points + rng.normal(0, 6, points.shape).astype(np.float32))].astype(np.uint8)
        for kind, array, rows in (("gt", gt, gt_rows), ("pd", pd, pd_rows)):
            name = os.path.join("png", f"{kind}-{uid}.png")
            Image.fromarray(array).save(os.path.join(folder, name))
            rows.append({"datum_uid": uid, "label_map_uri": name})
        if (i + 1) % 500 == 0:
            print(f"  wrote {i + 1:,} datums ({time.time() - started:.0f} s)", file=sys.stderr)
    paths = {"groundtruths": os.path.join(folder, "groundtruths.jsonl"),
             "predictions": os.path.join(folder, "predictions.jsonl")}
    for key, rows in (("groundtruths", gt_rows), ("predictions", pd_rows)):
        with open(paths[key], "w", encoding="utf-8") as out:
            out.writelines(json.dumps(r) + "\n" for r in rows)
    png_bytes = sum(os.path.getsize(os.path.join(folder, "png", f)) for f in os.listdir(os.path.join(folder, "png")))
    info = {**paths, "n_datums": n_datums, "png_mb": png_bytes / 1e6}
    write_json(done, info)
    return info


def scaled(data: dict, factor: int) -> dict:
    """The dataset `factor` times over: rows repeated with distinct datum_uids, naming the same PNG
    files (for timing larger N without generating more images)."""
    if factor == 1:
        return data
    out = dict(data, n_datums=data["n_datums"] * factor)
    for key in ("groundtruths", "predictions"):
        path = data[key].replace(".jsonl", f"_x{factor}.jsonl")
        if not os.path.exists(path):
            with open(data[key], encoding="utf-8") as f:
                rows = [json.loads(line) for line in f]
            with open(path, "w", encoding="utf-8") as out_file:
                for copy in range(factor):
                    for row in rows:
                        out_file.write(json.dumps(dict(row, datum_uid=f"{row['datum_uid']}-{copy}")) + "\n")
        out[key] = path
    return out


# -------------------------------------------------------------------------------------- commands

def evalbeam_command(data: dict, output: str, beam_args: str) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "evalbeam")
    base = [exe] if os.path.exists(exe) else [sys.executable, "-m", "evalbeam.pipelines.cli"]
    names = ",".join(f"{k}={name}" for k, name in enumerate(LABELS, start=1))
    return base + ["segmentation", "--groundtruths", data["groundtruths"],
                   "--predictions", f"{MODEL}={data['predictions']}", "--output", output, "--quiet",
                   "--label_names", names, "--unlabeled_id", "0", *shlex.split(beam_args)]


def peer_command(data: dict, output: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--_peer", "--groundtruths", data["groundtruths"],
            "--predictions", data["predictions"], "--output", output]


def run_valor_lite(gt_path: str, pd_path: str, output: str) -> None:
    """valor-lite on the same rows and PNGs (child process); writes metrics.jsonl like evalbeam's
    mIOU / Accuracy / IOU records."""
    started = time.perf_counter()
    import numpy as np
    from PIL import Image
    from valor_lite.semantic_segmentation import Loader, Segmentation

    def rows(path):
        with open(path, encoding="utf-8") as f:
            return {r["datum_uid"]: r for r in map(json.loads, f)}

    gts, pds = rows(gt_path), rows(pd_path)
    base_gt, base_pd = os.path.dirname(gt_path), os.path.dirname(pd_path)
    loader = Loader.in_memory()
    batch = []
    for uid, row in gts.items():
        g = np.asarray(Image.open(os.path.join(base_gt, row["label_map_uri"])))
        p = np.asarray(Image.open(os.path.join(base_pd, pds[uid]["label_map_uri"])))
        batch.append(Segmentation(uid=uid, groundtruths=g, predictions=p, labels=LABELS))
        if len(batch) == 50:
            loader.add_data(batch)
            batch = []
    if batch:
        loader.add_data(batch)
    metrics = loader.finalize().compute_precision_recall_iou()
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "metrics.jsonl"), "w", encoding="utf-8") as out:
        for items in metrics.values():
            for m in items:
                d = m.to_dict()
                if d["type"] in ("mIOU", "Accuracy", "IOU"):
                    out.write(json.dumps(d) + "\n")
    write_json(os.path.join(output, "peer.json"), {"timed_s": time.perf_counter() - started})


# ---------------------------------------------------------------------------------------- report

def headline(path: str) -> dict | None:
    """{(type, label): value} of mIOU, Accuracy and IOU records (evalbeam: model, whole set)."""
    if not os.path.exists(path):
        return None
    out = {}
    with open(path, encoding="utf-8") as f:
        for r in map(json.loads, f):
            if r["type"] in ("mIOU", "Accuracy", "IOU") and r.get("slice", {}) == {}:
                out[(r["type"], r["parameters"].get("label"))] = r["value"]
    return out or None


def main(argv: list[str]) -> int:
    if argv[:1] == ["--_peer"]:
        p = argparse.ArgumentParser()
        for flag in ("--groundtruths", "--predictions", "--output"):
            p.add_argument(flag, required=True)
        a = p.parse_args(argv[1:])
        run_valor_lite(a.groundtruths, a.predictions, a.output)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_datums", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=os.path.join("/tmp", "evalbeam-bench", "segmentation"))
    parser.add_argument("--skip", default="", help='sides not to run, separated by commas, or by ";" '
                                                   'when a name holds a comma')
    parser.add_argument("--repeat_rows", type=int, default=1, metavar="K",
                        help="evaluate every row K times (distinct uids, same PNG files): larger N "
                             "for the worker-scaling measurement")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="R",
                        help="also time evalbeam with --bootstrap R (in-process) and print the ratio")
    args = parser.parse_args(argv)
    data = scaled(ensure_dataset(args.workdir, args.n_datums), args.repeat_rows)
    load_at_start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    sides = {
        "evalbeam": lambda out: evalbeam_command(data, out, ""),
        "evalbeam, multi_processing, 1 worker": lambda out: evalbeam_command(
            data, out, "--direct_running_mode multi_processing --direct_num_workers 1"),
        "evalbeam, multi_processing, 2 workers": lambda out: evalbeam_command(
            data, out, "--direct_running_mode multi_processing --direct_num_workers 2"),
        "valor-lite": lambda out: peer_command(data, out),
    }
    booted = f"evalbeam, --bootstrap {args.bootstrap}"
    if args.bootstrap:
        sides[booted] = lambda out: evalbeam_command(data, out, f"--bootstrap {args.bootstrap}")
    skip = {s.strip() for s in args.skip.split(";" if ";" in args.skip else ",") if s.strip()}
    runs: dict = {key: [] for key in sides if key not in skip}
    runs_dir = os.path.join(args.workdir, f"runs_n{data['n_datums']}")
    os.makedirs(runs_dir, exist_ok=True)
    for repeat in range(1, args.repeats + 1):
        for i, key in enumerate(runs):
            output = os.path.join(runs_dir, f"side{i}_r{repeat}")
            shutil.rmtree(output, ignore_errors=True)
            cmd = sides[key](output)
            print(f"[{repeat}/{args.repeats}] {key}: {shlex.join(cmd)}", file=sys.stderr)
            result = measure(cmd, output + ".log")
            result["headline"] = headline(os.path.join(output, "metrics.jsonl"))
            if result["returncode"] != 0 or result["headline"] is None:
                with open(result["stderr"], encoding="utf-8", errors="replace") as f:
                    sys.stderr.write(f.read()[-5000:])
                print(f"!!! {key} failed (exit {result['returncode']})", file=sys.stderr)
                return 1
            print(f"    {result['wall_s']:.2f} s, peak RSS {result['maxrss_kb'] / 1024:.0f} MB, "
                  f"tree {result['peak_tree_kb'] / 1024:.0f} MB", file=sys.stderr)
            runs[key].append(result)

    print("### Machine")
    print("\n".join(machine_info(("apache-beam", "valor-lite", "numpy", "pillow"))))
    print(f"- load average at the start: {load_at_start}; at the end: "
          + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"\n### Semantic segmentation, {data['n_datums']:,} datums of {SIZE}x{SIZE}, {N_LABELS} labels, "
          f"PNG label maps ({data['png_mb']:.0f} MB), median of {args.repeats} run(s)\n")
    print("| side | wall time median (s) | all runs (s) | peak RSS, largest process (MB) | peak PSS, process tree (MB) |")
    print("|---|---:|---|---:|---:|")
    median = {}
    for key, items in runs.items():
        median[key] = statistics.median(r["wall_s"] for r in items)
        walls = ", ".join(f"{r['wall_s']:.2f}" for r in items)
        print(f"| {key} | {median[key]:.2f} | {walls} | "
              f"{max(r['maxrss_kb'] for r in items) / 1024:.0f} | {max(r['peak_tree_kb'] for r in items) / 1024:.0f} |")
    print()
    if "evalbeam" in median and "valor-lite" in median:
        print(f"**evalbeam / valor-lite: {median['evalbeam'] / median['valor-lite']:.2f}x** (target <= 1.0)")
    one, two = "evalbeam, multi_processing, 1 worker", "evalbeam, multi_processing, 2 workers"
    if one in median and two in median:
        print(f"**2 workers vs 1: {median[one] / median[two]:.2f}x faster** (target >= 1.6)")
    if args.bootstrap and "evalbeam" in median and booted in median:
        print(f"**--bootstrap {args.bootstrap} / without: {median[booted] / median['evalbeam']:.2f}x**")
        plain, with_intervals = runs["evalbeam"][-1]["headline"], runs[booted][-1]["headline"]
        if plain != with_intervals:
            print("!!! the point values differ with --bootstrap")
            return 1
    if "evalbeam" in runs and "valor-lite" in runs:
        ours, theirs = runs["evalbeam"][-1]["headline"], runs["valor-lite"][-1]["headline"]
        diff = max(abs(ours[k] - theirs[k]) for k in theirs)
        print(f"\nAgreement with valor-lite over {len(theirs)} values (mIOU, Accuracy, IOU per label): "
              f"max abs difference {diff:.2e}; mIOU {ours[('mIOU', None)]:.6f}")
        if diff > 1e-9:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
