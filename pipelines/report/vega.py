"""The machinery under pipelines/report/charts.py: Vega-Lite specs built with altair on named
placeholder data (InlineData), tooltips that show numbers exactly, explicit colour domains,
titles with notes, and the downsampling of long curves. What the specs look like, and why, is
charts.py's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from numbers import Real

import altair as alt
import numpy as np

MISSING = "-"              # what a tooltip shows for a value the row lacks
MAX_POINTS = 500           # points per curve above which the curve functions downsample


def finite_number(x):
    """A finite float or int from a record value; None for None, NaN, infinities, booleans
    and anything that is not a number."""
    if isinstance(x, bool) or not isinstance(x, Real):
        return None
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = float(x)
    return x if math.isfinite(x) else None


def label_text(x) -> str:
    """Text of a row's name, series, model or measure: "" for None."""
    return "" if x is None else str(x)


def _exact(field: str, title: str) -> tuple[dict, alt.Tooltip]:
    """A tooltip showing number `field` exactly (see charts.py's docstring), "-" when missing.
    `field` is always one of this module's fixed identifiers, never record text."""
    shown = f"{field}_s"
    expr = (f"isValid(datum.{field}) && isFinite(datum.{field}) "
            f"? toString(datum.{field}) : '{MISSING}'")
    return {shown: expr}, alt.Tooltip(f"{shown}:N", title=title)


def tooltips(entries) -> tuple[list, list]:
    """entries: (field, title, kind) with kind "number" (shown exactly), "text" or "list"
    (an array of strings shown comma-separated). Returns (calculate transforms, tooltips)."""
    calcs, tips = {}, []
    for field, title, kind in entries:
        if kind == "number":
            calc, tip = _exact(field, title)
            calcs.update(calc)
            tips.append(tip)
        elif kind == "list":
            shown = f"{field}_s"
            calcs[shown] = (f"isArray(datum.{field}) && length(datum.{field}) > 0 "
                            f"? join(datum.{field}, ', ') : '{MISSING}'")
            tips.append(alt.Tooltip(f"{shown}:N", title=title))
        else:
            tips.append(alt.Tooltip(f"{field}:N", title=title))
    return [alt.CalculateTransform(calculate=expr, **{"as": name}) for name, expr in calcs.items()], tips


def _scheme(n: int) -> str:
    return "category10" if n <= 10 else "tableau20"


def colour(field: str, domain: list, title: str, legend=True) -> alt.Color:
    """The colour of nominal `field`, over an explicit domain (so the same series get the same
    colours whatever the data's order); ten colours up to ten series, twenty beyond."""
    return alt.Color(f"{field}:N", title=title, scale=alt.Scale(domain=domain, scheme=_scheme(len(domain))),
                     legend=alt.Legend(labelLimit=160, symbolLimit=0) if legend else None)


def chart_title(text: str, notes: Sequence[str] = ()) -> alt.TitleParams:
    """A chart's title, with the non-empty notes (what was left out or folded) as subtitle."""
    notes = [n for n in notes if n]
    return alt.TitleParams(text=text, subtitle=list(notes)) if notes else alt.TitleParams(text=text)


class InlineData:
    """Inline data for one spec. altair's to_dict walks every data value (slow on thousands of
    rows), so a chart is built on named placeholders and `spec` puts the rows in after to_dict,
    as `"data": {"values": rows}` where the placeholder was."""

    def __init__(self):
        self.rows: dict[str, list] = {}

    def __call__(self, rows: list[dict]) -> alt.NamedData:
        name = f"evalbeam_rows_{len(self.rows)}"
        self.rows[name] = rows
        return alt.NamedData(name=name)

    def spec(self, chart) -> dict:
        spec = chart.to_dict(validate=False)
        spec.pop("datasets", None)

        def inline(node):
            if isinstance(node, dict):
                data = node.get("data")
                if isinstance(data, dict) and data.get("name") in self.rows:
                    node["data"] = {"values": self.rows[data["name"]]}
                for key, value in node.items():
                    if key != "data":
                        inline(value)
            elif isinstance(node, list):
                for value in node:
                    inline(value)

        inline(spec)
        return spec


def param_text(x) -> str:
    """A parameter for a title: numbers as Python prints them."""
    return repr(x) if isinstance(x, float) else str(x)


def _even_indices(n: int, m: int) -> list[int]:
    """m indices evenly spaced over range(n), the first 0 and the last n - 1 (m <= n)."""
    if m <= 0:
        return []
    if m == 1:
        return [0]
    # round(i * (n - 1) / (m - 1)) half up in integers: strictly increasing when m <= n
    return [(2 * i * (n - 1) + (m - 1)) // (2 * (m - 1)) for i in range(m)]


def downsample_curve(points: Sequence[Mapping], keep: Iterable = (), max_points: int = MAX_POINTS) -> list:
    """At most max_points of a long curve's points, in their order.

    points: the curve's points in drawing order, dicts with "x", "y" and any other fields (a
    score-threshold curve has "threshold"). keep: thresholds whose points must stay (compared
    with ==, against each point's "threshold"; points without one are never forced).

    A curve with max_points points or fewer comes back whole (a new list). Otherwise the first
    and the last point stay, then every point whose threshold is in keep (when those are more
    than max_points - 2 themselves, an evenly spaced subset of them), and the rest of the budget
    goes to points evenly spaced in index over the whole curve (those that coincide with a kept
    point are not replaced, so the result can be a little shorter than max_points). The result
    depends only on the points' order and thresholds, never on their values."""
    points = list(points)
    n = len(points)
    if n <= max_points:
        return points
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, not {max_points}")
    keep = set(keep)
    forced = [i for i in range(1, n - 1) if points[i].get("threshold") in keep] if keep else []
    budget = max_points - 2
    if len(forced) > budget:
        forced = [forced[j] for j in _even_indices(len(forced), budget)]
    chosen = {0, n - 1, *forced}
    chosen.update(_even_indices(n, max_points - len(forced)))
    return [points[i] for i in sorted(chosen)]
