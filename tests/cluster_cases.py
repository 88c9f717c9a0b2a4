"""What a cluster runner must reproduce, shared by tests/test_portable.py and tests/test_dask.py:
each golden case, segmentation masks read from files by the workers, and a gated sweep with its
report, byte for byte as the DirectRunner writes them. `runner` is the list of Beam options that
selects the runner under test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from helpers import ROOT, SHARED

sys.path.insert(0, str(ROOT / "tests" / "golden"))
from cases import EXPECTED, KEPT, command, needs_reference, normalise, output_folder  # noqa: E402

# one golden case per task and input form (the golden outputs are the DirectRunner's bytes)
CASES_HERE = ["classification_bootstrap", "detection_bbox", "detection_valor", "coco_segm",
              "segmentation_bootstrap", "text_judge", "retrieval", "trec_eval"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_evalbeam(args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["evalbeam", *map(str, args)], capture_output=True, text=True,
                          timeout=900, env=env or dict(os.environ))


def check_golden_case(tmp_path, runner, name):
    """The golden case `name` run with the runner options `runner` writes the golden bytes."""
    if needs_reference(name) and not (SHARED / "reference").is_dir():
        pytest.skip(f"needs the shared reference cases at {SHARED / 'reference'} (absent in a fresh clone)")
    env = dict(os.environ, EVALBEAM_JUDGE_API_KEY="golden-key")
    out = str(tmp_path)
    if name == "text_judge":
        from evalbeam.pipelines.judge_server import StandInServer

        with StandInServer() as server:
            done = run_evalbeam([*command(name, out, server.url), *runner], env)
    else:
        done = run_evalbeam([*command(name, out), *runner], env)
    expected = open(os.path.join(EXPECTED, name, "exit_code")).read().strip()
    assert str(done.returncode) == expected, done.stderr[-3000:]
    folder = output_folder(name, out)
    for file in KEPT:
        golden = os.path.join(EXPECTED, name, file)
        if os.path.exists(golden):
            with open(os.path.join(folder, file), encoding="utf-8") as got:
                assert normalise(got.read(), out) == open(golden, encoding="utf-8").read(), file
    golden = os.path.join(EXPECTED, name, "shuffle_elements.json")
    if os.path.exists(golden):   # run.json's meters count the same elements on every runner
        with open(os.path.join(folder, "run.json"), encoding="utf-8") as got:
            shuffles = json.load(got)["shuffles"]
        assert {stage: f["elements"] for stage, f in shuffles.items()} == \
            json.load(open(golden, encoding="utf-8"))


def check_segmentation_mask_files(tmp_path, runner, forms=("png", "npy")):
    """Masks the rows point to (PNG by a path relative to the rows' file, .npy by an absolute
    one) are read by the workers, not by the launcher."""
    sys.path.insert(0, str(ROOT / "tests" / "segmentation"))
    from test_segmentation import random_maps, write_inputs

    for form in forms:
        folder = write_inputs(tmp_path / form, random_maps(5), form)
        base = ["segmentation", "--groundtruths", folder / "groundtruths.jsonl",
                "--predictions", f"good={folder / 'good.jsonl'}", "--predictions",
                f"noisy={folder / 'noisy.jsonl'}", "--slice", "site", "--quiet"]
        direct = run_evalbeam([*base, "--output", tmp_path / f"{form}-direct"])
        cluster = run_evalbeam([*base, "--output", tmp_path / f"{form}-cluster", *runner])
        assert direct.returncode == cluster.returncode == 0, cluster.stderr[-3000:]
        for file in ("metrics.jsonl", "rejected.jsonl"):
            assert (tmp_path / f"{form}-direct" / file).read_bytes() == \
                (tmp_path / f"{form}-cluster" / file).read_bytes(), (form, file)


def check_sweep(tmp_path, runner):
    """A sweep of two tasks (a classification group and text cells) with a gate and the report:
    the same cells, leaderboard and verdicts as on the DirectRunner."""
    golden = ROOT / "tests" / "golden" / "inputs"
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f"""
[sweep]
bootstrap = 10
max_rejected_fraction = 0.2

[[dataset]]
name = "animals"
task = "classification"
groundtruths = "{golden / 'classification' / 'groundtruths.jsonl'}"
models = ["a", "b"]
options = {{ slice = ["region"] }}

[[dataset]]
name = "answers"
task = "text"
groundtruths = "{golden / 'text' / 'groundtruths.jsonl'}"
models = ["good", "bad"]

[[model]]
name = "a"
predictions = "{golden / 'classification' / 'model_a.jsonl'}"

[[model]]
name = "b"
predictions = "{golden / 'classification' / 'model_b.jsonl'}"

[[model]]
name = "good"
predictions = "{golden / 'text' / 'good.jsonl'}"

[[model]]
name = "bad"
predictions = "{golden / 'text' / 'bad.jsonl'}"

[[gate]]
metric = "Accuracy"
min = 0.8
""")
    outs = {}
    for name, extra in (("direct", []), ("cluster", runner)):
        done = run_evalbeam(["sweep", manifest, "--output", tmp_path / name, "--quiet", "--report", *extra])
        assert done.returncode == 5, done.stderr[-3000:]      # model b: accuracy 0.73
        outs[name] = tmp_path / name
    for path in ["leaderboard.jsonl", "gates.json"] + [
            f"cells/{c}/{f}" for c in ("animals/a", "animals/b", "answers/good", "answers/bad")
            for f in ("metrics.jsonl", "rejected.jsonl")] + ["cells/answers/good/scores.jsonl"]:
        direct = (outs["direct"] / path).read_text().replace(str(outs["direct"]), "OUT")
        cluster = (outs["cluster"] / path).read_text().replace(str(outs["cluster"]), "OUT")
        assert direct == cluster, path
    assert (outs["cluster"] / "report.html").stat().st_size > 100_000
