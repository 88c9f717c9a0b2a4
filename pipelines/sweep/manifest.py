"""The sweep manifest (SWEEP.toml): its tables and keys, its checks, and its cells.

    [sweep]                      # optional: settings of the whole sweep
    bootstrap = 1000             # replicates: intervals and the leaderboard's comparisons
    baseline = "resnet"          # compare every model with this one (default: each group's best)

    [[dataset]]
    name = "alpha"
    task = "classification"
    groundtruths = "data/{dataset}/gt.jsonl"
    options = { slice = ["region"] }

    [[model]]
    name = "resnet"
    predictions = "data/{dataset}/resnet.jsonl"   # or a table: { alpha = "...", beta = "..." }

A cell is one (dataset, model) pair: the run `evalbeam <task> --groundtruths G --predictions
MODEL=P [options]` would be, with the options of the dataset, then the model's, then a matching
[[cell]] table's (later ones win), then the [sweep] settings, then, for text cells, the [judge]
table's (each key K as --judge_K). Everything a cell's command line can say is checked by the
task's own parser, so a manifest accepts exactly the options `evalbeam <task>` accepts.
Reference: pipelines/sweep/sweep.md.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

from evalbeam.pipelines.launch.common import UsageError

SWEEP_KEYS = {"bootstrap", "confidence", "bootstrap_seed", "baseline", "max_rejected_fraction",
              "headline"}
DATASET_KEYS = {"name", "task", "groundtruths", "options", "models", "headline", "baseline"}
MODEL_KEYS = {"name", "predictions", "datasets", "options"}
CELL_KEYS = {"dataset", "model", "options"}
TOP_KEYS = {"sweep", "judge", "dataset", "model", "cell", "gate"}
# Cells of one sweep: each is a run with its own folder, run.json and leaderboard rows (100
# models over 100 datasets); past that, one manifest is a mistake or several sweeps, and its
# cells would cost the launcher unbounded time and memory (3,000 x 3,000 tables: 9 M cells).
MAX_CELLS = 10_000
# options a cell may not set: the sweep sets them (inputs, output folder, comparisons, intervals)
RESERVED = {"groundtruths", "predictions", "output", "overwrite", "quiet", "compare_to",
            "bootstrap", "confidence", "bootstrap_seed", "max_rejected_fraction"}
OPTION_NAME = re.compile(r"[a-z][a-z0-9_]*")   # with fullmatch: "$" lets a final newline in


class ManifestError(UsageError):
    """A manifest that cannot run; .errors holds one message per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


@dataclass
class Cell:
    """One (dataset, model) evaluation: its id (dataset/model, also its folder under cells/),
    task, the command line it runs (without --output) and where in the manifest it comes from."""

    id: str
    dataset: str
    model: str
    task: str
    groundtruths: str
    predictions: str
    options: dict
    line: int
    argv: list = field(default_factory=list)


@dataclass
class Manifest:
    path: str
    sweep: dict
    judge: dict
    datasets: list
    models: list
    cells: list
    gates: list = field(default_factory=list)     # the [[gate]] tables (pipelines/quality/gates.py)


class Lines:
    """Where a key of the manifest is written: TOML parsers keep no positions, so the text is
    scanned for the table header ([name] or the n-th [[name]]) and the key's line after it."""

    HEADER = re.compile(r"^\s*\[(\[)?\s*([A-Za-z0-9_.\-]+)\s*\]")

    def __init__(self, text: str):
        self.lines = text.splitlines()
        # {table name: line numbers of its headers}, found once: a search per lookup made a
        # manifest of thousands of tables quadratic (3,000 datasets: minutes)
        self.headers: dict[str, list[int]] = {}
        for number, line in enumerate(self.lines, 1):
            match = self.HEADER.match(line)
            if match is not None:
                self.headers.setdefault(match.group(2), []).append(number)

    def of(self, table: str, index: int | None = None, key: str | None = None) -> int:
        found = self.headers.get(table, [])
        at = 0 if index is None else index
        start = found[at] if 0 <= at < len(found) else None
        if start is None:
            return 1
        if key is None:
            return start
        pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
        for number in range(start + 1, len(self.lines) + 1):
            line = self.lines[number - 1]
            if self.HEADER.match(line):
                break
            if pattern.match(line):
                return number
        return start


def _placeholders(text: str) -> list[str]:
    """The {names} in a path; raises ValueError on unbalanced braces."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def _fill(text: str, values: dict, where: str, errors: list) -> str | None:
    try:
        names = _placeholders(text)
    except ValueError as error:
        errors.append(f"{where}: {text!r} is not a path with placeholders ({error}); write "
                      "a literal brace as {{ or }}")
        return None
    unknown = sorted({n for n in names if n not in values})
    if unknown:
        errors.append(f"{where}: the placeholder {{{unknown[0]}}} in {text!r} has no value here "
                      f"(known: {', '.join('{' + k + '}' for k in sorted(values))})")
        return None
    return text.format(**values)


# one plain folder name on every OS and object store: ASCII letters, digits, '_', '.', '-' (so no
# separator, drive colon, space, control character or any of <>:"|?*)
PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
# device names Windows reserves, in any case, alone or before an extension ("nul.txt")
WINDOWS_DEVICE = re.compile(r"(CON|PRN|AUX|NUL|COM[0-9]|LPT[0-9])(\..*)?", re.IGNORECASE)


def name_problem(name: str) -> str | None:
    """Why a dataset or model name cannot be a folder of DIR/cells/<dataset>/<model>/ on every
    OS and object store, or None. '.', '..' and any name starting with '.' would put a cell's
    files in cells/ or DIR itself (or above it), or hide them; Windows drops a trailing dot ('a.'
    and 'a' would be one folder) and cannot create a folder named after a device (CON, NUL.txt,
    com1)."""
    if not PLAIN_NAME.fullmatch(name):
        return ("may hold only letters, digits, '_', '.' and '-' (no space, control character, "
                "separator or any of < > : \" | ? *)")
    if name.startswith("."):
        return "may not start with '.' ('.' and '..' are not folders of their own)"
    if name.endswith("."):
        return "may not end with '.' (Windows drops it, so 'a.' and 'a' would be one folder)"
    if WINDOWS_DEVICE.fullmatch(name):
        return ("is a device name on Windows (CON, PRN, AUX, NUL, COM0-COM9, LPT0-LPT9, in any "
                "case, with or without an extension), which no folder there can have")
    return None


def _check_keys(table: dict, known: set, where: str, errors: list, lines: Lines, name: str,
                index: int | None) -> None:
    for key in sorted(set(table) - known):
        errors.append(f"{where}: unknown key {key!r} at line {lines.of(name, index, key)}; "
                      f"known keys: {', '.join(sorted(known))}")


def _names(values, what: str, where: str, errors: list) -> list[str] | None:
    if values is None:
        return None
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        errors.append(f"{where}: {what} must be a list of names")
        return None
    return values


def load(path: str) -> Manifest:
    """Read and check a manifest, expand its cells; raises ManifestError (every problem found,
    each with its manifest line) or UsageError (the file cannot be read).

    The tables are checked first, every one of them (so one run lists every mistake); the cells
    are expanded only from tables without a problem, then checked as cells."""
    from evalbeam.transforms.input_files import FileRefused, load_toml

    try:
        # a regular file, size and depth bounded, strict UTF-8 (transforms/input_files.py)
        data, text = load_toml(path, what=f"the sweep manifest {path}")
    except FileRefused as error:
        raise UsageError(error.message) from None
    lines = Lines(text)
    errors: list[str] = []
    sweep, judge = _settings_tables(data, path, lines, errors)
    datasets = _array(data, "dataset", errors)
    models = _array(data, "model", errors)
    cells_tables = _array(data, "cell", errors)
    if not datasets:
        errors.append(f"{path}: no [[dataset]] table: a sweep needs at least one dataset")
    if not models:
        errors.append(f"{path}: no [[model]] table: a sweep needs at least one model")
    seen_datasets = _check_datasets(datasets, lines, errors)
    seen_models = _check_models(models, seen_datasets, lines, errors)
    for i, d in enumerate(datasets):
        for model in _names(d.get("models"), "models", f"[[dataset]] #{i + 1}", errors) or []:
            if model not in seen_models:
                errors.append(f"[[dataset]] #{i + 1} (line {lines.of('dataset', i, 'models')}): "
                              f"models names {model!r}, which no [[model]] defines")
    overrides = _check_cell_tables(cells_tables, seen_datasets, seen_models, lines, errors)
    if errors:
        raise ManifestError(errors)

    cells = _expand(path, datasets, models, overrides, lines, errors)
    overridden = {key for key in overrides} - {(c.dataset, c.model) for c in cells}
    for key in sorted(overridden):
        errors.append(f"[[cell]] {key[0]}/{key[1]} (line {overrides[key][1]}): no cell of the sweep "
                      "is that pair (the model does not apply to the dataset)")
    if not cells and not errors:
        errors.append(f"{path}: no cell: no model applies to any dataset")
    gates = data.get("gate", [])
    if gates:
        from evalbeam.pipelines.quality.gates import parse_gates

        try:
            parse_gates(gates, path)
        except UsageError as error:
            errors.append(str(error))
    if errors:
        raise ManifestError(errors)
    return Manifest(path, sweep, judge, datasets, models, cells, gates)


def _settings_tables(data: dict, path: str, lines: Lines, errors: list) -> tuple[dict, dict]:
    """(the [sweep] table, the [judge] table), each {} when it is not a table, after checking
    the manifest's top-level keys and both tables' keys."""
    for key in sorted(set(data) - TOP_KEYS):
        errors.append(f"{path} (line {lines.of(key) if isinstance(data[key], dict) else _top_line(lines, key)}): "
                      f"unknown key {key!r}; a manifest has [sweep], [judge], [[dataset]], "
                      "[[model]], [[cell]] and [[gate]] tables")
    sweep = data.get("sweep", {})
    judge = data.get("judge", {})
    if not isinstance(sweep, dict):
        errors.append("[sweep] must be a table")
        sweep = {}
    if not isinstance(judge, dict):
        errors.append("[judge] must be a table")
        judge = {}
    _check_keys(sweep, SWEEP_KEYS, "[sweep]", errors, lines, "sweep", None)
    # checked whatever the cells: a table that no cell reads is still a mistake to report
    settings = judge_settings() if judge else {}
    for key, value in judge.items():
        where = f"[judge] (line {lines.of('judge', None, key)})"
        if not OPTION_NAME.fullmatch(key) or key.startswith("judge_"):
            errors.append(f"{where}: {key!r} is not a judge "
                          "setting; write the option --judge_NAME as NAME (e.g. url, model, rpm)")
        elif key not in settings:
            errors.append(f"{where}: unknown key {key!r} (the text task has no option "
                          f"--judge_{key}){_secret_hint(key)}; known keys: {', '.join(sorted(settings))}")
        else:
            problem = setting_problem(settings[key], value)
            if problem:
                errors.append(f"{where}: {key} {problem} (the text task's option --judge_{key})")
    return sweep, judge


def _check_datasets(datasets: list[dict], lines: Lines, errors: list) -> dict[str, int]:
    """{name: line} of the [[dataset]] tables with a usable name, after checking each table."""
    from evalbeam.pipelines.tasks.registry import TASKS

    seen: dict[str, int] = {}
    for i, d in enumerate(datasets):
        where = f"[[dataset]] #{i + 1} (line {lines.of('dataset', i)})"
        _check_keys(d, DATASET_KEYS, where, errors, lines, "dataset", i)
        for key in ("name", "task", "groundtruths"):
            if not isinstance(d.get(key), str) or not d.get(key):
                errors.append(f"{where}: needs {key} = \"...\"")
        name = d.get("name")
        if isinstance(name, str) and name:
            problem = name_problem(name)
            if problem:
                errors.append(f"{where}: the name {name!r} (the folder cells/<dataset>/) {problem}")
            elif name in seen:
                errors.append(f"{where}: a dataset named {name!r} is already defined at line "
                              f"{seen[name]}")
            else:
                seen[name] = lines.of("dataset", i)
        task = d.get("task")
        if isinstance(task, str) and task and task not in TASKS:
            errors.append(f"{where} (line {lines.of('dataset', i, 'task')}): unknown task {task!r}; "
                          f"tasks: {', '.join(TASKS)}")
        if not isinstance(d.get("options", {}), dict):
            errors.append(f"{where}: options must be a table, e.g. options = {{ slice = [\"region\"] }}")
    return seen


def _check_models(models: list[dict], datasets: dict, lines: Lines, errors: list) -> dict[str, int]:
    """{name: line} of the [[model]] tables with a usable name, after checking each table
    (datasets: the defined datasets, which its predictions and datasets keys may name)."""
    seen: dict[str, int] = {}
    for i, m in enumerate(models):
        where = f"[[model]] #{i + 1} (line {lines.of('model', i)})"
        _check_keys(m, MODEL_KEYS, where, errors, lines, "model", i)
        name = m.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f"{where}: needs name = \"...\"")
        elif name_problem(name):
            errors.append(f"{where}: the name {name!r} (the folder cells/<dataset>/<model>/) "
                          f"{name_problem(name)}")
        elif name == "groundtruths":
            errors.append(f"{where}: a model may not be named 'groundtruths' (the ground truths' "
                          "name in every cell)")
        elif name in seen:
            errors.append(f"{where}: a model named {name!r} is already defined at line {seen[name]}")
        else:
            seen[name] = lines.of("model", i)
        predictions = m.get("predictions")
        if not (isinstance(predictions, str) and predictions) and not (
                isinstance(predictions, dict) and predictions
                and all(isinstance(v, str) for v in predictions.values())):
            errors.append(f"{where}: needs predictions = \"path/{{dataset}}/...\" or a table "
                          "{ dataset name = \"path\", ... }")
        if isinstance(predictions, dict):
            for dataset in sorted(set(predictions) - set(datasets)):
                errors.append(f"{where} (line {lines.of('model', i, 'predictions')}): predictions "
                              f"names the dataset {dataset!r}, which no [[dataset]] defines")
        if not isinstance(m.get("options", {}), dict):
            errors.append(f"{where}: options must be a table")
        listed = _names(m.get("datasets"), "datasets", where, errors) or []
        for dataset in listed:
            if dataset not in datasets:
                errors.append(f"{where} (line {lines.of('model', i, 'datasets')}): datasets names "
                              f"{dataset!r}, which no [[dataset]] defines")
    return seen


def _check_cell_tables(tables: list[dict], datasets: dict, models: dict, lines: Lines,
                       errors: list) -> dict[tuple, tuple[dict, int]]:
    """{(dataset, model): (options, line)} of the [[cell]] tables, after checking each."""
    overrides: dict[tuple, tuple[dict, int]] = {}
    for i, c in enumerate(tables):
        where = f"[[cell]] #{i + 1} (line {lines.of('cell', i)})"
        _check_keys(c, CELL_KEYS, where, errors, lines, "cell", i)
        key = (c.get("dataset"), c.get("model"))
        if key[0] not in datasets or key[1] not in models:
            errors.append(f"{where}: needs dataset = and model = naming a defined dataset and model")
        elif key in overrides:
            errors.append(f"{where}: the cell {key[0]}/{key[1]} already has a [[cell]] table at "
                          f"line {overrides[key][1]}")
        elif not isinstance(c.get("options", {}), dict):
            errors.append(f"{where}: options must be a table")
        else:
            overrides[key] = (c.get("options", {}), lines.of("cell", i))
    return overrides


def _expand(path: str, datasets: list[dict], models: list[dict], overrides: dict, lines: Lines,
            errors: list) -> list[Cell]:
    """The cells of checked tables, in dataset then model order: each model that applies to a
    dataset (its datasets key, the dataset's models key, a path in its predictions table), its
    paths filled in and its options merged (dataset's, model's, then its [[cell]] table's).
    Problems go to errors; past MAX_CELLS cells, ManifestError is raised at once."""
    cells = []
    folders: dict[str, str] = {}
    for i, d in enumerate(datasets):
        wanted = d.get("models")
        for j, m in enumerate(models):
            if wanted is not None and m["name"] not in wanted:
                continue
            if len(cells) == MAX_CELLS:
                errors.append(f"{path}: more than {MAX_CELLS:,} cells ({len(datasets):,} datasets "
                              f"x {len(models):,} models); a sweep that large is several sweeps: "
                              "split the manifest, or name each dataset's models (models = [...])")
                raise ManifestError(errors)
            if m.get("datasets") is not None and d["name"] not in m["datasets"]:
                continue
            predictions = m["predictions"]
            if isinstance(predictions, dict):
                if d["name"] not in predictions:
                    if wanted is not None:
                        errors.append(f"[[dataset]] {d['name']!r} lists the model {m['name']!r}, "
                                      f"whose predictions table (line {lines.of('model', j, 'predictions')}) "
                                      "has no path for it")
                    continue
                predictions = predictions[d["name"]]
            values = {"dataset": d["name"], "model": m["name"], "task": d["task"]}
            gt = _fill(d["groundtruths"], {k: values[k] for k in ("dataset", "task")},
                       f"[[dataset]] {d['name']!r} (line {lines.of('dataset', i, 'groundtruths')})",
                       errors)
            pred = _fill(predictions, values,
                         f"[[model]] {m['name']!r} (line {lines.of('model', j, 'predictions')})", errors)
            if gt is None or pred is None:
                continue
            cell_options, cell_line = overrides.get((d["name"], m["name"]), ({}, lines.of("dataset", i)))
            options = {**d.get("options", {}), **m.get("options", {}), **cell_options}
            cell_id = f"{d['name']}/{m['name']}"
            folded = cell_id.lower()
            if folded in folders:
                errors.append(f"the cells {folders[folded]} and {cell_id} would write the same folder "
                              f"cells/{cell_id} on a case-insensitive file system: rename one "
                              f"(line {lines.of('dataset', i)})")
                continue
            folders[folded] = cell_id
            cells.append(Cell(cell_id, d["name"], m["name"], d["task"], gt, pred, options, cell_line))
    return cells


def judge_settings() -> dict:
    """The keys a [judge] table may hold: {NAME: argparse action} of every --judge_NAME option
    of the text task (the task whose cells get them)."""
    from evalbeam.pipelines.launch.launcher import build_parser
    from evalbeam.pipelines.tasks.registry import task_of

    actions = build_parser(task_of("text"))._option_string_actions
    return {flag[len("--judge_"):]: action for flag, action in actions.items()
            if flag.startswith("--judge_")}


def setting_problem(action, value) -> str | None:
    """Why a [judge] value cannot be its option's (the table's shape and numbers; the text
    task's parser checks the rest in every text cell), or None. The value is never quoted: it
    could be a secret put in the wrong key."""
    import argparse

    if isinstance(action, argparse._StoreTrueAction):
        return None if isinstance(value, bool) else "is a switch: write true or false"
    if isinstance(value, bool) or isinstance(value, dict):
        return "takes a value, not true, false or a table"
    if isinstance(value, list):
        if not isinstance(action, argparse._AppendAction):
            return "takes one value, not a list"
        values = value
    else:
        values = [value]
    if action.type in (int, float):
        for item in values:
            try:
                action.type(str(item))
            except ValueError:
                return "takes a whole number" if action.type is int else "takes a number"
    return None


def _secret_hint(key: str) -> str:
    """For a [judge] key that looks like the API key itself (api_key, token): where it goes."""
    if key == "key" or key.endswith(("api_key", "token", "secret", "password", "credentials")):
        return (": a key or secret is never a setting; name the environment variable that holds "
                "it with api_key_env")
    return ""


def _top_line(lines: Lines, key: str) -> int:
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for number, line in enumerate(lines.lines, 1):
        if pattern.match(line):
            return number
    return 1


def _array(data: dict, name: str, errors: list) -> list[dict]:
    value = data.get(name, [])
    if isinstance(value, dict):
        errors.append(f"[{name}] must be written [[{name}]] (one table per {name})")
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        errors.append(f"{name} must be [[{name}]] tables")
        return []
    return value


def option_args(options: dict, parser, where: str) -> list[str]:
    """A cell's options as command-line arguments of the task's parser (checked by it): true ->
    --name, false -> --no_name when the parser has it, else nothing (a switch left off), a
    list -> the option repeated (for repeatable options like slice, whose items may be lists of
    keys) or its items joined by commas (score_thresholds = [0.5, 0.75]), anything else -> its
    text. Raises UsageError naming `where` for an option the task does not have."""
    import argparse

    actions = parser._option_string_actions
    args: list[str] = []
    for name, value in options.items():
        flag = f"--{name}"
        if not OPTION_NAME.fullmatch(name) or flag not in actions:
            raise UsageError(f"{where}: unknown option {name!r} for this task (see evalbeam "
                             f"<task> --help; write --some_option as some_option)")
        if name in RESERVED:
            raise UsageError(f"{where}: the option {name!r} is set by the sweep, not per cell"
                             + (" (use the [sweep] table)" if name in SWEEP_KEYS | {"bootstrap"} else ""))
        action = actions[flag]
        if isinstance(value, bool):
            if value:
                args.append(flag)
            elif f"--no_{name}" in actions:
                args.append(f"--no_{name}")
            elif not isinstance(action, (argparse._StoreTrueAction,)):
                raise UsageError(f"{where}: {name} = false: the option takes a value")
        elif isinstance(value, list):
            def text(item):
                return ",".join(map(str, item)) if isinstance(item, list) else str(item)
            if isinstance(action, argparse._AppendAction):
                for item in value:
                    args += [flag, text(item)]
            else:
                args += [flag, ",".join(text(item) for item in value)]
        elif isinstance(value, dict):
            raise UsageError(f"{where}: option {name!r} cannot be a table")
        else:
            args += [flag, str(value)]
    return args
