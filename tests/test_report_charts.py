"""The report's chart builders (pipelines/report/charts.py): Vega-Lite specs from metric records,
on the golden runs' real records and on edge cases: schema-valid, strict JSON with inline data
only, the records' numbers in the data, untrusted text only as values, sizes bounded, and the
same spec for the same records."""

from __future__ import annotations

import copy
import html
import json
import math
import random
import re
from functools import lru_cache

import jsonschema
import numpy as np
import pytest

from evalbeam.pipelines.report import charts as rc
from helpers import ROOT, read_jsonl

GOLDEN = ROOT / "tests" / "golden" / "expected"
HOSTILE = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "a.b[0]\\c", "{{x}} ${y}",
           "(other)", "(no prediction)", "(no ground truth)", "datum.x", "'; drop"]
# every field name a spec may use: the module's own identifiers (and their "_s" tooltip strings)
FIELDS = {"l", "t", "p", "r", "tp", "fp", "fn", "tn", "s", "c", "g", "n", "e", "i", "u", "a",
          "lo", "hi", "d", "v", "m", "k", "f"}


# --- helpers ------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _records(run: str) -> tuple:
    return tuple(read_jsonl(GOLDEN / run / "metrics.jsonl"))


def golden(run: str, kind: str, **where) -> list[dict]:
    return [copy.deepcopy(r) for r in _records(run) if r["type"] == kind
            and all(r.get(k) == v for k, v in where.items())]


@lru_cache(maxsize=None)
def _validator():
    from altair.vegalite.v6.schema import core
    schema = core.load_schema()
    return jsonschema.validators.validator_for(schema)(schema)


def walk(node, path=()):
    """(path, node) of every node of a spec; data rows are yielded as one node, not entered."""
    yield path, node
    if isinstance(node, dict):
        if path and path[-1] == "data":
            return
        for key, value in node.items():
            yield from walk(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, path + (i,))


def datasets(spec) -> list[list]:
    """The spec's inline data, in document order."""
    return [node["values"] for path, node in walk(spec)
            if path and path[-1] == "data" and isinstance(node, dict)]


def rows(spec) -> list[dict]:
    """The spec's data rows that carry a record's numbers (not the reliability diagonal)."""
    return [row for values in datasets(spec) for row in values if "d" not in row]


def check(spec) -> dict:
    """A spec the page can use: strict JSON, data inline only, only this module's field names,
    valid against the Vega-Lite schema (data cut to 3 rows per dataset: the schema allows any
    JSON rows, and validating thousands of them only costs time)."""
    assert isinstance(spec, dict)
    text = json.dumps(spec, allow_nan=False)
    assert "datasets" not in spec and '"url"' not in text
    assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/v6")
    for path, node in walk(spec):
        if path and path[-1] == "data":
            assert set(node) == {"values"} and isinstance(node["values"], list), path
            for row in node["values"]:
                assert set(row) <= FIELDS, row
        if path and path[-1] == "field" and isinstance(node, str):
            assert node.removesuffix("_s") in FIELDS, node
        if path and path[-1] == "calculate":
            # expressions name fixed fields only: no record text in them
            assert not any(h in node for h in HOSTILE[:4])
    data = [json.dumps(values) for values in datasets(spec)]
    assert len(data) == len(set(data)), "a dataset is repeated"
    error = _schema_error(json.dumps(_cut(spec)))
    assert error is None, error
    return spec


def _cut(node, key=None):
    """A copy of a spec with at most 3 rows per dataset."""
    if isinstance(node, dict):
        if key == "data":
            return {**node, "values": node["values"][:3]}
        return {k: _cut(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_cut(v) for v in node]
    return node


@lru_cache(maxsize=None)
def _schema_error(text: str):
    errors = list(_validator().iter_errors(json.loads(text)))
    return jsonschema.exceptions.best_match(errors).message[:500] if errors else None


def size(spec) -> int:
    return len(json.dumps(spec, separators=(",", ":")))


def tooltip_fields(spec) -> list[str]:
    for path, node in walk(spec):
        if path and path[-1] == "tooltip" and isinstance(node, list):
            return [t["title"] for t in node]
    raise AssertionError("no tooltip")


def title(spec) -> tuple[str, list]:
    t = spec["title"]
    return t["text"], t.get("subtitle", [])


def test_the_schema_check_catches_a_bad_spec():
    spec = rc.histogram([0.5], "t", "x")
    check(spec)
    spec["mark"]["type"] = "barr"
    with pytest.raises(AssertionError):
        check(spec)


# --- downsample_curve ---------------------------------------------------------------------

def test_downsample_keeps_short_curves_whole():
    points = [{"x": i, "y": i, "threshold": i / 10} for i in range(10)]
    out = rc.downsample_curve(points, keep=(), max_points=10)
    assert out == points and out is not points


def test_downsample_long_curve_even_first_last_and_kept_thresholds():
    points = [{"x": i / 1999, "y": 1 - i / 1999, "threshold": i} for i in range(2000)]
    keep = {7, 1001, 1002, 1998}
    out = rc.downsample_curve(points, keep=keep, max_points=500)
    index = [p["threshold"] for p in out]
    assert len(out) <= 500 and len(out) >= 490
    assert index[0] == 0 and index[-1] == 1999 and index == sorted(set(index))
    assert keep <= set(index)
    assert sum(i not in keep for i in index) >= 490
    gaps = np.diff(index)
    assert gaps.max() <= 5 and gaps.min() >= 1           # evenly spaced: about 2000 / 500
    assert rc.downsample_curve(points, keep=keep, max_points=500) == out


def test_downsample_too_many_kept_thresholds_are_thinned():
    points = [{"x": i, "y": i, "threshold": i} for i in range(1000)]
    out = rc.downsample_curve(points, keep=range(1000), max_points=50)
    assert len(out) == 50 and out[0] is points[0] and out[-1] is points[-1]
    with pytest.raises(ValueError):
        rc.downsample_curve(points, (), max_points=1)


# --- 1. pr_curves -------------------------------------------------------------------------

def _pr_points(record):
    return {(label, float(t)): e for label, curve in record["value"].items() for t, e in curve.items()}


def test_pr_curves_classification_golden_points_equal_the_record():
    record = golden("classification", "PrecisionRecallCurve", model="model_a", slice={})[0]
    spec = check(rc.pr_curves(record))
    expected = _pr_points(record)
    got = {(r["l"], r["t"]): r for r in rows(spec)}
    assert got.keys() == expected.keys()
    for key, row in got.items():
        entry = expected[key]
        assert (row["p"], row["r"], row["tp"], row["fp"], row["fn"], row["tn"]) == (
            entry["precision"], entry["recall"], entry["tp"], entry["fp"], entry["fn"], entry["tn"])
        assert "f1_score" not in row                    # fields the chart does not use stay out
    assert spec["encoding"]["color"]["scale"]["domain"] == sorted(record["value"])
    assert tooltip_fields(spec) == ["label", "score threshold", "precision", "recall", "tp", "fp", "fn", "tn"]
    assert title(spec) == ("Precision-recall by score threshold (key class)", [])
    assert 360 <= spec["width"] <= 560 and 240 <= spec["height"] <= 320
    assert spec["encoding"]["x"]["title"] == "recall" and spec["encoding"]["y"]["title"] == "precision"
    assert size(spec) < 12_000


def test_pr_curves_detection_golden():
    record = golden("detection_bbox", "PrecisionRecallCurve")[0]
    spec = check(rc.pr_curves(record))
    assert {(r["l"], r["t"]): r["p"] for r in rows(spec)} == {
        k: e["precision"] for k, e in _pr_points(record).items()}
    assert "tn" not in tooltip_fields(spec) and all("tn" not in r for r in rows(spec))
    assert title(spec)[0] == "Precision-recall by score threshold (IoU 0.5)"


def test_pr_curves_keeps_the_labels_with_most_ground_truths():
    value = {f"label{i:02d}": {"0.5": {"tp": i, "fp": 1, "fn": 100 - 2 * i if i % 2 else 1,
                                       "precision": 0.5, "recall": 0.25}} for i in range(20)}
    spec = check(rc.pr_curves({"type": "PrecisionRecallCurve", "value": value, "parameters": {}}))
    truths = {lab: c["0.5"]["tp"] + c["0.5"]["fn"] for lab, c in value.items()}
    best = sorted(sorted(truths, key=lambda lab: (-truths[lab], lab))[:12])
    assert spec["encoding"]["color"]["scale"]["domain"] == best
    assert sorted({r["l"] for r in rows(spec)}) == best
    assert title(spec)[1] == ["12 of 20 labels shown: those with the most ground truths"]
    assert spec["encoding"]["color"]["scale"]["scheme"] == "tableau20"   # 12 colours
    assert rc.pr_curves({"value": value}, max_series=3)["encoding"]["color"]["scale"]["domain"] == sorted(
        sorted(truths, key=lambda lab: (-truths[lab], lab))[:3])


def test_pr_curves_edge_cases():
    assert rc.pr_curves({}) is None
    assert rc.pr_curves({"type": "PrecisionRecallCurve", "value": {}}) is None
    assert rc.pr_curves({"value": {"a": {"0.5": {"precision": None, "recall": float("nan")}}}}) is None
    value = {"only": {"0.1": {"tp": 1, "fp": 0, "fn": 0, "precision": 1.0, "recall": 1.0},
                      "0.2": {"tp": 1, "fp": 0, "fn": 0, "precision": float("nan"), "recall": 1.0},
                      "0.3": {"tp": 0, "fp": 0, "fn": 1, "precision": 0.0, "recall": None},
                      "bad": {"precision": 1.0, "recall": 1.0}}}
    spec = check(rc.pr_curves({"value": value}))
    assert [(r["l"], r["t"]) for r in rows(spec)] == [("only", 0.1)]


def test_pr_curves_long_curve_is_downsampled_keeping_thresholds():
    curve = {repr(t): {"tp": 5, "fp": 1, "fn": 1, "precision": 1 - t, "recall": t}
             for t in (i / 2000 for i in range(2001))}
    spec = check(rc.pr_curves({"value": {"x": curve}}, keep=[0.5, 0.25]))
    thresholds = [r["t"] for r in rows(spec)]
    assert len(thresholds) <= rc.MAX_POINTS and {0.0, 0.25, 0.5, 1.0} <= set(thresholds)
    assert all(r["p"] == 1 - r["t"] and r["r"] == r["t"] for r in rows(spec))


# --- 2. interpolated_pr_curves ------------------------------------------------------------

def _interpolated(iou, label, undefined_from=90, model="m", seed=0):
    rng = np.random.default_rng(seed)
    precisions = np.sort(rng.random(101))[::-1].tolist()
    precisions[undefined_from:] = [-1.0] * (101 - undefined_from)
    scores = np.sort(rng.random(101))[::-1].tolist()
    return {"type": "InterpolatedPrecisionRecallCurve", "model": model, "slice": {},
            "parameters": {"iou_threshold": iou, "label": label},
            "value": {"precisions": precisions, "scores": scores}}


def rendered_points(spec) -> list[dict]:
    """The tooltips of a spec's points as the page shows them ({title: text}), from an SVG
    rendering: Vega-Lite describes each point (aria-label) with its encodings, then its tooltip
    entries, so the entries are renamed to be told apart."""
    vlc = pytest.importorskip("vl_convert", reason="rendering checks need vl-convert-python")
    spec = copy.deepcopy(spec)
    for path, node in walk(spec):
        if path and path[-1] == "tooltip" and isinstance(node, list):
            for tip in node:
                tip["title"] = "tip " + tip["title"]
    svg = vlc.vegalite_to_svg(spec)
    points = []
    for label in re.findall(r'aria-label="([^"]*)" role="graphics-symbol" aria-roledescription="point"', svg):
        parts = dict(part.split(": ", 1) for part in html.unescape(label).split("; ") if ": " in part)
        points.append({k[4:]: v for k, v in parts.items() if k.startswith("tip ")})
    return points


def shown(x) -> str:
    """A number as the tooltip shows it (JavaScript's String(x))."""
    return repr(x).removesuffix(".0") if isinstance(x, float) else str(x)


def _curve_row(spec, key):
    (row,) = [r for r in rows(spec) if r["s"] == key]
    return row


def _expected_points(records, series, title):
    """(series, recall, precision, score) as the tooltips should show them: every point with a
    defined precision, at recall np.linspace(0, 1, 101)[i]."""
    out = []
    for record in records:
        value = record["value"]
        for i, p in enumerate(value["precisions"]):
            if p is not None and p == p and p >= 0:
                out.append({title: shown(record["parameters"][series]),
                            "recall": shown(float(np.linspace(0, 1, len(value["precisions"]))[i])),
                            "interpolated precision": shown(p), "score": shown(value["scores"][i])})
    return sorted(out, key=lambda d: sorted(d.items()))


def test_interpolated_golden_detection_one_label_all_iou_thresholds():
    records = golden("detection_bbox", "InterpolatedPrecisionRecallCurve", model="good", slice={})
    car = [r for r in records if r["parameters"]["label"] == "car"]
    spec = check(rc.interpolated_pr_curves(car))
    ious = sorted(r["parameters"]["iou_threshold"] for r in car)
    assert len(ious) == 10 and spec["encoding"]["color"]["scale"]["domain"] == ious
    for record in car:      # the data is the records' arrays as they are
        row = _curve_row(spec, record["parameters"]["iou_threshold"])
        assert (row["p"], row["c"], row["k"]) == (record["value"]["precisions"], record["value"]["scores"], 100)
    assert title(spec) == ("Interpolated precision-recall (label car)", [])
    assert tooltip_fields(spec) == ["IoU threshold", "recall", "interpolated precision", "score"]
    assert spec["encoding"]["color"]["scale"]["scheme"] == "category10"
    # the points the page draws: recall exactly np.linspace's (0.35000000000000003 at 35), each
    # precision and score with its own recall, exact in the tooltip
    points = sorted(rendered_points(spec), key=lambda d: sorted(d.items()))
    assert points == _expected_points(car, "iou_threshold", "IoU threshold")
    assert any(p["recall"] == "0.35000000000000003" for p in points)
    with pytest.raises(ValueError):       # three labels' records are not one label's chart
        rc.interpolated_pr_curves(records)


def test_interpolated_golden_coco_one_iou_threshold_80_labels():
    records = golden("coco_bbox", "InterpolatedPrecisionRecallCurve")
    at_half = [r for r in records if r["parameters"]["iou_threshold"] == 0.5]
    assert len(at_half) == 80 and len({r["parameters"]["category_id"] for r in at_half}) == 80
    spec = check(rc.interpolated_pr_curves(at_half, series="label"))
    defined = [r for r in at_half if any(p >= 0 for p in r["value"]["precisions"])]
    ap = {r["parameters"]["label"]: np.mean(r["value"]["precisions"]) for r in defined}
    best = sorted(sorted(ap, key=lambda lab: (-ap[lab], lab))[:12])
    assert spec["encoding"]["color"]["scale"]["domain"] == best == [r["s"] for r in rows(spec)]
    for record in at_half:
        if record["parameters"]["label"] in best:
            assert _curve_row(spec, record["parameters"]["label"])["p"] == record["value"]["precisions"]
    assert title(spec) == ("Interpolated precision-recall (IoU 0.5)",
                           [f"12 of {len(defined)} labels shown: those with the highest AP"])
    assert tooltip_fields(spec)[0] == "label" and size(spec) < 30_000
    undefined = [r for r in records if all(p < 0 for p in r["value"]["precisions"])]
    assert undefined and rc.interpolated_pr_curves(undefined[:1]) is None     # -1 throughout


def test_interpolated_synthetic_minus_one_nan_and_long_curves():
    records = [_interpolated(t, "car", undefined_from=60 + i, seed=i) for i, t in enumerate([0.95, 0.5, 0.75])]
    records[1]["value"]["precisions"][3] = float("nan")
    records[1]["value"]["scores"][4] = None
    spec = check(rc.interpolated_pr_curves(records))
    assert spec["encoding"]["color"]["scale"]["domain"] == [0.5, 0.75, 0.95]
    assert _curve_row(spec, 0.5)["p"][3] is None                         # strict JSON
    expected = _expected_points(records, "iou_threshold", "IoU threshold")
    for point in expected:
        if point["IoU threshold"] == "0.5" and point["recall"] == "0.04":
            point["score"] = "-"                                         # a missing score
    assert sorted(rendered_points(spec), key=lambda d: sorted(d.items())) == expected
    # a curve longer than max_points: downsampled, points carry their index
    long = _interpolated(0.5, "car")
    long["value"]["precisions"] = np.linspace(1, 0, 1001).tolist()
    long["value"]["scores"] = np.linspace(1, 0, 1001).tolist()
    spec = check(rc.interpolated_pr_curves([long], max_points=50))
    (row,) = rows(spec)
    assert len(row["i"]) == 50 and row["i"][0] == 0 and row["i"][-1] == 1000 and row["k"] == 1000
    assert row["p"] == [long["value"]["precisions"][i] for i in row["i"]]
    points = rendered_points(spec)
    assert {p["recall"] for p in points} == {shown(float(np.linspace(0, 1, 1001)[i])) for i in row["i"]}


def test_interpolated_one_iou_threshold_lines_per_label():
    records = [_interpolated(0.5, f"label{i:02d}", seed=i) for i in range(20)]
    spec = check(rc.interpolated_pr_curves(records, series="label"))
    ap = {r["parameters"]["label"]: np.mean([p for p in r["value"]["precisions"] if p >= 0]) for r in records}
    best = sorted(sorted(ap, key=lambda lab: (-ap[lab], lab))[:12])
    assert spec["encoding"]["color"]["scale"]["domain"] == best
    assert title(spec) == ("Interpolated precision-recall (IoU 0.5)",
                           ["12 of 20 labels shown: those with the highest AP"])


def test_interpolated_edge_cases():
    assert rc.interpolated_pr_curves([]) is None
    assert rc.interpolated_pr_curves([_interpolated(0.5, "a", undefined_from=0)]) is None
    assert rc.interpolated_pr_curves([{"parameters": {"iou_threshold": 0.5}, "value": None}]) is None
    single = check(rc.interpolated_pr_curves([_interpolated(0.5, "a", undefined_from=1)]))
    assert rows(single)[0]["p"][1:] == [-1.0] * 100
    with pytest.raises(ValueError):
        rc.interpolated_pr_curves([_interpolated(0.5, "a"), _interpolated(0.5, "a")])
    with pytest.raises(ValueError):
        rc.interpolated_pr_curves([_interpolated(0.5, "a"), _interpolated(0.75, "b")])
    with pytest.raises(ValueError):
        rc.interpolated_pr_curves([_interpolated(0.5, "a"), _interpolated(0.75, "a", model="other")])
    with pytest.raises(ValueError):
        rc.interpolated_pr_curves([_interpolated(0.5, "a")], series="model")


# --- 3. confusion_heatmap -----------------------------------------------------------------

def _cells(spec) -> dict:
    return {(r["g"], r["p"]): r for r in rows(spec)}


def test_confusion_classification_golden():
    record = golden("classification", "ConfusionMatrix", model="model_a", slice={})[0]
    spec = check(rc.confusion_heatmap(record))
    cells = _cells(spec)
    matrix = record["value"]["confusion_matrix"]
    expected = {(g, p): c for g, row in matrix.items() for p, c in row.items() if c["count"]}
    expected |= {(g, "(no prediction)"): c for g, c in record["value"]["unmatched_ground_truths"].items()}
    assert cells.keys() == expected.keys()
    for key, cell in expected.items():
        assert cells[key]["n"] == cell["count"]
        assert cells[key]["e"] == [ex["datum_uid"] for ex in cell["examples"]][:3]
    labels = sorted(matrix)
    x = spec["layer"][0]["encoding"]["x"]["scale"]["domain"]
    y = spec["layer"][0]["encoding"]["y"]["scale"]["domain"]
    assert x == labels + ["(no prediction)"] and y == labels      # no unmatched predictions
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["rect", "text"]
    assert spec["layer"][0]["encoding"]["color"]["scale"]["type"] == "log"
    assert tooltip_fields(spec["layer"][0]) == ["ground truth", "prediction", "count", "examples"]
    assert size(spec) < 8_000


def test_confusion_detection_golden_has_uids_never_geometries():
    for record in golden("detection_bbox", "ConfusionMatrix")[:6]:
        spec = check(rc.confusion_heatmap(record))
        text = json.dumps(spec)
        assert "coordinates" not in text and "Polygon" not in text
        total = sum(c["count"] for row in record["value"]["confusion_matrix"].values() for c in row.values())
        total += sum(c["count"] for side in ("unmatched_ground_truths", "unmatched_predictions")
                     for c in record["value"][side].values())
        assert sum(r["n"] for r in rows(spec)) == total
        assert all(isinstance(u, str) for r in rows(spec) for u in r.get("e", []))
        params = record["parameters"]
        assert title(spec)[0] == (f"Confusion matrix (IoU {params['iou_threshold']!r}, "
                                  f"score >= {params['score_threshold']!r})")


def test_confusion_segmentation_golden_iou_and_ratio():
    record = golden("segmentation", "ConfusionMatrix")[0]
    spec = check(rc.confusion_heatmap(record))
    cells = _cells(spec)
    value = record["value"]
    for g, row in value["confusion_matrix"].items():
        for p, cell in row.items():
            if cell["count"]:
                assert (cells[g, p]["n"], cells[g, p]["i"]) == (cell["count"], cell["iou"])
    for label, cell in value["unmatched_ground_truths"].items():
        if cell["count"]:
            assert (cells[label, "(no prediction)"]["n"], cells[label, "(no prediction)"]["u"]) == (
                cell["count"], cell["ratio"])
    for label, cell in value["unmatched_predictions"].items():
        if cell["count"]:
            assert cells["(no ground truth)", label]["u"] == cell["ratio"]
    assert tooltip_fields(spec["layer"][0]) == ["ground truth", "prediction", "count", "IoU", "unmatched ratio"]
    assert all("e" not in r for r in rows(spec))


def _matrix(n, seed=0, examples=3, geometry=False):
    rng = random.Random(seed)
    labels = [f"label{i:03d}" for i in range(n)]

    def cell(count):
        exs = [{"datum_uid": f"img-{rng.randrange(10**8):08d}", "score": rng.random()}
               for _ in range(min(count, examples))]
        for ex in exs if geometry else ():
            ex["groundtruth"] = ex["prediction"] = {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]}
        return {"count": count, "examples": exs}

    matrix = {g: {p: cell(rng.randrange(100, 1000) if g == p else
                           rng.randrange(1, 20) if rng.random() < 0.5 else 0)
                  for p in labels} for g in labels}
    unmatched = {lab: cell(rng.randrange(1, 30)) for lab in labels}
    return {"type": "ConfusionMatrix", "value": {"confusion_matrix": matrix, "unmatched_ground_truths": unmatched,
                                                 "unmatched_predictions": unmatched},
            "parameters": {"iou_threshold": 0.5, "score_threshold": 0.5}, "model": "m", "slice": {}}


def test_confusion_100_labels_folds_into_other_and_stays_small():
    record = _matrix(100, geometry=True)
    spec = check(rc.confusion_heatmap(record))
    value = record["value"]
    total = sum(c["count"] for row in value["confusion_matrix"].values() for c in row.values())
    total += 2 * sum(c["count"] for c in value["unmatched_ground_truths"].values())
    assert sum(r["n"] for r in rows(spec)) == total                  # folding adds, loses nothing
    domain = spec["layer"][0]["encoding"]["x"]["scale"]["domain"]
    assert len(domain) == 32 and domain[-2:] == ["(other)", "(no prediction)"]
    assert title(spec)[1] == ["30 most frequent of 100 labels shown, 70 folded into (other)"]
    frequency = {lab: 0 for lab in value["confusion_matrix"]}
    for g, row in value["confusion_matrix"].items():
        for p, c in row.items():
            frequency[g] += c["count"]
            frequency[p] += c["count"]
    for lab, c in value["unmatched_ground_truths"].items():
        frequency[lab] += 2 * c["count"]
    assert domain[:30] == sorted(sorted(frequency, key=lambda lab: (-frequency[lab], lab))[:30])
    assert all(len(r.get("e", [])) <= 3 for r in rows(spec))
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["rect"]   # no cell text above 15
    assert size(spec) < 70_000
    unfolded = check(rc.confusion_heatmap(record, max_labels=100))
    assert 100_000 < size(unfolded) < 600_000
    assert spec["width"] == spec["height"] == 560


def test_confusion_edge_cases():
    assert rc.confusion_heatmap({}) is None
    assert rc.confusion_heatmap({"value": {"confusion_matrix": {}}}) is None
    zeros = {"confusion_matrix": {"a": {"a": {"count": 0, "examples": []}}}, "unmatched_ground_truths": {},
             "unmatched_predictions": {}}
    assert rc.confusion_heatmap({"value": zeros}) is None
    # a single label; plain-count cells (detection with --max_examples 0); None and NaN counts
    plain = {"confusion_matrix": {"a": {"a": 7, "b": None}, "b": {"a": float("nan"), "b": 2}},
             "unmatched_ground_truths": {"a": 1}, "unmatched_predictions": {}}
    spec = check(rc.confusion_heatmap({"value": plain}))
    assert {k: r["n"] for k, r in _cells(spec).items()} == {("a", "a"): 7, ("b", "b"): 2, ("a", "(no prediction)"): 1}
    assert tooltip_fields(spec["layer"][0]) == ["ground truth", "prediction", "count"]
    single = check(rc.confusion_heatmap({"value": {"confusion_matrix": {"a": {"a": {"count": 3, "examples": []}}}}}))
    assert _cells(single)[("a", "a")]["n"] == 3 and single["width"] == 240


def test_confusion_hostile_labels_and_uids_are_values_only():
    labels = HOSTILE
    matrix = {g: {p: {"count": 5 if g == p else 1, "examples": [{"datum_uid": HOSTILE[1]}, {"datum_uid": HOSTILE[0]}]}
                  for p in labels} for g in labels}
    record = {"value": {"confusion_matrix": matrix,
                        "unmatched_ground_truths": {HOSTILE[0]: {"count": 2, "examples": [{"datum_uid": HOSTILE[2]}]}},
                        "unmatched_predictions": {HOSTILE[1]: {"count": 3, "examples": []}}},
              "parameters": {"label_key": HOSTILE[0]}}
    spec = check(rc.confusion_heatmap(record))
    domain = spec["layer"][0]["encoding"]["x"]["scale"]["domain"]
    # real labels named like the synthetic rows keep their own row and column
    assert domain == sorted(labels) + ["(no prediction)*"]
    assert spec["layer"][0]["encoding"]["y"]["scale"]["domain"] == sorted(labels) + ["(no ground truth)*"]
    assert _cells(spec)[("(other)", "(other)")]["n"] == 5
    assert _cells(spec)[(HOSTILE[0], "(no prediction)*")]["e"] == [HOSTILE[2]]
    folded = check(rc.confusion_heatmap(record, max_labels=2))
    assert folded["layer"][0]["encoding"]["x"]["scale"]["domain"][-2:] == ["(other)*", "(no prediction)*"]
    assert title(folded)[1] == ["2 most frequent of 9 labels shown, 7 folded into (other)*"]


# --- 4. reliability_diagram ---------------------------------------------------------------

def test_reliability_golden_bins():
    record = golden("classification_bootstrap", "ReliabilityDiagram")[0]
    spec = check(rc.reliability_diagram(record))
    bins = record["value"]["bins"]
    assert [(r["lo"], r["hi"], r["n"], r["c"], r["a"]) for r in rows(spec)] == [
        (b["lower"], b["upper"], b["count"], b["confidence"], b["accuracy"]) for b in bins]
    assert datasets(spec)[0] == [{"d": 0}, {"d": 1}]                   # the diagonal
    assert title(spec)[0] == "Reliability diagram (class, 5 equal_mass bins)"
    assert tooltip_fields(spec["layer"][1]["layer"][1]) == ["bin lower", "bin upper", "count", "confidence", "accuracy"]


def test_reliability_edge_cases():
    assert rc.reliability_diagram({}) is None
    assert rc.reliability_diagram({"value": {"bins": []}}) is None
    empty = {"lower": 0.0, "upper": 0.5, "count": 0, "confidence": None, "accuracy": None}
    assert rc.reliability_diagram({"value": {"bins": [empty]}}) is None
    record = {"type": "ClasswiseReliabilityDiagram", "parameters": {"label": {"key": "k", "value": HOSTILE[0]},
                                                                     "bins": 2, "binning": "equal_width"},
              "value": {"bins": [empty, {"lower": 0.5, "upper": 1.0, "count": 3, "confidence": 0.7,
                                         "accuracy": float("nan")},
                                 {"lower": 0.5, "upper": 1.0, "count": 4, "confidence": 0.75, "accuracy": 1.0}]}}
    spec = check(rc.reliability_diagram(record))
    assert [r["n"] for r in rows(spec)] == [4]
    assert title(spec)[0] == f"Reliability diagram (k = {HOSTILE[0]}, 2 equal_width bins)"


# --- 5. metric_bars -----------------------------------------------------------------------

def _bar_rows(run, kind, **where):
    out = []
    for r in golden(run, kind, slice={}, **where):
        interval = r.get("interval") or {}
        out.append({"name": r["parameters"]["label"]["value"], "series": r["model"], "value": r["value"],
                    "low": interval.get("low"), "high": interval.get("high")})
    return out


def test_metric_bars_golden_with_intervals():
    data = _bar_rows("classification_bootstrap", "Precision")
    spec = check(rc.metric_bars(data, "Precision per label", "precision"))
    assert [(r["n"], r["s"], r["v"], r["lo"], r["hi"]) for r in rows(spec)] == [
        (d["name"], d["series"], d["value"], d["low"], d["high"]) for d in data]
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["rule", "point"]
    enc = spec["layer"][1]["encoding"]
    assert enc["y"]["scale"]["domain"] == ["bird", "cat", "dog", "fish"]
    assert enc["color"]["scale"]["domain"] == ["model_a", "model_b"] and "yOffset" in enc
    assert enc["x"]["title"] == "precision" and title(spec)[0] == "Precision per label"
    assert tooltip_fields(spec["layer"][1]) == ["name", "series", "value", "low", "high"]


def test_metric_bars_without_intervals_are_bars_and_height_grows_capped():
    data = [dict(d, low=None, high=None) for d in _bar_rows("classification_bootstrap", "Recall")]
    spec = check(rc.metric_bars(data, "Recall", "recall"))
    assert spec["mark"]["type"] == "bar" and all("lo" not in r for r in rows(spec))
    heights = []
    for n in (5, 50, 100, 200, 400):
        many = [{"name": f"label {i}", "series": "model", "value": i / n} for i in range(n)]
        spec = check(rc.metric_bars(many, "AP", "AP"))
        heights.append(spec["height"])
        assert "yOffset" not in spec["encoding"] and spec["encoding"]["color"]["legend"] is None
    assert heights == [120, 600, 1200, 2400, 2400]
    assert size(spec) < 40_000


def test_metric_bars_edge_cases():
    assert rc.metric_bars([], "t", "x") is None
    assert rc.metric_bars([{"name": "a", "series": "m", "value": None}], "t", "x") is None
    spec = check(rc.metric_bars([{"name": "a", "series": "m", "value": float("nan")},
                                 {"name": HOSTILE[0], "series": HOSTILE[1], "value": 0.5, "low": 0.4, "high": None},
                                 {"name": "c", "series": "m", "value": 1, "low": 0.9, "high": 1.0}], "t", "x"))
    assert spec["layer"][0]["encoding"]["y"]["scale"]["domain"] == ["a", HOSTILE[0], "c"]   # "a" kept, empty
    assert rows(spec) == [{"n": HOSTILE[0], "s": HOSTILE[1], "v": 0.5},
                          {"n": "c", "s": "m", "v": 1, "lo": 0.9, "hi": 1.0}]
    with pytest.raises(ValueError):
        rc.metric_bars([{"name": "a", "series": "m", "value": 1}, {"name": "a", "series": "m", "value": 2}], "t", "x")
    titled = check(rc.metric_bars([{"name": "a", "value": 1}], "t", "x", y_title="label"))
    assert titled["encoding"]["y"]["title"] == "label" and rows(titled) == [{"n": "a", "s": "", "v": 1}]


# --- 6. at_k_lines ------------------------------------------------------------------------

def _k_rows(run):
    out = []
    for r in _records(run):
        if r["type"] in ("Precision", "Recall", "NDCG", "MAP") and r.get("slice", {}) == {}:
            interval = r.get("interval") or {}
            out.append({"measure": r["type"], "k": r["parameters"].get("k"), "model": r["model"],
                        "value": r["value"], "low": interval.get("low"), "high": interval.get("high")})
    return out


def test_at_k_golden_retrieval_facets_log_scale_and_intervals():
    data = _k_rows("retrieval_bootstrap")
    spec = check(rc.at_k_lines(data, "Retrieval at k"))
    with_k = [d for d in data if d["k"] is not None]
    assert sorted((r["m"], r["k"], r["s"], r["v"], r["lo"], r["hi"]) for r in rows(spec)) == sorted(
        (d["measure"], d["k"], d["model"], d["value"], d["low"], d["high"]) for d in with_k)
    assert spec["facet"]["field"] == "m"
    assert spec["facet"]["sort"] == list(dict.fromkeys(d["measure"] for d in with_k))
    layers = spec["spec"]["layer"]
    assert [layer["mark"]["type"] for layer in layers] == ["rule", "line"]
    x = layers[1]["encoding"]["x"]
    assert x["scale"]["type"] == "log" and x["axis"]["values"] == sorted({d["k"] for d in with_k})
    assert spec["resolve"]["scale"]["y"] == "independent"
    assert title(spec)[0] == "Retrieval at k" and size(spec) < 20_000


def test_at_k_single_measure_linear_without_intervals():
    data = [d for d in _k_rows("trec_eval") if d["measure"] == "NDCG" and d["k"] is not None and d["k"] <= 100]
    spec = check(rc.at_k_lines(data, "NDCG"))
    assert "facet" not in spec and [layer["mark"]["type"] for layer in spec["layer"]] == ["line"]
    encoding = spec["layer"][0]["encoding"]
    assert encoding["x"]["scale"].get("type") is None and encoding["y"]["title"] == "NDCG"
    assert [(r["k"], r["v"]) for r in rows(spec)] == [(d["k"], d["value"]) for d in data]


def test_at_k_edge_cases():
    assert rc.at_k_lines([], "t") is None
    assert rc.at_k_lines([{"measure": "MAP", "k": None, "model": "a", "value": 0.3}], "t") is None
    spec = check(rc.at_k_lines([{"measure": HOSTILE[0], "k": 10.0, "model": HOSTILE[1], "value": 0.5},
                                {"measure": HOSTILE[0], "k": 5, "model": HOSTILE[1], "value": float("nan")},
                                {"measure": HOSTILE[0], "k": True, "model": HOSTILE[1], "value": 0.1}], "t"))
    assert rows(spec) == [{"m": HOSTILE[0], "k": 10, "s": HOSTILE[1], "v": 0.5}]
    with pytest.raises(ValueError):
        rc.at_k_lines([{"measure": "P", "k": 1, "model": "a", "value": 1}] * 2, "t")


# --- 7. histogram -------------------------------------------------------------------------

def test_histogram_golden_scores_binned_in_python():
    scores = read_jsonl(GOLDEN / "text" / "scores.jsonl")
    by_model = {}
    for s in scores:
        if s["metric"] == "BLEU" and s["value"] is not None:
            by_model.setdefault(s["model"], []).append(s["value"])
    spec = check(rc.histogram(by_model, "BLEU per datum", "BLEU", bins=10, domain=(0, 1)))
    data = rows(spec)
    assert len(data) == 10 * len(by_model)
    for model, values in by_model.items():
        counts, _ = np.histogram(values, bins=10, range=(0, 1))
        mine = [r for r in data if r["s"] == model]
        assert [r["n"] for r in mine] == counts.tolist()
        assert [r["lo"] for r in mine] == [i / 10 for i in range(10)]
        assert math.isclose(sum(r["f"] for r in mine), 1.0)
    assert spec["encoding"]["color"]["scale"]["domain"] == sorted(by_model)
    assert spec["encoding"]["x"]["title"] == "BLEU" and spec["encoding"]["y"]["title"] == "count"
    assert size(spec) < 6_000


def test_histogram_never_carries_the_values():
    values = np.random.default_rng(3).normal(size=100_000).tolist()
    spec = check(rc.histogram(values, "scores", "score"))
    assert len(rows(spec)) == 20 and size(spec) < 6_000
    assert sum(r["n"] for r in rows(spec)) == 100_000
    assert rows(spec)[0]["lo"] == min(values) and rows(spec)[-1]["hi"] == max(values)
    assert "color" not in spec["encoding"] and all("s" not in r for r in rows(spec))


def test_histogram_edge_cases():
    assert rc.histogram([], "t", "x") is None
    assert rc.histogram([None, float("nan"), float("inf")], "t", "x") is None
    assert rc.histogram({"a": []}, "t", "x") is None
    array = check(rc.histogram(np.array([0.25, 0.75, np.nan]), "t", "x", bins=2, domain=(0, 1)))
    assert [r["n"] for r in rows(array)] == [1, 1]
    single = check(rc.histogram([2.0, 2.0], "t", "x", bins=4))
    assert [(r["lo"], r["hi"], r["n"]) for r in rows(single)] == [(1.5, 1.75, 0), (1.75, 2.0, 0), (2.0, 2.25, 2),
                                                                 (2.25, 2.5, 0)]
    spec = check(rc.histogram({HOSTILE[0]: [0.1, 0.5, 1.0, 7.0, None], "b": [-3]}, "t", "x", bins=2, domain=(0, 1)))
    assert [(r["s"], r["n"]) for r in rows(spec)] == [(HOSTILE[0], 1), (HOSTILE[0], 2)]   # 1.0 in the last bin
    assert title(spec)[1] == ["2 values outside [0.0, 1.0] not shown"]
    with pytest.raises(ValueError):
        rc.histogram([1], "t", "x", bins=0)
    with pytest.raises(ValueError):
        rc.histogram([1], "t", "x", domain=(1, 1))


# --- every kind: determinism, safety, exact tooltips, rendering, sizes ---------------------

def _build_all_specs():
    cls_pr = golden("classification", "PrecisionRecallCurve", model="model_a", slice={})[0]
    return {
        "pr_curves": rc.pr_curves(cls_pr),
        "interpolated": rc.interpolated_pr_curves([_interpolated(t, "car", seed=i) for i, t in enumerate((0.5, 0.75))]),
        "confusion": rc.confusion_heatmap(golden("classification", "ConfusionMatrix", model="model_a", slice={})[0]),
        "confusion_segmentation": rc.confusion_heatmap(golden("segmentation", "ConfusionMatrix")[0]),
        "reliability": rc.reliability_diagram(golden("classification_bootstrap", "ReliabilityDiagram")[0]),
        "bars": rc.metric_bars(_bar_rows("classification_bootstrap", "Precision"), "Precision", "precision"),
        "at_k": rc.at_k_lines(_k_rows("retrieval_bootstrap"), "Retrieval"),
        "histogram": rc.histogram({"a": [0.1, 0.2], "b": [0.3]}, "h", "x", domain=(0, 1)),
    }


@lru_cache(maxsize=None)
def _all_specs_json() -> tuple:
    return tuple((name, json.dumps(spec)) for name, spec in _build_all_specs().items())


def _all_specs() -> dict:
    return {name: json.loads(text) for name, text in _all_specs_json()}


def test_same_records_same_spec_whatever_the_dict_order():
    first = dict(_all_specs_json())
    assert first == {k: json.dumps(v) for k, v in _build_all_specs().items()}
    record = golden("classification", "PrecisionRecallCurve", model="model_a", slice={})[0]
    reordered = copy.deepcopy(record)
    reordered["value"] = {lab: dict(reversed(list(c.items()))) for lab, c in reversed(list(record["value"].items()))}
    assert json.dumps(rc.pr_curves(reordered)) == first["pr_curves"]
    cm = golden("classification", "ConfusionMatrix", model="model_a", slice={})[0]
    cm["value"]["confusion_matrix"] = {g: dict(reversed(list(row.items())))
                                       for g, row in reversed(list(cm["value"]["confusion_matrix"].items()))}
    assert json.dumps(rc.confusion_heatmap(cm)) == first["confusion"]
    histogram = rc.histogram({"b": [0.3], "a": [0.1, 0.2]}, "h", "x", domain=(0, 1))
    assert json.dumps(histogram) == first["histogram"]


def test_hostile_text_is_data_only_in_every_kind():
    value = {h: {"0.5": {"tp": 1, "fp": 1, "fn": 1, "precision": 0.5, "recall": 0.5}} for h in HOSTILE}
    specs = [
        rc.pr_curves({"value": value, "parameters": {"label_key": HOSTILE[1]}}),
        rc.interpolated_pr_curves([_interpolated(0.5, h, seed=i) for i, h in enumerate(HOSTILE)], series="label"),
        rc.metric_bars([{"name": h, "series": h, "value": 0.5} for h in HOSTILE], HOSTILE[0], HOSTILE[1]),
        rc.at_k_lines([{"measure": h, "k": 1, "model": h, "value": 0.5} for h in HOSTILE], HOSTILE[0]),
        rc.histogram({h: [0.5] for h in HOSTILE}, HOSTILE[0], HOSTILE[1]),
    ]
    for spec in specs:
        check(spec)
        for path, node in walk(spec):
            if isinstance(node, dict):
                assert not any(h in key for key in node for h in HOSTILE), path      # never a key
            if isinstance(node, str) and any(h in node for h in HOSTILE):
                # only as data values, scale domains and sort orders, titles
                allowed = {"values", "domain", "sort", "text", "subtitle", "title"}
                assert allowed & set(map(str, path)), path


def test_tooltips_show_exact_numbers_and_text_renders_escaped():
    vlc = pytest.importorskip("vl_convert", reason="rendering checks need vl-convert-python")
    record = golden("classification", "PrecisionRecallCurve", model="model_a", slice={})[0]
    record["value"][HOSTILE[0]] = record["value"].pop("bird")
    spec = rc.pr_curves(record)
    # Vega-Lite describes each point (aria-label) with its encodings and its tooltip, so renamed
    # tooltip entries show there the strings the tooltip shows
    for tip in spec["encoding"]["tooltip"]:
        tip["title"] = "tooltip " + tip["title"]
    svg = vlc.vegalite_to_svg(spec)
    shown = set(re.findall(r"tooltip precision: ([-0-9.e+]+);", svg))
    expected = {repr(e["precision"]).removesuffix(".0") for c in record["value"].values() for e in c.values()}
    assert shown == expected and any(len(s) > 14 for s in shown)       # beyond 12 digits
    assert "<script" not in svg and "&lt;script&gt;alert(1)&lt;/script&gt;" in svg
    matrix = {h: {g: {"count": 2, "examples": [{"datum_uid": HOSTILE[1]}]} for g in HOSTILE} for h in HOSTILE}
    svg = vlc.vegalite_to_svg(rc.confusion_heatmap({"value": {"confusion_matrix": matrix}}))
    assert "<script" not in svg and "<img" not in svg and "examples: &quot;&gt;&lt;img" in svg


def test_every_kind_compiles_to_vega():
    vlc = pytest.importorskip("vl_convert", reason="compiling checks need vl-convert-python")
    for name, spec in _all_specs().items():
        check(spec)
        assert vlc.vegalite_to_vega(spec)["marks"], name


def test_sizes_of_large_cases():
    """The 10-IoU x 80-label detection case (the golden coco run's curves) and wide charts stay
    small (bytes of compact JSON)."""
    curves = golden("coco_bbox", "InterpolatedPrecisionRecallCurve")
    by_label = {}
    for c in curves:
        by_label.setdefault(c["parameters"]["label"], []).append(c)
    per_label = [rc.interpolated_pr_curves(by_label[lab]) for lab in sorted(by_label)[::8]]   # 10 of 80
    assert max(size(spec) for spec in per_label if spec) < 50_000
    check(next(spec for spec in per_label if spec))
    labels = sorted(by_label)
    value = {lab: {repr(round(0.05 * (t + 1), 2)): {"tp": 10, "fp": t, "fn": 3 + j, "precision": 1 / (t + 2),
                                                    "recall": 1 / (t + 3)} for t in range(19)}
             for j, lab in enumerate(labels)}
    assert size(check(rc.pr_curves({"value": value}))) < 25_000
    assert size(check(rc.pr_curves({"value": value}, max_series=80))) < 150_000
    bars = [{"name": lab, "series": m, "value": 0.5, "low": 0.4, "high": 0.6} for lab in labels for m in "ab"]
    assert size(check(rc.metric_bars(bars, "AP", "AP"))) < 20_000
