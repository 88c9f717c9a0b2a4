"""Minimal reproduction, for Beam's issue tracker: on the DaskRunner, what a DoFn emits from
finish_bundle is dropped.

    pip install 'apache-beam[dask]'      # seen with apache-beam 2.77.0, dask/distributed 2026.8.0
    python deploy/dask/repro_finish_bundle.py

Expected (DirectRunner, Flink, Dataflow): "total 10" (one or more partial counts, summed).
Seen on the DaskRunner: "total 0" (the sum of no partial counts).

Why, in apache_beam/runners/dask/transform_evaluator.py: `apply_dofn_to_bundle` collects the
bundle's outputs before it calls `invoke_finish_bundle`, so what finish_bundle emits goes to
a list nobody reads. Batching DoFns (count per bundle, flush a buffer) emit there.
"""

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue


class CountPerBundle(beam.DoFn):
    def start_bundle(self):
        self.n = 0

    def process(self, x):
        self.n += 1

    def finish_bundle(self):
        yield WindowedValue(self.n, 0, [GlobalWindow()])


def main(runner="apache_beam.runners.dask.dask_runner.DaskRunner"):
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    options = PipelineOptions(["--runner", runner,
                               "--dask_client_address", cluster.scheduler_address])
    try:
        with beam.Pipeline(options=options) as p:
            _ = (p | beam.Create(list(range(10))) | beam.ParDo(CountPerBundle())
                 | beam.CombineGlobally(sum) | beam.Map(lambda total: print("total", total)))
    finally:
        cluster.close()


if __name__ == "__main__":
    main(*sys.argv[1:2])  # evalbeam.pipelines.runners.dask.DaskRunner prints the expected lines
