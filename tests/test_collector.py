"""transforms/collector.py: the young-generation threshold is raised, never lowered, and the
older thresholds are kept; evalbeam's DoFns set it in setup (so a worker process of any runner
has it) and the CLI before its pipeline runs."""

from __future__ import annotations

import gc

import pytest

from evalbeam.transforms.collector import YOUNG, tune


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_tune_raises_the_young_threshold_only(thresholds):
    gc.set_threshold(700, 7, 9)
    tune()
    assert gc.get_threshold() == (YOUNG, 7, 9)
    gc.set_threshold(YOUNG * 4, 3, 4)      # a user's higher setting stays
    tune()
    assert gc.get_threshold() == (YOUNG * 4, 3, 4)


def test_dofn_setup_and_cli_tune_their_process(thresholds, capsys):
    from evalbeam.transforms.io import ProgressDoFn

    from helpers import run_cli_here

    gc.set_threshold(700, 10, 10)
    ProgressDoFn(True, 0.0).setup()
    assert gc.get_threshold() == (YOUNG, 10, 10)
    gc.set_threshold(700, 10, 10)
    run_cli_here(["classification", "--help"], capsys)
    assert gc.get_threshold() == (YOUNG, 10, 10)
