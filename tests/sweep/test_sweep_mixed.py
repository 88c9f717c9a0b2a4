"""`evalbeam sweep` over a manifest that mixes tasks: classification, detection and text with
LLM-judge metrics (against the stand-in judge server), on the small golden inputs
(tests/golden/cases.py: classification, detection_bbox, text_judge). Each cell writes what the
same run alone writes, the leaderboard has a row per (dataset, model, slice), a finished sweep
evaluates nothing and sends the judge nothing, --force replays every judge answer from the
sweep's shared journal, and the multi-process runner writes the same bytes."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from helpers import MULTIPROCESS, ROOT, read_jsonl, write_jsonl
from evalbeam.pipelines.runners.judge_server import StandInServer

INPUTS = ROOT / "tests" / "golden" / "inputs"
REJECTED = "0.2"   # the sweep's max_rejected_fraction: detection_bbox rejects 5 of 44 rows

# dataset -> (task, ground truths, the options of its golden case, as the command line gives them)
DATASETS = {
    "cls": ("classification", INPUTS / "classification" / "groundtruths.jsonl",
            ["--slice", "region", "--score_thresholds", "0.0,0.5"]),
    "det": ("detection", INPUTS / "detection" / "groundtruths.jsonl", ["--slice", "camera"]),
    "rag": ("text", INPUTS / "text" / "rag" / "groundtruths.jsonl", ["--metrics", "all"]),
}
MODELS = ("first", "second")
CELLS = [f"{d}/{m}" for d in DATASETS for m in MODELS]
JUDGE_OPTIONS = ["--judge_rpm", "100000", "--judge_concurrency", "8"]

MANIFEST = """
[sweep]
max_rejected_fraction = {rejected}

[judge]
url = "{url}"
rpm = 100000
concurrency = 8

[[dataset]]
name = "cls"
task = "classification"
groundtruths = "{inputs}/classification/groundtruths.jsonl"
options = {{ slice = ["region"], score_thresholds = [0.0, 0.5] }}

[[dataset]]
name = "det"
task = "detection"
groundtruths = "{inputs}/detection/groundtruths.jsonl"
options = {{ slice = ["camera"] }}

[[dataset]]
name = "rag"
task = "text"
groundtruths = "{inputs}/text/rag/groundtruths.jsonl"
options = {{ metrics = "all" }}

[[model]]
name = "first"
predictions = {{ cls = "{inputs}/classification/model_a.jsonl", det = "{inputs}/detection/good.jsonl", rag = "{inputs}/text/rag/alpha.jsonl" }}

[[model]]
name = "second"
predictions = {{ cls = "{inputs}/classification/model_b.jsonl", det = "{inputs}/detection/weak.jsonl", rag = "{data}/rag/second.jsonl" }}
"""


def sweep(args) -> int:
    from evalbeam.pipelines.sweep.command import run

    return run([str(a) for a in args])


def run_alone(task: str, args) -> int:
    """`evalbeam TASK ARGS` in this process (the launcher's entry, as the CLI runs it)."""
    from evalbeam.pipelines.launch.launcher import run_task
    from evalbeam.pipelines.tasks.registry import task_of

    return run_task(task_of(task), [str(a) for a in args])


def info(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def metrics_bytes(out: Path) -> dict[str, bytes]:
    return {cell: (out / "cells" / cell / "metrics.jsonl").read_bytes() for cell in CELLS}


def predictions(dataset: str, model: str, data: Path) -> Path:
    first = {"cls": INPUTS / "classification" / "model_a.jsonl", "det": INPUTS / "detection" / "good.jsonl",
             "rag": INPUTS / "text" / "rag" / "alpha.jsonl"}
    second = {"cls": INPUTS / "classification" / "model_b.jsonl", "det": INPUTS / "detection" / "weak.jsonl",
              "rag": data / "rag" / "second.jsonl"}
    return (first if model == "first" else second)[dataset]


@pytest.fixture(scope="module")
def judge():
    """The stand-in judge on 127.0.0.1, a free port, for the module's tests; stopped after."""
    with StandInServer() as server:
        yield server


@pytest.fixture(scope="module")
def data(tmp_path_factory, judge):
    """The manifest, and the text dataset's second model: the golden alpha answers, each cut to
    its first sentence (other answers, so other judge requests, than the first model's)."""
    folder = tmp_path_factory.mktemp("mixed-data")
    rows = read_jsonl(INPUTS / "text" / "rag" / "alpha.jsonl")
    for row in rows:
        row["response"] = row["response"].split(". ")[0].rstrip(".") + "."
    write_jsonl(folder / "rag" / "second.jsonl", rows)
    manifest = folder / "sweep.toml"
    manifest.write_text(MANIFEST.format(rejected=REJECTED, url=judge.url, inputs=INPUTS, data=folder))
    return folder, manifest


@pytest.fixture(scope="module")
def finished(data, judge, tmp_path_factory):
    """The in-process sweep of the 6 cells, and its cells' metrics.jsonl as first written."""
    _, manifest = data
    out = tmp_path_factory.mktemp("mixed-out") / "out"
    judge.reset_stats()
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    # both text cells asked the judge (their answers differ), and the server saw each request
    sent = [json.loads((out / "cells" / "rag" / m / "run.json").read_text())["judge"]["sent"]
            for m in MODELS]
    assert all(n > 0 for n in sent) and sum(sent) == judge.stats()["requests"]
    return out, metrics_bytes(out)


def test_every_cell_equals_its_run_alone_and_the_leaderboard_has_every_row(data, finished, judge, tmp_path):
    from evalbeam.pipelines.sweep.leaderboard import default_headlines

    folder, _ = data
    out, first = finished
    summary = info(out)
    assert summary["status"] == "complete" and summary["exit_code"] == 0
    assert summary["ran"] == 6 and summary["skipped"] == 0
    cells = {c["cell"]: c for c in summary["cells"]}
    assert sorted(cells) == sorted(CELLS)
    assert all(c["ran"] and c["status"] == "complete" for c in cells.values())
    expected_rows = set()
    for cell in CELLS:
        dataset, model = cell.split("/")
        task, groundtruths, options = DATASETS[dataset]
        prediction = predictions(dataset, model, folder)
        argv = ["--groundtruths", groundtruths, "--predictions", f"{model}={prediction}", *options,
                "--max_rejected_fraction", REJECTED]
        if task == "text":
            argv += ["--judge_url", judge.url, *JUDGE_OPTIONS]
        # the command sweep.json records is this run's (its own --output and shared journal aside)
        recorded = shlex.split(cells[cell]["command"])
        assert recorded[:2] == ["evalbeam", task]
        assert _options(recorded[2:]) == _options([str(a) for a in argv]), cell
        alone = tmp_path / "alone" / dataset / model
        journal = []
        if task == "text":
            # a copy of the sweep's journal: the run alone finds there every request it makes
            # (it sends none), so the sweep asked the judge exactly what the run alone asks
            shutil.copytree(out / "judge-journal", tmp_path / "journal" / model)
            journal = ["--judge_journal", tmp_path / "journal" / model]
        assert run_alone(task, [*argv, *journal, "--output", alone, "--quiet"]) == 0, cell
        assert first[cell] == (alone / "metrics.jsonl").read_bytes(), f"{cell}: metrics.jsonl differs"
        cell_folder = out / "cells" / cell
        assert (cell_folder / "rejected.jsonl").read_bytes() == (alone / "rejected.jsonl").read_bytes()
        if task == "text":
            assert (cell_folder / "scores.jsonl").read_bytes() == (alone / "scores.jsonl").read_bytes()
        run_json = json.loads((cell_folder / "run.json").read_text())
        assert run_json["status"] == "complete" and run_json["sweep"]["cell"] == cell
        if task == "text":
            report = json.loads((alone / "run.json").read_text())["judge"]
            assert report["sent"] == 0 and report["cached"] == report["requests"] > 0, report
            assert run_json["judge"]["requests"] == report["requests"]
        assert (cell_folder / "leaderboard_inputs.json").is_file()
        for record in read_jsonl(alone / "metrics.jsonl"):
            expected_rows.add((dataset, model, json.dumps(record["slice"], sort_keys=True)))
    # one leaderboard row per (dataset, model, slice), with its task's headline columns
    rows = read_jsonl(out / "leaderboard.jsonl")
    keys = [(r["dataset"], r["model"], json.dumps(r["slice"], sort_keys=True)) for r in rows]
    assert len(keys) == len(set(keys)) and set(keys) == expected_rows
    assert {k[2] for k in keys if k[0] == "cls"} == {"{}"} | {json.dumps({"region": r}) for r in
                                                          ("east", "north", "south", "west")}
    assert {k[2] for k in keys if k[0] == "det"} == {"{}", '{"camera": "a"}', '{"camera": "b"}'}
    assert {k[2] for k in keys if k[0] == "rag"} == {"{}"}
    for row in rows:
        task = DATASETS[row["dataset"]][0]
        assert row["task"] == task and row["cell"] == f"{row['dataset']}/{row['model']}"
        specs = default_headlines(task)
        named = {next((s for s in specs if c == s or c.startswith(s + "{")), None) for c in row["metrics"]}
        assert None not in named, (row["dataset"], sorted(row["metrics"]))
        if row["slice"] == {}:
            # every headline the task computes here: classification's Accuracy at both thresholds
            assert named == set(specs), (row["dataset"], sorted(row["metrics"]))
            assert row["comparable"] and row["rank"] in (1, 2)
        if task == "classification":
            assert len([c for c in row["metrics"] if c.startswith("Accuracy")]) == 2
    for dataset in DATASETS:
        top = [r for r in rows if r["dataset"] == dataset and r["slice"] == {}]
        assert sorted(r["model"] for r in top) == list(MODELS)
        assert len({r["datum_fingerprint"] for r in top}) == 1
    csv_lines = (out / "leaderboard.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(rows)


def _options(argv: list[str]) -> dict:
    """A command line's options as {option: [values]}, without those that say only where a run
    writes (--output, --judge_journal), how it runs (--quiet, --judge_skip_check) or its shards."""
    out: dict[str, list] = {}
    i = 0
    while i < len(argv):
        name = argv[i]
        assert name.startswith("--"), argv
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 2
        else:
            value, i = None, i + 1
        if name in ("--output", "--judge_journal", "--quiet", "--judge_skip_check", "--num_shards"):
            continue
        out.setdefault(name, []).append(value)
    return out


def test_finished_sweep_reruns_nothing_and_force_replays_the_judge_journal(data, finished, judge):
    _, manifest = data
    out, first = finished
    leaderboard = (out / "leaderboard.jsonl").read_bytes()
    judge.reset_stats()
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    summary = info(out)
    assert summary["status"] == "complete" and summary["ran"] == 0 and summary["skipped"] == 6
    assert not any(c["ran"] for c in summary["cells"]) and {c["why"] for c in summary["cells"]} == {"done"}
    assert judge.stats()["requests"] == 0
    assert (out / "leaderboard.jsonl").read_bytes() == leaderboard
    assert metrics_bytes(out) == first

    assert sweep([manifest, "--output", out, "--quiet", "--force"]) == 0
    summary = info(out)
    assert summary["status"] == "complete" and summary["ran"] == 6
    assert all(c["ran"] and c["status"] == "complete" for c in summary["cells"])
    # every judge answer came from the sweep's shared journal
    assert judge.stats()["requests"] == 0
    for model in MODELS:
        run_json = json.loads((out / "cells" / "rag" / model / "run.json").read_text())
        report = run_json["judge"]
        assert report["sent"] == 0 and report["requests"] > 0, report
        assert report["cached"] + report.get("shared", 0) == report["requests"], report
        assert run_json["options"]["judge"]["journal"] == str(out / "judge-journal")
    assert (out / "judge-journal").is_dir()
    assert metrics_bytes(out) == first
    assert (out / "leaderboard.jsonl").read_bytes() == leaderboard


@pytest.mark.multiprocess
def test_multi_process_sweep_equals_in_process(data, finished, judge, tmp_path):
    _, manifest = data
    done, first = finished
    out = tmp_path / "out"
    # the judge's answers from the in-process sweep's journal (asking the stand-in again would
    # only add time): the worker processes read the shared journal and send nothing
    shutil.copytree(done / "judge-journal", out / "judge-journal")
    judge.reset_stats()
    assert sweep([manifest, "--output", out, "--quiet", *MULTIPROCESS]) == 0
    summary = info(out)
    assert summary["status"] == "complete" and summary["ran"] == 6
    assert metrics_bytes(out) == first
    assert judge.stats()["requests"] == 0
    for model in MODELS:
        run_json = json.loads((out / "cells" / "rag" / model / "run.json").read_text())
        assert run_json["judge"]["sent"] == 0 and run_json["judge"]["requests"] > 0


def test_judge_limits_of_a_multi_process_sweep_are_shared_by_its_workers(data, tmp_path):
    """A judged cell on 2 workers is set up as `evalbeam text ... --direct_num_workers 2` is."""
    import argparse
    import time

    from evalbeam.pipelines.sweep.plan import plan_cells
    from evalbeam.pipelines.sweep.manifest import load

    _, manifest = data
    plans = plan_cells(load(str(manifest)), str(tmp_path / "out"), list(MULTIPROCESS),
                       argparse.Namespace(num_shards=None), time.time())
    judged = [p for p in plans if p.cell.task == "text"]
    assert len(judged) == 2
    for plan in judged:
        assert plan.config.judge_settings.workers == 2, plan.cell.id


def test_a_finished_sweep_reruns_with_the_judge_down(tmp_path, capsys):
    """The endpoint is checked only when a judge cell will run: a finished sweep and a dry run
    need no judge; a forced rerun does, and stops at once when it is down."""
    manifest = tmp_path / "sweep.toml"
    out = tmp_path / "out"
    with StandInServer() as server:
        manifest.write_text(f"""
[judge]
url = "{server.url}"

[[dataset]]
name = "rag"
task = "text"
groundtruths = "{INPUTS}/text/rag/groundtruths.jsonl"
options = {{ metrics = "Faithfulness" }}

[[model]]
name = "first"
predictions = "{INPUTS}/text/rag/alpha.jsonl"
""")
        assert sweep([manifest, "--output", out, "--quiet"]) == 0
        assert server.stats()["requests"] > 0
    before = (out / "cells" / "rag" / "first" / "metrics.jsonl").read_bytes()
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    assert info(out)["ran"] == 0
    assert sweep([manifest, "--output", out, "--dry_run"]) == 0
    capsys.readouterr()
    assert sweep([manifest, "--output", out, "--quiet", "--force"]) == 2
    assert "judge" in capsys.readouterr().err
    assert (out / "cells" / "rag" / "first" / "metrics.jsonl").read_bytes() == before
    assert info(out)["ran"] == 0
