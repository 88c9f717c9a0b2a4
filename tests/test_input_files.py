"""The one reading door (transforms/input_files.py) and the files that go through it: gate
files, sweep manifests, a --baseline folder and `evalbeam report DIR`. Each hostile file is
refused with exit 2 and one paragraph, before anything is written, and never hangs or grows
memory: FIFOs, devices, symlinks to devices, folders, files nested thousands deep, too large
or not UTF-8; a baseline with a repeated record is unusable; one whose metrics.jsonl changed
since its run wrote it is a problem in run.json, and its change bounds fail."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest

from evalbeam.transforms.input_files import (FileMissing, FileRefused, iter_json_lines,
                                             json_problem, load_json, load_toml, parse_toml,
                                             read_bytes, read_text)
from helpers import ROOT, run_classification, run_cli_here

INPUTS = ROOT / "tests" / "golden" / "inputs" / "classification"
DEEP_TOML = "a = " + "[" * 5000 + "]" * 5000 + "\n"


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.toml"
    os.mkfifo(path)
    return path


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(FileRefused) as error:
        call(*args, **kwargs)
    assert "\n" not in error.value.message
    return error.value.message


# ---- the door itself --------------------------------------------------------------------------

def test_only_regular_files_pass_and_none_is_read_past_its_bound(tmp_path, fifo):
    small = tmp_path / "small.toml"
    small.write_bytes(b"x = 1\n")
    assert read_bytes(str(small), 6) == b"x = 1\n"
    assert "6 bytes or more, more than the 5 bytes" in refused(read_bytes, str(small), 5)
    link = tmp_path / "zero.toml"
    link.symlink_to("/dev/zero")
    started = time.monotonic()
    for path in (fifo, link, "/dev/zero", "/dev/urandom"):
        assert "not a regular file" in refused(read_bytes, str(path), 1 << 20, what="--gates x")
    assert time.monotonic() - started < 5            # a FIFO is never waited on
    assert "a folder, not a file" in refused(read_bytes, str(tmp_path), 10)
    with pytest.raises(FileMissing) as missing:
        read_bytes(str(tmp_path / "absent"), 10, what="--gates absent")
    assert isinstance(missing.value, FileNotFoundError)
    assert missing.value.message == "--gates absent: no such file"


def test_a_file_that_grows_past_its_bound_while_read_is_refused(tmp_path, monkeypatch):
    """The size is checked before reading, and reading stops at limit + 1 bytes for a file
    whose size lied (it grew after fstat)."""
    path = tmp_path / "grows.json"
    path.write_bytes(b"[1]" + b" " * 100)
    real_fstat = os.fstat

    def stale(fd):   # the size fstat saw before the file grew
        real = real_fstat(fd)
        return os.stat_result(tuple(real[:6]) + (3,) + tuple(real[7:10]))

    monkeypatch.setattr(os, "fstat", stale)
    assert "more than the 50 bytes" in refused(load_json, str(path), 50)
    assert "line 1 is longer than" not in refused(lambda: list(iter_json_lines(str(path), 50)))


def test_text_is_strict_utf8_and_a_leading_bom_is_dropped(tmp_path):
    path = tmp_path / "t.toml"
    path.write_bytes(b"\xef\xbb\xbfx = 1\n")
    assert read_text(str(path)) == "x = 1\n"
    path.write_bytes(b"x = '\xff'\n")
    assert "not UTF-8 text (invalid start byte at byte 5)" in refused(read_text, str(path))


@pytest.mark.parametrize("depth", [65, 300, 5000, 200_000])
def test_toml_nested_deeper_than_64_levels_is_refused_not_a_recursion_error(depth):
    text = "a = " + "[" * depth + "]" * depth
    assert "nested deeper than 64 levels" in refused(parse_toml, text, "f.toml")
    table = "x = " + "{y = " * depth + "1" + "}" * depth
    assert "nested deeper than 64 levels" in refused(parse_toml, table, "f.toml")


def test_toml_within_the_bound_parses():
    assert parse_toml("a = " + "[" * 63 + "1" + "]" * 63, "f.toml")["a"] is not None
    assert "not valid TOML" in refused(parse_toml, "[[gate]\n", "f.toml")


@pytest.mark.parametrize("raw, words", [
    (b"[" * 65 + b"]" * 65, "nested deeper than 64 levels"),
    (b"[" * 100_000, "nested deeper than 64 levels"),
    (b'{"v": NaN}', "NaN is not a JSON number"),
    (b'{"v": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"v": 1e999}', "1e999 is out of range"),
    (b'{"v": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'{"v": "\xed\xa0\x80"}', "not UTF-8 text"),
    (b'{"v": ', "not JSON"),
])
def test_json_is_strict(raw, words):
    value, problem = json_problem(raw)
    assert value is None and words in problem


def test_json_lines_are_bounded_and_numbered(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n[' + b"[" * 70 + b"\n")
    lines = iter_json_lines(str(path))
    assert next(lines) == (1, {"a": 1}) and next(lines) == (3, {"a": 2})
    with pytest.raises(FileRefused, match="line 4: JSON nested deeper than 64"):
        next(lines)
    from evalbeam.transforms.input_files import iter_lines

    path.write_bytes(b"x" * 5000)
    with pytest.raises(FileRefused, match="line 1 is longer than 1,000 bytes"):
        list(iter_lines(str(path), max_line_bytes=1000))


# ---- gate files and sweep manifests (issue 39, points 1 and 2) ---------------------------------

def classification_args(out, extra=(), quiet=True):
    return ["classification", "--groundtruths", INPUTS / "groundtruths.jsonl",
            "--predictions", f"model_a={INPUTS / 'model_a.jsonl'}", "--slice", "region",
            "--output", out, "--max_rejected_fraction", "0.1", *(["--quiet"] if quiet else []), *extra]


def gate_files(tmp_path, fifo):
    deep = tmp_path / "deep.toml"
    deep.write_text('[[gate]]\nmetric = "Accuracy"\nmin = 0.1\nparameters = {x = '
                    + "[" * 5000 + "]" * 5000 + "}\n")
    inline = tmp_path / "inline.toml"
    inline.write_text('[[gate]]\nmetric = "Accuracy"\nmin = 0.1\nparameters = {x = '
                      + "{y = " * 100 + "1" + "}" * 100 + "}\n")
    link = tmp_path / "zero.toml"
    link.symlink_to("/dev/zero")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (5 << 20) + "\n")
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[[gate]]\nname = "caf\xe9"\nmetric = "Accuracy"\nmin = 0.1\n')
    return {deep: "nested deeper than 64 levels", inline: "nested deeper than 64 levels",
            fifo: "not a regular file", link: "not a regular file",
            "/dev/zero": "not a regular file", "/dev/urandom": "not a regular file",
            tmp_path: "a folder, not a file", big: "more than the 4,194,304 bytes",
            latin: "not UTF-8 text"}


def test_hostile_gate_files_stop_the_run_with_one_paragraph(tmp_path, fifo, capsys):
    for path, words in gate_files(tmp_path, fifo).items():
        out = tmp_path / "out"
        done = run_cli_here(classification_args(out, ["--gates", path]), capsys)
        assert done.returncode == 2, (path, done.stderr)
        assert f"--gates {path}: " in done.stderr and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
        assert not out.exists()


def test_hostile_sweep_manifests_stop_with_one_paragraph(tmp_path, fifo, capsys):
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f"""
[[dataset]]
name = "golden"
task = "classification"
groundtruths = "{INPUTS / 'groundtruths.jsonl'}"

[[model]]
name = "a"
predictions = "{INPUTS / 'model_a.jsonl'}"
headline = {"[" * 5000}{"]" * 5000}
""")
    cases = dict(gate_files(tmp_path, fifo))
    cases[manifest] = "nested deeper than 64 levels"
    for path, words in cases.items():
        for command in (["sweep", path, "--output", tmp_path / "sweep-out"], ["sweep", "validate", path]):
            done = run_cli_here(command, capsys)
            assert done.returncode == 2, (command, done.stderr)
            assert f"the sweep manifest {path}: " in done.stderr and words in done.stderr, done.stderr
            assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
            assert not (tmp_path / "sweep-out").exists()


# ---- baseline folders and `evalbeam report DIR` (points 2 and 6) -------------------------------

@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    out = tmp_path_factory.mktemp("door") / "base"
    assert run_classification(classification_args(out)[1:]) == 0
    return out


def copy_of(baseline, tmp_path, name="edited"):
    edited = tmp_path / name
    shutil.copytree(baseline, edited)
    return edited


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "fifo"])
def test_a_baseline_whose_metrics_are_a_device_or_pipe_is_refused_at_once(tmp_path, baseline, target, capsys):
    edited = copy_of(baseline, tmp_path)
    metrics = edited / "metrics.jsonl"
    metrics.unlink()
    if target == "fifo":
        os.mkfifo(metrics)
    else:
        metrics.symlink_to(target)
    out = tmp_path / "out"
    started = time.monotonic()
    done = run_cli_here(classification_args(out, ["--baseline", edited]), capsys)
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr
    assert not out.exists()
    done = run_cli_here(["report", edited], capsys)
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr
    assert not (edited / "report.html").exists()
    assert time.monotonic() - started < 60


def test_a_baseline_run_json_that_is_a_device_is_refused(tmp_path, baseline, capsys):
    edited = copy_of(baseline, tmp_path)
    (edited / "run.json").unlink()
    (edited / "run.json").symlink_to("/dev/zero")
    done = run_cli_here(classification_args(tmp_path / "out", ["--baseline", edited]), capsys)
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr
    done = run_cli_here(["report", edited], capsys)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def accuracy_line(folder, model="model_a") -> int:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "Accuracy"
                and json.loads(line)["model"] == model and json.loads(line)["slice"] == {})


@pytest.mark.parametrize("order", ["copy_after", "copy_before"])
def test_a_baseline_with_a_repeated_record_is_unusable_whatever_its_order(tmp_path, baseline, order, capsys):
    """Two Accuracy records of one identity: which one a gate compared with depended on their
    order (the last won), so a max_drop gate passed or failed by the editor's choice. Now the
    baseline is refused before the run, either way round."""
    edited = copy_of(baseline, tmp_path)
    lines = (edited / "metrics.jsonl").read_text().splitlines()
    at = accuracy_line(edited)
    record = json.loads(lines[at])
    copy = json.dumps(dict(record, value=0.0))
    lines[at + 1:at + 1] = [copy] if order == "copy_after" else []
    if order == "copy_before":
        lines.insert(at, copy)
    (edited / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmodel = "model_a"\nmax_drop = 0.01\n')
    out = tmp_path / "out"
    done = run_cli_here(classification_args(out, ["--baseline", edited, "--gates", gates]), capsys)
    assert done.returncode == 2, done.stderr
    assert f"line {at + 2} repeats the record of line {at + 1} (Accuracy of model 'model_a'" in done.stderr
    assert not out.exists()
    done = run_cli_here(["report", edited], capsys)
    assert done.returncode == 2 and "repeats the record" in done.stderr


def test_a_baseline_edited_in_place_is_a_problem_and_fails_its_change_bounds(tmp_path, baseline, capsys):
    """A value edited so that the file's size no longer matches run.json: the run uses it, says
    so in run.json (baseline_changed) and on stderr, and a change bound against it is
    baseline_differs (failed, exit 5), never a pass; value bounds are checked as usual."""
    edited = copy_of(baseline, tmp_path)
    lines = (edited / "metrics.jsonl").read_text().splitlines()
    at = accuracy_line(edited)
    lines[at] = json.dumps(dict(json.loads(lines[at]), value=0.123456789))
    (edited / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmodel = "model_a"\nmax_drop = 1.0\n'
                     '[[gate]]\nmetric = "Accuracy"\nmodel = "model_a"\nmin = 0.0\n')
    out = tmp_path / "out"
    done = run_cli_here(classification_args(out, ["--baseline", edited, "--gates", gates], quiet=False), capsys)
    assert done.returncode == 5, done.stderr
    info = json.loads((out / "run.json").read_text())
    changed = [p for p in info["problems"] if p["code"] == "baseline_changed"]
    assert len(changed) == 1 and changed[0]["severity"] == "warning"
    assert "changed since evalbeam wrote it: run.json records" in changed[0]["message"]
    results = json.loads((out / "gates.json").read_text())["results"]
    assert [c["verdict"] for c in results] == ["baseline_differs", "pass"]
    assert results[0]["baseline_value"] == 0.123456789
    assert "is not the file its run wrote" in done.stderr

    # the untouched baseline: no such problem, the change bound is checked
    out2 = tmp_path / "out2"
    assert run_cli_here(classification_args(out2, ["--baseline", baseline, "--gates", gates]), capsys).returncode == 0
    info = json.loads((out2 / "run.json").read_text())
    assert "baseline_changed" not in [p["code"] for p in info["problems"]]


def test_a_fifo_label_names_file_is_refused(tmp_path, fifo, capsys):
    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.tasks.segmentation import parse_label_names

    pipe = tmp_path / "names.json"
    os.mkfifo(pipe)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100 + "]" * 100)
    result = {}

    def call(path):
        try:
            parse_label_names(str(path))
        except UsageError as error:
            result[path] = str(error)

    for path in (pipe, deep):
        worker = threading.Thread(target=call, args=(path,), daemon=True)
        worker.start()
        worker.join(10)
        assert not worker.is_alive()
    assert "not a regular file" in result[pipe] and "nested deeper than 64" in result[deep]


def test_run_json_of_a_baseline_read_through_the_door(tmp_path, baseline):
    from evalbeam.transforms.io import read_json

    assert read_json(str(baseline / "run.json"))["written_by"] == "evalbeam"
    toml, text = load_toml(str(ROOT / "pyproject.toml"))
    assert toml["project"]["name"] == "evalbeam" and text.startswith("[build-system]")


# ---- the judge journal ------------------------------------------------------------------------

def test_a_journal_line_nested_thousands_deep_is_skipped_not_a_crash(tmp_path):
    from evalbeam.transforms.judge.journal import check_journal, read_journal

    journal = tmp_path / "journal"
    journal.mkdir()
    good = {"hash": "h1", "status": "ok", "content": {"verdict": 1}}
    (journal / "part-a-000000.jsonl").write_text(
        json.dumps(good) + "\n" + '{"hash": "h2", "status": "ok", "content": ' + "[" * 5000
        + "]" * 5000 + "}\n" + '{"hash": "h3", "status": "ok", "con')
    assert check_journal(str(journal)) is None
    assert list(read_journal(str(journal))) == ["h1"]


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_a_journal_part_that_is_a_device_or_pipe_stops_the_run_before_it_starts(tmp_path, target, capsys, monkeypatch):
    from evalbeam.pipelines.demo.synthetic_rag import write_rag_dataset
    from evalbeam.transforms.io import ReadError
    from evalbeam.transforms.judge.journal import read_journal

    journal = tmp_path / "journal"
    journal.mkdir()
    part = journal / "part-b-000000.jsonl"
    if target == "fifo":
        os.mkfifo(part)
    else:
        part.symlink_to(target)
    with pytest.raises(ReadError, match="not a regular file"):   # on a worker: an input error
        read_journal(str(journal))
    data = write_rag_dataset(str(tmp_path / "data"), 5, seed=1, models=("alpha",))
    monkeypatch.setenv("EVALBEAM_JUDGE_TEST_KEY", "sk-test-0123456789")
    out = tmp_path / "out"
    done = run_cli_here(["text", "--groundtruths", data["groundtruths"], "--predictions",
                         f"alpha={data['alpha']}", "--metrics", "AnswerRelevance", "--output", out,
                         "--judge_url", "http://127.0.0.1:9/v1", "--judge_api_key_env",
                         "EVALBEAM_JUDGE_TEST_KEY", "--judge_journal", journal, "--quiet"], capsys)
    assert done.returncode == 2 and "--judge_journal: the judge journal's" in done.stderr, done.stderr
    assert "not a regular file" in done.stderr and not out.exists()
    # a journal that is a file: its part files cannot be written in it (the workers failed, exit 3)
    part.unlink()
    journal.rmdir()
    journal.write_text("")
    done = run_cli_here(["text", "--groundtruths", data["groundtruths"], "--predictions",
                         f"alpha={data['alpha']}", "--metrics", "AnswerRelevance", "--output", out,
                         "--judge_url", "http://127.0.0.1:9/v1", "--judge_api_key_env",
                         "EVALBEAM_JUDGE_TEST_KEY", "--judge_journal", journal, "--quiet"], capsys)
    assert done.returncode == 2 and f"{journal} is a file, not a folder" in done.stderr, done.stderr
    assert not out.exists()


# ---- sizes a file may ask for ------------------------------------------------------------------

def test_a_manifest_of_too_many_cells_is_refused_quickly(tmp_path, capsys):
    """3,000 datasets x 3,000 models (700 KB) ran for minutes (a quadratic header search, then
    9 M cells); now the header lines are indexed once and cells stop at MAX_CELLS."""
    from evalbeam.pipelines.sweep.manifest import MAX_CELLS

    gt = INPUTS / "groundtruths.jsonl"
    text = "".join(f'[[dataset]]\nname = "d{i}"\ntask = "classification"\ngroundtruths = "{gt}"\n'
                   for i in range(1000))
    text += "".join(f'[[model]]\nname = "m{i}"\npredictions = "{INPUTS / "model_a.jsonl"}"\n'
                    for i in range(1000))
    manifest = tmp_path / "big.toml"
    manifest.write_text(text)
    started = time.monotonic()
    done = run_cli_here(["sweep", "validate", manifest], capsys)
    assert done.returncode == 2 and f"more than {MAX_CELLS:,} cells (1,000 datasets x 1,000 models)" in done.stderr
    assert time.monotonic() - started < 30


def test_a_gate_file_of_too_many_gates_is_refused(tmp_path, capsys):
    from evalbeam.pipelines.quality.gates import MAX_GATES

    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmin = 0.1\n' * (MAX_GATES + 1))
    out = tmp_path / "out"
    done = run_cli_here(classification_args(out, ["--gates", gates]), capsys)
    assert done.returncode == 2 and f"1,001 [[gate]] tables, more than the {MAX_GATES:,}" in done.stderr
    assert not out.exists()
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmin = 0.1\n' * MAX_GATES)
    assert run_cli_here(classification_args(out, ["--gates", gates]), capsys).returncode == 0


def test_the_demo_replaces_only_its_own_data_files(tmp_path, capsys):
    """`evalbeam demo --folder F` wrote F/data/groundtruths.jsonl with open(..., "w"): a user's
    file of that name was overwritten, and a symlink was followed to its target."""
    from evalbeam.pipelines.demo.command import write_demo_data
    from evalbeam.pipelines.launch.common import UsageError

    data = tmp_path / "demo" / "data"
    data.mkdir(parents=True)
    mine = tmp_path / "precious.jsonl"
    mine.write_text('{"mine": 1}\n')
    (data / "model_a.jsonl").symlink_to(mine)
    with pytest.raises(UsageError, match="model_a.jsonl exists and the demo did not write it"):
        write_demo_data(str(data), n_datums=50)
    (data / "model_a.jsonl").unlink()
    (data / "groundtruths.jsonl").write_text('{"mine": 2}\n')
    done = run_cli_here(["demo", "--folder", tmp_path / "demo", "--n_datums", "50"], capsys)
    assert done.returncode == 2 and "the demo replaces only its own files" in done.stderr
    assert (data / "groundtruths.jsonl").read_text() == '{"mine": 2}\n' and mine.read_text() == '{"mine": 1}\n'
    (data / "groundtruths.jsonl").unlink()
    first = write_demo_data(str(data), n_datums=50)
    again = write_demo_data(str(data), n_datums=80, seed=1)      # its own files: replaced
    assert first == again and sum(1 for _ in open(again["groundtruths"])) == 80
    assert sorted(p.name for p in data.iterdir()) == [".evalbeam-demo.json", "groundtruths.jsonl",
                                                      "model_a.jsonl", "model_b.jsonl"]


@pytest.mark.parametrize("kind", ["fifo", "zero", "latin1"])
def test_a_report_cache_file_that_is_not_a_bundle_is_rebuilt(tmp_path, monkeypatch, kind):
    """The vega bundle cache (~/.cache/evalbeam) was read with open(): a FIFO there hung every
    report, a link to /dev/zero never ended, bytes that are not UTF-8 raised."""
    import re

    import vl_convert

    from evalbeam.pipelines.report import page as report

    monkeypatch.setenv("EVALBEAM_CACHE_DIR", str(tmp_path))
    report.vega_bundle.cache_clear() if hasattr(report.vega_bundle, "cache_clear") else None
    version = re.sub(r"[^A-Za-z0-9.]", "_", getattr(vl_convert, "__version__", "unknown"))
    path = tmp_path / f"vega-bundle-{version}.js"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(b"\xff\xfe" * 10)
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("text", report.vega_bundle()), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive() and "vega" in result["text"][:100000].lower()
    assert path.is_file() and not path.is_symlink()          # rebuilt and replaced atomically
