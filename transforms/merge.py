"""MergeStates, the second of every task's two shuffles: the partial states per (model, slice)
added up (combine_states), the step after it (records_of), and both as one step
(merged_records), metered (transforms/meters.py).

A task's state (transforms/kernels/<task>.py) has copy() -> a new state and merge(other) ->
self with other added. Merging is exact and order-free (integer counts, exact sums, states
sorted by a total order when read), so any bundling and any worker count give the same state.

combine_states does what a CombinePerKey with combiner lifting does (each bundle adds its
states per key before the shuffle, the shuffle's side adds what every bundle sent), with the
states crossing the shuffle as pickled bytes or spilled files, as GroupByShard's pieces do
(transforms/grouping.py): a runner that groups in Python would otherwise unpickle and pickle
every accumulator in its one process (a classification state of 1,000,000 datums is 76 MB;
2 s of the runner alone in such a run on 2 workers, 2026-11-27).
"""

from __future__ import annotations

import json
import typing

import apache_beam as beam

from evalbeam.transforms.grouping import pack, spill_folder, spill_size, unpack
from evalbeam.transforms.meters import in_global_window, meter, meter_states


def records_of(element, state_records, config, side=None, by_model: bool = False):
    """((model, slice JSON), merged state) -> the records of state_records(state, config,
    side) (a kernel's function, the one signature of every task; records without model and
    slice), each with "model" and "slice" added last; nothing for an empty (None) state.
    side: what the records are read against besides the config (a side state: categories,
    labels), or None; by_model: side is {model: value} and state_records gets the value of the
    element's model (classification's per-model vocabularies)."""
    (model, slice_json), state = element
    if state is None:
        return
    if by_model:
        side = side[model]
    slice_value = json.loads(slice_json)
    for record in state_records(state, config, side):
        record["model"] = model
        record["slice"] = slice_value
        yield record


def merged_records(partials, state_records, config, side=None, by_model: bool = False,
                   spill_dir: str | None = None):
    """((model, slice JSON), partial state) pairs -> (records, meter stats, merged states): the
    records of each merged state (combine_states, spilling to spill_dir when given, then
    records_of with state_records(state, config, side); by_model: see records_of), the stats
    pairs of what entered the combine and of its largest state (transforms/meters.py), and the
    merged states ((model, slice JSON), state)."""
    combined = combine_states(partials, spill_dir)
    records = combined | "Records" >> beam.FlatMap(records_of, state_records, config, side,
                                                   by_model=by_model)
    return records, metered_states(partials, combined), combined


def metered_states(partials, combined):
    """The meter stats of the MergeStates shuffle (combine_states): its input, and its largest
    merged state."""
    return ((meter(partials, "MergeStates"), meter_states(combined))
            | "MergeStatesMeters" >> beam.Flatten())


class _MergeInBundle(beam.DoFn):
    """((key, state) pairs) -> one (key, state) per key per bundle, the bundle's states of the
    key added (combiner lifting), packed (grouping.pack) for the shuffle."""

    def __init__(self, spill_dir: str | None, spill_bytes: int):
        self.spill_dir = spill_dir
        self.spill_bytes = spill_bytes

    def start_bundle(self):
        self.states: dict = {}
        self.pending: dict = {}

    def process(self, element):
        key, state = element
        if state is None:
            return
        if hasattr(type(state), "merge_all"):
            self.pending.setdefault(key, []).append(state)
            return
        held = self.states.get(key)
        # the first state is copied: a DoFn must not change its input
        self.states[key] = state.copy() if held is None else held.merge(state)

    def finish_bundle(self):
        states, self.states = self.states, {}
        pending, self.pending = self.pending, {}
        for key, parts in pending.items():
            states[key] = merge_states(parts, owned=False)
        for key in sorted(states):
            yield in_global_window(pack((key, states[key]), self.spill_dir, self.spill_bytes))


def merge_states(states: list, owned: bool):
    """The sum of kernel states (merge, copy). A class with merge_all (states that keep rows,
    detection's: pairwise, each merge copies the rows held so far) sums them at once, leaving
    them unchanged; else they are merged pairwise, into the first when owned (the caller's
    own, unpickled states), into a copy of it otherwise (a DoFn must not change its input)."""
    if hasattr(type(states[0]), "merge_all"):
        return type(states[0]).merge_all(states)
    total = states[0] if owned else states[0].copy()
    for state in states[1:]:
        total = total.merge(state)
    return total


def _merged(element):
    """(key, packed states) -> (key, their sum, compacted)."""
    key, states = unpack(element)
    total = merge_states(states, owned=True)
    # a state may keep more than its records need until merged (compact() drops it)
    return key, total.compact() if hasattr(total, "compact") else total


STATE_KEY = typing.Tuple[str, str]       # (model, slice JSON)


def combine_states(partials, spill_dir: str | None = None, key_type=STATE_KEY):
    """((model, slice JSON), partial state) pairs -> (key, merged state) per key, compacted;
    a None partial state is empty (a key with nothing else is not output). key_type: the keys'
    type hint, which picks their (deterministic) coder for the grouping."""
    spill_dir = spill_folder(spill_dir, partials.pipeline.options)
    grouped = (partials
               | "MergeInBundles" >> beam.ParDo(_MergeInBundle(spill_dir, spill_size()))
               .with_output_types(typing.Tuple[key_type, bytes])
               | "GroupStates" >> beam.GroupByKey())
    return grouped | "Combine" >> beam.Map(_merged)
