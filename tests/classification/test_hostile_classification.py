"""Classification under hostile and surprising input (issue 14): integer labels, one typing rule
for JSONL and Parquet, deeply nested lines, lone surrogates, lines too long, non-finite slice
values, rows and vocabularies too large, label vocabularies that cannot match, the summary's
macro means, valor-lite's true negatives, a file given to the wrong command."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import MULTIPROCESS, ROOT, read_jsonl, run_classification, write_jsonl
from evalbeam.schemas.classification_rows import (CLASSIFICATION_GROUNDTRUTH,
                                                  CLASSIFICATION_PREDICTION, check_row,
                                                  dict_rows_table, parquet_tables,
                                                  parse_jsonl_block, validate)
from evalbeam.schemas.formats import SkippedLine, deep_lines, jsonl_blocks
from evalbeam.schemas.arrow_tables import REASON
from evalbeam.schemas.safe_json import BOM, BOM_REASON, nesting_depth

GT, PRED = CLASSIFICATION_GROUNDTRUTH, CLASSIFICATION_PREDICTION
DEEP = 100_000
SURROGATE = "the value of 'value' holds a lone UTF-16 surrogate"
NAN_REASON = "metadata 'region' is nan: a slice value must be a string, a finite number"


def jsonl(rows) -> bytes:
    return b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in rows)


def gt(uid, value, region="a", key="class"):
    return {"datum_uid": uid, "metadata": {"region": region}, "labels": [{"key": key, "value": value}]}


def pred(uid, scores, key="class"):
    return {"datum_uid": uid,
            "labels": [{"key": key, "value": v, "score": s} for v, s in scores.items()]}


def deep_line(n=DEEP, where="metadata"):
    return ('{"datum_uid": "deep", "labels": [], "' + where + '": ' + '{"a": ' * n + "1"
            + "}" * n + "}")


def no_slow_path(monkeypatch):
    """Make the slow JSONL path fail, to prove a block was read by Arrow."""
    import evalbeam.schemas.classification_rows as classification_rows

    def refuse(*args, **kwargs):
        raise AssertionError("the block went to the slow path")

    monkeypatch.setattr(classification_rows, "_parse_slowly", refuse)


# ----------------------------------------------------------------------------- item 1: integer labels

def test_integer_labels_read_as_decimal_text_on_both_jsonl_paths(monkeypatch):
    as_int = [pred(f"d{i}", {i % 3: 0.5, 10 + i: 0.25, -7: 0.125}) for i in range(6)]
    as_text = [pred(f"d{i}", {str(i % 3): 0.5, str(10 + i): 0.25, "-7": 0.125}) for i in range(6)]
    mixed = [as_int[0], as_text[1]]          # ints and strings in one block: the slow path
    expected, bad = parse_jsonl_block(jsonl(as_text), 1, PRED, [])
    assert not bad
    slow, bad = parse_jsonl_block(jsonl(mixed), 1, PRED, [])
    assert not bad and slow.column("labels").to_pylist() == expected.column("labels").to_pylist()[:2]
    no_slow_path(monkeypatch)
    fast, bad = parse_jsonl_block(jsonl(as_int), 1, PRED, [])
    assert not bad and fast.equals(expected)
    gt_int, _ = parse_jsonl_block(jsonl([gt("a", 3), gt("b", 12345678901234)]), 1, GT, [])
    assert [r[0]["value"] for r in gt_int.column("labels").to_pylist()] == ["3", "12345678901234"]


@pytest.mark.parametrize("value, reason", [
    (3.0, 'label value must be a string or an integer, got float 3.0: write whole-number labels '
          'as integers (3) or strings ("3")'),
    (0.5, 'label value must be a string or an integer, got float 0.5: write it as a string ("0.5")'),
    (True, 'label value must be a string or an integer, got bool true: write it as a string ("true")'),
    ({"id": 3}, 'label value must be a string or an integer, got dict {"id": 3}: a label is one '
                'string or integer'),
])
def test_other_non_strings_are_rejected_with_how_to_write_them(value, reason):
    row = pred("d1", {"x": 0.5})
    row["labels"][0]["value"] = value
    table, bad = parse_jsonl_block(jsonl([pred("d0", {1: 0.5}), row]), 1, PRED, [])
    assert bad == [(2, reason)] and table.num_rows == 1
    assert check_row(json.loads(json.dumps(row)), True) == reason


# ----------------------------------------------------------------------------- item 2: Parquet typing

def write_row_groups(path, groups, value_type=pa.string(), score_type=pa.string()):
    """A Parquet prediction file with one row group per list of (uid, value, score) rows."""
    label = pa.struct([("key", pa.string()), ("value", value_type), ("score", score_type)])
    schema = pa.schema([("datum_uid", pa.string()), ("labels", pa.list_(label))])
    with pq.ParquetWriter(path, schema) as writer:
        for rows in groups:
            writer.write_table(pa.table({
                "datum_uid": [u for u, _, _ in rows],
                "labels": [[{"key": "class", "value": v, "score": s}] for _, v, s in rows]},
                schema=schema))
    return path


def reasons_of(tables):
    out = {}
    for table in tables:
        rows, rejects = validate(table, scored=True, file_id=0)
        out.update({position: reason for position, _, reason in rejects})
    return out


def test_parquet_scores_follow_the_jsonl_rule_in_every_row_group(tmp_path):
    path = write_row_groups(tmp_path / "p.parquet",
                            [[(f"d{i}", "cat", "0.5") for i in range(20)],
                             [("d20", "cat", "0.25")], [("d21", "cat", "abc"), ("d22", "cat", None)]])
    with open(path, "rb") as stream:
        tables = list(parquet_tables(stream, PRED, [], batch_rows=8))   # several batches
    reasons = reasons_of(tables)
    assert len(reasons) == 23
    for position, score in ((0, "0.5"), (20, "0.25"), (21, "abc")):
        jsonl_reason = check_row(pred("x", {"cat": score}), True)
        assert reasons[position] == jsonl_reason == f'label score must be a number, got str "{score}"'
    assert reasons[22] == "label without score"   # a null score in a text column: as in JSONL


def test_parquet_integer_values_are_text_and_other_types_are_rejected(tmp_path):
    ints = write_row_groups(tmp_path / "i.parquet", [[("d0", 3, 0.5), ("d1", -12, 1)]],
                            value_type=pa.int64(), score_type=pa.float32())
    bools = write_row_groups(tmp_path / "b.parquet", [[("d0", True, 0.5), ("d1", None, 0.5)]],
                             value_type=pa.bool_(), score_type=pa.float64())
    scores_bool = write_row_groups(tmp_path / "s.parquet", [[("d0", "cat", True)]],
                                   value_type=pa.string(), score_type=pa.bool_())
    with open(ints, "rb") as stream:
        (table,) = parquet_tables(stream, PRED, [])
    assert REASON not in table.column_names
    assert [r[0] for r in table.column("labels").to_pylist()] == [
        {"key": "class", "value": "3", "score": 0.5}, {"key": "class", "value": "-12", "score": 1.0}]
    with open(bools, "rb") as stream:
        assert reasons_of(parquet_tables(stream, PRED, [])) == {
            0: 'label value must be a string or an integer, got bool true: write it as a string ("true")',
            1: "label without value"}
    with open(scores_bool, "rb") as stream:
        assert reasons_of(parquet_tables(stream, PRED, [])) == {
            0: "label score must be a number, got bool true"}


# ----------------------------------------------------------------------------- item 3: depth, surrogates, long lines

def test_deep_lines_measure_depth_like_safe_json():
    rng = random.Random(5)
    alphabet = ['{', '[', '}', ']', '"', '\\', 'a', ' ', ':', ',']
    lines = [b'{"a":' * 70 + b'1' + b'}' * 70, b'["]",' * 100, b'', b'"\\\\"' + b'[' * 66]
    for _ in range(1500):
        weights = rng.choice([[1] * 10, [8, 8, 1, 1, 3, 2, 1, 1, 1, 1], [10, 10, 1, 1, 1, 0, 1, 1, 1, 1]])
        lines.append("".join(rng.choices(alphabet, weights, k=rng.choice([5, 80, 300]))).encode())
    block = b"\n".join(lines) + b"\n"
    for limit in (3, 20, 64):
        expected = [i for i, line in enumerate(lines) if nesting_depth(line) > limit]
        assert deep_lines(block, limit).tolist() == expected, limit
    assert deep_lines(block).tolist()[:2] == [0, 1] and 3 in deep_lines(block).tolist()
    # valid JSON only (each line balanced: the whole-block counts apply), strings with brackets
    valid = [json.dumps({"labels": [{"value": "]" * 70 + "\\\"[", "x": [[[[1]]]]}] * 80}),
             json.dumps({"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
             json.dumps({"q": "\"" * 3, "r": [{"s": "[" * 100}] * 70})]
    block = ("\n".join(valid * 3) + "\n").encode()
    for limit in (3, 6, 64):
        expected = [i for i, line in enumerate(block.splitlines()) if nesting_depth(line) > limit]
        assert deep_lines(block, limit).tolist() == expected, limit
    assert deep_lines(block, 64).tolist() == [1, 4, 7]


@pytest.mark.parametrize("slice_keys", [[], ["region"]])
def test_a_line_nested_100000_deep_is_a_rejected_row_not_a_crash(slice_keys):
    """Arrow's JSON reader overflows its stack (a segfault) on such a line and Python's json
    raises RecursionError: run in a subprocess so a crash fails the test instead of pytest."""
    program = f"""
import json
from evalbeam.schemas.classification_rows import CLASSIFICATION_GROUNDTRUTH, parse_jsonl_block
good = [json.dumps({{"datum_uid": f"g{{i}}", "metadata": {{"region": "a"}},
                     "labels": [{{"key": "class", "value": "cat"}}]}}) for i in range(3)]
n = {DEEP}
deep = '{{"datum_uid": "deep", "labels": [], "metadata": ' + '{{"a": ' * n + "1" + "}}" * n + "}}"
block = "\\n".join(good[:2] + [deep] + good[2:]).encode() + b"\\n"
table, bad = parse_jsonl_block(block, 1, CLASSIFICATION_GROUNDTRUTH, {slice_keys!r})
print(json.dumps([table.column("datum_uid").to_pylist(), bad]))
"""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            cwd=str(ROOT), env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    uids, bad = json.loads(result.stdout.splitlines()[-1])
    assert uids == ["g0", "g1", "g2"] and bad == [[3, "JSON nested deeper than 64 levels"]]


def test_lone_surrogates_and_bom(monkeypatch):
    rows = [pred("d0", {"cat": 0.5}),
            '{"datum_uid": "d1", "labels": [{"key": "class", "value": "\\ud800", "score": 0.5}]}',
            '{"datum_uid": "d2", "labels": [{"key": "class", "value": "\\ud83d\\ude00", "score": 0.5}]}']
    table, bad = parse_jsonl_block(jsonl(rows), 1, PRED, [])
    assert [line for line, _ in bad] == [2] and SURROGATE in bad[0][1]
    assert table.column("labels").to_pylist()[1][0]["value"] == "\U0001F600"   # a valid pair
    no_slow_path(monkeypatch)
    bom, bad = parse_jsonl_block(b"\xef\xbb\xbf" + jsonl([rows[0]]), 1, PRED, [])
    assert bom.num_rows == 1 and not bad


def test_a_bom_is_dropped_at_byte_0_of_the_file_only_whatever_the_blocks(monkeypatch):
    """Arrow's reader drops a BOM at the start of any block it reads, the line-by-line reader
    rejects a line that starts with one: the file's BOM (byte 0) is dropped before either sees
    it, and a block that starts with a BOM further on is still read line by line. Before the
    fix line 3 was a row, and would still be one in a block of its own without the blank line
    jsonl_blocks puts before it."""
    rows = [jsonl([pred(f"d{i}", {"cat": 0.5})]) for i in range(5)]
    data = BOM + rows[0] + b"{bad\n" + BOM + rows[2] + rows[3] + rows[4]
    ends = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    for cut in [0] + ends[:-1]:
        for block_size in (16 << 20, 40, 7):
            first = 1 + data.count(b"\n", 0, cut)
            pieces = list(jsonl_blocks(io.BytesIO(data[:cut]), block_size)) if cut else []
            pieces += list(jsonl_blocks(io.BytesIO(data[cut:]), block_size, first_line=first))
            parsed = [parse_jsonl_block(block, line, PRED, []) for block, line in pieces]
            uids = [uid for table, _ in parsed for uid in table.column("datum_uid").to_pylist()]
            bad = [(line, reason.split(":")[0]) for _, rejects in parsed for line, reason in rejects]
            assert uids == ["d0", "d3", "d4"] and bad == [(2, "malformed JSON"), (3, BOM_REASON)], \
                (cut, block_size)
    # a good block with the file's BOM still takes Arrow's path
    no_slow_path(monkeypatch)
    (block, line), = jsonl_blocks(io.BytesIO(BOM + rows[0] + rows[1]))
    assert parse_jsonl_block(block, line, PRED, [])[0].num_rows == 2


class CountingStream(io.BytesIO):
    """A stream that records the largest read asked of it."""
    largest = 0

    def read(self, size=-1):
        self.largest = max(self.largest, size)
        return super().read(size)


def test_jsonl_blocks_never_hold_a_line_longer_than_the_limit():
    long_line = b'{"datum_uid": "' + b"x" * 5000 + b'"}'
    data = (jsonl([pred("d1", {"a": 0.5})]) + long_line + b"\n" + jsonl([pred("d3", {"a": 0.5})])
            + b"\n" + long_line)                     # line 4 blank, line 5 long without newline
    for block_size in (64, 1000, 1 << 20):
        blocks = list(jsonl_blocks(CountingStream(data), block_size, max_line_bytes=1000))
        assert all(len(b) <= block_size + 1000 + 1 for b, _ in blocks)
        skipped = [(first, b.limit) for b, first in blocks if isinstance(b, SkippedLine)]
        assert skipped == [(2, 1000), (5, 1000)], block_size
        parsed = [parse_jsonl_block(b, first, PRED, []) for b, first in blocks]
        assert [uid for t, _ in parsed for uid in t.column("datum_uid").to_pylist()] == ["d1", "d3"]
        assert [r for _, bad in parsed for r in bad] == [(2, "line longer than 1,000 bytes"),
                                                         (5, "line longer than 1,000 bytes")]


# ----------------------------------------------------------------------------- item 4: non-finite slice values

def test_non_finite_slice_values_are_rejected_on_every_reader(monkeypatch, tmp_path):
    reason = NAN_REASON
    rows = ['{"datum_uid": "a", "metadata": {"region": 1.5}, "labels": [{"key": "c", "value": "x"}]}',
            '{"datum_uid": "b", "metadata": {"region": NaN}, "labels": [{"key": "c", "value": "x"}]}',
            '{"datum_uid": "c", "metadata": {"region": -Infinity}, "labels": [{"key": "c", "value": "x"}]}',
            '{"datum_uid": "d", "metadata": {"region": {"lat": NaN}}, "labels": [{"key": "c", "value": "x"}]}']
    slow, bad = parse_jsonl_block(jsonl(rows), 1, GT, ["region"])   # mixed types: slow path
    assert [line for line, _ in bad] == [2, 3, 4] and bad[0][1].startswith(reason)
    assert "is -inf" in bad[1][1] and slow.num_rows == 1
    table, _ = parse_jsonl_block(jsonl(rows[3:]), 1, GT, [])       # not sliced on: fine
    assert table.num_rows == 1
    no_slow_path(monkeypatch)
    fast, bad = parse_jsonl_block(jsonl(rows[:3]), 1, GT, ["region"])
    kept, rejects = validate(fast, scored=False, file_id=0)
    assert not bad and [p for p, _, _ in rejects] == [2, 3]
    assert rejects[0][2].startswith(reason) and rejects[1][2].startswith("metadata 'region' is -inf")
    assert kept.uid.to_pylist() == ["a"]

    path = tmp_path / "gt.parquet"
    pq.write_table(pa.table({"datum_uid": ["a", "b"], "metadata": [{"region": 1.0}, {"region": float("nan")}],
                             "labels": [[{"key": "c", "value": "x"}]] * 2}), path)
    with open(path, "rb") as stream:
        (table,) = parquet_tables(stream, GT, ["region"])
    assert [r[:len(reason)] for _, _, r in validate(table, False, 0)[1]] == [reason]

    dict_table, bad = dict_rows_table([json.loads(rows[0]), {**json.loads(rows[0]), "metadata": {"region": float("inf")}},
                                       {"datum_uid": "s", "labels": [{"key": "c", "value": "\ud800"}]}],
                                      0, GT, ["region"])
    assert dict_table.num_rows == 1 and "is inf" in bad[0][1] and SURROGATE in bad[1][1]


# ----------------------------------------------------------------------------- item 5: resource limits

def test_memory_model_and_bounds():
    from evalbeam.transforms.classification import VocabularyCombineFn
    from evalbeam.transforms.kernels.classification import (STATE_BUDGET_BYTES, ClassificationConfig,
                                                   DEFAULT_METRIC_TYPES)

    config = ClassificationConfig()
    # the 74.5 GiB: one int64 confusion matrix of 100,001 x 100,001 at one threshold
    assert config.state_bytes(100_000) / 2**30 == pytest.approx(74.58, abs=0.01)
    limit = config.value_limit
    assert config.state_bytes(limit) <= STATE_BUDGET_BYTES < config.state_bytes(limit + 1)
    assert limit == 5742 and config.labels_per_row_limit == limit
    linear = ClassificationConfig(metrics=frozenset(DEFAULT_METRIC_TYPES) - {"ConfusionMatrix"})
    assert linear.value_limit == 338_933
    assert ClassificationConfig(max_label_values=10, max_labels_per_row=3).labels_per_row_limit == 3

    combine = VocabularyCombineFn(limit=3)
    acc = combine.add_input(combine.create_accumulator(), {"a": {"1", "2"}, "b": {"x"}})
    acc = combine.merge_accumulators([acc, combine.add_input({}, {"a": {"3", "4"}, "b": {"x", "y"}})])
    assert combine.extract_output(acc) == {"a": None, "b": ["x", "y"]}

    table, _ = parse_jsonl_block(jsonl([pred("big", {str(i): 0.5 for i in range(7)}),
                                        pred("ok", {str(i): 0.5 for i in range(6)})]), 1, PRED, [])
    rows, rejects = validate(table, scored=True, file_id=0, max_labels=6)
    assert rows.uid.to_pylist() == ["ok"] and rejects == [(
        1, "big", "7 labels in one row, more than --max_labels_per_row allows (6); raise it if "
                  "rows this large are meant")]


# ----------------------------------------------------------------------------- items 1-5 end to end

CLASSES = list(range(6))
REGIONS = {"a": [0, 1, 2], "b": [2, 3, 4], "c": CLASSES}


def make_rows(seed=11, n=240):
    """Ground truth and two models with integer labels; class 9 is scored (low) for every datum
    but is nobody's truth and never the top score; model_b also predicts a key the ground truth
    lacks."""
    rng = random.Random(seed)
    truth, models = [], {"model_a": [], "model_b": []}
    for i in range(n):
        region = "abc"[i % 3]
        value = rng.choice(REGIONS[region])
        truth.append(gt(f"d{i:03d}", value, region))
        for m, skill in (("model_a", 0.7), ("model_b", 0.5)):
            top = value if rng.random() < skill else rng.choice(CLASSES)
            scores = {c: round(rng.uniform(0.01, 0.3), 6) for c in CLASSES}
            scores[top] = round(rng.uniform(0.31, 0.99), 6)
            scores[9] = round(rng.uniform(0.0001, 0.001), 6)
            row = pred(f"d{i:03d}", scores)
            if m == "model_b" and i % 4 == 0:
                row["labels"].append({"key": "shape", "value": 7, "score": 0.5})
            models[m].append(row)
    return truth, models


def as_text(rows):
    return [{**r, "labels": [{**label, "value": str(label["value"])} for label in r["labels"]]}
            for r in rows]


HOSTILE_GT = [
    deep_line(where="extra"),                                                        # 1
    '{"datum_uid": "nan", "metadata": {"region": NaN}, "labels": [{"key": "class", "value": 1}]}',
    '{"datum_uid": "inf", "metadata": {"region": Infinity}, "labels": [{"key": "class", "value": 1}]}',
    '{"datum_uid": "\\udc00", "metadata": {"region": "a"}, "labels": [{"key": "class", "value": 1}]}',
    gt("float", 3.0), gt("bool", True),                                              # 5, 6
]
HOSTILE_GT_REASONS = ["JSON nested deeper than 64 levels", NAN_REASON, "metadata 'region' is inf",
                      "the value of 'datum_uid' holds a lone UTF-16 surrogate",
                      "got float 3.0", "got bool true"]


def test_integer_labels_and_hostile_rows_end_to_end(tmp_path):
    """Item 1: an int-labelled input (JSONL fast and slow path, Parquet int column) gives the
    metrics of the same input with string labels, byte for byte, in the multi-process runner;
    items 3-5: hostile rows beside it are rejected rows with their reasons, nothing crashes;
    item 7: a key the ground truth lacks is a warning (exit 0 on the clean input)."""
    truth, models = make_rows()
    ints = tmp_path / "ints"
    write_jsonl(ints / "gt-1.jsonl", truth[:200])                       # Arrow, integer values
    write_jsonl(ints / "gt-2.jsonl", truth[200:] + HOSTILE_GT)          # the slow path
    write_jsonl(ints / "a-1.jsonl", models["model_a"])
    write_jsonl(ints / "a-2.jsonl", [pred("d000", {i: 0.5 for i in range(100_000)}),
                                     pred("d001", {"cat": "0.5"}),
                                     '{"datum_uid": "d002", "labels": [{"key": "class", "value": "\\ud800", "score": 0.1}]}'])
    pq.write_table(pa.Table.from_pylist(models["model_b"]), ints / "b.parquet")
    assert pq.read_schema(ints / "b.parquet").field("labels").type.value_type.field("value").type == pa.int64()
    text = tmp_path / "text"
    write_jsonl(text / "gt.jsonl", as_text(truth))
    write_jsonl(text / "a.jsonl", as_text(models["model_a"]))
    pq.write_table(pa.Table.from_pylist(as_text(models["model_b"])), text / "b.parquet")

    def run(folder, gt_glob, a_glob, *extra):
        return run_classification(["--groundtruths", folder / gt_glob, "--predictions",
                                   f"model_a={folder / a_glob}", "--predictions",
                                   f"model_b={folder / 'b.parquet'}", "--output", folder / "out",
                                   "--quiet", "--slice", "region", "--num_shards", "3", *extra])

    assert run(text, "gt.jsonl", "a.jsonl") == 0
    assert run(ints, "gt-*.jsonl", "a-*.jsonl", *MULTIPROCESS) == 1
    assert (ints / "out" / "metrics.jsonl").read_bytes() == (text / "out" / "metrics.jsonl").read_bytes()

    rejects = {(Path(r["file"]).name, r["line"]): r["reason"] for r in read_jsonl(ints / "out" / "rejected.jsonl")}
    for line, reason in enumerate(HOSTILE_GT_REASONS, start=41):
        assert reason in rejects.pop(("gt-2.jsonl", line)), (line, reason)
    assert rejects.pop(("a-2.jsonl", 1)).startswith("100,000 labels in one row, more than "
                                                    "--max_labels_per_row allows (5,742)")
    assert rejects.pop(("a-2.jsonl", 2)) == 'label score must be a number, got str "0.5"'
    assert SURROGATE in rejects.pop(("a-2.jsonl", 3))
    assert rejects == {}
    for folder in (ints, text):
        info = json.loads((folder / "out" / "run.json").read_text())
        assert [(p["severity"], p["code"]) for p in info["problems"]] == [("warning", "label_key_unmatched")]
        assert "'shape'" in info["problems"][0]["message"]


# ----------------------------------------------------------------------------- item 6: summary

def test_summary_macro_means_equal_sklearn_default_label_set(tmp_path):
    from sklearn.metrics import precision_recall_fscore_support

    from evalbeam.pipelines.tasks.classification import classification_summary
    from evalbeam.transforms.kernels.classification import ClassificationConfig

    truth, models = make_rows(seed=4, n=150)
    write_jsonl(tmp_path / "gt.jsonl", as_text(truth))
    write_jsonl(tmp_path / "a.jsonl", as_text(models["model_a"]))
    assert run_classification(["--groundtruths", tmp_path / "gt.jsonl", "--predictions",
                               f"model_a={tmp_path / 'a.jsonl'}", "--output", tmp_path / "out",
                               "--quiet", "--slice", "region", "--metrics",
                               "Counts,Precision,Recall,F1,Accuracy"]) == 0
    text = classification_summary(str(tmp_path / "out" / "metrics.jsonl"), {}, ClassificationConfig())
    assert "macro means over the label values present in the slice" in text
    shown = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == "model_a":
            shown[cells[1]] = [float(c) for c in cells[4:7]]

    def top(row):   # hardmax: the highest score, ties to the smallest value (text order)
        scored = [(-label["score"], str(label["value"])) for label in row["labels"] if label["key"] == "class"]
        return min(scored)[1]

    predicted = {row["datum_uid"]: top(row) for row in models["model_a"]}
    for name, regions in (("(all)", "abc"), ("region=a", "a"), ("region=b", "b"), ("region=c", "c")):
        rows = [r for r in truth if r["metadata"]["region"] in regions]
        y_true = [str(r["labels"][0]["value"]) for r in rows]
        y_pred = [predicted[r["datum_uid"]] for r in rows]
        expected = precision_recall_fscore_support(y_true, y_pred, average="macro", zero_division=0)[:3]
        assert shown[name] == pytest.approx([round(v, 4) for v in expected], abs=1e-4), name


# ----------------------------------------------------------------------------- items 2, 5, 7 end to end

def test_label_findings_vocabulary_bound_and_late_parquet_row_group(tmp_path, capsys):
    """Keys disjoint and values disjoint are errors (exit 4, incomplete), a key with more values
    than --max_label_values is not evaluated (an error, no allocation), and a Parquet score
    column of strings with "abc" in a later row group is rejected row by row (no traceback)."""
    truth = [{"datum_uid": f"d{i}", "labels": [{"key": "class", "value": str(i % 2)},
                                               {"key": "big", "value": f"v{i % 8}"}]} for i in range(40)]
    write_jsonl(tmp_path / "gt.jsonl", truth)
    write_jsonl(tmp_path / "keys.jsonl", [pred(f"d{i}", {"cat": 0.9}, key="species") for i in range(40)])
    write_jsonl(tmp_path / "values.jsonl", [pred(f"d{i}", {"cat": 0.9, "dog": 0.1}) for i in range(40)])
    write_row_groups(tmp_path / "strings.parquet",
                     [[(f"d{i}", "0", "0.5") for i in range(g, g + 10)] for g in (0, 10, 20)]
                     + [[("d30", "1", "abc")]])
    code = run_classification(["--groundtruths", tmp_path / "gt.jsonl",
                               "--predictions", f"keys={tmp_path / 'keys.jsonl'}",
                               "--predictions", f"values={tmp_path / 'values.jsonl'}",
                               "--predictions", f"strings={tmp_path / 'strings.parquet'}",
                               "--output", tmp_path / "out", "--quiet", "--max_label_values", "5"])
    assert code == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err and 'the run is incomplete (status "incomplete", exit 4)' in err
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["status"] == "incomplete"
    codes = {(p["code"], p["message"].split(":")[0]) for p in info["problems"]}
    assert codes == {
        ("label_keys_disjoint", "model 'keys'"), ("label_values_disjoint", "model 'values'"),
        ("label_values_over_limit", "label key 'big' has more than 5 distinct values (ground truth and "
                                    "predictions together), so none of its metrics was computed"),
        ("nothing_evaluated", "no prediction row of model 'strings' could be evaluated")}
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    keys = {r["parameters"].get("label_key") or r["parameters"]["label"]["key"] for r in records}
    assert keys == {"class", "species"}
    rejects = [r for r in read_jsonl(tmp_path / "out" / "rejected.jsonl") if r["source"] == "strings"]
    assert [r["row"] for r in rejects] == list(range(31))
    assert rejects[-1]["reason"] == 'label score must be a number, got str "abc"'


def test_each_model_has_its_own_vocabulary_bound(tmp_path):
    """A model whose predicted values push a key past --max_label_values loses that key alone:
    the other model of the run is evaluated on the ground truth's values and its own, exactly
    as when run alone (no record of it depends on the other model), and the error names the
    model."""
    truth = [{"datum_uid": f"d{i}", "labels": [{"key": "class", "value": str(i % 2)}]} for i in range(30)]
    write_jsonl(tmp_path / "gt.jsonl", truth)
    write_jsonl(tmp_path / "calm.jsonl", [pred(f"d{i}", {"0": 0.7, "1": 0.3}) for i in range(30)])
    write_jsonl(tmp_path / "noisy.jsonl", [pred(f"d{i}", {f"junk{i}": 0.9, "1": 0.2}) for i in range(30)])
    common = ["--groundtruths", tmp_path / "gt.jsonl", "--quiet", "--max_label_values", "5"]
    assert run_classification(common + ["--predictions", f"calm={tmp_path / 'calm.jsonl'}",
                                        "--predictions", f"noisy={tmp_path / 'noisy.jsonl'}",
                                        "--output", tmp_path / "both"]) == 4
    assert run_classification(common + ["--predictions", f"calm={tmp_path / 'calm.jsonl'}",
                                        "--output", tmp_path / "calm"]) == 0
    problems = json.loads((tmp_path / "both" / "run.json").read_text())["problems"]
    assert [(p["code"], p.get("model")) for p in problems] == [("label_values_over_limit", "noisy")]
    assert problems[0]["message"].startswith("model 'noisy': label key 'class' has more than 5")
    both = read_jsonl(tmp_path / "both" / "metrics.jsonl")
    assert {r["model"] for r in both} == {"calm"}
    alone = (tmp_path / "calm" / "metrics.jsonl").read_text().splitlines()
    assert [json.dumps(r, ensure_ascii=False) for r in both] == alone


# ----------------------------------------------------------------------------- item 8: valor-lite's true negatives

def test_true_negatives_differ_from_valor_lite_as_documented():
    """valor-lite counts a true negative for label v only on datums whose prediction lists v;
    evalbeam counts every datum of the population (a missing score is 0), as scikit-learn's
    one-vs-rest confusion matrices do. tp, fp and fn agree."""
    from sklearn.metrics import multilabel_confusion_matrix
    from valor_lite.classification import Classification, Loader

    from evalbeam.transforms.kernels.classification import ClassificationConfig, key_metrics, match_key
    from evalbeam.schemas.hashing import fnv1a_64

    data = [("d1", "cat", {"cat": 0.7, "dog": 0.3}),
            ("d2", "dog", {"dog": 0.6, "bird": 0.4}),
            ("d3", "bird", {"bird": 0.9})]
    loader = Loader.in_memory()
    loader.add_data([Classification(uid=u, groundtruth=g, predictions=list(s), scores=list(s.values()))
                     for u, g, s in data])
    metrics = loader.finalize().compute_precision_recall(score_thresholds=[0.0], hardmax=True)
    valor = {m.parameters["label"]: m.value for kind, found in metrics.items()
             if "Counts" in str(kind) for m in found}

    vocab = ["bird", "cat", "dog"]
    uids = pa.array([u for u, _, _ in data])
    entries = [(i, vocab.index(v), s) for i, (_, _, scores) in enumerate(data) for v, s in scores.items()]
    config = ClassificationConfig(metrics=frozenset({"Counts"}))
    state = match_key(np.array([vocab.index(g) for _, g, _ in data], np.int32), fnv1a_64(uids), uids,
                      np.array([e[0] for e in entries]), np.array([e[1] for e in entries], np.int32),
                      np.array([e[2] for e in entries]), len(vocab), config)
    ours = {r["parameters"]["label"]["value"]: r["value"] for r in key_metrics(state, "class", vocab, config)}

    assert valor == {"cat": {"tp": 1, "fp": 0, "fn": 0, "tn": 0},
                     "dog": {"tp": 1, "fp": 0, "fn": 0, "tn": 1},
                     "bird": {"tp": 1, "fp": 0, "fn": 0, "tn": 1}}
    assert ours == {v: {"tp": 1, "fp": 0, "fn": 0, "tn": 2} for v in vocab}
    sklearn_tn = multilabel_confusion_matrix([g for _, g, _ in data], [g for _, g, _ in data],
                                             labels=vocab)[:, 0, 0]
    assert sklearn_tn.tolist() == [2, 2, 2]


# ----------------------------------------------------------------------------- item 9: the wrong command

def test_detection_rows_given_to_classification_name_the_right_command(tmp_path, capsys):
    truth = write_jsonl(tmp_path / "gt.jsonl", [gt("a", "cat")])
    boxes = write_jsonl(tmp_path / "boxes.jsonl", [
        {"datum_uid": "a", "annotations": [{"label": "cat", "score": 0.9, "bbox": [0, 0, 5, 5]}]}])
    code = run_classification(["--groundtruths", truth, "--predictions", f"m={boxes}",
                               "--output", tmp_path / "out", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "holds detection rows" in err and "evaluate it with 'evalbeam detection'" in err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- the PTransform on dict rows

def test_ptransform_reads_integer_labels_and_refuses_a_vocabulary_beyond_its_bound(tmp_path):
    import apache_beam as beam

    from evalbeam.pipelines.launch.common import local_pipeline
    from evalbeam.transforms.classification import EvaluateClassification
    from evalbeam.transforms.kernels.classification import ClassificationConfig

    truth, models = make_rows(seed=2, n=30)
    numpy_ints = [{**r, "labels": [{**label, "value": np.int64(label["value"])} for label in r["labels"]]}
                  for r in models["model_a"]]
    config = ClassificationConfig(metrics=frozenset({"Counts", "Accuracy", "ROCAUC"}))

    def keep(records, path):
        Path(path).write_text("\n".join(sorted(json.dumps(r, sort_keys=True) for r in records)))

    with local_pipeline() as pipeline:
        for name, gt_rows, pred_rows in (("ints", truth, numpy_ints),
                                         ("text", as_text(truth), as_text(models["model_a"]))):
            inputs = {"groundtruths": pipeline | f"GT {name}" >> beam.Create(gt_rows),
                      "m": pipeline | f"P {name}" >> beam.Create(pred_rows)}
            _ = (inputs | f"Evaluate {name}" >> EvaluateClassification(config, num_shards=2)
                 | f"Gather {name}" >> beam.combiners.ToList()
                 | f"Keep {name}" >> beam.Map(keep, str(tmp_path / name)))
    ints, text = (tmp_path / "ints").read_text(), (tmp_path / "text").read_text()
    assert ints == text and len(text.splitlines()) > 10

    with pytest.raises(Exception, match="label key 'class' has more than 3 distinct values"):
        with local_pipeline() as pipeline:
            inputs = {"groundtruths": pipeline | "GT" >> beam.Create(as_text(truth)),
                      "m": pipeline | "P" >> beam.Create(as_text(models["model_a"]))}
            _ = inputs | EvaluateClassification(ClassificationConfig(max_label_values=3), num_shards=2)


# ----------------------------------------------------------------------------- text that is not UTF-8

def arrow_strings(values: list[bytes]) -> pa.Array:
    """A string array holding these bytes unchecked, as Arrow reads a Parquet file's strings."""
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))])


def test_bytes_that_are_not_utf8_are_rejected_rows(tmp_path):
    """Arrow's JSON reader and Parquet reader pass such bytes into string columns, and Python's
    json decodes the UTF-8 form of a lone surrogate (ED A0 80) with surrogatepass: each would
    crash the run later, when the text is converted."""
    good = jsonl([pred("a", {"cat": 0.5}), pred("d", {"caf\u00e9": 0.5})])
    block = (good + b'{"datum_uid": "b\xed\xa0\x80", "labels": []}\n'
             + b'{"datum_uid": "c", "labels": [{"key": "k", "value": "c\xffat", "score": 0.5}]}\n')
    table, bad = parse_jsonl_block(block, 1, PRED, [])
    assert table.column("datum_uid").to_pylist() == ["a", "d"]
    assert bad == [(3, "the line holds text that is not valid UTF-8 (invalid continuation byte at byte 16)"),
                   (4, "the line holds text that is not valid UTF-8 (invalid start byte at byte 54)")]

    label = pa.struct([("key", pa.string()), ("value", pa.string()), ("score", pa.float64())])
    labels = pa.ListArray.from_arrays(pa.array([0, 1, 2, 3, 4], pa.int32()), pa.StructArray.from_arrays(
        [pa.array(["class"] * 4), arrow_strings([b"cat", b"d\xed\xa0\x80g", b"cow", b"ox"]),
         pa.array([0.5] * 4)], fields=list(label)))
    metadata = pa.StructArray.from_arrays([arrow_strings([b"n", b"s", b"e", b"w\xff"])], names=["region"])
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"datum_uid": arrow_strings([b"a", b"b", b"\xffc", b"d"]),
                             "metadata": metadata, "labels": labels}), path)
    with open(path, "rb") as stream:
        (table,) = parquet_tables(stream, PRED, ["region"])
    rows, rejects = validate(table, scored=True, file_id=0)
    assert rows.uid.to_pylist() == ["a"] and rejects == [
        (1, "b", "label value holds text that is not valid UTF-8 (invalid continuation byte at byte 1)"),
        (2, None, "datum_uid holds text that is not valid UTF-8 (invalid start byte at byte 0)"),
        (3, "d", "metadata 'region' holds text that is not valid UTF-8 (invalid start byte at byte 1)")]
