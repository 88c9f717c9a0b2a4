"""Bundled judge templates load, render and validate; broken files and BYOP files are rejected clearly."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from evalbeam.transforms.judge.templates import (Template, TemplateError, load_byop, load_template, load_template_file,
                                        render_messages, request_schema, template_names)

# name -> (inputs, answer, top-level properties in order, verdict options or numbers); callers depend on these
CONTRACT = {
    "statements": (("question", "text"), "json", ["statements"], None),
    "opinions": (("text",), "json", ["opinions"], None),
    "bias_verdicts": (("opinions",), "json", ["verdicts"], ["yes", "no"]),
    "toxicity_verdicts": (("opinions",), "json", ["verdicts"], ["yes", "no"]),
    "answer_correctness_verdicts": (("question", "answer_statements", "reference_statements"), "json",
                                    ["answer_verdicts", "reference_verdicts"], ["yes", "no"]),
    "answer_relevance_verdicts": (("question", "statements"), "json", ["verdicts"], ["yes", "no", "idk"]),
    "context_precision_verdict": (("question", "context", "reference"), "json", ["reason", "verdict"], ["yes", "no"]),
    "context_recall_verdicts": (("contexts", "statements"), "json", ["verdicts"], ["yes", "no"]),
    "context_relevance_verdict": (("question", "context"), "json", ["reason", "verdict"], ["yes", "no"]),
    "faithfulness_verdicts": (("contexts", "claims"), "json", ["verdicts"], ["yes", "no"]),
    "hallucination_verdict": (("context", "text"), "json", ["reason", "verdict"], ["yes", "no"]),
    "summary_coherence": (("source", "summary"), "number", None, [1, 2, 3, 4, 5]),
    "nv_answer_accuracy_1": (("question", "answer", "reference"), "number", None, [0, 2, 4]),
    "nv_answer_accuracy_2": (("question", "answer", "reference"), "number", None, [0, 2, 4]),
    "nv_context_relevance_1": (("question", "contexts"), "number", None, [0, 1, 2]),
    "nv_context_relevance_2": (("question", "contexts"), "number", None, [0, 1, 2]),
    "nv_groundedness_1": (("response", "contexts"), "number", None, [0, 1, 2]),
    "nv_groundedness_2": (("response", "contexts"), "number", None, [0, 1, 2]),
    "contact_information": (("text",), "json", ["reason", "verdict"], ["present", "absent"]),
    "language_mismatch": (("question", "text"), "json", ["reason", "verdict"], ["same", "different"]),
    "sexism": (("question", "text"), "json", ["reason", "verdict"], ["yes", "no"]),
    "stereotypes": (("question", "text"), "json", ["reason", "score"], None),
    "summarization": (("source", "summary"), "json", ["reason", "verdict"], ["good", "bad"]),
}
COUNTS = {
    "bias_verdicts": {("verdicts", "opinions")},
    "toxicity_verdicts": {("verdicts", "opinions")},
    "answer_correctness_verdicts": {("answer_verdicts", "answer_statements"),
                                    ("reference_verdicts", "reference_statements")},
    "answer_relevance_verdicts": {("verdicts", "statements")},
    "context_recall_verdicts": {("verdicts", "statements")},
    "faithfulness_verdicts": {("verdicts", "claims")},
}
ITEM_TEXT = {"bias_verdicts": "opinion", "toxicity_verdicts": "opinion", "faithfulness_verdicts": "claim"}
LIST_INPUTS = {"contexts", "claims", "opinions", "statements", "answer_statements", "reference_statements"}


def sample_values(t: Template) -> dict:
    return {name: (["first {{question}} item", "second }}{{ item"] if name in LIST_INPUTS else f"sample {name}")
            for name in t.inputs}


def walk_objects(schema):
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            yield schema
        for sub in schema.get("properties", {}).values():
            yield from walk_objects(sub)
        if "items" in schema:
            yield from walk_objects(schema["items"])


def test_the_bundled_names():
    assert template_names() == sorted(CONTRACT)
    assert len(template_names()) == 23


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_bundled_template_follows_its_contract(name):
    t = load_template(name)
    inputs, answer, properties, options = CONTRACT[name]
    assert (t.name, t.inputs, t.answer) == (name, inputs, answer)
    assert t.version and t.description and 1 <= len(t.examples) <= 3
    assert set(t.counts) == COUNTS.get(name, set())
    if answer == "number":
        assert t.numbers == tuple(options) and t.schema is None and t.max_tokens == 8
        return
    assert list(t.schema["properties"]) == properties
    for node in walk_objects(t.schema):
        assert node["additionalProperties"] is False
        assert set(node["required"]) == set(node["properties"])
        keys = list(node["properties"])
        for last in ("verdict", "score"):
            if last in keys:
                assert keys.index("reason") < keys.index(last), "the judge must reason first"
                assert keys[-1] == last
        if "verdict" in keys:
            assert node["properties"]["verdict"]["enum"] == options
    if name == "stereotypes":
        assert t.schema["properties"]["score"] == {"type": "integer", "minimum": 0, "maximum": 10}
    if name in ITEM_TEXT:
        assert list(t.schema["properties"]["verdicts"]["items"]["properties"])[0] == ITEM_TEXT[name]


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_bundled_template_renders_and_its_examples_validate(name):
    t = load_template(name)
    values = sample_values(t)
    messages = render_messages(t, values)
    roles = [role for role, _ in messages]
    assert roles == ["system"] + ["user", "assistant"] * len(t.examples) + ["user"]
    assert messages[0][1] == t.system
    final = messages[-1][1]
    for value in values.values():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)
        assert text in final
    for (_, user), (_, output), example in zip(messages[1:-1:2], messages[2:-1:2], t.examples):
        assert output == example["output"]
        if t.answer == "number":
            assert int(output) in t.numbers
        else:
            jsonschema.validate(json.loads(output), request_schema(t, example["inputs"]))
    if t.answer == "number":
        line = "Reply with only one of these numbers: " + ", ".join(map(str, t.numbers)) + "."
        for role, text in messages:
            if role == "user":
                assert text.endswith("\n" + line)
        assert request_schema(t, values) is None
    assert load_template(name) is t  # cached


def test_request_schema_applies_counts_and_leaves_the_template_alone():
    t = load_template("faithfulness_verdicts")
    before = json.dumps(t.schema, sort_keys=True)
    schema = request_schema(t, {"contexts": ["c"], "claims": ["a", "b"]})
    verdicts = schema["properties"]["verdicts"]
    assert (verdicts["minItems"], verdicts["maxItems"]) == (2, 2)
    item = {"claim": "a", "reason": "r", "verdict": "yes"}
    jsonschema.validate({"verdicts": [item, item]}, schema)
    for wrong in ([item], [item, item, item], []):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"verdicts": wrong}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"verdicts": [item, {**item, "verdict": "idk"}]}, schema)
    assert json.dumps(t.schema, sort_keys=True) == before
    both = request_schema(load_template("answer_correctness_verdicts"),
                          {"question": "q", "answer_statements": ["a"], "reference_statements": ["x", "y", "z"]})
    assert both["properties"]["answer_verdicts"]["maxItems"] == 1
    assert both["properties"]["reference_verdicts"]["minItems"] == 3
    with pytest.raises(ValueError):
        request_schema(t, {"contexts": ["c"], "claims": "not a list"})


def test_values_are_inserted_literally():
    t = load_template("context_relevance_verdict")
    tricky = "{{question}} and }}{{ and {{context}} and \\1 \\g<0> {not a placeholder}"
    final = render_messages(t, {"question": "Q?", "context": tricky})[-1][1]
    assert tricky in final
    assert final.count("Q?") == 1
    lists = load_template("faithfulness_verdicts")
    final = render_messages(lists, {"contexts": ["{{claims}}", "naïve"], "claims": []})[-1][1]
    assert json.dumps(["{{claims}}", "naïve"], ensure_ascii=False, indent=2) in final
    assert "\n[]" in final


def test_values_must_match_the_inputs_exactly():
    t = load_template("context_relevance_verdict")
    with pytest.raises(ValueError, match="missing"):
        render_messages(t, {"question": "q"})
    with pytest.raises(ValueError, match="unexpected"):
        render_messages(t, {"question": "q", "context": "c", "extra": "x"})
    with pytest.raises(ValueError):
        render_messages(t, {"question": "q", "context": 3})
    with pytest.raises(ValueError):
        render_messages(t, {"question": "q", "context": ["ok", None]})


def test_templates_hash_and_compare():
    t = load_template("sexism")
    assert hash(t) == hash(load_template_file(str(_bundled_path("sexism"))))
    assert t == load_template_file(str(_bundled_path("sexism")))


def _bundled_path(name):
    from evalbeam.transforms.judge import templates

    return templates.TEMPLATE_DIR / f"{name}.toml"


GOOD_JSON = '''name = "mini"
version = "1"
description = "A small valid template."
answer = "json"
max_tokens = 64
system = "Judge the claims."
user = """Context: {{context}}
Claims: {{claims}}"""
inputs = ["context", "claims"]
counts = { verdicts = "claims" }
schema = \'\'\'{"type": "object", "properties": {"verdicts": {"type": "array", "items": {"type": "object",
  "properties": {"reason": {"type": "string"}, "verdict": {"type": "string", "enum": ["yes", "no"]}},
  "required": ["reason", "verdict"], "additionalProperties": false}}},
  "required": ["verdicts"], "additionalProperties": false}\'\'\'
[[examples]]
output = \'\'\'{"verdicts": [{"reason": "r", "verdict": "yes"}]}\'\'\'
[examples.inputs]
context = "c"
claims = ["one"]
'''

GOOD_NUMBER = '''name = "mini"
version = "1"
description = "A small rating template."
answer = "number"
numbers = [0, 1, 2]
max_tokens = 8
system = "Rate it."
user = "Text: {{text}}"
inputs = ["text"]
[[examples]]
output = "2"
[examples.inputs]
text = "fine"
'''


def write(tmp_path, text, name="mini.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_minimal_templates_load(tmp_path):
    t = load_template_file(write(tmp_path, GOOD_JSON))
    assert t.counts == (("verdicts", "claims"),) and t.examples[0]["inputs"]["claims"] == ["one"]
    n = load_template_file(write(tmp_path, GOOD_NUMBER))
    assert n.numbers == (0, 1, 2)
    assert render_messages(n, {"text": "x"})[-1][1] == "Text: x\n\nReply with only one of these numbers: 0, 1, 2."


BROKEN = [
    ("missing key", GOOD_JSON.replace('description = "A small valid template."\n', ""), "description"),
    ("unknown key", GOOD_JSON.replace('max_tokens = 64', 'max_tokens = 64\ntemperature = 0'), "unknown keys"),
    ("name not stem", GOOD_JSON.replace('name = "mini"', 'name = "other"'), "stem"),
    ("bad answer", GOOD_JSON.replace('answer = "json"', 'answer = "text"'), "answer"),
    ("version not str", GOOD_JSON.replace('version = "1"', "version = 1"), "version"),
    ("extra placeholder", GOOD_JSON.replace("Claims: {{claims}}", "Claims: {{claims}} {{extra}}"), "extra"),
    ("unused input", GOOD_JSON.replace("Claims: {{claims}}", "Claims:"), "claims"),
    ("spaced placeholder", GOOD_JSON.replace("Claims: {{claims}}", "Claims: {{claims}} {{ context }}"), "malformed"),
    ("placeholder in system", GOOD_JSON.replace('"Judge the claims."', '"Judge {{claims}}."'), "system"),
    ("no schema", GOOD_JSON.split("schema = ")[0] + "[[examples]]" + GOOD_JSON.split("[[examples]]")[1], "schema"),
    ("schema not JSON", GOOD_JSON.replace('{"type": "object", "properties": {"verdicts"', '{"type": object, "p": {"v"'),
     "schema is not JSON"),
    ("schema nested deep", GOOD_JSON.replace('{"type": "object", "properties": {"verdicts"',
                                              '{"x": ' + "[" * 3000 + "]" * 3000 + ', "type": "object", "properties": {"verdicts"'),
     "JSON nested deeper than 64 levels"),
    ("invalid JSON Schema", GOOD_JSON.replace('"type": "array"', '"type": "list"'), "JSON Schema"),
    ("open object", GOOD_JSON.replace('"required": ["verdicts"], "additionalProperties": false',
                                      '"required": ["verdicts"]'), "additionalProperties"),
    ("not all required", GOOD_JSON.replace('"required": ["reason", "verdict"]', '"required": ["verdict"]'),
     "required"),
    ("counts on a string", GOOD_JSON.replace('counts = { verdicts = "claims" }', 'counts = { verdicts = "context" }'),
     "must be a list"),
    ("counts unknown property", GOOD_JSON.replace('counts = { verdicts = "claims" }', 'counts = { items = "claims" }'),
     "items"),
    ("example wrong length", GOOD_JSON.replace('claims = ["one"]', 'claims = ["one", "two"]'), "example 1"),
    ("example bad verdict", GOOD_JSON.replace('"verdict": "yes"}]}', '"verdict": "maybe"}]}'), "example 1"),
    ("example not JSON", GOOD_JSON.replace('output = \'\'\'{"verdicts"', 'output = \'\'\'{verdicts'), "example 1"),
    ("example missing input", GOOD_JSON.replace('context = "c"\n', ""), "example 1"),
    ("example extra input", GOOD_JSON.replace('context = "c"\n', 'context = "c"\nother = "x"\n'), "example 1"),
    ("no examples", GOOD_JSON.split("[[examples]]")[0], "examples"),
    ("bad TOML", GOOD_JSON.replace('version = "1"', "version = "), "not valid TOML"),
    ("number without numbers", GOOD_NUMBER.replace("numbers = [0, 1, 2]\n", ""), "numbers"),
    ("number example not allowed", GOOD_NUMBER.replace('output = "2"', 'output = "3"'), "example 1"),
    ("number example with words", GOOD_NUMBER.replace('output = "2"', 'output = "2 because"'), "example 1"),
    ("number with schema", GOOD_NUMBER.replace('max_tokens = 8', 'max_tokens = 8\nschema = "{}"'), "schema"),
]


@pytest.mark.parametrize("case, text, needle", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_files_raise_template_error_naming_the_file(tmp_path, case, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(TemplateError) as error:
        load_template_file(path)
    assert path in str(error.value)
    assert needle in str(error.value)


def test_missing_file_and_unknown_bundled_name(tmp_path):
    with pytest.raises(TemplateError, match="no such file"):
        load_template_file(str(tmp_path / "absent.toml"))
    with pytest.raises(TemplateError, match="unknown template"):
        load_template("../templates")


PASS_FAIL = '''name = "polite"
version = "2"
verdict = "pass_fail"
user = """Is this answer polite?
Question: {{question}}
Answer: {{answer}}"""
'''

NUMERIC = '''name = "depth"
version = "1"
verdict = "numeric"
min = 0
max = 5
system = "Rate the depth."
user = """Rate the depth of {{answer}} given {{contexts}} and again {{answer}}."""
[[examples]]
output = \'\'\'{"reason": "Thorough.", "score": 4.5}\'\'\'
[examples.inputs]
answer = "A long answer."
contexts = ["one", "two"]
'''


def test_byop_pass_fail(tmp_path):
    t = load_byop(write(tmp_path, PASS_FAIL, "polite.toml"))
    assert (t.name, t.version, t.answer, t.inputs, t.examples, t.counts) == (
        "polite", "2", "json", ("question", "answer"), (), ())
    assert t.schema == {"type": "object",
                        "properties": {"reason": {"type": "string"},
                                       "verdict": {"type": "string", "enum": ["pass", "fail"]}},
                        "required": ["reason", "verdict"], "additionalProperties": False}
    assert t.system and "pass" in t.system
    messages = render_messages(t, {"question": "q", "answer": "Yes, please."})
    assert messages == (("system", t.system), ("user", "Is this answer polite?\nQuestion: q\nAnswer: Yes, please."))
    assert request_schema(t, {"question": "q", "answer": "a"}) == t.schema


def test_byop_numeric(tmp_path):
    t = load_byop(write(tmp_path, NUMERIC, "depth.toml"))
    assert t.inputs == ("answer", "contexts") and t.system == "Rate the depth."
    assert t.schema["properties"]["score"] == {"type": "number", "minimum": 0, "maximum": 5}
    assert list(t.schema["properties"]) == ["reason", "score"]
    assert len(t.examples) == 1
    final = render_messages(t, {"answer": "A", "contexts": ["c"]})[-1][1]
    assert final.count("A") == 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"reason": "r", "score": 6}, request_schema(t, {"answer": "A", "contexts": []}))


BYOP_BROKEN = [
    ("unknown placeholder", PASS_FAIL.replace("{{question}}", "{{prompt}}"), "prompt"),
    ("no placeholder", 'name = "x"\nversion = "1"\nverdict = "pass_fail"\nuser = "Is it good?"\n', "placeholder"),
    ("numeric without min", NUMERIC.replace("min = 0\n", ""), "min and max"),
    ("numeric without max", NUMERIC.replace("max = 5\n", ""), "min and max"),
    ("min not below max", NUMERIC.replace("max = 5", "max = 0"), "less than"),
    ("min not a number", NUMERIC.replace("min = 0", 'min = "0"'), "numbers"),
    ("pass_fail with bounds", PASS_FAIL + "min = 0\nmax = 1\n", "numeric"),
    ("unknown verdict", PASS_FAIL.replace('"pass_fail"', '"true_false"'), "verdict"),
    ("missing verdict", PASS_FAIL.replace('verdict = "pass_fail"\n', ""), "verdict"),
    ("unknown key", PASS_FAIL + 'temperature = 0\n', "unknown keys"),
    ("bad name", PASS_FAIL.replace('"polite"', '"no spaces allowed"'), "name"),
    ("bundled name", PASS_FAIL.replace('"polite"', '"sexism"'), "bundled"),
    ("bad example", NUMERIC.replace('"score": 4.5', '"score": 7'), "example 1"),
    ("bad TOML", PASS_FAIL.replace('version = "2"', 'version = "2'), "not valid TOML"),
]


@pytest.mark.parametrize("case, text, needle", BYOP_BROKEN, ids=[c[0] for c in BYOP_BROKEN])
def test_broken_byop_files_raise_template_error(tmp_path, case, text, needle):
    path = write(tmp_path, text, "byop.toml")
    with pytest.raises(TemplateError) as error:
        load_byop(path)
    assert path in str(error.value) and needle in str(error.value)


def test_byop_path_that_is_no_template_file_is_refused_without_reading_it(tmp_path):
    """A pipe would block the run before it starts and /dev/zero would never end; a TOML file
    nested 5,000 deep made tomllib raise RecursionError (a traceback)."""
    pipe = tmp_path / "pipe.toml"
    os.mkfifo(pipe)
    cases = [(write(tmp_path, "a = " + "[" * 5000 + "]" * 5000 + "\n", "deep.toml"), "nested deeper than 64 levels"),
             (write(tmp_path, "# " + "x" * (2 << 20) + "\n", "big.toml"), "more than the 1,048,576 bytes"),
             (str(pipe), "not a regular file"), ("/dev/zero", "not a regular file")]
    for path, needle in cases:
        with pytest.raises(TemplateError) as error:
            load_byop(path)
        assert path in str(error.value) and needle in str(error.value)
