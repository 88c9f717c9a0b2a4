"""Fixtures every test folder shares; plain helpers are in helpers.py (importable from any test
folder: this file's folder, tests/, is on sys.path while the tests run)."""

from __future__ import annotations

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


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in SLOW_FILES)  # stable: order kept otherwise
