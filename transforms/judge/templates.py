"""Versioned LLM-judge prompt templates: TOML files validated on load and rendered to chat messages.

Bundled templates live in transforms/judge/templates/<name>.toml (package data). A template has a
system text, a user text with {{name}} placeholders, an answer format (a strict JSON schema, or one
number from a fixed set) and 1-3 few-shot examples whose outputs must satisfy that format.
`load_byop` builds a json template from a user's "bring your own prompt" file.

Rendering substitutes every placeholder in one pass, so a value containing "{{x}}" or braces is
inserted literally and never expanded again (values are untrusted model output). A str is inserted
as is, a list of str as a JSON array (indent 2, UTF-8 kept).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import re
from pathlib import Path

import jsonschema

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
PLACEHOLDER_RE = re.compile(r"\{\{(\w+)\}\}")
# "{{ question }}" is almost always a typo for "{{question}}"; it would be sent to the judge literally
SPACED_PLACEHOLDER_RE = re.compile(r"\{\{\s+\w+\s*\}\}|\{\{\s*\w+\s+\}\}")
INPUT_NAME_RE = re.compile(r"^\w+$")
# OpenAI's json_schema name rule; the client sends the template name there
TEMPLATE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ANSWERS = ("json", "number")
MAX_EXAMPLES = 3
NUMBERS_LINE = "Reply with only one of these numbers: {}."

REQUIRED_KEYS = ("name", "version", "description", "answer", "max_tokens", "system", "user", "inputs",
                 "examples")
OPTIONAL_KEYS = ("numbers", "counts", "schema")

BYOP_INPUTS = ("question", "answer", "references", "contexts")
BYOP_KEYS = ("name", "version", "user", "system", "verdict", "min", "max", "description", "max_tokens",
             "examples")
BYOP_VERDICTS = ("pass_fail", "numeric")
BYOP_MAX_TOKENS = 512


@dataclasses.dataclass(frozen=True)
class Template:
    """One validated template. `schema` and `examples` are left out of the hash (dicts)."""

    name: str
    version: str
    description: str
    answer: str  # "json" | "number"
    numbers: tuple[int, ...] | None
    max_tokens: int
    system: str
    user: str
    inputs: tuple[str, ...]
    counts: tuple[tuple[str, str], ...]  # (top-level array property, list input giving its length)
    schema: dict | None = dataclasses.field(hash=False)
    examples: tuple[dict, ...] = dataclasses.field(hash=False)  # each {"inputs": {...}, "output": str}


class TemplateError(ValueError):
    """A template file that cannot be used; the message names the file and the problem."""


# ---------------------------------------------------------------- loading


@functools.lru_cache(maxsize=None)
def load_template(name: str) -> Template:
    """The bundled template `name` (transforms/judge/templates/<name>.toml)."""
    names = template_names()
    if name not in names:
        raise TemplateError(f"unknown template {name!r}; bundled templates: {', '.join(names)}")
    return load_template_file(str(TEMPLATE_DIR / f"{name}.toml"))


def template_names() -> list[str]:
    """Sorted stems of the bundled template files."""
    return sorted(p.stem for p in TEMPLATE_DIR.glob("*.toml"))


def load_template_file(path: str) -> Template:
    """A template from any TOML file in the bundled format; its `name` must equal the file stem."""
    data = _read_toml(path)
    unknown = sorted(set(data) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        _fail(path, f"unknown keys {unknown}")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        _fail(path, f"missing required keys {missing}")
    if data["name"] != Path(path).stem:
        _fail(path, f"name {data['name']!r} must equal the file stem {Path(path).stem!r}")
    return _build(path, data, min_examples=1)


def load_byop(path: str) -> Template:
    """A json Template from a user's "bring your own prompt" file.

    Keys: name, version, user (placeholders from {{question}}, {{answer}}, {{references}},
    {{contexts}}; at least one), optional system and description, verdict = "pass_fail" (answer
    {"reason", "verdict": "pass"|"fail"}) or "numeric" with numbers min < max (answer {"reason",
    "score"} within [min, max]), optional max_tokens and 0-3 examples.
    """
    data = _read_toml(path)
    unknown = sorted(set(data) - set(BYOP_KEYS))
    if unknown:
        _fail(path, f"unknown keys {unknown}; a BYOP file may have {', '.join(BYOP_KEYS)}")
    missing = [k for k in ("name", "version", "user", "verdict") if k not in data]
    if missing:
        _fail(path, f"missing required keys {missing}")
    user = data["user"]
    if not isinstance(user, str) or not user.strip():
        _fail(path, "user must be a non-empty string")
    used = list(dict.fromkeys(PLACEHOLDER_RE.findall(user)))
    bad = [p for p in used if p not in BYOP_INPUTS]
    if bad:
        _fail(path, f"unknown placeholders {['{{' + p + '}}' for p in bad]}; a BYOP prompt may use "
                    + ", ".join("{{" + p + "}}" for p in BYOP_INPUTS))
    if not used:
        _fail(path, "user uses no placeholder; it needs at least one of "
                    + ", ".join("{{" + p + "}}" for p in BYOP_INPUTS))
    name = data["name"]
    if isinstance(name, str) and name in template_names():
        # records name the template; sharing a bundled name would make them ambiguous
        _fail(path, f"name {name!r} is the name of a bundled template")
    verdict = data["verdict"]
    if verdict not in BYOP_VERDICTS:
        _fail(path, f"verdict must be one of {list(BYOP_VERDICTS)}, not {verdict!r}")
    if verdict == "pass_fail":
        if "min" in data or "max" in data:
            _fail(path, 'min and max apply only to verdict = "numeric"')
        outcome = {"verdict": {"type": "string", "enum": ["pass", "fail"]}}
        ask = 'then "verdict": "pass" when the output meets the criteria of the task, else "fail"'
    else:
        bounds = [data.get("min"), data.get("max")]
        if any(b is None for b in bounds):
            _fail(path, 'verdict = "numeric" needs both min and max')
        if any(not _is_number(b) for b in bounds):
            _fail(path, f"min and max must be finite numbers, not {bounds}")
        low, high = bounds
        if not low < high:
            _fail(path, f"min ({low}) must be less than max ({high})")
        outcome = {"score": {"type": "number", "minimum": low, "maximum": high}}
        ask = f'then "score": a number from {low} to {high} on the scale the task describes'
    schema = {"type": "object", "properties": {"reason": {"type": "string"}, **outcome},
              "required": ["reason", *outcome], "additionalProperties": False}
    system = data.get("system", (
        "You are an impartial judge of the output of an AI system. Read the task and the material "
        "below, apply the task's criteria strictly and consistently, and rely only on what is shown, "
        "not on outside knowledge. Answer with a JSON object: first \"reason\", one or two sentences "
        f"explaining your judgement, {ask}."))
    built = {"name": name, "version": data["version"],
             "description": data.get("description", f"user-supplied judge prompt {name}"),
             "answer": "json", "max_tokens": data.get("max_tokens", BYOP_MAX_TOKENS),
             "system": system, "user": user, "inputs": used, "schema": schema,
             "examples": data.get("examples", [])}
    return _build(path, built, min_examples=0)


# A template is a few KiB; a bound keeps a wrong path (a device, a huge file) from being read whole.
MAX_TEMPLATE_BYTES = 1 << 20


def _read_toml(path: str) -> dict:
    """The TOML of a template file, read through transforms.input_files: a regular file of at
    most MAX_TEMPLATE_BYTES (a pipe would block, /dev/zero never ends), strict UTF-8, nested at
    most 64 levels; TemplateError otherwise."""
    from evalbeam.transforms.input_files import FileRefused, load_toml

    try:
        return load_toml(path, MAX_TEMPLATE_BYTES)[0]
    except FileRefused as error:
        raise TemplateError(error.message) from None


def _fail(path, problem: str):
    raise TemplateError(f"{path}: {problem}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _build(path: str, data: dict, min_examples: int) -> Template:
    """Validate the keys of one template (file format; `schema` as JSON text or a dict)."""
    name = data["name"]
    if not isinstance(name, str) or not TEMPLATE_NAME_RE.match(name):
        _fail(path, f"name must be 1-64 letters, digits, '_' or '-', not {name!r}")
    for key in ("version", "description", "system", "user"):
        if not isinstance(data[key], str) or not data[key].strip():
            _fail(path, f"{key} must be a non-empty string")
    answer = data["answer"]
    if answer not in ANSWERS:
        _fail(path, f"answer must be one of {list(ANSWERS)}, not {answer!r}")
    max_tokens = data["max_tokens"]
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        _fail(path, f"max_tokens must be a positive integer, not {max_tokens!r}")

    inputs = data["inputs"]
    if (not isinstance(inputs, list) or not inputs
            or not all(isinstance(i, str) and INPUT_NAME_RE.match(i) for i in inputs)):
        _fail(path, "inputs must be a non-empty list of names (letters, digits, '_')")
    if len(set(inputs)) != len(inputs):
        _fail(path, f"inputs has duplicates: {inputs}")
    system, user = data["system"].strip(), data["user"].strip()
    _check_placeholders(path, system, user, inputs)

    numbers = schema = None
    counts: list[tuple[str, str]] = []
    if answer == "number":
        for key in ("schema", "counts"):
            if key in data:
                _fail(path, f'{key} is not allowed with answer = "number"')
        numbers = data.get("numbers")
        if (not isinstance(numbers, list) or not numbers
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers)):
            _fail(path, 'answer = "number" needs numbers, a non-empty list of non-negative integers')
        if len(set(numbers)) != len(numbers):
            _fail(path, f"numbers has duplicates: {numbers}")
        numbers = tuple(numbers)
    else:
        if "numbers" in data:
            _fail(path, 'numbers is only for answer = "number"')
        schema = _parse_schema(path, data.get("schema"))
        counts = _parse_counts(path, data.get("counts", {}), schema, inputs)

    template = Template(name=name, version=data["version"], description=data["description"].strip(),
                        answer=answer, numbers=numbers, max_tokens=max_tokens, system=system, user=user,
                        inputs=tuple(inputs), counts=tuple(counts), schema=schema, examples=())
    examples = _parse_examples(path, data["examples"], template, min_examples)
    return dataclasses.replace(template, examples=examples)


def _check_placeholders(path, system: str, user: str, inputs: list) -> None:
    if PLACEHOLDER_RE.search(system):
        _fail(path, "system must not contain placeholders (only the user text is rendered)")
    spaced = SPACED_PLACEHOLDER_RE.findall(user)
    if spaced:
        _fail(path, f"malformed placeholders {spaced}: write {{{{name}}}} without spaces")
    used = set(PLACEHOLDER_RE.findall(user))
    if used != set(inputs):
        problems = []
        if used - set(inputs):
            problems.append(f"user uses {sorted(used - set(inputs))} not listed in inputs")
        if set(inputs) - used:
            problems.append(f"inputs {sorted(set(inputs) - used)} are not used in user")
        _fail(path, "placeholders do not match inputs: " + "; ".join(problems))


def _parse_schema(path, text) -> dict:
    if text is None:
        _fail(path, 'answer = "json" needs a schema')
    if isinstance(text, str):
        from evalbeam.transforms.input_files import json_problem

        # strict and depth-bounded, as every JSON evalbeam reads (json.loads alone raised
        # RecursionError on a schema nested thousands deep)
        schema, problem = json_problem(text.encode("utf-8", "surrogatepass"))
        if problem:
            _fail(path, f"schema is {problem}" if problem.startswith("not ") else
                  f"schema is not usable: {problem}")
    else:
        schema = text
    if not isinstance(schema, dict):
        _fail(path, "schema must be a JSON object")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        _fail(path, f"schema is not a valid JSON Schema: {error.message}")
    if schema.get("type") != "object":
        _fail(path, 'schema must have "type": "object" at the top')
    problem = _strict_problem(schema, "schema")
    if problem:
        _fail(path, problem)
    return schema


def _strict_problem(node, where: str) -> str | None:
    """The first departure from OpenAI strict structured outputs (closed objects, all required)."""
    if not isinstance(node, dict):
        return None
    if node.get("type") == "object":
        properties = node.get("properties")
        if not isinstance(properties, dict) or not properties:
            return f"{where}: an object needs properties"
        if set(node.get("required", [])) != set(properties):
            return f"{where}: every property must be listed in required"
        if node.get("additionalProperties") is not False:
            return f'{where}: an object needs "additionalProperties": false'
        for key, sub in properties.items():
            problem = _strict_problem(sub, f"{where}.{key}")
            if problem:
                return problem
    if "items" in node:
        return _strict_problem(node["items"], f"{where}[]")
    return None


def _parse_counts(path, counts, schema: dict, inputs: list) -> list[tuple[str, str]]:
    if not isinstance(counts, dict):
        _fail(path, "counts must be a table {array property = list input}")
    out = []
    for prop, source in counts.items():
        if schema["properties"].get(prop, {}).get("type") != "array":
            _fail(path, f"counts: {prop!r} is not a top-level array property of the schema")
        if source not in inputs:
            _fail(path, f"counts: {prop!r} refers to {source!r}, which is not an input")
        out.append((prop, source))
    return out


def _parse_examples(path, examples, t: Template, min_examples: int) -> tuple[dict, ...]:
    if not isinstance(examples, list) or not min_examples <= len(examples) <= MAX_EXAMPLES:
        _fail(path, f"examples must be a list of {min_examples}-{MAX_EXAMPLES} [[examples]] tables")
    out = []
    for i, example in enumerate(examples, 1):
        where = f"example {i}"
        if not isinstance(example, dict) or set(example) != {"inputs", "output"}:
            _fail(path, f"{where}: needs exactly the keys inputs and output")
        values, output = example["inputs"], example["output"]
        if not isinstance(values, dict) or set(values) != set(t.inputs):
            got = sorted(values) if isinstance(values, dict) else values
            _fail(path, f"{where}: inputs must have exactly {sorted(t.inputs)}, not {got}")
        if not isinstance(output, str) or not output.strip():
            _fail(path, f"{where}: output must be a non-empty string")
        try:
            _render(t, t.user, values)
            schema = request_schema(t, values)
        except ValueError as error:
            _fail(path, f"{where}: {error}")
        output = output.strip()
        if t.answer == "number":
            if output not in {str(n) for n in t.numbers}:
                _fail(path, f"{where}: output {output!r} is not one of {list(t.numbers)}")
        else:
            try:
                answer = json.loads(output)
            except ValueError as error:
                _fail(path, f"{where}: output is not valid JSON: {error}")
            error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(answer))
            if error is not None:
                at = "/".join(str(p) for p in error.absolute_path) or "top level"
                _fail(path, f"{where}: output does not fit the schema at {at}: {error.message}")
        out.append({"inputs": values, "output": output})
    return tuple(out)


# ---------------------------------------------------------------- rendering


def _text_of(name: str, value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return json.dumps(list(value), ensure_ascii=False, indent=2)
    raise ValueError(f"value of {name!r} must be a string or a list of strings, not {type(value).__name__}")


def _render(t: Template, text: str, values: dict) -> str:
    if not isinstance(values, dict) or set(values) != set(t.inputs):
        got = set(values) if isinstance(values, dict) else set()
        problems = []
        if set(t.inputs) - got:
            problems.append(f"missing {sorted(set(t.inputs) - got)}")
        if got - set(t.inputs):
            problems.append(f"unexpected {sorted(got - set(t.inputs))}")
        raise ValueError(f"template {t.name}: values must have exactly {list(t.inputs)} ({'; '.join(problems)})")
    texts = {name: _text_of(name, value) for name, value in values.items()}
    # one pass, replacement by function: inserted text is never re-scanned nor backslash-expanded
    return PLACEHOLDER_RE.sub(lambda m: texts[m.group(1)], text)


def _user_text(t: Template) -> str:
    if t.answer == "number":
        return t.user + "\n\n" + NUMBERS_LINE.format(", ".join(str(n) for n in t.numbers))
    return t.user


def render_messages(t: Template, values: dict) -> tuple[tuple[str, str], ...]:
    """(role, content) pairs: system, then a user/assistant pair per example, then the user turn.

    `values` must have exactly the template's inputs (ValueError otherwise). Number templates get
    the final line "Reply with only one of these numbers: a, b, c." on every user turn.
    """
    user = _user_text(t)
    messages = [("system", t.system)]
    for example in t.examples:
        messages.append(("user", _render(t, user, example["inputs"])))
        messages.append(("assistant", example["output"]))
    messages.append(("user", _render(t, user, values)))
    return tuple(messages)


def request_schema(t: Template, values: dict) -> dict | None:
    """The response schema of one request: None for number templates; else a copy of the schema
    whose `counts` arrays have minItems = maxItems = len(values[input])."""
    if t.answer == "number":
        return None
    schema = copy.deepcopy(t.schema)
    for prop, source in t.counts:
        items = values.get(source) if isinstance(values, dict) else None
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"template {t.name}: {source!r} must be a list (it sets the length of {prop!r})")
        schema["properties"][prop]["minItems"] = len(items)
        schema["properties"][prop]["maxItems"] = len(items)
    return schema
