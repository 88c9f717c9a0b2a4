"""An --output on an object store (gs://, s3://, azfs://): no folders, only objects named by
prefix. tests/object_store.py stands in for one; what must hold is what holds on a local disk
(test_output_folder.py): the published files and nothing else, the run's temporary objects gone
after it, a killed run's removed by the next, the user's look-alikes left alone, and a failed run
leaving no metrics. Inputs on the store too (row files, TREC files in byte spans, mask files named
relative to their row file), the judge journal kept there, and a sweep that resumes: each gives
the bytes a local run gives. In-process runs only: the stand-in scheme is known only to the
process that imported it."""

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


# ----------------------------------------------------------------------------- inputs, too

def upload(local, uri: str) -> str:
    from apache_beam.io.filesystems import FileSystems

    with open(local, "rb") as f, FileSystems.create(uri) as out:
        out.write(f.read())
    return uri


def stored(uri: str) -> bytes:
    return object_store.objects(uri)[uri]


def test_retrieval_in_spans_from_the_store_with_per_query(tmp_path, store):
    """TREC files on the store read in byte spans of 16 bytes; per_query.jsonl is published and a
    later run without --per_query removes it."""
    from evalbeam.pipelines.tasks.retrieval import run as retrieval

    (tmp_path / "qrels.txt").write_text("q1 0 a 1\nq1 0 b 0\nq2 0 c 1\nq3 0 d 2\n")
    (tmp_path / "run.txt").write_text("q1 Q0 a 1 0.9 r\nq1 Q0 b 2 0.5 r\nq2 Q0 c 1 0.7 r\n"
                                      "q2 Q0 d 2 0.6 r\nq3 Q0 x 1 0.8 r\n")
    qrels = upload(tmp_path / "qrels.txt", "fakestore://bucket/in/qrels.txt")
    run_file = upload(tmp_path / "run.txt", "fakestore://bucket/in/run.txt")

    def args(qrels, run_file, out, *extra):
        return [str(a) for a in ["--groundtruths", qrels, "--predictions", f"r={run_file}",
                                 "--output", out, "--quiet", "--input_split_bytes", "16", *extra]]

    assert retrieval(args(tmp_path / "qrels.txt", tmp_path / "run.txt", tmp_path / "local",
                          "--per_query")) == 0
    assert retrieval(args(qrels, run_file, OUT, "--per_query")) == 0
    for name in ("metrics.jsonl", "per_query.jsonl"):
        assert stored(f"{OUT}/{name}") == (tmp_path / "local" / name).read_bytes()
    assert retrieval(args(qrels, run_file, OUT)) == 0
    assert names_under(OUT) == ["metrics.jsonl", "rejected.jsonl", "run.json"]


def test_segmentation_masks_relative_to_a_row_file_on_the_store(tmp_path, store):
    import io

    import numpy as np

    from evalbeam.pipelines.tasks.segmentation import run as segmentation
    from helpers import write_jsonl

    rng = np.random.default_rng(7)
    rows = {"gt": [], "pd": []}
    for i in range(4):
        truth = rng.integers(0, 3, (9, 7)).astype(np.uint8)
        guess = np.where(rng.random(truth.shape) < 0.3, 1, truth).astype(np.uint8)
        for kind, labels in (("gt", truth), ("pd", guess)):
            name = f"maps/{kind}{i}.npy"
            blob = io.BytesIO()
            np.save(blob, labels)
            (tmp_path / "maps").mkdir(exist_ok=True)
            (tmp_path / name).write_bytes(blob.getvalue())
            upload(tmp_path / name, f"fakestore://bucket/seg/{name}")
            rows[kind].append({"datum_uid": f"d{i}", "label_map_uri": name})
    local = {k: write_jsonl(tmp_path / f"{k}.jsonl", v) for k, v in rows.items()}
    remote = {k: upload(path, f"fakestore://bucket/seg/{k}.jsonl") for k, path in local.items()}
    for files, out in ((local, tmp_path / "local"), (remote, OUT)):
        assert segmentation([str(a) for a in ["--groundtruths", files["gt"], "--predictions",
                                              f"m={files['pd']}", "--label_names", "a,b,c",
                                              "--output", out, "--quiet"]]) == 0
    assert stored(f"{OUT}/metrics.jsonl") == (tmp_path / "local" / "metrics.jsonl").read_bytes()


def test_the_judge_journal_on_the_store_serves_a_rerun_and_holds_no_key(tmp_path, store,
                                                                        monkeypatch):
    from evalbeam.pipelines.runners.judge_server import StandInServer
    from evalbeam.pipelines.demo.synthetic_rag import write_rag_dataset
    from evalbeam.pipelines.tasks.text import run as text

    secret = "sk-object-store-test-0123456789"
    monkeypatch.setenv("EVALBEAM_STORE_TEST_KEY", secret)
    data = write_rag_dataset(str(tmp_path / "rag"), 6, seed=2, models=("alpha",))
    gt = upload(data["groundtruths"], "fakestore://bucket/in/rag.jsonl")
    alpha = upload(data["alpha"], "fakestore://bucket/in/alpha.jsonl")
    with StandInServer() as server:
        args = [str(a) for a in ["--groundtruths", gt, "--predictions", f"alpha={alpha}",
                                 "--metrics", "Faithfulness,AnswerRelevance", "--output", OUT,
                                 "--quiet", "--judge_url", server.url, "--judge_api_key_env",
                                 "EVALBEAM_STORE_TEST_KEY", "--judge_rpm", "1000000"]]
        assert text(args) == 0
        first, sent = stored(f"{OUT}/metrics.jsonl"), server.stats()["requests"]
        assert sent > 0
        assert text(args) == 0                          # every answer from the journal
        assert server.stats()["requests"] == sent
    assert stored(f"{OUT}/metrics.jsonl") == first
    assert object_store.objects(f"{OUT}/judge-journal/")
    assert not [uri for uri, blob in object_store.objects().items() if secret.encode() in blob]
    assert not [n for n in names_under(OUT) if n.startswith(".evalbeam-tmp")]


def test_a_sweep_into_the_store_resumes_and_leaves_no_temporary_objects(tmp_path, store):
    from evalbeam.pipelines.cli import main

    data = small_dataset(tmp_path)
    gt = upload(data["groundtruths"], "fakestore://bucket/in/gt.jsonl")
    m = upload(data["m"], "fakestore://bucket/in/m.jsonl")
    manifest = tmp_path / "sweep.toml"
    manifest.write_text(f'[[dataset]]\nname = "d"\ntask = "classification"\ngroundtruths = "{gt}"\n\n'
                        f'[[model]]\nname = "m"\npredictions = "{m}"\n\n'
                        f'[[model]]\nname = "n"\npredictions = "{m}"\n')

    def sweep() -> int:
        try:
            main(["sweep", str(manifest), "--output", OUT, "--quiet"])
        except SystemExit as stop:
            return stop.code
        return 0

    assert sweep() == 0
    first = object_store.objects(OUT + "/")
    assert sweep() == 0                                 # both cells skipped, nothing rewritten
    again = json.loads(stored(f"{OUT}/sweep.json"))
    assert {c["ran"] for c in again["cells"]} == {False}
    assert {uri: blob for uri, blob in object_store.objects(OUT + "/").items()
            if "/cells/" in uri} == {uri: blob for uri, blob in first.items() if "/cells/" in uri}
    assert not [uri for uri in first if ".evalbeam-tmp" in uri]
