"""Issue 14, text and the LLM judge: hostile rows are rejected with a reason (never a crash), the
judge is checked before a run, and a run whose judge calls failed does not end "complete".

Servers start on 127.0.0.1 on a free port inside the test and stop by themselves."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading

import pytest
from aiohttp import web

from helpers import MULTIPROCESS, read_jsonl, run_cli_subprocess, write_jsonl
from evalbeam.pipelines.runners.judge_server import StandInServer

KEY = "sk-evalbeam-hostile-SECRET-42"
DEEP = "[" * 2000 + "]" * 2000
LONE = "hi \\ud800 there"            # a JSON escape of a lone surrogate, as it appears in a file


def run_text(*args) -> int:
    from evalbeam.pipelines.tasks.text import run

    return run([str(a) for a in args])


def free_port() -> int:
    """A port nothing listens on (bound, then released): connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------- hostile rows


def test_hostile_text_rows_are_rejected_with_reasons_on_the_multi_process_runner(tmp_path):
    """Lone surrogates under the rule metrics that used to crash on them, JSON nested 2,000
    deep, NaN and Infinity slice values: each a rejected row with its reason; the good rows
    are evaluated (before: a traceback and exit 3)."""
    gt = [{"datum_uid": "a", "references": ["hello world"], "metadata": {"g": "x"}},
          {"datum_uid": "b", "references": ["hello"], "metadata": {"g": "y"}},
          '{"datum_uid": "c", "references": ["x"], "metadata": {"g": NaN}}',
          '{"datum_uid": "d", "references": ["x"], "metadata": {"g": Infinity}}',
          '{"datum_uid": "e", "references": ["x"], "metadata": {"g": {"deep": -Infinity}}}',
          '{"datum_uid": "f", "references": ["x"], "metadata": {"h": ' + DEEP + '}}',
          {"datum_uid": "s1", "references": ["x"], "metadata": {"g": "x"}},
          {"datum_uid": "s2", "references": ["x"], "metadata": {"g": "x"}},
          '{"datum_uid": "s3", "query": "' + LONE + '", "references": ["x"]}']
    preds = [{"datum_uid": "a", "response": "hello world"},
             {"datum_uid": "b", "response": "mail me at jo@example.org"},
             '{"datum_uid": "s1", "response": "' + LONE + '"}',
             '{"datum_uid": "s2", "response": "ok", "contexts": ["\\udfff"]}',
             '{"datum_uid": "\\ud800", "response": "ok"}',
             '{"datum_uid": "x", "response": ' + DEEP + '}']
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    # Parquet ground truth: the same rule for a NaN slice value
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"datum_uid": ["p1", "p2"], "references": [["x"], ["x"]],
                             "metadata": [{"g": float("nan")}, {"g": 2.5}]}), tmp_path / "gt.parquet")
    code = run_text("--groundtruths", tmp_path / "gt.*", "--predictions", f"m={tmp_path / 'm.jsonl'}",
                    "--output", tmp_path / "out", "--slice", "g", "--quiet",
                    "--metrics", "ROUGE,PIILeakage,SensitiveDataLeakage,EncodingGuardrail",
                    *MULTIPROCESS)
    assert code == 1        # complete, with rejections
    reasons = {(r["source"], r["line"]): r["reason"] for r in read_jsonl(tmp_path / "out" / "rejected.jsonl")
               if "line" in r}
    surrogate = "holds a lone UTF-16 surrogate"
    assert reasons[("groundtruths", 3)] == ("metadata 'g' is nan: a slice value must be a string, "
                                            "a finite number, a boolean or null")
    assert reasons[("groundtruths", 4)].startswith("metadata 'g' is inf")
    assert reasons[("groundtruths", 5)].startswith("metadata 'g' is -inf")
    assert reasons[("groundtruths", 6)] == "JSON nested deeper than 64 levels"
    assert reasons[("groundtruths", 9)].startswith("the value of 'query' " + surrogate)
    assert reasons[("m", 3)].startswith("the value of 'response' " + surrogate)
    assert reasons[("m", 4)].startswith("the value of 'contexts' " + surrogate)
    assert reasons[("m", 5)].startswith("the value of 'datum_uid' " + surrogate)
    assert reasons[("m", 6)] == "JSON nested deeper than 64 levels"
    parquet = [r for r in read_jsonl(tmp_path / "out" / "rejected.jsonl") if r["file"].endswith(".parquet")]
    assert [(r["row"], r["datum_uid"], r["reason"][:20]) for r in parquet] == [(0, "p1", "metadata 'g' is nan:")]
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"]["groundtruths"] == {"rows_read": 11, "rows_evaluated": 5, "rows_rejected": 6}
    assert info["counts"]["m"] == {"rows_read": 6, "rows_evaluated": 2, "rows_rejected": 4}
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert sorted({json.dumps(r["slice"]) for r in records}) == ['{"g": "x"}', '{"g": "y"}', '{"g": 2.5}', "{}"]
    pii = {json.dumps(r["slice"]): r["value"] for r in records if r["type"] == "PIILeakage"}
    assert pii['{"g": "y"}']["fail"] == 1.0 and pii['{"g": "x"}']["fail"] == 0.0


def test_rows_of_a_users_pipeline_with_lone_surrogates_or_nan_slices_are_rejected():
    """EvaluateText on dicts: a Python string can hold a lone surrogate (a JSON parser let it
    through, or text decoded with errors="surrogateescape"), which no UTF-8 output can carry, and
    a NaN slice value, which no JSON output can carry."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from evalbeam.pipelines.launch.common import local_pipeline
    from evalbeam.transforms.io import TAG_REJECTED
    from evalbeam.transforms.kernels.text import TextConfig
    from evalbeam.transforms.text import EvaluateText, TextRowsFromDicts

    config = TextConfig(metrics=frozenset({"ROUGE", "PIILeakage"}))
    reader = TextRowsFromDicts([], 4, config)
    batch = [{"datum_uid": "a", "response": "x \ud800 y"}, {"datum_uid": "b\udc00", "response": "ok"},
             {"datum_uid": "c", "response": "ok", "contexts": ["fine", "\udfff"]},
             {"datum_uid": "d", "response": "ok"}]
    out = list(reader.process(("m", batch)))
    rejected = [o.value for o in out if isinstance(o, beam.pvalue.TaggedOutput) and o.tag == TAG_REJECTED]
    assert [r["reason"].split(" holds")[0] for r in rejected] == [
        "the value of 'response'", "the value of 'datum_uid'", "the value of 'contexts'"]
    assert all("datum_uid" not in r for r in rejected)     # a uid that is no text is left out
    pieces = [o for o in out if not isinstance(o, beam.pvalue.TaggedOutput)]
    assert [row.uid for _, (_, rows) in pieces for row in rows] == ["d"]

    with local_pipeline() as p:
        gt = p | "G" >> beam.Create([{"datum_uid": "a", "references": ["x"], "metadata": {"k": "v"}},
                                     {"datum_uid": "b", "references": ["x"], "metadata": {"k": float("nan")}}])
        preds = p | "M" >> beam.Create([{"datum_uid": "a", "response": "x"}, {"datum_uid": "b", "response": "x"}])
        records, rejects, _, _ = ({"groundtruths": gt, "m": preds}
                                  | EvaluateText(config, slices=[("k",)], with_diagnostics=True))
        assert_that(rejects | beam.Map(lambda r: (r["source"], r.get("datum_uid"), r["reason"][:16])),
                    equal_to([("groundtruths", "b", "metadata 'k' is "), ("m", "b", "no valid ground ")]),
                    label="rejects")
        assert_that(records | beam.Map(lambda r: json.dumps(r["slice"])) | beam.Distinct(),
                    equal_to(["{}", '{"k": "v"}']), label="slices")


def test_wrong_task_files_and_cut_gzip_stop_before_the_run(tmp_path, capsys):
    """A detection file given to `evalbeam text` names the right command; a .gz cut short is an
    input error. Both exit 2 before anything is written."""
    write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "references": ["x"]}])
    write_jsonl(tmp_path / "det.jsonl", [{"datum_uid": "a", "annotations": [{"bbox": [0, 0, 1, 1], "label": "cat"}]}])
    assert run_text("--groundtruths", tmp_path / "det.jsonl", "--predictions", f"m={tmp_path / 'gt.jsonl'}",
                    "--output", tmp_path / "out1") == 2
    assert "evalbeam detection" in capsys.readouterr().err
    whole = gzip.compress(b"".join(json.dumps({"datum_uid": f"u{i}", "response": "a b c " * 20}).encode()
                                   + b"\n" for i in range(400)))
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    assert run_text("--groundtruths", tmp_path / "gt.jsonl", "--predictions", f"m={tmp_path / 'cut.jsonl.gz'}",
                    "--output", tmp_path / "out2") == 2
    assert "does not end as a complete compressed file" in capsys.readouterr().err
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()


# ---------------------------------------------------------------- the judge, checked first


class EndpointDouble:
    """An endpoint on 127.0.0.1 whose GET <prefix>/v1/models answers by prefix: /k401 401 (with
    the Authorization header echoed back, as a careless server might), /k404 404, /hang never
    (in time); anything else 404."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def handle(self, request):
        path = request.path
        if path.startswith("/k401"):
            return web.json_response({"error": {"message": "bad key " + request.headers.get("Authorization", ""),
                                                "code": "invalid_api_key"}}, status=401)
        if path.startswith("/hang"):
            await asyncio.sleep(3.0)
        return web.json_response({"error": {"message": "no such path", "code": None}}, status=404)

    async def _start(self):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.2)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    def __enter__(self):
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture()
def text_data(tmp_path):
    gt = [{"datum_uid": f"d{i}", "query": "Where is the Eiffel Tower?",
           "references": ["The Eiffel Tower is in Paris."]} for i in range(3)]
    preds = [{"datum_uid": f"d{i}", "response": f"It is in Paris, says source {i}.",
              "contexts": ["The Eiffel Tower is in Paris."]} for i in range(3)]
    return (write_jsonl(tmp_path / "gt.jsonl", gt), write_jsonl(tmp_path / "m.jsonl", preds))


def test_judge_endpoint_and_key_are_checked_before_anything_is_written(tmp_path, text_data, monkeypatch,
                                                                        capsys):
    import evalbeam.pipelines.tasks.judge_options as judge_options

    gt, preds = text_data
    monkeypatch.setenv("EVALBEAM_HOSTILE_KEY", KEY)
    monkeypatch.delenv("EVALBEAM_HOSTILE_UNSET", raising=False)
    monkeypatch.setattr(judge_options, "CHECK_TIMEOUT_S", 0.5)   # the never-answering case
    base = ["--groundtruths", gt, "--predictions", f"m={preds}", "--metrics", "Faithfulness",
            "--output", tmp_path / "out", "--quiet"]
    refused = f"http://127.0.0.1:{free_port()}/v1"
    with EndpointDouble() as double:
        cases = [
            (["--judge_url", refused], "cannot connect to the judge endpoint http://127.0.0.1:"),
            (["--judge_url", double.base + "/k401/v1", "--judge_api_key_env", "EVALBEAM_HOSTILE_KEY"],
             "refused the key in EVALBEAM_HOSTILE_KEY (HTTP 401 invalid_api_key to GET /models)"),
            (["--judge_url", double.base + "/k404/v1"], "usually ends in /v1"),
            (["--judge_url", double.base + "/hang/v1"], "did not answer GET /models within 0.5 s"),
            (["--judge_url", refused, "--judge_api_key_env", "EVALBEAM_HOSTILE_UNSET"],
             "--judge_api_key_env names EVALBEAM_HOSTILE_UNSET, which is not set"),
            (["--judge_url", "localhost:8000/v1"], "--judge_url must start with http:// or https://"),
        ]
        for args, message in cases:
            assert run_text(*base, *args) == 2, args
            err = capsys.readouterr().err
            assert message in err and KEY not in err and "Traceback" not in err, err
            assert len(err.strip().splitlines()) == 1, err       # one paragraph
    assert not (tmp_path / "out").exists()                       # nothing written, not even the folder
    # a dry run sends nothing, so nothing is checked
    assert run_text(*base, "--judge_url", refused, "--judge_dry_run") == 0


def test_failed_judge_calls_make_the_run_incomplete_unless_within_the_limit(tmp_path, text_data, capsys):
    """--judge_skip_check against an endpoint that refuses connections: every call fails, the
    outputs are written, and the run is incomplete (exit 4; before: exit 0, "complete"), even
    with --judge_max_failed_fraction 1."""
    gt, preds = text_data
    refused = f"http://127.0.0.1:{free_port()}/v1"
    base = ["--groundtruths", gt, "--predictions", f"m={preds}", "--metrics", "ROUGE,Hallucination",
            "--judge_url", refused, "--judge_skip_check", "--judge_max_attempts", "1"]
    assert run_text(*base, "--output", tmp_path / "strict", "--quiet") == 4
    err = capsys.readouterr().err
    assert 'the run is incomplete (status "incomplete", exit 4)' in err
    info = json.loads((tmp_path / "strict" / "run.json").read_text())
    assert info["status"] == "incomplete" and info["options"]["judge"]["skip_check"] is True
    (failed,) = [p for p in info["problems"] if p["code"] == "judge_failed"]
    assert failed["severity"] == "error"
    assert failed["message"].startswith("judge metric Hallucination: 3 of 3 datums could not be judged "
                                        "(http_error 3; e.g. http_error: connection error: ")
    assert "it has no value" in failed["message"] and failed["message"] in err
    assert info["judge"]["failed_by_status"] == {"http_error": 3}
    assert (tmp_path / "strict" / "metrics.jsonl").exists()
    # --judge_max_failed_fraction 1 allows every failure, but with no datum judged the metric
    # has no value: still incomplete (within the limit with some judged: the unit test below)
    assert run_text(*base, "--output", tmp_path / "lenient", "--judge_max_failed_fraction", "1") == 4
    err = capsys.readouterr().err
    info = json.loads((tmp_path / "lenient" / "run.json").read_text())
    assert info["status"] == "incomplete"
    (failed,) = [p for p in info["problems"] if p["severity"] == "error"]
    assert failed["code"] == "judge_failed" and "none was judged, so it has no value" in failed["message"]
    assert failed["message"] in err


def test_judge_problems_count_failures_per_metric_over_the_datums_asked():
    from evalbeam.transforms.judge.report import judge_problems

    def record(kind, model, counts, **parameters):
        return {"type": kind, "model": model, "slice": {}, "parameters": parameters, "counts": counts}

    records = [record("Faithfulness", "a", {"ok": 8, "timeout": 1, "not_applicable": 10}),
               record("Faithfulness", "b", {"ok": 9, "missing_prediction": 5, "no_statements": 1}),
               record("BYOP", "a", {"ok": 1, "invalid_output": 1, "refused": 2}, template="polite"),
               record("Toxicity", "a", {"ok": 3, "not_sent": 2}),
               record("Bias", "a", {"dry_run": 4})]
    found = {p["message"].split(":")[0]: p for p in judge_problems(records, 0.05, {"timeout": "deadline 3s"})}
    # Faithfulness: 1 failed of 19 asked (not_applicable and missing_prediction are not asked) > 0.05
    assert found["judge metric Faithfulness"]["severity"] == "error"
    assert "1 of 19 datums could not be judged (timeout 1; e.g. timeout: deadline 3s)" in \
        found["judge metric Faithfulness"]["message"]
    assert "the mean over the 17 datums judged ok" in found["judge metric Faithfulness"]["message"]
    assert "invalid_output 1, refused 2" in found["judge metric BYOP (polite)"]["message"]
    assert found["the judge budget (--judge_max_calls / --judge_max_cost) was reached"]["severity"] == "warning"
    assert "Toxicity 2" in found["the judge budget (--judge_max_calls / --judge_max_cost) was reached"]["message"]
    assert "judge metric Bias" not in found and "judge metric Toxicity" not in found
    relaxed = judge_problems(records, 0.75)
    assert {p["code"] for p in relaxed} == {"judge_failed_within_limit", "judge_not_sent"}
    assert judge_problems(records[:2], 1 / 19)[0]["code"] == "judge_failed_within_limit"   # not more than
    # every datum failed: an error whatever the fraction allows (the metric has no value)
    none = judge_problems([record("Faithfulness", "a", {"timeout": 2, "not_applicable": 1})], 1.0)
    assert [p["code"] for p in none] == ["judge_failed"] and "none was judged" in none[0]["message"]


# ---------------------------------------------------------------- the stand-in's verdicts


def test_stand_in_catches_a_plain_contradiction_through_the_cli(tmp_path):
    """`evalbeam text` (its own process) against `evalbeam judge-server`'s rules: an answer that
    puts the Eiffel Tower in Rome against a context and a reference saying Paris is a
    hallucination, unfaithful and incorrect; the faithful answer is none of these (before:
    Hallucination 1 for the faithful answer, AnswerCorrectness 1 for Rome)."""
    context = ["The Eiffel Tower is in Paris.", "It was completed in 1889.", "Gustave Eiffel's company built it."]
    gt = [{"datum_uid": uid, "query": "Where is the Eiffel Tower?", "references": ["The Eiffel Tower is in Paris."]}
          for uid in ("faithful", "rome", "year")]
    preds = [{"datum_uid": "faithful", "response": "The Eiffel Tower is in Paris. It was completed in 1889.",
              "contexts": context},
             {"datum_uid": "rome", "response": "The Eiffel Tower is in Rome.", "contexts": context},
             {"datum_uid": "year", "response": "The Eiffel Tower is in Paris. It was completed in 1925.",
              "contexts": context}]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    with StandInServer() as server:
        done = run_cli_subprocess(["text", "--groundtruths", tmp_path / "gt.jsonl", "--predictions",
                                   f"m={tmp_path / 'm.jsonl'}", "--output", tmp_path / "out", "--metrics",
                                   "Hallucination,Faithfulness,AnswerCorrectness,AnswerAccuracy",
                                   "--judge_url", server.url, "--judge_rpm", "100000"])
        assert server.stats()["requests"] > 0
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    scores = {(s["datum_uid"], s["metric"]): s["value"] for s in read_jsonl(tmp_path / "out" / "scores.jsonl")}
    assert scores[("faithful", "Hallucination")] == 0.0
    assert scores[("faithful", "Faithfulness")] == 1.0
    # its second statement is not in the reference: a "no", as the template asks (F1 2/3)
    assert scores[("faithful", "AnswerCorrectness")] == pytest.approx(2 / 3)
    assert scores[("faithful", "AnswerAccuracy")] == 1.0
    assert scores[("rome", "Hallucination")] == pytest.approx(1 / 3)   # one context of three says Paris
    assert scores[("rome", "Faithfulness")] == 0.0
    assert scores[("rome", "AnswerCorrectness")] == 0.0
    assert scores[("rome", "AnswerAccuracy")] == 0.0
    assert scores[("year", "Hallucination")] == pytest.approx(1 / 3)   # 1925 against 1889
    assert scores[("year", "Faithfulness")] == 0.5
