"""The one CombineFn of every task (MergeStates), the step after it (records_of), and both
as one step (merged_records), metered (transforms/meters.py).

A task's state (transforms/kernels/<task>.py) has copy() -> a new state and merge(other) ->
self with other added. Merging is exact and order-free (integer counts, exact sums, states
sorted by a total order when read), so any bundling and any worker count give the same state.
"""

from __future__ import annotations

import json

import apache_beam as beam

from evalbeam.transforms.meters import meter, meter_states


class MergeStates(beam.CombineFn):
    """Combines partial states that have copy() and merge(); None is the empty state."""

    def create_accumulator(self):
        return None

    def add_input(self, acc, state):
        return state.copy() if acc is None else acc.merge(state)

    def merge_accumulators(self, accs):
        out = None
        for acc in accs:
            if acc is not None:
                out = acc.copy() if out is None else out.merge(acc)
        return out

    def compact(self, acc):
        return acc.compact() if acc is not None and hasattr(acc, "compact") else acc

    def extract_output(self, acc):
        return self.compact(acc)


def records_of(element, state_records, *args, by_model: bool = False, **kwargs):
    """((model, slice JSON), merged state) -> the records of state_records(state, *args,
    **kwargs) (a kernel's function, records without model and slice), each with "model" and
    "slice" added last; nothing for an empty (None) state. by_model: args[0] is {model: value}
    and state_records gets the value of the element's model (classification's per-model
    vocabularies)."""
    (model, slice_json), state = element
    if state is None:
        return
    if by_model:
        args = (args[0][model],) + args[1:]
    slice_value = json.loads(slice_json)
    for record in state_records(state, *args, **kwargs):
        record["model"] = model
        record["slice"] = slice_value
        yield record


def merged_records(partials, state_records, *args, by_model: bool = False):
    """((model, slice JSON), partial state) pairs -> (records, meter stats): the records of
    each merged state (CombinePerKey(MergeStates()), then records_of with
    state_records(state, *args); by_model: see records_of), and the stats pairs of what entered
    the combine and of its largest state (transforms/meters.py)."""
    combined = partials | "Combine" >> beam.CombinePerKey(MergeStates())
    records = combined | "Records" >> beam.FlatMap(records_of, state_records, *args, by_model=by_model)
    return records, metered_states(partials, combined)


def metered_states(partials, combined):
    """The meter stats of a MergeStates combine: its input, and its largest merged state."""
    return ((meter(partials, "MergeStates"), meter_states(combined))
            | "MergeStatesMeters" >> beam.Flatten())
