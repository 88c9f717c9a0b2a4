"""The stand-in judge server: shapes, schema-valid answers, determinism, rate limit, faults, stats.

Every server runs on 127.0.0.1 on a free port, inside the test, and stops at its end.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request

import jsonschema
import pytest

from evalbeam.pipelines.runners.judge_server import (FAULT_KINDS, JudgeState, StandInServer, build_parser, busiest_window,
                                    state_from_args)
from evalbeam.pipelines.runners.stand_in import count_tokens

CONTEXT = "Paris is the capital of France. The Eiffel Tower stands in Paris."
ANSWER = "Paris is the capital of France. Berlin hosts the German parliament."


def post(url: str, body, timeout: float = 5.0):
    """(status, headers, raw body) for a POST of JSON; HTTP errors are returned, not raised."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json", "Authorization": "Bearer sk-secret-test"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def chat(messages=None, **extra) -> dict:
    body = {"model": "judge", "temperature": 0, "messages": messages or [
        {"role": "system", "content": f"Context: {CONTEXT}"},
        {"role": "user", "content": f"Judge each statement.\nStatements: {ANSWER}"}]}
    body.update(extra)
    return body


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def server():
    with StandInServer() as running:
        yield running


def test_chat_shape_and_usage(server):
    status, headers, raw = post(server.url + "/chat/completions", chat())
    assert status == 200
    reply = json.loads(raw)
    assert reply["object"] == "chat.completion" and reply["created"] == 0
    assert reply["model"] == "judge" and reply["system_fingerprint"]
    choice = reply["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    content = choice["message"]["content"]
    assert content[0] in "12345"  # a 1-5 rating first, then a sentence
    usage = reply["usage"]
    prompt = f"Context: {CONTEXT}" + f"Judge each statement.\nStatements: {ANSWER}"
    assert usage["prompt_tokens"] == count_tokens(prompt)
    assert usage["completion_tokens"] == count_tokens(content)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert headers["x-ratelimit-remaining-requests"]
    assert "sk-secret-test" not in raw.decode() and "sk-secret-test" not in json.dumps(headers)


def test_token_rule():
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("") == 0
    assert count_tokens("don't  stop") == 4


STATEMENTS_VERDICTS = {
    "type": "object", "additionalProperties": False, "required": ["statements"],
    "properties": {"statements": {"type": "array", "items": {
        "type": "object", "additionalProperties": False,
        "required": ["statement", "reason", "verdict"],
        "properties": {"statement": {"type": "string"}, "reason": {"type": "string"},
                       "verdict": {"type": "integer", "enum": [0, 1]}}}}}}

SCHEMAS = [
    STATEMENTS_VERDICTS,
    {"type": "object", "required": ["statements"],
     "properties": {"statements": {"type": "array", "items": {"type": "string"}}}},
    {"type": "object", "required": ["verdicts"], "properties": {"verdicts": {"type": "array", "items": {
        "type": "object", "required": ["verdict", "reason"],
        "properties": {"verdict": {"type": "string", "enum": ["yes", "no", "idk"]},
                       "reason": {"type": ["string", "null"]}}}}}},
    {"type": "object", "required": ["score", "confidence", "label", "ok"],
     "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                    "confidence": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                    "label": {"enum": ["red", "green", "blue"]},
                    "ok": {"type": "boolean"}}},
    {"type": "object", "required": ["outer"], "properties": {"outer": {
        "type": "object", "required": ["inner", "tags"],
        "properties": {"inner": {"$ref": "#/$defs/Inner"},
                       "tags": {"type": "array", "minItems": 3, "maxItems": 4,
                                "items": {"type": "string", "minLength": 2, "maxLength": 10}}}}},
     "$defs": {"Inner": {"type": "object", "required": ["rating", "attributed"],
                         "properties": {"rating": {"type": "integer", "enum": [0, 2, 4]},
                                        "attributed": {"type": "integer", "minimum": 0,
                                                       "maximum": 1}}}}},
    {"type": "object", "required": ["TP", "FP", "FN"],
     "properties": {k: {"type": "array", "items": {"anyOf": [{"$ref": "#/definitions/Item"},
                                                             {"type": "null"}]}}
                    for k in ("TP", "FP", "FN")},
     "definitions": {"Item": {"type": "object", "required": ["statement", "reason"],
                              "properties": {"statement": {"type": "string"},
                                             "reason": {"type": "string"}}}}},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: "-".join(sorted(s["properties"])))
def test_json_schema_answers_validate(server, schema):
    status, _, raw = post(server.url + "/chat/completions",
                          chat(response_format=schema_format(schema)))
    assert status == 200
    answer = json.loads(json.loads(raw)["choices"][0]["message"]["content"])
    jsonschema.validate(answer, schema)


def test_statements_and_verdicts_follow_the_prompt(server):
    _, _, raw = post(server.url + "/chat/completions",
                     chat(response_format=schema_format(STATEMENTS_VERDICTS)))
    items = json.loads(json.loads(raw)["choices"][0]["message"]["content"])["statements"]
    # one item per sentence of the text after "Statements:", judged by word overlap with the context
    assert [i["statement"] for i in items] == ["Paris is the capital of France.",
                                               "Berlin hosts the German parliament."]
    assert [i["verdict"] for i in items] == [1, 0]


def test_json_object_and_max_tokens(server):
    _, _, raw = post(server.url + "/chat/completions",
                     chat(response_format={"type": "json_object"}))
    answer = json.loads(json.loads(raw)["choices"][0]["message"]["content"])
    assert answer["verdict"] in (0, 1) and isinstance(answer["reason"], str)
    _, _, raw = post(server.url + "/chat/completions", chat(max_tokens=3))
    reply = json.loads(raw)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 3


def test_logprobs_and_n(server):
    _, _, raw = post(server.url + "/chat/completions", chat(logprobs=True, top_logprobs=5, n=2))
    reply = json.loads(raw)
    assert len(reply["choices"]) == 2
    entries = reply["choices"][0]["logprobs"]["content"]
    content = reply["choices"][0]["message"]["content"]
    assert "".join(e["token"] for e in entries) == content.rstrip()
    first = entries[0]
    assert first["token"] in "12345" and len(first["top_logprobs"]) == 5
    assert first["top_logprobs"][0]["token"] == first["token"]
    assert sum(math.exp(t["logprob"]) for t in first["top_logprobs"]) <= 1.0
    assert all(t["token"].strip().isdigit() for t in first["top_logprobs"])
    assert reply["usage"]["completion_tokens"] == 2 * count_tokens(content)


def test_same_request_same_body(server):
    body = chat(response_format=schema_format(SCHEMAS[4]), seed=7, logprobs=True)
    first = post(server.url + "/chat/completions", body)[2]
    second = post(server.url + "/chat/completions", body)[2]
    assert first == second
    other = post(server.url + "/chat/completions", chat(seed=8))[2]
    assert json.loads(other)["id"] != json.loads(first)["id"]


def test_embeddings(server):
    texts = ["Paris is the capital of France", "Paris is the capital of France", "", "bananas"]
    status, _, raw = post(server.url + "/embeddings", {"model": "emb", "input": texts})
    assert status == 200
    reply = json.loads(raw)
    vectors = [d["embedding"] for d in reply["data"]]
    assert [d["index"] for d in reply["data"]] == [0, 1, 2, 3]
    assert all(len(v) == 64 for v in vectors)
    assert all(abs(sum(x * x for x in v) - 1.0) < 1e-9 for v in vectors)
    assert vectors[0] == vectors[1] and vectors[0] != vectors[3]
    assert reply["usage"]["prompt_tokens"] == sum(count_tokens(t) for t in texts)
    single = json.loads(post(server.url + "/embeddings",
                             {"model": "emb", "input": "bananas", "dimensions": 8})[2])
    assert len(single["data"][0]["embedding"]) == 8
    assert post(server.url + "/embeddings", {"model": "emb", "input": [1, 2]})[0] == 400


@pytest.mark.parametrize("model,status,code", [
    ("fail-400", 400, "invalid_request"), ("fail-401", 401, "invalid_api_key"),
    ("fail-403", 403, "model_not_permitted"), ("fail-404", 404, "model_not_found"),
    ("quota", 429, "insufficient_quota")])
def test_permanent_error_models(server, model, status, code):
    for _ in range(2):
        got, headers, raw = post(server.url + "/chat/completions", chat(model=model))
        assert got == status
        assert json.loads(raw)["error"]["code"] == code
        assert headers["x-should-retry"] == "false"


def test_bad_requests_are_400(server):
    assert post(server.url + "/chat/completions", b"{not json")[0] == 400
    assert post(server.url + "/chat/completions", {"model": "m", "messages": []})[0] == 400
    bad_format = chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert post(server.url + "/chat/completions", bad_format)[0] == 400


def test_rate_limit():
    with StandInServer(rpm=3) as server:
        remaining = []
        for _ in range(3):
            status, headers, _ = post(server.url + "/chat/completions", chat())
            assert status == 200
            remaining.append(int(headers["x-ratelimit-remaining-requests"]))
        assert remaining == [2, 1, 0]
        status, headers, raw = post(server.url + "/chat/completions", chat())
        assert status == 429
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert 0 < int(headers["retry-after-ms"]) <= 60_000
        assert json.loads(raw)["error"]["type"] == "rate_limit_exceeded"
        assert server.stats()["status_counts"] == {"200": 3, "429": 1}


def classify(url: str, body: dict, timeout: float) -> str:
    """What a client sees: a fault kind, or "ok"."""
    try:
        status, _, raw = post(url, body, timeout=timeout)
    except TimeoutError:
        return "timeout"
    except urllib.error.URLError as error:
        return "timeout" if isinstance(error.reason, TimeoutError) else "reset"
    except ConnectionError:  # includes http.client.RemoteDisconnected and ConnectionResetError
        return "reset"
    if status != 200:
        return str(status)
    try:
        reply = json.loads(raw)
    except ValueError:
        return "malformed"
    return "truncated" if reply["choices"][0]["finish_reason"] == "length" else "ok"


def test_fault_schedule_and_rates():
    rate, total = 0.35, 200
    reference = JudgeState(fault_rate=rate, seed=11)
    expected_schedule = [reference.next_fault() for _ in range(total)]
    with StandInServer(fault_rate=rate, seed=11, timeout_fault_s=1.0) as server:
        seen = [classify(server.url + "/chat/completions", chat(seed=i), timeout=0.25)
                for i in range(total)]
        stats = server.stats()
    # the client sees exactly the seeded schedule, by arrival order
    assert seen == [kind or "ok" for kind in expected_schedule]
    per_kind = {kind: seen.count(kind) for kind in FAULT_KINDS}
    assert sum(per_kind.values()) == pytest.approx(rate * total, abs=25)
    for kind, count in per_kind.items():
        assert 3 <= count <= 22, (kind, count)
    assert stats["faults"] == {k: v for k, v in per_kind.items() if v}
    assert stats["dropped"] == per_kind["reset"] and stats["requests"] == total


def test_reset_drops_the_connection():
    with StandInServer(fault_rate=1.0, faults=("reset",)) as server:
        with pytest.raises((ConnectionError, urllib.error.URLError)):
            post(server.url + "/chat/completions", chat(), timeout=3)


def test_timeout_fault_delays_then_answers():
    with StandInServer(fault_rate=1.0, faults=("timeout",), timeout_fault_s=0.6) as server:
        started = time.monotonic()
        status, _, _ = post(server.url + "/chat/completions", chat(), timeout=5)
        assert status == 200 and time.monotonic() - started >= 0.55
        assert classify(server.url + "/chat/completions", chat(), timeout=0.2) == "timeout"


def test_malformed_json_content_and_injected_429():
    with StandInServer(fault_rate=1.0, faults=("malformed",)) as server:
        _, _, raw = post(server.url + "/chat/completions", chat(response_format={"type": "json_object"}))
        content = json.loads(raw)["choices"][0]["message"]["content"]
        with pytest.raises(ValueError):
            json.loads(content)
        assert classify(server.url + "/embeddings", {"model": "e", "input": "x"}, 2) != "ok"
    with StandInServer(fault_rate=1.0, faults=("429",)) as server:
        status, headers, raw = post(server.url + "/chat/completions", chat())
        assert status == 429 and headers["retry-after-ms"] == "200" and headers["Retry-After"] == "1"
        assert json.loads(raw)["error"]["type"] == "rate_limit_exceeded"
    with StandInServer(fault_rate=1.0, faults=("429",), fault_retry_after_ms=35) as server:
        status, headers, raw = post(server.url + "/chat/completions", chat())
        assert status == 429 and headers["retry-after-ms"] == "35"


def test_stats_duplicates_and_reset():
    with StandInServer(latency_ms=20) as server:
        started = time.monotonic()
        for body in (chat(), chat(), chat(seed=1)):
            post(server.url + "/chat/completions", body)
        post(server.url + "/chat/completions", chat(model="fail-404"))
        assert time.monotonic() - started >= 0.08  # latency applies to every request
        stats = json.loads(urllib.request.urlopen(server.base + "/stats", timeout=5).read())
        assert stats["requests"] == 4
        assert stats["status_counts"] == {"200": 3, "404": 1}
        assert stats["distinct_bodies"] == 3 and stats["duplicate_bodies"] == 1
        assert len(stats["arrivals"]) == 4 and stats["arrivals"] == sorted(stats["arrivals"])
        post(server.base + "/stats/reset", {})
        assert server.stats()["requests"] == 0


def test_cli_parsing():
    args = build_parser().parse_args(["--port", "0", "--latency_ms", "5", "--rpm", "60",
                                      "--fault_rate", "0.1", "--faults", "500,reset", "--seed", "3",
                                      "--timeout_fault_s", "2", "--fault_retry_after_ms", "50"])
    assert (args.port, args.host, args.latency_ms, args.rpm) == (0, "127.0.0.1", 5.0, 60)
    assert args.faults == ("500", "reset") and args.seed == 3
    assert (args.timeout_fault_s, args.fault_retry_after_ms) == (2.0, 50.0)
    state = state_from_args(args)
    assert state.fault_rate == 0.1 and state.faults == ("500", "reset")
    defaults = build_parser().parse_args(["--port", "8000"])
    assert defaults.faults == FAULT_KINDS and defaults.rpm is None and defaults.fault_rate == 0.0
    assert defaults.timeout_fault_s == 30.0 and defaults.latency_ms == 0.0
    for bad in (["--port", "1", "--faults", "500,boom"], ["--port", "1", "--fault_rate", "2"],
                ["--port", "1", "--fault-rate", "2"], []):
        with pytest.raises(SystemExit) as stop:
            build_parser().parse_args(bad)
        assert stop.value.code == 2


def test_cli_flags_use_underscores_and_the_dashed_spellings_still_work(capsys):
    """Every evalbeam command spells its options with underscores; scripts written with the
    judge-server's earlier dashed flags keep working, but --help shows only the underscores."""
    dashed = build_parser().parse_args(["--port", "0", "--latency-ms", "5", "--fault-rate", "0.1",
                                        "--timeout-fault-s", "2", "--fault-retry-after-ms", "50"])
    underscored = build_parser().parse_args(["--port", "0", "--latency_ms", "5", "--fault_rate", "0.1",
                                             "--timeout_fault_s", "2", "--fault_retry_after_ms", "50"])
    assert vars(dashed) == vars(underscored)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    shown = capsys.readouterr().out
    for name in ("--latency_ms", "--fault_rate", "--timeout_fault_s", "--fault_retry_after_ms"):
        assert name in shown and name.replace("_", "-") not in shown


def test_models_endpoint_for_the_check_before_a_run():
    """GET /v1/models (and /models) lists models; it is never faulted, rate limited or counted."""
    with StandInServer(rpm=1, fault_rate=1.0, faults=("500",)) as server:
        for url in (server.url + "/models", server.base + "/models", server.url + "/models"):
            with urllib.request.urlopen(url, timeout=5) as response:
                listed = json.loads(response.read())
            assert response.status == 200 and listed["object"] == "list"
            assert "gpt-4o-mini" in [m["id"] for m in listed["data"]]
        assert server.stats()["requests"] == 0


# ---------------------------------------------------------------- schemas written in the prompt

VERDICTS_SCHEMA = {
    "$defs": {"Item": {"type": "object", "properties": {
        "statement": {"type": "string"}, "reason": {"type": "string"},
        "verdict": {"type": "integer", "description": "1 if supported, else 0"}},
        "required": ["statement", "reason", "verdict"]}},
    "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
    "required": ["items"]}
RATING_SCHEMA = {"type": "object", "properties": {
    "rating": {"type": "integer", "description": "the rating (0, 2, or 4)"}}, "required": ["rating"]}


def input_prompt(instruction: str, schema: dict, data: dict) -> str:
    """A prompt in the format RAGAS's prompts use: instruction, schema, an example, then
    `input: {...}` and a trailing `Output:` (words of our own, the same layout)."""
    example = {"context": "Rome is in Italy.", "statements": ["Rome is in Italy."]}
    return (f"{instruction}\nThe answer must be JSON valid for this JSON Schema:\n{json.dumps(schema)}\n\n"
            f"Example\nInput: {json.dumps(example, indent=4)}\nOutput: {{\"items\": []}}\n\n"
            f"Now the real one\ninput: {json.dumps(data, indent=4)}\nOutput: ")


def content_of(raw: bytes):
    return json.loads(raw)["choices"][0]["message"]["content"]


def test_schema_in_the_prompt_is_answered_from_the_input_object(server):
    data = {"context": CONTEXT, "statements": ["Paris is the capital of France.",
                                               "Berlin hosts the German parliament."]}
    prompt = input_prompt("Judge every statement against the context.", VERDICTS_SCHEMA, data)
    # json_object with the schema in a system message (instructor's JSON mode), and plain text
    for body in (chat([{"role": "system", "content": "Match this json_schema:\n" + json.dumps(VERDICTS_SCHEMA, indent=2)},
                       {"role": "user", "content": prompt}], response_format={"type": "json_object"}),
                 chat([{"role": "user", "content": prompt}])):
        status, _, raw = post(server.url + "/chat/completions", body)
        answer = json.loads(content_of(raw))
        jsonschema.validate(answer, VERDICTS_SCHEMA)
        # one item per statement of the input object, judged against its other fields
        assert [i["statement"] for i in answer["items"]] == data["statements"]
        assert [i["verdict"] for i in answer["items"]] == [1, 0]


def test_rating_listed_in_a_description_and_the_plain_rules_without_a_schema(server):
    same = input_prompt("Rate the answer.", RATING_SCHEMA,
                        {"query": "Capital of France?", "user_answer": "Paris is the capital of France.",
                         "reference_answer": "Paris is the capital of France."})
    other = input_prompt("Rate the answer.", RATING_SCHEMA,
                         {"query": "Capital of France?", "user_answer": "Bananas grow on trees.",
                          "reference_answer": "Paris is the capital of France."})
    ratings = [json.loads(content_of(post(server.url + "/chat/completions", chat(
        [{"role": "user", "content": p}], response_format={"type": "json_object"}))[2]))["rating"]
        for p in (same, other)]
    assert ratings == [4, 0]
    # no schema anywhere in the prompt: json_object keeps its {"verdict", "reason"} answer
    _, _, raw = post(server.url + "/chat/completions", chat(response_format={"type": "json_object"}))
    assert set(json.loads(content_of(raw))) == {"verdict", "reason"}


def test_busiest_window_counts_arrivals_in_half_open_windows():
    assert busiest_window([], 1.0) == 0
    assert busiest_window([3.0, 0.0, 1.2, 0.5, 1.0], 1.0) == 3   # 0.5, 1.0, 1.2
    assert busiest_window([0.0, 1.0, 2.0], 1.0) == 1             # [t, t + 1) holds one of each pair
    assert busiest_window([0.0, 0.0, 0.0], 0.1) == 3


def test_contradiction_rule_a_different_name_or_number_in_the_same_statement():
    from evalbeam.transforms.judge.simulated import contradiction

    paris = ["The Eiffel Tower is in Paris.", "It was completed in 1889.", "Gustave Eiffel's company built it."]
    assert contradiction("The Eiffel Tower is in Rome.", paris) == ("Rome", "Paris")
    assert contradiction("Nice weather. It was completed in 1,925.", paris) == ("1925", "1889")
    # the same statement, extra information, another statement about the same thing: none
    for text in ("The Eiffel Tower is in Paris.", "The Eiffel Tower is in Paris, France, since 1889.",
                 "The Eiffel Tower was designed by Stephen Sauvestre.", "Rome is in Italy.", ""):
        assert contradiction(text, paris) is None, text
