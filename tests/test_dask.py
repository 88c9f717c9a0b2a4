"""evalbeam on Dask: a dask.distributed cluster on 127.0.0.1 (a scheduler and two worker
processes, started and stopped by these tests as `dask scheduler` and `dask worker` would run
them), driven by `--runner DaskRunner` (pipelines/runners/dask.py). Every task and a sweep must
write byte for byte what the DirectRunner writes, and a worker killed in the middle of a run
must cost nothing but time. Run alone with `python -m pytest -m dask`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from helpers import ROOT, run_cli_here, run_cli_subprocess

pytest.importorskip("distributed", reason="the Dask tests need evalbeam[dask]")

from cluster_cases import (check_coco_pieces, check_golden_case,  # noqa: E402
                           check_segmentation_mask_files, check_sweep, free_port)

pytestmark = pytest.mark.dask
# a case per task and protocol (tests/test_portable.py runs every input form); classification
# is the case of the killed-worker test, segmentation that of the mask-files test
DASK_CASES = ["detection_bbox", "coco_segm", "text_judge", "retrieval", "trec_eval"]


def wait_for_workers(address: str, n: int, timeout: float = 90) -> None:
    from distributed import Client

    with Client(address, timeout=timeout) as client:
        client.wait_for_workers(n, timeout=timeout)


@pytest.fixture(scope="module")
def dask_cluster():
    """(runner options, scheduler address): a scheduler and two single-threaded worker
    processes under nannies (which restart a worker that dies), all on 127.0.0.1."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    # the workers can import tests/dask_plugins.py, as a cluster's image would carry plugins
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    log = open(os.devnull, "w")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--no-dashboard"], stdout=log, stderr=log, env=env)
    workers = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "2",
         "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard"],
        stdout=log, stderr=log, env=env)
    try:
        wait_for_workers(address, 2)
        yield ["--runner", "DaskRunner", "--dask_client_address", address], address
    finally:
        for process in (workers, scheduler):
            process.terminate()
        for process in (workers, scheduler):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()


@pytest.mark.parametrize("name", DASK_CASES)
def test_every_task_writes_the_direct_runner_s_bytes(tmp_path, dask_cluster, name):
    check_golden_case(tmp_path, dask_cluster[0], name)


def test_segmentation_mask_files(tmp_path, dask_cluster):
    """Masks the rows point to are read by the Dask workers, not by the launcher."""
    check_segmentation_mask_files(tmp_path, dask_cluster[0], forms=("png",))



def test_coco_results_read_in_pieces(tmp_path, dask_cluster):
    """The pieces of a cut COCO results file are parsed by the workers, in any order."""
    check_coco_pieces(tmp_path, dask_cluster[0])

def test_a_sweep_with_gates_and_report(tmp_path, dask_cluster):
    check_sweep(tmp_path, dask_cluster[0])


def test_a_worker_killed_mid_run_costs_only_time(tmp_path, dask_cluster):
    """A worker process dies while it runs one of the pipeline's DoFn bundles: dask reruns the
    lost tasks on the other worker (its nanny restarts the dead one) and the outputs are still
    the DirectRunner's bytes."""
    from dask_plugins import CrashOnce
    from distributed import Client

    runner, address = dask_cluster
    flag = tmp_path / "crashed"
    with Client(address) as client:
        client.register_plugin(CrashOnce(str(flag), "beam:"))
        try:
            check_golden_case(tmp_path / "run", runner, "classification_bootstrap")
        finally:
            client.unregister_worker_plugin(CrashOnce.name)
        assert flag.exists(), "no worker was killed: the test proved nothing"
        started = time.time()
        while len(client.scheduler_info()["workers"]) < 2 and time.time() - started < 60:
            time.sleep(0.5)  # the nanny brings the dead worker back for the next test


def _split(x):
    import apache_beam as beam

    yield beam.pvalue.TaggedOutput("odd", x) if x % 2 else x


def _count_per_bundle():
    """A DoFn that emits only from finish_bundle."""
    import apache_beam as beam
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.windowed_value import WindowedValue

    class CountPerBundle(beam.DoFn):
        def start_bundle(self):
            self.n = 0

        def process(self, x):
            self.n += 1

        def finish_bundle(self):
            yield WindowedValue(self.n, 0, [GlobalWindow()])

    return CountPerBundle()


def _noted(x, path):
    """x, after appending a line to path: how many times the step ran on x."""
    with open(path, "a") as out:
        out.write(f"{x}\n")
    return x


def _dump(values, path):
    import json

    with open(path, "w") as out:
        json.dump(sorted(values, key=repr), out)


def test_the_translation_keeps_what_beam_s_dask_runner_drops(tmp_path, dask_cluster):
    """The three losses of Beam's own DaskRunner (deploy/dask/repro_*.py), plus side inputs,
    an empty Create, Flatten and keys Python cannot hash, against what any runner must give;
    and each step runs once on each element, also when its output is both grouped and read as
    a side input (dask's graph optimizations would run it once per consumer)."""
    import json

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    runner, _ = dask_cluster
    options = PipelineOptions(["--runner", "evalbeam.pipelines.runners.dask.DaskRunner", *runner[2:]])
    with beam.Pipeline(options=options) as p:
        numbers = p | "Numbers" >> beam.Create(list(range(1000)))
        split = numbers | beam.ParDo(_split).with_outputs("odd", main="even")
        _ = split.odd | "Odd" >> beam.combiners.ToList() | "DumpOdd" >> beam.Map(_dump, tmp_path / "odd")
        _ = (split.even | beam.Map(lambda x: (["k", x % 3], x)) | beam.GroupByKey()
             | beam.MapTuple(lambda k, v: (k, sum(v))) | "Groups" >> beam.combiners.ToList()
             | "DumpGroups" >> beam.Map(_dump, tmp_path / "groups"))
        noted = numbers | "Noted" >> beam.Map(_noted, str(tmp_path / "noted"))
        _ = (noted | beam.Map(lambda x: (x % 2, x)) | "GroupNoted" >> beam.GroupByKey()
             | beam.Map(lambda kv, side: (kv[0], len(list(kv[1])), len(side)), beam.pvalue.AsList(noted))
             | "NotedGroups" >> beam.combiners.ToList()
             | "DumpNoted" >> beam.Map(_dump, tmp_path / "noted-groups"))
        _ = (numbers | beam.ParDo(_count_per_bundle()) | beam.CombineGlobally(sum)
             | "DumpCount" >> beam.Map(lambda total: _dump([total], tmp_path / "count")))
        side = p | "Side" >> beam.Create(["a", "b"])
        empty = p | "Empty" >> beam.Create([])
        _ = ((side, empty) | beam.Flatten()
             | beam.Map(lambda x, s, e: (x, sorted(s), list(e)), beam.pvalue.AsList(side),
                        beam.pvalue.AsList(empty))
             | "Sided" >> beam.combiners.ToList() | "DumpSided" >> beam.Map(_dump, tmp_path / "sided"))

    def read(name):
        return json.loads((tmp_path / name).read_text())

    assert read("odd") == sorted(range(1, 1000, 2), key=repr)
    assert sorted(map(tuple, [(tuple(k), v) for k, v in read("groups")])) == [
        (("k", r), sum(x for x in range(0, 1000, 2) if x % 3 == r)) for r in range(3)]
    assert read("count") == [1000]
    assert read("noted-groups") == [[0, 500, 1000], [1, 500, 1000]]
    assert sorted(map(int, (tmp_path / "noted").read_text().split())) == list(range(1000))
    assert read("sided") == [["a", ["a", "b"], []], ["b", ["a", "b"], []]]


# ---- the scheduler check (pipelines/dask_runner.check_scheduler): refusals before any output ----

GOLDEN_CLASSIFICATION = ROOT / "tests" / "golden" / "inputs" / "classification"


@contextlib.contextmanager
def stand_in(answer, backlog: int = 8):
    """The address of a TCP server on a free port of 127.0.0.1 that runs answer(connection,
    stop) for each connection, in a thread of its own; everything stops and closes on exit."""
    stop = threading.Event()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(backlog)
    server.settimeout(0.05)
    threads = []

    def serve_one(connection):
        with connection:
            answer(connection, stop)

    def accept():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except socket.timeout:
                continue
            thread = threading.Thread(target=serve_one, args=(connection,), daemon=True)
            thread.start()
            threads.append(thread)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(timeout=5)
        for thread in threads:
            thread.join(timeout=5)
        server.close()


def _answers_http_400(connection, stop):
    """What an HTTP server or proxy that rejects a malformed request at once sends: dask read
    "HTTP/1.1" as the length of a message, 3 EiB, and raised MemoryError."""
    connection.recv(4096)
    connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                       b"Connection: close\r\n\r\n")


def _sends_garbage(connection, stop):
    """A frame header of a plausible length, then bytes that are no Dask frames, then close."""
    connection.sendall(struct.pack("<Q", 16) + b"\xff" * 16)


def _stays_silent(connection, stop):
    """Accepts, never answers, until the test ends."""
    stop.wait()


@contextlib.contextmanager
def nothing_listens():
    yield f"tcp://127.0.0.1:{free_port()}"


class _QuietHandler:
    def log_message(self, *args):   # the test's stderr is the CLI's
        pass


@contextlib.contextmanager
def http_server():
    """Python's own HTTP server. It answers 400 once dask's binary handshake holds a byte 0x0a
    (it then reads a request line), and else waits for the line's end: either way no Dask
    scheduler answers."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    handler = type("Handler", (_QuietHandler, BaseHTTPRequestHandler), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def backlog_full():
    """A port whose listen queue is full and never emptied: the kernel drops further connection
    attempts, as a firewall drops the packets to an unreachable host, so no connection
    completes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held = []
    for _ in range(4):   # Linux queues backlog + 1 connections: fill the queue, whatever its size
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
        except OSError:
            break
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        for connection in held:
            connection.close()
        server.close()


# (server, what the refusal says, --dask_connection_timeout or None for the default 5 s)
BAD_SCHEDULERS = {
    "nothing_listens": (nothing_listens, "nothing listens on port", None),
    "http_400": (lambda: stand_in(_answers_http_400), "does not speak Dask's protocol", None),
    "http_server": (http_server, "not a Dask scheduler", 2),
    "garbage": (lambda: stand_in(_sends_garbage), "does not speak Dask's protocol", None),
    "silent": (lambda: stand_in(_stays_silent), "gave no Dask answer within 1 s", 1),
}


def _classification(out, address, *extra):
    return ["classification", "--groundtruths", GOLDEN_CLASSIFICATION / "groundtruths.jsonl",
            "--predictions", f"a={GOLDEN_CLASSIFICATION / 'model_a.jsonl'}", "--output", out,
            "--runner", "DaskRunner", "--dask_client_address", address, *extra]


def _one_paragraph(stderr: str, address: str, what: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"evalbeam: error: --dask_client_address {address}: "), stderr
    assert what in lines[0] and lines[0].endswith("Nothing was written."), stderr
    assert "MemoryError" not in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("case", list(BAD_SCHEDULERS))
def test_no_scheduler_at_the_address_is_refused_before_anything_is_written(tmp_path, capsys, case):
    """Where no Dask scheduler answers, the run stops with exit 2 and one paragraph, within the
    check's timeout, and writes nothing (it waited 30 s for a closed port and then failed
    with exit 3; an HTTP answer made dask allocate 3 EiB; a silent peer hung the run)."""
    server, what, timeout = BAD_SCHEDULERS[case]
    extra = ["--dask_connection_timeout", str(timeout)] if timeout else []
    out = tmp_path / "out"
    with server() as address:
        started = time.monotonic()
        done = run_cli_here(_classification(out, address, *extra), capsys)
        elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    _one_paragraph(done.stderr, address, what)
    assert not out.exists()
    # the check's own time is bounded in the test below; this one also reads the inputs
    assert elapsed < (timeout or 5) + 10, elapsed


def test_the_check_takes_its_timeout_at_most():
    """A closed port is refused at once; a port that never completes a connection (its queue
    full, as behind a firewall that drops packets) and a silent peer, after the timeout."""
    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.runners.dask import check_scheduler

    import distributed.comm  # noqa: F401  (imported before the clock starts, as in a run)

    cases = [(nothing_listens, "nothing listens on port", 0.0, 1.0),
             (backlog_full, "did not accept a connection on port", 1.0, 3.0),
             (lambda: stand_in(_stays_silent), "gave no Dask answer within 1 s", 1.0, 3.0)]
    for server, what, low, high in cases:
        with server() as address:
            started = time.monotonic()
            with pytest.raises(UsageError, match=what):
                check_scheduler(address, timeout=1)
            assert low <= time.monotonic() - started < high, (what, time.monotonic() - started)


def test_an_http_answer_is_refused_in_a_fresh_process(tmp_path):
    """As a user sees it: exit 2, one line on stderr (no MemoryError, no log lines)."""
    out = tmp_path / "out"
    with stand_in(_answers_http_400) as address:
        done = run_cli_subprocess(_classification(out, address), timeout=120)
    assert done.returncode == 2, done.stderr
    _one_paragraph(done.stderr, address, "does not speak Dask's protocol")
    assert not out.exists()


def test_a_sweep_is_refused_before_its_folder_is_made(tmp_path, capsys):
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f"""
[[dataset]]
name = "animals"
task = "classification"
groundtruths = "{GOLDEN_CLASSIFICATION / 'groundtruths.jsonl'}"
models = ["a"]

[[model]]
name = "a"
predictions = "{GOLDEN_CLASSIFICATION / 'model_a.jsonl'}"
""")
    out = tmp_path / "sweep"
    with nothing_listens() as address:
        done = run_cli_here(["sweep", manifest, "--output", out, "--runner", "DaskRunner",
                             "--dask_client_address", address], capsys)
    assert done.returncode == 2, done.stderr
    _one_paragraph(done.stderr, address, "nothing listens on port")
    assert not out.exists()


def test_the_check_passes_the_scheduler_and_refuses_a_worker(tmp_path, capsys, dask_cluster):
    """The cluster's scheduler passes (every run above goes through the check too); one of its
    workers, which speaks Dask's protocol too, is refused."""
    from distributed import Client

    from evalbeam.pipelines.runners.dask import check_scheduler

    _, address = dask_cluster
    check_scheduler(address)
    check_scheduler(address[len("tcp://"):])          # the scheme is optional, as for dask
    with Client(address) as client:
        worker = sorted(client.scheduler_info()["workers"])[0]
    out = tmp_path / "out"
    done = run_cli_here(_classification(out, worker), capsys)
    assert done.returncode == 2, done.stderr
    _one_paragraph(done.stderr, worker, "that is a Dask worker, not the scheduler")
    assert not out.exists()
