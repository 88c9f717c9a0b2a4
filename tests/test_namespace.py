"""The installed import names are evalbeam.pipelines, evalbeam.transforms and evalbeam.schemas:
a user's folder holding its own transforms.py, schemas.py and pipelines.py (common names in ML
projects, and packages on PyPI) changes nothing for the CLI, `python -m` or a user's pipeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import MULTIPROCESS, write_jsonl

USER_PIPELINE = '''
import sys
import apache_beam as beam
import transforms, schemas, pipelines          # the user's own modules, imported first
assert transforms.MINE and schemas.MINE and pipelines.MINE
from evalbeam.pipelines.launch.common import local_pipeline
from evalbeam.transforms.classification import EvaluateClassification
from evalbeam.transforms.kernels.classification import ClassificationConfig

gts = [{"datum_uid": u, "labels": [{"key": "k", "value": v}]} for u, v in (("a", "x"), ("b", "y"))]
pds = [{"datum_uid": u, "labels": [{"key": "k", "value": "x", "score": s},
                                   {"key": "k", "value": "y", "score": 1 - s}]} for u, s in (("a", .9), ("b", .8))]
with local_pipeline(sys.argv[1:]) as p:
    records = ({"groundtruths": p | "G" >> beam.Create(gts), "m": p | "P" >> beam.Create(pds)}
               | EvaluateClassification(ClassificationConfig(metrics=frozenset({"Accuracy"}))))
    _ = (records | beam.Map(lambda r: f"RECORD {r['type']} {r['value']}")
         | beam.io.WriteToText("records", shard_name_template=""))
'''


@pytest.fixture()
def user_folder(tmp_path):
    for name in ("transforms", "schemas", "pipelines"):
        (tmp_path / f"{name}.py").write_text("MINE = True\n")
    write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": u, "labels": [{"key": "k", "value": v}]}
                                        for u, v in (("a", "x"), ("b", "y"))])
    write_jsonl(tmp_path / "m.jsonl", [{"datum_uid": u, "labels": [{"key": "k", "value": "x", "score": s},
                                                                   {"key": "k", "value": "y", "score": 1 - s}]}
                                       for u, s in (("a", 0.9), ("b", 0.2))])
    (tmp_path / "user_pipeline.py").write_text(USER_PIPELINE)
    return tmp_path


def run_in(folder, command):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, env=env, timeout=300)


def accuracy(folder) -> float:
    with open(folder / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if '"Accuracy"' in line][0]["value"]


@pytest.mark.parametrize("how", ["cli", "module"])
def test_cli_and_python_m_beside_the_users_modules(user_folder, how):
    base = ["evalbeam"] if how == "cli" else [sys.executable, "-m", "evalbeam.pipelines.tasks.classification"]
    if how == "cli":
        base.append("classification")
    done = run_in(user_folder, [*base, "--groundtruths", "gt.jsonl", "--predictions", "m=m.jsonl",
                                "--output", "out", "--quiet"])
    assert done.returncode == 0, done.stderr
    assert accuracy(user_folder / "out") == 1.0


@pytest.mark.multiprocess
def test_cli_on_two_worker_processes_beside_the_users_modules(user_folder):
    done = run_in(user_folder, ["evalbeam", "classification", "--groundtruths", "gt.jsonl",
                                "--predictions", "m=m.jsonl", "--output", "out", "--quiet", *MULTIPROCESS])
    assert done.returncode == 0, done.stderr
    assert accuracy(user_folder / "out") == 1.0


@pytest.mark.parametrize("beam_args", [[], MULTIPROCESS], ids=["in_process", "multi_process"])
def test_users_pipeline_imports_the_ptransforms(user_folder, beam_args):
    done = run_in(user_folder, [sys.executable, "user_pipeline.py", *beam_args])
    assert done.returncode == 0, done.stderr
    assert "RECORD Accuracy 0.5" in (user_folder / "records").read_text()
