"""An --output on an object store (gs://, s3://, azfs://): no folders, only objects named by
prefix. tests/object_store.py stands in for one; what must hold is what holds on a local disk
(test_output_folder.py): the published files and nothing else, the run's temporary objects gone
after it, a killed run's removed by the next, the user's look-alikes left alone, and a failed run
leaving no metrics."""

from __future__ import annotations

import json

import pytest

import object_store
from helpers import run_classification
from test_output_folder import small_dataset

OUT = "fakestore://bucket/evals/nightly"


@pytest.fixture
def store(tmp_path):
    object_store.use(tmp_path / "store")
    yield tmp_path / "store"
    object_store.use(None)


def run(data: dict, out: str, *extra) -> int:
    return run_classification(["--groundtruths", data["groundtruths"], "--predictions",
                               f"m={data['m']}", "--output", out, "--quiet", *extra])


def names_under(prefix: str) -> list[str]:
    return sorted(uri[len(prefix) + 1:] for uri in object_store.objects(prefix + "/"))


def test_a_run_leaves_its_outputs_and_no_temporary_objects(tmp_path, store):
    data = small_dataset(tmp_path)
    assert run(data, str(tmp_path / "local")) == 0
    assert run(data, OUT) == 0
    assert names_under(OUT) == ["metrics.jsonl", "rejected.jsonl", "run.json"]
    found = object_store.objects(OUT + "/")
    assert found[f"{OUT}/metrics.jsonl"] == (tmp_path / "local" / "metrics.jsonl").read_bytes()
    info = json.loads(found[f"{OUT}/run.json"])
    assert info["status"] == "complete"
    assert info["files"] == {n: len(found[f"{OUT}/{n}"]) for n in ("metrics.jsonl", "rejected.jsonl")}


def test_killed_runs_temporary_objects_go_and_the_users_stay(tmp_path, store):
    from apache_beam.io.filesystems import FileSystems

    from evalbeam.transforms.outputs import OutputFolder

    data = small_dataset(tmp_path)
    assert run(data, OUT) == 0
    killed = OutputFolder(OUT).make_temp()                 # as a run makes it, then killed
    with FileSystems.create(f"{killed}/pieces/00001-part.pkl") as out:
        out.write(b"half written")
    users = {f"{OUT}/.evalbeam-tmp-mybackup/data.txt": b"backup",   # named like one, no mark
             f"{OUT}/.evalbeam-tmp-userstuff": b"stuff",
             f"{OUT}/keep.me": b"mine"}
    for uri, blob in users.items():
        with FileSystems.create(uri) as out:
            out.write(blob)
    assert run(data, OUT) == 0
    found = object_store.objects(OUT + "/")
    assert not [uri for uri in found if uri.startswith(killed)]
    assert {uri: found.get(uri) for uri in users} == users
    assert names_under(OUT) == sorted(["metrics.jsonl", "rejected.jsonl", "run.json"]
                                      + [uri[len(OUT) + 1:] for uri in users])


def test_a_failed_run_leaves_no_metrics_and_no_temporary_objects(tmp_path, store, monkeypatch):
    """Publishing fails after metrics.jsonl was moved into place: the run ends failed, and the
    folder holds run.json (failed) and rejected.jsonl, nothing that looks complete."""
    from apache_beam.io.filesystems import FileSystems

    data = small_dataset(tmp_path)
    real = FileSystems.rename

    def rename_then_fail(sources, destinations):
        real(sources, destinations)
        if any(d.endswith("/metrics.jsonl") for d in destinations):
            raise OSError("the store went away")

    monkeypatch.setattr(FileSystems, "rename", staticmethod(rename_then_fail))
    assert run(data, OUT) == 3
    assert names_under(OUT) == ["rejected.jsonl", "run.json"]
    info = json.loads(object_store.objects(OUT + "/")[f"{OUT}/run.json"])
    assert info["status"] == "failed" and "the store went away" in info["error"]
