"""Minimal reproduction, for Beam's issue tracker: on the DaskRunner, only the branch of the
pipeline visited last is computed; every other sink silently never runs.

    pip install 'apache-beam[dask]'      # seen with apache-beam 2.77.0, dask/distributed 2026.8.0
    python deploy/dask/repro_unrun_sinks.py

Expected (DirectRunner, Flink, Dataflow): "first sink got 1" and "second sink got 2", in
either order. Seen on the DaskRunner: only "second sink got 2".

Why, in apache_beam/runners/dask/dask_runner.py: `run_pipeline` computes
`list(dask_visitor.bags.values())[-1]`, the bag of the last transform visited, on the
assumption that it depends on all the others; a pipeline with two outputs is not a chain.
"""

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def main(runner="apache_beam.runners.dask.dask_runner.DaskRunner"):
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    options = PipelineOptions(["--runner", runner,
                               "--dask_client_address", cluster.scheduler_address])
    try:
        with beam.Pipeline(options=options) as p:
            _ = p | "One" >> beam.Create([1]) | "First" >> beam.Map(lambda x: print("first sink got", x))
            _ = p | "Two" >> beam.Create([2]) | "Second" >> beam.Map(lambda x: print("second sink got", x))
    finally:
        cluster.close()


if __name__ == "__main__":
    main(*sys.argv[1:2])  # evalbeam.pipelines.runners.dask.DaskRunner prints the expected lines
