"""`evalbeam sweep` on classification cells: each cell equals its run alone, the leaderboard's
comparisons equal --compare_to's, reruns skip what is done, a killed sweep resumes with exactly
its unfinished cells, a changed input reruns exactly its cells, a broken cell fails alone."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import MULTIPROCESS, ROOT, read_jsonl, run_classification, write_jsonl

LABELS = ["cat", "dog", "bird"]
MODELS = {"good": 0.9, "fair": 0.75, "poor": 0.55}


def make_data(folder: Path, datasets=("alpha", "beta"), n=240, seed=0):
    """Per dataset a ground truth with a region and one predictions file per model."""
    rng = random.Random(seed)
    for d in datasets:
        truth = [rng.choice(LABELS) for _ in range(n)]
        write_jsonl(folder / d / "gt.jsonl", [
            {"datum_uid": f"{d}-{i:04d}", "labels": [{"key": "class", "value": v}],
             "metadata": {"region": rng.choice(["eu", "us"])}} for i, v in enumerate(truth)])
        for model, accuracy in MODELS.items():
            rows = []
            for i, v in enumerate(truth):
                top = v if rng.random() < accuracy else rng.choice(LABELS)
                scores = {x: round(rng.uniform(0.0, 0.3), 3) for x in LABELS}
                scores[top] = round(rng.uniform(0.5, 1.0), 3)
                rows.append({"datum_uid": f"{d}-{i:04d}",
                             "labels": [{"key": "class", "value": x, "score": s} for x, s in scores.items()]})
            rng.shuffle(rows)   # input order must not matter
            write_jsonl(folder / d / f"{model}.jsonl", rows)


MANIFEST = """
[sweep]
bootstrap = {bootstrap}
{extra}

[[dataset]]
name = "alpha"
task = "classification"
groundtruths = "{root}/{{dataset}}/gt.jsonl"
options = {{ slice = ["region"], score_thresholds = [0.0, 0.5] }}

[[dataset]]
name = "beta"
task = "classification"
groundtruths = "{root}/{{dataset}}/gt.jsonl"

[[model]]
name = "good"
predictions = "{root}/{{dataset}}/good.jsonl"

[[model]]
name = "fair"
predictions = "{root}/{{dataset}}/fair.jsonl"

[[model]]
name = "poor"
predictions = {{ alpha = "{root}/alpha/poor.jsonl", beta = "{root}/beta/poor.jsonl" }}
"""


def write_manifest(folder: Path, bootstrap=100, extra="") -> str:
    path = folder / "sweep.toml"
    path.write_text(MANIFEST.format(root=folder, bootstrap=bootstrap, extra=extra))
    return str(path)


def sweep(args) -> int:
    from evalbeam.pipelines.sweep.command import run

    return run([str(a) for a in args])


def info(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def ran(out: Path) -> set[str]:
    return {c["cell"] for c in info(out)["cells"] if c["ran"]}


CELLS = {f"{d}/{m}" for d in ("alpha", "beta") for m in MODELS}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep-data")
    make_data(folder)
    return folder


@pytest.fixture(scope="module")
def finished(data, tmp_path_factory):
    """A finished sweep of the 6 cells with 100 replicates."""
    out = tmp_path_factory.mktemp("sweep-out") / "out"
    assert sweep([write_manifest(data), "--output", out, "--quiet"]) == 0
    return out


def test_every_cell_equals_its_run_alone(data, finished, tmp_path):
    assert info(finished)["status"] == "complete" and ran(finished) == CELLS
    for d, options in (("alpha", ["--slice", "region", "--score_thresholds", "0.0,0.5"]), ("beta", [])):
        for model in MODELS:
            alone = tmp_path / d / model
            assert run_classification(
                ["--groundtruths", data / d / "gt.jsonl", "--predictions", f"{model}={data / d / model}.jsonl",
                 "--output", alone, "--bootstrap", "100", "--quiet", *options]) == 0
            cell = finished / "cells" / d / model
            assert (cell / "metrics.jsonl").read_bytes() == (alone / "metrics.jsonl").read_bytes()
            assert (cell / "rejected.jsonl").read_bytes() == (alone / "rejected.jsonl").read_bytes()
            run_json = json.loads((cell / "run.json").read_text())
            assert run_json["status"] == "complete" and run_json["sweep"]["cell"] == f"{d}/{model}"


def test_leaderboard_ranks_and_comparisons_equal_compare_to(data, finished, tmp_path):
    rows = read_jsonl(finished / "leaderboard.jsonl")
    # one row per (dataset, model, slice): alpha has (all) + eu + us, beta (all)
    assert len(rows) == 3 * 3 + 3
    top = [r for r in rows if r["dataset"] == "alpha" and r["slice"] == {}]
    assert [r["model"] for r in sorted(top, key=lambda r: r["rank"])] == ["good", "fair", "poor"]
    assert len({r["datum_fingerprint"] for r in top}) == 1 and all(r["comparable"] for r in top)
    assert all(r["datums"] == 240 for r in top)
    # the same comparison made inside one run with --compare_to
    alone = tmp_path / "together"
    assert run_classification(
        ["--groundtruths", data / "alpha" / "gt.jsonl", "--predictions", f"good={data}/alpha/good.jsonl",
         "--predictions", f"fair={data}/alpha/fair.jsonl", "--compare_to", "good",
         "--slice", "region", "--score_thresholds", "0.0,0.5",
         "--output", alone, "--bootstrap", "100", "--quiet"]) == 0
    together = [r for r in read_jsonl(alone / "metrics.jsonl") if r["type"] == "Comparison"
                and r["parameters"]["metric"] == "Accuracy" and r["slice"] == {}
                and r["parameters"]["metric_parameters"]["score_threshold"] == 0.0]
    fair = next(r for r in top if r["model"] == "fair")
    columns = [c for c in fair["metrics"] if c.startswith("Accuracy")]
    assert len(columns) == 2   # two thresholds: two Accuracy columns
    column = next(c for c in columns if '"score_threshold":0.0' in c)
    comparison = fair["metrics"][column]["comparison"]
    assert comparison["against"] == "good"
    assert comparison["difference"] == pytest.approx(together[0]["value"], abs=1e-15)
    assert comparison["interval"]["low"] == together[0]["interval"]["low"]
    assert comparison["interval"]["high"] == together[0]["interval"]["high"]
    assert 0.0 <= comparison["p_value_adjusted"] <= 1.0
    csv_lines = (finished / "leaderboard.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(rows) and csv_lines[0].startswith("dataset,task,slice,model,rank")


def test_rerun_evaluates_nothing_and_force_reruns_all(data, finished):
    before = (finished / "leaderboard.jsonl").read_bytes()
    started = time.time()
    assert sweep([write_manifest(data), "--output", finished, "--quiet"]) == 0
    assert ran(finished) == set() and info(finished)["skipped"] == 6
    assert (finished / "leaderboard.jsonl").read_bytes() == before
    assert time.time() - started < 10
    assert sweep([write_manifest(data), "--output", finished, "--quiet", "--force"]) == 0
    assert ran(finished) == CELLS
    assert (finished / "leaderboard.jsonl").read_bytes() == before


def test_changed_input_reruns_exactly_its_cells(data, tmp_path):
    local = tmp_path / "data"
    shutil.copytree(data, local)
    out = tmp_path / "out"
    manifest = write_manifest(local, bootstrap=0)
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    lines = (local / "beta" / "fair.jsonl").read_text().splitlines(keepends=True)
    (local / "beta" / "fair.jsonl").write_text("".join(reversed(lines)))   # new content, same rows
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    assert ran(out) == {"beta/fair"}
    (local / "alpha" / "gt.jsonl").write_text((local / "alpha" / "gt.jsonl").read_text() + "\n")
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    assert ran(out) == {"alpha/good", "alpha/fair", "alpha/poor"}
    # an option of one dataset reruns that dataset's cells only
    text = Path(manifest).read_text().replace('groundtruths = "' + str(local) + '/{dataset}/gt.jsonl"\n\n[[model]]',
                                              'groundtruths = "' + str(local) + '/{dataset}/gt.jsonl"\noptions = { hardmax = false }\n\n[[model]]', 1)
    Path(manifest).write_text(text)
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    assert ran(out) == {"beta/good", "beta/fair", "beta/poor"}


def test_sweep_reads_every_input_file_once(data, tmp_path, monkeypatch):
    """A dataset's cells with equal options are one graph that reads its files together; a
    cell with options of its own is a graph of its own, and the ground truth it shares with
    the others is read once for both (transforms.io.ReadFiles under share_reads)."""
    from evalbeam.pipelines.launch.common import local_pipeline
    from evalbeam.pipelines.sweep.plan import plan_cells
    from evalbeam.pipelines.sweep.running import _add_cells
    from evalbeam.pipelines.sweep.manifest import load
    from evalbeam.transforms.io import ReadFiles

    import argparse

    reads = []
    original = ReadFiles._read

    def recorded(self, pbegin, sources, reader, suffix):
        reads.append(sorted(f for source in sources.values() for f in source.files))
        return original(self, pbegin, sources, reader, suffix)

    monkeypatch.setattr(ReadFiles, "_read", recorded)
    manifest = write_manifest(data, bootstrap=0, extra="""
[[cell]]
dataset = "alpha"
model = "poor"
options = { hardmax = false }""")
    plans = plan_cells(load(manifest), str(tmp_path / "out"), [], argparse.Namespace(num_shards=None),
                       time.time())
    _add_cells(local_pipeline(), plans, time.time(), sidecars=True)
    files = [f for read in reads for f in read]
    assert sorted(files) == sorted(str(data / d / f"{n}.jsonl") for d in ("alpha", "beta")
                                   for n in ("gt", *MODELS))   # every file read exactly once
    alpha = str(data / "alpha" / "gt.jsonl")
    assert [alpha] in reads        # shared by alpha's group and alpha/poor: read on its own
    beta = next(r for r in reads if str(data / "beta" / "gt.jsonl") in r)
    assert len(beta) == 4          # beta's four files, one graph: read together


def test_killed_sweep_resumes_with_its_unfinished_cells(data, finished, tmp_path):
    out = tmp_path / "out"
    manifest = write_manifest(data)
    process = subprocess.Popen([sys.executable, "-m", "evalbeam.pipelines.cli", "sweep", manifest,
                                "--output", str(out), "--quiet"], cwd=str(ROOT),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    try:
        while time.time() < deadline and process.poll() is None:
            done = [c for c in CELLS if _status(out / "cells" / c) == "complete"]
            if done:
                break
            time.sleep(0.02)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    unfinished = {c for c in CELLS if _status(out / "cells" / c) != "complete"}
    assert not (out / "leaderboard.jsonl").exists() or info(out)["status"] != "running"
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    assert ran(out) == unfinished
    for cell in CELLS:
        assert (out / "cells" / cell / "metrics.jsonl").read_bytes() == \
            (finished / "cells" / cell / "metrics.jsonl").read_bytes()
    assert (out / "leaderboard.jsonl").read_bytes() == (finished / "leaderboard.jsonl").read_bytes()
    # no temporary folder is left anywhere: the cells that ran removed theirs, and the sweep
    # removed those of done cells killed between publishing and removing it
    assert not list(out.rglob(".evalbeam-tmp-*"))


# Runs a sweep that dies (os._exit: no cleanup runs, as with kill -9) at one step of publishing:
# argv = point, DIR, then the sweep's arguments.
KILLED_AT = r"""
import os, sys

from apache_beam.io.filesystems import FileSystems

point, out, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
if point == "published":            # a run.json (a cell's) or sweep.json written, then killed
    from evalbeam.transforms.outputs import OutputFolder

    OutputFolder.cleanup = lambda self: os._exit(9)
elif point == "gates_written":      # killed while gates.json is written (before its rename)
    real_replace = os.replace

    def replace(src, dst, **kwargs):
        if str(dst).endswith("gates.json"):
            os._exit(9)
        return real_replace(src, dst, **kwargs)

    os.replace = replace
elif point == "leaderboard_moved":  # killed just after leaderboard.jsonl is moved into DIR
    target = os.path.join(out, "leaderboard.jsonl")
    real_rename = FileSystems.rename

    def rename(sources, destinations):
        if target in destinations:
            i = destinations.index(target)
            real_rename(sources[i:i + 1], destinations[i:i + 1])
            os._exit(9)
        return real_rename(sources, destinations)

    FileSystems.rename = rename
elif point == "all_moved":          # every file in place, killed before sweep.json's status
    from evalbeam.pipelines.sweep import folder

    real_write = folder.write_sweep_json

    def write(output, info):
        if info["status"] != "running":
            os._exit(9)
        real_write(output, info)

    folder.write_sweep_json = write
from evalbeam.pipelines.sweep.command import run

sys.exit(run(argv))
"""


def _killed_at(point: str, out: Path, args: list) -> None:
    process = subprocess.run([sys.executable, "-c", KILLED_AT, point, str(out), *map(str, args),
                              "--output", str(out), "--quiet"], cwd=str(ROOT),
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 9, process.stderr[-2000:]


@pytest.mark.multiprocess
def test_a_cell_killed_after_publishing_leaves_no_temporary_folder(data, finished, tmp_path):
    """A cell killed after its final run.json was written and before its temporary folder was
    removed is done: the resumed sweep skips it, and used to keep its .evalbeam-tmp-* folder for
    good (only --force removed it). The resumed sweep (here on the multi-process runner) now
    removes it, as it is marked as evalbeam's."""
    out = tmp_path / "out"
    manifest = write_manifest(data)
    _killed_at("published", out, [manifest])
    done = {c for c in CELLS if _status(out / "cells" / c) == "complete"}
    assert len(done) == 1                                    # the first cell to publish
    assert list((out / "cells" / next(iter(done))).glob(".evalbeam-tmp-*"))
    assert sweep([manifest, "--output", out, "--quiet", *MULTIPROCESS]) == 0
    assert ran(out) == CELLS - done
    assert not list(out.rglob(".evalbeam-tmp-*"))
    for cell in CELLS:
        assert (out / "cells" / cell / "metrics.jsonl").read_bytes() == \
            (finished / "cells" / cell / "metrics.jsonl").read_bytes()
    assert (out / "leaderboard.jsonl").read_bytes() == (finished / "leaderboard.jsonl").read_bytes()


@pytest.mark.parametrize("point", ["gates_written", "leaderboard_moved", "all_moved", "published"])
def test_a_sweep_killed_while_it_publishes(data, finished, tmp_path, point):
    """sweep.json's status is written last: a sweep killed at any step of publishing leaves a
    sweep.json that says "running" (whatever leaderboard files stand beside it) or the whole
    set; run again, it publishes the whole set and leaves nothing else in DIR (a killed write's
    partial file, a temporary folder)."""
    out = tmp_path / "out"
    shutil.copytree(finished, out)            # every cell done: the rerun only publishes
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmin = 0.0\n')
    args = [write_manifest(data), "--gates", gates]
    names = {"leaderboard.jsonl", "leaderboard.csv", "gates.json"}
    _killed_at(point, out, args)
    status = info(out)["status"]
    if point == "published":
        assert status == "complete" and names <= set(os.listdir(out))
    else:
        assert status == "running"
    if point == "leaderboard_moved":          # the state the sweep can be killed in: said so
        assert (out / "leaderboard.jsonl").exists() and not (out / "leaderboard.csv").exists()
    assert sweep([*args, "--output", out, "--quiet"]) == 0
    assert info(out)["status"] == "complete" and ran(out) == set()
    assert set(os.listdir(out)) == names | {"sweep.json", "cells"}
    assert not list(out.rglob(".evalbeam-tmp-*"))
    for name in ("leaderboard.jsonl", "leaderboard.csv"):
        assert (out / name).read_bytes() == (finished / name).read_bytes()
    assert json.loads((out / "gates.json").read_text())["results"]


def _status(folder: Path):
    try:
        return json.loads((folder / "run.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def test_a_truncated_input_stops_the_sweep_before_it_runs(data, tmp_path, capsys):
    local = tmp_path / "data"
    shutil.copytree(data, local)
    import gzip

    blob = gzip.compress((local / "beta" / "poor.jsonl").read_bytes())
    (local / "beta" / "poor.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    manifest = Path(write_manifest(local, bootstrap=0))
    manifest.write_text(manifest.read_text().replace(f'beta = "{local}/beta/poor.jsonl"',
                                                     f'beta = "{local}/beta/poor.jsonl.gz"'))
    assert sweep([manifest, "--output", tmp_path / "out", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cell beta/poor (manifest line" in err and "cut short" in err
    assert not (tmp_path / "out").exists()


def test_a_broken_cell_fails_alone(data, tmp_path, monkeypatch):
    from evalbeam.transforms.classification import MatchClassification

    original = MatchClassification.process

    def broken(self, element, *args, **kwargs):   # a bug that strikes one cell only
        if any("beta/poor" in path for paths in self.files.values() for path in paths):
            raise RuntimeError("injected failure")
        yield from original(self, element, *args, **kwargs)

    monkeypatch.setattr(MatchClassification, "process", broken)
    out = tmp_path / "out"
    manifest = write_manifest(data, bootstrap=0)
    assert sweep([manifest, "--output", out, "--quiet"]) == 3
    cells = {c["cell"]: c for c in info(out)["cells"]}
    assert cells["beta/poor"]["status"] == "failed" and "injected failure" in cells["beta/poor"]["error"]
    assert not (out / "cells" / "beta" / "poor" / "metrics.jsonl").exists()
    assert json.loads((out / "cells" / "beta" / "poor" / "run.json").read_text())["status"] == "failed"
    assert all(c["status"] == "complete" for name, c in cells.items() if name != "beta/poor")
    assert info(out)["status"] == "failed" and info(out)["exit_code"] == 3
    assert {r["cell"] for r in read_jsonl(out / "leaderboard.jsonl")} == CELLS - {"beta/poor"}
    # fixed: the rerun runs the broken cell only
    monkeypatch.setattr(MatchClassification, "process", original)
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    assert ran(out) == {"beta/poor"}
    assert {r["cell"] for r in read_jsonl(out / "leaderboard.jsonl")} == CELLS


def test_rejections_fail_their_cell_only(data, tmp_path):
    local = tmp_path / "data"
    shutil.copytree(data, local)
    with open(local / "alpha" / "fair.jsonl", "a") as stream:
        stream.write("{not json\n")
    out = tmp_path / "out"
    assert sweep([write_manifest(local, bootstrap=0), "--output", out, "--quiet"]) == 1
    cells = {c["cell"]: c for c in info(out)["cells"]}
    assert cells["alpha/fair"]["status"] == "complete_with_rejections"
    assert cells["alpha/fair"]["counts"]["rows_rejected"] == 1
    assert sum(c["status"] == "complete" for c in cells.values()) == 5
    rejected = read_jsonl(out / "cells" / "alpha" / "fair" / "rejected.jsonl")
    assert len(rejected) == 1 and rejected[0]["source"] == "fair" and rejected[0]["line"] == 241
    # allowed in the manifest: every cell complete, exit 0
    assert sweep([write_manifest(local, bootstrap=0, extra="max_rejected_fraction = 0.01"),
                  "--output", out, "--quiet"]) == 0


def test_dry_run_lists_cells_and_writes_nothing(data, finished, tmp_path, capsys):
    out = tmp_path / "fresh"
    assert sweep([write_manifest(data), "--output", out, "--dry_run"]) == 0
    assert not out.exists()
    text = capsys.readouterr().out
    assert "6 of 6 cell(s) would run" in text and "alpha/good" in text
    before = (finished / "sweep.json").read_bytes()
    assert sweep([write_manifest(data), "--output", finished, "--dry_run"]) == 0
    assert "0 of 6 cell(s) would run" in capsys.readouterr().out
    assert (finished / "sweep.json").read_bytes() == before


# The sweep on the multi-process runner: tests/sweep/test_sweep_mixed.py (every task kind).


def test_models_of_one_graph_do_not_change_each_other(tmp_path):
    """Cells of a dataset run as one multi-model graph (pipelines/sweep/cells.py): a model that
    predicts values and a key no other model (nor the ground truth) has must change none of the
    other cells' records, intervals or problems; each cell still equals its run alone."""
    import argparse

    from evalbeam.pipelines.sweep.plan import plan_cells
    from evalbeam.pipelines.sweep.cells import groups_of
    from evalbeam.pipelines.sweep.manifest import load

    rng = random.Random(7)
    truth = [rng.choice(LABELS) for _ in range(150)]
    write_jsonl(tmp_path / "d" / "gt.jsonl", [
        {"datum_uid": f"u{i}", "labels": [{"key": "class", "value": v}]} for i, v in enumerate(truth)])
    wild_values = LABELS + ["fox", "owl"]
    rows = {"tame": [], "wild": []}
    for i, v in enumerate(truth):
        rows["tame"].append({"datum_uid": f"u{i}", "labels": [
            {"key": "class", "value": x, "score": round(rng.random(), 2)} for x in LABELS]})
        labels = [{"key": "class", "value": x, "score": round(rng.random(), 2)} for x in wild_values]
        labels.append({"key": "mood", "value": rng.choice(["calm", "wild"]), "score": 0.5})
        if i % 5:   # some datums without a prediction
            rows["wild"].append({"datum_uid": f"u{i}", "labels": labels})
    for name, model_rows in rows.items():
        write_jsonl(tmp_path / "d" / f"{name}.jsonl", model_rows)
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f"""
[sweep]
bootstrap = 50

[[dataset]]
name = "d"
task = "classification"
groundtruths = "{tmp_path}/d/gt.jsonl"
options = {{ calibration_bins = 5, score_thresholds = [0.0, 0.6] }}

[[model]]
name = "tame"
predictions = "{tmp_path}/d/tame.jsonl"

[[model]]
name = "wild"
predictions = "{tmp_path}/d/wild.jsonl"
""")
    out = tmp_path / "out"
    plans = plan_cells(load(str(manifest)), str(out), [], argparse.Namespace(num_shards=None), time.time())
    assert [len(group) for group in groups_of(plans)] == [2]   # one graph for both cells
    assert sweep([manifest, "--output", out, "--quiet"]) == 0
    for model in rows:
        alone = tmp_path / "alone" / model
        assert run_classification(
            ["--groundtruths", tmp_path / "d" / "gt.jsonl", "--predictions",
             f"{model}={tmp_path}/d/{model}.jsonl", "--output", alone, "--bootstrap", "50",
             "--calibration_bins", "5", "--score_thresholds", "0.0,0.6", "--quiet"]) == 0
        cell = out / "cells" / "d" / model
        assert (cell / "metrics.jsonl").read_bytes() == (alone / "metrics.jsonl").read_bytes()
        assert (cell / "rejected.jsonl").read_bytes() == (alone / "rejected.jsonl").read_bytes()
        mine, theirs = (json.loads((f / "run.json").read_text()) for f in (cell, alone))
        assert mine["problems"] == theirs["problems"] and mine["counts"] == theirs["counts"]
    wild = json.loads((out / "cells" / "d" / "wild" / "run.json").read_text())
    assert {p["code"] for p in wild["problems"]} == {"label_key_unmatched"}
    assert wild["problems"][0]["model"] == "wild"
    assert json.loads((out / "cells" / "d" / "tame" / "run.json").read_text())["problems"] == []
    assert any(r["parameters"].get("label", {}).get("value") == "fox"
               for r in read_jsonl(out / "cells" / "d" / "wild" / "metrics.jsonl"))
    assert info(out)["cells"][0]["ran"] and info(out)["status"] == "complete"


def _overlapping_datasets(folder: Path):
    """Two datasets whose datum uids are the same strings (u0, u1, ...) with other truths: a
    shard of one dataset must never meet the other's rows. x's ground truth repeats a uid (both
    copies rejected, in x's cells only); y's model b predicts a datum y lacks (an orphan)."""
    rng = random.Random(11)
    for d, n in (("x", 90), ("y", 70)):
        truth = [rng.choice(LABELS) for _ in range(n)]
        rows = [{"datum_uid": f"u{i}", "labels": [{"key": "class", "value": v}],
                 "metadata": {"region": rng.choice(["eu", "us"])}} for i, v in enumerate(truth)]
        if d == "x":
            rows.append(dict(rows[3]))
        write_jsonl(folder / d / "gt.jsonl", rows)
        for model, skill in (("a", 0.8), ("b", 0.6)):
            preds = []
            for i, v in enumerate(truth):
                top = v if rng.random() < skill else rng.choice(LABELS)
                preds.append({"datum_uid": f"u{i}", "labels": [
                    {"key": "class", "value": x, "score": 0.9 if x == top else round(rng.random() * 0.4, 2)}
                    for x in LABELS]})
            if d == "y" and model == "b":
                preds.append({"datum_uid": "u500", "labels": [{"key": "class", "value": "cat", "score": 0.5}]})
            write_jsonl(folder / d / f"{model}.jsonl", preds)
    manifest = folder / "sweep.toml"
    manifest.write_text(f"""
[sweep]
bootstrap = 40

[[dataset]]
name = "x"
task = "classification"
groundtruths = "{folder}/x/gt.jsonl"
options = {{ slice = ["region"] }}

[[dataset]]
name = "y"
task = "classification"
groundtruths = "{folder}/y/gt.jsonl"
options = {{ slice = ["region"] }}

[[model]]
name = "a"
predictions = "{folder}/{{dataset}}/a.jsonl"

[[model]]
name = "b"
predictions = "{folder}/{{dataset}}/b.jsonl"
""")
    return manifest


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overlap")
    manifest = _overlapping_datasets(folder)
    out = folder / "out"
    assert sweep([manifest, "--output", out, "--quiet"]) == 1   # x's repeated uid: rejections
    return folder, manifest, out


def test_datasets_in_one_graph_equal_their_runs_alone(overlapping):
    """Cells of two datasets with the same options are one graph (sweep_cells.CellGroupJob over
    both datasets, FilesJob.layout); with the same uid strings in both datasets, each cell still
    equals its run alone: records, intervals, rejections, problems and counts."""
    import argparse

    from evalbeam.pipelines.sweep.plan import plan_cells
    from evalbeam.pipelines.sweep.cells import groups_of
    from evalbeam.pipelines.sweep.manifest import load

    folder, manifest, out = overlapping
    plans = plan_cells(load(str(manifest)), str(folder / "plan"), [], argparse.Namespace(num_shards=None),
                       time.time())
    assert [len(group) for group in groups_of(plans)] == [4]
    for d in ("x", "y"):
        for model in ("a", "b"):
            alone = folder / "alone" / d / model
            code = run_classification(["--groundtruths", folder / d / "gt.jsonl", "--predictions",
                                       f"{model}={folder / d / model}.jsonl", "--output", alone,
                                       "--bootstrap", "40", "--slice", "region", "--quiet"])
            cell = out / "cells" / d / model
            assert (cell / "metrics.jsonl").read_bytes() == (alone / "metrics.jsonl").read_bytes()
            assert (cell / "rejected.jsonl").read_bytes() == (alone / "rejected.jsonl").read_bytes()
            mine, theirs = (json.loads((f / "run.json").read_text()) for f in (cell, alone))
            assert mine["problems"] == theirs["problems"] and mine["counts"] == theirs["counts"]
            assert mine["status"] == theirs["status"] and code == (1 if d == "x" or model == "b" else 0)
    x_rejects = read_jsonl(out / "cells" / "x" / "a" / "rejected.jsonl")
    # both copies of u3's ground truth, and a's prediction of u3, which then has none
    assert [(r["source"], r["line"]) for r in x_rejects] == [("a", 4), ("groundtruths", 4),
                                                             ("groundtruths", 91)]
    assert [r["source"] for r in read_jsonl(out / "cells" / "y" / "b" / "rejected.jsonl")] == ["b"]
    assert read_jsonl(out / "cells" / "y" / "a" / "rejected.jsonl") == []


@pytest.mark.multiprocess
def test_datasets_in_one_graph_on_the_multi_process_runner(overlapping, tmp_path):
    folder, manifest, out = overlapping
    other = tmp_path / "mp"
    assert sweep([manifest, "--output", other, "--quiet", *MULTIPROCESS]) == 1
    for cell in ("x/a", "x/b", "y/a", "y/b"):
        for name in ("metrics.jsonl", "rejected.jsonl"):
            assert (other / "cells" / cell / name).read_bytes() == (out / "cells" / cell / name).read_bytes()
    assert (other / "leaderboard.jsonl").read_bytes() == (out / "leaderboard.jsonl").read_bytes()
