"""Benchmark: `evalbeam text --metrics ROUGE,BLEU` end to end against a plain Python loop.

Data (made once, cached in --workdir): N datums, each with one reference (30% two) of 1-2 sentences
of 5-15 words (Zipf-distributed words from a 5,000-word vocabulary, some punctuation, numbers and non-ASCII
words) and a response that paraphrases one reference (dropped, replaced and inserted words).

Sides, each in a fresh process, on the same files, in the same run:
- evalbeam: the CLI from reading the JSONL to writing metrics.jsonl and scores.jsonl (ROUGE
  rouge1/rouge2/rougeL/rougeLsum and sentence BLEU), in-process and with
  --direct_running_mode multi_processing --direct_num_workers 2 (the machine's 2 cores);
- the loop a user would write: read the same JSONL, then per datum rouge-score's
  RougeScorer([...4 types]).score_multi(references, response) and nltk's sentence_bleu on Valor's
  tokens, writing the scores.
The script checks that every per-datum F-measure and BLEU value is identical and prints the
wall times and the ratio.

    pip install -e ".[test,bench]"
    python tests/benchmarks/bench_text.py                     # 200,000 datums, 3 repeats
    python tests/benchmarks/bench_text.py --n_datums 20000 --repeats 1
    python tests/benchmarks/bench_text.py --bootstrap 100   # evalbeam with / without --bootstrap 100

With --bootstrap R the sides are evalbeam (2 workers) without and with `--bootstrap R` on the same
files; the script checks that the point values are identical and prints the time ratio (issue
16's target: at most 1.5x).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_classification import machine_info, measure, read_json, write_json  # noqa: E402

ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


def ensure_dataset(workdir: str, n: int, seed: int = 0) -> dict:
    import numpy as np

    folder = os.path.join(workdir, f"data_v2_n{n}_s{seed}")
    done = os.path.join(folder, "done.json")
    if read_json(done):
        print(f"reusing data in {folder}", file=sys.stderr)
        return read_json(done)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ren", "sto", "va", "pe", "dri", "on", "tu", "ché", "ß", "ü"]
    vocab = ["".join(rng.choice(syllables, int(rng.integers(1, 4)))) for _ in range(5000)]
    vocab[:12] = ["the", "of", "and", "a", "to", "in", "is", "was", "for", "$100", "3.5%", "2024"]
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()

    def sentence():
        words = list(rng.choice(vocab, int(rng.integers(5, 16)), p=weights))
        return " ".join(words).capitalize() + rng.choice([".", ".", "!", "?", ","])

    def paraphrase(text):
        out = []
        for word in text.split(" "):
            r = rng.random()
            if r < 0.10:
                continue
            out.append(str(rng.choice(vocab, p=weights)) if r < 0.25 else word)
            if rng.random() < 0.05:
                out.append(str(rng.choice(vocab, p=weights)))
        return " ".join(out)

    gt_path, pd_path = os.path.join(folder, "groundtruths.jsonl"), os.path.join(folder, "predictions.jsonl")
    with open(gt_path, "w", encoding="utf-8") as gt, open(pd_path, "w", encoding="utf-8") as pd:
        for i in range(n):
            refs = [" ".join(sentence() for _ in range(int(rng.integers(1, 3))))
                    for _ in range(1 if rng.random() < 0.7 else 2)]
            uid = f"q{i:07d}"
            gt.write(json.dumps({"datum_uid": uid, "references": refs}, ensure_ascii=False) + "\n")
            pd.write(json.dumps({"datum_uid": uid, "response": paraphrase(refs[0])}, ensure_ascii=False) + "\n")
    info = {"groundtruths": gt_path, "predictions": pd_path, "n_datums": n}
    write_json(done, info)
    return info


def evalbeam_command(data: dict, output: str, beam_args: str) -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "evalbeam")
    base = [exe] if os.path.exists(exe) else [sys.executable, "-m", "evalbeam.pipelines.cli"]
    return base + ["text", "--groundtruths", data["groundtruths"], "--predictions",
                   f"model={data['predictions']}", "--output", output, "--quiet",
                   "--metrics", "ROUGE,BLEU", *shlex.split(beam_args)]


def run_loop(gt_path: str, pd_path: str, output: str) -> None:
    """The plain loop (child process): rouge-score and nltk per datum, scores to output/scores.json."""
    import warnings

    from nltk.tokenize import RegexpTokenizer
    from nltk.translate import bleu_score
    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(ROUGE_TYPES)
    tokenizer = RegexpTokenizer(r"\w+|\$[\d]+|[^\s\.]+")        # Valor's BLEU tokens
    with open(gt_path, encoding="utf-8") as f:
        truths = [json.loads(line) for line in f]
    with open(pd_path, encoding="utf-8") as f:
        responses = {r["datum_uid"]: r["response"] for r in map(json.loads, f)}
    out = {}
    warnings.simplefilter("ignore")
    for row in truths:
        response = responses[row["datum_uid"]]
        rouge = scorer.score_multi(row["references"], response)
        bleu = bleu_score.sentence_bleu([tokenizer.tokenize(r) for r in row["references"]],
                                        tokenizer.tokenize(response))
        out[row["datum_uid"]] = [rouge[t].fmeasure for t in ROUGE_TYPES] + [bleu if bleu >= 1e-9 else 0.0]
    os.makedirs(output, exist_ok=True)
    write_json(os.path.join(output, "scores.json"), out)


def evalbeam_scores(output: str) -> dict:
    out: dict = {}
    with open(os.path.join(output, "scores.jsonl"), encoding="utf-8") as f:
        for row in map(json.loads, f):
            values = out.setdefault(row["datum_uid"], [None] * 5)
            index = ROUGE_TYPES.index(row["parameters"]["rouge_type"]) if row["metric"] == "ROUGE" else 4
            values[index] = row["value"]
    return out


def bootstrap_main(args, data: dict) -> int:
    """evalbeam (2 workers) without and with --bootstrap R on the same files: time ratio, and
    the point values compared."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    beam_args = "--direct_running_mode multi_processing --direct_num_workers 2"
    sides = {"without --bootstrap": beam_args,
             f"--bootstrap {args.bootstrap}": f"{beam_args} --bootstrap {args.bootstrap}"}
    runs: dict = {key: [] for key in sides}
    runs_dir = os.path.join(args.workdir, f"boot_n{args.n_datums}")
    os.makedirs(runs_dir, exist_ok=True)
    for repeat in range(1, args.repeats + 1):
        for i, (key, extra) in enumerate(sides.items()):
            output = os.path.join(runs_dir, f"side{i}_r{repeat}")
            shutil.rmtree(output, ignore_errors=True)
            cmd = evalbeam_command(data, output, extra)
            print(f"[{repeat}/{args.repeats}] {key}: {shlex.join(cmd)}", file=sys.stderr)
            result = measure(cmd, output + ".log")
            if result["returncode"] != 0:
                with open(result["stderr"], encoding="utf-8", errors="replace") as f:
                    sys.stderr.write(f.read()[-5000:])
                return 1
            result["output"] = output
            print(f"    {result['wall_s']:.2f} s, tree {result['peak_tree_kb'] / 1024:.0f} MB", file=sys.stderr)
            runs[key].append(result)
    plain_key, boot_key = list(sides)

    def points(output):
        with open(os.path.join(output, "metrics.jsonl"), encoding="utf-8") as f:
            return [{k: v for k, v in json.loads(line).items() if k not in ("interval", "wilson")} for line in f]

    same = points(runs[plain_key][-1]["output"]) == points(runs[boot_key][-1]["output"])
    print("### Machine")
    print("\n".join(machine_info(("apache-beam", "rouge-score", "nltk", "sacrebleu", "numpy"))))
    print(f"- load average at the start: {load}; at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"\n### Text bootstrap: {args.n_datums:,} datums, ROUGE (4 types) + sentence BLEU, "
          f"evalbeam 2 workers, median of {args.repeats} run(s)\n")
    print("| side | wall time median (s) | all runs (s) | peak PSS, process tree (MB) |")
    print("|---|---:|---|---:|")
    median = {}
    for key, items in runs.items():
        median[key] = statistics.median(r["wall_s"] for r in items)
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in items)
        print(f"| {key} | {median[key]:.1f} | {walls} | {max(r['peak_tree_kb'] for r in items) / 1024:.0f} |")
    print(f"\n**with / without --bootstrap {args.bootstrap}: {median[boot_key] / median[plain_key]:.2f}x** "
          f"(target <= 1.5)")
    print(f"\nPoint values identical with and without --bootstrap: {same}")
    return 0 if same else 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["--_loop"]:
        run_loop(*argv[1:4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n_datums", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=os.path.join("/tmp", "evalbeam-bench", "text"))
    parser.add_argument("--bootstrap", type=int, default=0, metavar="R",
                        help="time evalbeam with --bootstrap R against evalbeam without it")
    args = parser.parse_args(argv)
    data = ensure_dataset(args.workdir, args.n_datums)
    if args.bootstrap:
        return bootstrap_main(args, data)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    sides = {
        "evalbeam, multi_processing, 2 workers": lambda out: evalbeam_command(
            data, out, "--direct_running_mode multi_processing --direct_num_workers 2"),
        "evalbeam, in-process": lambda out: evalbeam_command(data, out, ""),
        "loop (rouge-score + nltk)": lambda out: [sys.executable, os.path.abspath(__file__), "--_loop",
                                                  data["groundtruths"], data["predictions"], out],
    }
    runs: dict = {key: [] for key in sides}
    runs_dir = os.path.join(args.workdir, f"runs_n{args.n_datums}")
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
    loop_key, mp_key = "loop (rouge-score + nltk)", "evalbeam, multi_processing, 2 workers"
    ours = evalbeam_scores(runs[mp_key][-1]["output"])
    theirs = read_json(os.path.join(runs[loop_key][-1]["output"], "scores.json"))
    differing = sum(ours[uid] != values for uid, values in theirs.items())
    print("### Machine")
    print("\n".join(machine_info(("apache-beam", "rouge-score", "nltk", "sacrebleu", "numpy"))))
    print(f"- load average at the start: {load}; at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"\n### Text: {args.n_datums:,} datums, ROUGE (4 types) + sentence BLEU, median of {args.repeats} run(s)\n")
    print("| side | wall time median (s) | all runs (s) | datums/s | peak PSS, process tree (MB) |")
    print("|---|---:|---|---:|---:|")
    median = {}
    for key, items in runs.items():
        median[key] = statistics.median(r["wall_s"] for r in items)
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in items)
        print(f"| {key} | {median[key]:.1f} | {walls} | {args.n_datums / median[key]:,.0f} | "
              f"{max(r['peak_tree_kb'] for r in items) / 1024:.0f} |")
    print(f"\n**evalbeam (2 workers) / loop: {median[mp_key] / median[loop_key]:.2f}x** (target <= 0.6)")
    print(f"\nPer-datum scores (4 ROUGE F-measures and BLEU) identical to the loop's: "
          f"{len(theirs) - differing:,} of {len(theirs):,} datums")
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
