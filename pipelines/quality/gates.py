"""Quality gates: thresholds on a run's metrics, checked after the run, that a scheduled job can
fail on (reference: pipelines/quality/gates.md).

A gate file is TOML with one `[[gate]]` table per gate (or the same tables in a sweep manifest).
A gate selects metric records by type (`metric`), numeric field of a dict value (`field`),
parameters (`parameters`, `label`), model, slice (`slice` = one slice, `every_slice` = every
slice over these keys; neither: the whole dataset) and, in a sweep, dataset; every selected
record is one check. A check bounds the value (`min`, `max`) and/or its change against the same
record of a baseline run (`max_drop`, `max_rise`, absolute; `max_relative_drop`,
`max_relative_rise`, a fraction of |baseline value|). `require = "interval"` makes a check pass
only when the whole confidence interval clears the bound (value bounds: the record's interval;
change bounds: the interval's ends minus the baseline's value), so bootstrap or judge noise does
not decide it.

Verdicts: "pass"; "fail"; "missing" (no record matched: a label, slice value or threshold the run
did not produce), "missing_baseline" (a change bound whose record the baseline lacks) and
"baseline_differs" (a change bound against a baseline evaluated on other data) all count as
failed, since a gate that checks nothing must not pass silently. What can be known
before the run (metric types, models, slice keys, fields, --bootstrap for interval gates,
--baseline for change gates) is checked then (`check_gates`), an error exits 2.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field as dc_field

from evalbeam.pipelines.launch.common import UsageError

VALUE_BOUNDS = ("min", "max")
CHANGE_BOUNDS = ("max_drop", "max_rise", "max_relative_drop", "max_relative_rise")
KEYS = {"name", "metric", "field", "parameters", "label", "model", "slice", "every_slice",
        "dataset", "require"} | set(VALUE_BOUNDS) | set(CHANGE_BOUNDS)
PASS, FAIL, MISSING, MISSING_BASELINE = "pass", "fail", "missing", "missing_baseline"
BASELINE_DIFFERS = "baseline_differs"
FAILING = (FAIL, MISSING, MISSING_BASELINE, BASELINE_DIFFERS)
GATES_JSON = "gates.json"

# Metrics (or fields of dict-valued metrics) where a smaller value is better; a drop bound on
# them guards an improvement, which is refused as a likely mistake. Everything else in
# evalbeam's outputs is better when higher, except where neither holds (UNDIRECTED).
LOWER_IS_BETTER = {"ECE", "MCE", "BrierScore", "Hallucination", "Bias", "Toxicity", "Sexism",
                   "Stereotypes", "ContactInformation", "LanguageMismatch", "Perplexity",
                   "GPTScoreTranslation", "GPTScoreSummarization", "GPTScoreQA",
                   "GPTScoreSummarizationNoReference", "ToxicityClassifier", "FairnessBias"}
LOWER_IS_BETTER_FIELDS = {"fail", "retrieval_failure", "generation_failure", "parse_failure",
                          "longest_repeated_substring", "compression_ratio"}
UNDIRECTED = {"Queries", "Counts", "SummaryCoherence"}
# records whose value is a curve or a matrix: nothing a bound can apply to
NOT_NUMBERS = {"PrecisionRecallCurve", "DetailedPrecisionRecallCurve", "ConfusionMatrix",
               "ReliabilityDiagram", "InterpolatedPrecisionRecallCurve"}


def direction(metric: str, field: str | None) -> str:
    """"higher", "lower" or "either" (no bound direction is refused)."""
    if field in LOWER_IS_BETTER_FIELDS or (field is None and metric in LOWER_IS_BETTER):
        return "lower"
    if metric in UNDIRECTED or field in ("tp", "fp", "fn", "tn", "datums", "sys_len", "ref_len"):
        return "either"
    return "higher"


@dataclass(frozen=True)
class Gate:
    index: int
    name: str
    metric: str
    field: str | None = None
    parameters: dict = dc_field(default_factory=dict)
    label: str | None = None
    model: str | None = None
    slice: dict | None = None           # one slice; {} is the whole dataset
    every_slice: tuple | None = None    # every slice over exactly these keys
    dataset: str | None = None
    require: str = "value"
    bounds: dict = dc_field(default_factory=dict)

    @property
    def needs_baseline(self) -> bool:
        return any(b in self.bounds for b in CHANGE_BOUNDS)

    def describe(self) -> str:
        what = self.metric + (f".{self.field}" if self.field else "")
        where = [f"model {self.model}"] if self.model else []
        if self.dataset:
            where.append(f"dataset {self.dataset}")
        if self.every_slice:
            where.append(f"every slice of {','.join(self.every_slice)}")
        elif self.slice:
            where.append("slice " + ",".join(f"{k}={v}" for k, v in sorted(self.slice.items())))
        bounds = ", ".join(f"{k} {v:g}" for k, v in self.bounds.items())
        return f"{what} ({'; '.join(where + [bounds])})" if where else f"{what} ({bounds})"


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{what} must be a finite number; got {value!r}")
    return float(value)


# Gates of one file or manifest. Real gate files hold a few to a few dozen; every_slice makes one
# gate many checks. Each gate scans every record, so the time and memory of the checks grow with
# gates x records (what that cost: tests/benchmarks/README.md, "Measurements behind the design").
MAX_GATES = 1_000


def parse_gates(tables, where: str) -> list[Gate]:
    """The gates of a list of [[gate]] tables (where: the file, for messages); raises
    UsageError naming the gate and the key at fault."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{where}: gates are [[gate]] tables")
    if len(tables) > MAX_GATES:
        raise UsageError(f"{where}: {len(tables):,} [[gate]] tables, more than the {MAX_GATES:,} a "
                         "gate file may hold; each gate is checked against every record, so that "
                         "many would cost the run minutes. Gate the headline metrics, and use "
                         "every_slice for one gate per slice.")
    gates = []
    for i, table in enumerate(tables, 1):
        at = f"{where}: gate {i}" + (f" ({table['name']!r})" if isinstance(table.get("name"), str) else "")
        unknown = sorted(set(table) - KEYS)
        if unknown:
            raise UsageError(f"{at}: unknown key(s) {', '.join(unknown)}; a gate takes "
                             f"{', '.join(sorted(KEYS))}")
        metric = table.get("metric")
        if not isinstance(metric, str) or not metric:
            raise UsageError(f"{at}: `metric` (a record type, e.g. \"Accuracy\") is required")
        for key in ("field", "label", "model", "dataset", "name"):
            if key in table and not isinstance(table[key], str):
                raise UsageError(f"{at}: `{key}` must be a string")
        parameters = table.get("parameters", {})
        if not isinstance(parameters, dict):
            raise UsageError(f"{at}: `parameters` must be a table, e.g. {{score_threshold = 0.5}}")
        slice_value = table.get("slice")
        if slice_value is not None and not (isinstance(slice_value, dict) and all(
                isinstance(v, (str, int, float, bool)) for v in slice_value.values())):
            raise UsageError(f"{at}: `slice` must be a table of metadata values, e.g. "
                             "{region = \"eu\"} ({} is the whole dataset)")
        every = table.get("every_slice")
        if every is not None:
            if slice_value is not None:
                raise UsageError(f"{at}: give `slice` or `every_slice`, not both")
            every = [every] if isinstance(every, str) else every
            if not isinstance(every, list) or not every or not all(isinstance(k, str) and k for k in every):
                raise UsageError(f"{at}: `every_slice` is a metadata key or a list of keys")
            every = tuple(sorted(k.strip() for key in every for k in key.split(",")))
        require = table.get("require", "value")
        if require not in ("value", "interval"):
            raise UsageError(f"{at}: `require` is \"value\" or \"interval\"; got {require!r}")
        bounds = {k: _number(table[k], f"{at}: `{k}`") for k in VALUE_BOUNDS + CHANGE_BOUNDS
                  if k in table}
        if not bounds:
            raise UsageError(f"{at}: no bound: give min, max, max_drop, max_rise, "
                             "max_relative_drop or max_relative_rise")
        if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
            raise UsageError(f"{at}: min {bounds['min']} is above max {bounds['max']}")
        for k in CHANGE_BOUNDS:
            if bounds.get(k, 0.0) < 0:
                raise UsageError(f"{at}: `{k}` is an allowed change and must be >= 0")
        field_name = table.get("field")
        way = direction(metric, field_name)
        guarded = [k for k in bounds if k.endswith("drop")] if way == "lower" else \
            [k for k in bounds if k.endswith("rise")] if way == "higher" else []
        if guarded:
            better = "a drop" if way == "lower" else "a rise"
            other = guarded[0].replace("drop", "RISE").replace("rise", "drop").replace("RISE", "rise")
            raise UsageError(f"{at}: {metric}{'.' + field_name if field_name else ''} is better "
                             f"when {way}, so {better} is an improvement and `{guarded[0]}` would "
                             f"fail on it; did you mean `{other}`?")
        gates.append(Gate(
            index=i, name=table.get("name") or "", metric=metric, field=field_name,
            parameters=parameters, label=table.get("label"), model=table.get("model"),
            slice=None if every else (slice_value if slice_value is not None else {}),
            every_slice=every, dataset=table.get("dataset"), require=require, bounds=bounds))
    return gates


def load_gates(path: str) -> list[Gate]:
    """The gates of a TOML file (`[[gate]]` tables), read through transforms.input_files (a
    regular file of at most MAX_SETTINGS_BYTES, strict UTF-8, nested at most 64 levels); raises
    UsageError for a missing, unusable or malformed file."""
    from evalbeam.transforms.input_files import FileRefused, load_toml

    try:
        document, _ = load_toml(path, what=f"--gates {path}")
    except FileRefused as error:
        raise UsageError(error.message) from None
    unknown = sorted(set(document) - {"gate"})
    if unknown:
        raise UsageError(f"--gates {path}: unknown table(s) {', '.join(unknown)}; a gate file holds "
                         "[[gate]] tables")
    if not document.get("gate"):
        raise UsageError(f"--gates {path}: no [[gate]] table")
    return parse_gates(document["gate"], path)


def check_gates(gates: list[Gate], *, metric_types, models, slices, intervals: bool,
                baseline: bool, datasets=None, where: str = "--gates") -> None:
    """Refuse, before the run, gates that could not check anything: an unknown metric type
    (`metric_types`: every type the task can write), model, slice key set (`slices`: the
    run's --slice key tuples) or dataset; `require = "interval"` without --bootstrap; a change
    bound without --baseline. Raises UsageError."""
    spec_keys = {tuple(sorted(s)) for s in slices}
    for gate in gates:
        at = f"{where}: gate {gate.index} ({gate.describe()})"
        if gate.metric not in metric_types:
            raise UsageError(f"{at}: this task writes no {gate.metric!r} records; its metric types "
                             f"are {', '.join(sorted(metric_types))}")
        if gate.metric in NOT_NUMBERS:
            raise UsageError(f"{at}: {gate.metric} records are curves or matrices; a gate bounds a "
                             "number (a metric, or a `field` of one)")
        if gate.model is not None and gate.model not in models:
            raise UsageError(f"{at}: no model {gate.model!r} in this run (models: "
                             f"{', '.join(sorted(models))})")
        keys = gate.every_slice or (tuple(sorted(gate.slice)) if gate.slice else None)
        if keys is not None and keys not in spec_keys:
            given = ", ".join(",".join(k) for k in sorted(spec_keys)) or "none"
            raise UsageError(f"{at}: the run has no --slice {','.join(keys)} (its slices: {given})")
        if datasets is not None and gate.dataset is not None and gate.dataset not in datasets:
            raise UsageError(f"{at}: no dataset {gate.dataset!r} in the sweep")
        if gate.require == "interval" and not intervals:
            raise UsageError(f"{at}: require = \"interval\" needs intervals: run with --bootstrap R "
                             "(e.g. 1000)")
        if gate.needs_baseline and not baseline:
            raise UsageError(f"{at}: a change bound ({', '.join(b for b in gate.bounds if b in CHANGE_BOUNDS)}) "
                             "needs --baseline DIR, an earlier run's output folder")


# ---- evaluation -------------------------------------------------------------------------------

def record_key(record: dict) -> str:
    """The identity of a record across runs: type, parameters, model and slice."""
    return json.dumps([record["type"], record.get("parameters", {}), record.get("model"),
                       record.get("slice", {})], sort_keys=True, separators=(",", ":"))


def _same(wanted, actual) -> bool:
    """A gate's `parameters` value against a record's (wanted a subset of actual). A bool
    matches only the same bool (Python's True == 1 == 1.0 must not make `hardmax = 1` select
    `hardmax: true`); numbers match across int and float with a relative tolerance of 1e-9
    (evalbeam writes each parameter with one type, and thresholds carry rounding:
    iou_threshold 0.8999999999999999); anything else by equality."""
    if isinstance(wanted, bool) or isinstance(actual, bool):
        return isinstance(wanted, bool) and isinstance(actual, bool) and wanted is actual
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(k in actual and _same(v, actual[k])
                                                for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(actual, list) and len(wanted) == len(actual) and all(
            _same(w, a) for w, a in zip(wanted, actual))
    if isinstance(wanted, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(wanted, actual, rel_tol=1e-9, abs_tol=1e-12)
    return wanted == actual


def _slice_text(values: dict) -> str:
    return json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _slice_matches(gate: Gate, slice_value: dict) -> bool:
    """A run keeps apart the slices whose metadata values differ as JSON (region = true, 1 and
    1.0 are three slices, shown so in metrics.jsonl), so a gate's `slice` selects the one
    slice whose values are the same JSON: `{region = 1}` is `"region": 1`, not 1.0 or true."""
    if gate.every_slice is not None:
        return tuple(sorted(slice_value)) == gate.every_slice
    return _slice_text(gate.slice) == _slice_text(slice_value)


def selects(gate: Gate, record: dict) -> bool:
    if record.get("type") != gate.metric:
        return False
    if gate.model is not None and record.get("model") != gate.model:
        return False
    params = record.get("parameters") or {}
    if not _same(gate.parameters, params):
        return False
    if gate.label is not None:
        label = params.get("label")
        if label != gate.label and not (isinstance(label, dict) and label.get("value") == gate.label):
            return False
    return _slice_matches(gate, record.get("slice") or {})


def scalar_of(record: dict, field: str | None):
    """(value, interval {low, high} or None) of a record, or (None, reason)."""
    value, interval = record.get("value"), record.get("interval")
    if field is not None:
        if not isinstance(value, dict) or field not in value:
            return None, f"{record['type']} has no field {field!r}"
        value = value[field]
        interval = interval.get(field) if isinstance(interval, dict) else None
    elif isinstance(value, dict):
        numeric = sorted(k for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        if not numeric:
            return None, f"{record['type']}'s value is not a number"
        return None, f"{record['type']} has several values; name one with `field` ({', '.join(numeric)})"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, f"{record['type']}'s value is not a number"
    if interval is not None and not ("low" in interval and "high" in interval):
        interval = None
    return float(value), interval


def _bound_check(gate: Gate, value: float, interval, base: float | None) -> list[str]:
    """The bounds a value breaks, as phrases (empty: it passes)."""
    use_interval = gate.require == "interval"
    low = interval["low"] if use_interval and interval else value
    high = interval["high"] if use_interval and interval else value
    what = "the interval" if use_interval else "the value"
    broken = []
    b = gate.bounds
    if "min" in b and not (low is not None and low >= b["min"]):
        broken.append(f"{what} {_fmt(low)} is below min {b['min']:g}")
    if "max" in b and not (high is not None and high <= b["max"]):
        broken.append(f"{what} {_fmt(high)} is above max {b['max']:g}")
    if base is not None:
        drop, rise = base - low, high - base      # the worst change the interval allows
        scale = abs(base)
        if "max_drop" in b and drop > b["max_drop"] + 1e-12:
            broken.append(f"{what} fell {drop:.6g} below the baseline {base:.6g} (max_drop {b['max_drop']:g})")
        if "max_rise" in b and rise > b["max_rise"] + 1e-12:
            broken.append(f"{what} rose {rise:.6g} above the baseline {base:.6g} (max_rise {b['max_rise']:g})")
        for key, change in (("max_relative_drop", drop), ("max_relative_rise", rise)):
            if key in b and change > 0:
                relative = math.inf if scale == 0 else change / scale
                if relative > b[key] + 1e-12:
                    broken.append(f"{what} changed {relative:.4%} of the baseline {base:.6g} "
                                  f"({key} {b[key]:g})")
    return broken


def _fmt(x) -> str:
    return "none" if x is None else f"{x:.6g}"


def evaluate(gates: list[Gate], records, baseline_records=None, dataset: str | None = None,
             baseline_differs: list[str] | None = None,
             baseline_changed: str | None = None) -> list[dict]:
    """Every check of every gate against a run's records (iterable of dicts) and, for change
    bounds, the baseline's (None: no baseline). dataset: the sweep cell's dataset (gates naming
    another dataset are skipped); checks then carry it. baseline_differs: what shows that the
    baseline was evaluated on other data (comparison.data_differences): a change-bound check is
    then BASELINE_DIFFERS (failed), its numbers kept; so is it when baseline_changed says how
    the baseline's metrics.jsonl changed since its run wrote it (comparison.changed_since).
    Returns check dicts in gate order."""
    records = [r for r in records if r.get("type") != "Comparison" or
               any(g.metric == "Comparison" for g in gates)]
    by_key = {}
    if baseline_records is not None:
        by_key = {record_key(r): r for r in baseline_records}
    checks = []
    for gate in gates:
        if gate.dataset is not None and dataset is not None and gate.dataset != dataset:
            continue
        chosen = sorted((r for r in records if selects(gate, r)), key=record_key)
        common = {"gate": gate.index, "name": gate.name or gate.describe(), "metric": gate.metric,
                  "field": gate.field, "require": gate.require, "bounds": gate.bounds}
        if dataset is not None:
            common["dataset"] = dataset
        if not chosen:
            checks.append(dict(common, parameters=gate.parameters, model=gate.model,
                               slice=gate.slice if gate.every_slice is None else
                               {k: "*" for k in gate.every_slice},
                               value=None, interval=None, baseline_value=None, change=None,
                               verdict=MISSING,
                               reason="no record matched: the run did not produce this metric "
                                      "for this model, slice and parameters"))
            continue
        for record in chosen:
            value, interval = scalar_of(record, gate.field)
            check = dict(common, parameters=record.get("parameters", {}), model=record.get("model"),
                         slice=record.get("slice", {}), value=value,
                         interval=({"low": interval["low"], "high": interval["high"]}
                                   if isinstance(interval, dict) else None),
                         baseline_value=None, change=None)
            if value is None:
                checks.append(dict(check, verdict=FAIL, reason=interval))
                continue
            base = None
            if gate.needs_baseline:
                old = by_key.get(record_key(record))
                base, _ = scalar_of(old, gate.field) if old is not None else (None, None)
                if base is None:
                    checks.append(dict(check, verdict=MISSING_BASELINE,
                                       reason="the baseline run has no such record to compare with"))
                    continue
                check.update(baseline_value=base, change=value - base)
            if gate.require == "interval" and check["interval"] is None:
                checks.append(dict(check, verdict=FAIL,
                                   reason="require = \"interval\" but this record has no interval"))
                continue
            broken = _bound_check(gate, value, check["interval"], base)
            if base is not None and baseline_differs:
                checks.append(dict(check, verdict=BASELINE_DIFFERS, reason=(
                    "the baseline was evaluated on other data (" + "; ".join(baseline_differs)
                    + "): a change against it says nothing about a regression"
                    + (f"; also {'; '.join(broken)}" if broken else ""))))
                continue
            if base is not None and baseline_changed:
                checks.append(dict(check, verdict=BASELINE_DIFFERS, reason=(
                    f"the baseline's metrics.jsonl is not the file its run wrote ({baseline_changed})"
                    ": a change against edited values says nothing about a regression"
                    + (f"; also {'; '.join(broken)}" if broken else ""))))
                continue
            checks.append(dict(check, verdict=FAIL if broken else PASS,
                               reason="; ".join(broken) if broken else "within bounds"))
    return checks


def summarize(checks: list[dict]) -> dict:
    """gates.json's head: passed (every check passed), counts per verdict."""
    counts = {}
    for c in checks:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    failed = sum(n for v, n in counts.items() if v in FAILING)
    return {"passed": failed == 0, "checks": len(checks), "failed": failed, "verdicts": counts}


def gates_document(checks: list[dict], gates_source: str, baseline: str | None) -> dict:
    return dict(summarize(checks), gates_file=gates_source, baseline=baseline, results=checks)


def failed_lines(checks: list[dict], limit: int = 20) -> list[str]:
    """One line per failed check, for the printed summary (failed checks first)."""
    lines = []
    for c in checks:
        if c["verdict"] not in FAILING:
            continue
        where = [c["model"] or "every model"]
        if c.get("dataset"):
            where.insert(0, c["dataset"])
        if c["slice"]:
            where.append(",".join(f"{k}={v}" for k, v in sorted(c["slice"].items())))
        params = {k: v for k, v in c["parameters"].items()} if c["parameters"] else {}
        shown = "".join(f" {k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(params.items()))
        lines.append(f"FAIL {c['metric']}{'.' + c['field'] if c['field'] else ''}{shown} "
                     f"[{' / '.join(str(w) for w in where)}]: {c['reason']}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more failed checks (gates.json)"]
    return lines
