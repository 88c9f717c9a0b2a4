"""FilesJob.presence: every task's Evaluate<Task>Files returns Evaluated.presence when asked,
without --bootstrap or --compare_to, the same as the paired comparisons get with them, and the
metrics do not change (the sweep's datum fingerprints, pipelines/sweep/leaderboard.py).

One pipeline per task on the golden inputs (tests/golden/inputs), with the Files transform
applied three times: presence asked (no bootstrap), bootstrap + compare_to (the reference
presence), and neither (today's plain run, whose metrics the first must equal)."""

from __future__ import annotations

import json
import os
import time

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from evalbeam.pipelines.launch.common import local_pipeline
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.transforms.evaluated import FilesJob
from evalbeam.transforms.preflight import expand_source
from evalbeam.transforms.kernels.bootstrap import Bootstrap

INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "inputs")
NUM_SHARDS = 3


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def _metric(record) -> dict:
    return record


def _presence(element) -> list:
    """(slice JSON, (source, uint64 hashes)) -> [slice JSON, source, sorted hashes]."""
    slice_json, (source, hashes) = element
    assert np.asarray(hashes).dtype == np.uint64
    return [slice_json, source, sorted(int(h) for h in hashes)]


def _write_lines(lines, path):
    with open(path, "w", encoding="utf-8") as out:
        out.write("".join(line + "\n" for line in sorted(lines)))


def _tagged(fn, tag: str):
    """element -> one JSON line [tag, fn(element)]."""
    return lambda element: json.dumps([tag, fn(element)], sort_keys=True, default=_plain)


def _read(path: str) -> dict:
    """{tag: sorted [element]} of the lines _tagged wrote."""
    found: dict = {}
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            tag, element = json.loads(line)
            found.setdefault(tag, []).append(element)
    return {tag: sorted(elements, key=json.dumps) for tag, elements in found.items()}


TASKS = {
    # task: (folder of tests/golden/inputs, Files transform, {source: file}, slices,
    #        baseline model, the ground truth's datum id field)
    "classification": ("classification", "EvaluateClassificationFiles",
                       {"groundtruths": "groundtruths.jsonl", "model_a": "model_a.jsonl",
                        "model_b": "model_b.jsonl"}, [("region",)], "model_a", "datum_uid"),
    "detection": ("detection", "EvaluateDetectionFiles",
                  {"groundtruths": "groundtruths.jsonl", "good": "good.jsonl", "weak": "weak.jsonl"},
                  [("camera",)], "good", "datum_uid"),
    "segmentation": ("segmentation", "EvaluateSegmentationFiles",
                     {"groundtruths": "groundtruths.jsonl", "good": "good.jsonl",
                      "noisy": "noisy.jsonl"}, [("site",)], "good", "datum_uid"),
    "text": ("text", "EvaluateTextFiles",
             {"groundtruths": "groundtruths.jsonl", "good": "good.jsonl", "bad": "bad.jsonl"},
             [("topic",)], "good", "datum_uid"),
    "retrieval": ("retrieval", "EvaluateRetrievalFiles",
                  {"groundtruths": "qrels.jsonl", "a": "run_a.jsonl", "b": "run_b.jsonl"},
                  [("kind",)], "a", "query_id"),
}


def _config(task: str):
    if task == "classification":
        from evalbeam.transforms.kernels.classification import ClassificationConfig

        return ClassificationConfig(score_thresholds=(0.0, 0.5))
    if task == "detection":
        from evalbeam.transforms.kernels.detection import DetectionConfig

        return DetectionConfig(native=True)
    if task == "segmentation":
        from evalbeam.transforms.kernels.segmentation import SegmentationConfig

        return SegmentationConfig()
    if task == "text":
        from evalbeam.transforms.kernels.text import TextConfig

        return TextConfig()
    from evalbeam.transforms.kernels.retrieval import RetrievalConfig

    return RetrievalConfig()


def _gt_hashes(path: str, field: str) -> set[int]:
    """The FNV-1a hashes of every datum_uid (query id) of the ground-truth file, rejected or not."""
    uids = set()
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get(field), str):
                uids.add(row[field])
    return set(fnv1a_64(pa.array(sorted(uids), pa.string())).tolist())


VARIANTS = {
    # name: (bootstrap, compare_to from the baseline, presence)
    "asked": (None, False, True),
    "compared": (Bootstrap(replicates=10, seed=3), True, False),
    "plain": (Bootstrap(), False, False),
}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_presence_on_request(task, tmp_path):
    folder, transform_name, files, slices, baseline, uid_field = TASKS[task]
    module = __import__(f"evalbeam.transforms.{task}", fromlist=[transform_name])
    transform = getattr(module, transform_name)
    config = _config(task)
    sources = {name: expand_source(name, os.path.join(INPUTS, folder, file))
               for name, file in files.items()}
    models = tuple(sorted(name for name in sources if name != "groundtruths"))
    started = time.time()

    pipeline = local_pipeline()
    outputs, lines = {}, []
    for variant, (bootstrap, compare, presence) in VARIANTS.items():
        scratch = tmp_path / variant
        scratch.mkdir()
        job = FilesJob(sources, models, tuple(slices), NUM_SHARDS, True, started,
                       lambda name, scratch=scratch: str(scratch / name), bootstrap,
                       baseline if compare else None, presence=presence)
        out = pipeline | f"Run[{variant}]" >> transform(config, job)
        outputs[variant] = out
        if out.presence is not None:
            lines.append(out.presence | f"Presence[{variant}]" >> beam.Map(
                _tagged(_presence, f"{variant}.presence")))
        if variant in ("asked", "plain"):
            lines.append(out.metrics | f"Metrics[{variant}]" >> beam.Map(
                _tagged(_metric, f"{variant}.metrics")))
    # one gathering step for everything (each step costs the local runner time)
    _ = (lines
         | "AllLines" >> beam.Flatten()
         | "Gather" >> beam.combiners.ToList()
         | "Write" >> beam.Map(_write_lines, str(tmp_path / "collected.jsonl")))

    # today's behaviour without the flag: no presence unless comparing
    assert outputs["plain"].presence is None
    # asked for: presence, but not the outcomes that only the comparisons use
    assert outputs["asked"].presence is not None
    assert outputs["asked"].outcomes is None
    pipeline.run().wait_until_finish()

    collected = _read(str(tmp_path / "collected.jsonl"))
    reference = collected["compared.presence"]
    asked = collected["asked.presence"]
    assert asked == reference   # as sorted lists: the same (slice, source, hashes) elements

    # not empty, and made of the FNV-1a hashes of the ground truth's datum_uids
    known = _gt_hashes(sources["groundtruths"].files[0], uid_field)
    overall = {source: set() for source in ("groundtruths", *models)}
    for slice_json, source, hashes in asked:
        assert set(hashes) <= known
        if slice_json == "{}":
            overall[source] |= set(hashes)
    assert overall["groundtruths"]
    assert all(overall[model] for model in models)
    assert all(overall[model] <= overall["groundtruths"] for model in models)
    assert any(slice_json != "{}" for slice_json, _, _ in asked)

    # the metrics do not change
    plain = collected["plain.metrics"]
    assert plain
    assert collected["asked.metrics"] == plain
