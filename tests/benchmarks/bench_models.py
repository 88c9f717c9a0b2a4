"""Perplexity with a model on the workers (`--lm_uri`) against a plain loop over the same
runtime: 10,000 texts, a tiny causal LM built here (tests/tiny_models.py: vocabulary V, width
D), the same ONNX Runtime. The loop is what a user writes without evalbeam: read the texts, one
text at a time tokenize, run, log-softmax, mean. Both run end to end as a fresh process each, as
every benchmark here times its peer (the interpreter's start and the imports included; the
loop's timed section, from loading the model to the last text, is printed beside), on the same
files in the same run; the ratio is evalbeam's time over the loop's (issue 20's target: at
most 0.5).

    pip install -e ".[test,bench]"
    python tests/benchmarks/bench_models.py                   # 10,000 texts, 3 repeats
    python tests/benchmarks/bench_models.py --texts 2000 --repeats 1
    python tests/benchmarks/bench_models.py --architecture transformer --dim 128 --layers 4

--architecture transformer builds a causal transformer of GPT-2's shape instead
(tests/tiny_models.write_transformer_lm: attention, MLP, LayerNorm; --heads), where a call's
cost is matrix products rather than the per-operator overhead of the toy's 96 thin layers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench_classification import machine_info  # noqa: E402
from tiny_models import write_tiny_causal_lm, write_transformer_lm  # noqa: E402


def make_inputs(folder: str, n: int, vocabulary: int, seed: int = 0) -> tuple[str, str, list[str]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocabulary)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 80))) + "." for _ in range(n)]
    os.makedirs(folder, exist_ok=True)
    gt, pred = os.path.join(folder, "groundtruths.jsonl"), os.path.join(folder, "predictions.jsonl")
    with open(gt, "w", encoding="utf-8") as g, open(pred, "w", encoding="utf-8") as p:
        for i, text in enumerate(texts):
            g.write(json.dumps({"datum_uid": f"d{i:06d}", "query": "q"}) + "\n")
            p.write(json.dumps({"datum_uid": f"d{i:06d}", "response": text}) + "\n")
    return gt, pred, texts


def plain_loop(model: str, texts: list[str]) -> tuple[float, float]:
    """(seconds, mean perplexity) of one text at a time, timed from loading the model."""
    import onnxruntime
    from tokenizers import Tokenizer

    started = time.perf_counter()
    tokenizer = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    session = onnxruntime.InferenceSession(os.path.join(model, "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    values = []
    for text in texts:
        ids = np.array([tokenizer.encode(text).ids], np.int64)
        logits = session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]
        logits = logits[:-1].astype(np.float64)
        top = logits.max(axis=1)
        norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        lp = logits[np.arange(ids.shape[1] - 1), ids[0, 1:]] - norm
        values.append(math.exp(-lp.mean()))
    return time.perf_counter() - started, float(np.mean(values))


def loop_process(model: str, pred: str) -> tuple[float, float, float]:
    """(whole process seconds, timed section seconds, mean perplexity) of the loop run as a
    fresh `python bench_models.py --_loop MODEL PREDICTIONS` process."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--_loop", model, pred],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    section, mean = json.loads(done.stdout.strip().splitlines()[-1])
    return seconds, section, mean


def evalbeam_run(gt: str, pred: str, model: str, out: str, extra: list[str]) -> tuple[float, float]:
    """(seconds, the overall Perplexity record's value) of one evalbeam run."""
    started = time.perf_counter()
    done = subprocess.run(["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}",
                           "--output", out, "--metrics", "Perplexity", "--lm_uri", model, "--quiet",
                           "--overwrite", *extra], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    record = next(json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8")
                  if '"Perplexity"' in line and '"slice": {}' in line)
    return seconds, record["value"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=10_000)
    parser.add_argument("--vocabulary", type=int, default=500)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--architecture", choices=("toy", "transformer"), default="toy")
    parser.add_argument("--heads", type=int, default=4, help="transformer only")
    parser.add_argument("--lm_batch_size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "evalbeam-bench", "models"))
    args = parser.parse_args(argv)
    folder = os.path.join(args.workdir, f"n{args.texts}_v{args.vocabulary}_d{args.dim}_l{args.layers}")
    gt, pred, texts = make_inputs(folder, args.texts, args.vocabulary)
    words = [f"w{i}" for i in range(args.vocabulary)] + ["."]
    if args.architecture == "toy":
        model = str(write_tiny_causal_lm(os.path.join(folder, "lm"), dim=args.dim, layers=args.layers,
                                         words=words))
    else:
        model = str(write_transformer_lm(os.path.join(folder, "transformer"), dim=args.dim,
                                         layers=args.layers, heads=args.heads, words=words))
    runs: dict = {"loop": [], "evalbeam": [], "evalbeam, 2 workers": []}
    sections = []
    for repeat in range(args.repeats):
        seconds, section, loop_mean = loop_process(model, pred)
        runs["loop"].append(seconds)
        sections.append(section)
        for label, extra in (("evalbeam", []), ("evalbeam, 2 workers", [
                "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"])):
            seconds, mean = evalbeam_run(gt, pred, model, os.path.join(folder, "out"),
                                         ["--lm_batch_size", str(args.lm_batch_size), *extra])
            runs[label].append(seconds)
            # the same numbers: the batched, padded runs agree with the loop
            assert math.isclose(mean, loop_mean, rel_tol=1e-6), (mean, loop_mean)
        print(f"repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in runs.items()),
              file=sys.stderr)
    print("\n".join(machine_info()))
    shape = "tiny causal LM" if args.architecture == "toy" else f"causal transformer, {args.heads} heads,"
    print(f"\nPerplexity of {args.texts:,} texts (20-80 words), {shape} V={args.vocabulary:,} "
          f"D={args.dim}, {args.layers} layers, ONNX Runtime on CPU, --lm_batch_size "
          f"{args.lm_batch_size}; medians of {args.repeats}\n")
    print("| what | seconds | / loop |")
    print("|---|---:|---:|")
    loop = statistics.median(runs["loop"])
    for label, values in runs.items():
        print(f"| {label} | {statistics.median(values):.1f} | {statistics.median(values) / loop:.2f} |")
    print(f"\nThe loop's timed section (loading the model to the last text): "
          f"{statistics.median(sections):.1f} s")
    return 0


def loop_main(model: str, pred: str) -> int:
    """The loop's process: read the texts, run plain_loop, print [timed seconds, mean]."""
    with open(pred, encoding="utf-8") as f:
        texts = [json.loads(line)["response"] for line in f]
    seconds, mean = plain_loop(model, texts)
    print(json.dumps([seconds, mean]))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--_loop"]:
        sys.exit(loop_main(*sys.argv[2:4]))
    sys.exit(main(sys.argv[1:]))
