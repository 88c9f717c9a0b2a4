"""Golden outputs: every task, run through the `evalbeam` command on fixed inputs, writes byte
for byte what it wrote when the outputs were captured (tests/golden/expected/). A change of any
metric, rejection, score, per-query record, printed summary or exit code fails here.

Capture again, only for an intended change of behaviour (and say so in the commit):
    EVALBEAM_GOLDEN_UPDATE=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import MULTIPROCESS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "golden"))
from cases import CASES, EXPECTED, KEPT, REFERENCE, command, needs_reference, normalise, output_folder  # noqa: E402

UPDATE = os.environ.get("EVALBEAM_GOLDEN_UPDATE") == "1"


def run_case(name: str, out: str, judge_url: str = "", extra: tuple = (), env: dict | None = None) -> dict:
    env = dict(os.environ, EVALBEAM_JUDGE_API_KEY="golden-key", **(env or {}))
    env.pop("EVALBEAM_LOG_LEVEL", None)
    done = subprocess.run(["evalbeam", *command(name, out, judge_url), *extra], capture_output=True,
                          text=True, env=env, timeout=600)
    got = {"exit_code": f"{done.returncode}\n", "stdout.txt": normalise(done.stdout, out),
           "stderr.txt": normalise(done.stderr, out)}
    folder = output_folder(name, out)
    run_json = os.path.join(folder, "run.json")
    if os.path.exists(run_json) and done.returncode != 2:
        # how many elements crossed each shuffle: a property of the inputs and the shards, not
        # of the runner (the bytes depend on pickle and numpy versions, so they are not kept)
        with open(run_json, encoding="utf-8") as f:
            shuffles = json.load(f).get("shuffles", {})
        got["shuffle_elements.json"] = json.dumps(
            {stage: figures["elements"] for stage, figures in shuffles.items()}, indent=1) + "\n"
    for file in KEPT:
        path = os.path.join(folder, file)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                got[file] = normalise(f.read(), out)
    return got


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_are_byte_identical(tmp_path, name):
    """Each case's outputs equal the golden copy (EVALBEAM_GOLDEN_UPDATE=1 rewrites it)."""
    if needs_reference(name) and not os.path.isdir(REFERENCE):
        pytest.skip(f"needs the shared reference cases at {REFERENCE} (absent in a fresh clone)")
    if name == "text_judge":
        from evalbeam.pipelines.runners.judge_server import StandInServer

        with StandInServer() as server:
            got = run_case(name, str(tmp_path), server.url)
    else:
        got = run_case(name, str(tmp_path))
    folder = os.path.join(EXPECTED, name)
    if UPDATE:
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):
            os.remove(os.path.join(folder, old))
        for file, text in got.items():
            with open(os.path.join(folder, file), "w", encoding="utf-8") as f:
                f.write(text)
    compare(name, got)


def compare(name: str, got: dict, skip: tuple = ()) -> None:
    folder = os.path.join(EXPECTED, name)
    expected = {}
    for file in os.listdir(folder):
        if file not in skip:
            with open(os.path.join(folder, file), encoding="utf-8") as f:
                expected[file] = f.read()
    got = {file: text for file, text in got.items() if file not in skip}
    assert sorted(got) == sorted(expected), "a different set of output files"
    for file in sorted(expected):
        assert got[file] == expected[file], f"{name}/{file} differs from the golden copy"


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["classification", "detection_bbox", "segmentation", "text", "retrieval",
                                  "classification_bootstrap", "text_bootstrap", "trec_eval",
                                  "coco_bbox", "coco_segm"])
def test_multi_process_runner_and_split_files_write_the_golden_bytes(tmp_path, name):
    """The same cases on two worker processes, every input file (JSONL, TREC) read in spans of
    1,000 bytes (transforms/line_spans.py: tens of spans per file, lines cut at every place),
    and COCO files cut into pieces of about 1,000 bytes (a results file's array, an instances
    file's annotations: schemas/json_pieces.py): the same files, byte for byte, rejections'
    line numbers and positions included. Only the shuffle's
    element counts differ (each span sends its own pieces). Every piece is spilled to a file
    (EVALBEAM_SPILL_BYTES=0, transforms/grouping.py), written by one process, read by another.
    Detection's labels holding more than an eighth of a model's detections are merged and
    accumulated in spans of IoU thresholds (EVALBEAM_SPLIT_DETECTIONS=0: at any size)."""
    if needs_reference(name) and not os.path.isdir(REFERENCE):
        pytest.skip(f"needs the shared reference cases at {REFERENCE} (absent in a fresh clone)")
    got = run_case(name, str(tmp_path), extra=(*MULTIPROCESS, "--input_split_bytes", "1000"),
                   env={"EVALBEAM_SPILL_BYTES": "0", "EVALBEAM_SPLIT_DETECTIONS": "0"})
    compare(name, got, skip=("shuffle_elements.json",))
    assert got["shuffle_elements.json"] != open(
        os.path.join(EXPECTED, name, "shuffle_elements.json"), encoding="utf-8").read(), \
        "the inputs were not split"
