"""Minimal reproduction, for Beam's issue tracker: on the DaskRunner, every consumer of one
output of a multi-output ParDo receives the elements of all its outputs.

    pip install 'apache-beam[dask]'      # seen with apache-beam 2.77.0, dask/distributed 2026.8.0
    python deploy/dask/repro_tagged_outputs.py

Expected (DirectRunner, Flink, Dataflow): "odd got 1", "odd got 3".
Seen on the DaskRunner: "odd got 1", "odd got 2", "odd got 3", "odd got 4".

Why, in apache_beam/runners/dask: the visitor keeps one dask bag per *transform*
(`self.bags[prev_op]`), not per output PCollection, and `apply_dofn_to_bundle` returns
`[v.value for v in tagged_receivers.values]`, the windowed values of every tag with the tags
dropped, so the outputs cannot be told apart downstream.

evalbeam's readers and matchers route rejected rows and row counters through tagged outputs,
so no evalbeam job can run on the DaskRunner until this is fixed (deploy/README.md).
"""

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def split(x):
    if x % 2:
        yield beam.pvalue.TaggedOutput("odd", x)
    else:
        yield x


def main(runner="apache_beam.runners.dask.dask_runner.DaskRunner"):
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    options = PipelineOptions(["--runner", runner,
                               "--dask_client_address", cluster.scheduler_address])
    try:
        with beam.Pipeline(options=options) as p:
            outputs = p | beam.Create([1, 2, 3, 4]) | beam.ParDo(split).with_outputs("odd", main="even")
            _ = outputs.odd | "Odd" >> beam.Map(lambda x: print("odd got", x))
    finally:
        cluster.close()


if __name__ == "__main__":
    main(*sys.argv[1:2])  # evalbeam.pipelines.runners.dask.DaskRunner prints the expected lines
