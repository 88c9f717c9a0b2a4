"""The stand-in judge's HTTP answers: the response that `evalbeam judge-server`
(pipelines/runners/judge_server.py) sends for a request body, as pure functions (no server, no
state, no aiohttp). What an answer says comes from the answer rules of a dry run
(transforms/judge/simulated.py, whose docstring lists them); this module wraps them as the
OpenAI-compatible, TEI and vLLM endpoints answer, and adds what only a server does: token
counts, limits, logprobs, scoring classifiers, injected faults and the validation of bodies.

Everything is a pure function of the request body, so the same request always gets the same
answer; `created` is 0 and `system_fingerprint` is fixed:

* Tokens: `\\w+` runs and single punctuation characters each count as one token
  (`count_tokens`). prompt_tokens counts the text of every message (string content, or the "text" of
  content parts); cached_tokens and reasoning_tokens are always 0. With `n` choices the completion
  tokens are counted once per choice.
* Chat content: `simulated.chat_answer`; but `chat_payload(body, hash, fault, answer)`:
  answer(body) -> content or None, when given (tests running the server in-process pass it),
  answers first: a content it returns is the answer (faults, max_tokens and logprobs still
  apply); None falls back to the rules.
* max_tokens: content longer than that is cut to max_tokens tokens and finish_reason is "length".
* logprobs: one entry per token (leading whitespace kept with the token); the chosen token has
  p = 0.7, alternatives p = 0.3 * 2^-(k+1); digit tokens get neighbouring digits as alternatives.
* /completions with echo and logprobs (`completions_payload`): the prompt's tokens and
  log-probabilities are `simulated.prompt_logprobs`; the answer echoes them and adds one
  generated token " the" (log 0.5).
* Embeddings: `simulated.embed` of every input, `dimensions` (default 64) long.
* Scoring endpoints (`scoring_payload`): TEI's POST /predict and GET /info, vLLM's POST /classify
  and /score, over two deterministic classifiers (`classifier_logits`): a single text's logits
  over TEXT_LABELS hashed from the label and the text, and a (premise, hypothesis) pair's over
  PAIR_LABELS from the hypothesis's overlap with the premise.
* Faults the server injects (judge_server.py) that change an answer are applied here when a
  payload function is given their kind: truncated (finish_reason "length", content cut to half
  its tokens) and malformed (the response body cut in half, or, when JSON content was asked,
  message content that is not JSON).
* Invalid bodies: `validate_chat`, `validate_completions`, `validate_embeddings` and
  `validate_scoring` give the reason (the server answers 400 with it), or None; the payload
  functions build the response of a valid body.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from evalbeam.transforms.judge.simulated import (EMBEDDING_DIM, chat_answer, content_words, embed,
                                                 message_text, overlap, prompt_logprobs)

SYSTEM_FINGERPRINT = "fp_evalbeam_standin_v1"

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
LOGPROB_TOKEN_RE = re.compile(r"\s*(?:\w+|[^\w\s])")


def count_tokens(text: str) -> int:
    """Tokens = `\\w+` runs plus single punctuation characters (whitespace is free)."""
    return len(TOKEN_RE.findall(text or ""))


def cut_tokens(text: str, limit: int) -> str:
    """The prefix of `text` that holds its first `limit` tokens (all of it if it has fewer)."""
    if limit <= 0:
        return ""
    for i, match in enumerate(TOKEN_RE.finditer(text)):
        if i + 1 == limit:
            return text[:match.end()]
    return text


def canonical_hash(payload) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a request body."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode()).hexdigest()


def logprobs_for(content: str, top: int) -> dict:
    """Deterministic logprobs: chosen token p = 0.7, alternative k p = 0.3 * 2^-(k+1)."""
    entries = []
    for match in LOGPROB_TOKEN_RE.finditer(content):
        token = match.group(0)
        core = token.strip()
        lead = token[:len(token) - len(core)]
        if core.isdigit() and len(core) == 1:
            alts = [lead + str(d) for d in sorted(range(10), key=lambda d: (abs(d - int(core)), d))
                    if str(d) != core]
        else:
            alts = [lead + core.lower(), lead + core.upper(), " the", " a", ",", "."]
        alts = list(dict.fromkeys(a for a in alts if a != token))
        tops = [{"token": token, "logprob": math.log(0.7), "bytes": list(token.encode())}]
        for k, alt in enumerate(alts[:max(0, top - 1)]):
            tops.append({"token": alt, "logprob": math.log(0.3 * 2 ** -(k + 1)),
                         "bytes": list(alt.encode())})
        entries.append({"token": token, "logprob": math.log(0.7), "bytes": list(token.encode()),
                        "top_logprobs": tops[:top]})
    return {"content": entries}


def validate_chat(body) -> str | None:
    """The reason a chat request is invalid, or None."""
    if not isinstance(body, dict):
        return "The body must be a JSON object."
    if not isinstance(body.get("model"), str):
        return "'model' must be a string."
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list."
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
            return "'response_format.type' must be text, json_object or json_schema."
        if fmt["type"] == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                return "'response_format.json_schema.schema' must be an object."
    for key in ("n", "max_tokens", "max_completion_tokens", "top_logprobs"):
        if key in body and body[key] is not None and (not isinstance(body[key], int)
                                                      or body[key] < (0 if key == "top_logprobs" else 1)):
            return f"'{key}' must be a positive integer."
    return None


def validate_embeddings(body) -> str | None:
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "'model' must be a string."
    data = body.get("input")
    if not (isinstance(data, str) or (isinstance(data, list) and data
                                      and all(isinstance(t, str) for t in data))):
        return "'input' must be a string or a non-empty list of strings."
    dim = body.get("dimensions", EMBEDDING_DIM)
    if not isinstance(dim, int) or not 1 <= dim <= 4096:
        return "'dimensions' must be an integer in [1, 4096]."
    return None


def chat_payload(body: dict, request_hash: str, fault: str | None,
                 answer=None) -> tuple[dict | None, str | None]:
    """(response payload, or a raw broken body for the malformed fault). `fault` is the kind the
    server injects into this request, or None: only truncated and malformed change the answer.
    answer(body) -> content or None, when given, answers before the rules (tests choose
    verdicts with it)."""
    content, wants_json = _content(body, request_hash, answer)
    finish = "stop"
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if limit is not None and count_tokens(content) > limit:
        content, finish = cut_tokens(content, limit), "length"
    if fault == "truncated":
        content, finish = cut_tokens(content, count_tokens(content) // 2), "length"
    if fault == "malformed" and wants_json:
        content = "Sure! Here is the JSON you asked for:\n" + content[:len(content) // 2]
    n = body.get("n") or 1
    choice_logprobs = (logprobs_for(content, min(20, body.get("top_logprobs") or 0))
                       if body.get("logprobs") else None)
    choices = [{"index": i, "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": choice_logprobs, "finish_reason": finish} for i in range(n)]
    prompt_tokens = sum(count_tokens(message_text(m)) for m in body["messages"])
    completion_tokens = count_tokens(content) * n
    payload = {"id": "chatcmpl-" + request_hash[:24], "object": "chat.completion", "created": 0,
               "model": body["model"], "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices,
               "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + completion_tokens,
                         "prompt_tokens_details": {"cached_tokens": 0},
                         "completion_tokens_details": {"reasoning_tokens": 0}}}
    return _with_fault(payload, fault == "malformed" and not wants_json)


def _content(body: dict, request_hash: str, answer) -> tuple[str, bool]:
    """(content, wants_json) of a chat request: answer(body) when given and it answers, else
    the rules (simulated.chat_answer)."""
    chosen = answer(body) if answer is not None else None
    if chosen is None:
        return chat_answer(body, request_hash)
    fmt = body.get("response_format") or {}
    return chosen, isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object")


def _with_fault(payload, malformed: bool) -> tuple:
    """(payload, None), or for the malformed fault (None, the payload's JSON cut in half)."""
    if malformed:
        text = json.dumps(payload)
        return None, text[:len(text) // 2]
    return payload, None


def embeddings_payload(body: dict, fault: str | None) -> tuple[dict | None, str | None]:
    texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
    dim = body.get("dimensions", EMBEDDING_DIM)
    tokens = sum(count_tokens(t) for t in texts)
    payload = {"object": "list", "model": body["model"],
               "data": [{"object": "embedding", "index": i, "embedding": embed(t, dim)}
                        for i, t in enumerate(texts)],
               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return _with_fault(payload, fault == "malformed")


def validate_completions(body) -> str | None:
    """The reason a /completions request is invalid, or None (a string prompt only)."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "'model' must be a string."
    if not isinstance(body.get("prompt"), str):
        return "'prompt' must be a string."
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                 or not 0 <= logprobs <= 5):
        return "'logprobs' must be an integer in [0, 5]."
    max_tokens = body.get("max_tokens", 16)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        return "'max_tokens' must be a non-negative integer."
    return None


def completions_payload(body: dict, fault: str | None) -> tuple[dict | None, str | None]:
    """The /completions answer: one generated token " the" (none with max_tokens 0); with echo
    the text and the logprobs start with the prompt's (prompt_logprobs)."""
    prompt = body["prompt"]
    generated = " the" if body.get("max_tokens", 16) > 0 else ""
    logprobs = None
    if body.get("logprobs") is not None:
        tokens = {"tokens": [], "token_logprobs": [], "text_offset": []}
        if body.get("echo"):
            tokens = prompt_logprobs(prompt)
        start = len(prompt) if body.get("echo") else 0
        if generated:
            tokens["tokens"].append(generated)
            tokens["token_logprobs"].append(math.log(0.5))
            tokens["text_offset"].append(start)
        logprobs = dict(tokens, top_logprobs=None)
    prompt_tokens = len(prompt_logprobs(prompt)["tokens"])
    completion_tokens = 1 if generated else 0
    payload = {"id": "cmpl-" + hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:24],
               "object": "text_completion", "created": 0, "model": body["model"],
               "system_fingerprint": SYSTEM_FINGERPRINT,
               "choices": [{"index": 0, "text": (prompt if body.get("echo") else "") + generated,
                            "logprobs": logprobs, "finish_reason": "length"}],
               "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + completion_tokens}}
    return _with_fault(payload, fault == "malformed")


# ---------------------------------------------------------------- scoring endpoints

TEXT_LABELS = ("neutral", "toxic", "insult", "Biased")   # the single-text classifier's labels
PAIR_LABELS = ("hallucinated", "consistent")              # the (premise, hypothesis) classifier's


def classifier_logits(text: str, pair: str | None = None) -> list[float]:
    """The stand-in classifiers' logits: a single text's over TEXT_LABELS, each 6u - 3 with u in
    [0, 1) from the sha256 of the label and the text; a (premise, hypothesis) pair's over
    PAIR_LABELS, [0, 6o - 3] with o the overlap of the hypothesis with the premise's content
    words, so a hypothesis the premise supports is likely "consistent"."""
    if pair is not None:
        return [0.0, 6.0 * overlap(pair, content_words(text)) - 3.0]
    out = []
    for label in TEXT_LABELS:
        digest = hashlib.sha256((label + "\x00" + text).encode("utf-8", "surrogatepass")).digest()
        out.append(6.0 * int.from_bytes(digest[:4], "big") / 2 ** 32 - 3.0)
    return out


def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    return [e / sum(exps) for e in exps]


def _sequences(inputs):
    """TEI's /predict inputs as (batch?, [(text, pair or None)]), or None when malformed: a
    string, a pair [a, b], or a batch [[a], [a, b], ...]."""
    if isinstance(inputs, str):
        return False, [(inputs, None)]
    if isinstance(inputs, list) and inputs and all(isinstance(t, str) for t in inputs) and len(inputs) <= 2:
        return False, [(inputs[0], inputs[1] if len(inputs) == 2 else None)]
    if isinstance(inputs, list) and inputs and all(
            isinstance(s, list) and 1 <= len(s) <= 2 and all(isinstance(t, str) for t in s) for s in inputs):
        return True, [(s[0], s[1] if len(s) == 2 else None) for s in inputs]
    return None


def validate_scoring(route: str, body) -> str | None:
    """The reason a body is invalid for a scoring route ("predict", "classify", "score"), or None."""
    if not isinstance(body, dict):
        return "The body must be a JSON object."
    if route == "predict":
        if _sequences(body.get("inputs")) is None:
            return "'inputs' must be a string, a pair of strings or a batch of them."
        if not isinstance(body.get("raw_scores", False), bool):
            return "'raw_scores' must be a boolean."
        return None
    if route == "classify":
        data = body.get("input")
        if not (isinstance(data, str) or (isinstance(data, list) and data and all(isinstance(t, str) for t in data))):
            return "'input' must be a string or a non-empty list of strings."
        return None
    for key in ("text_1", "text_2"):
        if not isinstance(body.get(key), (str, list)):
            return f"'{key}' must be a string or a list of strings."
    return None


def scoring_payload(route: str, body: dict, fault: str | None) -> tuple:
    """(response payload, or a raw broken body for the malformed fault) of a valid body:
    TEI's /predict ([{"label", "score"}] sorted by score, the softmax over the labels, or the
    logits with raw_scores; a batch gives a list of those), vLLM's /classify (data[i].probs,
    the softmax) and /score (data[i].score, the pair's probability of "consistent")."""
    if route == "predict":
        batch, sequences = _sequences(body["inputs"])
        answers = []
        for text, pair in sequences:
            logits = classifier_logits(text, pair)
            scores = logits if body.get("raw_scores") else softmax(logits)
            labels = PAIR_LABELS if pair is not None else TEXT_LABELS
            answers.append(sorted(({"label": label, "score": score} for label, score in zip(labels, scores)),
                                  key=lambda item: -item["score"]))
        payload = answers if batch else answers[0]
    elif route == "classify":
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        data = []
        for i, text in enumerate(texts):
            probs = softmax(classifier_logits(text))
            data.append({"index": i, "label": TEXT_LABELS[probs.index(max(probs))], "probs": probs,
                         "num_classes": len(probs)})
        tokens = sum(count_tokens(t) for t in texts)
        payload = {"id": "classify-0", "object": "list", "created": 0, "model": body.get("model") or "stand-in",
                   "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                                           "completion_tokens": 0}}
    else:
        firsts = body["text_1"] if isinstance(body["text_1"], list) else [body["text_1"]]
        seconds = body["text_2"] if isinstance(body["text_2"], list) else [body["text_2"]]
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        data = [{"index": i, "object": "score", "score": softmax(classifier_logits(a, b))[1]}
                for i, (a, b) in enumerate(zip(firsts, seconds))]
        payload = {"id": "score-0", "object": "list", "created": 0, "model": body.get("model") or "stand-in",
                   "data": data, "usage": {"prompt_tokens": 0, "total_tokens": 0}}
    return _with_fault(payload, fault == "malformed")


def info_payload() -> dict:
    """TEI's GET /info of the stand-in: the single-text classifier's labels."""
    return {"model_id": "evalbeam-stand-in", "model_type": {"classifier": {
        "id2label": {str(i): label for i, label in enumerate(TEXT_LABELS)}}}}
