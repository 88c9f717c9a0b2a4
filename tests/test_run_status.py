"""Runs that must not end as a plain "complete", exit codes that agree with run.json, and inputs
that must stop a run or be read whole (truncated compressed files, long first lines)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import MULTIPROCESS, read_jsonl, run_classification, run_cli_subprocess, write_jsonl


def gt(i, value, region=None):
    row = {"datum_uid": f"d{i}", "labels": [{"key": "class", "value": value}]}
    if region is not None:
        row["metadata"] = {"region": region}
    return row


def pred(i, value, score=0.9):
    return {"datum_uid": f"d{i}", "labels": [{"key": "class", "value": value, "score": score}]}


def test_every_prediction_rejected_is_incomplete_not_a_table_of_zeros(tmp_path):
    g = write_jsonl(tmp_path / "gt.jsonl", [gt(i, "cat") for i in range(20)])
    p = write_jsonl(tmp_path / "p.jsonl", [pred(i, "cat", score=1.5) for i in range(20)])
    result = run_cli_subprocess(["classification", "--groundtruths", g, "--predictions", f"m={p}",
                                 "--output", tmp_path / "out"])
    assert result.returncode == 4, result.stderr
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["status"] == "incomplete"
    assert [p["code"] for p in info["problems"] if p["severity"] == "error"] == ["nothing_evaluated"]
    assert "no prediction row of model 'm' could be evaluated" in result.stderr
    assert "incomplete" in result.stderr and "exit 4" in result.stderr
    assert len(read_jsonl(tmp_path / "out" / "rejected.jsonl")) == 20


def test_a_slice_key_no_row_has_is_incomplete(tmp_path):
    g = write_jsonl(tmp_path / "gt.jsonl", [gt(i, "cat" if i % 2 else "dog", region="north")
                                            for i in range(20)])
    p = write_jsonl(tmp_path / "p.jsonl", [pred(i, "cat") for i in range(20)])
    out = tmp_path / "out"
    code = run_classification(["--groundtruths", g, "--predictions", f"m={p}", "--output", out,
                               "--quiet", "--slice", "regoin", *MULTIPROCESS])
    assert code == 4
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "incomplete"
    assert [p["code"] for p in info["problems"]] == ["slice_key_missing"]
    assert "regoin" in info["problems"][0]["message"]
    # a key some rows have is a real slice (its null group holds the rest): complete
    code = run_classification(["--groundtruths", g, "--predictions", f"m={p}", "--output",
                               tmp_path / "ok", "--quiet", "--slice", "region"])
    assert code == 0
    assert json.loads((tmp_path / "ok" / "run.json").read_text())["problems"] == []


@pytest.mark.parametrize("rows", [5_000, 80_000])
def test_a_truncated_gzip_input_is_an_input_error(tmp_path, rows):
    """Cut in half. The small file breaks off within the first lines the launcher checks (exit 2
    before any work, nothing written); the large one while a worker reads it (exit 2, run.json
    "failed", no metrics). Beam's own reader returned the first half as if it were all."""
    text = "".join(json.dumps(gt(i, "cat")) + "\n" for i in range(rows)).encode()
    whole = gzip.compress(text)
    (tmp_path / "gt.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    p = write_jsonl(tmp_path / "p.jsonl", [pred(i, "cat") for i in range(rows)])
    result = run_cli_subprocess(["classification", "--groundtruths", tmp_path / "gt.jsonl.gz",
                                 "--predictions", f"m={p}", "--output", tmp_path / "out"])
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("evalbeam: error:")]
    assert len(errors) == 1 and "gt.jsonl.gz" in errors[0] and "cut short" in errors[0]
    if rows == 5_000:
        assert not (tmp_path / "out").exists()
    else:
        info = json.loads((tmp_path / "out" / "run.json").read_text())
        assert info["status"] == "failed" and "gt.jsonl.gz" in info["error"]
        assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_first_line_over_one_mebibyte_is_read_whole(tmp_path):
    """A valid row whose metadata makes the first line 1.5 MiB long: once 'no line is valid JSON'."""
    first = gt(0, "cat")
    first["metadata"] = {"note": "x" * (3 << 19)}
    g = write_jsonl(tmp_path / "gt.jsonl", [first] + [gt(i, "dog") for i in range(1, 10)])
    p = write_jsonl(tmp_path / "p.jsonl", [pred(i, "cat") for i in range(10)])
    assert run_classification(["--groundtruths", g, "--predictions", f"m={p}", "--output",
                               tmp_path / "out", "--quiet"]) == 0
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"]["groundtruths"]["rows_evaluated"] == 10


def test_unknown_options_never_echo_secret_values(tmp_path):
    g = write_jsonl(tmp_path / "gt.jsonl", [gt(0, "cat")])
    result = run_cli_subprocess(["classification", "--groundtruths", g, "--predictions", g,
                                 "--output", tmp_path / "out", "--openai_api_key=sk-live-123456",
                                 "--auth_header", "Bearer sk-live-654321"])
    assert result.returncode == 2
    assert "sk-live" not in result.stderr and "--openai_api_key=***" in result.stderr
    assert not (tmp_path / "out").exists()


def test_quiet_multiprocess_run_prints_nothing(tmp_path):
    g = write_jsonl(tmp_path / "gt.jsonl", [gt(i, "cat" if i % 3 else "dog") for i in range(50)])
    p = write_jsonl(tmp_path / "p.jsonl", [pred(i, "cat") for i in range(50)])
    result = run_cli_subprocess(["classification", "--groundtruths", g, "--predictions", f"m={p}",
                                 "--output", tmp_path / "out", "--quiet", *MULTIPROCESS])
    assert result.returncode == 0
    assert result.stdout == "" and result.stderr == ""


def test_a_bom_at_the_start_of_a_jsonl_file_is_not_a_bad_row(tmp_path):
    g = Path(write_jsonl(tmp_path / "gt.jsonl", [gt(i, "cat") for i in range(5)]))
    g.write_bytes(b"\xef\xbb\xbf" + g.read_bytes())
    p = write_jsonl(tmp_path / "p.jsonl", [pred(i, "cat") for i in range(5)])
    assert run_classification(["--groundtruths", g, "--predictions", f"m={p}", "--output",
                               tmp_path / "out", "--quiet"]) == 0
    assert read_jsonl(tmp_path / "out" / "rejected.jsonl") == []


def test_a_pipe_given_as_input_stops_at_once(tmp_path):
    import os

    os.mkfifo(tmp_path / "gt.jsonl")               # nobody writes: reading it would hang
    p = write_jsonl(tmp_path / "p.jsonl", [pred(0, "cat")])
    result = run_cli_subprocess(["classification", "--groundtruths", tmp_path / "gt.jsonl",
                                 "--predictions", f"m={p}", "--output", tmp_path / "out"],
                                timeout=60)
    assert result.returncode == 2 and "not a regular file" in result.stderr
    assert not (tmp_path / "out").exists()
