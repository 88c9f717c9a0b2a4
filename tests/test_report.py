"""The HTML report in a real browser (headless chromium, tests/browser.py): for a classification
run with a baseline and gates, a detection run, a text run with judge metrics, and a sweep, the
page loads from disk with no network, draws every chart, shows the expected sections and tables,
logs no error; hostile model text, labels and datum uids appear as text and run nothing.
Also `evalbeam report DIR` on a finished run, and the page's bounds (sizes, capped tables)."""

from __future__ import annotations

import html
import json
import os
import random
import re

import pytest

from browser import load_page, png_is_blank, requires_chromium
from helpers import MULTIPROCESS, ROOT, page_problems, run_classification, write_jsonl

GOLDEN = ROOT / "tests" / "golden" / "inputs"
HOSTILE = ["<script>alert(1)</script>", "\"><img src=x onerror=alert(1)>", "javascript:alert(1)"]
DRAW_ALL = "window.evalbeamDrawAll ? window.evalbeamDrawAll().then(function (n) { return n + 1; }) : false"
PROBES = {
    "sections": "Array.from(document.querySelectorAll('section.card')).map(s => s.id)",
    "tables": "document.querySelectorAll('table').length",
    "charts": "document.querySelectorAll('div.chart').length",
    "chart_titles": "Array.from(document.querySelectorAll('div.chart')).map(d => d.dataset.title)",
    "drawn": "document.querySelectorAll('div.chart.drawn canvas, div.chart.drawn svg').length",
    "failed_charts": "Array.from(document.querySelectorAll('div.chart')).filter(d => d.textContent.includes('could not be drawn')).length",
    "text": "document.body.innerText",
    "scripts": "document.querySelectorAll('script').length",
    "json_scripts": "document.querySelectorAll('script[type=\"application/json\"]').length",
    "images": "document.querySelectorAll('img').length",
    "js_links": "document.querySelectorAll('a[href^=\"javascript\"]').length",
    "status": "document.getElementById('run-status').textContent",
    "gates": "(document.getElementById('gates-verdict') || {}).textContent || null",
}


def open_report(path, tmp_path):
    shot = tmp_path / "page.png"
    page = load_page(str(path), wait_js=DRAW_ALL, screenshot=str(shot), probes=PROBES, timeout=90)
    assert not page.errors, page.errors
    assert not page.dialogs, page.dialogs
    assert not page.requests, page.requests
    assert not png_is_blank(str(shot))
    p = page.probes
    assert p["failed_charts"] == 0
    assert p["drawn"] == p["charts"] > 0
    # one bundle, one drawing script, and the chart specs as data: nothing else runs
    assert p["scripts"] == p["json_scripts"] + 2 and p["images"] == 0 and p["js_links"] == 0
    return p


def hostile_classification(folder, seed=0):
    rng = random.Random(seed)
    labels = ["cat", "dog", HOSTILE[0], HOSTILE[1]]
    gt, pa, pb = [], [], []
    for i in range(120):
        uid = (HOSTILE[i % 3] + f"-{i}") if i % 2 == 0 else f"img-{i:04d}"
        truth = labels[i % 4]
        gt.append({"datum_uid": uid, "metadata": {"region": HOSTILE[i % 2] if i % 3 == 0 else "north"},
                   "labels": [{"key": "class", "value": truth}]})
        for rows, skill in ((pa, 0.8), (pb, 0.5)):
            guess = truth if rng.random() < skill else rng.choice(labels)
            scores = {v: rng.random() * 0.3 for v in labels}
            scores[guess] = 0.7 + rng.random() * 0.3
            rows.append({"datum_uid": uid, "labels": [{"key": "class", "value": v, "score": round(s, 4)}
                                                      for v, s in scores.items()]})
    return (write_jsonl(folder / "gt.jsonl", gt), write_jsonl(folder / "a.jsonl", pa),
            write_jsonl(folder / "b.jsonl", pb))


@requires_chromium
def test_classification_report_with_baseline_gates_and_hostile_text(tmp_path):
    gt, a, b = hostile_classification(tmp_path)
    common = ["--groundtruths", gt, "--slice", "region", "--bootstrap", "20", "--quiet",
              "--metrics", "Counts,Precision,Recall,F1,Accuracy,ROCAUC,mROCAUC,PrecisionRecallCurve,"
                           "ConfusionMatrix,ReliabilityDiagram,ECE"]
    assert run_classification(["--predictions", f"new={a}", "--predictions", f"old={b}",
                               "--output", tmp_path / "base", *common]) == 0
    gates = tmp_path / "gates.toml"
    gates.write_text('[[gate]]\nmetric = "Accuracy"\nmax_drop = 0.05\n'
                     '[[gate]]\nmetric = "Accuracy"\nmodel = "new"\nmin = 0.3\nrequire = "interval"\n')
    out = tmp_path / "run"
    # the models' files swapped against the baseline: "new" got worse
    code = run_classification(["--predictions", f"new={b}", "--predictions", f"old={a}",
                               "--output", out, "--gates", gates, "--baseline", tmp_path / "base",
                               "--report", "--compare_to", "old", *common])
    assert code == 5
    p = open_report(out / "report.html", tmp_path)
    assert p["sections"][:4] == ["overview", "gates", "baseline", "headline"]
    assert len(p["sections"]) == 4 + 2 * 4          # 2 models x (all datums, 3 regions)
    assert p["status"] == "complete" and p["gates"].startswith("FAILED")
    text = p["text"]
    for needle in HOSTILE[:2]:
        assert needle in text                          # labels and slice values, as text
    import re

    for needle in HOSTILE:                             # datum uids among the examples
        assert re.search(re.escape(needle) + r"-\d+", text), needle
    for needle in ("Per label", "Confusions with example datums", "Largest changes against the baseline",
                   "Datums whose correctness changed", "Paired comparisons between models"):
        assert needle in text, needle


@requires_chromium
def test_detection_report(tmp_path):
    from evalbeam.pipelines.tasks.detection import TASK

    out = tmp_path / "det"
    assert TASK.run(["--groundtruths", str(GOLDEN / "detection" / "groundtruths.jsonl"),
                     "--predictions", f"good={GOLDEN / 'detection' / 'good.jsonl'}",
                     "--predictions", f"weak={GOLDEN / 'detection' / 'weak.jsonl'}",
                     "--protocol", "valor", "--max_rejected_fraction", "0.2", "--output", str(out),
                     "--report", "--quiet"]) == 0
    p = open_report(out / "report.html", tmp_path)
    for needle in ("AP per label", "Overall", "Confusions with example datums",
                   "Headline metrics per model and slice"):
        assert needle.lower() in p["text"].lower(), needle
    titles = " ".join(p["chart_titles"]).lower()
    for needle in ("interpolated", "confusion", "precision"):
        assert needle in titles, (needle, p["chart_titles"])
    assert p["charts"] >= 2 * 4


@requires_chromium
def test_text_report_with_judge_metrics_and_hostile_responses(tmp_path, monkeypatch):
    from evalbeam.pipelines.runners.judge_server import StandInServer
    from evalbeam.pipelines.tasks.text import TASK

    gt = [json.loads(line) for line in open(GOLDEN / "text" / "rag" / "groundtruths.jsonl")]
    pred = [json.loads(line) for line in open(GOLDEN / "text" / "rag" / "alpha.jsonl")]
    for i, needle in enumerate(HOSTILE):
        uid = f"{needle}#{i}"
        gt.append(dict(gt[i], datum_uid=uid))
        pred.append({"datum_uid": uid, "response": f"{needle} <a href=\"javascript:alert(2)\">click</a>",
                     "contexts": [needle]})
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "alpha.jsonl", pred)
    monkeypatch.setenv("EVALBEAM_JUDGE_API_KEY", "report-key")
    out = tmp_path / "text"
    with StandInServer() as server:
        assert TASK.run(["--groundtruths", str(tmp_path / "gt.jsonl"),
                         "--predictions", f"alpha={tmp_path / 'alpha.jsonl'}",
                         "--metrics", "ROUGE,BLEU,Faithfulness,AnswerRelevance,Toxicity,PIILeakage",
                         "--judge_url", server.url, "--judge_rpm", "100000",
                         "--output", str(out), "--report", "--quiet"]) == 0
    html = (out / "report.html").read_text()
    assert "report-key" not in html
    p = open_report(out / "report.html", tmp_path)
    text = p["text"]
    for needle in ("LLM judge", "Lowest-scoring datums per metric", "Faithfulness"):
        assert needle.lower() in text.lower(), needle
    assert "per-datum scores" in " ".join(p["chart_titles"])
    # the model's text is shown as text, markup and all
    assert "<a href=\"javascript:alert(2)\">click</a>" in text
    assert any(f"{needle}#" in text for needle in HOSTILE)      # as datum uids


@requires_chromium
def test_sweep_report_with_gates(tmp_path):
    from evalbeam.pipelines.sweep.command import run as sweep

    gt, a, b = hostile_classification(tmp_path / "alpha")
    gt2, a2, b2 = hostile_classification(tmp_path / "beta", seed=1)
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f"""
[sweep]
bootstrap = 20

[[dataset]]
name = "alpha"
task = "classification"
groundtruths = "{gt}"

[[dataset]]
name = "beta"
task = "classification"
groundtruths = "{gt2}"

[[model]]
name = "new"
predictions = {{alpha = "{a}", beta = "{a2}"}}

[[model]]
name = "old"
predictions = {{alpha = "{b}", beta = "{b2}"}}

[[gate]]
metric = "Accuracy"
model = "old"
min = 0.9
""")
    out = tmp_path / "out"
    assert sweep([str(manifest), "--output", str(out), "--report", "--quiet"]) == 5
    info = json.loads((out / "sweep.json").read_text())
    assert info["gates"]["passed"] is False and info["gates"]["checks"] == 2
    assert info["exit_code"] == 5 and "report.html" in info["files"]
    checks = json.loads((out / "gates.json").read_text())["results"]
    assert {(c["dataset"], c["model"], c["verdict"]) for c in checks} == {
        ("alpha", "old", "fail"), ("beta", "old", "fail")}
    p = open_report(out / "report.html", tmp_path)
    assert p["sections"][:3] == ["overview", "gates", "headline"]
    assert "Leaderboard" in p["text"] and "alpha" in p["text"] and "beta" in p["text"]


def test_sweep_page_lists_the_baseline_problems_as_text(tmp_path):
    """sweep.json's baseline_problems (a baseline cell evaluated on other data) are in the
    page's Problems list, as a run's page lists its baseline_data_differs; their text (cell
    names, the baseline's path, here hostile) is escaped. Before, the sweep page left them out."""
    from evalbeam.pipelines.report import page as report

    cells = [{"dataset": "golden", "model": m, "status": "complete", "ran": True} for m in ("a", "b")]
    info = {"status": "complete", "cells": cells, "leaderboard_problems": ["few datums"]}
    plain = report.render(report.sweep_context(str(tmp_path), info))
    messages = [f"cell golden/{m}: the baseline /n/{HOSTILE[i]} was evaluated on other data than this run "
                f"(datum ids: fingerprint {HOSTILE[2]})" for i, m in enumerate("ab")]
    info["baseline_problems"] = [{"severity": "warning", "code": "baseline_data_differs", "message": text,
                                  "cell": f"golden/{m}"} for m, text in zip("ab", messages)]
    report.write_sweep_report(str(tmp_path), str(tmp_path / "report.html"), info=info)
    items, tags = page_problems((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert items == [("warning", f"warning baseline_data_differs: {text}") for text in messages] + \
        [("warning", "warning leaderboard: few datums")]
    assert sorted(tags) == sorted(page_problems(plain)[1] + ["li", "code"] * 2)    # no element of theirs


def test_sweep_page_names_its_baseline_folder_escaped(tmp_path):
    """A sweep with --baseline: its page says which earlier sweep the change bounds were
    checked against (a run's page says it in its comparison card), the path escaped."""
    from evalbeam.pipelines.report import page as report

    cells = [{"dataset": "golden", "model": "a", "status": "complete", "ran": True}]
    folder = f"/sweeps/{HOSTILE[0]}"
    report.write_sweep_report(str(tmp_path), str(tmp_path / "report.html"),
                              info={"status": "complete", "cells": cells}, baseline=folder)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    shown = re.search(r'<code id="baseline-folder">(.*?)</code>', page, re.S)
    assert shown and html.unescape(shown.group(1)) == folder and HOSTILE[0] not in page
    report.write_sweep_report(str(tmp_path), str(tmp_path / "plain.html"),
                              info={"status": "complete", "cells": cells})
    assert "baseline-folder" not in (tmp_path / "plain.html").read_text(encoding="utf-8")


def test_report_command_on_a_finished_run(tmp_path, capsys):
    from evalbeam.pipelines.report.command import run as report

    out = tmp_path / "run"
    assert run_classification(["--groundtruths", GOLDEN / "classification" / "groundtruths.jsonl",
                               "--predictions", f"a={GOLDEN / 'classification' / 'model_a.jsonl'}",
                               "--output", out, "--max_rejected_fraction", "0.1", "--quiet"]) == 0
    assert report([str(out)]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["files"]["report.html"] == os.path.getsize(out / "report.html")
    # the folder stays evalbeam's: a new run replaces the report like any of its outputs
    assert run_classification(["--groundtruths", GOLDEN / "classification" / "groundtruths.jsonl",
                               "--predictions", f"a={GOLDEN / 'classification' / 'model_a.jsonl'}",
                               "--output", out, "--max_rejected_fraction", "0.1", "--quiet"]) == 0
    assert not (out / "report.html").exists()
    assert report([str(tmp_path / "nothing")]) == 2
    assert "no run.json of evalbeam's" in capsys.readouterr().err
    # a report.html evalbeam did not write is never replaced
    (out / "report.html").write_text("my notes")
    assert report([str(out)]) == 2
    assert "evalbeam did not write it" in capsys.readouterr().err
    assert (out / "report.html").read_text() == "my notes"
    assert report([str(out), "-o", str(tmp_path / "elsewhere.html")]) == 0


def test_report_o_replaces_only_a_page_evalbeam_wrote(tmp_path, capsys):
    """`-o FILE` overwrote whatever FILE was: a data file given by mistake, or the run's own
    metrics.jsonl (the run then unreadable). An existing FILE is now replaced only when it is
    an evalbeam page; the folder's own report.html named with -o is listed in run.json as
    without -o."""
    from evalbeam.pipelines.report.command import run as report

    out = tmp_path / "run"
    assert run_classification(["--groundtruths", GOLDEN / "classification" / "groundtruths.jsonl",
                               "--predictions", f"a={GOLDEN / 'classification' / 'model_a.jsonl'}",
                               "--output", out, "--max_rejected_fraction", "0.1", "--quiet"]) == 0
    data = tmp_path / "gt.jsonl"
    data.write_bytes((GOLDEN / "classification" / "groundtruths.jsonl").read_bytes())
    kept = {path: path.read_bytes() for path in (data, out / "metrics.jsonl", out / "run.json")}
    (tmp_path / "folder.html").mkdir()
    for target in (data, out / "metrics.jsonl", out / "run.json", tmp_path / "folder.html"):
        capsys.readouterr()
        assert report([str(out), "-o", str(target)]) == 2
        assert "-o " in capsys.readouterr().err
    assert {path: path.read_bytes() for path in kept} == kept
    page = tmp_path / "page.html"
    assert report([str(out), "-o", str(page)]) == 0
    assert report([str(out), "-o", str(page)]) == 0              # its own page: replaced
    assert b'<meta name="generator" content="evalbeam">' in page.read_bytes()[:4096]
    assert report([str(out), "-o", str(out / "report.html")]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["files"]["report.html"] == os.path.getsize(out / "report.html")


def test_report_bounds_with_many_labels_and_slices(tmp_path):
    """Tables are capped, charts of the sections past MAX_SECTIONS are left out, and the page
    stays small whatever the number of records."""
    from evalbeam.pipelines.report import page as report

    records = []
    for model in ("a", "b"):
        for s in range(40):
            for label in range(300):
                records.append({"type": "F1", "value": random.Random(label).random(),
                                "parameters": {"label": {"key": "k", "value": f"l{label}"}, "score_threshold": 0.5},
                                "model": model, "slice": {"site": f"s{s}"} if s else {}})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "rejected.jsonl").write_text("")
    info = {"task": "classification", "status": "complete", "models": ["a", "b"], "counts": {}}
    report.write_report(report.RunFiles(str(tmp_path), info), str(tmp_path / "report.html"))
    html = (tmp_path / "report.html").read_text()
    assert len(html) < 5_000_000
    assert html.count('class="chart pending"') == report.MAX_SECTIONS
    assert "First 200 of 300 rows shown" in html


@pytest.mark.multiprocess
def test_report_written_on_the_multi_process_runner_equals_in_process(tmp_path):
    """Same run, both modes: the page's content (less its timestamps) is the same."""
    pages = []
    for name, extra in (("one", []), ("multi", MULTIPROCESS)):
        out = tmp_path / name
        assert run_classification(["--groundtruths", GOLDEN / "classification" / "groundtruths.jsonl",
                                   "--predictions", f"a={GOLDEN / 'classification' / 'model_a.jsonl'}",
                                   "--output", out, "--max_rejected_fraction", "0.1", "--report",
                                   "--quiet", *extra]) == 0
        html = (out / "report.html").read_text()
        import re

        pages.append(re.sub(r"(started|report made|wall time) [^·<]*", "", html)
                     .replace(str(out), "OUT"))
    assert pages[0] == pages[1]
