"""The sweep's leaderboard: headline metrics of every (dataset, model, slice), side by side.

Two halves. In the pipeline, each cell writes a sidecar (cells/<id>/leaderboard_inputs.json,
just before the cell publishes): its fingerprint, its headline records with their bootstrap
replicates, and per slice a fingerprint of the datums it was evaluated on (cell_sidecar).
After the pipeline, build() reads the sidecars of every finished cell (ran now or earlier) and
writes leaderboard.jsonl and leaderboard.csv: per row the headline values with their intervals,
the rank within (dataset, slice), and the paired comparison with the group's reference model
(the manifest's baseline, else the best-ranked model).

Why the comparisons can be made across cells: the bootstrap weight of a datum in replicate r
is a function of (datum uid, r, seed) only (transforms/kernels/bootstrap.py), so two cells over
the same datums draw the same replicates, and replicate r of model A minus replicate r of model
B is a replicate of the paired difference, exactly as --compare_to computes it in one run.
That holds only over the same datums: rows whose datum fingerprints differ from their group's
reference are neither ranked nor compared, and the mismatch is reported. Reference:
pipelines/sweep/sweep.md.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re

from evalbeam.schemas.slices import canonical_json
from evalbeam.transforms.kernels.bootstrap import (REPLICATES, benjamini_hochberg, bootstrap_p_value,
                                                   is_scalar, percentile_interval)

SIDECAR = "leaderboard_inputs.json"

def default_headlines(task: str) -> tuple:
    """A task's default headline metrics, best first (its Task.headlines): TYPE, TYPE.FIELD (a
    field of an object value) and an optional [param=value,...] filter on the record's
    parameters. Higher is better. () for a name that is no task."""
    from evalbeam.pipelines.tasks.registry import TASKS, task_of

    return task_of(task).headlines if task in TASKS else ()


SPEC = re.compile(r"^([A-Za-z][A-Za-z0-9]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?(?:\[([^\]]*)\])?$")


class Headline:
    """One headline metric spec, e.g. "ROUGE.fmeasure[rouge_type=rougeL]"."""

    def __init__(self, text: str):
        match = SPEC.match(text.strip())
        if match is None:
            raise ValueError(f"{text!r} is not TYPE, TYPE.FIELD or TYPE[param=value,...] "
                             "(e.g. Accuracy, ROUGE.fmeasure[rouge_type=rougeL], NDCG[k=10])")
        self.text = text.strip()
        self.type, self.field = match.group(1), match.group(2)
        self.filters = {}
        for part in (match.group(3) or "").split(","):
            if part.strip():
                key, sep, value = part.partition("=")
                if not sep or not key.strip():
                    raise ValueError(f"{text!r}: a filter is param=value")
                self.filters[key.strip()] = value.strip()

    def matches(self, record: dict) -> bool:
        if record.get("type") != self.type:
            return False
        params = record.get("parameters") or {}
        for key, wanted in self.filters.items():
            if key not in params:
                return False
            value = params[key]
            if (value if isinstance(value, str) else json.dumps(value)) != wanted:
                return False
        value = record.get("value")
        if self.field is not None:
            return isinstance(value, dict) and is_scalar(value.get(self.field))
        return is_scalar(value)

    def column(self, record: dict, unique: bool) -> str:
        """The column name: the spec, and the parameters it does not fix when several records
        match it (e.g. Accuracy of two label keys)."""
        if unique:
            return self.text
        rest = {k: v for k, v in (record.get("parameters") or {}).items() if k not in self.filters}
        return f"{self.text}{{{canonical_json(rest)[1:-1]}}}"

    def value_and_replicates(self, record: dict):
        value, replicates = record.get("value"), record.get(REPLICATES)
        if self.field is not None:
            value = value.get(self.field)
            replicates = replicates.get(self.field) if isinstance(replicates, dict) else None
        return value, replicates


def headlines_of(task: str, texts: list[str] | None) -> list[Headline]:
    return [Headline(t) for t in (texts or default_headlines(task))]


# ---- in the pipeline: the sidecar of one cell ----

def headline_records(records: list[dict], specs: list[Headline]) -> list[dict]:
    """{"column", "slice", "value", "replicates"} of every record some spec matches (the first
    that does), in a fixed order."""
    matched: dict[int, list[dict]] = {}
    for record in records:
        for i, spec in enumerate(specs):
            if spec.matches(record):
                matched.setdefault(i, []).append(record)
                break
    out = []
    for i, found in sorted(matched.items()):
        spec = specs[i]
        per_slice: dict[str, int] = {}
        for record in found:
            key = canonical_json(record["slice"])
            per_slice[key] = per_slice.get(key, 0) + 1
        unique = max(per_slice.values()) == 1
        for record in found:
            value, replicates = spec.value_and_replicates(record)
            out.append({"column": spec.column(record, unique), "order": i, "slice": record["slice"],
                        "value": value, "replicates": replicates})
    out.sort(key=lambda r: (canonical_json(r["slice"]), r["order"], r["column"]))
    return out


def datum_fingerprints(parts: list, model: str, intersect: bool) -> dict:
    """{slice JSON: {"datums", "fingerprint", "model_datums"}} from a cell's presence
    ((slice JSON, (source, hashes)) pairs): the datums of a slice are its ground-truth datums,
    or (intersect, for a task that averages each model over the datums it answered) those
    that also have a prediction of the model; the fingerprint is a SHA-256 of their sorted
    64-bit uid hashes."""
    import numpy as np

    by_slice: dict[str, dict[str, list]] = {}
    for slice_json, (source, hashes) in parts:
        key = canonical_json(json.loads(slice_json))
        by_slice.setdefault(key, {}).setdefault(source, []).append(np.asarray(hashes, np.uint64))
    out = {}
    for key, sources in sorted(by_slice.items()):
        truth = np.unique(np.concatenate(sources.get("groundtruths", [np.zeros(0, np.uint64)])))
        mine = np.unique(np.concatenate(sources.get(model, [np.zeros(0, np.uint64)])))
        covered = np.intersect1d(truth, mine, assume_unique=True)
        datums = covered if intersect else truth
        out[key] = {"datums": int(datums.size), "model_datums": int(covered.size),
                    "fingerprint": hashlib.sha256(np.sort(datums).astype("<u8").tobytes()).hexdigest()[:16]}
    return out


def sidecar_content(records, presence, model: str, specs, intersect: bool, fingerprint: str,
                    cell_id: str) -> dict:
    return {"cell": cell_id, "fingerprint": fingerprint,
            "records": headline_records(records, specs),
            "datums": datum_fingerprints(presence, model, intersect)}


def cell_sidecar(path: str, model: str, specs: list[Headline], intersect: bool, fingerprint: str,
                 cell_id: str):
    """TaskJob's sidecar hook (pipelines/launch/launcher.py): out (transforms.evaluated.Evaluated) ->
    a PCollection of one (path, sidecar dict). Needs out.presence (FilesJob.presence=True)."""
    import apache_beam as beam

    def build(out):
        wanted = out.metrics | "Headline" >> beam.Filter(
            lambda record: any(spec.matches(record) for spec in specs))
        presence = beam.pvalue.AsList(out.presence) if out.presence is not None else []
        # a task without datum hashes has no presence: no fingerprint to check
        return (out.metrics.pipeline
                | "SidecarOnce" >> beam.Create([None])
                | "Sidecar" >> beam.Map(
                    lambda _, rs, ps: (path, sidecar_content(list(rs), list(ps), model, specs,
                                                             intersect, fingerprint, cell_id)),
                    beam.pvalue.AsList(wanted), presence))
    return build


# ---- after the pipeline: the leaderboard of the whole sweep ----

def _interval(values, confidence: float):
    if values is None:
        return None
    low, high, kept = percentile_interval(values, confidence)
    return {"low": low, "high": high, "replicates": kept}


def build(cells: list[dict], confidence: float, baselines: dict) -> tuple[list[dict], list[str]]:
    """(rows, problems) of the leaderboard. cells: {"cell", "dataset", "task", "model",
    "sidecar"} of every finished cell; baselines: {dataset: model or None}."""
    rows: dict[tuple, dict] = {}
    replicates: dict[tuple, list] = {}
    for cell in sorted(cells, key=lambda c: c["cell"]):
        side = cell["sidecar"]
        for r in side["records"]:
            slice_json = canonical_json(r["slice"])
            key = (cell["dataset"], slice_json, cell["model"])
            datums = side["datums"].get(slice_json, {})
            row = rows.setdefault(key, {
                "dataset": cell["dataset"], "task": cell["task"], "model": cell["model"],
                "slice": r["slice"], "rank": None, "primary": r["column"], "metrics": {},
                "datums": datums.get("datums"), "model_datums": datums.get("model_datums"),
                "datum_fingerprint": datums.get("fingerprint"), "comparable": True,
                "cell": cell["cell"]})
            row["metrics"][r["column"]] = {"value": r["value"],
                                           "interval": _interval(r["replicates"], confidence)}
            replicates[key + (r["column"],)] = r["replicates"]
    problems: list[str] = []
    groups: dict[tuple, list[dict]] = {}
    for (dataset, slice_json, _), row in rows.items():
        groups.setdefault((dataset, slice_json), []).append(row)
    comparisons = []
    for (dataset, slice_json), members in sorted(groups.items()):
        primary = _primary(members)
        baseline = baselines.get(dataset)
        reference = next((m for m in members if m["model"] == baseline), None) if baseline else None
        # rows over other datums than the reference (or the most common set) are set apart
        prints = [m["datum_fingerprint"] for m in members]
        anchor = reference["datum_fingerprint"] if reference else max(set(prints), key=lambda p: (prints.count(p), str(p)))
        comparable = [m for m in members if m["datum_fingerprint"] == anchor]
        for m in members:
            if m["datum_fingerprint"] != anchor:
                m["comparable"] = False
                problems.append(
                    f"{dataset} {slice_json}: {m['model']} was evaluated on other datums "
                    f"({m['datums']} datums, fingerprint {m['datum_fingerprint']}) than the rest "
                    f"(fingerprint {anchor}); it is not ranked or compared")
        ranked = sorted(comparable, key=lambda m: _sort_value(m, primary))
        for m in ranked:
            value = m["metrics"].get(primary, {}).get("value")
            if value is not None:
                m["rank"] = 1 + sum(1 for o in ranked if (o["metrics"].get(primary, {}).get("value") or float("-inf")) > value)
        if reference is None:
            reference = ranked[0] if ranked and ranked[0]["rank"] is not None else None
        elif not reference["comparable"]:
            reference = None
        if baseline and reference is None:
            problems.append(f"{dataset} {slice_json}: the baseline {baseline} has no comparable "
                            "row here; nothing is compared")
        if reference is None:
            continue
        for m in comparable:
            if m is reference:
                continue
            for column, metric in m["metrics"].items():
                mine = replicates.get((dataset, slice_json, m["model"], column))
                theirs = replicates.get((dataset, slice_json, reference["model"], column))
                ref_value = reference["metrics"].get(column, {}).get("value")
                if ref_value is None or metric["value"] is None:
                    continue
                comparison = {"against": reference["model"],
                              "difference": metric["value"] - ref_value}
                if mine is not None and theirs is not None:
                    diffs = [None if a is None or b is None else a - b for a, b in zip(mine, theirs)]
                    comparison.update(interval=_interval(diffs, confidence), test="paired bootstrap",
                                      p_value=bootstrap_p_value(diffs))
                    comparisons.append(comparison)
                metric["comparison"] = comparison
    adjusted = benjamini_hochberg([c["p_value"] for c in comparisons])
    for comparison, q in zip(comparisons, adjusted):
        comparison["p_value_adjusted"] = q
    ordered = sorted(rows.values(), key=lambda r: (r["dataset"], canonical_json(r["slice"]) != "{}",
                                                   canonical_json(r["slice"]),
                                                   r["rank"] is None, r["rank"] or 0, r["model"]))
    return ordered, problems


def _primary(members: list[dict]) -> str:
    """The group's ranking column: the first headline column its rows have (the same for every
    row of a dataset, whose cells share their headline specs)."""
    counts: dict[str, int] = {}
    for m in members:
        counts[m["primary"]] = counts.get(m["primary"], 0) + 1
    return max(sorted(counts), key=lambda c: counts[c])


def _sort_value(row: dict, column: str):
    value = row["metrics"].get(column, {}).get("value")
    return (value is None, -(value or 0.0), row["model"])


def _cell_text(value) -> str:
    """A CSV cell: numbers as they are, text that a spreadsheet would read as a formula
    (slice values come from users' metadata) prefixed with a quote."""
    if value is None:
        return ""
    text = str(value)
    if text[:1] in ("=", "+", "-", "@", "\t", "\r") and not _is_number(text):
        return "'" + text
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def slice_text(slice_value: dict) -> str:
    return ";".join(f"{k}={v}" for k, v in slice_value.items()) or "(all)"


def to_csv(rows: list[dict]) -> str:
    """leaderboard.csv: one line per row; per headline column its value, interval ends,
    difference from the reference and adjusted p-value."""
    columns: list[str] = []
    for row in rows:
        for column in row["metrics"]:
            if column not in columns:
                columns.append(column)
    header = ["dataset", "task", "slice", "model", "rank"]
    for column in columns:
        header += [column, f"{column} low", f"{column} high", f"{column} vs", f"{column} diff",
                   f"{column} p adj"]
    header += ["datums", "datum_fingerprint", "comparable", "cell"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([_cell_text(h) for h in header])
    for row in rows:
        line = [row["dataset"], row["task"], slice_text(row["slice"]), row["model"], row["rank"]]
        for column in columns:
            metric = row["metrics"].get(column)
            if metric is None:
                line += [None] * 6
                continue
            interval = metric.get("interval") or {}
            comparison = metric.get("comparison") or {}
            line += [metric["value"], interval.get("low"), interval.get("high"),
                     comparison.get("against"), comparison.get("difference"),
                     comparison.get("p_value_adjusted")]
        line += [row["datums"], row["datum_fingerprint"], row["comparable"], row["cell"]]
        writer.writerow([_cell_text(v) for v in line])
    return out.getvalue()
