"""The headless-browser harness (tests/browser.py) on small pages: it must see what a report's
tests need to see (console, exceptions, dialogs, network use, a painted page, DOM facts), and
stop by itself with a clear error when a page never gets ready."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from browser import (BrowserTimeout, Dialog, SKIP_REASON, find_chromium, load_page,
                     png_is_blank, requires_chromium)


def page(tmp_path: Path, body: str, head: str = "", name: str = "page.html") -> Path:
    path = tmp_path / name
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'>{head}</head>"
                    f"<body>{body}</body></html>", encoding="utf-8")
    return path


# --- no browser needed ------------------------------------------------------------------------


def test_find_chromium_honours_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("EVALBEAM_CHROMIUM", str(tmp_path / "no-such-browser"))
    assert find_chromium() is None
    fake = tmp_path / "my-chrome"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("EVALBEAM_CHROMIUM", str(fake))
    assert find_chromium() == str(fake)


def test_skip_marker_gives_the_install_hint():
    assert requires_chromium.kwargs["reason"] == SKIP_REASON
    assert "apt-get install -y chromium" in SKIP_REASON


def test_png_is_blank(tmp_path):
    Image.new("RGB", (40, 30), "white").save(tmp_path / "blank.png")
    drawn = Image.new("RGB", (40, 30), "white")
    drawn.putpixel((5, 5), (0, 0, 0))
    drawn.save(tmp_path / "drawn.png")
    assert png_is_blank(tmp_path / "blank.png")
    assert not png_is_blank(tmp_path / "drawn.png")


# --- in chromium ------------------------------------------------------------------------------


@requires_chromium
def test_console_messages_are_reported(tmp_path):
    result = load_page(page(tmp_path, "<script>console.log('hello', 42); "
                                      "console.error('it broke')</script>"))
    assert ("log", "hello 42") in [(m.type, m.text) for m in result.console]
    assert result.console_texts("error") == ["it broke"]
    assert result.errors == ["console.error: it broke"]
    assert result.load_ms is not None and result.ready_ms >= result.load_ms
    assert not result.requests and not result.dialogs and not result.exceptions


@requires_chromium
def test_uncaught_exception_is_reported(tmp_path):
    result = load_page(page(tmp_path, "<p>before</p><script>throw new Error('boom')</script>"
                                      "<p id=after>after</p>"),
                       probes={"after": "document.getElementById('after') !== null"})
    assert len(result.exceptions) == 1
    assert "Error: boom" in result.exceptions[0]
    assert result.probes["after"] is True  # the page goes on after a failing script


@requires_chromium
def test_alert_in_a_script_is_reported_and_the_page_still_loads(tmp_path):
    result = load_page(page(tmp_path, "<script>alert(1)</script><p id=p>still here</p>"),
                       probes={"text": "document.getElementById('p').textContent"})
    assert result.dialogs == [Dialog("alert", "1")]
    assert result.load_ms is not None
    assert result.probes["text"] == "still here"


@requires_chromium
def test_alert_from_an_onerror_attribute_is_reported(tmp_path):
    result = load_page(page(tmp_path, "<img src=x onerror=alert(1)>"))
    assert result.dialogs == [Dialog("alert", "1")]
    assert any("ERR_FILE_NOT_FOUND" in entry.text for entry in result.log_errors)
    assert not result.requests  # a missing local file is not network use


@requires_chromium
def test_network_use_is_reported_and_blocked(tmp_path):
    result = load_page(page(tmp_path, "<p>x</p>",
                            head="<script src='https://example.invalid/x.js'></script>"))
    assert result.requests == ["https://example.invalid/x.js"]
    failed = [e for e in result.log_errors if e.url == "https://example.invalid/x.js"]
    assert failed and failed[0].source == "network"
    assert any("example.invalid" in error for error in result.errors)


@requires_chromium
def test_screenshots_full_page_and_viewport(tmp_path):
    tall = page(tmp_path, "<h1>Report</h1><table><tr><td>1</td></tr></table>"
                          "<div style='height:2000px;background:#36c'></div>",
                head="<style>body{margin:0;background:#fff}</style>")
    full = load_page(tall, width=800, height=600, screenshot=tmp_path / "full.png")
    view = load_page(tall, width=800, height=600, screenshot=tmp_path / "view.png",
                     full_page=False)
    assert full.screenshot == tmp_path / "full.png" and not png_is_blank(full.screenshot)
    assert not png_is_blank(view.screenshot)
    with Image.open(full.screenshot) as image:
        assert image.width == 800 and image.height > 2000
    with Image.open(view.screenshot) as image:
        assert image.size == (800, 600)


@requires_chromium
def test_probes_and_dom_after_wait_js(tmp_path):
    script = """<script>setTimeout(() => {
        for (const n of [1, 2]) document.body.insertAdjacentHTML('beforeend', '<table><tr><td>'
            + n + '</td></tr></table>');
        window.reportReady = true;
    }, 150)</script>"""
    result = load_page(page(tmp_path, script), wait_js="window.reportReady",
                       probes={"tables": "document.querySelectorAll('table').length",
                               "cells": "[...document.querySelectorAll('td')].map(c => c.textContent)",
                               "title": "Promise.resolve(document.title || null)"})
    assert result.probes == {"tables": 2, "cells": ["1", "2"], "title": None}
    assert result.dom.count("<tbody>") == 2  # the parser adds tbody: live DOM, not the source
    assert result.ready_ms >= 150


@requires_chromium
def test_a_page_that_never_gets_ready_times_out_and_cleans_up(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the profile is made
    path = page(tmp_path, "<script>console.error('not ready')</script>")
    with pytest.raises(BrowserTimeout) as caught:
        load_page(path, wait_js="window.neverReady", timeout=4)
    message = str(caught.value)
    assert "page.html" in message and "window.neverReady" in message
    assert "console.error: not ready" in message
    assert list(scratch.iterdir()) == []  # the profile is removed
    assert not _processes_mentioning(str(scratch))  # and the browser is gone


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found
