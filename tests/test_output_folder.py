"""The output folder: evalbeam touches only what it wrote, publishes so that no kill leaves output
that looks complete, and a run that stops with exit 2 changes nothing on disk."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import (ROOT, read_jsonl, run_classification, run_cli_here, run_cli_subprocess,
                     write_jsonl)


def small_dataset(folder: Path, n: int = 40) -> dict:
    classes = ["cat", "dog", "bird"]
    gts = [{"datum_uid": f"d{i}", "labels": [{"key": "class", "value": classes[i % 3]}]}
           for i in range(n)]
    preds = [{"datum_uid": f"d{i}", "labels": [
        {"key": "class", "value": c, "score": 0.8 if c == classes[(i * 7) % 3] else 0.1}
        for c in classes]} for i in range(n)]
    return {"groundtruths": write_jsonl(folder / "gt.jsonl", gts),
            "m": write_jsonl(folder / "m.jsonl", preds)}


def run(data: dict, out, *extra) -> int:
    return run_classification(["--groundtruths", data["groundtruths"], "--predictions",
                               f"m={data['m']}", "--output", out, "--quiet", *extra])


def listing(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def tree(folder: Path) -> dict:
    """Everything under folder, hidden entries and subfolders too: {relative path: bytes, or
    "folder"}."""
    return {str(p.relative_to(folder)): "folder" if p.is_dir() else p.read_bytes()
            for p in sorted(folder.rglob("*"))}


def classification_args(data: dict, out, *extra) -> list:
    return ["classification", "--groundtruths", data["groundtruths"], "--predictions",
            f"m={data['m']}", "--output", out, "--quiet", *extra]


def test_foreign_files_are_refused_unless_overwrite(tmp_path, capsys):
    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("my own notes, not evalbeam's\n")
    (out / "notes.txt").write_text("unrelated\n")
    before = listing(out)
    assert run(data, out) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl" in err and "--overwrite" in err and "Traceback" not in err
    assert listing(out) == before                      # nothing changed
    assert run(data, out, "--overwrite") == 0
    assert (out / "notes.txt").read_text() == "unrelated\n"   # never touched
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
    assert read_jsonl(out / "metrics.jsonl")


def test_own_outputs_are_replaced_but_an_edited_one_is_foreign(tmp_path, capsys):
    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    assert run(data, out) == 0
    first = (out / "metrics.jsonl").read_bytes()
    info = json.loads((out / "run.json").read_text())
    assert info["written_by"] == "evalbeam"
    assert info["files"] == {n: (out / n).stat().st_size for n in ("metrics.jsonl", "rejected.jsonl")}
    assert run(data, out) == 0                          # its own outputs: replaced
    assert (out / "metrics.jsonl").read_bytes() == first
    (out / "metrics.jsonl").write_bytes(first + b'{"edited": true}\n')
    capsys.readouterr()
    assert run(data, out) == 2                          # changed since evalbeam wrote it
    assert "metrics.jsonl" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_bytes() == first + b'{"edited": true}\n'


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_input_in_the_output_folder_is_never_removed(tmp_path, overwrite):
    """The issue's reproduction: predictions copied to d/metrics.jsonl and read from there."""
    data = small_dataset(tmp_path / "d")
    d = tmp_path / "d"
    (d / "metrics.jsonl").write_bytes(Path(data["m"]).read_bytes())
    before = listing(d)
    result = run_cli_subprocess(["classification", "--groundtruths", data["groundtruths"],
                                 "--predictions", f"m={d / 'metrics.jsonl'}", "--output", d,
                                 *(["--overwrite"] if overwrite else [])])
    assert result.returncode == 2, result.stderr
    assert "never removes an input" in result.stderr and "Traceback" not in result.stderr
    assert listing(d) == before


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_gates_file_among_the_outputs_is_never_removed(tmp_path, capsys, overwrite):
    """Options name inputs too: a gates file kept as out/gates.json was replaced by the run's own
    gates.json under --overwrite. Refused like any input among the outputs."""
    from evalbeam.pipelines.launch.launcher import _option_files

    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "gates.json").write_text('[[gate]]\nmetric = "Accuracy"\nmin = 0.1\n')
    before = listing(out)
    result = run_cli_here(classification_args(data, out, "--gates", out / "gates.json",
                                              *(["--overwrite"] if overwrite else [])), capsys)
    assert result.returncode == 2
    assert "never removes an input" in result.stderr and "Traceback" not in result.stderr
    assert listing(out) == before

    from evalbeam.pipelines.tasks.classification import TASK as CLASSIFICATION
    from evalbeam.pipelines.tasks.segmentation import TASK as SEGMENTATION
    from evalbeam.pipelines.tasks.text import TASK as TEXT

    class Args:
        gates, judge_byop, label_names = "g.toml", ["a.yaml", "b.yaml"], "names.JSON"
    assert _option_files(TEXT, Args) == ["g.toml", "a.yaml", "b.yaml"]
    assert _option_files(SEGMENTATION, Args) == ["g.toml", "names.JSON"]
    assert _option_files(CLASSIFICATION, Args) == ["g.toml"]
    Args.label_names = "0=road,1=car"                     # names, not a file
    assert _option_files(SEGMENTATION, Args) == ["g.toml"]


def test_exit_2_changes_nothing_even_with_an_earlier_run(tmp_path):
    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    assert run(data, out) == 0
    before = listing(out)
    code = run_classification(["--groundtruths", tmp_path / "gt-typo.jsonl", "--predictions",
                               f"m={data['m']}", "--output", out, "--quiet"])
    assert code == 2
    assert listing(out) == before                      # yesterday's outputs and run.json intact


def test_stale_outputs_and_killed_runs_temp_folders_are_removed(tmp_path):
    """A retrieval run with --per_query, then one without: per_query.jsonl of the first is gone.
    A killed run's temporary folder is removed by the next run; other files stay."""
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 a 1\nq1 0 b 0\nq2 0 c 1\n")
    run_file = tmp_path / "run.txt"
    run_file.write_text("q1 Q0 a 1 0.9 r\nq1 Q0 b 2 0.5 r\nq2 Q0 c 1 0.7 r\n")
    from evalbeam.pipelines.tasks.retrieval import run as retrieval

    out = tmp_path / "out"
    args = ["--groundtruths", qrels, "--predictions", f"r={run_file}", "--output", out, "--quiet"]
    assert retrieval([str(a) for a in args + ["--per_query"]]) == 0
    assert (out / "per_query.jsonl").exists()
    from evalbeam.transforms.outputs import OutputFolder

    killed = Path(OutputFolder(str(out)).make_temp())   # as a run makes it, then killed
    (killed / "pieces").mkdir(parents=True)
    (killed / "pieces" / "part-0").write_text("half written")
    (out / "keep.me").write_text("mine")
    assert retrieval([str(a) for a in args]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["keep.me", "metrics.jsonl", "rejected.jsonl", "run.json"]
    assert set(json.loads((out / "run.json").read_text())["files"]) == {"metrics.jsonl",
                                                                       "rejected.jsonl"}


def test_a_live_run_in_the_same_folder_is_refused(tmp_path, capsys):
    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    assert run(data, out) == 0
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        info = json.loads((out / "run.json").read_text())
        info.update(status="running", host=socket.gethostname(), pid=other.pid,
                    started_at="2026-11-24T00:00:00Z")
        (out / "run.json").write_text(json.dumps(info))
        before = listing(out)
        assert run(data, out) == 2
        assert f"process {other.pid}" in capsys.readouterr().err
        assert listing(out) == before
    finally:
        other.kill()
        other.wait()
    assert run(data, out) == 0                          # a dead run's folder is taken over


OUTPUT_NAMES = ("metrics.jsonl", "rejected.jsonl", "report.html", "gates.json", "comparison.jsonl",
                "per_query.jsonl", "scores.jsonl")


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_name_taken_by_a_folder_is_refused_even_with_overwrite(tmp_path, capsys,
                                                                           overwrite):
    """A folder is never something evalbeam wrote: --overwrite replaces files, never removes a
    folder and its contents (it did, each of these was deleted with its userdata.txt)."""
    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    for name in OUTPUT_NAMES:
        (out / name).mkdir(parents=True)
        (out / name / "userdata.txt").write_text("mine\n")
    before = tree(out)
    result = run_cli_here(classification_args(data, out, *(["--overwrite"] if overwrite else [])),
                          capsys)
    assert result.returncode == 2, result.stderr
    assert "is a folder" in result.stderr and "metrics.jsonl" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert tree(out) == before                          # nothing changed, nothing added


def test_a_symlink_to_a_folder_under_an_output_name_is_refused(tmp_path, capsys):
    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("mine")
    (out / "metrics.jsonl").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    result = run_cli_here(classification_args(data, out, "--overwrite"), capsys)
    assert result.returncode == 2 and "is a symlink to a folder" in result.stderr, result.stderr
    assert (out / "metrics.jsonl").is_symlink()
    assert (tmp_path / "elsewhere" / "keep.txt").read_text() == "mine"


def test_a_folder_named_run_json_is_refused_and_leaves_no_partial_file(tmp_path, capsys):
    """s3/run.json a folder (an earlier `--output s3/run.json/x`): the run with --overwrite was
    refused only when writing run.json, leaving s3/run.json.<hex>.partial behind."""
    data = small_dataset(tmp_path)
    out = tmp_path / "s3"
    (out / "run.json" / "x").mkdir(parents=True)
    (out / "run.json" / "x" / "run.json").write_text("{}")
    before = tree(out)
    result = run_cli_here(classification_args(data, out, "--overwrite"), capsys)
    assert result.returncode == 2, result.stderr
    assert "run.json" in result.stderr and "is a folder" in result.stderr
    assert tree(out) == before


def test_only_evalbeams_own_temporary_folders_are_removed(tmp_path, capsys):
    """Names that merely start like evalbeam's temporary folders are the user's: a first run into
    the folder removed .evalbeam-tmp-mybackup/ (with its data) and a file .evalbeam-tmp-userstuff.
    Only a temporary folder carrying evalbeam's mark, or the one its own run.json names, goes."""
    from evalbeam.transforms.outputs import OutputFolder

    data = small_dataset(tmp_path)
    out = tmp_path / "u2"
    (out / ".evalbeam-tmp-mybackup").mkdir(parents=True)
    (out / ".evalbeam-tmp-mybackup" / "data.txt").write_text("backup")
    (out / ".evalbeam-tmp-userstuff").write_text("stuff")
    (out / ".evalbeam-tmp-0123456789ab").mkdir()          # evalbeam's kind of name, no mark
    (out / ".evalbeam-tmp-0123456789ab" / "notes.txt").write_text("mine")
    copied = Path(OutputFolder(str(out)).make_temp())       # evalbeam's, renamed by the user:
    copied.rename(out / ".evalbeam-tmp-kept")               # its mark names another folder
    (out / "elsewhere").mkdir()
    (out / ".evalbeam-tmp-link").symlink_to(out / "elsewhere", target_is_directory=True)
    users = tree(out)
    assert run_cli_here(classification_args(data, out), capsys).returncode == 0
    assert {k: v for k, v in tree(out).items() if k in users} == users

    own = Path(OutputFolder(str(out)).make_temp())          # a killed run's: removed
    (own / "part-0").write_text("half written")
    assert run_cli_here(classification_args(data, out), capsys).returncode == 0
    assert not own.exists()
    # killed between making its temporary folder and marking it: run.json names the folder
    info = json.loads((out / "run.json").read_text())
    unmarked = out / ".evalbeam-tmp-fedcba987654"
    (unmarked / "pieces").mkdir(parents=True)
    info.update(status="running", host="another-host", pid=1, temp=unmarked.name)
    (out / "run.json").write_text(json.dumps(info))
    assert run_cli_here(classification_args(data, out), capsys).returncode == 0
    assert not unmarked.exists()
    assert {k: v for k, v in tree(out).items() if k in users} == users
    assert not [p for p in out.iterdir() if p.name.startswith(".evalbeam-tmp")
                and p.name not in {Path(k).parts[0] for k in users}]


# ----------------------------------------------------------------------------- publishing

class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, not even `finally` blocks of the caller's."""


def _folder_state(out: Path) -> str:
    """'complete' when run.json says complete and every file it lists is there with its size,
    'unfinished' when run.json says the run did not finish, else a description of the breach."""
    if not (out / "run.json").exists():
        return "no run.json" if (out / "metrics.jsonl").exists() else "unfinished"
    info = json.loads((out / "run.json").read_text())
    if info["status"] in ("running", "failed"):
        return "unfinished"
    files = info["files"]
    if set(files) != {"metrics.jsonl", "rejected.jsonl"}:
        return f"complete run.json lists {sorted(files)}"
    for name, size in files.items():
        if not (out / name).exists() or (out / name).stat().st_size != size:
            return f"complete run.json, but {name} is missing or of another size"
    return "complete"


def test_a_kill_at_any_step_of_publishing_never_looks_complete(tmp_path, monkeypatch):
    """Every file-system step of start() and publish() is interrupted in turn; after each, the
    folder is either unfinished (run.json says so) or the complete new set, and the next run
    accepts the folder as evalbeam's own."""
    from apache_beam.io.filesystems import FileSystems

    import evalbeam.transforms.outputs as outputs

    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    assert run(data, out) == 0
    steps = {"n": 0, "kill_at": None}
    real = {"rename": FileSystems.rename, "delete": FileSystems.delete,
            "write": outputs.write_json_atomic}

    def counted(name):
        def step(*args, **kwargs):
            steps["n"] += 1
            if steps["n"] == steps["kill_at"]:
                steps["at_kill"] = _folder_state(out)    # what a SIGKILL here would leave
                raise Killed()
            return real[name](*args, **kwargs)
        return step

    monkeypatch.setattr(FileSystems, "rename", staticmethod(counted("rename")))
    monkeypatch.setattr(FileSystems, "delete", staticmethod(counted("delete")))
    monkeypatch.setattr(outputs, "write_json_atomic", counted("write"))
    steps.update(n=0, kill_at=None)
    assert run(data, out) == 0
    total = steps["n"]     # the file-system steps of one run: each is interrupted once below
    seen = set()
    for kill_at in range(1, total + 2):
        steps.update(n=0, kill_at=kill_at, at_kill=None)
        try:
            code = run(data, out)
        except Killed:      # killed in the launcher (start()); inside the pipeline Beam
            code = None     # reports the step as failed and the launcher records the failure
        seen.add(steps["at_kill"] or "not reached")
        assert steps["at_kill"] in (None, "unfinished", "complete"), (kill_at, steps["at_kill"])
        state = _folder_state(out)
        assert state in ("unfinished", "complete"), (kill_at, state)
        if code not in (0, None):
            assert not (out / "metrics.jsonl").exists()   # a failed run leaves no metrics
        steps.update(n=0, kill_at=None)
        assert run(data, out) == 0, kill_at           # the folder is still evalbeam's
        assert _folder_state(out) == "complete"
    # kills fell before, inside and after publishing (the last step renames run.json into place)
    assert {"unfinished", "not reached"} <= seen


def test_a_killed_process_leaves_an_unfinished_or_complete_folder(tmp_path):
    data = small_dataset(tmp_path, n=3000)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for delay in (1.5, 3.0):
        proc = subprocess.Popen(
            [sys.executable, "-m", "evalbeam.pipelines.cli", "classification", "--groundtruths",
             data["groundtruths"], "--predictions", f"m={data['m']}", "--output", str(out),
             "--quiet"], env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _folder_state(out) in ("unfinished", "complete")
    assert run(data, out) == 0
    assert _folder_state(out) == "complete"
    assert not [p for p in out.iterdir() if p.name.startswith(".evalbeam-tmp")]


def test_an_output_that_is_a_file_is_refused(tmp_path, capsys):
    data = small_dataset(tmp_path)
    (tmp_path / "out").write_text("a file")
    assert run(data, tmp_path / "out") == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == "a file"


def test_parts_are_created_whole(tmp_path):
    """transforms.io.created_whole: a part that workers write under a fixed name (a retried
    bundle writes it again) is seen whole or not at all: the old copy stays readable until the
    new one replaces it, and a write that fails leaves the old copy and no partial file."""
    from evalbeam.transforms.io import created_whole

    path = str(tmp_path / "part-00001.jsonl")
    with created_whole(path) as out:
        out.write(b"first\n")
    with open(path, "rb") as reader:       # a reader of the first copy, mid-read
        with created_whole(path) as out:
            out.write(b"second, longer\n")
            assert open(path, "rb").read() == b"first\n"   # not truncated while being rewritten
        assert reader.read() == b"first\n"
    assert open(path, "rb").read() == b"second, longer\n"
    with pytest.raises(RuntimeError):
        with created_whole(path) as out:
            out.write(b"half")
            raise RuntimeError("worker lost")
    assert open(path, "rb").read() == b"second, longer\n"
    assert sorted(os.listdir(tmp_path)) == ["part-00001.jsonl"]
    (tmp_path / "taken").mkdir()                  # the final rename fails: no partial is left
    with pytest.raises(OSError):
        with created_whole(str(tmp_path / "taken")) as out:
            out.write(b"x")
    assert sorted(os.listdir(tmp_path)) == ["part-00001.jsonl", "taken"]


def test_a_removal_that_fails_leaves_a_failed_run_json_not_a_running_one(tmp_path, monkeypatch, capsys):
    """start() says "running" in run.json, then removes the earlier outputs; when a removal
    fails (here: every one), the run stops with exit 2 and run.json says "failed" with the
    reason, listing the earlier outputs still there, so the next run replaces them as its own.
    Before, run.json went on saying "running" for a run that never started."""
    from apache_beam.io.filesystems import FileSystems

    data = small_dataset(tmp_path)
    out = tmp_path / "out"
    assert run(data, out) == 0
    before = {n: (out / n).read_bytes() for n in ("metrics.jsonl", "rejected.jsonl")}

    def refuse(paths):
        raise OSError(13, "Permission denied", str(paths[0]))

    with monkeypatch.context() as patch:
        patch.setattr(FileSystems, "delete", staticmethod(refuse))
        done = run_cli_here(classification_args(data, out), capsys)
    assert done.returncode == 2 and "Permission denied" in done.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and "Permission denied" in info["error"]
    assert set(info["files"]) == set(before)
    assert {n: (out / n).read_bytes() for n in before} == before      # nothing else changed
    assert run(data, out) == 0
    assert json.loads((out / "run.json").read_text())["status"] == "complete"
