"""Helpers the tests share: paths, the multi-process runner's options, writing and reading
JSONL, running the CLI in-process or as a subprocess. (Fixtures are in conftest.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MULTIPROCESS = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]


def write_jsonl(path, rows) -> str:
    """Write rows (dicts, or raw strings written as they are) one per line; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def run_classification(args: list[str]) -> int:
    """Run `evalbeam classification ARGS` in this process; returns the exit code."""
    from evalbeam.pipelines.tasks.classification import run

    return run([str(a) for a in args])


def run_cli_here(args: list[str], capsys) -> subprocess.CompletedProcess:
    """`evalbeam ARGS` in this process, for runs that stop before any pipeline (usage and input
    errors): the exit code, stdout and stderr as run_cli_subprocess gives them, without a fresh
    interpreter's start-up. An uncaught exception fails the test, as a traceback would."""
    import logging

    from evalbeam.pipelines.cli import main

    # the CLI quietens logging for its process; later tests in this one must not inherit that
    loggers = [logging.getLogger(), logging.getLogger("apache_beam")]
    levels = [logger.level for logger in loggers]
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def run_cli_subprocess(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m evalbeam.pipelines.cli ARGS` in a fresh interpreter (to see stderr as a user does)."""
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "evalbeam.pipelines.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))


def page_problems(html: str) -> tuple[list[tuple[str, str]], list[str]]:
    """((class, text) of each item of a report page's Problems list, <ul class="problems">;
    the name of every element of the page), read as a browser builds its DOM: entities decoded,
    so a message that held "<img ...>" is text here, and an element only if it was not escaped."""
    from html.parser import HTMLParser

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.items, self.tags, self.inside = [], [], False

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag == "ul" and "problems" in (dict(attrs).get("class") or "").split():
                self.inside = True
            elif tag == "li" and self.inside:
                self.items.append([dict(attrs).get("class") or "", ""])

        def handle_endtag(self, tag):
            if tag == "ul":
                self.inside = False

        def handle_data(self, data):
            if self.inside and self.items:
                self.items[-1][1] += data

    page = Page()
    page.feed(html)
    page.close()
    return [tuple(item) for item in page.items], page.tags
