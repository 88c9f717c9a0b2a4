"""Intervals and paired comparisons on a task's metric records: the one Beam step every task
shares (the formulas are in transforms/kernels/bootstrap.py; the reference is
pipelines/launch/uncertainty.md).

A task's records may carry kernels.bootstrap.REPLICATES (the replicate values of a scalar
record) and PROPORTION ([successes, trials] over datums). Uncertainty turns them into
"interval" and "wilson" and removes them, and with a baseline model adds one Comparison record
per other model, scalar record identity and slice.
"""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np

from evalbeam.schemas.slices import canonical_json
from evalbeam.transforms.kernels.bootstrap import (
    PROPORTION, REPLICATES, Bootstrap, benjamini_hochberg, bootstrap_p_value, is_scalar,
    mcnemar_exact, percentile_interval, record_identity, wilson_interval,
)

COMPARISON = "Comparison"
METHOD = "percentile bootstrap, Poisson(1) weights"
GROUNDTRUTHS = "groundtruths"


def _interval(values, bootstrap: Bootstrap, unit: str) -> dict:
    low, high, kept = percentile_interval(values, bootstrap.confidence)
    return {"low": low, "high": high, "confidence": bootstrap.confidence, "method": METHOD,
            "replicates": kept, "unit": unit}


def finish_record(record: dict, bootstrap: Bootstrap, unit: str) -> dict:
    """A copy of record with "interval" from REPLICATES and "wilson" from PROPORTION (when
    bootstrapping) and without the internal fields."""
    out = {k: v for k, v in record.items() if k not in (REPLICATES, PROPORTION)}
    if not bootstrap.enabled:
        return out
    replicates, proportion = record.get(REPLICATES), record.get(PROPORTION)
    if isinstance(replicates, dict):
        # a value that is an object: one interval per field that has replicates
        out["interval"] = {name: _interval(values, bootstrap, unit) for name, values in replicates.items()}
    elif replicates is not None:
        out["interval"] = _interval(replicates, bootstrap, unit)
    if isinstance(proportion, dict):
        out["wilson"] = {name: _wilson(k_n, bootstrap) for name, k_n in proportion.items()}
    elif proportion is not None:
        out["wilson"] = _wilson(proportion, bootstrap)
    return out


def _wilson(k_n, bootstrap: Bootstrap) -> dict:
    successes, trials = (int(x) for x in k_n)
    low, high = wilson_interval(successes, trials, bootstrap.confidence)
    return {"low": low, "high": high, "confidence": bootstrap.confidence,
            "successes": successes, "trials": trials}


def _keyed(record: dict):
    """(record identity, slice JSON), (model, value, replicates) of a scalar record with
    replicates; for a record whose value is an object with REPLICATES {field: [R]}, one per
    scalar field, named record_identity(type, {**parameters, "field": field}); nothing for the
    others."""
    slice_json = canonical_json(record["slice"])
    replicates, value = record.get(REPLICATES), record.get("value")
    if isinstance(replicates, dict) and isinstance(value, dict):
        for name, values in sorted(replicates.items()):
            if is_scalar(value.get(name)):
                identity = record_identity(record["type"], {**record["parameters"], "field": name})
                yield (identity, slice_json), (record["model"], float(value[name]), values)
    elif replicates is not None and is_scalar(value):
        yield ((record_identity(record["type"], record["parameters"]), slice_json),
               (record["model"], float(value), replicates))


def coverage(element, baseline: str):
    """(slice JSON, [(source, hashes), ...]) -> ((slice JSON, model), counts) for every model
    but the baseline: datums (with a ground truth in the slice), datums_both (with predictions
    of both), model_lacks and baseline_lacks (ground-truth datums without a prediction of that
    side)."""
    slice_json, parts = element
    slice_json = canonical_json(json.loads(slice_json))
    hashes: dict[str, list] = {}
    for source, h in parts:
        hashes.setdefault(source, []).append(np.asarray(h, dtype=np.uint64))
    unique = {source: np.unique(np.concatenate(h)) for source, h in hashes.items()}
    empty = np.zeros(0, np.uint64)
    truth = unique.get(GROUNDTRUTHS, empty)
    base = np.intersect1d(truth, unique.get(baseline, empty), assume_unique=True)
    for source, h in sorted(unique.items()):
        if source in (GROUNDTRUTHS, baseline):
            continue
        model = np.intersect1d(truth, h, assume_unique=True)
        yield (slice_json, source), {
            "datums": int(truth.size),
            "datums_both": int(np.intersect1d(model, base, assume_unique=True).size),
            "model_lacks": int(truth.size - model.size),
            "baseline_lacks": int(truth.size - base.size)}


def discordance(element, baseline: str):
    """((identity, slice JSON), [(model, hashes, correct), ...]) -> ((identity, slice JSON,
    model), {"datums", "model_only", "baseline_only", "p_value"}) for every model but the
    baseline, over the datums both have an outcome for (McNemar's exact test)."""
    (identity, slice_json), parts = element
    slice_json = canonical_json(json.loads(slice_json))
    by_model: dict[str, tuple[list, list]] = {}
    for model, h, correct in parts:
        hs, cs = by_model.setdefault(model, ([], []))
        hs.append(np.asarray(h, dtype=np.uint64))
        cs.append(np.asarray(correct, dtype=bool))
    joined = {}
    for model, (hs, cs) in by_model.items():
        h, c = np.concatenate(hs), np.concatenate(cs)
        order = np.argsort(h, kind="stable")
        joined[model] = (h[order], c[order])
    if baseline not in joined:
        return
    base_h, base_c = joined[baseline]
    for model, (h, c) in sorted(joined.items()):
        if model == baseline:
            continue
        common, in_model, in_base = np.intersect1d(h, base_h, assume_unique=True, return_indices=True)
        m, b = c[in_model], base_c[in_base]
        only_model, only_baseline = int(np.count_nonzero(m & ~b)), int(np.count_nonzero(~m & b))
        yield (identity, slice_json, model), {
            "datums": int(common.size), "model_only": only_model, "baseline_only": only_baseline,
            "p_value": mcnemar_exact(only_model, only_baseline)}


def compare(element, baseline: str, bootstrap: Bootstrap, unit: str, coverages: dict,
            discordances: dict):
    """((identity, slice JSON), [(model, value, replicates), ...]) -> one Comparison record per
    model other than the baseline (without p_value_adjusted, which needs every comparison)."""
    (identity, slice_json), parts = element
    by_model = {model: (value, replicates) for model, value, replicates in parts}
    if baseline not in by_model:
        return
    base_value, base_replicates = by_model[baseline]
    record_type, parameters = json.loads(identity)
    slice_value = json.loads(slice_json)
    for model, (value, replicates) in sorted(by_model.items()):
        if model == baseline:
            continue
        differences = [None if a is None or b is None else a - b
                       for a, b in zip(replicates, base_replicates)]
        if all(d is None for d in differences):
            # undefined on one side in every replicate (e.g. COCO's -1 for "no ground truth"):
            # there is no difference to estimate
            continue
        comparison = {"model_value": value, "baseline_value": base_value,
                      "test": "paired bootstrap", "p_value": bootstrap_p_value(differences)}
        mcnemar = discordances.get((identity, slice_json, model))
        if mcnemar is not None:
            comparison.update(test="McNemar exact", p_value=mcnemar["p_value"],
                              discordant={"model_only": mcnemar["model_only"],
                                          "baseline_only": mcnemar["baseline_only"],
                                          "datums": mcnemar["datums"]})
        comparison.update(coverages.get((slice_json, model), {}))
        yield {"type": COMPARISON, "value": value - base_value,
               "parameters": {"metric": record_type, "metric_parameters": parameters,
                              "baseline": baseline},
               "interval": _interval(differences, bootstrap, unit),
               "comparison": comparison, "model": model, "slice": slice_value}


def adjust(records: list[dict]) -> list[dict]:
    """The Comparison records with comparison.p_value_adjusted: Benjamini-Hochberg over every
    comparison of the run, in a fixed order (so the result does not depend on arrival)."""
    records = sorted(records, key=lambda r: (r["model"], canonical_json(r["slice"]),
                                             canonical_json(r["parameters"])))
    adjusted = benjamini_hochberg([r["comparison"]["p_value"] for r in records])
    for record, q in zip(records, adjusted):
        record["comparison"]["p_value_adjusted"] = q
    return records


class Uncertainty(beam.PTransform):
    """{"records": ..., "presence": ..., "outcomes": ...} -> the final metric records:
    intervals attached and, with compare_to, the Comparison records added (see the module
    docstring and transforms.evaluated.Evaluated for presence and outcomes; either may be
    missing or None). Use Uncertainty.inputs(records, presence, outcomes) to build the dict."""

    def __init__(self, bootstrap: Bootstrap | None, unit: str = "datum", compare_to: str | None = None):
        super().__init__()
        self.bootstrap = bootstrap or Bootstrap()
        self.unit = unit
        self.compare_to = compare_to if self.bootstrap.enabled else None

    @staticmethod
    def inputs(records, presence=None, outcomes=None) -> dict:
        named = {"records": records, "presence": presence, "outcomes": outcomes}
        return {name: pcoll for name, pcoll in named.items() if pcoll is not None}

    def expand(self, pcolls):
        records, presence, outcomes = (pcolls.get(name) for name in ("records", "presence", "outcomes"))
        finished = records | "Intervals" >> beam.Map(finish_record, self.bootstrap, self.unit)
        if self.compare_to is None:
            return finished
        pipeline = records.pipeline
        baseline = self.compare_to
        if presence is None:
            presence = pipeline | "NoPresence" >> beam.Create([])
        if outcomes is None:
            outcomes = pipeline | "NoOutcomes" >> beam.Create([])
        coverages = (presence
                     | "GroupPresence" >> beam.GroupByKey()
                     | "Coverage" >> beam.FlatMap(coverage, baseline))
        discordances = (outcomes
                        | "GroupOutcomes" >> beam.GroupByKey()
                        | "McNemar" >> beam.FlatMap(discordance, baseline))
        comparisons = (records
                       | "KeyScalars" >> beam.FlatMap(_keyed)
                       | "GroupScalars" >> beam.GroupByKey()
                       | "Compare" >> beam.FlatMap(compare, baseline, self.bootstrap, self.unit,
                                                   beam.pvalue.AsDict(coverages),
                                                   beam.pvalue.AsDict(discordances))
                       | "AllComparisons" >> beam.combiners.ToList()
                       | "Adjust" >> beam.FlatMap(adjust))
        return (finished, comparisons) | "WithComparisons" >> beam.Flatten()


def compared_record(record: dict) -> dict:
    """The record a Comparison compares, as far as ordering needs it: its type, parameters
    (without the compared "field"), model and slice."""
    params = {k: v for k, v in record["parameters"]["metric_parameters"].items() if k != "field"}
    return {"type": record["parameters"]["metric"], "value": None, "parameters": params,
            "model": record["model"], "slice": record["slice"]}


def _ordered(task_key, record: dict):
    if record["type"] == COMPARISON:
        params = record["parameters"]["metric_parameters"]
        return (1, task_key(compared_record(record)), str(params.get("field", "")),
                canonical_json(params))
    return (0, task_key(record))


def with_comparisons_last(task_key):
    """The order of metrics.jsonl: the task's records in task_key's order, then the Comparison
    records in the order task_key gives the records they compare (then by field), so a
    Comparison sits where its record would (picklable)."""
    import functools

    return functools.partial(_ordered, task_key)
