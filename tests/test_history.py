"""Results history in MLflow (pipelines/quality/history.py): a real classification run folder logged to a
local file store in tmp_path and read back through MlflowClient; names that must stay distinct;
the tracking URI's checks; no telemetry, no network, nothing written outside tmp_path."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import read_jsonl, run_classification

# find_spec, not an import: the first `import mlflow` decides whether its telemetry starts, and
# the module under test is what imports it (pipelines/quality/history.py, with telemetry off)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                reason="mlflow is not installed (pip install 'evalbeam[mlflow]')")



def no_network(*args, **kwargs):
    raise AssertionError(f"network access attempted: {args[:2]}")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A finished classification run: 2 models, --slice region, --bootstrap 20, --compare_to,
    plus a report.html and a gates.json as the launcher's --report and --gates would add (the
    history logs whatever of those files a folder has)."""
    from evalbeam.pipelines.demo.synthetic import write_classification_dataset

    data = tmp_path_factory.mktemp("data")
    paths = write_classification_dataset(str(data), n_datums=300, n_classes=3, seed=3)
    out = tmp_path_factory.mktemp("runs") / "nightly-01"
    args = ["--groundtruths", paths["groundtruths"], "--output", out, "--quiet",
            "--slice", "region", "--score_thresholds", "0.0,0.5", "--bootstrap", "20",
            "--compare_to", "model_a"]
    for name in ("model_a", "model_b"):
        args += ["--predictions", f"{name}={paths[name]}"]
    assert run_classification(args) == 0
    (out / "report.html").write_text("<!doctype html><title>evalbeam report</title><p>stand-in</p>")
    (out / "gates.json").write_text(json.dumps({"passed": True, "checks": []}))
    return out


@pytest.fixture(scope="module")
def logged(run_folder, tmp_path_factory):
    """run_folder logged to a file store in tmp_path with HOME and the working folder pointed
    at empty folders and every socket call failing; (client, run_id, home, cwd, environ before)."""
    from evalbeam.pipelines.quality.history import log_run

    base = tmp_path_factory.mktemp("mlflow")
    home, cwd = base / "home", base / "cwd"
    home.mkdir()
    cwd.mkdir()
    uri = (base / "mlruns").as_uri()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("HOME", str(home))
        mp.delenv("XDG_CONFIG_HOME", raising=False)
        mp.chdir(cwd)
        for name in ("connect", "connect_ex"):
            mp.setattr(socket.socket, name, no_network)
        mp.setattr(socket, "getaddrinfo", no_network)
        mp.setattr(socket, "create_connection", no_network)
        environ = dict(os.environ)
        run_id = log_run(str(run_folder), uri, tags={"schedule": "nightly"})
        environ_after = dict(os.environ)
    with pytest.MonkeyPatch.context() as mp:
        # reading a file store back needs what log_run sets for itself (MLflow >= 3.13)
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
    return {"client": client, "run_id": run_id, "uri": uri, "home": home, "cwd": cwd,
            "environ": environ, "environ_after": environ_after, "base": base}


def metric_map(logged) -> dict:
    return logged["client"].get_run(logged["run_id"]).data.metrics


def find(records, **where) -> dict:
    found = [r for r in records if all(r.get(k) == v for k, v in where.items())]
    assert found, where
    return found[0]


# ----------------------------------------------------------------------------- one run


def test_run_status_name_times_params_and_tags(logged, run_folder):
    run = logged["client"].get_run(logged["run_id"])
    info = json.loads((run_folder / "run.json").read_text())
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "nightly-01"
    assert logged["client"].get_experiment(run.info.experiment_id).name == "evalbeam"
    # the MLflow run spans the evaluation itself
    assert run.info.end_time - run.info.start_time == round(info["wall_time_seconds"] * 1000)
    params = run.data.params
    assert params["task"] == "classification"
    assert params["models"] == "model_a,model_b"
    assert params["slices"] == "region"
    assert params["evalbeam_version"] == info["versions"]["evalbeam"]
    assert params["bootstrap"] == "20"
    assert params["score_thresholds"] == "[0.0,0.5]"
    assert params["compare_to"] == "model_a"
    assert params["hardmax"] == "true"
    assert set(info["options"]) <= set(params)
    assert all(len(v) <= 500 for v in params.values())
    tags = run.data.tags
    assert tags["evalbeam.task"] == "classification"
    assert tags["evalbeam.status"] == "complete"
    assert tags["evalbeam.models"] == "model_a,model_b"
    assert tags["evalbeam.folder"] == str(run_folder)
    assert tags["schedule"] == "nightly"
    # nothing of the environment: no user, no git commit, no variable's value
    assert not any(k in tags for k in ("mlflow.user", "mlflow.source.git.commit"))
    assert str(logged["home"]) not in json.dumps(tags)


def test_every_scalar_is_a_metric_with_its_value(logged, run_folder):
    metrics = metric_map(logged)
    records = read_jsonl(run_folder / "metrics.jsonl")

    # a number, its interval's ends
    precision = find(records, type="Precision", model="model_a", slice={},
                     parameters={"label": {"key": "class", "value": "bird"},
                                 "score_threshold": 0.5, "hardmax": True})
    name = "model_a/Precision/label-class.bird/score_threshold-0.5"
    assert metrics[f"{name}/value"] == precision["value"]
    assert metrics[f"{name}/ci_low"] == precision["interval"]["low"]
    assert metrics[f"{name}/ci_high"] == precision["interval"]["high"]
    # a slice
    sliced = find(records, type="Recall", model="model_b", slice={"region": "south"},
                  parameters={"label": {"key": "class", "value": "cat"},
                              "score_threshold": 0.0, "hardmax": True})
    name = "model_b/Recall/label-class.cat/score_threshold-0.0/slice.region-south"
    assert metrics[f"{name}/value"] == sliced["value"]
    assert metrics[f"{name}/ci_high"] == sliced["interval"]["high"]
    # a dict value: one metric per field
    counts = find(records, type="Counts", model="model_a", slice={"region": "north"},
                  parameters={"label": {"key": "class", "value": "dog"},
                              "score_threshold": 0.5, "hardmax": True})
    for field in ("tp", "fp", "fn", "tn"):
        name = f"model_a/Counts/{field}/label-class.dog/score_threshold-0.5/slice.region-north"
        assert metrics[f"{name}/value"] == counts["value"][field]
    # a parameter that is a run setting stays out, the label key stays in
    mrocauc = find(records, type="mROCAUC", model="model_b", slice={})
    assert metrics["model_b/mROCAUC/label_key-class/value"] == mrocauc["value"]
    # a comparison: named after the metric it compares, with its p-values
    comparison = find(records, type="Comparison", model="model_b", slice={},
                      parameters={"metric": "Precision", "baseline": "model_a",
                                  "metric_parameters": {"hardmax": True, "score_threshold": 0.0,
                                                        "label": {"key": "class", "value": "bird"}}})
    name = "model_b/Comparison/Precision/label-class.bird/score_threshold-0.0/baseline-model_a"
    assert metrics[f"{name}/value"] == comparison["value"]
    assert metrics[f"{name}/ci_low"] == comparison["interval"]["low"]
    assert metrics[f"{name}/p_value_adjusted"] == comparison["comparison"]["p_value_adjusted"]
    # the run's own numbers
    info = json.loads((run_folder / "run.json").read_text())
    assert metrics["evalbeam/wall_time_seconds"] == info["wall_time_seconds"]
    assert metrics["evalbeam/rows_read"] == info["rows_read"]
    assert metrics["evalbeam/counts/model_b/rows_rejected"] == info["counts"]["model_b"]["rows_rejected"]


def test_nothing_more_nothing_less(logged, run_folder):
    """As many metrics as metrics.jsonl has scalars (counted here independently), no curve or
    matrix among them, every name valid and short, none the folder of another."""
    metrics = metric_map(logged)
    records = read_jsonl(run_folder / "metrics.jsonl")
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    expected = 0
    for r in records:
        if number(r["value"]):
            expected += 1 + sum(number((r.get("interval") or {}).get(e)) for e in ("low", "high"))
            if r["type"] == "Comparison":
                expected += sum(number(r["comparison"].get(s)) for s in ("p_value", "p_value_adjusted"))
        elif isinstance(r["value"], dict):
            for field, v in r["value"].items():
                if number(v):
                    ends = (r.get("interval") or {}).get(field) or {}
                    expected += 1 + sum(number(ends.get(e)) for e in ("low", "high"))
    info = json.loads((run_folder / "run.json").read_text())
    run_level = [k for k in metrics if k.startswith("evalbeam/")]
    assert len(run_level) == 4 + 3 * len(info["counts"])       # wall time, rows x2, written
    assert len(metrics) - len(run_level) == expected
    assert {"ConfusionMatrix", "PrecisionRecallCurve", "DetailedPrecisionRecallCurve"} <= {r["type"] for r in records}
    assert not any(f"/{t}/" in k for k in metrics
                   for t in ("ConfusionMatrix", "PrecisionRecallCurve", "DetailedPrecisionRecallCurve"))
    assert not any("/hash-" in k for k in metrics)       # every name here is readable as it is
    assert max(len(k) for k in metrics) <= 250
    folders = {k.rsplit("/", 1)[0] for k in metrics}
    assert not folders & set(metrics)


def test_artifacts_are_the_files(logged, run_folder, tmp_path):
    import mlflow.artifacts

    listed = {f.path for f in logged["client"].list_artifacts(logged["run_id"])}
    assert listed == {"run.json", "metrics.jsonl", "report.html", "gates.json"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        local = mlflow.artifacts.download_artifacts(run_id=logged["run_id"], dst_path=str(tmp_path),
                                                    tracking_uri=logged["uri"])
    for name in listed:
        assert (Path(local) / name).read_bytes() == (run_folder / name).read_bytes(), name


def test_nothing_written_or_left_outside_the_store(logged):
    assert list(logged["home"].iterdir()) == []          # no ~/.config/mlflow, no ~/.mlflow
    assert list(logged["cwd"].iterdir()) == []           # no ./mlruns, no ./mlflow.db
    assert sorted(p.name for p in logged["base"].iterdir()) == ["cwd", "home", "mlruns"]
    # the variables log_run set for MLflow are gone again; none was there before
    assert logged["environ_after"] == logged["environ"]
    assert "MLFLOW_TRACKING_URI" not in os.environ


# ----------------------------------------------------------------------------- other folders


def write_folder(folder: Path, info: dict, records: list | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(info))
    if records is not None:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def info_of(run_folder, **changes) -> dict:
    info = json.loads((run_folder / "run.json").read_text())
    info.update(changes)
    return info


def test_failed_run_ends_failed(logged, run_folder, tmp_path):
    from evalbeam.pipelines.quality.history import log_run

    info = info_of(run_folder, status="failed", error="ValueError: boom [while running 'X']")
    for key in ("counts", "rows_read", "rows_rejected", "metrics_written"):
        info.pop(key)
    folder = write_folder(tmp_path / "failed", info, None)       # a failed run has no metrics
    run_id = log_run(str(folder), logged["uri"], run_name="broken", experiment="failures")
    run = logged["client"].get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.info.run_name == "broken"
    assert run.data.tags["evalbeam.status"] == "failed"
    assert run.data.tags["evalbeam.error"] == info["error"]
    assert set(run.data.metrics) == {"evalbeam/wall_time_seconds"}
    assert {f.path for f in logged["client"].list_artifacts(run_id)} == {"run.json"}
    assert logged["client"].get_experiment(run.info.experiment_id).name == "failures"


def test_a_run_still_running_or_a_folder_without_run_json_is_refused(logged, run_folder, tmp_path):
    from evalbeam.pipelines.quality.history import log_run

    folder = write_folder(tmp_path / "running", info_of(run_folder, status="running"), [])
    with pytest.raises(ValueError, match="has not finished"):
        log_run(str(folder), logged["uri"])
    with pytest.raises(FileNotFoundError, match="no run.json"):
        log_run(str(tmp_path), logged["uri"])


def test_names_that_would_meet_stay_distinct(logged, run_folder, tmp_path):
    """Long names shortened alike, names equal once their characters are made valid or their
    case folded, a field named like a leaf, a model named like the run's own prefix: each
    record keeps a metric of its own, every name valid and at most 250 characters."""
    from evalbeam.pipelines.quality.history import log_run, metric_names

    long = "x" * 300
    records = [
        {"type": "IOU", "value": 0.1, "parameters": {"label": long + "a"}, "model": "m", "slice": {}},
        {"type": "IOU", "value": 0.2, "parameters": {"label": long + "b"}, "model": "m", "slice": {}},
        {"type": "IOU", "value": 0.3, "parameters": {"label": "a/b"}, "model": "m", "slice": {}},
        {"type": "IOU", "value": 0.4, "parameters": {"label": "a:b"}, "model": "m", "slice": {}},
        {"type": "IOU", "value": 0.5, "parameters": {"label": "a_b"}, "model": "m", "slice": {}},
        {"type": "IOU", "value": 0.6, "parameters": {"label": "Cat"}, "model": "m", "slice": {}},
        {"type": "IOU", "value": 0.7, "parameters": {"label": "cat"}, "model": "m", "slice": {}},
        {"type": "IOU", "value": 0.8, "parameters": {"label": "cat", "hardmax": True}, "model": "m",
         "slice": {"region": "eu"}},
        {"type": "IOU", "value": 0.9, "parameters": {"label": "cat", "hardmax": False}, "model": "m",
         "slice": {"region": "eu"}},
        {"type": "Odd", "value": {"value": 1.0, "ci_low": 2.0}, "parameters": {}, "model": "m", "slice": {}},
        {"type": "Odd", "value": 3.0, "parameters": {}, "model": "m", "slice": {}},
        {"type": "mIOU", "value": 4.0, "parameters": {}, "model": "evalbeam", "slice": {}},
        {"type": "mIOU", "value": 5.0, "parameters": {}, "model": "m", "slice": {"café": "naïve"}},
    ]
    info = info_of(run_folder, options={"grid": list(range(300)), "judge": {"model": "gpt-x"},
                                        "task": "shadowed"})
    folder = write_folder(tmp_path / "odd", info, records)

    names = metric_names(records, info)
    assert names == metric_names(list(reversed(records)), info)      # order does not matter
    run_id = log_run(str(folder), logged["uri"])
    run = logged["client"].get_run(run_id)
    metrics = {k: v for k, v in run.data.metrics.items() if not k.startswith("evalbeam/")}
    assert metrics == {k: v for k, v in names.items() if not k.startswith("evalbeam/")}
    assert sorted(metrics.values()) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert len({k.casefold() for k in metrics}) == len(metrics)
    assert all(len(k) <= 250 for k in metrics)
    by_value = {v: k for k, v in metrics.items()}
    assert by_value[0.1] != by_value[0.2] and "/hash-" in by_value[0.1]
    assert by_value[0.1].startswith("m/IOU/label-xxxx")
    assert by_value[0.5] == "m/IOU/label-a_b/value"         # written as it is: no hash
    # names are pinned: the same metric must keep its name across evalbeam versions (history.md)
    assert by_value[0.3] == "m/IOU/label-a_b/hash-411c614628/value"
    assert "m/IOU/label-cat/value" not in metrics            # Cat and cat differ only in case
    assert by_value[0.7].startswith("m/IOU/label-cat/hash-")
    assert by_value[0.8] != by_value[0.9]                    # differ in a setting only
    assert by_value[3.0] == "m/Odd/value"
    assert by_value[1.0].startswith("m/Odd/value_/")
    assert by_value[4.0].startswith("evalbeam_/mIOU/hash-")
    assert by_value[5.0] == "m/mIOU/slice.café-naïve/value"
    params = run.data.params
    assert params["task"] == "classification" and params["options.task"] == "shadowed"
    assert params["judge.model"] == "gpt-x"
    assert len(params["grid"]) == 500 and params["grid"].startswith("[0,1,2,") and "sha1" in params["grid"]


# ----------------------------------------------------------------------------- the tracking URI


def test_check_tracking_uri_on_local_folders(tmp_path):
    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.quality.history import check_tracking_uri

    new = tmp_path / "a" / "b" / "mlruns"
    check_tracking_uri(new.as_uri())
    check_tracking_uri(str(new))
    assert not (tmp_path / "a").exists()                # checked, and nothing left behind
    existing = tmp_path / "store"
    existing.mkdir()
    check_tracking_uri(f"file:{existing}")
    assert list(existing.iterdir()) == []
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for uri in ((blocker / "mlruns").as_uri(), str(blocker)):
        with pytest.raises(UsageError, match="cannot be created or written"):
            check_tracking_uri(uri)
    with pytest.raises(UsageError, match="another host"):
        check_tracking_uri("file://elsewhere/mlruns")


def test_check_tracking_uri_on_servers():
    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.quality.history import check_tracking_uri

    class Quiet(http.server.BaseHTTPRequestHandler):
        """An MLflow-like API under /api and /locked, a 503 under /broken, a plain 404
        anywhere else (another web service)."""

        def do_GET(self):
            api = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=evalbeam"
            if self.path.endswith(api) and not self.path.startswith(("/broken", "/locked", "/other")):
                self.send_response(404)
                self.end_headers()
                self.wfile.write(b'{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"}')
                return
            code = 503 if self.path.startswith("/broken") else \
                401 if self.path.startswith("/locked") and self.path.endswith(api) else 404
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"<html>Not Found</html>")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        check_tracking_uri(f"http://127.0.0.1:{port}")          # MLflow's JSON error: a tracking server
        check_tracking_uri(f"http://127.0.0.1:{port}/locked")   # credentials are MLflow's to check
        with pytest.raises(UsageError, match="HTTP 503"):
            check_tracking_uri(f"http://user:secret@127.0.0.1:{port}/broken")
        # another service's 404 page: refused before the run, not after it (exit 3)
        with pytest.raises(UsageError, match="not an MLflow tracking server") as error:
            check_tracking_uri(f"http://user:secret@127.0.0.1:{port}/other")
        assert "secret" not in str(error.value)
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as free:                                # a port nobody listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(UsageError, match="no tracking server answered") as error:
        check_tracking_uri(f"http://user:secret@127.0.0.1:{port}")
    assert "secret" not in str(error.value)


def test_mlflow_missing(monkeypatch, tmp_path):
    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.quality.history import check_tracking_uri, log_run

    monkeypatch.setitem(sys.modules, "mlflow", None)          # `import mlflow` raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'evalbeam\[mlflow\]'"):
        check_tracking_uri((tmp_path / "mlruns").as_uri())
    folder = write_folder(tmp_path / "run", {"status": "complete", "task": "classification"}, [])
    with pytest.raises(UsageError, match="not installed"):
        log_run(str(folder), (tmp_path / "mlruns").as_uri())
    assert not (tmp_path / "mlruns").exists()


# ----------------------------------------------------------------------------- a fresh process


def test_fresh_process_without_ci_markers_sends_and_writes_nothing(run_folder, tmp_path):
    """As a user's shell runs it (no pytest or CI variables, which MLflow takes as "no
    telemetry" by itself): MLflow's telemetry stays off, no socket connects, HOME and the
    working folder stay empty, and the environment is as it was."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    script = f"""
import json, os, sys
events = []
sys.addaudithook(lambda event, args: events.append(event) if event in
                 ("socket.connect", "socket.getaddrinfo", "socket.sendto") else None)
before = dict(os.environ)
from evalbeam.pipelines.quality.history import log_run
run_id = log_run({str(run_folder)!r}, {(tmp_path / "mlruns").as_uri()!r})
from mlflow.telemetry import get_telemetry_client
print(json.dumps({{"telemetry": repr(get_telemetry_client()), "events": events,
                  "environ_same": dict(os.environ) == before, "run_id": run_id}}))
"""
    ci_markers = {"CI", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                  "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "XDG_CONFIG_HOME",
                  "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"}
    env = {k: v for k, v in os.environ.items() if k not in ci_markers}
    env["HOME"] = str(home)
    env["AGENT"] = "goose"                 # a coding agent's marker: MLflow would print a hint
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=cwd, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["telemetry"] == "None"
    assert out["events"] == []
    assert out["environ_same"]
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == []
    assert "skill" not in result.stderr                       # no hint for coding agents
    assert (tmp_path / "mlruns").is_dir()


def test_a_run_and_a_sweep_log_through_the_command_line(tmp_path, monkeypatch):
    """--mlflow_tracking_uri on a task and on a sweep (one MLflow run per cell that ran; a
    rerun whose cells are all done logs nothing new)."""
    from evalbeam.pipelines.sweep.command import run as sweep

    inputs = Path(__file__).resolve().parent / "golden" / "inputs" / "classification"
    uri = (tmp_path / "store").as_uri()
    out = tmp_path / "run"
    assert run_classification(["--groundtruths", inputs / "groundtruths.jsonl",
                               "--predictions", f"a={inputs / 'model_a.jsonl'}", "--output", out,
                               "--max_rejected_fraction", "0.1", "--quiet", "--report",
                               "--mlflow_tracking_uri", uri]) == 0
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f"""
[sweep]
max_rejected_fraction = 0.1
[[dataset]]
name = "golden"
task = "classification"
groundtruths = "{inputs / 'groundtruths.jsonl'}"
[[model]]
name = "a"
predictions = "{inputs / 'model_a.jsonl'}"
[[model]]
name = "b"
predictions = "{inputs / 'model_b.jsonl'}"
""")
    for _ in range(2):
        assert sweep([str(manifest), "--output", str(tmp_path / "sweep"), "--quiet",
                      "--mlflow_tracking_uri", uri]) == 0
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("evalbeam")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 3
    by_name = {r.info.run_name: r for r in runs}
    assert {"golden/a", "golden/b"} <= set(by_name)
    assert by_name["golden/b"].data.tags["dataset"] == "golden"
    accuracy = next(r for r in read_jsonl(tmp_path / "sweep" / "cells" / "golden" / "b" / "metrics.jsonl")
                    if r["type"] == "Accuracy" and not r["slice"])
    logged = [v for k, v in by_name["golden/b"].data.metrics.items() if k.startswith("b/Accuracy/")
              and k.endswith("/value")]
    assert logged == [accuracy["value"]]
    single = next(r for r in runs if r.info.run_name not in ("golden/a", "golden/b"))
    artifacts = {a.path for a in client.list_artifacts(single.info.run_id)}
    assert {"report.html", "metrics.jsonl", "run.json"} <= artifacts
