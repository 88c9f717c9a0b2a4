"""Gates and the comparison with a baseline: the verdicts on hand-built records, the checks made
before a run (exit 2), and whole runs: exit 5 after every output is written, gates.json and
comparison.jsonl contents, run.json's sections, on both DirectRunner modes."""

from __future__ import annotations

import json
import os

import pytest

from evalbeam.pipelines.quality import comparison
from evalbeam.pipelines.quality import gates as gating
from evalbeam.pipelines.launch.common import UsageError
from helpers import MULTIPROCESS, ROOT, page_problems, read_jsonl, run_classification

INPUTS = ROOT / "tests" / "golden" / "inputs" / "classification"


def rec(type_, value, model="m", slice_=None, interval=None, **params):
    r = {"type": type_, "value": value, "parameters": params, "model": model, "slice": slice_ or {}}
    if interval is not None:
        r["interval"] = {"low": interval[0], "high": interval[1], "confidence": 0.95}
    return r


def gate(**table):
    return gating.parse_gates([table], "test.toml")[0]


# ---- parsing and the checks before a run ---------------------------------------------------------

@pytest.mark.parametrize("table, words", [
    ({"min": 0.5}, "`metric`"),
    ({"metric": "Accuracy"}, "no bound"),
    ({"metric": "Accuracy", "min": 0.9, "max": 0.1}, "above max"),
    ({"metric": "Accuracy", "min": "high"}, "finite number"),
    ({"metric": "Accuracy", "min": float("nan")}, "finite number"),
    ({"metric": "Accuracy", "max_drop": -0.1}, ">= 0"),
    ({"metric": "Accuracy", "min": 0.1, "colour": "red"}, "unknown key"),
    ({"metric": "Accuracy", "min": 0.1, "require": "always"}, "require"),
    ({"metric": "Accuracy", "min": 0.1, "slice": {"a": "x"}, "every_slice": "a"}, "not both"),
    ({"metric": "ECE", "max_drop": 0.01}, "did you mean `max_rise`"),
    ({"metric": "Accuracy", "max_rise": 0.01}, "did you mean `max_drop`"),
    ({"metric": "PIILeakage", "field": "fail", "max_drop": 0.01}, "better when lower"),
])
def test_malformed_gates_are_refused_with_the_reason(table, words):
    with pytest.raises(UsageError, match=None) as error:
        gating.parse_gates([table], "g.toml")
    assert words in str(error.value) and "g.toml: gate 1" in str(error.value)


def test_gates_that_could_check_nothing_are_refused_before_the_run():
    common = dict(metric_types={"Accuracy", "F1", "ConfusionMatrix"}, models={"a", "b"}, slices=[("region",)],
                  intervals=False, baseline=False)
    for table, words in [({"metric": "mAP", "min": 0.1}, "writes no 'mAP'"),
                         ({"metric": "Accuracy", "model": "c", "min": 0.1}, "no model 'c'"),
                         ({"metric": "ConfusionMatrix", "min": 0.1}, "curves or matrices"),
                         ({"metric": "Accuracy", "every_slice": "site", "min": 0.1}, "no --slice site"),
                         ({"metric": "Accuracy", "slice": {"site": "x"}, "min": 0.1}, "no --slice site"),
                         ({"metric": "Accuracy", "min": 0.1, "require": "interval"}, "--bootstrap"),
                         ({"metric": "Accuracy", "max_drop": 0.1}, "--baseline")]:
        with pytest.raises(UsageError) as error:
            gating.check_gates([gate(**table)], **common)
        assert words in str(error.value), (table, str(error.value))
    gating.check_gates([gate(metric="Accuracy", every_slice="region", min=0.1)], **common)


def test_a_gate_file_that_is_missing_or_not_toml_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        gating.load_gates(str(tmp_path / "none.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[[gate]\nmetric=")
    with pytest.raises(UsageError, match="not valid TOML"):
        gating.load_gates(str(bad))
    empty = tmp_path / "empty.toml"
    empty.write_text("[other]\nx = 1\n")
    with pytest.raises(UsageError, match="unknown table"):
        gating.load_gates(str(empty))


# ---- verdicts ----------------------------------------------------------------------------------

def test_value_bounds_and_selection():
    records = [rec("Accuracy", 0.91, "a", label_key="class", score_threshold=0.5),
               rec("Accuracy", 0.89, "b", label_key="class", score_threshold=0.5),
               rec("Accuracy", 0.70, "a", {"region": "eu"}, label_key="class", score_threshold=0.5),
               rec("Accuracy", 0.95, "a", {"region": "us"}, label_key="class", score_threshold=0.5),
               rec("Accuracy", 0.99, "a", {"region": "us", "site": "x"}, label_key="class", score_threshold=0.5)]
    checks = gating.evaluate([gate(metric="Accuracy", min=0.9)], records)
    assert [(c["model"], c["verdict"]) for c in checks] == [("a", "pass"), ("b", "fail")]
    assert "0.89 is below min 0.9" in checks[1]["reason"]
    every = gating.evaluate([gate(metric="Accuracy", model="a", every_slice="region", min=0.8)], records)
    assert [(c["slice"], c["verdict"]) for c in every] == [({"region": "eu"}, "fail"), ({"region": "us"}, "pass")]
    one = gating.evaluate([gate(metric="Accuracy", slice={"region": "us"}, max=0.9)], records)
    assert [c["verdict"] for c in one] == ["fail"]
    narrowed = gating.evaluate([gate(metric="Accuracy", parameters={"score_threshold": 0.7}, min=0.1)], records)
    assert [c["verdict"] for c in narrowed] == ["missing"]
    assert gating.summarize(narrowed) == {"passed": False, "checks": 1, "failed": 1, "verdicts": {"missing": 1}}


def test_labels_fields_and_non_scalar_records():
    records = [rec("F1", 0.8, label={"key": "class", "value": "cat"}, score_threshold=0.5),
               rec("F1", 0.3, label={"key": "class", "value": "dog"}, score_threshold=0.5),
               rec("AP", 0.6, label="car", iou_threshold=0.5),
               rec("ROUGE", {"precision": 0.5, "recall": 0.4, "fmeasure": 0.45}, rouge_type="rougeL"),
               rec("ConfusionMatrix", {"confusion_matrix": {}})]
    assert [c["verdict"] for c in gating.evaluate([gate(metric="F1", label="cat", min=0.5)], records)] == ["pass"]
    assert [c["verdict"] for c in gating.evaluate([gate(metric="AP", label="car", min=0.7)], records)] == ["fail"]
    rouge = gating.evaluate([gate(metric="ROUGE", field="fmeasure", min=0.4)], records)
    assert [(c["value"], c["verdict"]) for c in rouge] == [(0.45, "pass")]
    whole = gating.evaluate([gate(metric="ROUGE", min=0.4)], records)
    assert whole[0]["verdict"] == "fail" and "name one with `field`" in whole[0]["reason"]
    matrix = gating.evaluate([gate(metric="ConfusionMatrix", min=0.4)], records)
    assert matrix[0]["verdict"] == "fail" and "not a number" in matrix[0]["reason"]


def test_interval_required_bounds_need_the_whole_interval():
    records = [rec("Accuracy", 0.92, interval=(0.88, 0.95))]
    assert gating.evaluate([gate(metric="Accuracy", min=0.9)], records)[0]["verdict"] == "pass"
    check = gating.evaluate([gate(metric="Accuracy", min=0.9, require="interval")], records)[0]
    assert check["verdict"] == "fail" and "the interval 0.88 is below min 0.9" in check["reason"]
    assert gating.evaluate([gate(metric="Accuracy", min=0.85, require="interval")], records)[0]["verdict"] == "pass"
    assert gating.evaluate([gate(metric="Accuracy", max=0.95, require="interval")], records)[0]["verdict"] == "pass"
    assert gating.evaluate([gate(metric="Accuracy", max=0.94, require="interval")], records)[0]["verdict"] == "fail"
    bare = gating.evaluate([gate(metric="Accuracy", min=0.5, require="interval")], [rec("Accuracy", 0.9)])[0]
    assert bare["verdict"] == "fail" and "no interval" in bare["reason"]


def test_change_bounds_against_a_baseline():
    base = [rec("Accuracy", 0.90), rec("ECE", 0.10), rec("MCE", 0.0)]
    new = [rec("Accuracy", 0.885, interval=(0.86, 0.91)), rec("ECE", 0.13), rec("MCE", 0.01)]
    drop = gating.evaluate([gate(metric="Accuracy", max_drop=0.015 + 1e-9)], new, base)[0]
    assert drop["verdict"] == "pass" and drop["baseline_value"] == 0.90
    assert drop["change"] == pytest.approx(-0.015)
    assert gating.evaluate([gate(metric="Accuracy", max_drop=0.014)], new, base)[0]["verdict"] == "fail"
    assert gating.evaluate([gate(metric="Accuracy", max_drop=0.01)], new, base)[0]["verdict"] == "fail"
    # with the interval, the worst end of the interval must stay within the bound
    assert gating.evaluate([gate(metric="Accuracy", max_drop=0.02, require="interval")], new, base)[0]["verdict"] == "fail"
    assert gating.evaluate([gate(metric="Accuracy", max_drop=0.05, require="interval")], new, base)[0]["verdict"] == "pass"
    assert gating.evaluate([gate(metric="Accuracy", max_relative_drop=0.02)], new, base)[0]["verdict"] == "pass"
    assert gating.evaluate([gate(metric="Accuracy", max_relative_drop=0.01)], new, base)[0]["verdict"] == "fail"
    assert gating.evaluate([gate(metric="ECE", max_rise=0.02)], new, base)[0]["verdict"] == "fail"
    assert gating.evaluate([gate(metric="ECE", max_relative_rise=0.5)], new, base)[0]["verdict"] == "pass"
    # a relative change from 0 is infinitely large
    assert gating.evaluate([gate(metric="MCE", max_relative_rise=10.0)], new, base)[0]["verdict"] == "fail"
    missing = gating.evaluate([gate(metric="Accuracy", max_drop=0.1)], new, [])[0]
    assert missing["verdict"] == "missing_baseline"


def test_comparison_rows_against_a_hand_built_pair():
    old = [rec("Accuracy", 0.8, "a"), rec("ROUGE", {"precision": 0.5, "fmeasure": 0.4}, "a"),
           rec("Counts", {"tp": 3, "fp": 1}, "a"), rec("Curve", {"x": [1, 2]}, "a"),
           rec("Gone", 0.2, "a"), rec("Zero", 0.0, "a")]
    new = [rec("Accuracy", 0.9, "a"), rec("ROUGE", {"precision": 0.6, "fmeasure": 0.4}, "a"),
           rec("Counts", {"tp": 2, "fp": 1}, "a"), rec("Curve", {"x": [1, 3]}, "a"),
           rec("New", 0.5, "a"), rec("Zero", 0.5, "a"),
           {"type": "Comparison", "value": 0.1, "parameters": {}, "model": "b", "slice": {}}]
    rows = comparison.compare(new, old)
    by = {(r["type"], r["status"]): r for r in rows}
    assert by[("Accuracy", "both")]["change"] == pytest.approx(0.1)
    assert by[("Accuracy", "both")]["relative_change"] == pytest.approx(0.125)
    assert by[("ROUGE", "both")]["change"] == {"fmeasure": 0.0, "precision": pytest.approx(0.1)}
    assert by[("Counts", "both")]["change"] == {"fp": 0, "tp": -1}
    assert by[("Curve", "both")]["change"] is None and by[("Curve", "both")]["equal"] is False
    assert by[("Zero", "both")]["relative_change"] is None
    assert by[("New", "only_in_run")]["value"] == 0.5
    assert by[("Gone", "only_in_baseline")]["baseline_value"] == 0.2
    assert not any(r["type"] == "Comparison" for r in rows)
    assert [r["type"] for r in rows] == ["Accuracy", "ROUGE", "Counts", "Curve", "New", "Zero", "Gone"]
    summary = comparison.comparison_summary(rows)
    assert summary == {"both": 5, "only_in_run": 1, "only_in_baseline": 1, "changed": 5}


# ---- whole runs -----------------------------------------------------------------------------------

def classification_args(out, a="model_a.jsonl", b="model_b.jsonl", extra=()):
    return ["--groundtruths", INPUTS / "groundtruths.jsonl", "--predictions", f"model_a={INPUTS / a}",
            "--predictions", f"model_b={INPUTS / b}", "--slice", "region", "--output", out,
            "--max_rejected_fraction", "0.1", "--bootstrap", "20", "--quiet", *extra]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    out = tmp_path_factory.mktemp("gates") / "base"
    assert run_classification(classification_args(out)) == 0
    return out


GATES = """
[[gate]]
name = "model_a accuracy"
metric = "Accuracy"
model = "model_a"
min = 0.80

[[gate]]
metric = "Accuracy"
every_slice = "region"
max_drop = 0.01
require = "interval"

[[gate]]
metric = "F1"
label = "cat"
parameters = {score_threshold = 0.0}
min = 0.5
"""


def test_a_failed_gate_exits_5_after_every_output_is_written(tmp_path, baseline, capsys):
    gates = tmp_path / "gates.toml"
    gates.write_text(GATES)
    out = tmp_path / "new"
    # the models swapped: model_a's accuracy falls from 0.8875 to 0.73
    code = run_classification(classification_args(out, "model_b.jsonl", "model_a.jsonl",
                                                  ["--gates", gates, "--baseline", baseline]))
    assert code == 5
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete"
    assert info["gates"] == {"passed": False, "checks": 11, "failed": 5,
                             "verdicts": {"fail": 5, "pass": 6}, "file": "gates.json"}
    assert set(info["files"]) == {"metrics.jsonl", "rejected.jsonl", "comparison.jsonl", "gates.json"}
    document = json.loads((out / "gates.json").read_text())
    assert document["passed"] is False and document["baseline"] == str(baseline)
    first = document["results"][0]
    assert (first["name"], first["model"], first["value"], first["verdict"]) == \
        ("model_a accuracy", "model_a", 0.73, "fail")
    drops = [c for c in document["results"] if c["gate"] == 2]
    assert len(drops) == 8 and {c["verdict"] for c in drops if c["model"] == "model_a"} == {"fail"}
    for c in drops:
        assert c["interval"] is not None and c["change"] == pytest.approx(c["value"] - c["baseline_value"])
    new_records = {gating.record_key(r): r for r in read_jsonl(out / "metrics.jsonl")}
    old_records = {gating.record_key(r): r for r in read_jsonl(baseline / "metrics.jsonl")}
    for c in drops:
        key = gating.record_key({"type": "Accuracy", "parameters": c["parameters"], "model": c["model"],
                                 "slice": c["slice"]})
        assert c["value"] == new_records[key]["value"] and c["baseline_value"] == old_records[key]["value"]
    rows = read_jsonl(out / "comparison.jsonl")
    assert {r["status"] for r in rows} == {"both"} and len(rows) == len(new_records) - sum(
        1 for r in new_records.values() if r["type"] == "Comparison")
    acc = next(r for r in rows if r["type"] == "Accuracy" and r["model"] == "model_a" and not r["slice"])
    assert (acc["baseline_value"], acc["value"]) == (0.8875, 0.73)
    assert acc["change"] == pytest.approx(0.73 - 0.8875)
    assert info["comparison"]["both"] == len(rows)
    err = capsys.readouterr().err
    assert "gate FAIL Accuracy" in err and "gates FAILED (5 of 11 checks)" in err


def test_passing_gates_exit_0(tmp_path, baseline):
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmax_drop = 0.0\n[[gate]]\nmetric = "mROCAUC"\nmin = 0.9\n')
    out = tmp_path / "same"
    assert run_classification(classification_args(out, extra=["--gates", gates, "--baseline", baseline])) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["gates"]["passed"] and info["gates"]["checks"] == 4   # 2 gates x 2 models, whole dataset
    assert info["comparison"]["changed"] == 0


@pytest.mark.parametrize("table, words", [
    ('metric = "mAP"\nmin = 0.5', "writes no 'mAP'"),
    ('metric = "Accuracy"\nevery_slice = "site"\nmin = 0.5', "no --slice site"),
    ('metric = "Accuracy"\nmodel = "model_c"\nmin = 0.5', "no model 'model_c'"),
    ('metric = "Accuracy"\nmax_drop = 0.5', "needs --baseline"),
])
def test_a_gate_naming_what_does_not_exist_exits_2_before_the_run(tmp_path, table, words, capsys):
    gates = tmp_path / "gates.toml"
    gates.write_text(f"[[gate]]\n{table}\n")
    out = tmp_path / "out"
    assert run_classification(classification_args(out, extra=["--gates", gates])) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_an_unusable_baseline_exits_2_before_the_run(tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    assert run_classification(classification_args(out, extra=["--baseline", tmp_path / "empty"])) == 2
    assert "no run.json of evalbeam's" in capsys.readouterr().err
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "run.json").write_text(json.dumps({"written_by": "evalbeam", "status": "failed", "task": "classification"}))
    assert run_classification(classification_args(out, extra=["--baseline", failed])) == 2
    assert "did not finish" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"written_by": "evalbeam", "status": "complete", "task": "text"}))
    assert run_classification(classification_args(out, extra=["--baseline", other])) == 2
    assert "is a run of 'text'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.multiprocess
def test_gates_comparison_and_report_on_the_multi_process_runner(tmp_path, baseline):
    """The publishing step that writes them runs in a worker process: the same bytes."""
    gates = tmp_path / "gates.toml"
    gates.write_text(GATES)
    outs = []
    for name, extra in (("one", []), ("multi", MULTIPROCESS)):
        out = tmp_path / name
        code = run_classification(classification_args(
            out, "model_b.jsonl", "model_a.jsonl",
            ["--gates", gates, "--baseline", baseline, "--report", *extra]))
        assert code == 5
        outs.append(out)
    for name in ("gates.json", "comparison.jsonl", "metrics.jsonl"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    for out in outs:
        html = (out / "report.html").read_text()
        assert "FAILED: 5 of 11 checks" in html and "Against the baseline" in html
        assert json.loads((out / "run.json").read_text())["files"]["report.html"] == os.path.getsize(out / "report.html")


TYPED_GATES = """
[[gate]]
metric = "Accuracy"
slice = {region = true}
max = 1.0

[[gate]]
metric = "Accuracy"
slice = {region = 1}
max = 1.0

[[gate]]
metric = "Accuracy"
slice = {region = 1.0}
max = 1.0

[[gate]]
metric = "Accuracy"
parameters = {hardmax = true, score_threshold = 0}
max = 1.0

[[gate]]
metric = "Accuracy"
parameters = {hardmax = 1}
max = 1.0
"""


def test_gates_tell_true_1_and_1_0_apart_as_the_run_does(tmp_path):
    """The run writes slices region=true, region=1 and region=1.0 apart: a gate's slice selects
    the one slice of the same JSON value, and `hardmax = 1` does not select `hardmax: true`.
    (Python's True == 1 == 1.0 once made each of the three slice gates check all three.)"""
    from helpers import write_jsonl

    values = [True, 1, 1.0]
    gt, preds = [], []
    for i in range(12):
        truth = "x" if i % 2 else "y"
        guess = truth if i % 3 else ("y" if truth == "x" else "x")   # wrong on every region=true datum
        gt.append({"datum_uid": f"d{i}", "metadata": {"region": values[i % 3]},
                   "labels": [{"key": "k", "value": truth}]})
        preds.append({"datum_uid": f"d{i}", "labels": [
            {"key": "k", "value": "x", "score": 0.9 if guess == "x" else 0.1},
            {"key": "k", "value": "y", "score": 0.1 if guess == "x" else 0.9}]})
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "m.jsonl", preds)
    (tmp_path / "gates.toml").write_text(TYPED_GATES)
    out = tmp_path / "out"
    code = run_classification(["--groundtruths", tmp_path / "gt.jsonl", "--predictions",
                               f"m={tmp_path / 'm.jsonl'}", "--slice", "region", "--output", out,
                               "--quiet", "--gates", tmp_path / "gates.toml"])
    assert code == 5                                      # the hardmax = 1 gate matched nothing
    accuracy = {json.dumps(r["slice"]): r["value"] for r in read_jsonl(out / "metrics.jsonl")
                if r["type"] == "Accuracy"}
    assert accuracy == {"{}": pytest.approx(2 / 3), '{"region": true}': 0.0,
                        '{"region": 1}': 1.0, '{"region": 1.0}': 1.0}
    results = json.loads((out / "gates.json").read_text())["results"]
    by_gate = {g: [(json.dumps(c["slice"]), c["value"], c["verdict"]) for c in results if c["gate"] == g]
               for g in range(1, 6)}
    assert by_gate[1] == [('{"region": true}', 0.0, "pass")]
    assert by_gate[2] == [('{"region": 1}', 1.0, "pass")]
    assert by_gate[3] == [('{"region": 1.0}', 1.0, "pass")]
    assert by_gate[4] == [("{}", pytest.approx(2 / 3), "pass")]   # score_threshold 0 matches 0.0
    assert by_gate[5] == [("{}", None, "missing")]


# ---- sweeps ------------------------------------------------------------------------------------

def small_sweep(tmp_path, extra_manifest=""):
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f"""
[sweep]
bootstrap = 20
max_rejected_fraction = 0.1

[[dataset]]
name = "golden"
task = "classification"
groundtruths = "{INPUTS / 'groundtruths.jsonl'}"
options = {{ slice = ["region"] }}

[[model]]
name = "a"
predictions = "{INPUTS / 'model_a.jsonl'}"

[[model]]
name = "b"
predictions = "{INPUTS / 'model_b.jsonl'}"
{extra_manifest}
""")
    return manifest


def test_sweep_gates_against_a_baseline_sweep(tmp_path, capsys):
    from evalbeam.pipelines.sweep.command import run as sweep

    first = tmp_path / "night1"
    assert sweep([str(small_sweep(tmp_path)), "--output", str(first), "--quiet"]) == 0
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nevery_slice = "region"\nmax_drop = 0.0\n'
                     '[[gate]]\nmetric = "Accuracy"\ndataset = "golden"\nmodel = "b"\nmin = 0.8\n')
    second = tmp_path / "night2"
    code = sweep([str(small_sweep(tmp_path)), "--output", str(second), "--quiet",
                  "--gates", str(gates), "--baseline", str(first)])
    assert code == 5                                   # b's accuracy is 0.73: below 0.8
    info = json.loads((second / "sweep.json").read_text())
    assert info["gates"]["checks"] == 2 * 4 + 1 and info["gates"]["failed"] == 1
    assert info["exit_code"] == 5 and info["files"] == ["comparison.jsonl", "gates.json"]
    checks = json.loads((second / "gates.json").read_text())["results"]
    assert all(c["dataset"] == "golden" for c in checks)
    assert all(c["change"] == 0 for c in checks if c["gate"] == 1)
    rows = read_jsonl(second / "comparison.jsonl")
    assert rows and {r["dataset"] for r in rows} == {"golden"} and {r["status"] for r in rows} == {"both"}
    assert all(r.get("change") in (0, None) or r["change"] == {k: 0 for k in r["change"]} for r in rows)
    assert "gate FAIL Accuracy" in capsys.readouterr().err


def test_sweep_refuses_cell_gates_and_unknown_gate_metrics(tmp_path, capsys):
    from evalbeam.pipelines.sweep.command import run as sweep

    manifest = small_sweep(tmp_path, '[[gate]]\nmetric = "mAP"\nmin = 0.5\n')
    assert sweep([str(manifest), "--output", str(tmp_path / "out")]) == 2
    assert "applies to no cell" in capsys.readouterr().err
    manifest = small_sweep(tmp_path, '[[gate]]\nmetric = "Accuracy"\nmax_rise = 0.5\n')
    assert sweep([str(manifest), "--output", str(tmp_path / "out")]) == 2
    assert "did you mean `max_drop`" in capsys.readouterr().err
    text = small_sweep(tmp_path).read_text().replace('options = { slice = ["region"] }',
                                                     'options = { slice = ["region"], report = true }')
    (tmp_path / "cell.toml").write_text(text)
    assert sweep([str(tmp_path / "cell.toml"), "--output", str(tmp_path / "out")]) == 2
    assert "is an option of the sweep" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_baseline_broken_during_the_run_keeps_the_run_s_metrics(tmp_path, baseline, monkeypatch):
    """The baseline is read at the end of the run: if it became unreadable meanwhile, the run
    still publishes its metrics, says why it is incomplete (exit 4), and the change bounds are
    missing_baseline, never a pass."""
    import shutil

    from evalbeam.pipelines.quality import comparison as comparing

    broken = tmp_path / "broken"
    shutil.copytree(baseline, broken)
    real = comparing.read_records
    reads = []

    def read(path):
        if str(broken) in str(path):
            reads.append(path)
            if len(reads) > 1:          # the first read is the check before the run
                raise ValueError("truncated line")
        return real(path)

    monkeypatch.setattr(comparing, "read_records", read)
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmax_drop = 0.1\n')
    out = tmp_path / "out"
    assert run_classification(classification_args(out, extra=["--gates", gates, "--baseline", broken])) == 4
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "incomplete" and "metrics.jsonl" in info["files"]
    assert [p["code"] for p in info["problems"] if p["severity"] == "error"] == ["baseline_unreadable"]
    checks = json.loads((out / "gates.json").read_text())["results"]
    assert {c["verdict"] for c in checks} == {"missing_baseline"}
    (broken / "metrics.jsonl").unlink()
    assert run_classification(classification_args(tmp_path / "out2", extra=["--baseline", broken])) == 2


HOSTILE_LINES = {
    "[1, 2]": "it is a JSON list, not an object",
    '{"value": 0.5}': 'it has no string "type"',
    '{"type": "Accuracy", "value": 0.5, "model": "model_a", "slice": ["region"]}': '"slice" is not an object',
    '{"type": "Accuracy", "value": 0.5, "model": 7, "slice": {}}': '"model" is not a string',
    '{"type": "Accuracy", "value": NaN, "model": "model_a", "slice": {}}': "NaN is not a JSON number",
    '{"type": "Accuracy", "value": 1e999, "model": "model_a", "slice": {}}': "1e999 is out of range",
    '{"type": "Accuracy", "value": 0.5': "is not JSON",
}


@pytest.mark.parametrize("line", list(HOSTILE_LINES))
def test_a_hand_edited_baseline_stops_the_run_before_any_work(tmp_path, baseline, line, capsys):
    """One line of the baseline's metrics.jsonl that evalbeam cannot have written: the run stops
    at once (exit 2, nothing written) naming the file, the line and why, and that the file
    changed since evalbeam wrote it; so does `evalbeam report` of that folder. Before, such a
    line failed the night's run at its very end and lost its metrics."""
    import shutil

    from evalbeam.pipelines.report.command import run as report

    edited = tmp_path / "edited"
    shutil.copytree(baseline, edited)
    lines = (edited / "metrics.jsonl").read_text().splitlines()
    (edited / "metrics.jsonl").write_text("\n".join(lines[:3] + [line] + lines[3:]) + "\n")
    out = tmp_path / "out"
    capsys.readouterr()
    assert run_classification(classification_args(out, extra=["--baseline", edited])) == 2
    err = capsys.readouterr().err
    assert f"{edited / 'metrics.jsonl'} line 4 " in err and HOSTILE_LINES[line] in err, err
    assert "changed since evalbeam wrote it" in err and "Traceback" not in err
    assert not out.exists()
    assert report([str(edited)]) == 2
    assert "line 4" in capsys.readouterr().err
    assert not (edited / "report.html").exists()


def test_a_baseline_edited_during_the_run_keeps_the_run_s_metrics(tmp_path, baseline, monkeypatch):
    """Valid when the run starts, a JSON list by its end: the run publishes its metrics and ends
    incomplete (exit 4) with baseline_unreadable naming the line, instead of failing."""
    import shutil

    from evalbeam.pipelines.quality import comparison as comparing

    edited = tmp_path / "edited"
    shutil.copytree(baseline, edited)
    real = comparing.check_baseline

    def check_then_edit(folder, *args, **kwargs):
        info = real(folder, *args, **kwargs)
        (edited / "metrics.jsonl").write_text("[]\n")
        return info

    monkeypatch.setattr(comparing, "check_baseline", check_then_edit)
    out = tmp_path / "out"
    assert run_classification(classification_args(out, extra=["--baseline", edited])) == 4
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "incomplete" and "metrics.jsonl" in info["files"]
    [unreadable] = [p for p in info["problems"] if p["code"] == "baseline_unreadable"]
    assert "line 1 is not a metric record" in unreadable["message"]


def test_a_sweep_baseline_cell_evalbeam_cannot_have_written_is_named(tmp_path, capsys):
    """A baseline sweep's cell whose metrics.jsonl was edited (a JSON list appended) or removed:
    sweep.json's baseline_problems names the cell, the file and the line, and the change bounds
    are missing_baseline. Before, the cell was silently compared with nothing."""
    import shutil

    from evalbeam.pipelines.sweep.command import run as sweep

    first = tmp_path / "night1"
    assert sweep([str(small_sweep(tmp_path)), "--output", str(first), "--quiet"]) == 0
    with open(first / "cells" / "golden" / "a" / "metrics.jsonl", "a") as f:
        f.write("[]\n")
    shutil.move(first / "cells" / "golden" / "b" / "metrics.jsonl", tmp_path / "b-metrics.jsonl")
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmax_drop = 1.0\n')
    capsys.readouterr()
    second = tmp_path / "night2"
    assert sweep([str(small_sweep(tmp_path)), "--output", str(second), "--quiet",
                  "--gates", str(gates), "--baseline", str(first)]) == 5
    problems = json.loads((second / "sweep.json").read_text())["baseline_problems"]
    assert [(p["cell"], p["code"]) for p in problems] == [("golden/a", "baseline_unreadable"),
                                                          ("golden/b", "baseline_unreadable")]
    lines = (first / "cells" / "golden" / "a" / "metrics.jsonl").read_text().count("\n")
    assert f"metrics.jsonl line {lines} is not a metric record" in problems[0]["message"]
    assert "has no metrics.jsonl" in problems[1]["message"]
    verdicts = {c["verdict"] for c in json.loads((second / "gates.json").read_text())["results"]}
    assert verdicts == {"missing_baseline"}
    assert "evalbeam: warning: cell golden/a: the baseline's cell" in capsys.readouterr().err


@pytest.mark.parametrize("edit", [{"counts": "x"}, {"counts": {"groundtruths": []}}, {"datums": 5},
                                  {"datums": []}, {"datums": {"fingerprint": 7}},
                                  {"inputs": {"groundtruths": {"files": [1, None]}}}])
def test_data_differences_read_an_edited_run_json_of_any_shape(edit):
    """A baseline's run.json is read at the end of the run: a field edited into another shape is
    not recorded, never an exception that fails the run (it did for "counts" or "datums")."""
    run = {"counts": {"groundtruths": {"rows_evaluated": 40}},
           "datums": {"fingerprint": "ab" * 16, "evaluated": 40},
           "inputs": {"groundtruths": {"files": ["gt.jsonl"]}}}
    edited = dict(run, **edit)
    assert comparison.data_differences(run, edited) == []
    assert comparison.data_differences(edited, run) == []
    sidecar = {"datums": {"{}": {"fingerprint": "cd" * 16, "datums": 40}}}
    for other in ([], {"datums": 3}, {"datums": {"{}": "x"}}):
        assert comparison.data_differences(run, run, sidecar, other) == []


def test_a_baseline_run_json_edited_into_other_shapes_keeps_the_run(tmp_path, baseline):
    import shutil

    edited = tmp_path / "edited"
    shutil.copytree(baseline, edited)
    info = json.loads((edited / "run.json").read_text())
    info.update(counts="x", datums=5)
    (edited / "run.json").write_text(json.dumps(info))
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmodel = "model_a"\nmax_drop = 0.5\n')
    out = tmp_path / "out"
    assert run_classification(classification_args(out, extra=["--baseline", edited, "--gates",
                                                             gates, "--report"])) == 0
    assert read_jsonl(out / "comparison.jsonl")
    assert json.loads((out / "gates.json").read_text())["passed"] is True


def test_the_output_folder_as_its_own_baseline_is_refused_before_anything_changes(tmp_path, capsys):
    """`--output night --baseline night` (or a symlink to it, or with a trailing slash): the run
    would remove the baseline's files when it starts and end incomplete; a sweep would compare
    each cell with itself and pass by accident. Both stop at once, the folder as it was."""
    from evalbeam.pipelines.sweep.command import run as sweep

    night = tmp_path / "night"
    assert run_classification(classification_args(night)) == 0
    before = {p.name: p.read_bytes() for p in night.iterdir()}
    (tmp_path / "link").symlink_to(night, target_is_directory=True)
    for same in (night, f"{night}/", tmp_path / "link"):
        capsys.readouterr()
        assert run_classification(classification_args(night, extra=["--baseline", same])) == 2
        assert "is this run's --output" in capsys.readouterr().err
        assert {p.name: p.read_bytes() for p in night.iterdir()} == before
    folder = tmp_path / "sweep"
    assert sweep([str(small_sweep(tmp_path)), "--output", str(folder), "--quiet"]) == 0
    before = sorted((p, p.stat().st_mtime_ns) for p in folder.rglob("*"))
    capsys.readouterr()
    assert sweep([str(small_sweep(tmp_path)), "--output", str(folder), "--quiet", "--baseline",
                  f"{folder}/"]) == 2
    assert "compared with itself" in capsys.readouterr().err
    assert sorted((p, p.stat().st_mtime_ns) for p in folder.rglob("*")) == before


# ---- a baseline evaluated on other data ----------------------------------------------------------

def golden_subset(folder, start: int, stop: int):
    """The golden classification inputs restricted to the valid ground-truth rows [start, stop)
    and their datums' prediction rows."""
    from helpers import write_jsonl

    def rows(name):
        out = []
        for line in (INPUTS / name).read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("datum_uid"), str):
                out.append(row)
        return out

    seen, gt = set(), []
    for row in rows("groundtruths.jsonl"):
        if row["datum_uid"] not in seen and row.get("labels"):
            seen.add(row["datum_uid"])
            gt.append(row)
    gt = gt[start:stop]
    uids = {row["datum_uid"] for row in gt}
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "groundtruths.jsonl", gt)
    for name in ("model_a.jsonl", "model_b.jsonl"):
        write_jsonl(folder / name, [r for r in rows(name) if r["datum_uid"] in uids])
    return folder


def test_a_baseline_on_other_data_is_a_warning_and_fails_its_change_bounds(tmp_path, baseline, capsys):
    """The baseline evaluated the whole golden set; this run 100 of its datums. The comparison
    is kept, run.json warns baseline_data_differs, a change bound is baseline_differs (exit 5)
    instead of a silent pass, and a value bound is checked as usual."""
    data = golden_subset(tmp_path / "data", 0, 100)
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmodel = "model_a"\nmax_drop = 1.0\n'
                     '[[gate]]\nmetric = "Accuracy"\nmodel = "model_a"\nmin = 0.0\n')
    out = tmp_path / "new"
    args = ["--groundtruths", data / "groundtruths.jsonl", "--predictions", f"model_a={data / 'model_a.jsonl'}",
            "--predictions", f"model_b={data / 'model_b.jsonl'}", "--slice", "region", "--output", out,
            "--bootstrap", "20", "--quiet", "--gates", gates, "--baseline", baseline]
    capsys.readouterr()
    assert run_classification(args) == 5
    info = json.loads((out / "run.json").read_text())
    base_info = json.loads((baseline / "run.json").read_text())
    old_n = base_info["counts"]["groundtruths"]["rows_evaluated"]
    assert info["status"] == "complete" and info["counts"]["groundtruths"]["rows_evaluated"] == 100
    differs = [p for p in info["problems"] if p["code"] == "baseline_data_differs"]
    assert len(differs) == 1 and differs[0]["severity"] == "warning"
    assert f"ground-truth datums evaluated: {old_n} in the baseline, 100 in this run" in differs[0]["message"]
    results = json.loads((out / "gates.json").read_text())["results"]
    change, bound = [c for c in results if c["gate"] == 1], [c for c in results if c["gate"] == 2]
    assert [c["verdict"] for c in change] == ["baseline_differs"]
    assert change[0]["baseline_value"] is not None and change[0]["change"] == pytest.approx(
        change[0]["value"] - change[0]["baseline_value"])
    assert [c["verdict"] for c in bound] == ["pass"]
    assert info["gates"]["verdicts"] == {"baseline_differs": 1, "pass": 1}
    assert read_jsonl(out / "comparison.jsonl")                     # the comparison is kept
    err = capsys.readouterr().err
    assert "evalbeam: warning: the baseline" in err and "baseline_differs" in err

    # the same baseline with value bounds only: the warning, exit 0
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmodel = "model_a"\nmin = 0.0\n')
    assert run_classification(args[:-4] + ["--output", tmp_path / "plain", "--gates", gates,
                                           "--baseline", baseline]) == 0
    info = json.loads((tmp_path / "plain" / "run.json").read_text())
    assert [p["code"] for p in info["problems"]] == ["baseline_data_differs"]
    assert "change-bound" not in info["problems"][0]["message"]


def test_a_sweep_baseline_on_other_datums_of_the_same_count(tmp_path, capsys):
    """Two nights over as many datums but other ones: only the datum fingerprints of the cells'
    leaderboard inputs tell; sweep.json's baseline_problems says so per cell, and so does the
    sweep's page (it did not list them before)."""
    from evalbeam.pipelines.sweep.command import run as sweep

    def manifest(data, name):
        path = tmp_path / name
        path.write_text(small_sweep(tmp_path).read_text().replace(str(INPUTS), str(data)))
        return path

    first, second = tmp_path / "night1", tmp_path / "night2"
    assert sweep([str(manifest(golden_subset(tmp_path / "d1", 0, 150), "one.toml")),
                  "--output", str(first), "--quiet"]) == 0
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmodel = "a"\nmax_drop = 1.0\n')
    capsys.readouterr()
    code = sweep([str(manifest(golden_subset(tmp_path / "d2", 150, 300), "two.toml")),
                  "--output", str(second), "--quiet", "--gates", str(gates), "--baseline", str(first),
                  "--report"])
    assert code == 5
    info = json.loads((second / "sweep.json").read_text())
    problems = info["baseline_problems"]
    assert [(p["cell"], p["code"], p["severity"]) for p in problems] == \
        [("golden/a", "baseline_data_differs", "warning"), ("golden/b", "baseline_data_differs", "warning")]
    assert "datum ids: fingerprint" in problems[0]["message"]
    assert "ground-truth datums evaluated" not in problems[0]["message"]     # 150 both nights
    checks = json.loads((second / "gates.json").read_text())["results"]
    assert [c["verdict"] for c in checks] == ["baseline_differs"]
    assert read_jsonl(second / "comparison.jsonl")
    assert "evalbeam: warning: cell golden/a: the baseline" in capsys.readouterr().err
    items, _ = page_problems((second / "report.html").read_text(encoding="utf-8"))
    assert [text for _, text in items if "baseline_data_differs" in text] == \
        [f"warning baseline_data_differs: {p['message']}" for p in problems]
