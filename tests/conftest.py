"""Fixtures every test folder shares; plain helpers are in helpers.py (importable from any test
folder: this file's folder, tests/, is on sys.path while the tests run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SHARED


@pytest.fixture
def shared_reference():
    """../shared/reference, or skip: the conformance data lives beside the project, not in it."""
    path = SHARED / "reference"
    if not path.is_dir():
        pytest.skip(f"{path} is absent (it ships beside the project in CI, not in a user's clone)")
    return path


# Files that each keep one worker busy for minutes (clusters started, every golden case run as
# a subprocess): collected first, so that under `--dist loadfile` they start at once instead of
# leaving one worker alone with them at the end of the run.
SLOW_FILES = ("test_portable.py", "test_dask.py", "test_golden.py")


def pytest_configure(config):
    """Compile evalbeam's modules once, in the controlling process, before any test starts a
    process. Where PYTHONDONTWRITEBYTECODE is set (as on the machines CI runs on), Python never
    caches bytecode, so every evalbeam subprocess and Beam worker the tests start would compile
    the sources again: ~0.6 s of each process's ~2.6 s start-up. Stale files are safe: Python
    checks each cached file against its source's time and size."""
    import compileall

    if hasattr(config, "workerinput"):      # an xdist worker: the controller did it
        return
    root = Path(__file__).resolve().parents[1]
    for package in ("pipelines", "transforms", "schemas"):
        compileall.compile_dir(str(root / package), quiet=2)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in SLOW_FILES)  # stable: order kept otherwise
