"""The portable path, as Flink (and Spark) run Python: Beam's job API with the SDK workers in a
worker pool beside the runner (`--environment_type EXTERNAL`). Here Beam's embedded job service
(`--job_endpoint embed`) plays the job server and a worker pool started by the test
(`python -m apache_beam.runners.worker.worker_pool_main`) the TaskManager's sidecar; every task
(and a sweep) must write byte for byte what the DirectRunner writes. What this catches: pickling
of every DoFn and side input, paths only the launcher can see, temp folders, the judge journal's
writers, publishing from a worker. Run alone with `python -m pytest -m portable`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from helpers import ROOT, SHARED, write_jsonl

sys.path.insert(0, str(ROOT / "tests" / "golden"))
from cases import CASES, EXPECTED, KEPT, command, needs_reference, normalise, output_folder  # noqa: E402

pytestmark = pytest.mark.portable
# one golden case per task and input form (the golden outputs are the DirectRunner's bytes)
CASES_HERE = ["classification_bootstrap", "detection_bbox", "detection_valor", "coco_segm",
              "segmentation_bootstrap", "text_judge", "retrieval", "trec_eval"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def worker_pool():
    """A Beam SDK worker pool on 127.0.0.1, from this environment; stopped after the module."""
    port = free_port()
    log = open(os.devnull, "w")
    pool = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                             f"--service_port={port}"], stdout=log, stderr=log)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if pool.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the Beam worker pool did not start")
                time.sleep(0.2)
        yield ["--runner", "PortableRunner", "--job_endpoint", "embed",
               "--environment_type", "EXTERNAL", "--environment_config", f"localhost:{port}"]
    finally:
        pool.kill()
        pool.wait(timeout=30)
        log.close()


def run_evalbeam(args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["evalbeam", *map(str, args)], capture_output=True, text=True,
                          timeout=900, env=env or dict(os.environ))


@pytest.mark.parametrize("name", CASES_HERE)
def test_every_task_writes_the_direct_runner_s_bytes(tmp_path, worker_pool, name):
    if needs_reference(name) and not (SHARED / "reference").is_dir():
        pytest.skip(f"needs the shared reference cases at {SHARED / 'reference'} (absent in a fresh clone)")
    env = dict(os.environ, EVALBEAM_JUDGE_API_KEY="golden-key")
    out = str(tmp_path)
    if name == "text_judge":
        from evalbeam.pipelines.judge_server import StandInServer

        with StandInServer() as server:
            done = run_evalbeam([*command(name, out, server.url), *worker_pool], env)
    else:
        done = run_evalbeam([*command(name, out), *worker_pool], env)
    expected = open(os.path.join(EXPECTED, name, "exit_code")).read().strip()
    assert str(done.returncode) == expected, done.stderr[-3000:]
    folder = output_folder(name, out)
    for file in KEPT:
        golden = os.path.join(EXPECTED, name, file)
        if os.path.exists(golden):
            with open(os.path.join(folder, file), encoding="utf-8") as got:
                assert normalise(got.read(), out) == open(golden, encoding="utf-8").read(), file


def test_segmentation_mask_files(tmp_path, worker_pool):
    """Masks the rows point to (PNG by a path relative to the rows' file, .npy by an absolute
    one) are read by the workers, not by the launcher."""
    sys.path.insert(0, str(ROOT / "tests" / "segmentation"))
    from test_segmentation import random_maps, write_inputs

    for form, extra in (("png", []), ("npy", [])):
        folder = write_inputs(tmp_path / form, random_maps(5), form)
        base = ["segmentation", "--groundtruths", folder / "groundtruths.jsonl",
                "--predictions", f"good={folder / 'good.jsonl'}", "--predictions",
                f"noisy={folder / 'noisy.jsonl'}", "--slice", "site", "--quiet", *extra]
        direct = run_evalbeam([*base, "--output", tmp_path / f"{form}-direct"])
        portable = run_evalbeam([*base, "--output", tmp_path / f"{form}-portable", *worker_pool])
        assert direct.returncode == portable.returncode == 0, portable.stderr[-3000:]
        for file in ("metrics.jsonl", "rejected.jsonl"):
            assert (tmp_path / f"{form}-direct" / file).read_bytes() == \
                (tmp_path / f"{form}-portable" / file).read_bytes(), (form, file)


def test_a_sweep_with_gates_and_report(tmp_path, worker_pool):
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
    for name, extra in (("direct", []), ("portable", worker_pool)):
        done = run_evalbeam(["sweep", manifest, "--output", tmp_path / name, "--quiet", "--report", *extra])
        assert done.returncode == 5, done.stderr[-3000:]      # model b: accuracy 0.73
        outs[name] = tmp_path / name
    for path in ["leaderboard.jsonl", "gates.json"] + [
            f"cells/{c}/{f}" for c in ("animals/a", "animals/b", "answers/good", "answers/bad")
            for f in ("metrics.jsonl", "rejected.jsonl")] + ["cells/answers/good/scores.jsonl"]:
        direct = (outs["direct"] / path).read_text().replace(str(outs["direct"]), "OUT")
        portable = (outs["portable"] / path).read_text().replace(str(outs["portable"]), "OUT")
        assert direct == portable, path
    assert (outs["portable"] / "report.html").stat().st_size > 100_000
