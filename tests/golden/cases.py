"""The golden cases: fixed inputs, the command run on them, and where their outputs are kept.

Each case is evalbeam's command line with paths relative to tests/golden/inputs (`{in}`), the
shared reference folder (`{ref}`) and the case's output folder (`{out}`). The outputs kept are
metrics.jsonl, rejected.jsonl, scores.jsonl, per_query.jsonl, what was printed on stdout and
stderr (wall
times blanked) and the exit code. run.json is not kept: it records times, versions and paths; of it
only the elements that crossed each shuffle are (shuffle_elements.json).
"""

from __future__ import annotations

import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "inputs")
EXPECTED = os.path.join(HERE, "expected")
REFERENCE = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "reference"))
KEPT = ("metrics.jsonl", "rejected.jsonl", "scores.jsonl", "per_query.jsonl")

COCO = "{ref}/detection/coco_val2014_100/"
TREC = "{ref}/retrieval/trec_eval/"

CASES = {
    "demo": ["demo", "--folder", "{out}/demo", "--n_datums", "2000"],
    "classification": [
        "classification", "--groundtruths", "{in}/classification/groundtruths.jsonl",
        "--predictions", "model_a={in}/classification/model_a.jsonl",
        "--predictions", "model_b={in}/classification/model_b.jsonl",
        "--slice", "region", "--score_thresholds", "0.0,0.5", "--max_rejected_fraction", "0.01"],
    "classification_bootstrap": [
        "classification", "--groundtruths", "{in}/classification/groundtruths.jsonl",
        "--predictions", "model_a={in}/classification/model_a.jsonl",
        "--predictions", "model_b={in}/classification/model_b.jsonl",
        "--slice", "region", "--max_rejected_fraction", "0.01", "--calibration_bins", "5",
        "--metrics", "Counts,Precision,Recall,F1,Accuracy,ROCAUC,mROCAUC,ECE,MCE,BrierScore,ReliabilityDiagram",
        "--bootstrap", "20", "--bootstrap_seed", "16", "--compare_to", "model_a"],
    "classification_wrong_task": [
        "classification", "--groundtruths", "{in}/classification/groundtruths.jsonl",
        "--predictions", "text={in}/text/good.jsonl"],
    "detection_bbox": [
        "detection", "--groundtruths", "{in}/detection/groundtruths.jsonl",
        "--predictions", "good={in}/detection/good.jsonl", "--predictions", "weak={in}/detection/weak.jsonl",
        "--slice", "camera", "--max_rejected_fraction", "0.2"],
    "detection_bootstrap": [
        "detection", "--groundtruths", "{in}/detection/groundtruths.jsonl",
        "--predictions", "good={in}/detection/good.jsonl", "--predictions", "weak={in}/detection/weak.jsonl",
        "--max_rejected_fraction", "0.2", "--protocol", "coco", "--bootstrap", "20", "--compare_to", "good"],
    "detection_valor": [
        "detection", "--groundtruths", "{in}/detection/groundtruths.jsonl",
        "--predictions", "good={in}/detection/good.jsonl", "--protocol", "valor",
        "--score_thresholds", "0.25,0.5", "--max_rejected_fraction", "0.2"],
    "coco_bbox": [
        "detection", "--groundtruths", COCO + "instances_val2014_100.json",
        "--predictions", "fake=" + COCO + "instances_val2014_fakebbox100_results.json"],
    "coco_segm": [
        "detection", "--groundtruths", COCO + "instances_val2014_100.json", "--iou_type", "segm",
        "--predictions", "fake=" + COCO + "instances_val2014_fakesegm100_results.json"],
    "segmentation": [
        "segmentation", "--groundtruths", "{in}/segmentation/groundtruths.jsonl",
        "--predictions", "good={in}/segmentation/good.jsonl",
        "--predictions", "noisy={in}/segmentation/noisy.jsonl", "--slice", "site",
        "--max_rejected_fraction", "0.2"],
    "segmentation_bootstrap": [
        "segmentation", "--groundtruths", "{in}/segmentation/groundtruths.jsonl",
        "--predictions", "good={in}/segmentation/good.jsonl",
        "--predictions", "noisy={in}/segmentation/noisy.jsonl",
        "--max_rejected_fraction", "0.2", "--bootstrap", "20", "--compare_to", "good"],
    "text_bootstrap": [
        "text", "--groundtruths", "{in}/text/groundtruths.jsonl",
        "--predictions", "good={in}/text/good.jsonl", "--predictions", "bad={in}/text/bad.jsonl",
        "--max_rejected_fraction", "0.1", "--bootstrap", "20", "--compare_to", "good"],
    "text": [
        "text", "--groundtruths", "{in}/text/groundtruths.jsonl",
        "--predictions", "good={in}/text/good.jsonl", "--predictions", "bad={in}/text/bad.jsonl",
        "--slice", "topic", "--max_rejected_fraction", "0.1"],
    "text_judge": [
        "text", "--groundtruths", "{in}/text/rag/groundtruths.jsonl",
        "--predictions", "alpha={in}/text/rag/alpha.jsonl", "--metrics", "all",
        "--judge_url", "{judge}", "--judge_rpm", "100000", "--judge_concurrency", "8",
        "--judge_journal", "{out}/journal"],
    "retrieval_bootstrap": [
        "retrieval", "--groundtruths", "{in}/retrieval/qrels.jsonl",
        "--predictions", "a={in}/retrieval/run_a.jsonl", "--predictions", "b={in}/retrieval/run_b.jsonl",
        "--max_rejected_fraction", "0.1", "--bootstrap", "20", "--compare_to", "a"],
    "retrieval": [
        "retrieval", "--groundtruths", "{in}/retrieval/qrels.jsonl",
        "--predictions", "a={in}/retrieval/run_a.jsonl", "--predictions", "b={in}/retrieval/run_b.jsonl",
        "--slice", "kind", "--per_query", "--max_rejected_fraction", "0.1"],
    "trec_eval": [
        "retrieval", "--groundtruths", TREC + "qrels.test", "--predictions", "run=" + TREC + "results.test",
        "--per_query"],
    "trec_eval_graded": [
        "retrieval", "--groundtruths", TREC + "qrels.rel_level", "--predictions", "run=" + TREC + "results.trunc",
        "--relevance_level", "2", "--complete"],
}


def needs_reference(name: str) -> bool:
    return any("{ref}" in part for part in CASES[name])


def command(name: str, out: str, judge_url: str = "") -> list[str]:
    values = {"{in}": INPUTS, "{ref}": REFERENCE, "{out}": out, "{judge}": judge_url}
    parts = []
    for part in CASES[name]:
        for key, value in values.items():
            part = part.replace(key, value)
        parts.append(part)
    if name != "demo":
        parts += ["--output", os.path.join(out, "output")]
    return parts


def output_folder(name: str, out: str) -> str:
    return os.path.join(out, "demo", "output") if name == "demo" else os.path.join(out, "output")


def normalise(text: str, out: str) -> str:
    """Printed text without what changes from run to run: wall times and the case's folders."""
    text = text.replace(out, "{out}").replace(INPUTS, "{in}").replace(REFERENCE, "{ref}")
    text = re.sub(r"Wall time [0-9.]+ s", "Wall time _ s", text)
    text = re.sub(r"[0-9,]+ requests/minute", "_ requests/minute", text)
    # progress lines carry their time and come in any order
    text = "".join(line for line in text.splitlines(keepends=True)
                   if not re.search(r" \([0-9.]+ s\)$", line.rstrip("\n")))
    return re.sub(r"http://127\.0\.0\.1:\d+", "{judge}", text)
