"""What every part of the HTML report is made of: a run's files as the page reads them
(RunFiles), the formatting of numbers and names, tables, and the page's list of charts.

Every function returns plain strings and dicts; the template escapes all of them (Jinja2's
auto-escaping), so a string from a run (labels, datum uids, model text, reasons) is text,
never markup. Bounds: a table lists at most MAX_TABLE_ROWS rows, a text is clipped to MAX_TEXT
characters.
"""

from __future__ import annotations

import json
import math

MAX_TABLE_ROWS = 200
MAX_EXAMPLES = 10
MAX_TEXT = 2000


# ---- where a run's files are -----------------------------------------------------------------

class RunFiles:
    """A run's files: `folder` holds them (a finished run folder, or the temporary folder of a
    run about to publish); `info` is its run.json (read from the folder when not given)."""

    def __init__(self, folder: str, info: dict | None = None):
        self.folder = folder
        self.info = info if info is not None else _read_json(self.path("run.json"))

    def path(self, name: str) -> str:
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.join(self.folder, name)

    def exists(self, name: str) -> bool:
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(self.path(name))

    def lines(self, name: str):
        """The parsed JSON lines of one of the run's files (nothing if it is absent)."""
        if not self.exists(name):
            return
        from evalbeam.transforms.input_files import iter_json_lines

        for _, value in iter_json_lines(self.path(name)):
            yield value


def _read_json(path: str):
    from evalbeam.transforms.io import read_json

    return read_json(path)


# ---- small formatting helpers (the template shows what these return, escaped) ----------------

def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def slice_text(slice_value: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(slice_value.items())) if slice_value else "all datums"


def params_text(params: dict, skip=()) -> str:
    parts = []
    for key, value in sorted((params or {}).items()):
        if key in skip:
            continue
        if isinstance(value, dict) and set(value) == {"key", "value"}:
            value = f"{value['key']}:{value['value']}"
        elif isinstance(value, list) and len(value) > 4:
            value = f"[{fmt(value[0])}..{fmt(value[-1])}, {len(value)}]"
        parts.append(f"{key}={value if isinstance(value, str) else json.dumps(value)}")
    return " ".join(parts)


def interval_text(interval) -> str:
    if not isinstance(interval, dict) or "low" not in interval:
        return ""
    return f"[{fmt(interval['low'])}, {fmt(interval['high'])}]"


def value_text(value, interval=None) -> str:
    """A number, then its interval when it has one: "0.91 [0.88, 0.93]"."""
    shown = interval_text(interval)
    return fmt(value) + (f" {shown}" if shown else "")


def clip(text, limit: int = MAX_TEXT) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit:,} more characters)"


# ---- charts ---------------------------------------------------------------------------------

class Charts:
    """The page's charts: each spec gets an id; the template writes them as JSON data."""

    def __init__(self):
        self.specs: list[tuple[str, str]] = []

    def add(self, spec) -> dict | None:
        if not spec:
            return None
        chart_id = f"chart-{len(self.specs)}"
        self.specs.append((chart_id, script_json(spec)))
        title = spec.get("title", "")
        if isinstance(title, dict):
            title = title.get("text", "")
        if isinstance(title, list):
            title = " ".join(map(str, title))
        return {"kind": "chart", "id": chart_id, "title": str(title)}


def script_json(value) -> str:
    """JSON safe inside a <script type="application/json"> element: no "</script>", no "<!--",
    whatever strings the value holds."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") \
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def table(title: str, columns: list[str], rows: list[list], note: str = "", cls: str = "") -> dict:
    shown = rows[:MAX_TABLE_ROWS]
    if len(rows) > MAX_TABLE_ROWS:
        note = (note + " " if note else "") + f"First {MAX_TABLE_ROWS:,} of {len(rows):,} rows shown; metrics.jsonl has all."
    return {"kind": "table", "title": title, "columns": columns, "rows": shown, "note": note,
            "cls": cls}
