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
        from evalbeam.pipelines.runners.judge_server import StandInServer

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


def shared_once(tmp_path, key: str, make):
    """The folder where make(folder) ran, once per test run whichever test asks first: the
    DirectRunner halves the portable and Dask tests both compare with (the pytest-xdist workers
    of a run share pytest's base folder, and a lock file orders them)."""
    import fcntl
    import shutil

    base = tmp_path.parent.parent if os.environ.get("PYTEST_XDIST_WORKER") else tmp_path.parent
    root = base / "direct-runs"
    root.mkdir(exist_ok=True)
    folder = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".done").touch()
    return folder


def check_segmentation_mask_files(tmp_path, runner, forms=("png", "npy")):
    """Masks the rows point to (PNG by a path relative to the rows' file, .npy by an absolute
    one) are read by the workers, not by the launcher."""
    sys.path.insert(0, str(ROOT / "tests" / "segmentation"))
    from test_segmentation import random_maps, write_inputs

    def base(folder):
        return ["segmentation", "--groundtruths", folder / "groundtruths.jsonl",
                "--predictions", f"good={folder / 'good.jsonl'}", "--predictions",
                f"noisy={folder / 'noisy.jsonl'}", "--slice", "site", "--quiet"]

    for form in forms:
        def direct_run(shared, form=form):
            write_inputs(shared / "inputs", random_maps(5), form)
            done = run_evalbeam([*base(shared / "inputs"), "--output", shared / "out"])
            assert done.returncode == 0, done.stderr[-3000:]

        shared = shared_once(tmp_path, f"segmentation-{form}", direct_run)
        cluster = run_evalbeam([*base(shared / "inputs"), "--output", tmp_path / f"{form}-cluster", *runner])
        assert cluster.returncode == 0, cluster.stderr[-3000:]
        for file in ("metrics.jsonl", "rejected.jsonl"):
            assert (shared / "out" / file).read_bytes() == \
                (tmp_path / f"{form}-cluster" / file).read_bytes(), (form, file)


def check_sweep(tmp_path, runner):
    """A sweep of two tasks (a classification group and text cells) with a gate and the report:
    the same cells, leaderboard and verdicts as on the DirectRunner."""
    golden = ROOT / "tests" / "golden" / "inputs"
    manifest_text = f"""
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
"""

    def sweep(manifest, out, *extra):
        done = run_evalbeam(["sweep", manifest, "--output", out, "--quiet", "--report", *extra])
        assert done.returncode == 5, done.stderr[-3000:]      # model b: accuracy 0.73

    def direct_run(shared):
        (shared / "sweep.toml").write_text(manifest_text)
        sweep(shared / "sweep.toml", shared / "direct")

    shared = shared_once(tmp_path, "sweep", direct_run)
    sweep(shared / "sweep.toml", tmp_path / "cluster", *runner)
    outs = {"direct": shared / "direct", "cluster": tmp_path / "cluster"}
    for path in ["leaderboard.jsonl", "gates.json"] + [
            f"cells/{c}/{f}" for c in ("animals/a", "animals/b", "answers/good", "answers/bad")
            for f in ("metrics.jsonl", "rejected.jsonl")] + ["cells/answers/good/scores.jsonl"]:
        direct = (outs["direct"] / path).read_text().replace(str(outs["direct"]), "OUT")
        cluster = (outs["cluster"] / path).read_text().replace(str(outs["cluster"]), "OUT")
        assert direct == cluster, path
    assert (outs["cluster"] / "report.html").stat().st_size > 100_000


def check_coco_pieces(tmp_path, runner):
    """COCO files cut into pieces (--input_split_bytes 2000: tens of them; a results file's array
    and an instances file's annotations) that the workers parse, with bad rows, tied scores and
    tied ground truths on both sides of the cuts: the DirectRunner's bytes of the files read
    whole."""
    sys.path.insert(0, str(ROOT / "tests" / "detection"))
    from test_coco_pieces import write_case

    def base(folder):
        return ["detection", "--groundtruths", folder / "instances.json", "--predictions",
                f"m={folder / 'results.json'}", "--quiet", "--max_rejected_fraction", "0.5"]

    def direct_run(shared):
        write_case(shared / "inputs", 5, "bbox")
        done = run_evalbeam([*base(shared / "inputs"), "--output", shared / "out",
                             "--input_split_bytes", "0"])
        assert done.returncode == 0, done.stderr[-3000:]

    shared = shared_once(tmp_path, "coco-pieces", direct_run)
    cluster = run_evalbeam([*base(shared / "inputs"), "--output", tmp_path / "cluster",
                            "--input_split_bytes", "2000", *runner])
    assert cluster.returncode == 0, cluster.stderr[-3000:]
    for file in ("metrics.jsonl", "rejected.jsonl"):
        assert (shared / "out" / file).read_bytes() == (tmp_path / "cluster" / file).read_bytes(), file
    shuffles = json.loads((tmp_path / "cluster" / "run.json").read_text())["shuffles"]
    assert shuffles["GroupByShard"]["elements"] > 10     # it was read in pieces
