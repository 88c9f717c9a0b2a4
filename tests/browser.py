"""Load a self-contained HTML file in a real headless browser (Debian's chromium) and report what
happened: console messages, uncaught exceptions, error log entries, JavaScript dialogs, network
requests, load timings, DOM probes and a screenshot. For tests of the HTML the project writes.

    from browser import load_page, png_is_blank, requires_chromium

    @requires_chromium
    def test_report_loads(tmp_path):
        page = load_page(report, wait_js="window.reportReady", probes={"tables": "..."},
                         screenshot=tmp_path / "shot.png")
        assert not page.errors and not page.requests and not page.dialogs

One browser per call: started on a fresh temporary profile, driven over the Chrome DevTools
Protocol (aiohttp's websocket client, on 127.0.0.1), and killed (with its whole process group)
in a finally block; the profile is removed. Nothing leaves the machine: host names do not
resolve and every http(s)/ws(s) request beyond loopback goes to a dead proxy on 127.0.0.1, so a
page that needs the network shows it in `requests` (and a failed-load error in `log_errors`)
instead of fetching anything.

Without wait_js the harness waits until the page is quiet (no DevTools event and no request in
flight for QUIET_MS): a heuristic. A page whose script finishes on a timer should be waited for
with wait_js (a flag the page sets when it is done, or a DOM condition).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENV_VAR = "EVALBEAM_CHROMIUM"
SKIP_REASON = "needs Debian's chromium (apt-get install -y chromium); CI installs it in .ci/run"

# Schemes that never touch the network; a request to anything else is reported.
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")

# Debian's /usr/bin/chromium is a shell wrapper that sources /etc/chromium.d/* (API keys, extra
# flags such as --enable-remote-extensions, a /dev/shm probe that prints a shell warning) and
# then execs this binary: the harness runs the binary itself with flags of its own.
_DEBIAN_WRAPPER = "/usr/bin/chromium"
_DEBIAN_BINARY = "/usr/lib/chromium/chromium"

QUIET_MS = 300  # "quiet": no DevTools event and no request in flight for this long
QUIET_MAX_S = 5.0  # a page that never goes quiet (timers) is reported as it is after this
MAX_SCREENSHOT_HEIGHT = 16384  # chromium's largest texture; taller full-page shots are cut


class BrowserError(RuntimeError):
    """The browser could not be started, the page could not be loaded, or a probe threw."""


class BrowserTimeout(BrowserError, TimeoutError):
    """load_page ran past its hard timeout (the browser is killed all the same)."""


def find_chromium() -> str | None:
    """$EVALBEAM_CHROMIUM, else /usr/bin/chromium, else chromium, chromium-browser or
    google-chrome on PATH; None when there is none."""
    env = os.environ.get(ENV_VAR)
    if env:
        found = shutil.which(env)
        return found if found else None
    if os.access(_DEBIAN_WRAPPER, os.X_OK):
        return _DEBIAN_WRAPPER
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


requires_chromium = pytest.mark.skipif(find_chromium() is None, reason=SKIP_REASON)


@dataclass
class ConsoleMessage:
    type: str  # "log", "error", "warning", "info", "debug", "assert", ...
    text: str


@dataclass
class LogEntry:
    source: str  # "network", "security", "javascript", ...
    level: str
    text: str
    url: str | None = None


@dataclass
class Dialog:
    type: str  # "alert", "confirm", "prompt", "beforeunload"
    message: str


@dataclass
class PageResult:
    url: str
    console: list[ConsoleMessage] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)  # uncaught, with their message
    log_errors: list[LogEntry] = field(default_factory=list)  # Log.entryAdded, level error
    # each dismissed so the page goes on (confirm() gets false, prompt() null)
    dialogs: list[Dialog] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # URLs not file:/data:/blob:/about:
    load_ms: float | None = None  # navigation start -> load event
    ready_ms: float | None = None  # navigation start -> wait_js truthy (or page quiet)
    quiet: bool = True  # False: the page still had activity when the harness stopped waiting
    probes: dict = field(default_factory=dict)
    dom: str = ""  # document.documentElement.outerHTML after waiting
    screenshot: Path | None = None

    def console_texts(self, *types: str) -> list[str]:
        """Texts of the console messages of these types (all when none given)."""
        return [m.text for m in self.console if not types or m.type in types]

    @property
    def errors(self) -> list[str]:
        """Everything that went wrong in the page: console.error/assert, uncaught exceptions
        and error log entries (failed loads, CSP), one string each."""
        return (
            [f"console.{m.type}: {m.text}" for m in self.console if m.type in ("error", "assert")]
            + [f"exception: {text}" for text in self.exceptions]
            + [f"log[{e.source}]: {e.text}" + (f" ({e.url})" if e.url else "")
               for e in self.log_errors]
        )


def png_is_blank(path) -> bool:
    """True when the image is a single colour (a blank screenshot)."""
    from PIL import Image

    with Image.open(path) as image:
        extrema = image.convert("RGBA").getextrema()
    return all(low == high for low, high in extrema)


def load_page(
    path,
    *,
    width: int = 1280,
    height: int = 900,
    timeout: float = 30,
    wait_js: str | None = None,
    screenshot=None,
    full_page: bool = True,
    probes: dict[str, str] | None = None,
) -> PageResult:
    """Open the HTML file `path` in headless chromium and report what happened.

    Waits for the load event, then until the JS expression `wait_js` is truthy (or, without
    it, until the page is quiet); then evaluates `probes` (name -> JS expression returning a
    JSON-serialisable value; promises are awaited) into result.probes, keeps the DOM in
    result.dom, and writes a PNG screenshot (the full page, or the viewport when
    full_page=False) to `screenshot` if given. The whole call is bounded by `timeout` seconds:
    past it BrowserTimeout is raised. Raises BrowserError when chromium is missing or fails,
    the navigation fails, or a probe throws.
    """
    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(f"no HTML file at {file}")
    exe = find_chromium()
    if exe is None:
        raise BrowserError(f"chromium not found: {SKIP_REASON}")
    if os.path.realpath(exe) == _DEBIAN_WRAPPER and os.access(_DEBIAN_BINARY, os.X_OK):
        exe = _DEBIAN_BINARY
    options = dict(
        url=file.as_uri(), width=width, height=height, wait_js=wait_js,
        screenshot=Path(screenshot) if screenshot is not None else None,
        full_page=full_page, probes=dict(probes or {}),
    )
    deadline = time.monotonic() + timeout
    workdir = Path(tempfile.mkdtemp(prefix="evalbeam-chromium-"))
    profile, home, stderr_path = workdir / "profile", workdir / "home", workdir / "stderr.log"
    profile.mkdir()
    home.mkdir()
    process = None
    try:
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                [exe, *_flags(profile, width, height), "about:blank"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                env=_environment(home), start_new_session=True,  # own process group: see _stop
            )
        progress = {"phase": "starting chromium", "result": None}
        try:
            return _run(_session(process, profile, deadline, options, progress), timeout)
        except BrowserError as error:
            # say which page, what the harness was doing, and what the page or browser said
            if isinstance(error, BrowserTimeout):
                message = f"{file.name}: no result within {timeout:g} s, while {progress['phase']}"
                errors = progress["result"].errors if progress["result"] is not None else []
                if errors:
                    message += "\nthe page's errors so far:\n  " + "\n  ".join(errors[:10])
            else:
                message = f"{file.name}: {error}"
            died = not _alive(process)
            if died or progress["phase"] == "starting chromium":
                tail = _tail(stderr_path)
                message += "\nchromium " + ("exited" if died else "was running") + (
                    f"; its stderr ends:\n{tail}" if tail else "")
            raise type(error)(message) from error
    finally:
        _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)


# --- launching and stopping ---------------------------------------------------------------


def _flags(profile: Path, width: int, height: int) -> list[str]:
    return [
        "--headless",
        "--no-sandbox",  # root (this machine and CI) cannot use the sandbox
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        f"--window-size={width},{height}",
        # nothing reaches the network: no host name resolves, and every proxied request
        # (all http/https/ws/wss but loopback) goes to a closed port on loopback, failing at once
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
        "--proxy-server=127.0.0.1:9",
        "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-breakpad",
        "--disable-crash-reporter",
        "--no-default-browser-check",
        "--no-pings",
        "--metrics-recording-only",
        "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,"
        "AutofillServerCommunication,CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions",
        # dependable in containers and on loaded machines
        "--disable-dev-shm-usage",
        "--disable-background-timer-throttling",
        "--disable-renderer-backgrounding",
        "--disable-backgrounding-occluded-windows",
        "--hide-scrollbars",
        "--mute-audio",
        "--password-store=basic",
        "--use-mock-keychain",
    ]


def _environment(home: Path) -> dict[str, str]:
    # a HOME of its own: chromium writes ~/.pki and ~/.config files otherwise
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CHROME_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CACHE_HOME=str(home / ".cache"), TZ=os.environ.get("TZ", "UTC"))
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    return env


def _alive(process: subprocess.Popen) -> bool:
    """Whether the browser has not exited, without reaping it (so its pid, which is also its
    process group's id, stays ours until _stop)."""
    if process.returncode is not None:
        return False
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return info is None


def _stop(process: subprocess.Popen | None) -> None:
    """Kill the browser and every process it started (its process group, which
    start_new_session made ours alone), then reap it."""
    if process is None:
        return
    if process.returncode is None:  # not reaped yet: the group id cannot have been reused
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
        pass


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if line.strip() and "dbus" not in line.lower()]
    return "\n".join(kept[-lines:])


def _run(coroutine, timeout: float):
    """asyncio.run with a hard timeout; in a thread of its own if this one runs an event loop."""

    async def bounded():
        try:
            return await asyncio.wait_for(coroutine, timeout)
        except asyncio.TimeoutError as error:
            raise BrowserTimeout("hard timeout") from error

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(bounded())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, bounded()).result()


# --- the DevTools session ---------------------------------------------------------------------


async def _devtools_url(process: subprocess.Popen, profile: Path, deadline: float) -> str:
    """ws:// URL of the browser endpoint, from DevToolsActivePort (port, then path)."""
    port_file = profile / "DevToolsActivePort"
    while True:
        try:
            lines = port_file.read_text().splitlines()
        except OSError:
            lines = []
        if len(lines) >= 2 and lines[0].strip().isdigit() and lines[1].startswith("/"):
            return f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
        if not _alive(process):
            raise BrowserError("chromium exited before opening its DevTools port")
        if time.monotonic() > deadline:
            raise BrowserTimeout("chromium did not open its DevTools port")
        await asyncio.sleep(0.05)


class _Connection:
    """A CDP client on one websocket: commands get futures, events go to a handler."""

    def __init__(self, ws, on_event):
        self.ws = ws
        self.on_event = on_event
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.closed: BaseException | None = None

    async def send(self, method: str, params: dict | None = None, session: str | None = None):
        if self.closed is not None:
            raise BrowserError(f"DevTools connection closed ({self.closed}) before {method}")
        message_id = next(self.ids)
        message = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        future = asyncio.get_running_loop().create_future()
        self.pending[message_id] = future
        await self.ws.send_str(json.dumps(message))
        reply = await future
        if "error" in reply:
            raise BrowserError(f"{method} failed: {reply['error'].get('message', reply['error'])}")
        return reply.get("result", {})

    async def read(self):
        import aiohttp

        try:
            async for message in self.ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(message.data)
                if "id" in data:
                    future = self.pending.pop(data["id"], None)
                    if future is not None and not future.done():
                        future.set_result(data)
                else:
                    self.on_event(data.get("method", ""), data.get("params", {}))
            self.closed = BrowserError("the browser closed the DevTools connection")
        except Exception as error:  # noqa: BLE001 - handed to every waiting command
            self.closed = error
        for future in self.pending.values():
            if not future.done():
                future.set_exception(BrowserError(f"DevTools connection lost: {self.closed}"))
        self.pending.clear()


def _remote_text(arg: dict) -> str:
    if "value" in arg:
        value = arg["value"]
        return value if isinstance(value, str) else json.dumps(value)
    if "unserializableValue" in arg:
        return arg["unserializableValue"]
    return arg.get("description", arg.get("type", ""))


def _exception_text(details: dict) -> str:
    exception = details.get("exception") or {}
    text = exception.get("description") or details.get("text", "")
    if exception.get("description") and details.get("text", "").startswith("Uncaught"):
        first = exception["description"].splitlines()[0]
        text = f"Uncaught {first}" + exception["description"][len(first):]
    where = details.get("url")
    if where:
        text += f" ({where}:{details.get('lineNumber', 0) + 1})"
    return text


async def _session(process, profile: Path, deadline: float, options: dict,
                   progress: dict) -> PageResult:
    import aiohttp

    result = progress["result"] = PageResult(url=options["url"])

    def phase(text: str):
        progress["phase"] = text

    loop = asyncio.get_running_loop()
    state = {"last_event": time.monotonic(), "loaded": set(), "inflight": set(), "t0": None}
    wake = asyncio.Event()
    tasks: set[asyncio.Task] = set()
    connection: _Connection | None = None
    session_id: str | None = None

    def dismiss_dialog():
        # sent from a task: the reader must not wait for its own replies
        task = loop.create_task(
            connection.send("Page.handleJavaScriptDialog", {"accept": False}, session_id)
        )
        tasks.add(task)
        task.add_done_callback(lambda t: (tasks.discard(t), t.cancelled() or t.exception()))

    def on_event(method: str, params: dict):
        now = time.monotonic()
        if method == "Runtime.consoleAPICalled":
            text = " ".join(_remote_text(arg) for arg in params.get("args", []))
            result.console.append(ConsoleMessage(params.get("type", "log"), text))
        elif method == "Runtime.exceptionThrown":
            result.exceptions.append(_exception_text(params.get("exceptionDetails", {})))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") == "error":
                result.log_errors.append(LogEntry(entry.get("source", ""), entry["level"],
                                                  entry.get("text", ""), entry.get("url")))
        elif method == "Page.javascriptDialogOpening":
            result.dialogs.append(Dialog(params.get("type", ""), params.get("message", "")))
            dismiss_dialog()
        elif method == "Network.requestWillBeSent":
            url = params.get("request", {}).get("url", "")
            if not url.startswith(LOCAL_SCHEMES):
                result.requests.append(url)
            if not url.startswith("data:"):  # data: loads may never report finishing
                state["inflight"].add(params.get("requestId"))
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            state["inflight"].discard(params.get("requestId"))
        elif method == "Network.webSocketCreated":
            result.requests.append(params.get("url", ""))
        elif method == "Page.lifecycleEvent" and params.get("name") == "load":
            if state["t0"] is not None:
                state["loaded"].add(params.get("loaderId"))
                state.setdefault("load_at", {}).setdefault(params.get("loaderId"), now)
        elif method == "Inspector.targetCrashed":
            state["detached"] = "the page's renderer crashed"
        elif method == "Inspector.detached":
            state["detached"] = params.get("reason", "detached")
        state["last_event"] = now
        wake.set()

    async def wait_for(predicate, what: str, limit: float | None = None):
        """Wait (event-driven, with a short poll) until predicate() is true."""
        stop = min(deadline, limit) if limit else deadline
        while not predicate():
            if connection.closed is not None or state.get("detached"):
                raise BrowserError(f"the page went away while waiting for {what} "
                                   f"({connection.closed or state.get('detached')})")
            left = stop - time.monotonic()
            if left <= 0:
                if limit and limit < deadline:
                    return False
                raise BrowserTimeout(f"waiting for {what}")
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), min(left, 0.05))
            except asyncio.TimeoutError:
                pass
        return True

    async def evaluate(expression: str, what: str):
        reply = await connection.send("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True,
            "userGesture": False,
        }, session_id)
        if "exceptionDetails" in reply:
            raise BrowserError(f"{what} threw: {_exception_text(reply['exceptionDetails'])}")
        return reply.get("result", {}).get("value")

    ws_url = await _devtools_url(process, profile, deadline)
    phase("connecting to chromium's DevTools")
    try:
        async with aiohttp.ClientSession(trust_env=False) as http:
            async with http.ws_connect(ws_url, max_msg_size=0, autoping=True) as ws:
                connection = _Connection(ws, on_event)
                reader = loop.create_task(connection.read())
                try:
                    target = await connection.send("Target.createTarget", {"url": "about:blank"})
                    attached = await connection.send(
                        "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
                    session_id = attached["sessionId"]
                    send = lambda method, params=None: connection.send(method, params, session_id)  # noqa: E731
                    await asyncio.gather(
                        send("Page.enable"), send("Runtime.enable"), send("Log.enable"),
                        send("Network.enable"), send("Page.setLifecycleEventsEnabled", {"enabled": True}),
                    )
                    await send("Emulation.setDeviceMetricsOverride", {
                        "width": options["width"], "height": options["height"],
                        "deviceScaleFactor": 1, "mobile": False})

                    phase("loading the page (waiting for its load event)")
                    state["t0"] = time.monotonic()
                    navigation = await send("Page.navigate", {"url": options["url"]})
                    if navigation.get("errorText"):
                        raise BrowserError(f"navigation to {options['url']} failed: "
                                           f"{navigation['errorText']}")
                    loader = navigation.get("loaderId")
                    await wait_for(lambda: loader in state["loaded"], "the load event")
                    result.load_ms = (state["load_at"][loader] - state["t0"]) * 1000

                    if options["wait_js"]:
                        phase(f"waiting for wait_js to be truthy: {options['wait_js']}")
                        check = f"Promise.resolve(({options['wait_js']})).then(Boolean)"
                        while True:
                            try:  # a wait_js that throws (not defined yet...) is not truthy yet
                                if await evaluate(check, "wait_js"):
                                    break
                            except BrowserError as error:
                                if connection.closed is not None:
                                    raise
                                phase(f"waiting for wait_js to be truthy: {options['wait_js']} "
                                      f"(last try: {str(error).removeprefix('wait_js ')})")
                            if state.get("detached"):
                                raise BrowserError(f"the page went away: {state['detached']}")
                            if time.monotonic() > deadline:
                                raise BrowserTimeout("wait_js")
                            await asyncio.sleep(0.05)
                        result.ready_ms = (time.monotonic() - state["t0"]) * 1000
                    else:
                        phase("waiting for the page to go quiet")
                        quiet = QUIET_MS / 1000
                        result.quiet = await wait_for(
                            lambda: not state["inflight"]
                            and time.monotonic() - state["last_event"] >= quiet,
                            "the page to go quiet", limit=time.monotonic() + QUIET_MAX_S)
                        result.ready_ms = (time.monotonic() - state["t0"]) * 1000
                    phase("waiting for a painted frame (is the page's JavaScript stuck?)")
                    # let the page paint what it has before it is probed and shot
                    # (a timer too, in case frames are not produced: never wait on them alone)
                    await evaluate("new Promise(done => { setTimeout(() => done(false), 1000); "
                                   "requestAnimationFrame(() => requestAnimationFrame("
                                   "() => done(true))); })", "a frame")

                    for name, expression in options["probes"].items():
                        phase(f"evaluating probe {name!r}")
                        result.probes[name] = await evaluate(expression, f"probe {name!r}")
                    phase("reading the DOM")
                    result.dom = await evaluate("document.documentElement.outerHTML", "dom") or ""

                    if options["screenshot"] is not None:
                        phase("taking the screenshot")
                        params = {"format": "png", "fromSurface": True}
                        if options["full_page"]:
                            metrics = await send("Page.getLayoutMetrics")
                            size = metrics.get("cssContentSize") or metrics["contentSize"]
                            params.update(captureBeyondViewport=True, clip={
                                "x": 0, "y": 0, "scale": 1,
                                "width": max(1, min(int(size["width"]), 16384)),
                                "height": max(1, min(int(size["height"]), MAX_SCREENSHOT_HEIGHT)),
                            })
                        shot = await send("Page.captureScreenshot", params)
                        options["screenshot"].parent.mkdir(parents=True, exist_ok=True)
                        options["screenshot"].write_bytes(base64.b64decode(shot["data"]))
                        result.screenshot = options["screenshot"]
                    return result
                finally:
                    for task in list(tasks):
                        task.cancel()
                    reader.cancel()
                    await asyncio.gather(reader, *tasks, return_exceptions=True)
    except aiohttp.ClientError as error:
        raise BrowserError(f"DevTools connection to {ws_url} failed: {error!r}") from error
