"""Comparison with a baseline run: an earlier night's output folder of the same task (or of the
same sweep), read back, and the records of comparison.jsonl (reference: pipelines/quality/gates.md).

comparison.jsonl has one line per metric record of either run, in the new run's order (records
only in the baseline last): `{"type", "parameters", "model", "slice", "status", "value",
"baseline_value", "change", "relative_change", "interval", "baseline_interval"}` with status
"both", "only_in_run" or "only_in_baseline". `change` is new minus old for a number, a dict of
the changes of the numeric fields for a dict of numbers (ROUGE, COCOSummary, judge pass/fail),
and null for anything else (curves, matrices), which carry `"equal"` instead;
`relative_change` is change / |old| (null where old is 0 or not a number).
"""

from __future__ import annotations

import json
import math

from evalbeam.pipelines.launch.common import UsageError

COMPARISON_JSONL = "comparison.jsonl"
USABLE = ("complete", "complete_with_rejections", "incomplete")


def record_problem(record) -> str | None:
    """Why a parsed metrics.jsonl line is not a metric record evalbeam wrote, or None: it must be
    an object with a string "type", and "parameters" and "slice" objects and "model" a string
    (or null) where present; the comparison, the gates and the report read no other fields
    without checking them."""
    if not isinstance(record, dict):
        return f"it is a JSON {type(record).__name__}, not an object"
    if not isinstance(record.get("type"), str):
        return 'it has no string "type"'
    for field in ("parameters", "slice"):
        if field in record and not isinstance(record[field], dict):
            return f'its "{field}" is not an object'
    if record.get("model") is not None and not isinstance(record["model"], str):
        return 'its "model" is not a string'
    return None


def read_records(path: str) -> list[dict]:
    """The metric records of a metrics.jsonl, read through transforms.input_files (a regular
    file of at most MAX_OUTPUT_BYTES, lines bounded, strict JSON: no NaN or Infinity, which
    evalbeam never writes). Raises ValueError naming the file and line of the first line that is
    not strict JSON, not a record (record_problem) or a second record of one identity (type,
    parameters, model and slice: gates.record_key) -- evalbeam writes each record once, so a
    repeated one was edited in, and which of the two a comparison or a gate used would depend
    on their order; FileMissing (a FileNotFoundError) without the file, FileRefused (an
    InputError) for a file that is not a regular file or too large."""
    from evalbeam.pipelines.quality.gates import record_key
    from evalbeam.transforms.input_files import iter_lines, json_problem

    records, lines_of = [], {}
    for number, line in iter_lines(path):
        record, problem = json_problem(line)
        if problem:
            raise ValueError(f"{path} line {number} is {problem}" if problem.startswith("not ")
                             else f"{path} line {number}: {problem}")
        problem = record_problem(record)
        if problem:
            raise ValueError(f"{path} line {number} is not a metric record: {problem}")
        key = record_key(record)
        if key in lines_of:
            raise ValueError(f"{path} line {number} repeats the record of line {lines_of[key]} "
                             f"({record['type']} of model {record.get('model')!r}, slice "
                             f"{json.dumps(record.get('slice', {}))}, the same parameters): "
                             "evalbeam writes each record once, so one of them was edited in")
        lines_of[key] = number
        records.append(record)
    return records


def check_baseline(folder: str, task: str | None = None, sweep: bool = False,
                   option: str = "--baseline", output: str | None = None) -> dict:
    """The run.json (or sweep.json) of a baseline folder, after checking that evalbeam wrote
    it, that it finished with metrics, (task given) that it is a run of that task, and (output
    given) that it is not the run's own --output. Raises UsageError with one paragraph (option:
    how the message names the folder)."""
    from evalbeam.transforms.io import join, read_json

    if output is not None:
        from evalbeam.transforms.outputs import same_path

        if same_path(folder, output):
            why = ("a sweep into its own folder keeps or replaces its cells, so each cell would be "
                   "compared with itself" if sweep else
                   "a run removes the earlier outputs of its folder when it starts, so no "
                   "baseline would be left to compare with")
            raise UsageError(
                f"{option} {folder} is this {'sweep' if sweep else 'run'}'s --output: {why}. Keep "
                f"each night in a folder of its own (runs/2026-11-28, ...) and give the previous "
                f"one as {option}.")
    name = "sweep.json" if sweep else "run.json"
    what = "an earlier `evalbeam sweep` output folder" if sweep else "an earlier run's output folder"
    try:
        info = read_json(join(folder, name))
    except FileNotFoundError:
        info = None
    except Exception as error:
        raise UsageError(f"{option} {folder}: cannot read its {name} ({error}); it must be {what}") from None
    if not isinstance(info, dict) or info.get("written_by") != "evalbeam" or \
            ("status" not in info):
        hint = ""
        if not sweep:
            try:
                read_json(join(folder, "sweep.json"))
                hint = " (it is a sweep's folder: use `evalbeam sweep ... --baseline` or name one cell, cells/<dataset>/<model>)"
            except Exception:
                pass
        raise UsageError(f"{option} {folder}: no {name} of evalbeam's there; it must be {what}{hint}")
    if sweep:
        return info
    if info["status"] not in USABLE:
        raise UsageError(f"{option} {folder}: that run did not finish (status {info['status']!r}); "
                         "a baseline must be a run that wrote its metrics")
    if task is not None and info.get("task") != task:
        raise UsageError(f"{option} {folder} is a run of {info.get('task')!r}, not of {task!r}")
    from apache_beam.io.filesystems import FileSystems

    metrics = join(folder, "metrics.jsonl")
    if not FileSystems.exists(metrics):
        raise UsageError(f"{option} {folder}: its run.json says {info['status']!r} but its "
                         "metrics.jsonl is missing")
    # read now, not when the run ends: a baseline that cannot be compared stops the run before
    # any work instead of costing the night's run its comparison and gates
    try:
        read_records(metrics)
    except Exception as error:
        raise UsageError(f"{option} {folder}: its metrics.jsonl cannot be used ({error})"
                         f"{_changed_since(info, metrics)}. Give an output folder of an earlier "
                         "run as evalbeam left it.") from None
    return info


def _changed_since(info: dict, path: str) -> str:
    """"; <changed_since's phrase>" when the file's size is not the one run.json records, else
    ""."""
    phrase = changed_since(info, path)
    return f"; {phrase}" if phrase else ""


def changed_since(info: dict, path: str) -> str | None:
    """"it changed since evalbeam wrote it: ..." when the size of the metrics.jsonl at path is
    not the one its run.json (info) records, else None (also when either is unknown)."""
    from apache_beam.io.filesystems import FileSystems

    recorded = _field(info, "files", "metrics.jsonl")
    try:
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    except Exception:
        return None
    if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded == size:
        return None
    return f"it changed since evalbeam wrote it: run.json records {recorded:,} bytes, it has {size:,}"


def changed_problem(phrase: str, baseline: str, gated: bool, where: str = "") -> dict:
    """The warning problem `baseline_changed`: the baseline's metrics.jsonl is not the file its
    run wrote (changed_since's phrase). Its values were used, but a change-bound gate against
    it is baseline_differs (failed): a hand-edited baseline must never pass a gate."""
    from evalbeam.transforms.outputs import WARNING, problem

    return problem(WARNING, "baseline_changed",
                   f"{where}the baseline's metrics.jsonl ({baseline}) is not the file its run "
                   f"wrote: {phrase}; comparison.jsonl compares with its values as they are now"
                   + ("; its change-bound gate checks are baseline_differs (failed)" if gated else ""))


def data_differences(info: dict, baseline_info: dict, sidecar: dict | None = None,
                     baseline_sidecar: dict | None = None) -> list[str]:
    """What shows that a run and its baseline were evaluated on different data, as phrases
    (empty: nothing does): the ground-truth datums evaluated (run.json's counts), the
    fingerprint of the datum ids evaluated where both run.json files record one ("datums":
    runs of this version on), and, where both runs recorded one (a sweep cell's
    leaderboard_inputs.json), the fingerprint of the datum ids of the whole dataset. The
    ground truth's files are named when something else differs, never alone: paths are
    recorded as typed, and a nightly job may copy the same ground truth to a dated folder.
    Prediction rows are the model's, not the data."""
    found = []

    def evaluated(run):
        value = _field(run, "counts", "groundtruths", "rows_evaluated")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    new, old = evaluated(info), evaluated(baseline_info)
    if new is not None and old is not None and new != old:
        found.append(f"ground-truth datums evaluated: {old} in the baseline, {new} in this run")
    ours, baselines = _object(info, "datums"), _object(baseline_info, "datums")
    if _text(ours.get("fingerprint")) and _text(baselines.get("fingerprint")) and \
            ours["fingerprint"] != baselines["fingerprint"]:
        found.append(f"datums evaluated: fingerprint {baselines['fingerprint']} "
                     f"({baselines.get('evaluated')} datums) in the baseline, {ours['fingerprint']} "
                     f"({ours.get('evaluated')}) in this run")
    mine = _object(sidecar, "datums", "{}")
    theirs = _object(baseline_sidecar, "datums", "{}")
    if _text(mine.get("fingerprint")) and _text(theirs.get("fingerprint")) and \
            mine["fingerprint"] != theirs["fingerprint"]:
        found.append(f"datum ids: fingerprint {theirs['fingerprint']} ({theirs.get('datums')} "
                     f"datums) in the baseline, {mine['fingerprint']} ({mine.get('datums')}) in "
                     "this run")
    if found:
        files = [_field(run, "inputs", "groundtruths", "files") for run in (baseline_info, info)]
        if files[0] != files[1] and all(isinstance(f, list) and f and all(map(_text, f))
                                        for f in files):
            found.append(f"ground-truth files: {', '.join(files[0])} in the baseline, "
                         f"{', '.join(files[1])} in this run")
    return found


def _field(document, *keys):
    """document[keys[0]][keys[1]]..., or None where a step is not an object or lacks the key:
    a baseline's run.json or sidecar may have been edited into any shape, and reading it must
    not fail the run that compares with it."""
    for key in keys:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def _object(document, *keys) -> dict:
    """_field when it is an object, else {}."""
    found = _field(document, *keys)
    return found if isinstance(found, dict) else {}


def _text(value) -> bool:
    return isinstance(value, str) and bool(value)


def differs_problem(differences: list[str], baseline: str, gated: bool, where: str = "") -> dict:
    """The warning problem `baseline_data_differs` (run.json's or sweep.json's problems)."""
    from evalbeam.transforms.outputs import WARNING, problem

    return problem(WARNING, "baseline_data_differs",
                   f"{where}the baseline {baseline} was evaluated on other data than this run ("
                   + "; ".join(differences) + "): comparison.jsonl compares different data"
                   + ("; its change-bound gate checks are baseline_differs (failed)" if gated else ""))


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _change(new, old):
    """(change, relative change) of two values, or (None, None) when they are not numbers or
    dicts of numbers."""
    if _numeric(new) and _numeric(old):
        change = new - old
        return change, (change / abs(old) if old != 0 else None)
    if isinstance(new, dict) and isinstance(old, dict):
        fields = sorted(k for k in new.keys() & old.keys() if _numeric(new[k]) and _numeric(old[k]))
        if fields and all(_numeric(v) or v is None for v in new.values()):
            changes = {k: new[k] - old[k] for k in fields}
            relative = {k: (changes[k] / abs(old[k]) if old[k] != 0 else None) for k in fields}
            return changes, relative
    return None, None


def compare(records: list[dict], baseline_records: list[dict]) -> list[dict]:
    """The rows of comparison.jsonl (module docstring), records in their given order, then those
    only in the baseline in theirs. Comparison records (paired comparisons within a run) are
    left out: they compare models, not runs."""
    from evalbeam.pipelines.quality.gates import record_key

    old = {record_key(r): r for r in baseline_records if r.get("type") != "Comparison"}
    seen = set()
    rows = []
    for record in records:
        if record.get("type") == "Comparison":
            continue
        key = record_key(record)
        head = {"type": record["type"], "parameters": record.get("parameters", {}),
                "model": record.get("model"), "slice": record.get("slice", {})}
        before = old.get(key)
        if before is None:
            rows.append(dict(head, status="only_in_run", value=record.get("value"),
                             interval=record.get("interval")))
            continue
        seen.add(key)
        change, relative = _change(record.get("value"), before.get("value"))
        row = dict(head, status="both", value=record.get("value"),
                   baseline_value=before.get("value"), change=change, relative_change=relative,
                   interval=record.get("interval"), baseline_interval=before.get("interval"))
        if change is None:
            row["equal"] = record.get("value") == before.get("value")
        rows.append(row)
    for key, record in old.items():
        if key not in seen:
            rows.append({"type": record["type"], "parameters": record.get("parameters", {}),
                         "model": record.get("model"), "slice": record.get("slice", {}),
                         "status": "only_in_baseline", "baseline_value": record.get("value"),
                         "baseline_interval": record.get("interval")})
    return rows


def comparison_summary(rows: list[dict]) -> dict:
    """run.json's "comparison" section: how many records each status has."""
    counts = {"both": 0, "only_in_run": 0, "only_in_baseline": 0}
    for row in rows:
        counts[row["status"]] += 1
    changed = sum(1 for r in rows if r["status"] == "both" and
                  (r.get("equal") is False or (r.get("change") not in (None, 0, 0.0) and
                                               not (isinstance(r["change"], dict) and not any(r["change"].values())))))
    return dict(counts, changed=changed)


def write_rows(rows: list[dict], path: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path) as out:
        for row in rows:
            out.write((json.dumps(row, sort_keys=False, allow_nan=False) + "\n").encode("utf-8"))
