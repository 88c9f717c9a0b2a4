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


def test_a_coco_parse_leaves_the_collector_as_it_found_it():
    """schemas.coco_rows parses with the collector off (a parse makes no cycles) and restores
    it, after a broken document too; a collector someone else turned off stays off."""
    from evalbeam.schemas.coco_rows import coco_document

    assert gc.isenabled()
    value, problem = coco_document(b'{"images": [], "annotations": [], "categories": []}')
    assert problem is None and value["images"] == [] and gc.isenabled()
    value, problem = coco_document(b'{"images": [')
    assert value is None and "cut short" in problem and gc.isenabled()
    gc.disable()
    try:
        coco_document(b"[]")
        assert not gc.isenabled()
    finally:
        gc.enable()
