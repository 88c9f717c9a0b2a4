"""Vega-Lite chart specs for the HTML report, built from metric records (as in metrics.jsonl).

Every public function is pure: records in, a JSON-serialisable Vega-Lite spec (a dict) out, or
None when there is nothing to draw. The page renders the specs with vega-embed; nothing here
builds HTML or draws.

What the specs look like
- Data is inline (`"data": {"values": [...]}` on the chart or on a layer), never a URL and never
  altair's top-level `"datasets"`; only the fields a chart uses, under short fixed field names
  of this module's own (Vega-Lite reads `.`, `[` and `\\` in field names as paths, so labels,
  datum uids, model names and other untrusted text are only ever values, never field names,
  format strings or expressions). Numbers are the records' numbers, unrounded; NaN and
  infinities are left out (a missing value), so the spec is strict JSON.
- Tooltips show numbers exactly: a `calculate` transform turns each shown number into the
  shortest string that reads back as the same float (JavaScript's String(x), like Python's
  repr), because Vega-Lite's default tooltip format keeps only 12 significant digits. A value a
  row lacks shows as "-".
- Untrusted text reaches the page as data values only: Vega draws axis labels, legends and
  titles as text (SVG text nodes or canvas), and vega-tooltip, which vega-embed uses for
  tooltips, HTML-escapes every value with its default `sanitize` (the page must keep it).
- Deterministic: series are sorted (labels by name, IoU thresholds by value), colour domains
  are explicit, and the same records give the same spec, byte for byte once json.dumps'd.
- Sizes are fixed: width 360-480 and height 260-300 for single charts, 240 x 180 per panel of
  at_k_lines, a heatmap square from 240 to 560 px, a bar chart 480 wide and 12 px per bar, from
  120 up to 2400 px high.
- Built with altair on named placeholder data, then `to_dict(validate=False)` and the rows put
  in (altair's to_dict walks every data value, slow on a large matrix); composite charts get
  their properties in one constructor call (each chained method deep-copies every layer). The
  tests validate every kind of spec against the Vega-Lite schema; the report does not, at run
  time. What building and validating cost: tests/benchmarks/README.md, "Measurements behind the
  design".

The specs carry altair's `$schema` (Vega-Lite 6): the page's bundle should be Vega-Lite 6 with
Vega 6 and vega-embed 7.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import altair as alt
import numpy as np

from evalbeam.pipelines.report import vega
from evalbeam.pipelines.report.vega import MAX_POINTS, downsample_curve

__all__ = [
    "pr_curves", "interpolated_pr_curves", "confusion_heatmap", "reliability_diagram",
    "metric_bars", "at_k_lines", "histogram", "downsample_curve",
]

CELL_TEXT_LABELS = 15      # the heatmap writes counts in its cells up to this many labels
OTHER = "(other)"
NO_PREDICTION = "(no prediction)"
NO_GROUND_TRUTH = "(no ground truth)"


def _threshold(key):
    try:
        value = float(key)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


# --- 1. score-threshold precision-recall curves ------------------------------------------

def pr_curves(record: Mapping, max_series: int = 12, *, keep: Iterable = (),
              max_points: int = MAX_POINTS) -> dict | None:
    """Precision against recall of a PrecisionRecallCurve record (classification, or detection
    at its pr_curve_iou_threshold): one line with points per label, in score-threshold order.

    With more than max_series labels, the max_series with the most ground truths (tp + fn, then
    by name) are drawn and the subtitle says how many of how many. Points without a finite
    precision and recall are left out; a curve longer than max_points is downsampled with
    downsample_curve, keeping the thresholds in keep. Tooltip: label, threshold, precision,
    recall, tp, fp, fn (and tn when the record has it). None without any point to draw."""
    data = vega.InlineData()
    value = record.get("value") if isinstance(record, Mapping) else None
    if not isinstance(value, Mapping):
        return None
    curves, truths = {}, {}
    for label, by_threshold in value.items():
        if not isinstance(by_threshold, Mapping):
            continue
        points = []
        for key, entry in by_threshold.items():
            t = _threshold(key)
            if t is None or not isinstance(entry, Mapping):
                continue
            p, r = vega.finite_number(entry.get("precision")), vega.finite_number(entry.get("recall"))
            tp, fn = vega.finite_number(entry.get("tp")), vega.finite_number(entry.get("fn"))
            if tp is not None and fn is not None:
                truths[str(label)] = max(truths.get(str(label), 0), tp + fn)
            if p is None or r is None:
                continue
            points.append({"x": r, "y": p, "threshold": t, "entry": entry})
        if points:
            points.sort(key=lambda pt: pt["threshold"])
            curves[str(label)] = points
    if not curves:
        return None
    total = len(curves)
    labels = sorted(curves, key=lambda lab: (-truths.get(lab, 0), lab))[:max(1, max_series)]
    labels.sort()
    with_tn = any("tn" in pt["entry"] for lab in labels for pt in curves[lab])
    rows = []
    for lab in labels:
        for pt in downsample_curve(curves[lab], keep, max_points):
            entry = pt["entry"]
            row = {"l": lab, "t": pt["threshold"], "p": pt["y"], "r": pt["x"]}
            for field in ("tp", "fp", "fn") + (("tn",) if with_tn else ()):
                number = vega.finite_number(entry.get(field))
                if number is not None:
                    row[field] = number
            rows.append(row)
    params = record.get("parameters") or {}
    iou = params.get("iou_threshold", params.get("pr_curve_iou_threshold"))
    key = params.get("label_key")
    context = (f" (IoU {vega.param_text(iou)})" if iou is not None else
               f" (key {key})" if key is not None else "")
    notes = [f"{len(labels)} of {total} labels shown: those with the most ground truths"
             if len(labels) < total else ""]
    calcs, tips = vega.tooltips([("l", "label", "text"), ("t", "score threshold", "number"),
                             ("p", "precision", "number"), ("r", "recall", "number"),
                             ("tp", "tp", "number"), ("fp", "fp", "number"), ("fn", "fn", "number")]
                            + ([("tn", "tn", "number")] if with_tn else []))
    return _precision_recall_lines(
        data, rows, calcs, vega.chart_title(f"Precision-recall by score threshold{context}", notes),
        point_size=28, precision="precision", colour=vega.colour("l", labels, "label"), order="t:Q",
        tooltips=tips)


# --- 2. interpolated (101-point) precision-recall curves -----------------------------------

def interpolated_pr_curves(records: Sequence[Mapping], max_series: int = 12,
                           series: str = "iou_threshold", *,
                           max_points: int = MAX_POINTS) -> dict | None:
    """Interpolated precision against recall of InterpolatedPrecisionRecallCurve records (value
    {"precisions": [P], "scores": [P]} at recall np.linspace(0, 1, P), usually P = 101),
    one line per value of parameters[series]: series="iou_threshold" for one label's records
    at several IoU thresholds, series="label" for one IoU threshold's records of several labels.

    The records must be of one model and slice and agree on every parameter but `series` (and
    the coco protocol's category_id with series="label"); ValueError otherwise, and for two
    records of the same series value. Recall of point i is np.linspace(0, 1, P)[i], the recall
    threshold the record's entry belongs to (0.35000000000000003 at i = 35, as the tooltip
    shows); a precision of -1 (undefined: no ground truth), None or NaN is left out. The data is
    one row per curve holding the record's arrays (see the code), about half the size of one row
    per point. With more than max_series series, the max_series with the highest AP (mean of
    the defined precisions, then by value) are drawn and the subtitle says so. Tooltip: series,
    recall, precision, score."""
    data = vega.InlineData()
    if series not in ("iou_threshold", "label"):
        raise ValueError(f'series must be "iou_threshold" or "label", not {series!r}')
    curves, fixed = _interpolated_curves(records, series)
    defined = {k: [p for p in curve[0] if p is not None and p >= 0] for k, curve in curves.items()}
    drawable = {k: ps for k, ps in defined.items() if ps}
    if not drawable:
        return None
    ap = {k: sum(ps) / len(ps) for k, ps in drawable.items()}
    keys = sorted(drawable, key=lambda k: (-ap[k], k))[:max(1, max_series)]
    keys.sort()
    rows, points = _interpolated_rows(curves, keys, max_points)
    if series == "iou_threshold":
        legend, context = "IoU threshold", (f" (label {fixed['label']})" if "label" in fixed else "")
        what = "IoU thresholds"
    else:
        legend = "label"
        iou = fixed.get("iou_threshold")
        context = f" (IoU {vega.param_text(iou)})" if iou is not None else ""
        what = "labels"
    notes = [f"{len(keys)} of {len(drawable)} {what} shown: those with the highest AP"
             if len(keys) < len(drawable) else ""]
    calcs, tips = vega.tooltips([("s", legend, "number" if series == "iou_threshold" else "text"),
                             ("r", "recall", "number"), ("p", "interpolated precision", "number"),
                             ("c", "score", "number")])
    return _precision_recall_lines(
        data, rows, points + calcs, vega.chart_title(f"Interpolated precision-recall{context}", notes),
        point_size=10, precision="interpolated precision", colour=vega.colour("s", keys, legend),
        order="r:Q", tooltips=tips)


def _interpolated_curves(records: Sequence[Mapping], series: str) -> tuple[dict, dict]:
    """({series value: (precisions, scores)}, the parameters the records share) of
    interpolated_pr_curves' records, each array as numbers or None; ValueError for records
    that cannot share one chart (see interpolated_pr_curves)."""
    curves, identity, fixed = {}, None, {}
    for record in records or ():
        params = dict(record.get("parameters") or {})
        if series not in params:
            raise ValueError(f"an InterpolatedPrecisionRecallCurve record without {series!r}")
        key = params.pop(series)
        key = vega.finite_number(key) if series == "iou_threshold" else str(key)
        if series == "label":
            params.pop("category_id", None)     # the coco protocol's id of the label
        if key is None:
            raise ValueError("an InterpolatedPrecisionRecallCurve record without a finite iou_threshold")
        ident = (record.get("model"), repr(record.get("slice")), repr(sorted(params.items(), key=str)))
        if identity is None:
            identity = ident
            fixed = params
        elif ident != identity:
            raise ValueError("records of more than one model, slice or parameter set "
                             f"(other than {series}) cannot share one chart")
        if key in curves:
            raise ValueError(f"two records for {series} {key!r}")
        value = record.get("value")
        value = value if isinstance(value, Mapping) else {}
        precisions = [vega.finite_number(p) for p in value.get("precisions") or ()]
        scores = [vega.finite_number(c) for c in value.get("scores") or ()]
        scores = (scores + [None] * len(precisions))[:len(precisions)]
        curves[key] = (precisions, scores)
    return curves, fixed


def _interpolated_rows(curves: dict, keys: list, max_points: int) -> tuple[list[dict], list]:
    """(the data rows, the transforms that make them points) of the curves of keys."""
    # One row per curve with the record's two arrays as they are (non-finite -> null); Vega
    # flattens them into points, numbers them, and computes each point's recall exactly as
    # np.linspace does (i * (1 / (P - 1)), the last one 1), so a point carries no recall and no
    # series name. A curve longer than max_points keeps downsample_curve's points of its
    # defined ones, with their indices ("i") since the positions no longer tell them.
    rows = []
    for k in keys:
        precisions, scores = curves[k]
        row = {"s": k, "k": len(precisions) - 1, "p": precisions, "c": scores}
        if len(precisions) > max_points:
            points = [{"x": i, "y": p} for i, p in enumerate(precisions) if p is not None and p >= 0]
            index = [pt["x"] for pt in downsample_curve(points, (), max_points)]
            row.update(p=[precisions[i] for i in index], c=[scores[i] for i in index], i=index)
        rows.append(row)
    indexed = any("i" in row for row in rows)
    for row in rows:
        if indexed and "i" not in row:
            row["i"] = list(range(len(row["p"])))
    position = "datum.i" if indexed else "(datum.i - 1)"
    points = [alt.FlattenTransform(flatten=["p", "c", "i"] if indexed else ["p", "c"])]
    if not indexed:
        points.append(alt.WindowTransform(window=[alt.WindowFieldDef(op="row_number", **{"as": "i"})],
                                          groupby=["s"]))
    points += [
        alt.CalculateTransform(calculate=f"datum.k == 0 ? 0 : {position} == datum.k ? 1 "
                                         f": {position} * (1 / datum.k)", **{"as": "r"}),
        alt.FilterTransform(filter="isValid(datum.p) && datum.p >= 0"),
    ]
    return rows, points


def _precision_recall_lines(data: vega.InlineData, rows: list[dict], transform: list, title, *,
                            point_size: int, precision: str, colour: alt.Color, order: str,
                            tooltips: list) -> dict:
    """The spec of both precision-recall charts: one line per series of precision (field "p",
    axis titled `precision`) against recall (field "r"), both on [0, 1], a point at every
    vertex, each line drawn in the order of the field `order` (a score threshold, or recall)."""
    chart = alt.Chart(
        data(rows), transform=transform, width=420, height=300, title=title,
    ).mark_line(
        point=alt.OverlayMarkDef(filled=True, size=point_size), strokeWidth=1.5, clip=True,
    ).encode(
        x=alt.X("r:Q", title="recall", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("p:Q", title=precision, scale=alt.Scale(domain=[0, 1])),
        color=colour,
        order=alt.Order(order),
        tooltip=tooltips,
    )
    return data.spec(chart)


# --- 3. confusion matrix heatmap -----------------------------------------------------------

def _cell(cell):
    """(count, uids, iou or ratio) of a confusion-matrix cell: {"count", "examples"},
    {"iou" | "ratio", "count"}, or a plain count (detection with --max_examples 0)."""
    if isinstance(cell, Mapping):
        count = vega.finite_number(cell.get("count"))
        uids = [str(ex["datum_uid"]) for ex in cell.get("examples") or ()
                if isinstance(ex, Mapping) and ex.get("datum_uid") is not None]
        extra = vega.finite_number(cell.get("iou", cell.get("ratio")))
        return count, uids, extra
    return vega.finite_number(cell), [], None


def _fresh(name: str, taken: set) -> str:
    while name in taken:
        name += "*"
    return name


def _confusion_cells(value: Mapping) -> tuple[list[tuple], bool]:
    """(cells, segmentation) of a ConfusionMatrix record's value. cells: (gt, pd, count, uids,
    extra, kind) with kind "cell", "gt" (an unmatched ground truth, pd None) or "pd" (an
    unmatched prediction, gt None) and extra the cell's IoU or ratio (_cell); segmentation:
    whether the record carries IoUs or ratios (a segmentation matrix)."""
    matrix = value.get("confusion_matrix") or {}
    unmatched_gt = value.get("unmatched_ground_truths") or {}
    unmatched_pd = value.get("unmatched_predictions") or {}
    cells = []
    for gt, row in (matrix.items() if isinstance(matrix, Mapping) else ()):
        for pd, cell in (row.items() if isinstance(row, Mapping) else ()):
            cells.append((str(gt), str(pd), *_cell(cell), "cell"))
    for label, cell in (unmatched_gt.items() if isinstance(unmatched_gt, Mapping) else ()):
        cells.append((str(label), None, *_cell(cell), "gt"))
    for label, cell in (unmatched_pd.items() if isinstance(unmatched_pd, Mapping) else ()):
        cells.append((None, str(label), *_cell(cell), "pd"))
    segmentation = any(isinstance(c, Mapping) and ("iou" in c or "ratio" in c)
                       for row in (matrix.values() if isinstance(matrix, Mapping) else ())
                       if isinstance(row, Mapping) for c in row.values())
    segmentation = segmentation or any(
        isinstance(c, Mapping) and "ratio" in c
        for side in (unmatched_gt, unmatched_pd) if isinstance(side, Mapping) for c in side.values())
    return cells, segmentation


def _heatmap_rows(cells: list[tuple], name: dict, no_ground_truth: str, no_prediction: str) -> list[dict]:
    """The heatmap's data: one row per drawn (ground truth "g", prediction "p") cell, sorted,
    with its count "n", up to 3 example uids "e" (the field left out when no cell has any) and
    its IoU "i" or unmatched ratio "u" when it is one record cell. name maps each label to the
    one drawn (itself, or the folded "(other)"); cells of count 0 are left out."""
    merged: dict[tuple, dict] = {}
    for gt, pd, count, uids, extra, kind in sorted(cells, key=lambda c: (c[5], c[0] or "", c[1] or "")):
        if not count:
            continue
        g = name[gt] if gt is not None else no_ground_truth
        p = name[pd] if pd is not None else no_prediction
        key = (g, p)
        cell = merged.get(key)
        if cell is None:
            cell = merged[key] = {"g": g, "p": p, "n": 0, "e": [], "parts": 0}
            if extra is not None:
                cell["i" if kind == "cell" else "u"] = extra
        cell["n"] += count
        cell["parts"] += 1
        if cell["parts"] > 1:       # a folded cell: the record has no IoU or ratio for it
            cell.pop("i", None)
            cell.pop("u", None)
        cell["e"].extend(uids[:max(0, 3 - len(cell["e"]))])
    has_examples = any(cell["e"] for cell in merged.values())
    rows = []
    for key in sorted(merged):
        cell = merged[key]
        del cell["parts"]
        if not has_examples:
            del cell["e"]
        rows.append(cell)
    return rows


def confusion_heatmap(record: Mapping, max_labels: int = 30) -> dict | None:
    """Heatmap of a ConfusionMatrix record's counts: ground truth down, prediction across, a
    log colour scale, and counts written in the cells when at most 15 labels are drawn.
    Unmatched ground truths are a "(no prediction)" column, unmatched predictions a
    "(no ground truth)" row, when the record has any.

    With more than max_labels labels, the max_labels most frequent (row plus column totals,
    unmatched included; then by name) are kept and the others folded into "(other)" (counts
    added, examples pooled); the subtitle says so. Cells with count 0 are left blank (and out
    of the data). Tooltip: ground truth, prediction, count, up to 3 example datum uids (never
    geometries); for segmentation the cell's IoU or the unmatched ratio (not for folded cells,
    whose IoU the record does not give)."""
    data = vega.InlineData()
    value = record.get("value") if isinstance(record, Mapping) else None
    if not isinstance(value, Mapping):
        return None
    cells, segmentation = _confusion_cells(value)
    frequency: dict[str, int] = {}
    for gt, pd, count, *_ in cells:
        for label in (gt, pd):
            if label is not None:
                frequency[label] = frequency.get(label, 0) + (count or 0)
    if not frequency or not any(count for _, _, count, *_ in cells):
        return None
    labels = sorted(frequency)
    folded = False
    if len(labels) > max_labels:
        kept = sorted(labels, key=lambda lab: (-frequency[lab], lab))[:max(1, max_labels)]
        kept_set = set(kept)
        other = _fresh(OTHER, set(labels))
        name = {lab: (lab if lab in kept_set else other) for lab in labels}
        shown = sorted(kept) + [other]
        folded = True
    else:
        name = {lab: lab for lab in labels}
        shown = labels
    taken = set(labels) | set(shown)
    no_prediction = _fresh(NO_PREDICTION, taken)
    no_ground_truth = _fresh(NO_GROUND_TRUTH, taken | {no_prediction})
    rows = _heatmap_rows(cells, name, no_ground_truth, no_prediction)
    has_examples = any("e" in cell for cell in rows)
    x_domain = shown + ([no_prediction] if any(c["p"] == no_prediction for c in rows) else [])
    y_domain = shown + ([no_ground_truth] if any(c["g"] == no_ground_truth for c in rows) else [])
    entries = [("g", "ground truth", "text"), ("p", "prediction", "text"), ("n", "count", "number")]
    if segmentation:
        entries += [("i", "IoU", "number"), ("u", "unmatched ratio", "number")]
    if has_examples:
        entries.append(("e", "examples", "list"))
    calcs, tips = vega.tooltips(entries)
    side = max(240, min(560, 28 * max(len(x_domain), len(y_domain))))
    counts = [c["n"] for c in rows]
    low, high = min(counts), max(counts)
    base = alt.Chart().encode(
        x=alt.X("p:N", title="prediction", scale=alt.Scale(domain=x_domain),
                axis=alt.Axis(labelAngle=-45, labelLimit=120, orient="top")),
        y=alt.Y("g:N", title="ground truth", scale=alt.Scale(domain=y_domain),
                axis=alt.Axis(labelLimit=120)),
        tooltip=tips,
    )
    rect = base.mark_rect().encode(
        color=alt.Color("n:Q", title="count", scale=alt.Scale(type="log", scheme="blues")))
    layers = [rect]
    if len(shown) <= CELL_TEXT_LABELS:
        dark = low * (high / low) ** 0.55 if high > low else high + 1
        layers.append(base.mark_text(fontSize=10).encode(
            text=alt.Text("n:Q", format=".3~s"),
            color=alt.condition(f"datum.n >= {dark!r}", alt.value("white"), alt.value("black"))))
    params = record.get("parameters") or {}
    context = ", ".join(f"{name_} {vega.param_text(params[key])}" for key, name_ in
                        (("label_key", "key"), ("iou_threshold", "IoU"), ("score_threshold", "score >=")
                         ) if params.get(key) is not None)
    notes = [f"{len(shown) - 1} most frequent of {len(labels)} labels shown, "
             f"{len(labels) - len(shown) + 1} folded into {shown[-1]}" if folded else ""]
    chart = alt.LayerChart(
        layer=layers, data=data(rows), transform=calcs, width=side, height=side,
        title=vega.chart_title("Confusion matrix" + (f" ({context})" if context else ""), notes))
    return data.spec(chart)


# --- 4. reliability diagram ----------------------------------------------------------------

def reliability_diagram(record: Mapping) -> dict | None:
    """Accuracy against mean confidence per bin of a ReliabilityDiagram (or
    ClasswiseReliabilityDiagram) record: a line through the non-empty bins, points sized by
    their count, and the dashed diagonal y = x of perfect calibration. Tooltip: bin bounds,
    count, confidence, accuracy. None without a non-empty bin."""
    data = vega.InlineData()
    value = record.get("value") if isinstance(record, Mapping) else None
    bins = value.get("bins") if isinstance(value, Mapping) else None
    rows = []
    for b in bins or ():
        if not isinstance(b, Mapping):
            continue
        count, conf, acc = (vega.finite_number(b.get(k)) for k in ("count", "confidence", "accuracy"))
        if not count or conf is None or acc is None:
            continue
        row = {"c": conf, "a": acc, "n": count}
        for field, key in (("lo", "lower"), ("hi", "upper")):
            number = vega.finite_number(b.get(key))
            if number is not None:
                row[field] = number
        rows.append(row)
    if not rows:
        return None
    rows.sort(key=lambda r: (r.get("lo", r["c"]), r["c"]))
    calcs, tips = vega.tooltips([("lo", "bin lower", "number"), ("hi", "bin upper", "number"),
                             ("n", "count", "number"), ("c", "confidence", "number"),
                             ("a", "accuracy", "number")])
    x = alt.X("c:Q", title="mean confidence", scale=alt.Scale(domain=[0, 1]))
    y = alt.Y("a:Q", title="accuracy", scale=alt.Scale(domain=[0, 1]))
    diagonal = alt.Chart(data([{"d": 0}, {"d": 1}])).mark_line(
        color="#999999", strokeDash=[4, 4], strokeWidth=1).encode(
        x=alt.X("d:Q", scale=alt.Scale(domain=[0, 1])), y=alt.Y("d:Q", scale=alt.Scale(domain=[0, 1])))
    base = alt.Chart()
    line = base.mark_line(color="#4c78a8", strokeWidth=1.5).encode(x=x, y=y, order=alt.Order("c:Q"))
    points = base.mark_circle(color="#4c78a8", opacity=0.85).encode(
        x=x, y=y, size=alt.Size("n:Q", title="count", scale=alt.Scale(range=[30, 400], zero=True)),
        tooltip=tips)
    params = record.get("parameters") or {}
    label = params.get("label") if isinstance(params.get("label"), Mapping) else None
    detail = []
    if label is not None:
        detail.append(f"{label.get('key')} = {label.get('value')}")
    elif params.get("label_key") is not None:
        detail.append(str(params["label_key"]))
    if params.get("bins") is not None:
        detail.append(f"{params['bins']} {params.get('binning', '')} bins".replace("  ", " "))
    bins_layer = alt.LayerChart(layer=[line, points], data=data(rows), transform=calcs)
    chart = alt.LayerChart(
        layer=[diagonal, bins_layer], width=360, height=300,
        title=vega.chart_title("Reliability diagram" + (f" ({', '.join(detail)})" if detail else "")))
    return data.spec(chart)


# --- 5. bars (or points with intervals) ----------------------------------------------------

BAR_STEP = 12          # pixels per bar (name x series) in metric_bars
BARS_MAX_HEIGHT = 2400


def _interval_rows(rows, keys):
    """Rows with numbers made finite-or-absent; `keys` maps output field -> input key."""
    out = []
    for row in rows:
        item = {}
        for field, key in keys.items():
            number = vega.finite_number(row.get(key))
            if number is not None:
                item[field] = number
        out.append(item)
    return out


def metric_bars(rows: Sequence[Mapping], title: str, x_title: str, *,
                y_title: str | None = None) -> dict | None:
    """Horizontal bars of rows {"name", "series", "value", "low", "high"}: one band per name
    (in the rows' order of first appearance), one bar per series inside it (series sorted, one
    colour each). When any row has an interval (low and high), every value is a point instead
    and intervals are error bars. A row whose value is missing keeps its name on the axis but
    draws nothing. Height grows by 12 px per bar, up to 2400 px (about 200 bars). The name axis
    has no title unless y_title is given. ValueError for two rows of the same (name, series)."""
    data = vega.InlineData()
    names, seen = [], set()
    items = []
    for row, numbers in zip(rows or (), _interval_rows(rows or (), {"v": "value", "lo": "low", "hi": "high"})):
        name, series = vega.label_text(row.get("name")), vega.label_text(row.get("series"))
        if (name, series) in seen:
            raise ValueError(f"two rows for name {name!r} and series {series!r}")
        seen.add((name, series))
        if name not in names:
            names.append(name)
        if "v" not in numbers:
            continue
        if not ("lo" in numbers and "hi" in numbers):
            numbers.pop("lo", None)
            numbers.pop("hi", None)
        items.append({"n": name, "s": series, **numbers})
    if not items:
        return None
    series_domain = sorted({d["s"] for d in items})
    intervals = any("lo" in d for d in items)
    height = max(120, min(BARS_MAX_HEIGHT, BAR_STEP * len(names) * len(series_domain)))
    entries = [("n", "name", "text"), ("s", "series", "text"), ("v", "value", "number")]
    if intervals:
        entries += [("lo", "low", "number"), ("hi", "high", "number")]
    calcs, tips = vega.tooltips(entries)
    y = alt.Y("n:N", title=y_title, scale=alt.Scale(domain=names),
              axis=alt.Axis(labelLimit=220, labelOverlap=True))
    offset = alt.YOffset("s:N", scale=alt.Scale(domain=series_domain))
    colour = vega.colour("s", series_domain, "series", legend=len(series_domain) > 1)
    encoding = {"y": y, "color": colour, "tooltip": tips}
    if len(series_domain) > 1:
        encoding["yOffset"] = offset
    if intervals:
        rule = alt.Chart().mark_rule(strokeWidth=1.5).encode(
            x=alt.X("lo:Q", title=x_title), x2="hi:Q", **encoding)
        point = alt.Chart().mark_point(filled=True, size=40, opacity=1).encode(
            x=alt.X("v:Q", title=x_title), **encoding)
        chart = alt.LayerChart(layer=[rule, point], data=data(items), transform=calcs,
                               width=480, height=height, title=vega.chart_title(str(title)))
    else:
        chart = alt.Chart(data(items), transform=calcs, width=480, height=height,
                          title=vega.chart_title(str(title))
                          ).mark_bar().encode(x=alt.X("v:Q", title=x_title), **encoding)
    return data.spec(chart)


# --- 6. value against k --------------------------------------------------------------------

def at_k_lines(rows: Sequence[Mapping], title: str) -> dict | None:
    """Lines of value against k from rows {"measure", "k", "model", "value", "low", "high"}:
    one colour per model (sorted), one panel per measure (in the rows' order of first
    appearance, each with its own y scale) when there are several. The k axis is logarithmic
    when the largest k is more than 100 times the smallest (and all k > 0); its ticks are the k
    values. Intervals (low and high) are vertical error bars. Rows without an integer k (a
    whole-ranking value) or a value are left out. ValueError for two rows of the same
    (measure, k, model)."""
    data = vega.InlineData()
    measures, seen, items = [], set(), []
    for row, numbers in zip(rows or (), _interval_rows(rows or (), {"v": "value", "lo": "low", "hi": "high"})):
        k = vega.finite_number(row.get("k"))
        if k is None or k != int(k) or "v" not in numbers:
            continue
        k = int(k)
        measure, model = vega.label_text(row.get("measure")), vega.label_text(row.get("model"))
        if (measure, k, model) in seen:
            raise ValueError(f"two rows for measure {measure!r}, k {k} and model {model!r}")
        seen.add((measure, k, model))
        if measure not in measures:
            measures.append(measure)
        if not ("lo" in numbers and "hi" in numbers):
            numbers.pop("lo", None)
            numbers.pop("hi", None)
        items.append({"m": measure, "k": k, "s": model, **numbers})
    if not items:
        return None
    items.sort(key=lambda d: (measures.index(d["m"]), d["s"], d["k"]))
    models = sorted({d["s"] for d in items})
    ks = sorted({d["k"] for d in items})
    log = ks[0] > 0 and ks[-1] > 100 * ks[0]
    intervals = any("lo" in d for d in items)
    entries = [("m", "measure", "text"), ("s", "model", "text"), ("k", "k", "number"),
               ("v", "value", "number")]
    if intervals:
        entries += [("lo", "low", "number"), ("hi", "high", "number")]
    calcs, tips = vega.tooltips(entries)
    x = alt.X("k:Q", title="k", scale=alt.Scale(type="log") if log else alt.Scale(zero=False),
              axis=alt.Axis(values=ks, format="d", labelOverlap=True))
    colour = vega.colour("s", models, "model", legend=len(models) > 1)
    facet = len(measures) > 1
    width, height = (240, 180) if facet else (420, 280)
    line = alt.Chart().mark_line(point=alt.OverlayMarkDef(filled=True, size=30), strokeWidth=1.5).encode(
        x=x, y=alt.Y("v:Q", title="value" if facet else measures[0]), color=colour,
        order=alt.Order("k:Q"), tooltip=tips)
    layers = [line]
    if intervals:
        layers.insert(0, alt.Chart().mark_rule(strokeWidth=1.2, opacity=0.7).encode(
            x=x, y="lo:Q", y2="hi:Q", color=colour, tooltip=tips))
    if facet:
        chart = alt.FacetChart(
            data=data(items), spec=alt.LayerChart(layer=layers, transform=calcs, width=width, height=height),
            facet=alt.Facet("m:N", title=None, sort=measures), columns=3,
            resolve=alt.Resolve(scale=alt.ScaleResolveMap(y="independent")),
            title=vega.chart_title(str(title)))
    else:
        chart = alt.LayerChart(layer=layers, data=data(items), transform=calcs, width=width, height=height,
                               title=vega.chart_title(str(title)))
    return data.spec(chart)


# --- 7. histogram --------------------------------------------------------------------------

def histogram(values, title: str, x_title: str, bins: int = 20, domain=None) -> dict | None:
    """Histogram of a per-datum distribution, binned here (numpy) so the spec holds one row per
    bin and series, never the values. values: a list of numbers, or {series: list of numbers}
    for overlaid series (sorted, one colour each, translucent). The bins are `bins` equal
    intervals over domain (lo, hi), or over the finite values' range when domain is None (a
    single value v gets [v - 0.5, v + 0.5]); intervals are [lo, hi) but the last is closed.
    None, NaN and infinities are left out; values outside a given domain too, and the subtitle
    counts them. Tooltip: series, bin bounds, count, share of the series' binned values."""
    data = vega.InlineData()
    if bins < 1:
        raise ValueError(f"bins must be at least 1, not {bins}")
    named = isinstance(values, Mapping)
    groups = {str(k): v for k, v in values.items()} if named else {"": values}
    finite = {}
    for key in sorted(groups):
        numbers = [vega.finite_number(x) for x in (() if groups[key] is None else groups[key])]
        finite[key] = np.array([x for x in numbers if x is not None], dtype=float)
    everything = np.concatenate(list(finite.values())) if finite else np.array([])
    if domain is not None:
        lo, hi = float(domain[0]), float(domain[1])
        if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            raise ValueError(f"domain must be two finite numbers, low < high, not {domain!r}")
    elif everything.size:
        lo, hi = float(everything.min()), float(everything.max())
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
    else:
        return None
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
    edges[-1] = hi
    rows, outside = [], 0
    for key, xs in finite.items():
        inside = xs[(xs >= lo) & (xs <= hi)]
        outside += int(xs.size - inside.size)
        if not inside.size:
            continue
        counts, _ = np.histogram(inside, bins=np.array(edges))
        for i, count in enumerate(counts.tolist()):
            row = {"lo": edges[i], "hi": edges[i + 1], "n": int(count), "f": count / inside.size}
            if named:
                row["s"] = key
            rows.append(row)
    if not rows:
        return None
    series = sorted({r["s"] for r in rows}) if named else []
    entries = ([("s", "series", "text")] if named else []) + [
        ("lo", "from", "number"), ("hi", "to", "number"), ("n", "count", "number"), ("f", "share", "number")]
    calcs, tips = vega.tooltips(entries)
    encoding = dict(
        x=alt.X("lo:Q", title=x_title, scale=alt.Scale(domain=[lo, hi], zero=False), bin="binned"),
        x2="hi:Q", y=alt.Y("n:Q", title="count", stack=None), tooltip=tips)
    if named:
        encoding["color"] = vega.colour("s", series, "series")
    notes = [f"{outside} value{'s' if outside != 1 else ''} outside "
             f"[{vega.param_text(lo)}, {vega.param_text(hi)}] not shown" if outside else ""]
    chart = alt.Chart(data(rows), transform=calcs, width=420, height=260,
                      title=vega.chart_title(str(title), notes)).mark_bar(
        opacity=0.55 if len(series) > 1 else 0.9, binSpacing=0).encode(**encoding)
    return data.spec(chart)
