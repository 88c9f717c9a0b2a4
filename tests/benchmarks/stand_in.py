"""The stand-in judge server for the judge benchmarks: started in its own process on a free
loopback port, stopped when the block ends. Standard library only, so the benchmarks' child
processes in other environments (RAGAS's) can import this module too."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_stats(base: str) -> dict:
    """GET /stats of the server at base (http://127.0.0.1:PORT)."""
    with urllib.request.urlopen(base + "/stats") as r:
        return json.loads(r.read())


@contextlib.contextmanager
def stand_in_server(latency_ms: int, rpm: int | None = None):
    """`evalbeam judge-server` with the given latency (and rate limit); yields its base URL once
    it answers /stats (within 10 s), terminates it on the way out."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "evalbeam.pipelines.cli", "judge-server", "--port", str(port),
               "--latency_ms", str(latency_ms)] + (["--rpm", str(rpm)] if rpm else [])
    server = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                server_stats(base)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"the stand-in judge server did not answer on {base} within 10 s")
        yield base
    finally:
        server.terminate()
        server.wait()
