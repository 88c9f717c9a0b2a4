"""Models on the workers and scoring endpoints that misbehave: a NaN or infinite output, an output
that does not fit config.json's labels, an encoder of the wrong kind fail their datums
(model_error, exit 4), never the run or a score under the wrong label; a config.json that
cannot describe the model, a model.onnx or tokenizer.json that cannot load, an unknown
filesystem scheme stop the run before it starts (exit 2, one paragraph); a scoring server that
echoes the API key cannot put it in any output."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from helpers import run_cli_here, write_jsonl

pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")

PREDICTIONS = [{"datum_uid": "a", "response": "the red tower ."},
               {"datum_uid": "b", "response": "paris is old ."}]


def with_bad_word(folder: Path, word: str, value: float) -> Path:
    """The model with `word`'s embedding row set to value (NaN, inf): only texts holding the
    word get a non-finite output."""
    import onnx
    from onnx import numpy_helper

    from tiny_models import vocabulary

    model = onnx.load(str(folder / "model.onnx"))
    table = next(i for i in model.graph.initializer if i.name == "embedding")
    rows = numpy_helper.to_array(table).copy()
    rows[vocabulary(folder)[word]] = value
    table.CopyFrom(numpy_helper.from_array(rows, "embedding"))
    onnx.save(model, str(folder / "model.onnx"))
    return folder


def run(tmp_path, name: str, *options) -> subprocess.CompletedProcess:
    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": p["datum_uid"], "query": "q",
                                               "references": ["the red tower ."]} for p in PREDICTIONS])
    pred = write_jsonl(tmp_path / "pred.jsonl", PREDICTIONS)
    return subprocess.run(["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}",
                           "--output", tmp_path / name, "--quiet", *map(str, options)],
                          capture_output=True, text=True, timeout=600)


def statuses(out: Path) -> dict:
    return {(r["metric"], r["datum_uid"], r["parameters"].get("label") or r["parameters"].get("component")):
            (r["status"], r["details"].get("error", "")) for r in map(json.loads, open(out / "scores.jsonl"))}


def test_a_non_finite_output_fails_its_datum_only(tmp_path):
    """NaN in the LM, the classifier and the encoder for the word "paris": datum b is
    model_error in every metric, datum a is scored, the run ends incomplete (exit 4) with its
    outputs written."""
    from tiny_models import write_tiny_causal_lm, write_tiny_classifier, write_tiny_encoder

    lm = with_bad_word(write_tiny_causal_lm(tmp_path / "lm"), "paris", np.nan)
    tox = with_bad_word(write_tiny_classifier(tmp_path / "tox", ["toxic", "insult"], multi_label=True),
                        "paris", np.inf)
    enc = with_bad_word(write_tiny_encoder(tmp_path / "enc"), "paris", np.nan)
    done = run(tmp_path, "out", "--metrics", "Perplexity,ToxicityClassifier,BERTScore", "--lm_uri", lm,
               "--model_uri", f"ToxicityClassifier={tox}", "--model_uri", f"BERTScore={enc}")
    assert done.returncode == 4, done.stderr[-3000:]
    run_info = json.load(open(tmp_path / "out" / "run.json", encoding="utf-8"))
    assert run_info["status"] == "incomplete" and (tmp_path / "out" / "metrics.jsonl").exists()
    got = statuses(tmp_path / "out")
    assert len(got) == 2 * 6
    for (metric, uid, _), (status, error) in got.items():
        if uid == "a":
            assert status == "ok", (metric, error)
        else:
            assert status == "model_error" and "NaN or infinity" in error, (metric, status, error)


def test_a_model_that_does_not_fit_its_config_fails_every_datum(tmp_path):
    """A 3-output classifier whose config.json names 5 labels, a classifier given as BERTScore's
    encoder: model_error for every datum (never label 0's probability under five names); with
    nothing judged, the run is incomplete even with --judge_max_failed_fraction 1."""
    from tiny_models import write_tiny_classifier

    bias = write_tiny_classifier(tmp_path / "bias", ["a", "b", "c"])
    config = json.loads((bias / "config.json").read_text())
    config["id2label"] = {str(i): name for i, name in enumerate(["x", "Biased", "y", "z", "w"])}
    (bias / "config.json").write_text(json.dumps(config))
    classifier = write_tiny_classifier(tmp_path / "cls", ["p", "q"])
    done = run(tmp_path, "out", "--metrics", "FairnessBias,BERTScore", "--model_uri", f"FairnessBias={bias}",
               "--model_uri", f"BERTScore={classifier}", "--judge_max_failed_fraction", "1")
    assert done.returncode == 4, done.stderr[-3000:]
    got = statuses(tmp_path / "out")
    assert {status for status, _ in got.values()} == {"model_error"}
    assert "config.json names 5 label(s)" in got[("FairnessBias", "a", "Biased")][1]
    assert "not one vector per token" in got[("BERTScore", "a", "f1")][1]
    problems = json.load(open(tmp_path / "out" / "run.json", encoding="utf-8"))["problems"]
    # one per metric record: FairnessBias (Biased), BERTScore's three components
    assert [p["code"] for p in problems if p["severity"] == "error"] == ["judge_failed"] * 4
    assert all("none was judged" in p["message"] for p in problems if p["code"] == "judge_failed")


def test_unusable_model_options_stop_before_the_run(tmp_path, capsys):
    """An unknown filesystem scheme, labels named twice, a prompt that repeats its fields: exit
    2, one paragraph, no traceback, nothing written."""
    from tiny_models import write_tiny_classifier

    twice = write_tiny_classifier(tmp_path / "twice", ["toxic", "toxic", "insult"])
    prompt = write_tiny_classifier(tmp_path / "prompt", ["hallucinated", "consistent"],
                                   prompt="{text1} {text2} " * 3)
    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "query": "q"}])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": "a", "response": "r", "contexts": ["c"]}])
    base = ["text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", tmp_path / "out"]
    for options, said in [
            (["--metrics", "Perplexity", "--lm_uri", "ftp://127.0.0.1/lm"], "no Beam filesystem reads ftp://"),
            (["--metrics", "BERTScore", "--model_uri", "BERTScore=foo://bar"], "no Beam filesystem reads foo://"),
            (["--metrics", "ToxicityClassifier", "--model_uri", f"ToxicityClassifier={twice}"],
             "names a label twice"),
            (["--metrics", "HHEM", "--model_uri", f"HHEM={prompt}"], "once each")]:
        done = run_cli_here(base + options, capsys)
        assert done.returncode == 2, (options, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "out").exists()


def test_a_model_folder_that_cannot_load_stops_before_the_run(tmp_path, capsys):
    """model.onnx cut short, random bytes, empty, without input_ids or with its weights in
    another file; tokenizer.json broken: exit 2, one paragraph, nothing written (before: the
    run started and every datum was model_error, exit 4)."""
    import onnx

    from tiny_models import write_tiny_causal_lm, write_tiny_encoder

    good = write_tiny_causal_lm(tmp_path / "lm")
    whole = (good / "model.onnx").read_bytes()
    broken = {"cut": whole[:len(whole) // 2], "random": np.random.default_rng(0).bytes(2000), "empty": b""}
    model = onnx.load(str(good / "model.onnx"))
    model.graph.input[0].name = "ids"
    model.graph.node[0].input[1] = "ids"
    broken["renamed"] = model.SerializeToString()
    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "query": "q"}])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": "a", "response": "the red tower ."}])
    base = ["text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", tmp_path / "out"]

    def stops(options, *said):
        done = run_cli_here(base + options, capsys)
        assert done.returncode == 2, (options, done.stderr)
        assert all(s in done.stderr for s in said) and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not (tmp_path / "out").exists()

    for name, data in broken.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "model.onnx").write_bytes(data)
        (folder / "tokenizer.json").write_bytes((good / "tokenizer.json").read_bytes())
        said = {"cut": "truncated", "random": "not an ONNX model file", "empty": "the file is empty",
                "renamed": "no input named input_ids (its inputs: 'ids', 'attention_mask')"}[name]
        stops(["--metrics", "Perplexity", "--lm_uri", folder], f"--lm_uri {folder}: model.onnx is not a model", said)
    (tmp_path / "cut" / "config.json").write_text("{}")
    stops(["--metrics", "ToxicityClassifier", "--model_uri", f"ToxicityClassifier={tmp_path / 'cut'}"],
          "truncated")
    external = write_tiny_encoder(tmp_path / "external")
    model = onnx.load(str(external / "model.onnx"))
    onnx.save(model, str(external / "model.onnx"), save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    stops(["--metrics", "BERTScore", "--model_uri", f"BERTScore={external}"], "ONNX external data")
    (good / "tokenizer.json").write_text('{"model": ')
    stops(["--metrics", "Perplexity", "--lm_uri", good], "tokenizer.json cannot be read")


def test_the_model_file_check_reads_around_the_weights(tmp_path):
    """onnx_file_problem passes the reference models' exports and refuses every cut of a model
    file; it reads none of a weight's bytes."""
    import io

    from evalbeam.transforms.judge.onnx_file import onnx_file_problem
    from tiny_models import write_tiny_causal_lm

    for path in sorted((Path(__file__).parent.parent / "reference_models").glob("*/model.onnx")):
        with open(path, "rb") as stream:
            assert onnx_file_problem(stream) is None, path
    whole = (write_tiny_causal_lm(tmp_path / "lm") / "model.onnx").read_bytes()
    for cut in range(0, len(whole), 7):
        assert onnx_file_problem(io.BytesIO(whole[:cut])) is not None, cut

    class Counted(io.BytesIO):
        """Counts the bytes read."""
        taken = 0

        def read(self, size=-1):
            data = super().read(size)
            Counted.taken += len(data)
            return data

    big = write_tiny_causal_lm(tmp_path / "big", dim=4096)     # weights: 2 x 4096 x 42 floats
    data = (big / "model.onnx").read_bytes()
    assert onnx_file_problem(Counted(data)) is None
    assert Counted.taken < 5000 < len(data) // 100, (Counted.taken, len(data))

    class Unseekable(io.BytesIO):
        def seekable(self):
            return False

    assert onnx_file_problem(Unseekable(b"not a model")) is None     # not checked, never refused


class _Echo(BaseHTTPRequestHandler):
    """A TEI-shaped classifier that answers with the Authorization header it was sent."""

    def _send(self, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):   # noqa: N802 (http.server's name)
        self._send({"model_type": {"classifier": {"id2label": {"0": "Non-biased", "1": "Biased"}}}})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        echoed = self.headers.get("Authorization", "")
        self._send([{"label": "Biased", "score": 0.5}, {"label": f"seen {echoed}", "score": 0.5}])

    def log_message(self, *args):
        pass


def test_a_server_echoing_the_key_cannot_put_it_in_the_outputs(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key = "sk-echo-TESTKEY-123456"
    try:
        gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "query": "q"}])
        pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": "a", "response": "the red tower ."}])
        done = subprocess.run(
            ["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", tmp_path / "out",
             "--metrics", "FairnessBias", "--quiet", "--model_api_key_env", "ECHO_KEY",
             "--model_uri", f"FairnessBias=http://127.0.0.1:{server.server_port}/predict"],
            capture_output=True, text=True, timeout=600, env=dict(os.environ, ECHO_KEY=key))
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    assert key not in done.stdout + done.stderr
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert any("journal" in str(p) for p in files)
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        assert key not in text, path
    journal = "".join(p.read_text() for p in files if "journal" in str(p))
    assert "seen Bearer ***" in journal
