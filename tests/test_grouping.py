"""transforms/grouping.py: a piece crosses GroupByShard as its pickle or, past the spill size
and with a spill folder, as the path of a file written whole; either way it comes back equal,
and the meter counts the pickle's bytes."""

from __future__ import annotations

import pickle

import apache_beam as beam
import numpy as np
from apache_beam.testing.util import assert_that, equal_to

from evalbeam.pipelines.launch.common import local_pipeline
from evalbeam.transforms.grouping import INLINE, SPILLED, group_by_shard, pack, unpack


def piece(size: int, seed: int):
    return ("model", np.random.default_rng(seed).random(size), {"note": "é" * seed})


def same(a, b) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_small_pieces_stay_inline_large_ones_go_to_a_file(tmp_path):
    small, large = piece(10, 1), piece(20_000, 2)
    shard, value = pack((3, small), str(tmp_path), spill_bytes=1000)
    assert shard == 3 and value[:1] == INLINE and not list(tmp_path.iterdir())
    _, spilled = pack((3, large), str(tmp_path), spill_bytes=1000)
    files = list(tmp_path.iterdir())
    assert spilled[:1] == SPILLED and len(files) == 1 and files[0].name.startswith("00003-")
    assert files[0].read_bytes() == pickle.dumps(large, protocol=5)   # whole, no .partial left
    _, no_folder = pack((3, large), None, spill_bytes=0)
    assert no_folder[:1] == INLINE
    got_shard, pieces = unpack((3, [value, spilled, no_folder]))
    assert got_shard == 3 and [same(a, b) for a, b in zip(pieces, [small, large, large])] == [True] * 3


def test_grouped_pieces_and_meter_whatever_crosses(tmp_path, monkeypatch):
    """In a pipeline: every piece of a shard arrives, spilled or not, and the meter's bytes are
    the pickles' lengths, the same with and without spilling."""
    elements = [(shard, ("m", shard, "x" * (shard * 50_000))) for shard in range(4) for _ in range(2)]
    pickled = sum(len(pickle.dumps(p, protocol=5)) for _, p in elements)
    for spill in ("0", "100000000"):
        monkeypatch.setenv("EVALBEAM_SPILL_BYTES", spill)
        with local_pipeline() as p:
            grouped, stats = group_by_shard(p | beam.Create(elements), str(tmp_path / spill))
            counted = stats | beam.CombinePerKey(sum)
            assert_that(grouped | beam.Map(lambda kv: (kv[0], sorted(kv[1]))),
                        equal_to([(s, [("m", s, "x" * (s * 50_000))] * 2) for s in range(4)]),
                        label="pieces")
            spilled_pairs = [(("shuffle_spilled_bytes", "GroupByShard"), pickled)] if spill == "0" else []
            assert_that(counted, equal_to([(("shuffle_elements", "GroupByShard"), 8),
                                           (("shuffle_bytes", "GroupByShard"), pickled)] + spilled_pairs),
                        label="meter")
        spilled = list((tmp_path / spill).glob("*.pkl")) if (tmp_path / spill).exists() else []
        assert len(spilled) == (8 if spill == "0" else 0)


def test_only_runners_that_group_in_python_spill():
    from apache_beam.options.pipeline_options import PipelineOptions

    from evalbeam.transforms.grouping import groups_in_python

    spill = {"": True, "DirectRunner": True, "evalbeam.pipelines.runners.dask.DaskRunner": True,
             "DataflowRunner": False, "FlinkRunner": False, "SparkRunner": False, "PrismRunner": False}
    for runner, expected in spill.items():
        assert groups_in_python(PipelineOptions(["--runner", runner] if runner else [])) is expected, runner
    portable = ["--runner", "PortableRunner", "--job_endpoint"]
    assert groups_in_python(PipelineOptions(portable + ["embed"]))
    assert not groups_in_python(PipelineOptions(portable + ["localhost:8099"]))


class Tally:
    """A toy state: copy(), merge(other) -> self, compact()."""

    def __init__(self, values):
        self.values = list(values)

    def copy(self):
        return Tally(self.values)

    def merge(self, other):
        self.values += other.values
        return self

    def compact(self):
        return sorted(self.values)


def test_combine_states_adds_every_partial_once_spilled_or_not(tmp_path, monkeypatch):
    """merge.combine_states: each key's partial states summed (a None partial is empty), the
    result compacted, the inputs untouched (a DoFn may not change them), spilled or inline."""
    from evalbeam.transforms.merge import combine_states

    partials = [((f"m{i % 3}", "{}"), Tally([i, i * 10])) for i in range(30)] + [(("m0", "{}"), None)]
    expected = [((f"m{k}", "{}"), sorted(v for i in range(30) if i % 3 == k for v in (i, i * 10)))
                for k in range(3)]
    for spill in ("0", "100000000"):
        monkeypatch.setenv("EVALBEAM_SPILL_BYTES", spill)
        with local_pipeline() as p:
            assert_that(combine_states(p | beam.Create(partials, reshuffle=False), str(tmp_path / spill)),
                        equal_to(expected))
        assert [t.values for _, t in partials[:2]] == [[0, 0], [1, 10]]
        assert bool(list((tmp_path / spill).glob("state-*.pkl"))) == (spill == "0")


def test_the_direct_runner_spills_to_a_local_folder_only():
    from apache_beam.options.pipeline_options import PipelineOptions

    from evalbeam.transforms.grouping import spill_folder

    direct, dask = PipelineOptions([]), PipelineOptions(["--runner", "DaskRunner"])
    assert spill_folder("/tmp/out/.evalbeam-tmp-x/pieces", direct) == "/tmp/out/.evalbeam-tmp-x/pieces"
    assert spill_folder("gs://bucket/out/.evalbeam-tmp-x/pieces", direct) is None
    assert spill_folder("gs://bucket/out/.evalbeam-tmp-x/pieces", dask) == "gs://bucket/out/.evalbeam-tmp-x/pieces"
    assert spill_folder(None, direct) is None
    assert spill_folder("/tmp/x", PipelineOptions(["--runner", "DataflowRunner"])) is None
