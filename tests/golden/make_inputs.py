"""Write the golden inputs under tests/golden/inputs/ (run once; the files are committed).

One small generated set per task, each with bad rows in it, so that the golden outputs cover
metrics, rejections, scores and the printed summary. Seeds are fixed; rerunning rewrites the same
bytes. The reference cases come from ../shared/reference and are not copied here.
"""

from __future__ import annotations

import json
import os
import random
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "inputs")


def write_lines(path: str, lines: list) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line, sort_keys=True)) + "\n")


def classification() -> None:
    from evalbeam.pipelines.demo.synthetic import write_classification_dataset

    folder = os.path.join(INPUTS, "classification")
    paths = write_classification_dataset(folder, n_datums=400, n_classes=4, seed=7)
    for name, path in paths.items():
        os.replace(path, os.path.join(folder, f"{name}.jsonl"))
    bad = ['{"datum_uid": "broken', {"datum_uid": "x1", "labels": {"class": [["cat", "0.5"]]}},
           {"labels": {"class": [["cat", 0.5]]}}, {"datum_uid": "d00001", "labels": {"class": [["cat", 0.9]]}}]
    with open(os.path.join(folder, "model_b.jsonl"), "a") as f:
        for line in bad:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    with open(os.path.join(folder, "groundtruths.jsonl"), "a") as f:
        f.write('{"datum_uid": "g-nan", "labels": {"class": "cat"}, "metadata": {"region": NaN}}\n')
        f.write("[1, 2]\n")


def detection() -> None:
    rng = np.random.default_rng(11)
    labels = ["car", "person", "dog"]
    gts, good, weak = [], [], []
    for i in range(40):
        uid = f"img{i:03d}"
        boxes = []
        for _ in range(int(rng.integers(0, 6))):
            x, y = rng.uniform(0, 400, 2).round(1)
            w, h = rng.uniform(4, 120, 2).round(1)
            boxes.append({"label": labels[int(rng.integers(3))], "bbox": [float(x), float(y), float(x + w), float(y + h)]})
        gts.append({"datum_uid": uid, "metadata": {"camera": "ab"[i % 2]}, "annotations": boxes})
        for rows, noise, miss in ((good, 3.0, 0.1), (weak, 15.0, 0.4)):
            dets = []
            for b in boxes:
                if rng.random() < miss:
                    continue
                x0, y0, x1, y1 = (np.array(b["bbox"]) + rng.normal(0, noise, 4)).round(1).tolist()
                dets.append({"label": b["label"] if rng.random() < 0.9 else labels[int(rng.integers(3))],
                             "bbox": [min(x0, x1), min(y0, y1), max(x0, x1) + 1, max(y0, y1) + 1],
                             "score": round(float(rng.uniform(0.05, 1.0)), 3)})
            for _ in range(int(rng.integers(0, 3))):
                x, y = rng.uniform(0, 400, 2).round(1)
                dets.append({"label": labels[int(rng.integers(3))], "bbox": [float(x), float(y), float(x + 30), float(y + 30)],
                             "score": round(float(rng.uniform(0.05, 0.6)), 3)})
            rows.append({"datum_uid": uid, "annotations": dets})
    weak += ['{"datum_uid": "img999", "annotations": [', {"datum_uid": "img998", "annotations": [
        {"label": "car", "bbox": [0, 0, 1e300, 10], "score": 0.5}]},
        {"datum_uid": "img997", "annotations": [{"label": "car", "bbox": [5, 5, 1, 1], "score": 0.5}]},
        {"datum_uid": "img996", "annotations": [{"label": "car", "bbox": [0, 0, 10, 10]}]}]
    gts.append({"datum_uid": "img-bad", "annotations": [{"label": "car", "bbox": [0, 0, "x", 3]}]})
    folder = os.path.join(INPUTS, "detection")
    write_lines(os.path.join(folder, "groundtruths.jsonl"), gts)
    write_lines(os.path.join(folder, "good.jsonl"), good)
    write_lines(os.path.join(folder, "weak.jsonl"), weak)


def segmentation() -> None:
    sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "segmentation")]
    from pathlib import Path

    from test_segmentation import random_maps, write_inputs

    folder = Path(INPUTS) / "segmentation"
    write_inputs(folder, random_maps(seed=5, n=10), "rle")
    with open(folder / "noisy.jsonl", "a") as f:
        f.write('{"datum_uid": "img-50", "shape": [4, 4], "segments": [{"label": "road", "rle": {"size": [5, 4], "counts": "0"}}]}\n')
        f.write('{"datum_uid": "img-51", "shape": [4, 4]\n')
        f.write('{"datum_uid": "img-00", "shape": [4, 4], "segments": []}\n')


def text() -> None:
    sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "text")]
    from test_text_pipeline import make_rows

    gt, predictions = make_rows(seed=4, n=50)
    folder = os.path.join(INPUTS, "text")
    gt.append({"datum_uid": "q-bad", "references": "not a list"})
    predictions["bad"].append({"datum_uid": "q001", "response": "a duplicate"})
    predictions["bad"].append({"datum_uid": "q-x", "response": 7})
    write_lines(os.path.join(folder, "groundtruths.jsonl"), gt)
    for name, rows in predictions.items():
        write_lines(os.path.join(folder, f"{name}.jsonl"), rows)
    from evalbeam.pipelines.demo.synthetic_rag import write_rag_dataset

    rag = write_rag_dataset(os.path.join(folder, "rag"), 12, seed=2, models=("alpha",))
    for name, path in rag.items():
        os.replace(path, os.path.join(folder, "rag", f"{name}.jsonl"))


def retrieval() -> None:
    rng = random.Random(3)
    qrels, run_a, run_b = [], [], []
    docs = [f"d{j:03d}" for j in range(60)]
    for q in range(25):
        qid = f"q{q:02d}"
        judged = rng.sample(docs, 12)
        for d in judged:
            qrels.append({"query_id": qid, "doc_id": d, "relevance": rng.choice([0, 0, 1, 2, 3]),
                          "metadata": {"kind": "ab"[q % 2]}})
        for rows, skill in ((run_a, 0.7), (run_b, 0.3)):
            ranked = rng.sample(docs, 30)
            for rank, d in enumerate(ranked):
                score = round(1.0 - rank / 40 + (skill if d in judged else 0) * rng.random(), 2)
                rows.append({"query_id": qid, "doc_id": d, "score": score})
    qrels.append({"query_id": "q00", "doc_id": qrels[0]["doc_id"], "relevance": 1, "metadata": {"kind": "a"}})
    qrels.append({"query_id": "q99", "doc_id": "d001", "relevance": "high"})
    run_b.append({"query_id": "q01", "doc_id": "d001", "score": float("nan")})
    run_b.append('{"query_id": "q02", "doc_id":')
    folder = os.path.join(INPUTS, "retrieval")
    write_lines(os.path.join(folder, "qrels.jsonl"), qrels)
    write_lines(os.path.join(folder, "run_a.jsonl"), run_a)
    write_lines(os.path.join(folder, "run_b.jsonl"), [r if isinstance(r, str) else json.dumps(r, sort_keys=True).replace("NaN", "NaN") for r in run_b])


if __name__ == "__main__":
    for make in (classification, detection, segmentation, text, retrieval):
        make()
    print(f"golden inputs written under {INPUTS}")
