"""Scoring endpoints: the classifier metrics (ToxicityClassifier, FairnessBias, HHEM) from a
served classifier instead of a model on the workers: `--model_uri METRIC=URL`.

The URL is the route that scores one text, and its last path segment names the protocol:

  .../predict   Hugging Face text-embeddings-inference (TEI). Body {"inputs": text, or
                [premise, hypothesis] for a pair, "truncate": true, "raw_scores": bool}; answer
                [{"label", "score"}, ...] (sorted by score). TEI applies a softmax over the
                labels (a sigmoid for a one-label model). A multi-label model (toxic-bert,
                detoxify's), whose labels are independent, needs a sigmoid per label: end the
                URL with "#multi_label" and evalbeam asks for the raw scores and applies it.
                Label names: GET .../info (model_type.classifier.id2label), before the run.
  .../classify  vLLM's classification API (`vllm serve MODEL --task classify`; also SGLang).
                Body {"input": text, "truncate_prompt_tokens": 512}; answer {"data": [{"probs":
                [...], "num_classes": n}]}, the probabilities after the activation vLLM picks
                from the model's config. vLLM does not name every label: they are LABEL_0 ..
                LABEL_{n-1}, in the model's order, n from one probe request before the run.
                Single texts only.
  .../score     vLLM's score API for a cross-encoder with one output: body {"text_1": context,
                "text_2": response, "truncate_prompt_tokens": 512}; answer {"data": [{"score":
                s}]}, reported as the label "consistent". Pairs only (HHEM).

One text (or pair) per request, so that every answer is journaled and reused on its own; the
judge engine's concurrency, retries, deadline and budget apply, the rate is --model_rpm (no
limit by default; its own bucket per URL), and a scoring request is priced 0. The key, when the endpoint wants
one, comes from the variable named by --model_api_key_env and goes to the scoring endpoints
only (never the judge's key: the two are often different parties).

An answer that does not hold finite probabilities in [0, 1] for the labels is invalid_output.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import typing
from urllib.parse import urlsplit

ROUTES = ("predict", "classify", "score")
MAX_TOKENS = 512    # vLLM cuts longer texts (truncate_prompt_tokens), as the local path does
MULTI_LABEL = "multi_label"
CONSISTENT = "consistent"   # the label a /score answer is reported as


@dataclasses.dataclass(frozen=True)
class ScoringEndpoint:
    url: str            # the route, without fragment
    route: str          # one of ROUTES
    multi_label: bool   # TEI: raw scores, sigmoid per label

    @property
    def shown(self) -> str:
        """The URL without user, password or query (any may hold a secret), fragment kept."""
        return shown_uri(self.url + ("#" + MULTI_LABEL if self.multi_label else ""))


def shown_uri(uri: str) -> str:
    """A --model_uri URL as messages and records show it (ScoringEndpoint.shown), or the text
    as it is when it does not parse."""
    url, _, fragment = uri.partition("#")
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}" + (f"#{fragment}" if fragment else "")


def shown_model(uri: str) -> str:
    """A --model_uri as outputs show it: a folder as given, a URL as shown_uri shows it."""
    return shown_uri(uri) if is_endpoint(uri) else uri


def is_endpoint(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def parse_endpoint(uri: str) -> ScoringEndpoint:
    """The endpoint of a --model_uri URL; ValueError naming what is wrong."""
    url, _, fragment = uri.partition("#")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("a scoring endpoint is an http:// or https:// URL naming a host")
    route = parts.path.rstrip("/").rsplit("/", 1)[-1]
    if route not in ROUTES:
        raise ValueError("the URL must be the scoring route itself, ending in /predict (TEI), "
                         "/classify or /score (vLLM)")
    if fragment not in ("", MULTI_LABEL):
        raise ValueError(f"the only URL fragment understood is #{MULTI_LABEL}")
    if fragment and route != "predict":
        raise ValueError(f"#{MULTI_LABEL} is for TEI's /predict (vLLM applies the activation of "
                         "the model's config itself)")
    return ScoringEndpoint(url.rstrip("/"), route, bool(fragment))


def check_metric(metric: str, endpoint: ScoringEndpoint) -> None:
    """ValueError when the metric cannot be served by that route."""
    if metric == "BERTScore":
        raise ValueError("BERTScore needs an encoder's token vectors, which no scoring route "
                         "answers: give it a model folder")
    if metric == "HHEM" and endpoint.route == "classify":
        raise ValueError("HHEM scores (context, answer) pairs: use TEI's /predict or vLLM's /score")
    if metric != "HHEM" and endpoint.route == "score":
        raise ValueError(f"{metric} classifies single texts: use TEI's /predict or vLLM's /classify")


def request_body(endpoint: ScoringEndpoint, text: str, pair: str | None) -> dict:
    if endpoint.route == "predict":
        return {"inputs": text if pair is None else [text, pair], "truncate": True,
                "raw_scores": endpoint.multi_label}
    if endpoint.route == "classify":
        return {"input": text, "truncate_prompt_tokens": MAX_TOKENS}
    return {"text_1": text, "text_2": pair if pair is not None else "", "truncate_prompt_tokens": MAX_TOKENS}


def _probability(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def read_answer(endpoint: ScoringEndpoint, data: typing.Any) -> dict | None:
    """{"labels": [str], "probabilities": [float]} of a 200 answer's parsed JSON, or None when
    it does not hold them (the call is then invalid_output)."""
    labels, values = [], []
    if endpoint.route == "predict":
        if isinstance(data, list) and len(data) == 1 and isinstance(data[0], list):
            data = data[0]      # a batch of one
        if not isinstance(data, list) or not data:
            return None
        for item in data:
            if not isinstance(item, dict) or not isinstance(item.get("label"), str):
                return None
            labels.append(item["label"])
            values.append(_probability(item.get("score")))
        if None in values or len(set(labels)) != len(labels):
            return None
        if endpoint.multi_label:
            values = [1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))
                      for v in values]
    else:
        try:
            item = data["data"][0]
        except (KeyError, IndexError, TypeError):
            return None
        if not isinstance(item, dict):
            return None
        if endpoint.route == "classify":
            probs = item.get("probs")
            if not isinstance(probs, list) or not probs:
                return None
            values = [_probability(v) for v in probs]
            labels = [f"LABEL_{k}" for k in range(len(values))]
        else:
            values, labels = [_probability(item.get("score"))], [CONSISTENT]
    if any(v is None or not 0.0 <= v <= 1.0 for v in values):
        return None
    return {"labels": labels, "probabilities": values}


def labels_of(endpoint: ScoringEndpoint, api_key: str, timeout_s: float) -> tuple[str, ...]:
    """The model's label names in its order, asked before the run: TEI's GET .../info, one
    probe text for vLLM's /classify, ("consistent",) for /score. Raises ValueError (a short
    reason; no server text beyond a status) when the endpoint cannot tell."""
    if endpoint.route == "score":
        return (CONSISTENT,)
    return asyncio.run(_labels(endpoint, api_key, timeout_s))


async def _labels(endpoint: ScoringEndpoint, api_key: str, timeout_s: float) -> tuple[str, ...]:
    import aiohttp

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            if endpoint.route == "predict":
                call = session.get(endpoint.url.rsplit("/", 1)[0] + "/info")
            else:
                call = session.post(endpoint.url, json=request_body(endpoint, "evalbeam", None))
            async with call as resp:
                status = resp.status
                text = (await resp.content.read(1 << 20)).decode("utf-8", "replace")
    except asyncio.TimeoutError:
        raise ValueError(f"no answer within {timeout_s:g} s: is the server up and the URL right?") from None
    except (aiohttp.ClientError, OSError) as error:
        raise ValueError(f"cannot connect ({type(error).__name__})") from None
    asked = "GET /info" if endpoint.route == "predict" else "a probe request"
    if status != 200:
        hint = " (the key in --model_api_key_env's variable refused, or none sent)" if status in (401, 403) else ""
        raise ValueError(f"HTTP {status} to {asked}{hint}")
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"the answer to {asked} is not JSON") from None
    if endpoint.route == "classify":
        answer = read_answer(endpoint, data)
        if answer is None:
            raise ValueError("the answer to a probe request holds no class probabilities (data[0].probs)")
        return tuple(answer["labels"])
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not isinstance(model_type, dict):
        model_type = {}
    kind = model_type.get("classifier") or model_type.get("reranker")
    id2label = kind.get("id2label") if isinstance(kind, dict) else None
    if not isinstance(id2label, dict) or not id2label:
        raise ValueError("GET /info names no classifier labels (model_type.classifier.id2label): "
                         "is the served model a sequence classifier?")
    try:
        labels = tuple(str(id2label[key]) for key in sorted(id2label, key=int))
    except (ValueError, TypeError):
        raise ValueError("GET /info's id2label is not keyed by label index") from None
    if len(set(labels)) != len(labels):
        raise ValueError("GET /info's id2label names a label twice: each label is one record")
    return labels

