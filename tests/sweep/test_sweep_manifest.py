"""Bad sweep manifests: one clear message each (naming the manifest line), exit 2, nothing run
or written. And the expansion of a good one into cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import write_jsonl

GOOD = """
[[dataset]]
name = "alpha"
task = "classification"
groundtruths = "{root}/{{dataset}}/gt.jsonl"

[[model]]
name = "resnet"
predictions = "{root}/{{dataset}}/{{model}}.jsonl"
"""


@pytest.fixture
def root(tmp_path) -> Path:
    for d in ("alpha", "beta"):
        write_jsonl(tmp_path / d / "gt.jsonl", [{"datum_uid": "a", "labels": [{"key": "k", "value": "x"}]}])
        for m in ("resnet", "vit"):
            write_jsonl(tmp_path / d / f"{m}.jsonl",
                        [{"datum_uid": "a", "labels": [{"key": "k", "value": "x", "score": 1.0}]}])
    return tmp_path


def sweep_fails(root: Path, text: str, capsys, validate: bool = False) -> str:
    from evalbeam.pipelines.sweep.command import run

    manifest = root / "sweep.toml"
    manifest.write_text(text)
    out = root / "out"
    argv = (["validate", str(manifest)] if validate else [str(manifest), "--output", str(out)])
    assert run(argv) == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_good_manifest_validates(root, capsys):
    from evalbeam.pipelines.sweep.command import run

    manifest = root / "sweep.toml"
    manifest.write_text(GOOD.format(root=root))
    assert run(["validate", str(manifest)]) == 0
    assert "1 cell(s) over 1 dataset(s) and 1 model(s)" in capsys.readouterr().out


def test_unknown_key_names_its_line(root, capsys):
    text = GOOD.format(root=root).replace('task = "classification"', 'task = "classification"\nslices = ["x"]')
    err = sweep_fails(root, text, capsys)
    assert "[[dataset]] #1 (line 2): unknown key 'slices' at line 5" in err


def test_unknown_top_level_table(root, capsys):
    err = sweep_fails(root, GOOD.format(root=root) + '\n[datasets]\nname = "x"\n', capsys)
    assert "(line 11): unknown key 'datasets'" in err


def test_missing_file(root, capsys):
    (root / "alpha" / "resnet.jsonl").unlink()
    err = sweep_fails(root, GOOD.format(root=root), capsys, validate=True)
    assert "cell alpha/resnet (manifest line 2)" in err and "resnet.jsonl" in err


def test_placeholder_without_value(root, capsys):
    text = GOOD.format(root=root).replace("{model}.jsonl", "{modle}.jsonl")
    err = sweep_fails(root, text, capsys)
    assert "placeholder {modle}" in err and "line 9" in err and "known: {dataset}, {model}, {task}" in err


def test_two_cells_writing_the_same_folder(root, capsys):
    text = GOOD.format(root=root) + f"""
[[dataset]]
name = "ALPHA"
task = "classification"
groundtruths = "{root}/alpha/gt.jsonl"
"""
    err = sweep_fails(root, text, capsys)
    assert "alpha/resnet and ALPHA/resnet would write the same folder" in err


def test_duplicate_names_and_unknown_task(root, capsys):
    text = GOOD.format(root=root) + GOOD.format(root=root).replace('"classification"', '"clasification"')
    err = sweep_fails(root, text, capsys)
    assert "a dataset named 'alpha' is already defined at line 2" in err
    assert "unknown task 'clasification'" in err
    assert "a model named 'resnet' is already defined" in err


def test_unknown_and_reserved_options(root, capsys):
    text = GOOD.format(root=root).replace('task = "classification"',
                                          'task = "classification"\noptions = { score_treshold = 0.5 }')
    err = sweep_fails(root, text, capsys)
    assert "unknown option 'score_treshold'" in err and "cell alpha/resnet" in err
    text = GOOD.format(root=root).replace('task = "classification"',
                                          'task = "classification"\noptions = { output = "x" }')
    assert "set by the sweep" in sweep_fails(root, text, capsys)


ONLY = "may hold only letters, digits, '_', '.' and '-'"
LEADING = "may not start with '.'"


@pytest.mark.parametrize("dataset, model, said", [
    ("..", "..", LEADING), (".", "resnet", LEADING), ("alpha", ".", LEADING),
    ("alpha", ".hidden", LEADING), ("..", "resnet", LEADING), ("a/b", "resnet", ONLY),
    ("alpha", "a\\\\b", ONLY), ("alpha", "c:x", ONLY), ("<x>", "resnet", ONLY),
    ("CON", "resnet", "is a device name on Windows"), ("alpha", "nul.txt", "is a device name on Windows"),
    ("alpha.", "resnet", "may not end with '.'"), ("alpha", "resnet\\n", ONLY)])
def test_names_that_are_not_one_plain_folder_are_refused(root, capsys, dataset, model, said):
    """Dataset and model names are folders of DIR/cells/<dataset>/<model>/: '..' twice once
    wrote a cell's metrics.jsonl and run.json into the folder above --output; names Windows
    cannot create or folds into another (CON, nul.txt, 'alpha.') and a trailing newline (which
    the old pattern's '$' let through) passed validate before."""
    from evalbeam.pipelines.sweep.command import run

    text = f"""
[[dataset]]
name = "{dataset}"
task = "classification"
groundtruths = "{root}/alpha/gt.jsonl"

[[model]]
name = "{model}"
predictions = "{root}/alpha/resnet.jsonl"
"""
    manifest = root / "sweep.toml"
    manifest.write_text(text)
    inner = root / "inner"
    for argv in (["validate", str(manifest)], [str(manifest), "--output", str(inner / "sweep")]):
        assert run(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert said in err, err
        assert not inner.exists()
    assert sorted(p.name for p in root.iterdir()) == ["alpha", "beta", "sweep.toml"]


def test_the_name_rule_on_every_os_and_object_store():
    from evalbeam.pipelines.sweep.manifest import name_problem

    for good in ("alpha", "resnet-50", "v1.2", "a..b", "console", "COM10", "LPT", "nul_x", "CONx.txt",
                 "auxiliary", "_x", "x-"):
        assert name_problem(good) is None, good
    for device in ("CON", "con", "Prn", "AUX", "nul", "NUL.txt", "com1", "COM9", "lpt1.tar.gz", "LPT9",
                   "COM0", "aux.x.y"):
        assert "device name on Windows" in name_problem(device), device
    for bad in ("a<b", "a>b", "a:b", 'a"b', "a|b", "a?b", "a*b", "a b", "a\tb", "a\nb", "a\n",
                "a\x7f", "a\x00", "a/b", "a\\b", "café", "a "):
        assert "may hold only" in name_problem(bad), repr(bad)
    assert "may not end with '.'" in name_problem("alpha.")
    assert "may not start with '.'" in name_problem("..")


@pytest.mark.parametrize("validate", [True, False])
def test_judge_table_is_checked_without_text_cells(root, capsys, validate):
    """[judge] went to text cells only, so in a sweep without one it was never checked:
    bogus_key = 1 passed. Its keys (the text task's --judge_NAME options) and the shape of their
    values are checked whatever the cells, each problem naming its line."""
    from evalbeam.pipelines.sweep.command import run

    good = '[judge]\nurl = "http://127.0.0.1:9/v1"\nrpm = 60\nskip_check = true\n'
    manifest = root / "sweep.toml"
    manifest.write_text(good + GOOD.format(root=root))
    assert run(["validate", str(manifest)]) == 0              # a valid table, no text cell
    bad = '[judge]\nbogus_key = 1\nrpm = "fast"\nskip_check = "yes"\nconcurrency = 2.5\n'
    err = sweep_fails(root, bad + GOOD.format(root=root), capsys, validate=validate)
    assert "[judge] (line 2): unknown key 'bogus_key' (the text task has no option " \
           "--judge_bogus_key); known keys: api_key_env," in err
    assert "[judge] (line 3): rpm takes a number" in err
    assert "[judge] (line 4): skip_check is a switch: write true or false" in err
    assert "[judge] (line 5): concurrency takes a whole number" in err
    assert "4 problem(s)" in err


def test_a_cell_error_names_the_cell_once(root, capsys):
    """An option the task does not have was reported as "cell alpha/resnet (manifest line 2):
    cell alpha/resnet (manifest line 2): unknown option ..."."""
    text = GOOD.format(root=root).replace('task = "classification"',
                                          'task = "classification"\noptions = { score_treshold = 0.5 }')
    err = sweep_fails(root, text, capsys, validate=True)
    line = next(x for x in err.splitlines() if "score_treshold" in x)
    assert line == ("evalbeam: error: cell alpha/resnet (manifest line 2): unknown option "
                    "'score_treshold' for this task (see evalbeam <task> --help; write "
                    "--some_option as some_option)")


def test_foreign_files_in_a_cell_folder_say_what_the_sweep_accepts(root, capsys):
    """A cell folder holding a file evalbeam did not write was refused with "pass --overwrite",
    an option the sweep refuses; --force does not replace such a file either."""
    from evalbeam.pipelines.sweep.command import run

    manifest = root / "sweep.toml"
    manifest.write_text(GOOD.format(root=root))
    cell = root / "out" / "cells" / "alpha" / "resnet"
    cell.mkdir(parents=True)
    (cell / "metrics.jsonl").write_text("mine\n")
    for extra in ([], ["--force"]):
        assert run([str(manifest), "--output", str(root / "out"), *extra]) == 2
        err = capsys.readouterr().err
        assert "--overwrite" not in err and "Traceback" not in err
        assert (f"cell alpha/resnet (manifest line 2): the cell's folder {cell} holds metrics.jsonl, "
                "which evalbeam did not write") in err
        assert "not even with --force: move it away, or give the sweep another --output folder" in err
        assert (cell / "metrics.jsonl").read_text() == "mine\n"
        assert sorted(p.name for p in (root / "out").rglob("*")) == ["alpha", "cells", "metrics.jsonl",
                                                                     "resnet"]


def test_bad_option_value_is_the_tasks_message(root, capsys):
    text = GOOD.format(root=root).replace('task = "classification"',
                                          'task = "classification"\noptions = { score_thresholds = [2.0] }')
    err = sweep_fails(root, text, capsys)
    assert "--score_thresholds must lie in [0, 1]" in err


def test_not_toml(root, capsys):
    err = sweep_fails(root, "[[dataset]\nname = ", capsys)
    assert "not valid TOML" in err and "line 1" in err


def test_missing_manifest(tmp_path, capsys):
    from evalbeam.pipelines.sweep.command import run

    assert run([str(tmp_path / "nope.toml"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "the sweep manifest" in err and "no such file" in err


def test_foreign_leaderboard_is_refused(root, capsys):
    from evalbeam.pipelines.sweep.command import run

    manifest = root / "sweep.toml"
    manifest.write_text(GOOD.format(root=root))
    (root / "out").mkdir()
    (root / "out" / "leaderboard.csv").write_text("mine\n")
    assert run([str(manifest), "--output", str(root / "out")]) == 2
    assert "did not write" in capsys.readouterr().err
    assert (root / "out" / "leaderboard.csv").read_text() == "mine\n"


def test_expansion(root):
    from evalbeam.pipelines.sweep.manifest import load

    text = f"""
[[dataset]]
name = "alpha"
task = "classification"
groundtruths = "{root}/{{dataset}}/gt.jsonl"
options = {{ slice = ["region", ["region", "site"]], hardmax = false }}

[[dataset]]
name = "beta"
task = "classification"
groundtruths = "{root}/{{dataset}}/gt.jsonl"
models = ["vit"]

[[model]]
name = "resnet"
predictions = {{ alpha = "{root}/alpha/resnet.jsonl" }}

[[model]]
name = "vit"
predictions = "{root}/{{dataset}}/vit.jsonl"
options = {{ max_examples = 0 }}

[[cell]]
dataset = "alpha"
model = "vit"
options = {{ max_examples = 2 }}
"""
    path = root / "sweep.toml"
    path.write_text(text)
    manifest = load(str(path))
    assert [(c.id, c.predictions.split("/")[-1]) for c in manifest.cells] == [
        ("alpha/resnet", "resnet.jsonl"), ("alpha/vit", "vit.jsonl"), ("beta/vit", "vit.jsonl")]
    options = {c.id: c.options for c in manifest.cells}
    assert options["alpha/vit"]["max_examples"] == 2 and options["beta/vit"]["max_examples"] == 0
    from evalbeam.pipelines.launch.launcher import build_parser
    from evalbeam.pipelines.tasks.registry import task_of
    from evalbeam.pipelines.sweep.manifest import option_args

    args = option_args(options["alpha/resnet"], build_parser(task_of("classification")), "here")
    assert args == ["--slice", "region", "--slice", "region,site", "--no_hardmax"]


def test_secrets_stay_out_of_messages_and_sweep_json(root, capsys):
    from evalbeam.pipelines.sweep.folder import _safe_judge, _safe_url

    text = GOOD.format(root=root).replace('task = "classification"', 'task = "text"')
    text = '[judge]\nurl = "http://127.0.0.1:9/v1"\napi_key = "sk-supersecret"\n' + text
    err = sweep_fails(root, text, capsys)
    assert "sk-supersecret" not in err
    assert "[judge] (line 3): unknown key 'api_key'" in err and "api_key_env" in err
    assert _safe_url("https://bob:hunter2@api.example.com:8443/v1?key=abc#x") == "https://api.example.com:8443/v1"
    safe = _safe_judge({"url": "https://u:hunter2@h/v1", "api_key_env": "MY_KEY", "token": "t0k"})
    assert safe == {"url": "https://h/v1", "api_key_env": "MY_KEY", "token": "***"}
