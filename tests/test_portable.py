"""The portable path, as Flink (and Spark) run Python: Beam's job API with the SDK workers in a
worker pool beside the runner (`--environment_type EXTERNAL`). Here Beam's embedded job service
(`--job_endpoint embed`) plays the job server and a worker pool started by the test
(`python -m apache_beam.runners.worker.worker_pool_main`) the TaskManager's sidecar; every task
(and a sweep) must write byte for byte what the DirectRunner writes. What this catches: pickling
of every DoFn and side input, paths only the launcher can see, temp folders, the judge journal's
writers, publishing from a worker. Run alone with `python -m pytest -m portable`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from cluster_cases import (CASES_HERE, check_coco_pieces, check_golden_case,
                           check_segmentation_mask_files, check_sweep, free_port)

pytestmark = pytest.mark.portable


@pytest.fixture(scope="module")
def worker_pool():
    """A Beam SDK worker pool on 127.0.0.1, from this environment; stopped after the module."""
    port = free_port()
    log = open(os.devnull, "w")
    pool = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                             f"--service_port={port}"], stdout=log, stderr=log)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if pool.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the Beam worker pool did not start")
                time.sleep(0.2)
        yield ["--runner", "PortableRunner", "--job_endpoint", "embed",
               "--environment_type", "EXTERNAL", "--environment_config", f"localhost:{port}"]
    finally:
        pool.kill()
        pool.wait(timeout=30)
        log.close()


@pytest.mark.parametrize("name", CASES_HERE)
def test_every_task_writes_the_direct_runner_s_bytes(tmp_path, worker_pool, name):
    check_golden_case(tmp_path, worker_pool, name)


def test_segmentation_mask_files(tmp_path, worker_pool):
    """Masks the rows point to (PNG by a path relative to the rows' file, .npy by an absolute
    one) are read by the workers, not by the launcher."""
    check_segmentation_mask_files(tmp_path, worker_pool)



def test_coco_results_read_in_pieces(tmp_path, worker_pool):
    """The pieces of a cut COCO results file are parsed by the workers, in any order."""
    check_coco_pieces(tmp_path, worker_pool)

def test_a_sweep_with_gates_and_report(tmp_path, worker_pool):
    """A sweep of two tasks (a classification group and text cells) with a gate and the report:
    the same cells, leaderboard and verdicts as on the DirectRunner."""
    check_sweep(tmp_path, worker_pool)
