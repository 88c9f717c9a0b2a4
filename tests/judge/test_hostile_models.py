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


# ------------------------------------------------- the tokenizer's ids against the model's size

def with_tokenizer_of(folder: Path, other: Path) -> Path:
    """The model of `folder` with the tokenizer.json of the model folder `other`."""
    (folder / "tokenizer.json").write_bytes((other / "tokenizer.json").read_bytes())
    return folder


def test_the_vocabulary_rule_on_real_models():
    """A tokenizer is far smaller than its model under 90% of the model's rows, unless the rows
    are its size rounded up to a multiple of 64 or 128: padded real models pass, a tokenizer of
    another model family does not."""
    from evalbeam.pipelines.tasks.judge_options import vocabulary_far_smaller

    padded = [(50_257, 50_304),     # GPT-2's tokenizer, logits padded to a multiple of 64
              (151_646, 151_936),   # Qwen2
              (32_100, 32_128),     # T5
              (50_295, 51_200),     # Phi-2: 905 rows more, 98.2%
              (50, 64), (900, 1_024), (400, 400), (37, 37)]
    for tokens, rows in padded:
        assert not vocabulary_far_smaller(tokens, rows), (tokens, rows)
    for tokens, rows in [(6, 37), (30, 37), (50_257, 128_256), (32_000, 151_936), (50, 65)]:
        assert vocabulary_far_smaller(tokens, rows), (tokens, rows)


def test_a_weights_header_is_read_whether_its_dims_are_packed_or_not():
    """A TensorProto's dims, one varint per field (onnx's own writer) or packed (proto3 writers),
    and its name are read without its data; a packed field that runs past its end is malformed."""
    import io

    import onnx

    from evalbeam.transforms.judge.onnx_file import _Malformed, _tensor_header

    packed = bytes([0x0A, 0x02, 37, 8, 0x42, 0x03]) + b"emb" + bytes([0x4A, 0x04]) + b"\0" * 4
    assert list(onnx.TensorProto.FromString(packed).dims) == [37, 8]
    unpacked = onnx.numpy_helper.from_array(np.zeros((37, 8), np.float32), "emb").SerializeToString()
    for data in (packed, unpacked):
        assert _tensor_header(io.BytesIO(data), 0, len(data)) == ("emb", [37, 8], False)
    broken = bytes([0x0A, 0x02, 37, 0x88, 0x01])    # the second varint ends past the field
    with pytest.raises(_Malformed, match="packed dims run past"):
        _tensor_header(io.BytesIO(broken), 0, len(broken))


def test_a_tokenizer_with_ids_the_model_lacks_stops_before_the_run(tmp_path, capsys):
    """A tokenizer whose ids reach the model's logits (a causal LM) or its embedding table's rows
    (a classifier, an encoder), or config.json's vocab_size when the graph does not tell: exit 2,
    one paragraph naming both sizes, nothing written (before: the run started and every datum
    holding such a token failed on the workers)."""
    import onnx
    from onnx import helper

    from tiny_models import write_tiny_causal_lm, write_tiny_classifier, write_tiny_encoder

    few = ("the", "red", "tower")
    full_lm = write_tiny_causal_lm(tmp_path / "full_lm")
    full_classifier = write_tiny_classifier(tmp_path / "full_classifier", ["toxic"])
    lm = with_tokenizer_of(write_tiny_causal_lm(tmp_path / "lm", words=few), full_lm)
    toxic = with_tokenizer_of(write_tiny_classifier(tmp_path / "tox", ["toxic"], words=few), full_classifier)
    encoder = with_tokenizer_of(write_tiny_encoder(tmp_path / "enc", words=few), full_classifier)
    # a graph that hides its table behind an Identity: config.json's vocab_size tells the size
    hidden = write_tiny_classifier(tmp_path / "hidden", ["toxic"])
    model = onnx.load(str(hidden / "model.onnx"))
    model.graph.node[0].input[0] = "table"
    model.graph.node.insert(0, helper.make_node("Identity", ["embedding"], ["table"]))
    onnx.save(model, str(hidden / "model.onnx"))
    config = json.loads((hidden / "config.json").read_text())
    (hidden / "config.json").write_text(json.dumps(dict(config, vocab_size=20)))
    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "query": "q", "references": ["r"]}])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": "a", "response": "the red tower ."}])
    base = ["text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", tmp_path / "out"]
    for options, said in [
            (["--metrics", "Perplexity", "--lm_uri", lm],
             f"--lm_uri {lm}: tokenizer.json's token ids go up to 36 ('!'), but the model takes ids "
             "below 5 only (its logits have 5 entries, one per token id)"),
            (["--metrics", "ToxicityClassifier", "--model_uri", f"ToxicityClassifier={toxic}"],
             "go up to 37 ('!'), but the model takes ids below 6 only (its embedding table "
             "'embedding' has 6 rows)"),
            (["--metrics", "BERTScore", "--model_uri", f"BERTScore={encoder}"],
             "below 6 only (its embedding table 'embedding' has 6 rows)"),
            (["--metrics", "ToxicityClassifier", "--model_uri", f"ToxicityClassifier={hidden}"],
             "below 20 only (its config.json's vocab_size is 20)")]:
        done = run_cli_here(base + options, capsys)
        assert done.returncode == 2, (options, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not (tmp_path / "out").exists()


def test_a_tokenizer_far_smaller_than_its_model_is_a_warning_on_two_workers(tmp_path):
    """The issue's case, a 6-id tokenizer given with a model of 37 logits (and a classifier of
    38 embedding rows given a 6-id tokenizer): the run computes (exit 0, complete, every datum
    ok) and says it in run.json's problems and on stderr after the summary (before: complete
    with no word, and a Perplexity of another tokenizer's ids)."""
    from tiny_models import write_tiny_causal_lm, write_tiny_classifier

    few = ("the", "red", "tower", ".")
    lm = with_tokenizer_of(write_tiny_causal_lm(tmp_path / "lm"),
                           write_tiny_causal_lm(tmp_path / "few_lm", words=few))
    toxic = with_tokenizer_of(write_tiny_classifier(tmp_path / "tox", ["toxic"]),
                              write_tiny_classifier(tmp_path / "few_tox", ["toxic"], words=few[:3]))
    done = run(tmp_path, "out", "--metrics", "Perplexity,ToxicityClassifier", "--lm_uri", lm,
               "--model_uri", f"ToxicityClassifier={toxic}", "--direct_running_mode",
               "multi_processing", "--direct_num_workers", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.load(open(tmp_path / "out" / "run.json", encoding="utf-8"))
    assert info["status"] == "complete"
    warned = [p for p in info["problems"] if p["code"] == "tokenizer_smaller_than_model"]
    assert [p["severity"] for p in warned] == ["warning", "warning"]
    by_option = {p["message"].split(":")[0]: p["message"] for p in warned}
    assert by_option[f"--lm_uri {lm}"].startswith(
        f"--lm_uri {lm}: tokenizer.json has 6 token ids, under 90% of the 37 the model takes "
        "(its logits have 37 entries, one per token id)")
    assert "tokenizer.json has 6 token ids, under 90% of the 38 the model takes (its embedding table " \
           "'embedding' has 38 rows)" in by_option[f"--model_uri ToxicityClassifier={toxic}"]
    for p in warned:
        assert f"evalbeam: warning: {p['message']}" in done.stderr
    assert {status for status, _ in statuses(tmp_path / "out").values()} == {"ok"}


def test_a_tokenizer_padding_explains_passes_without_a_word(tmp_path):
    """50 token ids of a model with 64 logits (the rows rounded up to a multiple of 64), and the
    tiny models' own tokenizers: no warning; 30 ids of 37 logits: a warning."""
    from evalbeam.pipelines.tasks.judge_options import check_model_folder
    from tiny_models import WORDS, write_tiny_causal_lm, write_tiny_classifier, write_tiny_encoder

    words = list(WORDS) + [f"w{i}" for i in range(62 - len(WORDS))]
    lm = with_tokenizer_of(write_tiny_causal_lm(tmp_path / "lm", words=words),
                           write_tiny_causal_lm(tmp_path / "tokens", words=words[:48]))
    assert len(json.loads((lm / "tokenizer.json").read_text())["model"]["vocab"]) == 50
    needs = ("model.onnx", "tokenizer.json")
    assert check_model_folder("--lm_uri x", str(lm), needs, "an LM", causal=True) is None
    for folder, causal in ((write_tiny_causal_lm(tmp_path / "own_lm"), True),
                           (write_tiny_classifier(tmp_path / "own", ["a"]), False),
                           (write_tiny_encoder(tmp_path / "own_enc"), False)):
        assert check_model_folder("--x", str(folder), needs, "a model", causal=causal) is None
    near = with_tokenizer_of(write_tiny_causal_lm(tmp_path / "near"),
                             write_tiny_causal_lm(tmp_path / "near_tokens", words=WORDS[:28]))
    assert "tokenizer.json has 30 token ids, under 90% of the 37" in check_model_folder(
        "--lm_uri x", str(near), needs, "an LM", causal=True)


@pytest.mark.parametrize("special", ["dev_zero", "fifo"])
def test_a_model_file_that_is_not_a_regular_file_is_refused(tmp_path, capsys, special):
    """model.onnx, tokenizer.json or config.json a symlink to /dev/zero or a FIFO, for --lm_uri
    and --model_uri: exit 2 at once, one paragraph naming the option and the file, nothing
    written (before: /dev/zero as model.onnx was "empty", as tokenizer.json or config.json it
    was read without end; a FIFO blocked the launcher). On the workers the same files fail
    each text (model_error), never hang a worker."""
    import asyncio

    from evalbeam.transforms.judge.local_classifier import LocalClassifier
    from evalbeam.transforms.judge.local_lm import LocalLM
    from evalbeam.transforms.judge.local_models import ModelError
    from tiny_models import write_tiny_causal_lm, write_tiny_classifier

    def spoil(folder: Path, name: str) -> Path:
        (folder / name).unlink()
        if special == "fifo":
            os.mkfifo(folder / name)
        else:
            os.symlink("/dev/zero", folder / name)
        return folder

    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "query": "q"}])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": "a", "response": "the red tower ."}])
    base = ["text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", tmp_path / "out"]
    for name in ("model.onnx", "tokenizer.json"):
        lm = spoil(write_tiny_causal_lm(tmp_path / f"lm_{name}"), name)
        done = run_cli_here(base + ["--metrics", "Perplexity", "--lm_uri", lm], capsys)
        assert done.returncode == 2, done.stderr
        assert f"--lm_uri {lm}: {name}: not a regular file" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
        with pytest.raises(ModelError, match="not a regular file"):
            asyncio.run(LocalLM(str(lm)).ask("the red tower"))
    for name in ("model.onnx", "tokenizer.json", "config.json"):
        toxic = spoil(write_tiny_classifier(tmp_path / f"tox_{name}", ["toxic"]), name)
        done = run_cli_here(base + ["--metrics", "ToxicityClassifier", "--model_uri",
                                    f"ToxicityClassifier={toxic}"], capsys)
        assert done.returncode == 2, done.stderr
        assert f"--model_uri ToxicityClassifier={toxic}: {name}: not a regular file" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
        with pytest.raises(ModelError, match="not a regular file"):
            asyncio.run(LocalClassifier(str(toxic)).ask("the red tower"))
