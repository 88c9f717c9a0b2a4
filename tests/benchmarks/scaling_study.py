"""Scaling study: what crosses each shuffle, and how long a run takes, as inputs grow.

For every task, evalbeam runs at three sizes on the benchmarks' own synthetic data (the same
generators as bench_<task>.py), and classification also varies one factor at a time around its
middle size: models, --slice keys, labels and --num_shards. Each run's run.json gives the
elements and bytes that entered GroupByShard and MergeStates and the largest merged state
(transforms/meters.py); the script fits, per task and figure, y = c * n^b on the sizes (b: how
it grows with the datums) and prints the per-datum (or per-state) coefficients that
deploy/README.md's sizing table is computed from. Wall times are the in-process DirectRunner's
on this machine (one core does the work), so n / wall is a per-core throughput.

    pip install -e ".[test,bench]"
    python tests/benchmarks/scaling_study.py                      # every task, ~15 min
    python tests/benchmarks/scaling_study.py --tasks classification --quick

Results go to --workdir/scaling.json; the data is made once and reused.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_classification import machine_info, measure  # noqa: E402

SIZES = {  # datums (classification, text), images (detection, segmentation), queries (retrieval)
    "classification": [10_000, 100_000, 1_000_000],
    "detection": [1_000, 3_000, 10_000],
    "detection_native": [1_000, 3_000, 10_000],   # the same images as native JSONL rows
    "segmentation": [100, 300, 1_000],
    "text": [1_000, 10_000, 100_000],
    "retrieval": [1_000, 10_000, 100_000],
}
QUICK = {task: sizes[:2] for task, sizes in SIZES.items()}
FIGURES = [("GroupByShard", "elements"), ("GroupByShard", "bytes"), ("MergeStates", "elements"),
           ("MergeStates", "bytes"), ("MergeStates", "largest_state_bytes")]


def evalbeam_exe() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "evalbeam")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "evalbeam.pipelines.cli"]


def classification_command(workdir: str, n: int, output: str, models: int = 1, slices: int = 0,
                           classes: int = 10, shards: int | None = None) -> list[str]:
    import bench_classification as bc

    # with 10 classes, smaller sizes are prefixes of bench_classification.py's 1 M datums
    folder = os.path.join(workdir, "classification")
    if classes == 10:
        paths = bc.ensure_dataset(folder, max(n, 1_000_000), classes)
        if n < 1_000_000:
            paths = bc.ensure_prefix(paths, n)
    else:
        paths = bc.ensure_dataset(folder, n, classes)
    predictions = paths[bc.MODEL]
    cmd = evalbeam_exe() + ["classification", "--groundtruths", paths["groundtruths"]]
    for m in range(models):  # the same file under several names: models x the per-model work
        cmd += ["--predictions", f"m{m}={predictions}"]
    if slices:  # the synthetic rows have one metadata key, "region", with 4 values
        cmd += ["--slice", "region"]
    if shards:
        cmd += ["--num_shards", str(shards)]
    return cmd + ["--output", output, "--quiet", "--max_rejected_fraction", "0.05"]


def task_command(task: str, workdir: str, n: int, output: str) -> list[str]:
    if task == "classification":
        return classification_command(workdir, n, output)
    if task == "detection":
        import bench_detection as bd

        paths, _ = bd.ensure_dataset(os.path.join(workdir, "detection"), n, need_segm=False)
        return bd.evalbeam_command(paths["groundtruths"], paths["predictions"], "bbox", output, "", None)
    if task == "detection_native":
        import bench_detection as bd

        paths, _ = bd.ensure_dataset(os.path.join(workdir, "detection"), n, need_segm=False)
        gt, dt = native_rows(paths["groundtruths"], paths["predictions"])
        return bd.evalbeam_command(gt, dt, "bbox", output, "--protocol coco", None)
    if task == "segmentation":
        import bench_segmentation as bs

        return bs.evalbeam_command(bs.ensure_dataset(os.path.join(workdir, "segmentation"), n), output, "")
    if task == "text":
        import bench_text as bt

        return bt.evalbeam_command(bt.ensure_dataset(os.path.join(workdir, "text"), n), output, "")
    if task == "retrieval":
        import bench_retrieval as br

        return br.evalbeam_command(br.ensure_dataset(os.path.join(workdir, "retrieval"), n), output, "")
    raise ValueError(task)


def native_rows(gt_path: str, dt_path: str) -> tuple[str, str]:
    """The COCO files as native JSONL rows beside them (made once): one row per image with its
    annotations (label = category name, bbox as [xmin, ymin, xmax, ymax]), and one per image
    with detections, in the results file's order. Large native files are read in byte spans by
    several workers, as a COCO .json is not (deploy/README.md); metrics differ from the COCO
    files' only in area ranges (a native ground truth's area is its box's)."""
    gt_out, dt_out = gt_path[:-len(".json")] + ".native.jsonl", dt_path[:-len(".json")] + ".native.jsonl"
    if os.path.exists(gt_out) and os.path.exists(dt_out):
        return gt_out, dt_out
    with open(gt_path, encoding="utf-8") as f:
        document = json.load(f)
    names = {c["id"]: c["name"] for c in document["categories"]}

    def box(a):
        x, y, w, h = a["bbox"]
        return [x, y, x + w, y + h]

    truths: dict = {image["id"]: [] for image in document["images"]}
    for a in document["annotations"]:
        truths[a["image_id"]].append({"label": names[a["category_id"]], "bbox": box(a),
                                      "iscrowd": bool(a.get("iscrowd"))})
    with open(dt_path, encoding="utf-8") as f:
        results = json.load(f)
    detections: dict = {}
    for d in results:
        detections.setdefault(d["image_id"], []).append(
            {"label": names[d["category_id"]], "bbox": box(d), "score": d["score"]})
    for path, rows in ((gt_out, truths), (dt_out, detections)):
        with open(path + ".partial", "w", encoding="utf-8") as f:
            for image, annotations in rows.items():
                f.write(json.dumps({"datum_uid": str(image), "annotations": annotations}) + "\n")
        os.replace(path + ".partial", path)
    return gt_out, dt_out


def run_one(cmd: list[str], output: str) -> dict:
    shutil.rmtree(output, ignore_errors=True)
    os.makedirs(output)
    got = measure(cmd, os.path.join(output, "log"))
    info = json.load(open(os.path.join(output, "run.json"), encoding="utf-8"))
    if got["returncode"] not in (0, 1) or info.get("status") == "failed":
        raise SystemExit(f"{' '.join(cmd)} failed: see {got['stderr']}")
    return {"wall_s": round(got["wall_s"], 2), "cpu_s": round(got["cpu_s"], 2),
            "peak_mb": round(got["peak_tree_kb"] / 1024),
            "rows_read": info["rows_read"], "shuffles": info["shuffles"],
            "num_shards": info["options"]["num_shards"], "input_bytes": sum(
                os.path.getsize(p) for p in _inputs(cmd))}


def _inputs(cmd: list[str]) -> list[str]:
    out = []
    for flag, value in zip(cmd, cmd[1:]):
        if flag in ("--groundtruths", "--predictions"):
            path = value.split("=", 1)[1] if "=" in value and not os.path.exists(value) else value
            if os.path.isfile(path) and path not in out:
                out.append(path)
    return out


def fit(ns: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares of log y = log c + b log n: (c, b)."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if y > 0]
    if len(pts) < 2:
        return float("nan"), float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return math.exp(my - b * mx), b


def figure(run: dict, stage: str, name: str) -> float:
    return run["shuffles"].get(stage, {}).get(name, 0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "evalbeam-bench"))
    parser.add_argument("--tasks", default=",".join(SIZES))
    parser.add_argument("--quick", action="store_true", help="the two smaller sizes only")
    parser.add_argument("--no_factors", action="store_true",
                        help="skip classification's models/slices/labels/shards variations")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else SIZES
    os.makedirs(args.workdir, exist_ok=True)
    out = os.path.join(args.workdir, "scaling-runs")
    results: dict = {"machine": machine_info(), "tasks": {}, "factors": {}}
    for task in args.tasks.split(","):
        runs = []
        for n in sizes[task]:
            cmd = task_command(task, args.workdir, n, os.path.join(out, "run"))
            run = run_one(cmd, os.path.join(out, "run"))
            run["n"] = n
            runs.append(run)
            print(f"{task:15s} n={n:>9,}  {run['wall_s']:7.1f} s  {json.dumps(run['shuffles'])}",
                  file=sys.stderr)
        fits = {}
        for stage, name in FIGURES:
            c, b = fit([r["n"] for r in runs], [figure(r, stage, name) for r in runs])
            top = runs[-1]
            fits[f"{stage}.{name}"] = {"exponent": round(b, 3), "per_unit_at_largest":
                                       figure(top, stage, name) / top["n"]}
        # the marginal rate between the two largest sizes leaves the fixed start-up out
        fits["wall_s"] = {"exponent": round(fit([r["n"] for r in runs], [r["wall_s"] for r in runs])[1], 3),
                          "units_per_s_at_largest": (runs[-1]["n"] - runs[-2]["n"])
                          / (runs[-1]["wall_s"] - runs[-2]["wall_s"])}
        results["tasks"][task] = {"runs": runs, "fits": fits}
    if "classification" in args.tasks.split(",") and not args.no_factors:
        variations = {"models": [("models", v) for v in (1, 2, 4)],
                      "slices": [("slices", v) for v in (0, 1)],
                      "labels": [("classes", v) for v in (5, 10, 40)],
                      # at the largest size: does the key of the overall slice, which receives a
                      # state from every shard, slow the run as shards grow?
                      "shards": [("shards", v) for v in (4, 16, 64, 256)]}
        for factor, settings in variations.items():
            n = sizes["classification"][-1 if factor == "shards" else 1]
            runs = []
            for key, value in settings:
                cmd = classification_command(args.workdir, n, os.path.join(out, "run"), **{key: value})
                run = run_one(cmd, os.path.join(out, "run"))
                run[factor] = value
                run["n"] = n
                runs.append(run)
                print(f"classification n={n:,} {factor}={value}: {run['wall_s']:.1f} s  "
                      f"{json.dumps(run['shuffles'])}", file=sys.stderr)
            results["factors"][factor] = runs
    path = os.path.join(args.workdir, "scaling.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print_report(results)
    print(f"\nresults: {path}")
    return 0


def print_report(results: dict) -> None:
    print("\n".join(results["machine"]))
    print("\n| task | sizes | figure | exponent | per unit at the largest size |")
    print("|---|---|---|---|---|")
    for task, got in results["tasks"].items():
        sizes = ", ".join(f"{r['n']:,}" for r in got["runs"])
        for key, value in got["fits"].items():
            per = value.get("per_unit_at_largest", value.get("units_per_s_at_largest"))
            label = "units/s (marginal)" if key == "wall_s" else "per unit"
            print(f"| {task} | {sizes} | {key} | {value['exponent']} | {per:,.4g} {label} |")
    for factor, runs in results["factors"].items():
        print(f"\nclassification, {factor} ({runs[0]['n']:,} datums):")
        for r in runs:
            print(f"  {factor}={r[factor]}: wall {r['wall_s']} s, " + ", ".join(
                f"{s}.{k}={figure(r, s, k):,}" for s, k in FIGURES))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
