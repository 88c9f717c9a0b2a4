"""evalbeam on Dask: a dask.distributed cluster on 127.0.0.1 (a scheduler and two worker
processes, started and stopped by these tests as `dask scheduler` and `dask worker` would run
them), driven by `--runner DaskRunner` (pipelines/dask_runner.py). Every task and a sweep must
write byte for byte what the DirectRunner writes, and a worker killed in the middle of a run
must cost nothing but time. Run alone with `python -m pytest -m dask`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from helpers import ROOT

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
    options = PipelineOptions(["--runner", "evalbeam.pipelines.dask_runner.DaskRunner", *runner[2:]])
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
