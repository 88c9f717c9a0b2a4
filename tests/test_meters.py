"""The shuffle meters (transforms/meters.py): the elements and pickled bytes that enter a
shuffle, and the largest merged state, counted inside a pipeline and summed (or maximised) on
the stats channel into run.json's "shuffles"."""

from __future__ import annotations

import json
import pickle

import apache_beam as beam
import numpy as np
from helpers import ROOT, run_cli_subprocess


def _save(pairs, path):
    with open(path, "w") as out:
        json.dump(sorted([[k[0], k[1], int(v), type(v).__name__] for k, v in pairs]), out)


def test_meters_count_elements_bytes_and_the_largest_state(tmp_path):
    """(On two worker processes, the golden cases check that run.json counts the same
    elements as in one: tests/test_golden.py, shuffle_elements.json.)"""
    from evalbeam.transforms.meters import add_stats, meter, meter_states

    rng = np.random.default_rng(3)
    # uneven sizes, so that a wrong sum or a max taken as a sum shows
    elements = [(f"k{i % 4}", rng.integers(0, 9, size=int(rng.integers(1, 400)))) for i in range(150)]
    with beam.Pipeline() as p:
        pcoll = p | beam.Create(elements)
        states = pcoll | beam.CombinePerKey(lambda arrays: np.concatenate(list(arrays)))
        stats = (meter(pcoll, "Test"), meter_states(states, "Test")) | beam.Flatten()
        _ = (stats | beam.CombinePerKey(add_stats) | beam.combiners.ToList()
             | beam.Map(_save, tmp_path / "stats.json"))
    got = json.loads((tmp_path / "stats.json").read_text())
    merged = {}
    for key, array in elements:
        merged.setdefault(key, []).append(array)
    largest = max(len(pickle.dumps((np.concatenate(v)), protocol=5)) for v in merged.values())
    assert got == sorted([
        ["largest_state_bytes", "Test", largest, "Largest"],
        ["shuffle_bytes", "Test", sum(len(pickle.dumps(e, protocol=5)) for e in elements), "int"],
        ["shuffle_elements", "Test", len(elements), "int"]])


def test_add_stats_and_the_report():
    from evalbeam.transforms.meters import Largest, add_stats, shuffle_report

    assert add_stats([3, 4]) == 7 and add_stats([]) == 0
    assert add_stats([Largest(3), Largest(9), Largest(4)]) == 9
    assert isinstance(add_stats([Largest(1)]), Largest)
    report = shuffle_report([(("rows_read", "model"), 5), (("shuffle_elements", "B"), 2),
                             (("shuffle_bytes", "B"), 80), (("largest_state_bytes", "B"), Largest(50)),
                             (("shuffle_elements", "A"), 1)])
    assert report == {"A": {"elements": 1}, "B": {"elements": 2, "bytes": 80, "largest_state_bytes": 50}}
    assert list(report) == ["A", "B"]


def test_run_json_has_the_shuffles_and_row_counts_still_add_up(tmp_path):
    """A run's run.json: both shuffles of the task, with bytes, and counts untouched by the
    meters (the launcher checks that rows read = evaluated + rejected)."""
    golden = ROOT / "tests" / "golden" / "inputs" / "classification"
    done = run_cli_subprocess(["classification", "--groundtruths", golden / "groundtruths.jsonl",
                               "--predictions", f"a={golden / 'model_a.jsonl'}", "--slice", "region",
                               "--max_rejected_fraction", "0.01", "--output", tmp_path, "--quiet"])
    assert done.returncode == 0, done.stderr
    info = json.loads((tmp_path / "run.json").read_text())
    assert sorted(info["shuffles"]) == ["GroupByShard", "MergeStates"]
    assert info["shuffles"]["GroupByShard"]["bytes"] > info["shuffles"]["GroupByShard"]["elements"] > 0
    assert 0 < info["shuffles"]["MergeStates"]["largest_state_bytes"] <= info["shuffles"]["MergeStates"]["bytes"]
    assert set(info["counts"]) == {"groundtruths", "a"}
