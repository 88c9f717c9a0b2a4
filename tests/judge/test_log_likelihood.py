"""Log-likelihood metrics through a completions endpoint (Perplexity, GPTScore): the kernels
against a direct computation, the answer parser on good and broken answers, and the text task
end to end on the stand-in server (on two worker processes), every per-datum score checked
against the stand-in's own log-probabilities."""

from __future__ import annotations

import json
import math
import os
import subprocess

import numpy as np
import pytest

from helpers import MULTIPROCESS, run_cli_here, write_jsonl
from evalbeam.transforms.judge import gptscore
from evalbeam.transforms.judge.client import prompt_logprobs
from evalbeam.pipelines.runners.stand_in import completions_payload
from evalbeam.transforms.judge.simulated import prompt_logprobs as stand_in_logprobs
from evalbeam.transforms.kernels.log_likelihood import mean_nll, perplexity


@pytest.mark.parametrize("seed", range(5))
def test_kernels_match_a_direct_computation(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    values = [None] + list(-rng.exponential(2.0, n - 1))
    offsets = list(np.cumsum(rng.integers(1, 6, n)) - 1)
    offsets[0] = 0
    length = offsets[-1] + 3
    assert math.isclose(perplexity(values), math.exp(-np.mean(values[1:])), rel_tol=1e-12)
    start = int(rng.integers(0, length))
    ends = offsets[1:] + [length]
    chosen = [v for v, end in zip(values, ends) if end > start and v is not None]
    got = mean_nll(values, offsets, start, length)
    assert (got is None) if not chosen else math.isclose(got, -np.mean(chosen), rel_tol=1e-12)


def test_kernel_edges():
    assert perplexity([None]) is None and perplexity([]) is None
    # a token that straddles the start is scored: it holds a character of the target
    assert mean_nll([None, -1.0, -3.0], [0, 4, 8], 6, 12) == 2.0
    assert mean_nll([None, -1.0], [0, 4], 0, 5) == 1.0
    assert mean_nll([None], [0], 0, 3) is None


def test_stand_in_tokens_spell_the_prompt_and_copy_earlier_words():
    prompt = "The cat sat. The cat ran away  \n"
    out = stand_in_logprobs(prompt)
    assert "".join(out["tokens"]) == prompt
    assert [prompt[o:o + len(t)] for t, o in zip(out["tokens"], out["text_offset"])] == out["tokens"]
    assert out["token_logprobs"][0] is None
    by_token = dict(zip(out["tokens"][1:], out["token_logprobs"][1:]))
    assert by_token[" cat"] == math.log(0.6)            # the second " cat"
    assert all(v < 0 for v in out["token_logprobs"][1:])


def test_answer_parser_keeps_the_prompt_and_refuses_broken_answers():
    prompt = "Some text here."
    payload, _ = completions_payload({"model": "m", "prompt": prompt, "echo": True, "logprobs": 1,
                                      "max_tokens": 1}, None)
    choice = payload["choices"][0]
    got = prompt_logprobs(choice, prompt)
    assert got["tokens"] == stand_in_logprobs(prompt)["tokens"]       # the generated token dropped
    assert prompt_logprobs({"logprobs": None}, prompt) is None         # no echo or no logprobs

    def broken(**change):
        logprobs = dict(choice["logprobs"], **change)
        return prompt_logprobs({"logprobs": logprobs}, prompt)

    values = choice["logprobs"]["token_logprobs"]
    assert broken(tokens=["x"]) is None                                 # lengths differ
    assert broken(token_logprobs=[None, 0.5] + values[2:]) is None      # a probability above 1
    assert broken(token_logprobs=[None, float("nan")] + values[2:]) is None
    assert broken(token_logprobs=[None, None] + values[2:]) is None     # None after the first
    assert broken(text_offset=[1] + choice["logprobs"]["text_offset"][1:]) is None
    assert broken(text_offset=[0, 9, 5] + choice["logprobs"]["text_offset"][3:]) is None
    assert broken(text_offset=[0, "4"] + choice["logprobs"]["text_offset"][2:]) is None


def expected_anll(prefix: str, target: str) -> float:
    lp = stand_in_logprobs(prefix + target)
    return mean_nll(lp["token_logprobs"], lp["text_offset"], len(prefix), len(prefix + target))


def test_text_task_scores_match_the_stand_in_on_two_workers(tmp_path):
    from evalbeam.pipelines.runners.judge_server import StandInServer

    truths = [{"datum_uid": "a", "query": "Where is the tower?",
               "references": ["The tower is in Paris.", "It stands in Paris, France."]},
              {"datum_uid": "b", "query": "How old is the bridge?"},
              {"datum_uid": "c", "query": "Name a colour.", "references": ["Blue."]}]
    predictions = [{"datum_uid": "a", "response": "The tower stands in Paris."},
                   {"datum_uid": "b", "response": "It was built in 1291 by monks."},
                   {"datum_uid": "c", "response": "Red"}]
    gt = write_jsonl(tmp_path / "gt.jsonl", truths)
    pred = write_jsonl(tmp_path / "pred.jsonl", predictions)
    out = tmp_path / "out"
    with StandInServer() as server:
        done = subprocess.run(
            ["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", out,
             "--metrics", "Perplexity,GPTScoreTranslation,GPTScoreQA,GPTScoreSummarizationNoReference",
             "--judge_url", server.url, "--judge_lm_model", "tiny-lm", "--quiet", *MULTIPROCESS],
            capture_output=True, text=True, env=dict(os.environ, OPENAI_API_KEY="test-key"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    scores = {(r["datum_uid"], r["metric"], r["parameters"].get("aspect")): r
              for r in map(json.loads, open(out / "scores.jsonl", encoding="utf-8"))}
    for truth, prediction in zip(truths, predictions):
        uid, response = truth["datum_uid"], prediction["response"]
        lp = stand_in_logprobs(response)["token_logprobs"]
        row = scores[(uid, "Perplexity", None)]
        if len(lp) < 2:
            assert row["status"] == "not_applicable"
        else:
            assert math.isclose(row["value"], math.exp(-np.mean(lp[1:])), rel_tol=1e-12)
        for aspect in gptscore.ASPECTS["GPTScoreTranslation"]:
            row = scores[(uid, "GPTScoreTranslation", aspect)]
            if "references" not in truth:
                assert row["status"] == "not_applicable"
                continue
            want = min((expected_anll(*gptscore.rewrite_prompt("GPTScoreTranslation", aspect, ref, response))
                        + expected_anll(*gptscore.rewrite_prompt("GPTScoreTranslation", aspect, response, ref))) / 2
                       for ref in truth["references"])
            assert math.isclose(row["value"], want, rel_tol=1e-12)
        for aspect in gptscore.ASPECTS["GPTScoreQA"]:
            want = expected_anll(*gptscore.qa_prompt(aspect, truth["query"], response))
            assert math.isclose(scores[(uid, "GPTScoreQA", aspect)]["value"], want, rel_tol=1e-12)
        for aspect in gptscore.ASPECTS["GPTScoreSummarizationNoReference"]:
            want = expected_anll(*gptscore.summary_prompt(aspect, truth["query"], response))
            assert math.isclose(scores[(uid, "GPTScoreSummarizationNoReference", aspect)]["value"], want,
                                rel_tol=1e-12)
    records = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    overall = {(r["type"], r["parameters"].get("aspect")): r for r in records if not r["slice"]}
    assert overall[("Perplexity", None)]["parameters"] == {"lm_model": "tiny-lm"}
    qa = overall[("GPTScoreQA", "Interest")]
    assert qa["parameters"]["prompt_version"] == gptscore.PROMPT_VERSION and qa["counts"] == {"ok": 3}
    assert len([k for k in overall if k[0] == "GPTScoreQA"]) == len(gptscore.ASPECTS["GPTScoreQA"])
    # the requests went to /completions with echo: the journal holds them, never the key
    journal = "".join(open(os.path.join(root, f), encoding="utf-8").read()
                      for root, _, files in os.walk(out / "judge-journal") for f in files)
    assert '"kind": "logprobs"' in journal and "test-key" not in journal


# ---------------------------------------------------------------- the model on the workers

def test_local_model_scores_match_onnx_runtime_on_two_workers(tmp_path):
    """--lm_uri: a tiny causal LM saved as model.onnx + tokenizer.json, run by the workers in
    batches (--lm_batch_size 2: texts of different lengths padded together), gives per datum the
    Perplexity and GPTScore that ONNX Runtime gives on each text alone, to 1e-6."""
    pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")
    from tiny_models import direct_logprobs, write_tiny_causal_lm

    model = write_tiny_causal_lm(tmp_path / "lm")
    truths = [{"datum_uid": f"d{i}", "query": q, "references": r} for i, (q, r) in enumerate([
        ("Where is the tower?", ["The tower is in Paris, France."]),
        ("How old is the bridge?", ["It was built by the old city."]),
        ("Name a colour.", ["Blue."]),
        ("How many people live in the city?", ["Many people live in it."])])]
    responses = ["The tower stands in Paris.", "It is an old stone bridge on the river.", "red",
                 "!"]
    gt = write_jsonl(tmp_path / "gt.jsonl", truths)
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": t["datum_uid"], "response": r}
                                                 for t, r in zip(truths, responses)])
    out = tmp_path / "out"
    done = subprocess.run(
        ["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", out,
         "--metrics", "Perplexity,GPTScoreSummarization,GPTScoreQA", "--lm_uri", model,
         "--lm_batch_size", "2", "--quiet", *MULTIPROCESS],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    def anll(prefix, target):
        values, starts = direct_logprobs(model, prefix + target)
        return mean_nll(values, starts, len(prefix), len(prefix + target))

    scores = {(r["datum_uid"], r["metric"], r["parameters"].get("aspect")): r
              for r in map(json.loads, open(out / "scores.jsonl", encoding="utf-8"))}
    for truth, response in zip(truths, responses):
        uid = truth["datum_uid"]
        values, _ = direct_logprobs(model, response)
        assert math.isclose(scores[(uid, "Perplexity", None)]["value"], math.exp(-np.mean(values[1:])),
                            rel_tol=1e-6)
        for aspect in gptscore.ASPECTS["GPTScoreSummarization"]:
            ref = truth["references"][0]
            want = (anll(*gptscore.rewrite_prompt("GPTScoreSummarization", aspect, ref, response))
                    + anll(*gptscore.rewrite_prompt("GPTScoreSummarization", aspect, response, ref))) / 2
            assert math.isclose(scores[(uid, "GPTScoreSummarization", aspect)]["value"], want, rel_tol=1e-6)
        for aspect in gptscore.ASPECTS["GPTScoreQA"]:
            want = anll(*gptscore.qa_prompt(aspect, truth["query"], response))
            assert math.isclose(scores[(uid, "GPTScoreQA", aspect)]["value"], want, rel_tol=1e-6)
    record = next(json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")
                  if '"Perplexity"' in line)
    assert record["parameters"] == {"lm_model": str(model)} and record["counts"] == {"ok": 4}
    info = json.load(open(out / "run.json", encoding="utf-8"))
    assert info["judge"]["sent"] == 0 and info["judge"]["local"] > 0
    # two worker processes share the cores: ONNX Runtime's threads are shared out among them
    assert info["options"]["judge"]["model_threads"] == max(1, (os.cpu_count() or 1) // 2)


def test_model_threads_default_and_reach_the_runtime(tmp_path):
    """--model_threads: given, it is used (at least 1); not given, the multi-process DirectRunner
    shares the cores out among its processes and every other runner leaves ONNX Runtime its own
    choice (None). The session the model loads with has that many intra-op threads."""
    pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")
    import asyncio

    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.tasks.judge_options import model_threads
    from evalbeam.transforms.judge.local_lm import LocalLM
    from tiny_models import write_tiny_causal_lm

    cores = os.cpu_count() or 1
    multi = ["--direct_running_mode", "multi_processing", "--direct_num_workers"]
    assert model_threads(3, []) == 3 and model_threads(None, []) is None
    assert model_threads(None, multi + ["2"]) == max(1, cores // 2)
    assert model_threads(None, [f"--direct_num_workers={cores * 4}", "--direct_running_mode=multi_processing"]) == 1
    assert model_threads(None, ["--direct_running_mode", "multi_threading", "--direct_num_workers", "2"]) is None
    assert model_threads(None, multi + ["1"]) is None
    with pytest.raises(UsageError, match="--model_threads must be 1 or more"):
        model_threads(0, [])
    lm = LocalLM(str(write_tiny_causal_lm(tmp_path / "lm")), 4, threads=1)
    assert asyncio.run(lm.ask("the red tower"))["token_logprobs"][0] is None
    session = lm.loaded[1]
    assert session.get_session_options().intra_op_num_threads == 1


def test_local_model_problems_stop_before_the_run(tmp_path, capsys):
    """A folder without the model, or without ONNX Runtime installed: one paragraph, exit 2,
    nothing written."""
    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "query": "q"}])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": "a", "response": "r"}])
    (tmp_path / "empty").mkdir()
    done = run_cli_here(["text", "--groundtruths", gt, "--predictions", f"m={pred}",
                         "--output", tmp_path / "out", "--metrics", "Perplexity",
                         "--lm_uri", tmp_path / "empty"], capsys)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "model.onnx" in done.stderr or "evalbeam[models]" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_text_the_model_cannot_take_fails_alone(tmp_path):
    """A sequence longer than the model accepts (here: a model whose graph only takes 8
    positions) fails in the runtime: that datum gets model_error with the runtime's message, the
    others are scored, and the run is incomplete (exit 4) rather than complete or crashed."""
    pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")
    import onnx
    from onnx import helper
    from tiny_models import write_tiny_causal_lm

    model = write_tiny_causal_lm(tmp_path / "lm")
    graph = onnx.load(str(model / "model.onnx"))
    # positions beyond 8 index a table of 8 rows: Gather fails for a longer text
    graph.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((8, 1), np.float32), "positions"))
    for node in graph.graph.node:       # the logits gain a zero read from the position table
        node.output[:] = ["raw" if name == "logits" else name for name in node.output]
    graph.graph.node.extend([
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
        helper.make_node("Range", ["zero", "length", "one"], ["position"]),
        helper.make_node("Gather", ["positions", "position"], ["checked"]),
        helper.make_node("Add", ["raw", "checked"], ["logits"])])
    graph.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
                                    onnx.numpy_helper.from_array(np.array(1, np.int64), "one")])
    onnx.save(graph, str(model / "model.onnx"))
    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": u, "query": "q"} for u in "ab"])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": "a", "response": "the red tower"},
                                                 {"datum_uid": "b", "response": "the " * 20}])
    out = tmp_path / "out"
    done = subprocess.run(["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}",
                           "--output", out, "--metrics", "Perplexity", "--lm_uri", model, "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 4, done.stderr[-3000:]
    rows = {r["datum_uid"]: r for r in map(json.loads, open(out / "scores.jsonl", encoding="utf-8"))}
    assert rows["a"]["status"] == "ok" and rows["b"]["status"] == "model_error"
    assert rows["b"]["details"]["error"]
    assert json.load(open(out / "run.json", encoding="utf-8"))["status"] == "incomplete"



def test_batches_are_bounded_by_count_and_padded_tokens():
    from evalbeam.transforms.judge.local_models import batches

    assert batches(list("abcde"), [1, 1, 2, 2, 3], 2) == [["a", "b"], ["c", "d"], ["e"]]
    # 3 x 4 padded tokens > 10: the third item of length 4 starts a new batch
    assert batches(list("abcd"), [2, 4, 4, 20], 8, max_tokens=10) == [["a", "b"], ["c"], ["d"]]
    assert batches([], [], 4) == []


# ---------------------------------------------------------------- classifiers on the workers

def test_classifier_metrics_match_onnx_runtime_on_two_workers(tmp_path):
    """--model_uri: tiny classifiers (multi-label toxicity with sigmoids, a 2-class bias model
    with softmax, an HHEM-2.1-Open-shaped pair model: a prompt in config.json and a token head)
    give per datum what ONNX Runtime gives on each text alone, to 1e-6: toxicity the max over
    sentences per label, bias the "Biased" label, HHEM the max over contexts of the first
    token's softmax of label 1 for the prompt filled with (context, response)."""
    pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")
    from evalbeam.transforms.kernels.judge_scores import split_sentences as split
    from tiny_models import direct_probabilities, write_tiny_classifier

    toxic = write_tiny_classifier(tmp_path / "tox", ["toxic", "insult", "threat"], multi_label=True)
    bias = write_tiny_classifier(tmp_path / "bias", ["Non-biased", "Biased"], seed=2)
    hhem = write_tiny_classifier(tmp_path / "hhem", ["hallucinated", "supported"], seed=3, token_logits=True,
                                 prompt="Determine if {text2} is true given {text1}.")
    truths = [{"datum_uid": u, "query": "q"} for u in ("a", "b", "c")]
    predictions = [
        {"datum_uid": "a", "response": "The tower stands in Paris. It is old!",
         "contexts": ["The tower is in Paris.", "It was built by the city."]},
        {"datum_uid": "b", "response": "red", "contexts": []},
        {"datum_uid": "c", "response": "Blue river and the old bridge."}]
    gt = write_jsonl(tmp_path / "gt.jsonl", truths)
    pred = write_jsonl(tmp_path / "pred.jsonl", predictions)
    out = tmp_path / "out"
    done = subprocess.run(
        ["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", out,
         "--metrics", "ToxicityClassifier,FairnessBias,HHEM", "--model_uri", f"ToxicityClassifier={toxic}",
         "--model_uri", f"FairnessBias={bias}", "--model_uri", f"HHEM={hhem}", "--lm_batch_size", "2",
         "--quiet", *MULTIPROCESS], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(r["datum_uid"], r["metric"], r["parameters"].get("label")): r
            for r in map(json.loads, open(out / "scores.jsonl", encoding="utf-8"))}
    for p in predictions:
        uid, response = p["datum_uid"], p["response"]
        for label in ("toxic", "insult", "threat"):
            want = max(direct_probabilities(toxic, s)[label] for s in split(response))
            assert math.isclose(rows[(uid, "ToxicityClassifier", label)]["value"], want, rel_tol=1e-6)
        assert math.isclose(rows[(uid, "FairnessBias", "Biased")]["value"],
                            direct_probabilities(bias, response)["Biased"], rel_tol=1e-6)
        row = rows[(uid, "HHEM", None)]
        if p.get("contexts"):
            want = max(direct_probabilities(hhem, c, response)["supported"] for c in p["contexts"])
            assert math.isclose(row["value"], want, rel_tol=1e-6)
        else:
            assert row["status"] == "not_applicable"
    records = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    labels = {r["parameters"].get("label") for r in records if r["type"] == "ToxicityClassifier"}
    assert labels == {"toxic", "insult", "threat"}
    bias_record = next(r for r in records if r["type"] == "FairnessBias" and not r["slice"])
    assert bias_record["parameters"] == {"model_uri": str(bias), "label": "Biased"}


def test_a_classifier_metric_without_its_model_stops_before_the_run(tmp_path, capsys):
    gt = write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "query": "q"}])
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": "a", "response": "r"}])
    for extra in (["--metrics", "HHEM"], ["--metrics", "HHEM", "--model_uri", "Bias=x"],
                  ["--metrics", "HHEM", "--model_uri", f"HHEM={tmp_path}"]):
        done = run_cli_here(["text", "--groundtruths", gt, "--predictions", f"m={pred}",
                             "--output", tmp_path / "out", *extra], capsys)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "--model_uri" in done.stderr
        assert not (tmp_path / "out").exists()


def test_bertscore_matches_a_direct_computation_on_two_workers(tmp_path):
    """--model_uri BERTScore=DIR with a tiny contextual encoder: precision, recall and F1 per
    datum equal greedy cosine matching computed here from ONNX Runtime's vectors of each text
    alone (special tokens matched, not averaged), max over references per component, to 1e-6; with
    --bertscore_idf and --bertscore_baseline the idf-weighted means (idf = log((M + 1) / (df + 1))
    over the M references of all ground truths, a repeated datum_uid's left out) and the
    rescaled values; no references: not_applicable."""
    pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")
    from tiny_models import direct_token_vectors, write_tiny_encoder

    from tokenizers import Tokenizer

    encoder = write_tiny_encoder(tmp_path / "enc")
    truths = [{"datum_uid": "a", "query": "q", "references": ["The tower is in Paris.", "It stands in Paris, France."]},
              {"datum_uid": "b", "query": "q", "references": ["Blue."]},
              {"datum_uid": "c", "query": "q"},
              {"datum_uid": "d", "query": "q", "references": ["The river is blue."]}]
    repeated = [{"datum_uid": "e", "query": "q", "references": ["Paris"]}] * 2   # rejected: not counted
    responses = {"a": "The old tower stands in Paris.", "b": "red river", "c": "anything",
                 "d": "The river is the river."}
    gt = write_jsonl(tmp_path / "gt.jsonl", truths + repeated)
    pred = write_jsonl(tmp_path / "pred.jsonl", [{"datum_uid": u, "response": r} for u, r in responses.items()])
    baseline = (0.3, 0.2, 0.25)
    tokenizer = Tokenizer.from_file(str(encoder / "tokenizer.json"))
    references = [ref for truth in truths for ref in truth.get("references", [])]
    df: dict = {}
    for ref in references:
        encoding = tokenizer.encode(ref)
        for token in {t for t, special in zip(encoding.ids, encoding.special_tokens_mask) if not special}:
            df[token] = df.get(token, 0) + 1

    def idf(text: str) -> np.ndarray:
        encoding = tokenizer.encode(text)
        ids = [t for t, special in zip(encoding.ids, encoding.special_tokens_mask) if not special]
        return np.log((len(references) + 1) / (np.array([df.get(t, 0) for t in ids]) + 1.0))

    def direct(candidate: str, reference: str, weighted: bool) -> tuple:
        (c, sc), (r, sr) = direct_token_vectors(encoder, candidate), direct_token_vectors(encoder, reference)
        c = c / np.linalg.norm(c, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
        sim = c @ r.T     # [CLS] and [SEP] compete for the best match, and are not averaged
        wc, wr = (idf(candidate), idf(reference)) if weighted else (np.ones((~sc).sum()), np.ones((~sr).sum()))
        p, rec = sim.max(axis=1)[~sc] @ wc / wc.sum(), sim.max(axis=0)[~sr] @ wr / wr.sum()
        return p, rec, 2 * p * rec / (p + rec)

    for rescaled in (False, True):
        out = tmp_path / f"out{rescaled}"
        extra = ["--bertscore_baseline", ",".join(map(str, baseline)), "--bertscore_idf"] if rescaled else []
        done = subprocess.run(
            ["evalbeam", "text", "--groundtruths", gt, "--predictions", f"m={pred}", "--output", out,
             "--metrics", "BERTScore", "--model_uri", f"BERTScore={encoder}", "--quiet", *extra,
             "--max_rejected_fraction", "0.5",
             *MULTIPROCESS], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        rows = {(r["datum_uid"], r["parameters"]["component"]): r
                for r in map(json.loads, open(out / "scores.jsonl", encoding="utf-8"))}
        for truth in truths:
            uid = truth["datum_uid"]
            if "references" not in truth:
                assert rows[(uid, "f1")]["status"] == "not_applicable"
                continue
            best = np.max([direct(responses[uid], ref, rescaled) for ref in truth["references"]], axis=0)
            for k, component in enumerate(("precision", "recall", "f1")):
                want = (best[k] - baseline[k]) / (1 - baseline[k]) if rescaled else best[k]
                assert math.isclose(rows[(uid, component)]["value"], want, rel_tol=1e-6, abs_tol=1e-9)
        record = next(json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")
                      if '"BERTScore"' in line and '"f1"' in line)
        assert record["parameters"]["rescaled"] is record["parameters"]["idf"] is rescaled
        assert record["counts"] == {"not_applicable": 1, "ok": 3}


def test_a_text_longer_than_a_model_call_is_refused_without_running(tmp_path):
    """More tokens than MAX_BATCH_TOKENS: ModelError at once (no logits of unbounded size are
    asked for); the other texts of the batch are scored."""
    pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")
    import asyncio

    from evalbeam.transforms.judge.local_lm import LocalLM
    from evalbeam.transforms.judge.local_models import MAX_BATCH_TOKENS, ModelError
    from tiny_models import write_tiny_causal_lm

    lm = LocalLM(str(write_tiny_causal_lm(tmp_path / "lm")), 4)

    async def both():
        return await asyncio.gather(lm.ask("the red tower"), lm.ask("the " * MAX_BATCH_TOKENS),
                                    return_exceptions=True)

    short, long = asyncio.run(both())
    assert len(short["token_logprobs"]) == len(short["text_offset"]) == 4
    assert isinstance(long, ModelError) and "8,193 tokens" in str(long)


def test_in_window_keeps_order_and_bounds_the_programs_running():
    """judged_text.in_window: results in the order of the indices, never more than `window`
    coroutines started and not finished, each started once; an exception ends the whole."""
    import asyncio

    from evalbeam.transforms.judge.judged_text import in_window

    running, peak, started = [0], [0], []

    async def program(index):
        started.append(index)
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        for _ in range(index % 4):   # uneven lengths: lanes finish out of order
            await asyncio.sleep(0)
        running[0] -= 1
        return index * index

    for n, window in ((0, 3), (1, 3), (10, 3), (10, 1), (5, 50)):
        running[0], peak[0], started[:] = 0, 0, []
        assert asyncio.run(in_window(program, n, window)) == [i * i for i in range(n)]
        assert sorted(started) == list(range(n)) and peak[0] <= max(1, min(window, n))

    async def failing(index):
        if index == 4:
            raise ValueError("program 4")
        return index

    with pytest.raises(ValueError, match="program 4"):
        asyncio.run(in_window(failing, 9, 2))


def test_a_bundle_larger_than_the_window_scores_the_same(tmp_path, monkeypatch):
    """With a window of 2 programs (a bundle of many windows), a model on the workers gives the
    same scores.jsonl and metrics.jsonl, byte for byte, as with every program at once."""
    pytest.importorskip("onnxruntime", reason="needs evalbeam[models] (ONNX Runtime)")
    import importlib

    from evalbeam.transforms.judge import judged_text
    from tiny_models import write_tiny_causal_lm

    model = write_tiny_causal_lm(tmp_path / "lm", dim=4)
    words = "the tower bridge river city is in on stands was built by old stone paris".split()
    rng = np.random.default_rng(5)
    truths, predictions = [], []
    for i in range(40):
        text = " ".join(rng.choice(words, rng.integers(1, 12)))
        truths.append({"datum_uid": f"d{i:02d}", "query": "where is it?", "references": [text[::-1]]})
        if i % 7:   # some datums without a prediction
            predictions.append({"datum_uid": f"d{i:02d}", "response": text})
    gt = write_jsonl(tmp_path / "gt.jsonl", truths)
    pred = write_jsonl(tmp_path / "pred.jsonl", predictions)
    text_task = importlib.import_module("evalbeam.pipelines.tasks.text")

    def run(out, window):
        monkeypatch.setattr(judged_text, "JUDGE_WINDOW", window)
        code = text_task.run([str(a) for a in (
            "--groundtruths", gt, "--predictions", f"m={pred}", "--output", out, "--metrics",
            "Perplexity,GPTScoreQA,GPTScoreSummarization", "--lm_uri", model, "--lm_batch_size", "3",
            "--num_shards", "1", "--quiet")])
        assert code == 0
        return [(out / name).read_bytes() for name in ("scores.jsonl", "metrics.jsonl")]

    whole = run(tmp_path / "whole", 100_000)
    assert run(tmp_path / "narrow", 2) == whole
    assert whole[0].count(b'"status": "ok"') > 100
