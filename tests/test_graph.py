"""The one graph (transforms/graph.py) and the task contract (pipelines/tasks/task.py): every task
plugs into the same graph, its users' PTransform takes the same arguments and returns the same
shape, and what a task declares agrees with what its graph writes."""

from __future__ import annotations

import inspect
import json
import os

import apache_beam as beam
import pytest

from evalbeam.pipelines.tasks.registry import TASKS, task_of
from evalbeam.pipelines.tasks.task import Task
from evalbeam.transforms.graph import Diagnosed, EvaluateFiles, EvaluateRows, TaskGraph

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "golden", "inputs")
# (groundtruth file, {model: file}) of the golden inputs, read as row dicts
ROWS = {
    "classification": ("classification/groundtruths.jsonl",
                       {"model_a": "classification/model_a.jsonl", "model_b": "classification/model_b.jsonl"}),
    "detection": ("detection/groundtruths.jsonl",
                  {"good": "detection/good.jsonl", "weak": "detection/weak.jsonl"}),
    "segmentation": ("segmentation/groundtruths.jsonl",
                     {"good": "segmentation/good.jsonl", "noisy": "segmentation/noisy.jsonl"}),
    "text": ("text/groundtruths.jsonl", {"good": "text/good.jsonl", "bad": "text/bad.jsonl"}),
    "retrieval": ("retrieval/qrels.jsonl", {"run_a": "retrieval/run_a.jsonl", "run_b": "retrieval/run_b.jsonl"}),
}


def _rows(relative: str) -> list[dict]:
    """The lines of a golden input that are JSON objects (some are bad JSON on purpose: those
    are rejected by the file readers, and cannot be dicts of a PCollection)."""
    rows = []
    with open(os.path.join(INPUTS, relative), encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_is_a_task_with_a_graph_plugged_into_both_ptransforms(name):
    task = task_of(name)
    assert isinstance(task, Task) and task.name == name
    files, rows = task.files_transform(), task.pcollection_transform()
    assert issubclass(files, EvaluateFiles) and issubclass(rows, EvaluateRows)
    assert isinstance(files.graph, TaskGraph) and type(rows.graph) is type(files.graph)
    assert files.graph.name == name
    # one signature for every users' PTransform: the config first, then EvaluateRows' own
    params = list(inspect.signature(EvaluateRows.__init__).parameters)
    own = list(inspect.signature(rows.__init__).parameters)
    assert own == params or own[:2] == ["self", "config"], own


@pytest.mark.parametrize("name", sorted(TASKS))
def test_what_a_task_declares_agrees_with_its_graph(name):
    """The metric types are the graph's record order; the default types and the leaderboard's
    headline types are among them, so a gate or a leaderboard never names a type the task
    cannot write; the order key orders every type."""
    task = task_of(name)
    graph = task.graph
    assert task.metric_types == tuple(graph.record_order) and len(set(task.metric_types)) > 1
    assert set(task.default_metric_types) <= set(task.metric_types)
    headline_types = {h.split("[")[0].split(".")[0] for h in task.headlines}
    assert headline_types and headline_types <= set(task.metric_types), headline_types
    assert task.interval_unit in ("datum", "image", "query")
    records = [{"type": t, "parameters": {}, "model": "m", "slice": {}} for t in task.metric_types]
    assert sorted(reversed(records), key=task.record_sort_key) == records


def test_classification_defaults_are_not_all_its_types():
    task = task_of("classification")
    assert "ECE" in task.metric_types and "ECE" not in task.default_metric_types


def _counters_add_up(stats: list) -> dict:
    counts: dict = {}
    for (counter, source), n in stats:
        counts.setdefault(source, {}).setdefault(counter, 0)
        counts[source][counter] += n
    for source, c in counts.items():
        assert c["rows_read"] == c["rows_evaluated"] + c["rows_rejected"], (source, c)
    return counts


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_users_ptransform_returns_the_same_shape(name, tmp_path):
    """Diagnosed(metrics, rejected, stats, extra) for every task, on the golden inputs as row
    dicts: records of every model, counters that add up for every source, rejections that
    name their source; text also gives its score rows."""
    from evalbeam.pipelines.launch.common import local_pipeline

    truth, models = ROWS[name]
    transform = task_of(name).pcollection_transform()(with_diagnostics=True, num_shards=3)

    def keep(values, key, folder):   # through files: the runner may run this in a copy
        with open(os.path.join(folder, key + ".json"), "w", encoding="utf-8") as f:
            json.dump(values, f)

    with local_pipeline() as p:
        pcolls = {"groundtruths": p | "G" >> beam.Create(_rows(truth))}
        for model, path in models.items():
            pcolls[model] = p | f"M[{model}]" >> beam.Create(_rows(path))
        result = pcolls | transform
        assert isinstance(result, Diagnosed)
        for key in ("metrics", "rejected", "stats"):
            _ = (getattr(result, key) | f"All[{key}]" >> beam.combiners.ToList()
                 | f"Keep[{key}]" >> beam.Map(keep, key, str(tmp_path)))
        for key, pcoll in result.extra.items():
            _ = (pcoll | f"All[{key}]" >> beam.combiners.ToList()
                 | f"Keep[{key}]" >> beam.Map(keep, key, str(tmp_path)))
    out = {}
    for file in os.listdir(tmp_path):
        with open(tmp_path / file, encoding="utf-8") as f:
            out[file[:-5]] = json.load(f)
    assert {r["model"] for r in out["metrics"]} == set(models)
    assert {r["type"] for r in out["metrics"]} <= set(task_of(name).metric_types) | {"Comparison"}
    counts = _counters_add_up([((c, s), n) for (c, s), n in out["stats"]])
    assert set(counts) == {"groundtruths", *models}
    assert {r["source"] for r in out["rejected"]} <= set(counts)
    rejected = sum(c["rows_rejected"] for c in counts.values())
    assert rejected == len(out["rejected"])
    if name == "text":
        # every datum with a valid ground truth is scored for every model (a missing or
        # rejected prediction is scored as missing)
        scored = {(row["model"], row["datum_uid"]) for row in out["scores"]}
        assert len(scored) == len(models) * counts["groundtruths"]["rows_evaluated"]
    else:
        assert set(result.extra) == set()


def test_reading_settings_travel_with_the_pipeline_options():
    """split_inputs and share_reads set ReadOptions, which survive the options' serialisation
    (what a runner ships to its workers), where attributes of the Pipeline object would not."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from evalbeam.transforms.io import ReadOptions, share_reads, split_inputs

    pipeline = beam.Pipeline(options=PipelineOptions([]))
    assert pipeline.options.view_as(ReadOptions).evalbeam_input_split_bytes is None
    split_inputs(pipeline, 0)
    share_reads(pipeline, {("groundtruths", ("a.jsonl", "b.jsonl")): 3, ("m", ("c.jsonl",)): 1})
    shipped = PipelineOptions.from_dictionary(pipeline.options.get_all_options(drop_default=True))
    settings = shipped.view_as(ReadOptions)
    assert settings.evalbeam_input_split_bytes == 0 and settings.evalbeam_share_reads
    assert settings.read_uses() == {("groundtruths", ("a.jsonl", "b.jsonl")): 3, ("m", ("c.jsonl",)): 1}


def test_finalize_run_records_the_rows_of_every_extra_output(tmp_path):
    """run.json's "<stem>_written" for each extra output a task wrote, not only the first."""
    from evalbeam.transforms.outputs import OutputFolder, finalize_run

    folder = OutputFolder(str(tmp_path / "out"), extra=("scores.jsonl", "per_query.jsonl"))
    folder.check([])
    folder.start({"status": "running"})
    for name in ("metrics.jsonl", "rejected.jsonl", "scores.jsonl", "per_query.jsonl"):
        with open(folder.temp(name), "w", encoding="utf-8") as f:
            f.write("")
    stats = [(("rows_read", "groundtruths"), 2), (("rows_evaluated", "groundtruths"), 2),
             (("rows_rejected", "groundtruths"), 0)]
    info = finalize_run(stats, 0, 0, folder, {"sources": {"groundtruths": {}}, "slices": []}, 0.0,
                        0.0, {"scores.jsonl": 7, "per_query.jsonl": 5})
    assert info["scores_written"] == 7 and info["per_query_written"] == 5
