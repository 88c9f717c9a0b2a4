"""Results history in MLflow: one MLflow run per finished evalbeam run folder
(`--mlflow_tracking_uri URI`; the reference is pipelines/quality/history.md).

    check_tracking_uri(uri)                 before a run starts: UsageError if it cannot be logged
    log_run(folder, uri, run_name=, tags=, experiment=)   -> the MLflow run id

What a run logs: its options, task, models, slices and evalbeam version as params; task, status,
models and folder as tags (plus the caller's); every scalar of metrics.jsonl as a metric (numbers,
and each numeric field of dict values; curves and matrices are left to the metrics.jsonl
artifact), with the bootstrap interval's ends beside it; run.json, metrics.jsonl, report.html,
gates.json and comparison.jsonl as artifacts. The MLflow run ends FINISHED when run.json says
"complete", FAILED otherwise.

Metric names (metric_names): `MODEL/TYPE[/FIELD][/PARAM-VALUE...][/slice.KEY-VALUE...]/LEAF`,
LEAF one of value, ci_low, ci_high (p_value, p_value_adjusted for comparisons), e.g.
`model_a/Precision/label-class.bird/score_threshold-0.5/slice.region-eu/ci_low`: readable, the
same for the same metric in every run (so MLflow charts a metric over runs), valid under MLflow's
key rules on every platform, at most 250 characters, and never the folder of another name (MLflow's
file store keeps a metric as a file named by its path: hence the LEAF). A name that cannot be all
of these (a character MLflow does not allow, too long, equal to another record's) carries a short
hash of the record's identity instead of being cut or merged.

mlflow is an optional dependency (`pip install 'evalbeam[mlflow]'`, mlflow-skinny): imported only
here, only when used, with its telemetry off and nothing written outside the tracking store.
"""

from __future__ import annotations

import calendar
import contextlib
import functools
import hashlib
import json
import os
import posixpath
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from evalbeam.pipelines.launch.common import UsageError

INSTALL_HINT = "pip install 'evalbeam[mlflow]'"
DEFAULT_EXPERIMENT = "evalbeam"
ARTIFACTS = ("run.json", "metrics.jsonl", "report.html", "gates.json", "comparison.jsonl")
REACH_TIMEOUT = 5.0          # seconds an http(s) tracking server has to answer check_tracking_uri

# MLflow's limits (mlflow.utils.validation), the strictest of the versions and servers it may
# talk to: param values were limited to 500 characters before MLflow 2 (6000 now), tag values
# to 5000 (8000 now).
MAX_KEY, MAX_PARAM_VALUE, MAX_TAG_VALUE = 250, 500, 5000
METRICS_PER_BATCH, PARAMS_PER_BATCH = 1000, 100
HASH_CHARS = 10              # hex digits of a name's hash segment (40 bits; 40 on a collision)

# Parameters that say how a metric was computed rather than which one it is: the same for every
# record of a run (they are the run's options, logged as params), so they stay out of metric
# names, which then stay short and equal across runs. List-valued parameters (the grids a metric
# averages over: iou_thresholds, max_detections, ...) stay out for the same reason. Records that
# differ only in these still get distinct names (the collision rule adds a hash).
SETTINGS = frozenset({
    "hardmax", "max_examples", "protocol", "rouge_use_stemmer", "tokenize", "smooth_method",
    "lowercase", "max_docs", "relevance_level", "complete", "judge_model", "template_version",
    "embedding_model", "no_claims", "no_statements", "both_empty", "similarity_weight",
    "top_logprobs", "lm_model", "prompt_version", "model_uri", "rescaled", "idf",
})
# the last segment of every metric name: the number itself, its interval's ends, a comparison's
# p-values. No other segment of a name is one of these, so no name is the folder of another.
VALUE = "value"
INTERVAL_ENDS = (("low", "ci_low"), ("high", "ci_high"))
COMPARISON_STATS = ("p_value", "p_value_adjusted")
LEAVES = frozenset({VALUE, "ci_low", "ci_high", *COMPARISON_STATS})
LONGEST_SUFFIX = len("/p_value_adjusted")
RUN_PREFIX = "evalbeam"      # evalbeam/...: the run's own numbers (wall time, rows read, ...)
_MODEL_RESERVED = LEAVES | {RUN_PREFIX}
_NONE: frozenset = frozenset()

# MLflow's rule (mlflow.utils.validation.validate_param_and_metric_name) on Windows, the stricter
# one: word characters (as Python's re sees them), underscores, dashes, periods, spaces, slashes.
# "/" separates a name's segments, so it is not allowed inside one.
_SEGMENT_CHARS = re.compile(r"[^\w.\- ]")
_KEY = re.compile(r"^[\w.\- /]+$")

# Environment MLflow reads while evalbeam uses it (set only for that long, then restored):
# no usage telemetry (it would also write an installation id under ~/.config), no hint printed
# for coding agents, and local file stores allowed (MLflow >= 3.13 refuses them without it).
_MLFLOW_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_AGENT_HINT": "1",
    "MLFLOW_ALLOW_FILE_STORE": "true",
}
_env_lock = threading.Lock()
_env_depth = 0
_env_saved: dict = {}


# ----------------------------------------------------------------------------- mlflow, quietly

@contextlib.contextmanager
def mlflow_environment():
    """_MLFLOW_ENV in os.environ for the duration (nested and concurrent uses share one setting;
    the last to leave restores what was there before)."""
    global _env_depth, _env_saved
    with _env_lock:
        if _env_depth == 0:
            _env_saved = {name: os.environ.get(name) for name in _MLFLOW_ENV}
            os.environ.update(_MLFLOW_ENV)
        _env_depth += 1
    try:
        yield
    finally:
        with _env_lock:
            _env_depth -= 1
            if _env_depth == 0:
                for name, value in _env_saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


def _import_mlflow():
    """(MlflowClient, Metric, Param), imported inside mlflow_environment (the first
    `import mlflow` decides whether its telemetry runs); UsageError when mlflow is missing."""
    try:
        import mlflow  # noqa: F401
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError as error:
        raise UsageError(
            f"--mlflow_tracking_uri needs MLflow, which is not installed here ({error}). "
            f"Install it with {INSTALL_HINT} (mlflow-skinny, the tracking client without the "
            "server and UI), or leave out --mlflow_tracking_uri.") from None
    return MlflowClient, Metric, Param


# ----------------------------------------------------------------------------- the tracking URI

def _shown(uri: str) -> str:
    """The URI for a message: a password in it is replaced by ***."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def local_store_path(uri: str) -> str | None:
    """The folder of a local file store URI (a path, `file:PATH` or `file:///PATH`), else None."""
    parts = urllib.parse.urlsplit(uri)
    if len(parts.scheme) == 1 or not parts.scheme:       # a path (a Windows drive is a "scheme")
        return os.path.abspath(os.path.expanduser(uri))
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return os.path.abspath(urllib.request.url2pathname(parts.path))
    return None


def check_tracking_uri(uri: str) -> None:
    """Raise UsageError (one paragraph) when a run could not be logged to `uri`: MLflow is not
    installed; a local file store whose folder cannot be created or written; an http(s) server
    that does not answer within REACH_TIMEOUT seconds (or answers with a server error); a
    database store without the packages MLflow needs for it; a scheme MLflow has no store for.
    Writes nothing: a folder made to test it is removed again."""
    if not uri or not uri.strip():
        raise UsageError("--mlflow_tracking_uri is empty: give a tracking server (http://HOST:PORT) "
                         "or a local folder (file:///PATH/mlruns)")
    with mlflow_environment():
        _import_mlflow()
        path = local_store_path(uri)
        scheme = urllib.parse.urlsplit(uri).scheme.lower()
        if path is not None:
            _check_folder(path, uri)
        elif scheme in ("http", "https"):
            _check_reachable(uri)
        elif scheme in ("sqlite", "postgresql", "mysql", "mssql") or "+" in scheme:
            _check_database(uri, scheme)
        elif scheme == "file":
            raise UsageError(f"--mlflow_tracking_uri {_shown(uri)} names a file on another host; "
                             "a local file store is file:///PATH (or just PATH)")
        else:
            _check_scheme(uri)


def _check_folder(path: str, uri: str) -> None:
    created = []
    try:
        probe = path
        while not os.path.exists(probe):
            created.append(probe)
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".evalbeam-check-"):
            pass
    except OSError as error:
        raise UsageError(
            f"--mlflow_tracking_uri {_shown(uri)}: the MLflow file store folder {path} cannot be "
            f"created or written ({error.strerror or error}). Give a folder this user can write, "
            "or a tracking server (http://HOST:PORT).") from None
    finally:
        for folder in created:                    # deepest first: only what this check made
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def _check_reachable(uri: str) -> None:
    parts = urllib.parse.urlsplit(uri)
    netloc = parts.hostname or ""
    if ":" in netloc:                                  # an IPv6 address
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    address = urllib.parse.urlunsplit(parts._replace(netloc=netloc))   # no user:password@
    request = urllib.request.Request(address, method="GET", headers={"User-Agent": "evalbeam"})
    try:
        with urllib.request.urlopen(request, timeout=REACH_TIMEOUT) as response:
            response.read(1)
    except urllib.error.HTTPError as error:
        if error.code >= 500:
            raise UsageError(
                f"--mlflow_tracking_uri {_shown(uri)}: the tracking server answered with HTTP "
                f"{error.code} ({error.reason}). Check that the MLflow server behind it is "
                "running, or leave out --mlflow_tracking_uri.") from None
        # any other answer (401, 403, 404 at the root of an API-only server) is a server that
        # is there; whether it takes this user's credentials MLflow says at log time
    except (urllib.error.URLError, socket.timeout, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise UsageError(
            f"--mlflow_tracking_uri {_shown(uri)}: no tracking server answered within "
            f"{REACH_TIMEOUT:.0f} s ({reason}). Start it (mlflow server --host HOST --port PORT), "
            "check the address, or log to a local folder (file:///PATH/mlruns).") from None
    _check_speaks_mlflow(uri, address)


def _check_speaks_mlflow(uri: str, address: str) -> None:
    """Ask the REST API what log_run asks first (an experiment by name): an MLflow server
    answers 200, or an error whose JSON body has an "error_code" (404 for no such experiment,
    401/403 without credentials); any other answer (a web page, another service's 404) is not a
    tracking server, which only failed after the run's work was done, with exit 3. At most
    64 KiB of the answer is read."""
    query = urllib.parse.urlencode({"experiment_name": DEFAULT_EXPERIMENT})
    url = address.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?" + query
    request = urllib.request.Request(url, method="GET", headers={"User-Agent": "evalbeam"})
    try:
        with urllib.request.urlopen(request, timeout=REACH_TIMEOUT) as response:
            body, code = response.read(1 << 16), response.status
    except urllib.error.HTTPError as error:
        body, code = error.read(1 << 16), error.code
    except (urllib.error.URLError, socket.timeout, TimeoutError, OSError):
        return      # reached a moment ago: what fails now, MLflow says at log time
    if code in (401, 403):
        return
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and ("experiment" in answer or "error_code" in answer):
        return
    raise UsageError(
        f"--mlflow_tracking_uri {_shown(uri)}: the server there is not an MLflow tracking "
        f"server (its REST API answered HTTP {code} without MLflow's JSON). Check the address "
        "and port (mlflow server's default port is 5000), or log to a local folder "
        "(file:///PATH/mlruns).")


def _check_database(uri: str, scheme: str) -> None:
    try:
        import sqlalchemy  # noqa: F401
    except ImportError:
        raise UsageError(
            f"--mlflow_tracking_uri {_shown(uri)}: a database store needs the full MLflow "
            "(pip install mlflow: SQLAlchemy and the migrations), not mlflow-skinny; or log to "
            "a local folder (file:///PATH/mlruns) or a tracking server.") from None
    if scheme == "sqlite":
        # sqlite:///relative.db, sqlite:////absolute.db (SQLAlchemy's URLs)
        database = urllib.parse.urlsplit(uri).path[1:]
        if database and database != ":memory:":
            _check_folder(os.path.dirname(os.path.abspath(database)), uri)


def _check_scheme(uri: str) -> None:
    """A scheme evalbeam does not check itself (databricks, plugins): MLflow must have a store
    for it."""
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry
    except ImportError:           # a private module of MLflow: without it, MLflow says at log time
        return
    try:
        _tracking_store_registry.get_store_builder(uri)
    except Exception as error:
        raise UsageError(f"--mlflow_tracking_uri {_shown(uri)}: MLflow has no tracking store for "
                         f"it ({error}). Use a tracking server (http://HOST:PORT) or a local "
                         "folder (file:///PATH/mlruns).") from None


# ----------------------------------------------------------------------------- the run folder

def _is_remote(folder: str) -> bool:
    return "://" in folder


def _join(folder: str, name: str) -> str:
    if _is_remote(folder):
        return folder.rstrip("/") + "/" + name
    return os.path.join(folder, name)


def _exists(path: str) -> bool:
    if _is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(path)
    return os.path.isfile(path)


def _read_bytes(path: str) -> bytes:
    """A run's file, through transforms.input_files (a regular file, size bounded)."""
    from evalbeam.transforms.input_files import MAX_OUTPUT_BYTES, read_bytes

    return read_bytes(path, MAX_OUTPUT_BYTES)


def _records(path: str):
    """The records of metrics.jsonl, one at a time (transforms.input_files: bounded, strict)."""
    from evalbeam.transforms.input_files import iter_json_lines

    for _, record in iter_json_lines(path):
        yield record


# ----------------------------------------------------------------------------- names

def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value) -> str:
    """A parameter or slice value as name text: strings as they are, numbers as JSON writes
    them, true/false/null, a {key, value} label as KEY.VALUE, another dict as K.V pairs."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if set(value) == {"key", "value"}:
            return f"{_text(value['key'])}.{_text(value['value'])}"
        return ".".join(f"{k}.{_text(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
    return json.dumps(value)


@functools.lru_cache(maxsize=65536)
def _clean(text: str, reserved: frozenset) -> tuple[str, bool]:
    """(text as one segment of a name, whether that is exactly text): characters MLflow does
    not allow become _; "", ".", ".." (which a path reads otherwise) and reserved words (in
    any case: a leaf, a model named like the run's own prefix) get a trailing _."""
    clean = _SEGMENT_CHARS.sub("_", text)
    if clean in ("", ".", "..") or clean.casefold() in reserved:
        clean += "_"
    return clean, clean == text


class _Name:
    """Segments of a name and whether they say exactly what they stand for (every character
    allowed, no segment that a path would read as another, no "-" in a parameter's name)."""

    def __init__(self):
        self.segments: list[str] = []
        self.exact = True

    def token(self, text, reserved=LEAVES) -> str:
        clean, exact = _clean(str(text), reserved)
        self.exact = self.exact and exact
        return clean

    def add(self, text, reserved=LEAVES) -> None:
        self.segments.append(self.token(text, reserved))

    def pair(self, name, value) -> None:
        name = str(name)
        if "-" in name:
            self.exact = False
        # a NAME-VALUE segment has a "-", so it never reads as a leaf: nothing reserved
        self.segments.append(f"{self.token(name, _NONE)}-{self.token(_text(value), _NONE)}")

    def parameters(self, parameters: dict) -> None:
        for name in sorted(parameters, key=str):
            value = parameters[name]
            if name in SETTINGS or isinstance(value, list):
                continue
            self.pair(name, value)

    def text(self) -> str:
        return "/".join(self.segments)


def _name_parts(record: dict) -> tuple[str, str, bool]:
    """(MODEL/TYPE, [/PARAM-VALUE...][/slice.KEY-VALUE...], exact) of a record: its numbers'
    names are HEAD[/FIELD]TAIL. A Comparison is named after the metric it compares:
    MODEL/Comparison/METRIC[/FIELD]/PARAM-VALUE.../baseline-B."""
    head, tail = _Name(), _Name()
    head.add(record.get("model", ""), _MODEL_RESERVED)
    head.add(record.get("type", ""))
    parameters = record.get("parameters") or {}
    compared = parameters.get("metric_parameters")
    if record.get("type") == "Comparison" and isinstance(compared, dict) and "metric" in parameters:
        head.add(parameters["metric"])
        if "field" in compared:
            head.add(compared["field"])
        tail.parameters({k: v for k, v in compared.items() if k != "field"})
        tail.parameters({k: v for k, v in parameters.items()
                         if k not in ("metric", "metric_parameters")})
    else:
        tail.parameters(parameters)
    for key in sorted(record.get("slice") or {}, key=str):
        tail.pair(f"slice.{key}", record["slice"][key])
    rest = tail.text()
    return head.text(), "/" + rest if rest else "", head.exact and tail.exact


def _identity(record: dict) -> str:
    return json.dumps([record.get("model"), record.get("type"), record.get("parameters"),
                       record.get("slice")], sort_keys=True, separators=(",", ":"), default=str)


def _hashed(base: str, identity: str, chars: int) -> str:
    digest = hashlib.sha1(identity.encode("utf-8")).hexdigest()[:chars]
    tail = f"/hash-{digest}"
    room = MAX_KEY - LONGEST_SUFFIX - len(tail)
    if len(base) > room:
        base = base[:room].rstrip("/.")
        if base.rsplit("/", 1)[-1] in LEAVES:        # a cut segment may read as a leaf
            base += "_"
    return base + tail


def _scalars(record: dict):
    """(field, [(leaf, number), ...]) of every scalar of a record: the value, its interval's
    ends, a comparison's p-values. Fields of dict values one by one; anything
    else (curves, matrices, lists, null) is not a scalar."""
    value, interval = record.get("value"), record.get("interval")
    if _is_number(value):
        numbers = [(VALUE, value)]
        if isinstance(interval, dict):
            numbers += [(suffix, interval[end]) for end, suffix in INTERVAL_ENDS
                        if _is_number(interval.get(end))]
        comparison = record.get("comparison")
        if record.get("type") == "Comparison" and isinstance(comparison, dict):
            numbers += [(stat, comparison[stat]) for stat in COMPARISON_STATS
                        if _is_number(comparison.get(stat))]
        yield None, numbers
    elif isinstance(value, dict):
        for field, number in value.items():
            if not _is_number(number):
                continue
            numbers = [(VALUE, number)]
            ends = interval.get(field) if isinstance(interval, dict) else None
            if isinstance(ends, dict):
                numbers += [(suffix, ends[end]) for end, suffix in INTERVAL_ENDS
                            if _is_number(ends.get(end))]
            yield str(field), numbers


def _run_scalars(info: dict) -> dict[str, float]:
    """evalbeam/...: wall time, rows read and rejected, records written, per source its counts."""
    out = {}
    for key, value in info.items():
        if _is_number(value) and (key in ("wall_time_seconds", "rows_read", "rows_rejected")
                                  or key.endswith("_written")):
            out[f"{RUN_PREFIX}/{_SEGMENT_CHARS.sub('_', key)}"] = value
    for source, counts in sorted((info.get("counts") or {}).items()):
        if isinstance(counts, dict):
            for key, value in counts.items():
                if _is_number(value):
                    name = _Name()
                    name.add(source)
                    name.add(key)
                    out[f"{RUN_PREFIX}/counts/{name.text()}"] = value
    return out


def metric_names(records, info: dict | None = None) -> dict[str, float]:
    """{MLflow metric name: value} of every scalar of `records` (metrics.jsonl's), plus the
    run-level numbers of `info` (run.json) under evalbeam/. Names: see the module docstring and
    pipelines/quality/history.md. Deterministic; no two numbers share a name, not even one differing
    only in case (a file store on macOS or Windows, MySQL's collation would merge them)."""
    reserved = _run_scalars(info or {})
    taken = {name.casefold() for name in reserved}
    entries = []               # [identity, natural base, exact, [(leaf, number)]]
    seen: dict[str, int] = {}
    for record in records:
        parts = None
        for field, numbers in _scalars(record):
            if parts is None:
                parts = _identity(record), *_name_parts(record)
            record_identity, head, tail, exact = parts
            identity = record_identity if field is None else f"{record_identity}/{json.dumps(field)}"
            if identity in seen:        # a repeated record: a name of its own all the same
                seen[identity] += 1
                identity += f"#{seen[identity]}"
            else:
                seen[identity] = 1
            if field is None:
                base = head + tail
            else:
                segment, field_exact = _clean(field, LEAVES)
                base, exact = f"{head}/{segment}{tail}", exact and field_exact
            entries.append([identity, base, exact and len(base) <= MAX_KEY - LONGEST_SUFFIX, numbers])
    hash_chars = [0 if exact else HASH_CHARS for _, _, exact, _ in entries]
    for _ in range(3):
        owner: dict[str, int] = {}
        clash: set[int] = set()
        for i, (identity, base, _, numbers) in enumerate(entries):
            name = base if not hash_chars[i] else _hashed(base, identity, hash_chars[i])
            for leaf, _ in numbers:
                full = f"{name}/{leaf}".casefold()
                other = owner.setdefault(full, i)
                if other != i:
                    clash.update((i, other))
                elif full in taken:
                    clash.add(i)
        if not clash:
            break
        for i in clash:
            hash_chars[i] = HASH_CHARS if hash_chars[i] == 0 else 40
    else:
        raise ValueError("metric names collide even with full hashes")   # cannot happen
    out = dict(reserved)
    for i, (identity, base, _, numbers) in enumerate(entries):
        name = base if not hash_chars[i] else _hashed(base, identity, hash_chars[i])
        for leaf, number in numbers:
            out[f"{name}/{leaf}"] = float(number)
    return out


# ----------------------------------------------------------------------------- params and tags

def _short(text: str, limit: int) -> str:
    """text cut to `limit` characters with its length and a hash, when longer."""
    if len(text) <= limit:
        return text
    tail = f" ... [{len(text)} chars, sha1 {hashlib.sha1(text.encode('utf-8')).hexdigest()[:10]}]"
    return text[: limit - len(tail)] + tail


def _value_text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, out)
    else:
        out[prefix] = value


def _key(text: str, taken: set) -> str:
    """A valid, unused param key for text (invalid characters become _, a long or changed one
    gets a hash)."""
    key = _SEGMENT_CHARS.sub("_", text)
    if key in ("", ".", "..") or key != text or len(key) > MAX_KEY or key in taken:
        digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:HASH_CHARS]
        key = f"{key[: MAX_KEY - HASH_CHARS - 1].rstrip('.')}_{digest}"
    taken.add(key)
    return key


def run_params(info: dict) -> dict[str, str]:
    """The params of a run: task, models, slices, evalbeam_version, runner, and every option
    (nested ones as a.b), values as short strings (JSON for non-strings; at most 500 chars)."""
    versions = info.get("versions") or {}
    fixed = {
        "task": info.get("task"),
        "models": ",".join(str(m) for m in info.get("models") or []),
        "slices": ";".join(",".join(str(k) for k in keys) for keys in info.get("slices") or []),
        "evalbeam_version": versions.get("evalbeam"),
        "runner": info.get("runner"),
    }
    options: dict = {}
    _flatten("", info.get("options") or {}, options)
    out: dict[str, str] = {}
    taken: set = set()
    for name, value in fixed.items():
        if value is not None:
            out[_key(name, taken)] = _short(_value_text(value), MAX_PARAM_VALUE)
    for name, value in options.items():
        key = name if name not in fixed else f"options.{name}"
        out[_key(key, taken)] = _short(_value_text(value), MAX_PARAM_VALUE)
    return out


def run_tags(info: dict, folder: str, tags: dict | None) -> dict[str, str]:
    """evalbeam.task, .status, .models, .folder, .started_at, .gates, .error, the source shown
    by the MLflow UI, then the caller's tags (which win)."""
    out = {
        "evalbeam.task": info.get("task"),
        "evalbeam.status": info.get("status"),
        "evalbeam.models": ",".join(str(m) for m in info.get("models") or []),
        "evalbeam.folder": folder if _is_remote(folder) else os.path.abspath(folder),
        "evalbeam.started_at": info.get("started_at"),
        "mlflow.source.name": f"evalbeam {info.get('task')}",
    }
    gates = info.get("gates")
    if isinstance(gates, dict) and "passed" in gates:
        out["evalbeam.gates"] = "passed" if gates["passed"] else "failed"
    if info.get("error"):
        out["evalbeam.error"] = info["error"]
    for key, value in (tags or {}).items():
        key = str(key)
        if not _KEY.match(key) or len(key) > MAX_KEY or _posix_unsafe(key):
            raise ValueError(f"MLflow tag name {key!r} is not valid: letters, digits, _ - . space "
                             f"and /, at most {MAX_KEY} characters, not a path such as a/../b")
        out[key] = value
    return {k: _short(str(v), MAX_TAG_VALUE) for k, v in out.items() if v is not None}


def _posix_unsafe(key: str) -> bool:
    norm = posixpath.normpath(key)
    return norm != key or norm == "." or norm.startswith("..") or norm.startswith("/")


# ----------------------------------------------------------------------------- logging

def _millis(info: dict) -> tuple[int, int]:
    """(start, end) of the evaluation in ms since the epoch: run.json's started_at and wall
    time (now when missing)."""
    now = int(time.time() * 1000)
    try:
        start = calendar.timegm(time.strptime(info["started_at"], "%Y-%m-%dT%H:%M:%SZ")) * 1000
    except (KeyError, TypeError, ValueError):
        return now, now
    wall = info.get("wall_time_seconds")
    return start, (start + int(round(wall * 1000)) if _is_number(wall) else now)


def _experiment_id(client, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name)
        except Exception:             # made meanwhile by another process
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        raise ValueError(f"the MLflow experiment {name!r} is deleted: restore it "
                         f"(mlflow experiments restore) or log to another experiment")
    return experiment.experiment_id


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


def log_run(folder: str, tracking_uri: str, *, run_name: str | None = None,
            tags: dict | None = None, experiment: str = DEFAULT_EXPERIMENT) -> str:
    """Log the finished evalbeam run in `folder` (a local path or a FileSystems URI) as ONE
    MLflow run of `experiment` at `tracking_uri`; returns the MLflow run id.

    run_name defaults to the folder's name; tags are added to evalbeam's (and win). The MLflow
    run starts and ends when the evaluation did (run.json), ends FINISHED if run.json's status is
    "complete" and FAILED otherwise (a run that fails while logging is ended FAILED too).
    Raises FileNotFoundError without run.json, ValueError for a run still running, UsageError
    without MLflow; MLflow's own errors as they are."""
    run_json = _join(folder, "run.json")
    if not _exists(run_json):
        raise FileNotFoundError(f"{folder} has no run.json: not an evalbeam run folder")
    from evalbeam.transforms.io import read_json

    info = read_json(run_json)
    if not isinstance(info, dict):
        raise ValueError(f"{run_json} is not a run.json evalbeam wrote (not a JSON object)")
    status = info.get("status")
    if status in (None, "running"):
        raise ValueError(f"the run in {folder} has not finished (run.json status {status!r}); "
                         "log it when it has")
    metrics_path = _join(folder, "metrics.jsonl")
    metrics = metric_names(_records(metrics_path) if _exists(metrics_path) else (), info)
    params = run_params(info)
    all_tags = run_tags(info, folder, tags)
    start, end = _millis(info)
    name = run_name or folder.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1] or info.get("task")

    with mlflow_environment():
        MlflowClient, Metric, Param = _import_mlflow()
        client = MlflowClient(tracking_uri)
        experiment_id = _experiment_id(client, experiment)
        run = client.create_run(experiment_id, start_time=start, tags=all_tags, run_name=name)
        run_id = run.info.run_id
        try:
            # artifacts first: MlflowClient.log_artifact reads the run back, metrics and all, so
            # each artifact logged after the metrics costs their whole number again
            _log_artifacts(client, run_id, folder)
            for batch in _chunks([Param(k, v) for k, v in params.items()], PARAMS_PER_BATCH):
                client.log_batch(run_id, params=batch)
            for batch in _chunks([Metric(k, v, end, 0) for k, v in metrics.items()], METRICS_PER_BATCH):
                client.log_batch(run_id, metrics=batch)
        except BaseException:
            with contextlib.suppress(Exception):
                client.set_terminated(run_id, "FAILED")
            raise
        client.set_terminated(run_id, "FINISHED" if status == "complete" else "FAILED", end_time=end)
    return run_id


def _log_artifacts(client, run_id: str, folder: str) -> None:
    """ARTIFACTS that the folder has, at the root of the run's artifacts, in one call (a
    remote folder's files copied to a temporary folder first)."""
    present = [name for name in ARTIFACTS if _exists(_join(folder, name))]
    if not present:
        return
    with tempfile.TemporaryDirectory(prefix="evalbeam-mlflow-") as local:
        for name in present:
            path = os.path.join(local, name)
            if _is_remote(folder):
                with open(path, "wb") as out:
                    out.write(_read_bytes(_join(folder, name)))
            else:
                try:
                    os.link(os.path.join(folder, name), path)     # no copy on one file system
                except OSError:
                    shutil.copyfile(os.path.join(folder, name), path)
        client.log_artifacts(run_id, local)
