"""`evalbeam judge-server`: a deterministic stand-in for an OpenAI-compatible LLM judge.

    evalbeam judge-server --port N [--host 127.0.0.1] [--latency_ms M] [--rpm R]
        [--fault_rate F] [--faults 429,500,503,timeout,reset,malformed,truncated] [--seed S]
        [--timeout_fault_s T] [--fault_retry_after_ms MS]
    (the dashed spellings --latency-ms, --fault-rate, ... of earlier versions still work)

Endpoints: POST /v1/chat/completions, POST /v1/completions (echo + logprobs: prompt
log-probabilities), POST /v1/embeddings, GET /v1/models (every path also
without /v1), GET /stats, POST /stats/reset; and the scoring routes of the classifier metrics:
POST /predict with GET /info (text-embeddings-inference), POST /classify and /score (vLLM, also
under /v1).
Tests use `StandInServer` (a context manager running the app on 127.0.0.1 in a background thread).

Answers: pipelines/runners/stand_in.py builds each response, over the answer rules that a dry run
uses too (transforms/judge/simulated.py; the two docstrings list every rule): every answer is a
pure function of the request body, so the same request always gets the same answer. Tests running
the server in-process may pass answer(body) -> content or None: a content it returns is the answer
(faults, max_tokens and logprobs still apply); None falls back to the rules.

Faults (`--fault_rate F`, kinds from `--faults`, a seeded RNG drawing two numbers per arriving API
request, so the schedule depends only on the seed and the arrival order): 429 (rate-limit body with
Retry-After of `fault_retry_after_ms`, default 200), 500, 503, timeout (waits `timeout_fault_s`, default 30 s, then answers normally),
reset (TCP reset, no response), malformed (200 with a body cut in half, or, when JSON content was
asked, message content that is not JSON), truncated (200, finish_reason "length", content cut to half
its tokens). Faults apply to both POST endpoints; /stats is never faulted or rate limited.

Permanent errors by model name: fail-400, fail-401, fail-403, fail-404, and quota (429 with code
insufficient_quota); they carry `x-should-retry: false`.

Rate limit (`--rpm R`): a sliding 60 s window of accepted requests; beyond R, 429 with `Retry-After`
(whole seconds, rounded up), `retry-after-ms` and an OpenAI-style body. Every API response carries
`x-ratelimit-remaining-requests` (1000000 when unlimited).

The Authorization header is never read, logged or echoed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import math
import random
import socket
import struct
import sys
import threading
import time

from aiohttp import web

from evalbeam.pipelines.runners.stand_in import (canonical_hash, chat_payload, completions_payload,
                                                 embeddings_payload, info_payload, scoring_payload,
                                                 validate_chat, validate_completions,
                                                 validate_embeddings, validate_scoring)

SCORING_ROUTES = ("predict", "classify", "score")
FAULT_KINDS = ("429", "500", "503", "timeout", "reset", "malformed", "truncated")
PERMANENT_MODELS = ("fail-400", "fail-401", "fail-403", "fail-404", "quota")
UNLIMITED = 1_000_000  # what x-ratelimit-remaining-requests says when there is no --rpm
WINDOW_S = 60.0
STATE = web.AppKey("state", object)
FAULT_RETRY_AFTER_MS = 200  # default delay of an injected 429: short, so clients under test do not sleep long
LISTED_MODELS = ("gpt-4o-mini", "text-embedding-3-small")


def error_body(message: str, kind: str, code: str | None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


PERMANENT_ERRORS = {
    "fail-400": (400, "Invalid request (stand-in permanent error).", "invalid_request_error",
                 "invalid_request"),
    "fail-401": (401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    "fail-403": (403, "You are not allowed to use this model.", "permission_error",
                 "model_not_permitted"),
    "fail-404": (404, "The model does not exist.", "invalid_request_error", "model_not_found"),
    "quota": (429, "You exceeded your current quota, please check your plan and billing details.",
              "insufficient_quota", "insufficient_quota"),
}


# ---------------------------------------------------------------- server


def busiest_window(times: list[float], width: float) -> int:
    """The most arrivals (monotonic times, e.g. stats()["arrivals"]) in any half-open window
    [t, t + width): what a rate limit of that many per width would have to allow."""
    times, best, lo = sorted(times), 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= width:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


class JudgeState:
    """Server options plus everything /stats reports; touched only from the server's event loop."""

    def __init__(self, latency_ms: float = 0, rpm: int | None = None, fault_rate: float = 0.0,
                 faults=FAULT_KINDS, seed: int = 0, timeout_fault_s: float = 30.0, answer=None,
                 fault_retry_after_ms: float = FAULT_RETRY_AFTER_MS):
        unknown = [f for f in faults if f not in FAULT_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {','.join(FAULT_KINDS)}")
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError("fault rate must be within [0, 1]")
        if fault_rate > 0 and not faults:
            raise ValueError("a fault rate needs at least one fault kind")
        self.latency_ms = latency_ms
        self.rpm = rpm
        self.fault_rate = fault_rate
        self.faults = tuple(faults)
        self.seed = seed
        self.timeout_fault_s = timeout_fault_s
        self.fault_retry_after_ms = fault_retry_after_ms
        self.answer = answer  # answer(body) -> content or None (rules); in-process tests only
        self.closing: asyncio.Event | None = None  # set on shutdown so timeout faults end early
        self.reset()

    def reset(self) -> None:
        """Forget stats, the rate-limit window and the fault schedule (restarts at the seed)."""
        self.rng = random.Random(self.seed)
        self.window: collections.deque[float] = collections.deque()
        self.requests = 0
        self.by_path: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.fault_counts: collections.Counter[str] = collections.Counter()
        self.dropped = 0
        self.arrivals: list[float] = []
        self.body_hashes: collections.Counter[str] = collections.Counter()

    def stats(self) -> dict:
        return {"requests": self.requests, "by_path": dict(self.by_path),
                "status_counts": dict(self.statuses), "dropped": self.dropped,
                "faults": dict(self.fault_counts), "arrivals": list(self.arrivals),
                "distinct_bodies": len(self.body_hashes),
                "duplicate_bodies": sum(self.body_hashes.values()) - len(self.body_hashes)}

    def next_fault(self) -> str | None:
        """Two draws per request whatever happens, so the schedule depends only on arrival order."""
        roll, pick = self.rng.random(), self.rng.random()
        if roll < self.fault_rate:
            return self.faults[int(pick * len(self.faults))]
        return None

    def admit(self, now: float) -> tuple[bool, float]:
        """Sliding window: (accepted, seconds until a slot frees when refused)."""
        while self.window and now - self.window[0] >= WINDOW_S:
            self.window.popleft()
        if self.rpm is not None and len(self.window) >= self.rpm:
            return False, WINDOW_S - (now - self.window[0])
        self.window.append(now)
        return True, 0.0

    def remaining(self) -> int:
        return UNLIMITED if self.rpm is None else max(0, self.rpm - len(self.window))


def _json_response(state: JudgeState, status: int, payload, headers: dict | None = None,
                   text: str | None = None) -> web.Response:
    heads = {"x-ratelimit-remaining-requests": str(state.remaining())}
    if state.rpm is not None:
        heads["x-ratelimit-limit-requests"] = str(state.rpm)
    heads.update(headers or {})
    state.statuses[str(status)] += 1
    body = text if text is not None else json.dumps(payload)
    return web.Response(status=status, text=body, content_type="application/json", headers=heads)


def _rate_limited(state: JudgeState, wait_s: float, message: str) -> web.Response:
    headers = {"Retry-After": str(max(1, math.ceil(wait_s))),
               "retry-after-ms": str(max(1, round(wait_s * 1000))),
               "x-ratelimit-reset-requests": f"{max(1, round(wait_s * 1000))}ms"}
    return _json_response(state, 429, error_body(message, "rate_limit_exceeded",
                                                 "rate_limit_exceeded"), headers)


def _reset_connection(request: web.Request) -> None:
    """Close with a TCP RST (SO_LINGER 0) so the client sees a reset, not a clean close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


async def _api(request: web.Request, endpoint: str) -> web.StreamResponse:
    """One API request: stats, rate limit, fault, latency, permanent errors, then the answer."""
    state: JudgeState = request.app[STATE]
    raw = await request.read()
    state.requests += 1
    state.by_path[request.path] += 1
    state.arrivals.append(time.monotonic())
    try:
        body = json.loads(raw)
        state.body_hashes[canonical_hash(body)] += 1
    except ValueError:
        body = None
        state.body_hashes[hashlib.sha256(raw).hexdigest()] += 1

    fault = state.next_fault()  # drawn before the rate limit so the schedule is by arrival only
    accepted, wait_s = state.admit(time.monotonic())
    if not accepted:
        return _rate_limited(state, wait_s, f"Rate limit reached: {state.rpm} requests per minute.")
    if fault:
        state.fault_counts[fault] += 1
    if fault == "reset":
        state.dropped += 1
        _reset_connection(request)
        # aiohttp cannot write to an aborted transport; this response is never sent
        return web.Response(status=499)
    if fault == "timeout":
        try:
            await asyncio.wait_for(state.closing.wait(), state.timeout_fault_s)
        except asyncio.TimeoutError:
            pass
    if state.latency_ms:
        await asyncio.sleep(state.latency_ms / 1000)
    if fault == "429":
        return _rate_limited(state, state.fault_retry_after_ms / 1000, "Rate limit reached (injected).")
    if fault in ("500", "503"):
        status = int(fault)
        kind = "server_error" if status == 500 else "service_unavailable"
        return _json_response(state, status, error_body(f"Injected {status}.", kind, kind))

    if endpoint in SCORING_ROUTES:
        problem = validate_scoring(endpoint, body)
    else:
        problem = {"chat": validate_chat, "completions": validate_completions,
                   "embeddings": validate_embeddings}[endpoint](body)
    if problem:
        return _json_response(state, 400, error_body(problem, "invalid_request_error",
                                                     "invalid_request"), {"x-should-retry": "false"})
    if endpoint in SCORING_ROUTES:
        payload, broken = scoring_payload(endpoint, body, fault)
        return _json_response(state, 200, payload, text=broken)
    if body["model"] in PERMANENT_ERRORS:
        status, message, kind, code = PERMANENT_ERRORS[body["model"]]
        return _json_response(state, status, error_body(message, kind, code),
                              {"x-should-retry": "false"})
    request_hash = canonical_hash(body)
    if endpoint == "chat":
        payload, broken = chat_payload(body, request_hash, fault, state.answer)
    elif endpoint == "completions":
        payload, broken = completions_payload(body, fault)
    else:
        payload, broken = embeddings_payload(body, fault)
    return _json_response(state, 200, payload, {"x-request-id": "req-" + request_hash[:16]},
                          text=broken)


def _route(endpoint: str):
    """The handler of one API endpoint (_api does the work)."""
    async def handle(request):
        return await _api(request, endpoint)

    return handle


async def _info(request):
    """GET /info (TEI): the classifier's labels. Never faulted or counted, like /models."""
    return web.json_response(info_payload())


async def _models(request):
    """GET /models: the cheap request evalbeam sends before a run to check the endpoint. The
    stand-in answers every model name; it lists evalbeam's defaults. Never faulted, never rate
    limited, not counted in /stats."""
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "evalbeam-stand-in"}
        for name in LISTED_MODELS]})


async def _stats(request):
    return web.json_response(request.app[STATE].stats())


async def _stats_reset(request):
    request.app[STATE].reset()
    return web.json_response({"reset": True})


def build_app(state: JudgeState) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    # every path also without /v1: clients configured without the prefix (vLLM serves both)
    for endpoint, path in (("chat", "/chat/completions"), ("completions", "/completions"),
                           ("embeddings", "/embeddings"), ("classify", "/classify"), ("score", "/score")):
        app.router.add_post("/v1" + path, _route(endpoint))
        app.router.add_post(path, _route(endpoint))
    app.router.add_post("/predict", _route("predict"))      # TEI
    app.router.add_get("/info", _info)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/models", _models)
    app.router.add_get("/stats", _stats)
    app.router.add_post("/stats/reset", _stats_reset)
    return app


async def _start(state: JudgeState, host: str, port: int, access_log) -> tuple[web.AppRunner, int]:
    state.closing = asyncio.Event()
    # a short shutdown timeout: pending timeout faults are woken by `closing` anyway
    runner = web.AppRunner(build_app(state), access_log=access_log, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, runner.addresses[0][1]


class StandInServer:
    """The judge server on 127.0.0.1 (loopback only) in a background thread with its own loop.

        with StandInServer(rpm=30) as server:
            url = server.url          # "http://127.0.0.1:PORT/v1"
            ...
            server.stats()            # the /stats dict
    """

    def __init__(self, port: int = 0, latency_ms: float = 0, rpm: int | None = None,
                 fault_rate: float = 0.0, faults=FAULT_KINDS, seed: int = 0,
                 timeout_fault_s: float = 30.0, answer=None,
                 fault_retry_after_ms: float = FAULT_RETRY_AFTER_MS):
        self.state = JudgeState(latency_ms, rpm, fault_rate, faults, seed, timeout_fault_s, answer,
                                fault_retry_after_ms)
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/v1"

    def start(self) -> StandInServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._runner, self.port = self._loop.run_until_complete(
                    _start(self.state, "127.0.0.1", self.port, None))
            except BaseException as exc:  # reported to start(), which raises it
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="judge-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def _call(self, fn):
        """Run `fn` on the server loop and return its result (stats must not race the handlers)."""
        done = threading.Event()
        box = []
        self._loop.call_soon_threadsafe(lambda: (box.append(fn()), done.set()))
        done.wait(10)
        return box[0]

    def stats(self) -> dict:
        return self._call(self.state.stats)

    def reset_stats(self) -> None:
        self._call(self.state.reset)

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        loop = self._loop
        loop.call_soon_threadsafe(self.state.closing.set)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(15)
        self._thread = None

    def __enter__(self) -> StandInServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- CLI

def parse_faults(text: str) -> tuple[str, ...]:
    faults = tuple(f.strip() for f in text.split(",") if f.strip())
    unknown = [f for f in faults if f not in FAULT_KINDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {unknown}; known: {','.join(FAULT_KINDS)}")
    return faults


def parse_rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be within [0, 1]")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Options spelt with underscores, as every other evalbeam command spells them; the dashed
    spellings of earlier versions (--latency-ms, --fault-rate, --timeout-fault-s,
    --fault-retry-after-ms) still work, as hidden aliases, so scripts using them do not break."""
    parser = argparse.ArgumentParser(
        prog="evalbeam judge-server", allow_abbrev=False,
        description="A deterministic stand-in for an OpenAI-compatible LLM judge "
                    "(/v1/chat/completions, /v1/embeddings, /v1/models, /stats).")

    def option(name: str, **kwargs) -> None:
        parser.add_argument(name, **kwargs)
        if "_" in name:   # the dashed alias: same destination, no help line, no default of its own
            alias = {k: v for k, v in kwargs.items() if k in ("type", "metavar")}
            parser.add_argument(name.replace("_", "-"), dest=name[2:], default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS, **alias)

    option("--port", type=int, required=True, help="port to listen on (0: any free one)")
    option("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    option("--latency_ms", type=float, default=0.0, help="delay before every answer")
    option("--rpm", type=int, default=None,
           help="requests per sliding 60 s window before answering 429")
    option("--fault_rate", type=parse_rate, default=0.0,
           help="share of API requests that get a fault (0..1)")
    option("--faults", type=parse_faults, default=FAULT_KINDS,
           help=f"fault kinds to choose among (default {','.join(FAULT_KINDS)})")
    option("--seed", type=int, default=0, help="seed of the fault schedule")
    option("--timeout_fault_s", type=float, default=30.0,
           help="how long a timeout fault waits before answering (default 30)")
    option("--fault_retry_after_ms", type=float, default=FAULT_RETRY_AFTER_MS,
           help=f"Retry-After of an injected 429 (default {FAULT_RETRY_AFTER_MS})")
    return parser


def state_from_args(args: argparse.Namespace) -> JudgeState:
    return JudgeState(args.latency_ms, args.rpm, args.fault_rate, args.faults, args.seed,
                      args.timeout_fault_s, fault_retry_after_ms=args.fault_retry_after_ms)


async def _serve_forever(state: JudgeState, host: str, port: int) -> None:
    stop = asyncio.Event()
    try:  # SIGTERM ends the server as cleanly as Ctrl-C (not available on every platform)
        import signal
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    runner, bound = await _start(state, host, port, None)
    # printed once listening (and after the handler), so a supervisor can wait for this line
    print(f"judge-server listening on http://{host}:{bound}/v1", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        state.closing.set()
        await runner.cleanup()


def run(argv: list[str]) -> int:
    """Serve until interrupted (Ctrl-C or SIGTERM); returns the exit code (2 on bad options)."""
    args = build_parser().parse_args(argv)
    try:
        state = state_from_args(args)
    except ValueError as exc:
        print(f"evalbeam judge-server: error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve_forever(state, args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
