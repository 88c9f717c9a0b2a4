"""What crosses a run's shuffles, measured inside the pipeline on every runner: run.json's
"shuffles" (pipelines/launch/outputs.md) and the sizing formulas of deploy/README.md come from here.

Every task has the same two shuffles. GroupByShard gathers the pieces the readers cut from the
input files by shard (their size grows with the rows); MergeStates gathers the partial states
each shard's matching produced, keyed by (model, slice), and adds them (their size grows with
shards x models x slices, and with what a state holds per label, threshold or replicate).

The meters ride on the stats channel every task already has: ((counter, stage), n) pairs,
summed per key, except counters of `Largest` values, which keep their maximum. Bytes are the
length of the element's pickle (protocol 5): the pieces and states cross both shuffles as
their pickles, or as files holding them (transforms/grouping.py; GroupByShard's spilled_bytes
counts those), and each bundle adds its states per key before MergeStates (transforms/merge.py),
so fewer bytes cross it than its input holds: its figure is an upper bound. Element
counts are the same on every runner; bytes can differ by a few between runners (a pickle
stores a string repeated within one object once, and a state merged in one process shares more
strings than one whose parts came from several) and between numpy versions.
"""

from __future__ import annotations

import pickle

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

SHUFFLE_ELEMENTS = "shuffle_elements"
SHUFFLE_BYTES = "shuffle_bytes"
LARGEST_STATE_BYTES = "largest_state_bytes"
SPILLED_BYTES = "shuffle_spilled_bytes"   # of SHUFFLE_BYTES, those written to files instead (grouping.py)
# The fingerprint of the datums evaluated (run.json's "datums"), summed on the same channel:
# the count and the two fingerprint_sums of the ground truth's datums in the overall slice.
DATUMS = "datums"
DATUM_SUM_A = "datum_fingerprint_a"
DATUM_SUM_B = "datum_fingerprint_b"
SHUFFLE_COUNTERS = (SHUFFLE_ELEMENTS, SHUFFLE_BYTES, SPILLED_BYTES, LARGEST_STATE_BYTES)
METER_COUNTERS = SHUFFLE_COUNTERS + (DATUMS, DATUM_SUM_A, DATUM_SUM_B)


def in_global_window(value) -> WindowedValue:
    """value as a finish_bundle output, which has no input element to take a window from: in
    the global window (every evalbeam pipeline is batch, in the global window)."""
    return WindowedValue(value, GlobalWindow().max_timestamp(), (GlobalWindow(),))


class Largest(int):
    """A stats value that combines by maximum instead of sum."""


def add_stats(values) -> int:
    """The CombinePerKey function of the stats channel: the sum of the values, or the largest
    when they are Largest (all values of one counter are of one kind)."""
    values = list(values)
    if values and isinstance(values[0], Largest):
        return Largest(max(values))
    return sum(values)


def pickled_size(value) -> int:
    return len(pickle.dumps(value, protocol=5))


class MeterShuffle(beam.DoFn):
    """Counts the elements entering a shuffle and the bytes of their pickles; emits two stats
    pairs per bundle (not per element), from finish_bundle."""

    def __init__(self, stage: str):
        self.stage = stage

    def start_bundle(self):
        self.elements = 0
        self.bytes = 0

    def process(self, element):
        self.elements += 1
        self.bytes += pickled_size(element)
        return ()

    def finish_bundle(self):
        if self.elements:
            for counter, n in ((SHUFFLE_ELEMENTS, self.elements), (SHUFFLE_BYTES, self.bytes)):
                yield in_global_window(((counter, self.stage), n))


def meter(pcoll, stage: str):
    """The stats pairs of what pcoll carries into the shuffle named stage."""
    return pcoll | f"Meter{stage}" >> beam.ParDo(MeterShuffle(stage))


def _largest_state(element, stage: str):
    _, state = element
    return (LARGEST_STATE_BYTES, stage), Largest(pickled_size(state))


def meter_states(combined, stage: str = "MergeStates"):
    """The stats pair of the largest merged state of combined ((key, state) pairs): the size of
    the biggest accumulator the combine had to hold for one key."""
    return combined | f"MeterLargest{stage}" >> beam.Map(_largest_state, stage)


def datum_fingerprint_stats(element):
    """A presence element (transforms.evaluated.Evaluated.presence) -> the stats pairs of the
    datums fingerprint: only the ground truth's datums of the overall slice count (each datum
    is in one shard, once)."""
    from evalbeam.schemas.hashing import fingerprint_sums
    from evalbeam.transforms.io import GROUNDTRUTHS

    slice_json, (source, hashes) = element
    if slice_json != "{}" or source != GROUNDTRUTHS:
        return
    first, second = fingerprint_sums(hashes)
    yield (DATUMS, GROUNDTRUTHS), int(len(hashes))
    yield (DATUM_SUM_A, GROUNDTRUTHS), first
    yield (DATUM_SUM_B, GROUNDTRUTHS), second


def datums_report(stats) -> dict | None:
    """run.json's "datums": {"evaluated": n, "fingerprint": 32 hex digits} of the ground
    truth's datums, from summed stats pairs; None when the run has no datum hashes."""
    from evalbeam.schemas.hashing import fingerprint

    found = {counter: value for (counter, _), value in stats
             if counter in (DATUMS, DATUM_SUM_A, DATUM_SUM_B)}
    if DATUMS not in found:
        return None
    return {"evaluated": int(found[DATUMS]),
            "fingerprint": fingerprint((found[DATUM_SUM_A], found[DATUM_SUM_B]))}


def is_row_counter(pair) -> bool:
    (counter, _), _ = pair
    return counter not in METER_COUNTERS


def shuffle_report(stats) -> dict:
    """{stage: {"elements", "bytes", "spilled_bytes"?, "largest_state_bytes"?}} from summed
    stats pairs; the pairs of other counters are ignored."""
    out: dict = {}
    for (counter, stage), value in stats:
        if counter in SHUFFLE_COUNTERS:
            out.setdefault(stage, {})[counter] = int(value)
    return {stage: {counter.replace("shuffle_", ""): out[stage][counter]
                    for counter in SHUFFLE_COUNTERS if counter in out[stage]}
            for stage in sorted(out)}
