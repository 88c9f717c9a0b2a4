"""Benchmark: evalbeam's detection job end to end against pycocotools and faster-coco-eval, on the
same COCO JSON files.

This is a standalone timing script, not a test. Run it from the repository root, e.g.

    python tests/benchmarks/bench_detection.py                        # 5,000 images, bbox, 3 repeats
    python tests/benchmarks/bench_detection.py --n_images 500 --iou_type segm
    python tests/benchmarks/bench_detection.py --skip evalbeam        # the peers only
    python tests/benchmarks/bench_detection.py --skip pycocotools \\
        --beam_args "--direct_running_mode multi_processing --direct_num_workers 2"
    python tests/benchmarks/bench_detection.py --scaling --repeats 1  # evalbeam, 5,000 vs 50,000 images
    python tests/benchmarks/bench_detection.py --bootstrap 100        # evalbeam with and without
                                                                      # --bootstrap 100 (issue 16)

What is measured
----------------
Data: `detection_data.write_coco_dataset` (next to this file) writes instances.json (COCO ground
truths: ~7.3 objects per image, 80 COCO categories, polygons, ~1% crowd regions as uncompressed
RLE), results_bbox.json (~55 detections per image, scores with 3 decimals) and, for --iou_type segm,
results_segm.json (compressed RLE masks) into a folder under --workdir named after the parameters;
a params.json written last marks the data complete, and the data is reused when it matches.
stats.json next to them describes the data.

Each side runs as its own fresh process, sequentially (never concurrently), with the repeats
interleaved (evalbeam, faster-coco-eval, pycocotools, evalbeam, ...). For each run (the
measurement is bench_classification.measure, imported):

* wall time: from just before the process is started to just after it has exited, so it includes
  interpreter start-up, imports, reading and parsing the JSON, evaluating and writing the metrics;
* peak RSS: `ru_maxrss` of that one child (os.wait4; the largest process of the tree);
* peak tree memory: summed PSS of the child and all its descendants (e.g. Beam's SDK workers),
  sampled every 0.25 s from /proc.

The peers also report their own timed section, from the `COCO(groundtruths)` constructor (which
reads the JSON) to the end of `summarize()`, i.e. without interpreter start-up and imports; the
table shows its median next to the process wall time. The ratios use the process wall time (the
same yardstick as evalbeam's end-to-end run) and, stricter, the peers' timed section.

Sides:

* evalbeam: `evalbeam detection --groundtruths GT --predictions model=DT --output OUT --quiet
  --iou_type {bbox,segm}` plus --beam_args. If it fails (non-zero exit or no metrics.jsonl) its
  stderr is printed, its remaining repeats are skipped, the peers still run, and the script exits
  non-zero at the end.
* pycocotools (`--_peer pycocotools`, this file re-invoked as a child): COCO(gt), loadRes(dt),
  COCOeval(gt, dt, iou_type).evaluate(), accumulate(), summarize().
* faster-coco-eval (`--_peer faster-coco-eval`): faster_coco_eval.COCO(gt), loadRes(dt),
  COCOeval_faster(gt, dt, iou_type) with its defaults, evaluate(), accumulate(), summarize().
  The defaults are its fastest documented mode that keeps pycocotools' numbers: separate_eval=False
  (evaluate() runs the C++ evaluation and accumulation in one call; accumulate() has nothing left
  to do), extra_calc=False (no per-detection match bookkeeping, no mIoU/mAUC), no deep copies of
  the loaded JSON. For segm, mask IoUs run on up to min(CPUs, rle_iou_max_workers=8) threads.

Each peer writes its 12 stats as one evalbeam-style record to metrics.jsonl:
{"type": "COCOSummary", "value": {"AP", "AP50", "AP75", "APsmall", "APmedium", "APlarge", "AR1",
"AR10", "AR100", "ARsmall", "ARmedium", "ARlarge"}, "parameters": {"iou_type": ...},
"model": "model", "slice": {}}. The report compares the three sides' records pairwise (max absolute
difference, and every stat); a difference is printed loudly but does not fail the run.

Targets printed against: at 5,000 images evalbeam's wall time <= 1.0x faster-coco-eval's; with
--scaling (evalbeam only, 5,000 and 50,000 images): 50,000 images in <= 10x the 5,000-image time,
with peak memory (process tree) <= 4 GB.

--bootstrap R (evalbeam only): the same evalbeam command without and with `--bootstrap R`
(intervals on every statistic, per image), repeats interleaved; prints the ratio of the median
wall times against the target (at 5,000 images and R = 100: <= 4x) and checks that the point
statistics are identical.
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
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # run as a script it is sys.path[0] already
    sys.path.insert(0, HERE)
from bench_classification import machine_info as classification_machine_info
from bench_classification import measure  # the same measurement for every benchmark
from bench_classification import read_json, write_json

MODEL = "model"
SEED = 0
SIDES = ("evalbeam", "faster-coco-eval", "pycocotools")
PEERS = ("faster-coco-eval", "pycocotools")
STAT_NAMES = ("AP", "AP50", "AP75", "APsmall", "APmedium", "APlarge",
              "AR1", "AR10", "AR100", "ARsmall", "ARmedium", "ARlarge")
TARGET_N_IMAGES = 5000
TARGET_RATIO_FCE = 1.0
SCALING_SIZES = (5000, 50_000)
TARGET_SCALING_RATIO = 10.0
TARGET_MEMORY_MB = 4096
TARGET_BOOTSTRAP_RATIO = 4.0
AGREEMENT_TOLERANCE = 1e-9
LOAD_AT_START = "unknown"


# --------------------------------------------------------------------------------------------- data

def ensure_dataset(workdir: str, n_images: int, need_segm: bool) -> tuple[dict, dict]:
    """Generate the data once per parameter set; reuse it when params.json matches. Segm results
    are written when asked for (or by the generator's default, small datasets)."""
    from detection_data import GENERATOR_VERSION, write_coco_dataset

    folder = os.path.join(workdir, f"data_n{n_images}_s{SEED}")
    marker = os.path.join(folder, "params.json")
    params = read_json(marker) or {}
    paths = params.get("paths") or {}
    if (params.get("n_images") == n_images and params.get("seed") == SEED
            and params.get("generator_version") == GENERATOR_VERSION
            and (params.get("with_segm") or not need_segm)
            and all(p is None or os.path.exists(p) for p in paths.values())):
        print(f"reusing data in {folder}", file=sys.stderr)
    else:
        if os.path.exists(marker):
            os.remove(marker)  # incomplete until written again
        print(f"generating {n_images:,} images{' with segm results' if need_segm else ''} "
              f"in {folder} ...", file=sys.stderr)
        start = time.perf_counter()
        paths = write_coco_dataset(folder, n_images, seed=SEED, with_segm=True if need_segm else None)
        params = {"n_images": n_images, "seed": SEED, "generator_version": GENERATOR_VERSION,
                  "with_segm": paths["predictions_segm"] is not None, "paths": paths}
        write_json(marker, params)
        print(f"  done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    stats = read_json(os.path.join(folder, "stats.json")) or {}
    return paths, stats


def predictions_path(paths: dict, iou_type: str) -> str:
    return paths["predictions_segm"] if iou_type == "segm" else paths["predictions"]


# ------------------------------------------------------------------------------------- commands

def evalbeam_command(gt: str, dt: str, iou_type: str, output: str, beam_args: str,
                     exe: str | None) -> list[str]:
    """exe defaults to the evalbeam script next to this interpreter, then on PATH, then -m."""
    if exe:
        base = shlex.split(exe)
    elif os.path.exists(os.path.join(os.path.dirname(sys.executable), "evalbeam")):
        base = [os.path.join(os.path.dirname(sys.executable), "evalbeam")]
    else:
        found = shutil.which("evalbeam")
        base = [found] if found else [sys.executable, "-m", "evalbeam.pipelines.cli"]
    return base + ["detection", "--groundtruths", gt, "--predictions", f"{MODEL}={dt}",
                   "--output", output, "--quiet", "--iou_type", iou_type, *shlex.split(beam_args)]


def peer_command(peer: str, gt: str, dt: str, iou_type: str, output: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--_peer", peer, "--groundtruths", gt,
            "--predictions", dt, "--iou_type", iou_type, "--output", output]


# ------------------------------------------------------------------------------ peers (child side)

def run_peer(peer: str, gt_path: str, dt_path: str, iou_type: str, output: str) -> None:
    """COCO(gt) + loadRes + COCOeval evaluate/accumulate/summarize, timed from COCO() on."""
    t = time.perf_counter()
    if peer == "pycocotools":
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        def make_eval(gt, dt):
            return COCOeval(gt, dt, iou_type)
    else:
        from faster_coco_eval import COCO, COCOeval_faster

        def make_eval(gt, dt):
            # defaults: separate_eval=False (fused C++ evaluate+accumulate), extra_calc=False
            return COCOeval_faster(gt, dt, iou_type, print_function=print)
    imports = time.perf_counter() - t

    phases, start = {}, time.perf_counter()
    coco_gt = COCO(gt_path)
    phases["COCO(groundtruths)"] = time.perf_counter() - start
    t = time.perf_counter()
    coco_dt = coco_gt.loadRes(dt_path)
    phases["loadRes"] = time.perf_counter() - t
    t = time.perf_counter()
    evaluator = make_eval(coco_gt, coco_dt)
    evaluator.evaluate()
    phases["evaluate"] = time.perf_counter() - t
    t = time.perf_counter()
    evaluator.accumulate()
    phases["accumulate"] = time.perf_counter() - t
    t = time.perf_counter()
    evaluator.summarize()
    phases["summarize"] = time.perf_counter() - t
    timed = time.perf_counter() - start

    stats = [float(x) for x in list(evaluator.stats)[:len(STAT_NAMES)]]
    os.makedirs(output, exist_ok=True)
    record = {"type": "COCOSummary", "value": dict(zip(STAT_NAMES, stats)),
              "parameters": {"iou_type": iou_type}, "model": MODEL, "slice": {}}
    with open(os.path.join(output, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    write_json(os.path.join(output, "peer.json"), {
        "peer": peer, "imports_s": imports, "timed_s": timed, "phases_s": phases,
        "images": len(coco_gt.getImgIds()), "groundtruths": len(coco_gt.getAnnIds()),
        "detections": len(coco_dt.getAnnIds()), "n_stats": len(evaluator.stats)})


def peer_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_detection.py --_peer")
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--groundtruths", required=True)
    parser.add_argument("--predictions", required=True)
    parser.add_argument("--iou_type", choices=["bbox", "segm"], required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    run_peer(args.peer, args.groundtruths, args.predictions, args.iou_type, args.output)


# ------------------------------------------------------------------------------------ running

def find_summary(metrics_path: str, iou_type: str) -> dict | None:
    """The COCOSummary record of model MODEL, empty slice, this iou_type (12 stats), or None."""
    try:
        with open(metrics_path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return None
    for r in records:
        if (r.get("type") == "COCOSummary" and r.get("model", MODEL) == MODEL and not r.get("slice")
                and (r.get("parameters") or {}).get("iou_type", iou_type) == iou_type
                and isinstance(r.get("value"), dict)):
            return r["value"]
    return None


def run_sides(plan: list[tuple[str, Callable[[str], list[str]]]], repeats: int, runs_dir: str,
              iou_type: str) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """plan: (side, output folder -> command). Runs each side `repeats` times, interleaved, and
    stops repeating a side after its first failure. Returns the successful runs per side and the
    failure message of each failed side."""
    runs: dict[str, list[dict]] = {key: [] for key, _ in plan}
    failed: dict[str, str] = {}
    os.makedirs(runs_dir, exist_ok=True)
    for repeat in range(1, repeats + 1):
        for key, make_cmd in plan:
            if key in failed:
                continue
            output = os.path.join(runs_dir, f"{key}_r{repeat}")
            shutil.rmtree(output, ignore_errors=True)
            cmd = make_cmd(output)
            print(f"[{repeat}/{repeats}] {key}: {shlex.join(cmd)}", file=sys.stderr)
            result = measure(cmd, output + ".log")
            result["output"] = output
            metrics = os.path.join(output, "metrics.jsonl")
            summary = find_summary(metrics, iou_type)
            if result["returncode"] != 0 or summary is None:
                with open(result["stderr"], encoding="utf-8", errors="replace") as f:
                    sys.stderr.write(f.read()[-20_000:])
                reason = (f"exit code {result['returncode']}" if result["returncode"] != 0 else
                          "no metrics.jsonl" if not os.path.exists(metrics) else
                          f"no COCOSummary record (model {MODEL}, slice {{}}, iou_type {iou_type})")
                failed[key] = f"{reason}; full stderr: {result['stderr']}"
                print(f"\n!!! {key} failed ({failed[key]}); continuing without it\n", file=sys.stderr)
                continue
            result["summary"] = summary
            result["peer"] = read_json(os.path.join(output, "peer.json"))
            print(f"    {result['wall_s']:.2f} s, peak RSS {result['maxrss_kb'] / 1024:.0f} MB, "
                  f"tree {result['peak_tree_kb'] / 1024:.0f} MB", file=sys.stderr)
            runs[key].append(result)
    return runs, failed


def summarize(runs: list[dict], images: int, detections: int) -> dict:
    peers = [r["peer"] for r in runs if r.get("peer")]
    return {"images": images, "detections": detections,
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "timed_s": statistics.median(p["timed_s"] for p in peers) if peers else None,
            "maxrss_mb": max(r["maxrss_kb"] for r in runs) / 1024,
            "tree_mb": max(r["peak_tree_kb"] for r in runs) / 1024,
            "walls": [r["wall_s"] for r in runs],
            "phases": peers[-1]["phases_s"] if peers else None,
            "imports_s": peers[-1]["imports_s"] if peers else None,
            "summary": runs[-1]["summary"]}


# ----------------------------------------------------------------------------------------- report

def machine_info() -> list[str]:
    return classification_machine_info(
        ("apache-beam", "pycocotools", "faster-coco-eval", "numpy", "evalbeam")) + [
        f"- load average at the start (1, 5, 15 min): {LOAD_AT_START} and at the end: "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
        + " (other work on the machine makes the times noisy)"]


def data_lines(stats: dict) -> list[str]:
    if not stats:
        return []
    mix = stats.get("size_mix_non_crowd_by_area", {})
    kinds = stats.get("detection_kinds", {})
    return [(f"- ground truths: {stats['groundtruths']:,} ({stats['groundtruths_per_image']:.2f} per "
            f"image; {stats['images_without_groundtruths']:,} images without, "
            f"{stats['images_with_30_or_more_groundtruths']:,} with 30 or more, max "
            f"{stats['max_groundtruths_per_image']}), crowd regions {stats['crowd']:,}; sizes (mask "
            f"area) small {mix.get('small', 0):.1%}, medium {mix.get('medium', 0):.1%}, "
            f"large {mix.get('large', 0):.1%}"),
            (f"- detections: {stats['detections']:,} ({stats['detections_per_image']:.1f} per image; "
            f"{stats['images_with_more_than_100_detections']:,} images with more than 100, max "
            f"{stats['max_detections_per_image']}); copies of objects "
            f"{kinds.get('copies_of_objects', 0):,}, wrong category {kinds.get('wrong_category', 0):,}, "
            f"in crowd regions {kinds.get('inside_crowd_regions', 0):,}, random "
            f"{kinds.get('random', 0):,}; {stats['distinct_scores']} distinct scores")]


def _fmt(x, spec=".2f"):
    return "—" if x is None else format(x, spec)


def print_table(sides: dict[str, dict]) -> None:
    print("| side | images | detections | wall time median (s) | timed section median (s) "
          "| peak RSS, largest process (MB) | peak PSS, process tree (MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, s in sides.items():
        print(f"| {name} | {s['images']:,} | {s['detections']:,} | {s['wall_s']:.2f} "
              f"| {_fmt(s['timed_s'])} | {s['maxrss_mb']:.0f} | {s['tree_mb']:.0f} |")
    print()
    for name, s in sides.items():
        print(f"- {name} wall times (s): {', '.join(f'{w:.2f}' for w in s['walls'])}")
        if s.get("phases"):
            print(f"  - phases of the last run (s): imports {s['imports_s']:.2f}, "
                  + ", ".join(f"{k} {v:.2f}" for k, v in s["phases"].items()))


def print_ratios(sides: dict[str, dict], n_images: int) -> None:
    if "evalbeam" not in sides:
        return
    ours = sides["evalbeam"]["wall_s"]
    print()
    for peer in PEERS:
        if peer not in sides:
            continue
        p = sides[peer]
        line = (f"**evalbeam / {peer}: {ours / p['wall_s']:.2f}x** (wall time; against {peer}'s "
                f"timed section COCO() → summarize(): {ours / p['timed_s']:.2f}x)")
        if peer == "faster-coco-eval":
            met = ours / p["wall_s"] <= TARGET_RATIO_FCE
            line += (f"; target at {TARGET_N_IMAGES:,} images <= {TARGET_RATIO_FCE:.1f}x: "
                     + (f"{'met' if met else 'NOT met'}" if n_images == TARGET_N_IMAGES
                        else f"(this run has {n_images:,} images)"))
        print(line)


def print_agreement(sides: dict[str, dict]) -> bool:
    """Pairwise max |difference| of the 12 stats; loud when above AGREEMENT_TOLERANCE."""
    have = [name for name in SIDES if name in sides]
    print("\n### Agreement of the 12 COCO stats\n")
    if len(have) < 2:
        print("fewer than two sides ran: nothing to compare")
        return True
    ok = True
    for i, a in enumerate(have):
        for b in have[i + 1:]:
            va, vb = sides[a]["summary"], sides[b]["summary"]
            missing = [k for k in STAT_NAMES if k not in va or k not in vb]
            diffs = {k: abs(float(va[k]) - float(vb[k])) for k in STAT_NAMES if k not in missing}
            worst = max(diffs, key=diffs.get) if diffs else None
            line = f"- {a} vs {b}: max abs difference {max(diffs.values(), default=0.0):.3g}"
            if worst and diffs[worst] > 0:
                line += f" ({worst})"
            if missing:
                line += f"; missing stats: {', '.join(missing)}"
            if missing or (diffs and max(diffs.values()) > AGREEMENT_TOLERANCE):
                ok = False
                line = "!!! STATS DIFFER !!! " + line
            print(line)
    print("\n| stat | " + " | ".join(have) + " |\n|---|" + "---:|" * len(have))
    for k in STAT_NAMES:
        print(f"| {k} | " + " | ".join(_fmt(sides[n]["summary"].get(k), ".6f") for n in have) + " |")
    if not ok:
        print(f"\n!!! THE STATS DO NOT AGREE (tolerance {AGREEMENT_TOLERANCE:g}); see above !!!")
    return ok


# ------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_images", type=int, default=TARGET_N_IMAGES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iou_type", choices=["bbox", "segm"], default="bbox")
    parser.add_argument("--workdir", default=os.path.join("/tmp", "evalbeam-bench", "detection"))
    parser.add_argument("--beam_args", default="", help="appended to the evalbeam command")
    parser.add_argument("--evalbeam_cmd", default=None,
                        help="run this instead of the installed evalbeam script (e.g. another venv's)")
    parser.add_argument("--skip", default="",
                        help=f"comma-separated sides not to run, of: {', '.join(SIDES)}")
    parser.add_argument("--scaling", action="store_true",
                        help="evalbeam only, at 5,000 and 50,000 images; print the time ratio")
    parser.add_argument("--scaling_sizes", default=",".join(map(str, SCALING_SIZES)),
                        help="the two sizes of --scaling (default %(default)s)")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="R",
                        help="evalbeam only: time it without and with --bootstrap R and print the "
                             "ratio (target at 5,000 images, R = 100: <= 4x)")
    args = parser.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - set(SIDES)
    if unknown:
        parser.error(f"--skip: unknown side(s) {', '.join(sorted(unknown))}; known: {', '.join(SIDES)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.scaling:
        if "evalbeam" in args.skip:
            parser.error("--scaling runs evalbeam; do not skip it")
        try:
            args.scaling_sizes = tuple(int(x) for x in args.scaling_sizes.split(","))
            assert len(args.scaling_sizes) == 2
        except (ValueError, AssertionError):
            parser.error("--scaling_sizes takes two comma-separated numbers of images")
    elif not set(SIDES) - args.skip:
        parser.error("nothing to run")
    return args


def main_compare(args) -> int:
    paths, stats = ensure_dataset(args.workdir, args.n_images, args.iou_type == "segm")
    gt, dt = paths["groundtruths"], predictions_path(paths, args.iou_type)
    plan = []
    for side in SIDES:
        if side in args.skip:
            continue
        if side == "evalbeam":
            make = (lambda out: evalbeam_command(gt, dt, args.iou_type, out, args.beam_args,
                                                 args.evalbeam_cmd))
        else:
            make = (lambda out, side=side: peer_command(side, gt, dt, args.iou_type, out))
        plan.append((side, make))
    runs, failed = run_sides(plan, args.repeats,
                             os.path.join(args.workdir, f"runs_n{args.n_images}_{args.iou_type}"),
                             args.iou_type)
    n_dt = stats.get("detections", 0)
    sides = {name: summarize(r, args.n_images, n_dt) for name, r in runs.items() if r}

    print("\n### Machine\n")
    print("\n".join(machine_info()))
    print(f"\n### Detection ({args.iou_type}), {args.n_images:,} images, median of "
          f"{args.repeats} run(s)\n")
    print("\n".join(data_lines(stats)) + "\n")
    if args.beam_args:
        print(f"evalbeam Beam args: `{args.beam_args}`\n")
    if sides:
        print_table(sides)
    print_ratios(sides, args.n_images)
    print_agreement(sides)
    for name, why in failed.items():
        print(f"\n!!! {name} FAILED: {why}")
    return 1 if failed else 0


def main_scaling(args) -> int:
    small, large = args.scaling_sizes
    sides, failed = {}, {}
    for n in (small, large):
        paths, stats = ensure_dataset(args.workdir, n, args.iou_type == "segm")
        gt, dt = paths["groundtruths"], predictions_path(paths, args.iou_type)
        key = f"evalbeam_{n}"
        plan = [(key, lambda out, gt=gt, dt=dt: evalbeam_command(
            gt, dt, args.iou_type, out, args.beam_args, args.evalbeam_cmd))]
        runs, fail = run_sides(plan, args.repeats,
                               os.path.join(args.workdir, f"runs_n{n}_{args.iou_type}"), args.iou_type)
        failed.update(fail)
        if runs[key]:
            sides[f"evalbeam ({n:,} images)"] = summarize(runs[key], n, stats.get("detections", 0))
        if fail:
            break

    print("\n### Machine\n")
    print("\n".join(machine_info()))
    print(f"\n### Detection scaling ({args.iou_type}), evalbeam, median of {args.repeats} run(s)\n")
    if args.beam_args:
        print(f"evalbeam Beam args: `{args.beam_args}`\n")
    if sides:
        print_table(sides)
    if len(sides) == 2:
        s, l = sides.values()
        ratio = l["wall_s"] / s["wall_s"]
        print(f"\n**evalbeam {large:,} / {small:,} images: {ratio:.2f}x wall time** (target <= "
              f"{TARGET_SCALING_RATIO:g}x: {'met' if ratio <= TARGET_SCALING_RATIO else 'NOT met'})")
        mb = l["tree_mb"]
        print(f"evalbeam peak memory at {large:,} images (process tree): {mb:.0f} MB (target <= "
              f"{TARGET_MEMORY_MB} MB: {'met' if mb <= TARGET_MEMORY_MB else 'NOT met'})")
    for name, why in failed.items():
        print(f"\n!!! {name} FAILED: {why}")
    return 1 if failed else 0


def main_bootstrap(args) -> int:
    """evalbeam without and with --bootstrap R on the same files, interleaved."""
    paths, stats = ensure_dataset(args.workdir, args.n_images, args.iou_type == "segm")
    gt, dt = paths["groundtruths"], predictions_path(paths, args.iou_type)
    with_key = f"evalbeam --bootstrap {args.bootstrap}"
    plan = [("evalbeam", lambda out: evalbeam_command(gt, dt, args.iou_type, out, args.beam_args,
                                                      args.evalbeam_cmd)),
            (with_key, lambda out: evalbeam_command(
                gt, dt, args.iou_type, out, f"{args.beam_args} --bootstrap {args.bootstrap}",
                args.evalbeam_cmd))]
    runs, failed = run_sides(plan, args.repeats, os.path.join(
        args.workdir, f"runs_n{args.n_images}_{args.iou_type}_bootstrap{args.bootstrap}"), args.iou_type)
    sides = {name: summarize(r, args.n_images, stats.get("detections", 0)) for name, r in runs.items() if r}
    print("\n### Machine\n")
    print("\n".join(machine_info()))
    print(f"\n### Detection ({args.iou_type}) with --bootstrap {args.bootstrap}, {args.n_images:,} "
          f"images, median of {args.repeats} run(s)\n")
    print("\n".join(data_lines(stats)) + "\n")
    if sides:
        print_table(sides)
    if len(sides) == 2:
        ratio = sides[with_key]["wall_s"] / sides["evalbeam"]["wall_s"]
        target = (f"target at {TARGET_N_IMAGES:,} images and R = 100 <= {TARGET_BOOTSTRAP_RATIO:g}x: "
                  + ("met" if ratio <= TARGET_BOOTSTRAP_RATIO else "NOT met")
                  if args.n_images == TARGET_N_IMAGES and args.bootstrap == 100
                  else f"(the target is for {TARGET_N_IMAGES:,} images and R = 100)")
        print(f"\n**evalbeam with / without --bootstrap {args.bootstrap}: {ratio:.2f}x wall time**; {target}")
        same = sides[with_key]["summary"] == sides["evalbeam"]["summary"]
        print(f"point statistics identical with and without bootstrap: {'yes' if same else '!!! NO !!!'}")
        if not same:
            failed["agreement"] = "the point statistics differ"
    for name, why in failed.items():
        print(f"\n!!! {name} FAILED: {why}")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--_peer"]:
        peer_main(argv[1:])
        return 0
    args = parse_args(argv)
    global LOAD_AT_START
    LOAD_AT_START = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    os.makedirs(args.workdir, exist_ok=True)
    if args.bootstrap:
        return main_bootstrap(args)
    return main_scaling(args) if args.scaling else main_compare(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
