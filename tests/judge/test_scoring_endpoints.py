"""Classifier metrics from scoring endpoints (`--model_uri METRIC=URL`): TEI's /predict and vLLM's
/classify and /score on the stand-in server, every per-datum score checked against the stand-in's
own classifiers; the answer reader on good and broken answers; the problems that stop a run
before it starts; the scoring key kept apart from the judge's."""

from __future__ import annotations

import json
import math
import os
import subprocess

from helpers import MULTIPROCESS, write_jsonl
from evalbeam.transforms.judge import scoring
from evalbeam.pipelines.runners.stand_in import PAIR_LABELS, TEXT_LABELS, classifier_logits, softmax
from evalbeam.transforms.kernels.judge_scores import split_sentences

PREDICTIONS = [
    {"datum_uid": "a", "response": "The tower stands in Paris. You are a fool!",
     "contexts": ["The tower is in Paris. It is tall.", "Rivers flow."]},
    {"datum_uid": "b", "response": "It was built in 1291 by monks.",
     "contexts": ["Bridges are old.", "The bridge was built in 1291 by monks."]},
    {"datum_uid": "c", "response": "Red"}]


def sigmoid(value: float) -> float:
    return 1.0 / (1.0 + math.exp(-value))


def run_text(tmp_path, name: str, uris: list[str], metrics: str, *extra, env=None):
    truths = [{"datum_uid": p["datum_uid"], "query": "q"} for p in PREDICTIONS]
    gt = write_jsonl(tmp_path / "gt.jsonl", truths)
    pred = write_jsonl(tmp_path / "pred.jsonl", PREDICTIONS)
    args = ["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}",
            "--output", tmp_path / name, "--metrics", metrics, "--quiet", *extra]
    for uri in uris:
        args += ["--model_uri", uri]
    return subprocess.run(args, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


def scores_of(out) -> dict:
    return {(r["datum_uid"], r["metric"], r["parameters"].get("label")): r
            for r in map(json.loads, open(out / "scores.jsonl", encoding="utf-8"))}


def test_scoring_endpoints_match_the_stand_in_on_two_workers(tmp_path):
    """TEI with #multi_label (toxicity: each label's sigmoid of the raw scores, max over
    sentences), vLLM /classify (bias: label 1 of the softmax, unnamed) and TEI pairs (HHEM:
    the softmax's "consistent", max over contexts), on two worker processes; then TEI without
    #multi_label (the server's softmax, the "Biased" label by name) and vLLM /score for HHEM,
    run twice on one journal: the second run sends nothing and scores the same."""
    from evalbeam.pipelines.runners.judge_server import StandInServer

    with StandInServer() as server:
        b = server.base
        done = run_text(tmp_path, "out", [f"ToxicityClassifier={b}/predict#multi_label",
                                          f"FairnessBias={b}/v1/classify", f"HHEM={b}/predict"],
                        "ToxicityClassifier,FairnessBias,HHEM", *MULTIPROCESS)
        assert done.returncode == 0, done.stderr[-3000:]
        second = [f"FairnessBias={b}/predict", f"HHEM={b}/score"]
        journal = ["--judge_journal", tmp_path / "journal"]
        again = run_text(tmp_path, "out2", second, "FairnessBias,HHEM", *journal)
        assert again.returncode == 0, again.stderr[-3000:]
        server.reset_stats()
        # a rerun is answered from the journal: nothing is sent (GET /info is not counted)
        rerun = run_text(tmp_path, "out3", second, "FairnessBias,HHEM", *journal)
        assert rerun.returncode == 0 and server.stats()["requests"] == 0, rerun.stderr[-3000:]
        scores = [(tmp_path / out / "scores.jsonl").read_bytes() for out in ("out2", "out3")]
        assert scores[0] == scores[1]
    first, second = scores_of(tmp_path / "out"), scores_of(tmp_path / "out2")
    consistent = PAIR_LABELS.index("consistent")
    for p in PREDICTIONS:
        uid, response = p["datum_uid"], p["response"]
        for k, label in enumerate(TEXT_LABELS):
            want = max(sigmoid(classifier_logits(s)[k]) for s in split_sentences(response))
            assert math.isclose(first[(uid, "ToxicityClassifier", label)]["value"], want, rel_tol=1e-12)
        assert math.isclose(first[(uid, "FairnessBias", "LABEL_1")]["value"],
                            softmax(classifier_logits(response))[1], rel_tol=1e-12)
        assert math.isclose(second[(uid, "FairnessBias", "Biased")]["value"],
                            softmax(classifier_logits(response))[TEXT_LABELS.index("Biased")], rel_tol=1e-12)
        for scores in (first, second):
            row = scores[(uid, "HHEM", None)]
            if not p.get("contexts"):
                assert row["status"] == "not_applicable"
                continue
            want = max(softmax(classifier_logits(c, response))[consistent] for c in p["contexts"])
            assert math.isclose(row["value"], want, rel_tol=1e-12)
    run = json.load(open(tmp_path / "out" / "run.json", encoding="utf-8"))
    assert run["status"] == "complete"
    assert run["options"]["judge"]["model_uris"]["ToxicityClassifier"].endswith("/predict#multi_label")
    records = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl", encoding="utf-8")]
    assert {r["parameters"]["label"] for r in records if r["type"] == "ToxicityClassifier"} == set(TEXT_LABELS)


def test_a_failing_scoring_endpoint_makes_the_run_incomplete(tmp_path):
    """Every answer cut in half: the datums fail with http_error, the run ends incomplete (exit 4)."""
    from evalbeam.pipelines.runners.judge_server import StandInServer

    with StandInServer(fault_rate=1.0, faults=("malformed",)) as server:
        done = run_text(tmp_path, "out", [f"HHEM={server.base}/predict"], "HHEM",
                        "--judge_max_attempts", "1")
    assert done.returncode == 4, done.stderr[-3000:]
    run = json.load(open(tmp_path / "out" / "run.json", encoding="utf-8"))
    assert run["status"] == "incomplete"
    statuses = {r["status"] for r in scores_of(tmp_path / "out").values()}
    assert statuses == {"http_error", "not_applicable"}


def test_answers_are_read_and_broken_ones_refused():
    tei = scoring.parse_endpoint("http://h/predict")
    raw = scoring.parse_endpoint("http://h/predict#multi_label")
    vllm = scoring.parse_endpoint("http://h:8000/v1/classify")
    score = scoring.parse_endpoint("https://h/score")
    good = [{"label": "b", "score": 0.75}, {"label": "a", "score": 0.25}]
    assert scoring.read_answer(tei, good) == {"labels": ["b", "a"], "probabilities": [0.75, 0.25]}
    assert scoring.read_answer(tei, [good])["labels"] == ["b", "a"]          # a batch of one
    got = scoring.read_answer(raw, [{"label": "x", "score": -800.0}, {"label": "y", "score": 2.0}])
    assert got["probabilities"] == [0.0, sigmoid(2.0)]                         # no overflow
    assert scoring.read_answer(vllm, {"data": [{"probs": [0.5, 0.5]}]}) == {
        "labels": ["LABEL_0", "LABEL_1"], "probabilities": [0.5, 0.5]}
    assert scoring.read_answer(score, {"data": [{"score": 0.9}]}) == {
        "labels": ["consistent"], "probabilities": [0.9]}
    for endpoint, broken in [
            (tei, []), (tei, {"label": "a"}), (tei, [{"label": "a", "score": 1.5}]),
            (tei, [{"label": "a", "score": float("nan")}]), (tei, [{"label": "a", "score": True}]),
            (tei, [{"label": "a", "score": 0.5}, {"label": "a", "score": 0.5}]), (tei, [{"score": 0.5}]),
            (raw, [{"label": "a", "score": "1"}]), (vllm, {"data": []}), (vllm, {"data": [{"probs": []}]}),
            (vllm, {"data": [{"probs": [-0.1, 1.1]}]}), (vllm, [1]), (score, {"data": [{"score": None}]}),
            (score, {"data": [{"score": 2}]}), (score, "text")]:
        assert scoring.read_answer(endpoint, broken) is None, broken
    assert scoring.parse_endpoint("http://u:pw@h:9/x/predict?token=s#multi_label").shown == \
        "http://h:9/x/predict#multi_label"


def test_scoring_endpoint_problems_stop_before_the_run(tmp_path, capsys):
    """A metric the route cannot serve, an unknown route or fragment, an endpoint that does not
    answer, a key variable that is not set: exit 2, one paragraph, nothing written."""
    import socket

    from evalbeam.pipelines.launch.launcher import run_task
    from evalbeam.pipelines.tasks.registry import task_of

    with socket.socket() as probe:      # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    cases = [(["BERTScore=http://127.0.0.1:1/predict"], "BERTScore", "BERTScore"),
             (["HHEM=http://127.0.0.1:1/classify"], "HHEM", "pairs"),
             (["FairnessBias=http://127.0.0.1:1/score"], "FairnessBias", "single texts"),
             (["FairnessBias=http://127.0.0.1:1/embed"], "FairnessBias", "/predict"),
             (["FairnessBias=http://127.0.0.1:1/classify#multi_label"], "FairnessBias", "#multi_label"),
             ([f"FairnessBias=http://127.0.0.1:{closed}/predict"], "FairnessBias", "cannot connect")]
    cases.append(([f"FairnessBias=http://127.0.0.1:{closed}/predict", "--model_api_key_env",
                   "EVALBEAM_TEST_UNSET_KEY"], "FairnessBias", "EVALBEAM_TEST_UNSET_KEY"))
    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "query": "q"}])
    pred = write_jsonl(tmp_path / "pred.jsonl", PREDICTIONS[:1])
    for uris, metric, said in cases:     # in this process: the usage check runs before Beam
        code = run_task(task_of("text"), ["--groundtruths", gt, "--predictions", f"m={pred}",
                                          "--output", str(tmp_path / "out"), "--metrics", metric,
                                          "--model_uri", *uris])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err
        assert said in err and "--model_uri" in err, err
        assert not (tmp_path / "out").exists()


def test_the_scoring_key_and_rate_are_their_own(tmp_path, monkeypatch):
    """The judge's key never goes to a scoring endpoint; --model_api_key_env's does. The rate is
    --model_rpm's share per worker, not the judge's; unlimited without it."""
    from evalbeam.transforms.judge.session import JudgeSession
    from evalbeam.transforms.judge.transform import JudgeSettings

    monkeypatch.setenv("OPENAI_API_KEY", "judge-secret")
    monkeypatch.setenv("SCORER_KEY", "scorer-secret")
    for key_env, want, model_rpm, rpm in (("", "", None, 10 ** 12), ("SCORER_KEY", "scorer-secret", 120.0, 60)):
        settings = JudgeSettings(url="", rpm=30, workers=2, model_api_key_env=key_env, model_rpm=model_rpm)
        session = JudgeSession(settings, str(tmp_path / "journal"))
        session.open()
        try:
            client = session.run(session._scoring_client("http://127.0.0.1:1/predict#multi_label"))
            assert client.url == "http://127.0.0.1:1/predict"
            assert client._api_key == want
            assert client.limiter.requests.limit == rpm
        finally:
            session.close()
