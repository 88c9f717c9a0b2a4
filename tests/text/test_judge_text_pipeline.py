"""`evalbeam text` with every judge metric against the stand-in server: a 200-datum RAG dataset,
injected faults, the journal's free rerun, dry runs, budgets, secrets, the multi-process runner."""

from __future__ import annotations

import json
import os

import pytest

from helpers import MULTIPROCESS, read_jsonl
from evalbeam.pipelines.runners.judge_server import StandInServer
from evalbeam.pipelines.demo.synthetic_rag import write_rag_dataset

KEY = "sk-evalbeam-test-SECRET-0123456789"
TRANSIENT = ("429", "500", "503", "reset")


def run_text(*args) -> int:
    from evalbeam.pipelines.tasks.text import run

    return run([str(a) for a in args])


@pytest.fixture()
def key_env(monkeypatch):
    monkeypatch.setenv("EVALBEAM_JUDGE_TEST_KEY", KEY)
    return "EVALBEAM_JUDGE_TEST_KEY"


def judge_args(url, key_env, *extra):
    return ["--judge_url", url, "--judge_api_key_env", key_env, "--judge_rpm", "1000000",
            "--judge_concurrency", "32", "--judge_max_attempts", "10", "--judge_timeout", "20",
            "--quiet", *extra]


def outputs(folder):
    metrics = read_jsonl(os.path.join(folder, "metrics.jsonl"))
    scores = read_jsonl(os.path.join(folder, "scores.jsonl"))
    with open(os.path.join(folder, "run.json")) as f:
        return metrics, scores, json.load(f)


def test_every_metric_on_200_datums_with_faults_equals_the_fault_free_run(tmp_path, key_env):
    # 40 datums (500 until issue 16, 200 until issue 17, 80 until the suite neared its 15-minute
    # budget): every judge metric, ~1,000 calls, faults, retries and the journal
    from evalbeam.transforms.judge.metrics import CLASSIFIER_METRICS, JUDGE_METRICS, LIKELIHOOD_METRICS

    n = 40
    data = write_rag_dataset(str(tmp_path / "data"), n, seed=3, models=("alpha",))
    base = ["--groundtruths", data["groundtruths"], "--predictions", f"alpha={data['alpha']}",
            "--metrics", "all", "--slice", "topic"]
    with StandInServer() as clean:
        assert run_text(*base, "--output", tmp_path / "clean", *judge_args(clean.url, key_env)) == 0
        clean_calls = clean.stats()["requests"]
    # injected 429s pause every call of the client for their Retry-After: 20 ms, not 200, keeps
    # the run short (the rate-limit behaviour itself is tested in test_judge_transform.py)
    with StandInServer(fault_rate=0.2, faults=TRANSIENT, seed=5, fault_retry_after_ms=20) as faulty:
        assert run_text(*base, "--output", tmp_path / "faulty", *judge_args(faulty.url, key_env)) == 0
        stats = faulty.stats()
        assert stats["faults"] and sum(stats["faults"].values()) > 0.1 * stats["requests"]
        faulty.reset_stats()
        # the same run again: everything comes from the journal
        assert run_text(*base, "--output", tmp_path / "faulty", *judge_args(faulty.url, key_env)) == 0
        assert faulty.stats()["requests"] == 0
    m1, s1, info1 = outputs(tmp_path / "clean")
    m2, s2, info2 = outputs(tmp_path / "faulty")
    assert m1 == m2 and s1 == s2
    assert info1["judge"]["sent"] == clean_calls and info1["judge"]["failed_by_status"] == {}
    assert info2["judge"]["sent"] == 0 and info2["judge"]["cached"] == info2["judge"]["requests"] > 0
    # every datum of every judge metric is scored or counted by status
    overall = [r for r in m1 if r["slice"] == {} and r["type"] in JUDGE_METRICS]
    # 'all' names every judge metric but BYOP, the log-likelihood ones (a completions model) and
    # those of models on the workers (--model_uri)
    assert {r["type"] for r in overall} == (set(JUDGE_METRICS) - {"BYOP"} - set(LIKELIHOOD_METRICS)
                                            - set(CLASSIFIER_METRICS))
    for record in overall:
        assert sum(record["counts"].values()) == n, record
        assert record["counts"].get("ok", 0) > 0, record
        assert set(record["counts"]) <= {"ok", "not_applicable", "no_statements"}, record
        assert record["value"] is None or 0.0 <= record["value"] <= 5.0
        assert record["parameters"]
    per_datum = [r for r in s1 if r["metric"] == "Faithfulness"]
    assert len(per_datum) == n and all("details" in r for r in per_datum)
    # the slices add up to the whole
    for kind in ("Faithfulness", "AnswerAccuracy"):
        sliced = [r for r in m1 if r["type"] == kind and r["slice"]]
        assert sum(sum(r["counts"].values()) for r in sliced) == n


def test_dry_run_counts_calls_per_metric_and_sends_nothing(tmp_path, key_env, capsys):
    data = write_rag_dataset(str(tmp_path / "data"), 40, seed=1, models=("alpha",))
    base = ["--groundtruths", data["groundtruths"], "--predictions", f"alpha={data['alpha']}",
            "--metrics", "Faithfulness,AnswerCorrectness,AnswerSemanticSimilarity"]
    with StandInServer() as server:
        args = judge_args(server.url, key_env, "--judge_dry_run", "--judge_price_prompt_1k", "1.5",
                          "--judge_price_completion_1k", "6")
        args.remove("--quiet")
        assert run_text(*base, "--output", tmp_path / "dry", *args) == 0
        assert server.stats()["requests"] == 0
        printed = capsys.readouterr().out
        assert run_text(*base, "--output", tmp_path / "real", *judge_args(server.url, key_env)) == 0
        real_calls = server.stats()["requests"]
    metrics, scores, info = outputs(tmp_path / "dry")
    judge = info["judge"]
    assert judge["sent"] == 0 and judge["dry_run"] == judge["requests"] - judge["cached"] - judge["shared"]
    # the stand-in's rules simulate the answers, so the later steps are counted too: as many
    # calls as the real run against the same rules sends
    assert judge["dry_run"] == real_calls
    assert set(judge["per_metric"]) == {"Faithfulness", "AnswerCorrectness", "AnswerSemanticSimilarity"}
    assert judge["estimated_cost"] > 0 and "dry run" in printed and "Faithfulness" in printed
    for record in metrics:
        if "counts" in record:
            assert record["value"] is None and set(record["counts"]) <= {"dry_run", "not_applicable"}


def test_budget_stops_sending_and_reports_what_was_not_judged(tmp_path, key_env):
    data = write_rag_dataset(str(tmp_path / "data"), 30, seed=2, models=("alpha",))
    with StandInServer() as server:
        assert run_text("--groundtruths", data["groundtruths"], "--predictions", f"alpha={data['alpha']}",
                        "--metrics", "Toxicity", "--output", tmp_path / "out",
                        *judge_args(server.url, key_env, "--judge_max_calls", "10")) == 0
        assert server.stats()["requests"] == 10
    metrics, scores, info = outputs(tmp_path / "out")
    overall = next(r for r in metrics if r["type"] == "Toxicity" and r["slice"] == {})
    assert overall["counts"].get("not_sent", 0) > 0 and sum(overall["counts"].values()) == 30
    assert info["judge"]["sent"] == 10 and info["judge"]["failed_by_status"] == {}
    # a datum stops at its first request past the budget: at least one unsent request each
    assert info["judge"]["not_sent"] >= overall["counts"]["not_sent"]
    assert sum(r["status"] == "not_sent" for r in scores) == overall["counts"]["not_sent"]


def test_permanent_errors_and_the_api_key_never_leaks(tmp_path, key_env, capfd):
    data = write_rag_dataset(str(tmp_path / "data"), 12, seed=4, models=("alpha",))
    with StandInServer() as server:
        code = run_text("--groundtruths", data["groundtruths"], "--predictions", f"alpha={data['alpha']}",
                        "--metrics", "Bias,Faithfulness", "--output", tmp_path / "out",
                        *judge_args(server.url, key_env, "--judge_model", "fail-401", "--judge_journal",
                                    tmp_path / "journal"))
    # every judge call refused: the outputs are written, but the run is incomplete (exit 4)
    assert code == 4
    metrics, scores, info = outputs(tmp_path / "out")
    bias = next(r for r in metrics if r["type"] == "Bias" and r["slice"] == {})
    assert bias["value"] is None and bias["counts"] == {"http_error": 12}
    assert info["judge"]["failed_by_status"]["http_error"] > 0
    assert info["status"] == "incomplete"
    failed = {p["message"].split(":")[0]: p for p in info["problems"] if p["code"] == "judge_failed"}
    assert set(failed) == {"judge metric Bias", "judge metric Faithfulness"}
    assert all(p["severity"] == "error" and "12 of 12" in p["message"] and "http_error 12" in p["message"]
               and "HTTP 401" in p["message"] for p in failed.values())
    printed = capfd.readouterr()
    texts = [printed.out, printed.err]
    for root in (tmp_path / "out", tmp_path / "journal"):
        for folder, _, files in os.walk(root):
            for name in files:
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
    assert all(KEY not in text for text in texts)
    assert "EVALBEAM_JUDGE_TEST_KEY" in json.dumps(info["options"])   # the variable's name only


def test_judge_metric_without_url_is_a_usage_error(tmp_path, capsys):
    data = write_rag_dataset(str(tmp_path / "data"), 5, seed=0, models=("alpha",))
    code = run_text("--groundtruths", data["groundtruths"], "--predictions", data["alpha"],
                    "--metrics", "Faithfulness", "--output", tmp_path / "out")
    assert code == 2 and "--judge_url" in capsys.readouterr().err
    # 'all' without a judge is the local metrics only
    assert run_text("--groundtruths", data["groundtruths"], "--predictions", data["alpha"],
                    "--output", tmp_path / "local", "--quiet") == 0
    assert all("counts" not in r for r in read_jsonl(os.path.join(tmp_path / "local", "metrics.jsonl")))


@pytest.mark.parametrize("option, text, message", [
    ("--judge_both_empty", "1.5", "--judge_both_empty must lie in [0.0, 1.0]; got 1.5"),
    ("--judge_no_claims_faithfulness", "yes", "--judge_no_claims_faithfulness takes a number"),
])
def test_convention_options_are_checked(tmp_path, capsys, option, text, message):
    data = write_rag_dataset(str(tmp_path / "data"), 3, seed=0, models=("alpha",))
    code = run_text("--groundtruths", data["groundtruths"], "--predictions", data["alpha"],
                    "--metrics", "Faithfulness", "--output", tmp_path / "out",
                    "--judge_url", "http://127.0.0.1:9/v1", option, text)
    assert code == 2 and message in capsys.readouterr().err


def test_optional_numbers():
    from evalbeam.pipelines.launch.common import UsageError, parse_optional_number

    assert parse_optional_number("none", "--x", float, 0.0, 1.0) is None
    assert parse_optional_number("NaN", "--x", float, 0.0, 1.0) is None
    assert parse_optional_number("0.25", "--x", float, 0.0, 1.0) == 0.25
    assert parse_optional_number("255", "--id", int, 0, 65535) == 255
    for text, kind, high in (("7.5", int, 65535), ("70000", int, 65535), ("-0.1", float, 1.0)):
        with pytest.raises(UsageError):
            parse_optional_number(text, "--x", kind, 0, high)


@pytest.mark.multiprocess
def test_multi_process_runner_gives_the_same_results(tmp_path, key_env):
    data = write_rag_dataset(str(tmp_path / "data"), 60, seed=6, models=("alpha", "beta"))
    base = ["--groundtruths", data["groundtruths"], "--predictions", f"alpha={data['alpha']}",
            "--predictions", f"beta={data['beta']}", "--metrics",
            "Faithfulness,AnswerAccuracy,ContextPrecision,SummaryCoherence,GroundednessSimilarity,ROUGE"]
    with StandInServer(fault_rate=0.1, faults=TRANSIENT, seed=2) as server:
        assert run_text(*base, "--output", tmp_path / "one", *judge_args(server.url, key_env),
                        "--judge_journal", tmp_path / "j1") == 0
        assert run_text(*base, "--output", tmp_path / "two", *judge_args(server.url, key_env),
                        "--judge_journal", tmp_path / "j2", *MULTIPROCESS, "--num_shards", "5") == 0
    m1, s1, _ = outputs(tmp_path / "one")
    m2, s2, info = outputs(tmp_path / "two")
    assert m1 == m2 and s1 == s2
    assert info["options"]["judge"]["workers"] == 2
