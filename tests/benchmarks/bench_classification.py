"""Benchmark: evalbeam's classification job end to end against valor-lite, on the same JSONL files.

This is a standalone timing script, not a test. Run it from the repository root, e.g.

    python tests/benchmarks/bench_classification.py            # 1,000,000 datums x 10 classes
    python tests/benchmarks/bench_classification.py --n_datums 200000 --repeats 1
    python tests/benchmarks/bench_classification.py \\
        --beam_args "--direct_running_mode multi_processing --direct_num_workers 2"
    python tests/benchmarks/bench_classification.py --check    # 20,000 datums, same rows, ROCAUC diff
    python tests/benchmarks/bench_classification.py --bootstrap 100 --skip_peer --repeats 1

What is measured
----------------
Data: `pipelines.synthetic.write_classification_dataset` writes groundtruths.jsonl and model_a.jsonl
(one model, skill 2.5, seed 0) into a folder under --workdir named after the parameters; a
params.json written last marks the data complete, and the data is reused when it matches.

Each side runs as its own fresh process, sequentially (never concurrently), with the repeats
interleaved (evalbeam, valor-lite, evalbeam, ...). For each run:

* wall time: from just before the process is started to just after it has exited, so it includes
  interpreter start-up, imports, reading and parsing the JSONL, computing, and writing the metrics;
* peak RSS: `ru_maxrss` of that one child as reported by `os.wait4` (Linux: the largest RSS of the
  child or any of its descendants, each process on its own). Linux carries a process's peak
  across exec, and a child started by vfork and exec (as subprocess starts it) begins with this
  script's own peak: a reading at or below it (`maxrss_floor_kb`, e.g. after generating the data
  in this process) says nothing of the child, and a warning says so;
* peak tree memory: the process tree (the child and all its descendants, e.g. Beam's SDK workers)
  is sampled every 0.25 s from /proc and its summed PSS (RSS where PSS is unreadable) is kept.
  With several workers this, not the single-process RSS, is the number to hold against a budget.

The table reports the median wall time and the largest memory over --repeats runs per side.

evalbeam side: `evalbeam classification --groundtruths GT --predictions model_a=PRED --output OUT
--quiet` plus --beam_args. If it exits non-zero or writes no metrics.jsonl, its stderr is printed
and the script exits non-zero.

valor-lite side (`--_peer valor-lite`, this same file re-invoked as a child): reads both JSONL files
with `json.loads` per line (its own reading is timed, as evalbeam's is), feeds
`valor_lite.classification.Loader.in_memory()` in batches of 10,000 `Classification`s, then
`finalize()`, `compute_precision_recall(score_thresholds=[0.0], hardmax=True)` and `compute_rocauc()`,
and writes the metrics as JSONL.

Datums without a prediction row (~1%) count as misses for evalbeam. valor-lite rejects a datum
without predictions, so the peer gives such a datum every known class with score 0.0. valor-lite
never counts a score of ~0 (np.isclose(score, 0)) as a positive prediction, so each of these datums
is a false negative of its ground-truth class and lowers Accuracy (TP / all datums) exactly as a
miss should; both sides process the same datums. For ROCAUC the datum enters the ranking at score 0,
i.e. at the bottom, tied with any genuine 0.0 score (scores are rounded to 6 decimals).

--peer_fraction F (default 0.1): valor-lite needs ~30 s per 100,000 datums and is linear in N, so it
runs on the first round(F * n_datums) ground-truth rows and the prediction rows of those datums,
written once as a separate pair of files (prefix_<K>/ next to the full data). Both the raw time and
the time scaled by 1/F are printed; the ratio compares seconds per datum. Peak memory is not
scaled: valor-lite's is for its K datums.

--bootstrap R adds a third side, `evalbeam+bootstrap`: the same evalbeam command with
`--bootstrap R` (intervals on every scalar metric, issue 16), interleaved with the others, and
prints its wall time over evalbeam's without it (target <= 4x) and its peak tree memory (target
<= 4 GB).

--check runs valor-lite on exactly the full data (F = 1; n_datums defaults to 20,000) and prints the
largest absolute difference between the per-class ROCAUC of evalbeam (metrics.jsonl records of
model model_a with an empty slice) and of valor-lite, plus, best effort, for other metric types
both sides report under the same name (at score threshold 0, hardmax). It never fails on it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time

MODEL = "model_a"
SKILL = 2.5
SEED = 0
LABEL_KEY = "class"
CHECK_N_DATUMS = 20_000
TARGET_RATIO = 0.1
TARGET_MEMORY_MB = 2048
BOOTSTRAP_SIDE = "evalbeam+bootstrap"
TARGET_BOOTSTRAP_RATIO = 4.0
TARGET_BOOTSTRAP_MEMORY_MB = 4096


# --------------------------------------------------------------------------------------------- data

def ensure_dataset(workdir: str, n_datums: int, n_classes: int) -> dict[str, str]:
    """Generate the dataset once per parameter set; reuse it when params.json matches."""
    params = {"n_datums": n_datums, "n_classes": n_classes, "models": {MODEL: SKILL}, "seed": SEED}
    folder = os.path.join(workdir, f"data_n{n_datums}_c{n_classes}_s{SEED}")
    paths = {"groundtruths": os.path.join(folder, "groundtruths.jsonl"),
             MODEL: os.path.join(folder, f"{MODEL}.jsonl")}
    complete = read_json(os.path.join(folder, "params.json")) == params
    if complete and all(map(os.path.exists, paths.values())):
        print(f"reusing data in {folder}", file=sys.stderr)
        return paths
    from evalbeam.pipelines.demo.synthetic import write_classification_dataset

    print(f"generating {n_datums:,} datums x {n_classes} classes in {folder} ...", file=sys.stderr)
    start = time.perf_counter()
    paths = write_classification_dataset(folder, n_datums=n_datums, n_classes=n_classes,
                                         models={MODEL: SKILL}, seed=SEED)
    write_json(os.path.join(folder, "params.json"), params)
    print(f"  done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return paths


def ensure_prefix(paths: dict[str, str], n_keep: int) -> dict[str, str]:
    """Write (once) the first n_keep ground-truth rows and the prediction rows of those datums."""
    folder = os.path.join(os.path.dirname(paths["groundtruths"]), f"prefix_{n_keep}")
    out = {"groundtruths": os.path.join(folder, "groundtruths.jsonl"),
           MODEL: os.path.join(folder, f"{MODEL}.jsonl")}
    marker = os.path.join(folder, "params.json")
    if read_json(marker) == {"n_keep": n_keep} and all(map(os.path.exists, out.values())):
        return out
    os.makedirs(folder, exist_ok=True)
    uids = set()
    with open(paths["groundtruths"], encoding="utf-8") as src, \
            open(out["groundtruths"], "w", encoding="utf-8") as dst:
        for line in src:
            if len(uids) == n_keep:
                break
            uids.add(json.loads(line)["datum_uid"])
            dst.write(line)
    with open(paths[MODEL], encoding="utf-8") as src, open(out[MODEL], "w", encoding="utf-8") as dst:
        dst.writelines(line for line in src if json.loads(line)["datum_uid"] in uids)
    write_json(marker, {"n_keep": n_keep})
    return out


def count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def read_json(path: str):
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f)


# -------------------------------------------------------------------------------------- measuring

def _process_tree(root: int) -> list[int]:
    """root and all its live descendants, from the parent pids in /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, ()))
    return tree


def _memory_kb(pid: int) -> int:
    """PSS of one process in KB (shared pages split between sharers); RSS if PSS is unreadable."""
    for path, field in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith(field):
                        return int(line.split()[1])
        except OSError:
            continue
    return 0


def measure(cmd: list[str], log_prefix: str, interval: float = 0.25) -> dict:
    """Run cmd to completion; return its wall time, returncode, peak memory (KB) and CPU seconds
    (user + system of cmd and of the processes it waited for: a DirectRunner's workers)."""
    peak_tree_kb = 0
    done = threading.Event()

    def sample(pid: int) -> None:
        nonlocal peak_tree_kb
        while not done.wait(interval):
            peak_tree_kb = max(peak_tree_kb, sum(_memory_kb(p) for p in _process_tree(pid)))

    floor_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(log_prefix + ".stdout", "wb") as out, open(log_prefix + ".stderr", "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        sampler = threading.Thread(target=sample, args=(proc.pid,), daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4, tell Popen
    if usage.ru_maxrss <= floor_kb:
        print(f"    peak RSS not measured: {usage.ru_maxrss // 1024} MB is this benchmark's own "
              "peak, which the child inherits (the tree's sampled PSS stands)", file=sys.stderr)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "returncode": proc.returncode, "maxrss_kb": usage.ru_maxrss,
            "maxrss_floor_kb": floor_kb,
            "peak_tree_kb": peak_tree_kb or usage.ru_maxrss,  # run shorter than one interval
            "stderr": log_prefix + ".stderr"}


def evalbeam_command(paths: dict[str, str], output: str, beam_args: str, exe: str | None) -> list[str]:
    """exe defaults to the evalbeam script next to this interpreter, then on PATH, then -m."""
    if exe:
        base = shlex.split(exe)
    elif os.path.exists(os.path.join(os.path.dirname(sys.executable), "evalbeam")):
        base = [os.path.join(os.path.dirname(sys.executable), "evalbeam")]
    else:
        found = shutil.which("evalbeam")
        base = [found] if found else [sys.executable, "-m", "evalbeam.pipelines.cli"]
    return base + ["classification", "--groundtruths", paths["groundtruths"],
                   "--predictions", f"{MODEL}={paths[MODEL]}", "--output", output, "--quiet",
                   *shlex.split(beam_args)]


def peer_command(paths: dict[str, str], output: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--_peer", "valor-lite",
            "--groundtruths", paths["groundtruths"], "--predictions", paths[MODEL], "--output", output]


# ------------------------------------------------------------------------- valor-lite (child side)

def run_valor_lite(gt_path: str, pd_path: str, output: str) -> None:
    """The peer: read the JSONL the way a user would, evaluate with valor-lite, write metrics."""
    phases, t = {}, time.perf_counter()
    from valor_lite.classification import Classification, Loader

    truth: dict[str, str] = {}
    with open(gt_path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            truth[row["datum_uid"]] = next(l["value"] for l in row["labels"] if l["key"] == LABEL_KEY)
    classes = set(truth.values())
    loader = Loader.in_memory()
    batch: list = []
    seen: set[str] = set()
    with open(pd_path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            uid = row["datum_uid"]
            if uid not in truth:
                continue  # prediction for a datum without ground truth: not evaluated by either side
            labels = [l for l in row["labels"] if l["key"] == LABEL_KEY]
            batch.append(Classification(uid=uid, groundtruth=truth[uid],
                                        predictions=[l["value"] for l in labels],
                                        scores=[l["score"] for l in labels]))
            classes.update(batch[-1].predictions)
            seen.add(uid)
            if len(batch) >= 10_000:
                loader.add_data(batch)
                batch = []
    # misses: every class at score 0, which valor-lite never counts as a positive prediction
    zero_filled = [uid for uid in truth if uid not in seen]
    names = sorted(classes)
    batch += [Classification(uid=uid, groundtruth=truth[uid], predictions=names,
                             scores=[0.0] * len(names)) for uid in zero_filled]
    if batch:
        loader.add_data(batch)
    phases["read+add_data"] = time.perf_counter() - t

    t = time.perf_counter()
    evaluator = loader.finalize()
    phases["finalize"] = time.perf_counter() - t
    t = time.perf_counter()
    metrics = evaluator.compute_precision_recall(score_thresholds=[0.0], hardmax=True)
    metrics.update(evaluator.compute_rocauc())
    phases["compute"] = time.perf_counter() - t

    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "metrics.jsonl"), "w", encoding="utf-8") as f:
        for group in metrics.values():
            f.writelines(json.dumps(m.to_dict()) + "\n" for m in group)
    write_json(os.path.join(output, "peer.json"),
                {"datums": len(truth), "zero_filled": len(zero_filled), "phases_s": phases})


def peer_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_classification.py --_peer valor-lite")
    parser.add_argument("peer", choices=["valor-lite"])
    parser.add_argument("--groundtruths", required=True)
    parser.add_argument("--predictions", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    run_valor_lite(args.groundtruths, args.predictions, args.output)


# ------------------------------------------------------------------------------------------ check

def _label(record: dict):
    label = (record.get("parameters") or {}).get("label")
    return label.get("value") if isinstance(label, dict) else label


def compare_metrics(evalbeam_path: str, valor_path: str) -> None:
    """Print max |evalbeam - valor-lite| per metric type over the labels both report (slice {})."""
    def load(path):
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    valor = {(r["type"], _label(r)): r["value"] for r in load(valor_path)
             if isinstance(r["value"], (int, float))}
    ours = {}
    for r in load(evalbeam_path):
        params = r.get("parameters") or {}
        if (r.get("model", MODEL) == MODEL and not r.get("slice")
                and isinstance(r.get("value"), (int, float))
                and params.get("score_threshold", 0.0) == 0.0 and params.get("hardmax", True) is True):
            ours.setdefault((r["type"], _label(r)), r["value"])
    common = sorted(set(ours) & set(valor), key=lambda k: (k[0], str(k[1])))
    print("\n### Sanity check: evalbeam vs valor-lite on the same rows\n")
    if not any(k[0] == "ROCAUC" for k in common):
        print("no ROCAUC record in common (evalbeam: type ROCAUC, model model_a, slice {}, "
              "parameters.label.value)")
    for metric in sorted({k[0] for k in common}, key=lambda m: (m != "ROCAUC", m)):
        keys = [k for k in common if k[0] == metric]
        diff, worst = max((abs(ours[k] - valor[k]), k[1]) for k in keys)
        print(f"- {metric}: {len(keys)} value(s) compared, max abs difference {diff:.3g}"
              + (f" (label {worst})" if worst is not None else ""))
    if any(k[0] == "ROCAUC" for k in common):
        print("\n| label | evalbeam ROCAUC | valor-lite ROCAUC |\n|---|---|---|")
        for k in (k for k in common if k[0] == "ROCAUC"):
            print(f"| {k[1]} | {ours[k]:.6f} | {valor[k]:.6f} |")


# ----------------------------------------------------------------------------------------- report

def machine_info(packages=("apache-beam", "valor-lite", "pyarrow", "numpy")) -> list[str]:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                if line.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next((int(line.split()[1]) for line in open("/proc/meminfo", encoding="utf-8")
                   if line.startswith("MemTotal:")), 0)
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg):
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "not installed"
    return [f"- nproc: {len(os.sched_getaffinity(0))} (os.cpu_count {os.cpu_count()})",
            f"- CPU: {cpu}",
            f"- RAM: {mem_kb / 1024 ** 2:.1f} GiB",
            f"- Python {platform.python_version()} on {platform.platform()}",
            "- " + ", ".join(f"{p} {ver(p)}" for p in packages)]


def summarize(runs: list[dict], datums: int) -> dict:
    wall = statistics.median(r["wall_s"] for r in runs)
    return {"datums": datums, "wall_s": wall, "per_100k_s": wall / datums * 100_000,
            "maxrss_mb": max(r["maxrss_kb"] for r in runs) / 1024,
            "tree_mb": max(r["peak_tree_kb"] for r in runs) / 1024,
            "walls": [r["wall_s"] for r in runs]}


def print_report(args, sides: dict[str, dict], fraction: float) -> None:
    print("\n### Machine\n")
    print("\n".join(machine_info()))
    print(f"\n### Classification, {args.n_datums:,} datums x {args.n_classes} classes, "
          f"median of {args.repeats} run(s)\n")
    if args.beam_args:
        print(f"evalbeam Beam args: `{args.beam_args}`\n")
    print("| side | datums | wall time median (s) | time per 100k datums (s) "
          "| peak RSS, largest process (MB) | peak PSS, process tree (MB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, s in sides.items():
        print(f"| {name} | {s['datums']:,} | {s['wall_s']:.2f} | {s['per_100k_s']:.2f} "
              f"| {s['maxrss_mb']:.0f} | {s['tree_mb']:.0f} |")
    print()
    for name, s in sides.items():
        print(f"- {name} wall times (s): {', '.join(f'{w:.2f}' for w in s['walls'])}")
    if "valor-lite" in sides:
        v = sides["valor-lite"]
        print(f"- valor-lite ran on {v['datums']:,} datums (fraction {fraction:g}): raw median "
              f"{v['wall_s']:.2f} s, scaled by 1/{fraction:g} to {args.n_datums:,} datums: "
              f"{v['per_100k_s'] * args.n_datums / 100_000:.2f} s")
        if v.get("phases"):
            print("- valor-lite phases of the last run (s): "
                  + ", ".join(f"{k} {x:.2f}" for k, x in v["phases"].items())
                  + f"; zero-filled datums without predictions: {v['zero_filled']:,}")
    if "evalbeam" in sides and "valor-lite" in sides:
        ratio = sides["evalbeam"]["per_100k_s"] / sides["valor-lite"]["per_100k_s"]
        print(f"\n**evalbeam / valor-lite, time per datum: {ratio:.3f}** "
              f"(target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'})")
    if "evalbeam" in sides:
        mb = sides["evalbeam"]["tree_mb"]
        print(f"evalbeam peak memory (process tree): {mb:.0f} MB "
              f"(target <= {TARGET_MEMORY_MB} MB: {'met' if mb <= TARGET_MEMORY_MB else 'NOT met'})")
    if "evalbeam" in sides and BOOTSTRAP_SIDE in sides:
        ratio = sides[BOOTSTRAP_SIDE]["wall_s"] / sides["evalbeam"]["wall_s"]
        mb = sides[BOOTSTRAP_SIDE]["tree_mb"]
        print(f"\n**evalbeam --bootstrap {args.bootstrap} / evalbeam without it, wall time: "
              f"{ratio:.2f}x** (target <= {TARGET_BOOTSTRAP_RATIO:g}x: "
              f"{'met' if ratio <= TARGET_BOOTSTRAP_RATIO else 'NOT met'}); peak memory with it "
              f"(process tree): {mb:.0f} MB (target <= {TARGET_BOOTSTRAP_MEMORY_MB} MB: "
              f"{'met' if mb <= TARGET_BOOTSTRAP_MEMORY_MB else 'NOT met'})")


# ------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_datums", type=int, default=None,
                        help=f"default 1,000,000 ({CHECK_N_DATUMS:,} with --check)")
    parser.add_argument("--n_classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=os.path.join("/tmp", "evalbeam-bench", "classification"))
    parser.add_argument("--peer_fraction", type=float, default=0.1,
                        help="valor-lite runs on this leading fraction of the datums (1.0 with --check)")
    parser.add_argument("--beam_args", default="", help="appended to the evalbeam command")
    parser.add_argument("--evalbeam_cmd", default=None,
                        help="run this instead of the installed evalbeam script (e.g. another venv's)")
    parser.add_argument("--skip_peer", action="store_true", help="do not run valor-lite")
    parser.add_argument("--skip_evalbeam", action="store_true", help="only run valor-lite")
    parser.add_argument("--bootstrap", type=int, default=0, metavar="R",
                        help="also run evalbeam with --bootstrap R and print the time ratio")
    parser.add_argument("--check", action="store_true",
                        help="valor-lite on the same full data; compare per-class ROCAUC")
    args = parser.parse_args(argv)
    if args.n_datums is None:
        args.n_datums = CHECK_N_DATUMS if args.check else 1_000_000
    if args.check and args.peer_fraction != 1.0:
        print("--check: valor-lite runs on all the datums (peer_fraction 1.0)", file=sys.stderr)
        args.peer_fraction = 1.0
    if not 0.0 < args.peer_fraction <= 1.0:
        parser.error("--peer_fraction must be in (0, 1]")
    if args.skip_peer and args.skip_evalbeam:
        parser.error("nothing to run")
    if args.bootstrap < 0 or (args.bootstrap and args.skip_evalbeam):
        parser.error("--bootstrap R needs R >= 0 and the evalbeam side")
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["--_peer"]:
        peer_main(argv[1:])
        return 0
    args = parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    full = ensure_dataset(args.workdir, args.n_datums, args.n_classes)
    n_keep = max(1, round(args.peer_fraction * args.n_datums))
    peer_paths = full if n_keep >= args.n_datums else ensure_prefix(full, n_keep)
    fraction = n_keep / args.n_datums

    plan = ([] if args.skip_evalbeam else ["evalbeam"]) + ([BOOTSTRAP_SIDE] if args.bootstrap else []) \
        + ([] if args.skip_peer else ["valor-lite"])
    runs: dict[str, list[dict]] = {name: [] for name in plan}
    runs_dir = os.path.join(args.workdir, "runs")
    for repeat in range(1, args.repeats + 1):
        for name in plan:
            output = os.path.join(runs_dir, f"{name}_r{repeat}")
            shutil.rmtree(output, ignore_errors=True)
            os.makedirs(runs_dir, exist_ok=True)
            if name == "evalbeam":
                cmd = evalbeam_command(full, output, args.beam_args, args.evalbeam_cmd)
            elif name == BOOTSTRAP_SIDE:
                cmd = evalbeam_command(full, output, args.beam_args, args.evalbeam_cmd) + [
                    "--bootstrap", str(args.bootstrap)]
            else:
                cmd = peer_command(peer_paths, output)
            print(f"[{repeat}/{args.repeats}] {name}: {shlex.join(cmd)}", file=sys.stderr)
            result = measure(cmd, output + ".log")
            result["output"] = output
            metrics = os.path.join(output, "metrics.jsonl")
            if result["returncode"] != 0 or not (os.path.exists(metrics) and os.path.getsize(metrics)):
                with open(result["stderr"], encoding="utf-8", errors="replace") as f:
                    sys.stderr.write(f.read()[-20_000:])
                print(f"\n{name} failed (exit code {result['returncode']}"
                      f"{'' if os.path.exists(metrics) else ', no metrics.jsonl'}); "
                      f"full stderr: {result['stderr']}", file=sys.stderr)
                return max(result["returncode"], 1)
            print(f"    {result['wall_s']:.2f} s, peak RSS {result['maxrss_kb'] / 1024:.0f} MB, "
                  f"tree {result['peak_tree_kb'] / 1024:.0f} MB", file=sys.stderr)
            runs[name].append(result)

    sides = {}
    for name in ("evalbeam", BOOTSTRAP_SIDE):
        if name in runs:
            sides[name] = summarize(runs[name], args.n_datums)
    if "valor-lite" in runs:
        sides["valor-lite"] = summarize(runs["valor-lite"], count_lines(peer_paths["groundtruths"]))
        peer = read_json(os.path.join(runs["valor-lite"][-1]["output"], "peer.json")) or {}
        sides["valor-lite"].update(phases=peer.get("phases_s"), zero_filled=peer.get("zero_filled", 0))
    print_report(args, sides, fraction)
    if args.check and len(sides) == 2:
        compare_metrics(os.path.join(runs["evalbeam"][-1]["output"], "metrics.jsonl"),
                        os.path.join(runs["valor-lite"][-1]["output"], "metrics.jsonl"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
