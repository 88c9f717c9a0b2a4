"""The one launcher: every task gets the same common options and the same checks of them (before
issue 15 detection lacked the --num_shards / --max_rejected_fraction checks), its own options,
and the same refusal of a bad command line (exit 2, one line naming the option)."""

from __future__ import annotations

import pytest

from evalbeam.pipelines.launch.common import UsageError
from evalbeam.pipelines.launch.launcher import build_parser, parse_command
from evalbeam.pipelines.tasks.registry import TASKS, task_of

BASE = ["--groundtruths", "gt.jsonl", "--predictions", "m=m.jsonl", "--output", "out"]


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("extra, message", [
    (["--num_shards", "0"], "--num_shards must be 1 or more"),
    (["--max_rejected_fraction", "1.5"], "--max_rejected_fraction must lie in [0, 1]"),
    (["--predictions", "m=other.jsonl"], "two --predictions are named 'm'"),
    (["--slice", ","], "--slice needs at least one metadata key"),
    (["--no_such_option", "1"], "unknown option(s) --no_such_option"),
    (["--bootstrap", "-1"], "--bootstrap must lie in [0, 10,000]"),
    (["--bootstrap", "10", "--confidence", "1"], "--confidence must lie strictly between 0 and 1"),
    (["--bootstrap", "10", "--bootstrap_seed", "-2"], "--bootstrap_seed must lie in [0, 2^63)"),
    (["--compare_to", "m", "--predictions", "n=n.jsonl"], "--compare_to needs --bootstrap R"),
    (["--bootstrap", "5", "--compare_to", "x", "--predictions", "n=n.jsonl"],
     "--compare_to 'x' is not one of the models (m, n)"),
    (["--bootstrap", "5", "--compare_to", "m"], "--compare_to needs at least two models"),
])
def test_common_checks_are_the_same_for_every_task(task, extra, message):
    with pytest.raises(UsageError) as error:
        parse_command(task_of(task), BASE + extra)
    assert message in str(error.value)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_has_the_common_options_and_its_own(task):
    spec = task_of(task)
    parser = build_parser(spec)
    options = {option for action in parser._actions for option in action.option_strings}
    assert {"--groundtruths", "--predictions", "--output", "--slice", "--num_shards",
            "--max_rejected_fraction", "--overwrite", "--quiet"} <= options
    assert parser.prog == f"evalbeam {task}"
    args, config, models, slices, beam_args = parse_command(spec, BASE + ["--slice", "a,b"])
    assert models == {"m": "m.jsonl"} and slices == [("a", "b")] and beam_args == []
    assert isinstance(spec.options(config, args), dict)
    assert not args.uncertainty.enabled and args.compare_to is None
    args = parse_command(spec, BASE + ["--predictions", "n=n.jsonl", "--bootstrap", "50",
                                       "--confidence", "0.9", "--bootstrap_seed", "7",
                                       "--compare_to", "n"])[0]
    assert (args.uncertainty.replicates, args.uncertainty.confidence, args.uncertainty.seed,
            args.compare_to) == (50, 0.9, 7, "n")


def test_run_returns_2_and_one_line_for_a_bad_command_line(capsys):
    assert task_of("detection").run(BASE + ["--num_shards", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "evalbeam: error: --num_shards must be 1 or more\n"


def test_many_replicates_mean_more_default_shards():
    from evalbeam.pipelines.launch.launcher import default_num_shards

    mib = 1 << 20
    assert default_num_shards(10 * mib) == 2
    assert default_num_shards(640 * mib) == default_num_shards(640 * mib, 100) == 10
    assert default_num_shards(640 * mib, 1000) == 100
    assert default_num_shards(640 * mib, 10_000) == 256


def test_default_shards_are_a_multiple_of_the_local_workers():
    """On the multi-process DirectRunner the default shard count is rounded up to a multiple of
    its workers, so that each worker matches as many shards; other runners keep it."""
    from evalbeam.pipelines.launch.launcher import _local_workers, balanced_shards

    multi = ("--direct_running_mode", "multi_processing")
    assert _local_workers(multi + ("--direct_num_workers", "2")) == 2
    assert _local_workers(multi + ("--direct_num_workers", "3")) == 3
    assert _local_workers(("--direct_num_workers", "2")) == 1          # in-process mode
    assert _local_workers(("--runner", "DataflowRunner", "--direct_num_workers", "2")) == 1
    assert [balanced_shards(n, 2) for n in (2, 5, 6, 255, 256)] == [2, 6, 6, 256, 256]
    assert balanced_shards(5, 3) == 6 and balanced_shards(5, 1) == 5


def test_the_dask_runner_by_its_short_name(monkeypatch):
    """`--runner DaskRunner` is Beam's Dask runner by its module path, whose options are then
    known; without dask installed, a one-line usage error names the extra to install."""
    import sys

    from evalbeam.pipelines.launch.common import DASK_RUNNER, UsageError, split_beam_args, with_runner_paths

    monkeypatch.setitem(sys.modules, "apache_beam.runners.dask.dask_runner", None)
    with pytest.raises(UsageError, match=r"evalbeam\[dask\]"):
        with_runner_paths(["--runner", "DaskRunner"])
    monkeypatch.undo()
    assert with_runner_paths(["--runner=direct", "--x"]) == ["--runner=direct", "--x"]
    pytest.importorskip("distributed")
    assert with_runner_paths(["--runner", "daskrunner"]) == ["--runner", DASK_RUNNER]
    assert split_beam_args(["--runner=DaskRunner", "--dask_client_address", "tcp://127.0.0.1:1"]) == \
        [f"--runner={DASK_RUNNER}", "--dask_client_address", "tcp://127.0.0.1:1"]


def test_a_model_name_is_the_whole_name_never_one_with_a_final_newline():
    from evalbeam.pipelines.launch.common import UsageError, parse_model_spec

    assert parse_model_spec("good=/data/p.jsonl") == ("good", "/data/p.jsonl")
    assert parse_model_spec("/data/model-b.jsonl.gz") == ("model-b", "/data/model-b.jsonl.gz")
    # a NAME=PATH whose NAME cannot be one: said so, with the characters a name may hold
    for spec in ("good\n=/data/p.jsonl", "a<b=/data/p.jsonl", "y<z=/data/p.jsonl", "=/data/p.jsonl"):
        with pytest.raises(UsageError, match="may hold only ASCII letters, digits") as error:
            parse_model_spec(spec)
        assert "write NAME=" not in str(error.value)
    # a "=" after a "/" is part of a path, named after its file
    assert parse_model_spec("/runs/date=2026-11-28/m.jsonl") == ("m", "/runs/date=2026-11-28/m.jsonl")
    for spec in ("/data/p\n.jsonl", "/data/é.jsonl", "good\n", "/data/m<1>.jsonl"):
        with pytest.raises(UsageError, match="may hold only ASCII letters.*write NAME="):
            parse_model_spec(spec)
