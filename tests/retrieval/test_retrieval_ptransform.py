"""EvaluateRetrieval, the PTransform on PCollections of row dicts, against the command on files:
the same rows give the same metric records (metrics.jsonl, byte for byte once sorted by
record_sort_key), the same counts and the same rejections, on random qrels and runs (several
seeds, tied scores, graded and negative levels, slices, bad rows, repeated pairs, a query without
judgments, a model without valid rows), on both DirectRunner modes."""

from __future__ import annotations

import json
import random

import apache_beam as beam
import pytest

from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from evalbeam.pipelines.launch.common import local_pipeline
from evalbeam.transforms.kernels.retrieval import RetrievalConfig
from evalbeam.transforms.retrieval import EvaluateRetrieval, record_sort_key

SLICES = [("topic",), ("topic", "hard")]
COUNTERS = ("rows_read", "rows_evaluated", "rows_rejected")
# per seed: command-line options and the same configuration
OPTIONS = {
    0: ([], RetrievalConfig()),
    1: (["--complete", "--relevance_level", "2", "--max_docs", "5"],
        RetrievalConfig(relevance_level=2, max_docs_per_query=5, complete=True)),
    2: (["--k", "1,2,5"], RetrievalConfig(ks=(1, 2, 5))),
}


def make_rows(seed: int) -> dict[str, list[str]]:
    """{source: JSONL lines} of a random qrels and three runs ("bm25", "dense", and "empty",
    whose only row is bad)."""
    rng = random.Random(seed)
    queries = [f"q{i}" for i in range(rng.randint(8, 14))] + ["q-é"]
    qrels, meta = [], {}
    for q in queries:
        meta[q] = {"topic": rng.choice(["a", "b", "c"]), "hard": rng.random() < 0.5}
        no_metadata = rng.random() < 0.2            # a query whose rows carry no metadata at all
        for d in rng.sample(range(30), rng.randint(1, 12)):
            row = {"query_id": q, "doc_id": f"d{d}", "relevance": rng.choice([-1, 0, 0, 1, 1, 2, 3])}
            if not no_metadata and rng.random() < 0.8:   # some rows of a query without metadata
                row["metadata"] = meta[q]
            qrels.append(row)
    rng.shuffle(qrels)
    qrels.append({"query_id": "q1", "doc_id": "bad", "relevance": "high"})            # bad row
    qrels.append({"query_id": "q2", "doc_id": "nan", "relevance": 1,
                  "metadata": {"topic": float("nan")}})                                 # bad slice value
    lines = {"groundtruths": [json.dumps(r) for r in qrels]}
    for model in ("bm25", "dense"):
        run = []
        for q in queries + ["unjudged"]:                                               # no judgments
            if rng.random() < 0.15:
                continue                                                               # unanswered
            for d in rng.sample(range(40), rng.randint(1, 15)):
                run.append({"query_id": q, "doc_id": f"d{d}",
                            "score": rng.choice([0.1, 0.25, 0.5, 0.9, 1.0, 2.0])})   # ties
        run.append(dict(run[0]))                                                       # repeated pair
        run.append({"query_id": "q0", "doc_id": "d1", "score": float("nan")})         # bad row
        rng.shuffle(run)
        lines[model] = [json.dumps(r) for r in run]
    lines["empty"] = [json.dumps({"query_id": "q0", "doc_id": "d1", "score": "high"})]
    return lines


def run_command(tmp_path, lines: dict, options: list[str]) -> tuple[list[str], dict, list[dict]]:
    """(metrics.jsonl lines, run.json counts, rejected rows) of the command on the rows."""
    from evalbeam.pipelines.tasks.retrieval import run

    paths = {name: write_jsonl(tmp_path / "in" / f"{name}.jsonl", rows) for name, rows in lines.items()}
    args = ["--groundtruths", paths["groundtruths"], "--output", tmp_path / "cli", "--quiet",
            "--num_shards", "3", *options]
    for name in sorted(lines):
        if name != "groundtruths":
            args += ["--predictions", f"{name}={paths[name]}"]
    for spec in SLICES:
        args += ["--slice", ",".join(spec)]
    assert run([str(a) for a in args]) == 4     # every row of "empty" is rejected
    metrics = (tmp_path / "cli" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    counts = json.loads((tmp_path / "cli" / "run.json").read_text())["counts"]
    return metrics, counts, read_jsonl(tmp_path / "cli" / "rejected.jsonl")


def run_ptransform(tmp_path, inputs: dict, config: RetrievalConfig, beam_args: list[str]):
    """(records, counts, rejected rows) of EvaluateRetrieval on {source: row dicts}."""
    out = tmp_path / "ptransform"
    out.mkdir(exist_ok=True)

    def save(items, name):
        (out / name).write_text(json.dumps(items), encoding="utf-8")

    with local_pipeline(beam_args) as p:
        pcolls = {name: p | f"Create[{name}]" >> beam.Create(rows) for name, rows in inputs.items()}
        records, rejects, stats, _ = pcolls | EvaluateRetrieval(config, slices=SLICES, num_shards=5,
                                                             batch_size=7, with_diagnostics=True)
        _ = records | "Records" >> beam.combiners.ToList() | "SaveRecords" >> beam.Map(save, "records.json")
        _ = rejects | "Rejects" >> beam.combiners.ToList() | "SaveRejects" >> beam.Map(save, "rejects.json")
        _ = (stats | "Sum" >> beam.CombinePerKey(sum) | "Stats" >> beam.combiners.ToList()
             | "SaveStats" >> beam.Map(lambda pairs: save([[k[0], k[1], n] for k, n in pairs], "stats.json")))
    records = json.loads((out / "records.json").read_text(encoding="utf-8"))
    counts: dict = {}
    for counter, source, n in json.loads((out / "stats.json").read_text()):
        counts.setdefault(source, dict.fromkeys(COUNTERS, 0))[counter] = n
    return records, counts, json.loads((out / "rejects.json").read_text(encoding="utf-8"))


def metrics_lines(records: list[dict]) -> list[str]:
    """The lines of metrics.jsonl for these records (as transforms.io.write_jsonl writes them)."""
    return [json.dumps(r, ensure_ascii=False, allow_nan=False) for r in sorted(records, key=record_sort_key)]


def reasons(rejects: list[dict]) -> list[tuple]:
    """(source, reason) of each rejection; a repeated pair's reason names files and lines in
    the command and rows in the PTransform, so only its kind is compared."""
    return sorted((r["source"], "duplicate" if r["reason"].startswith("duplicate") else r["reason"])
                  for r in rejects)


def check_same(tmp_path, seed: int, beam_args: list[str]) -> None:
    options, config = OPTIONS[seed]
    lines = make_rows(seed)
    expected, counts, rejected = run_command(tmp_path, lines, options)
    inputs = {name: [json.loads(line) for line in rows] for name, rows in lines.items()}
    records, got_counts, got_rejected = run_ptransform(tmp_path, inputs, config, beam_args)
    assert metrics_lines(records) == expected
    assert got_counts == counts
    assert reasons(got_rejected) == reasons(rejected)
    kinds = {r["type"] for r in records}
    assert {"Queries", "Precision", "MAP", "NDCG"} <= kinds
    assert {r["model"] for r in records} == {"bm25", "dense", "empty"}
    assert {json.dumps(r["slice"], sort_keys=True) for r in records} > {"{}"}


@pytest.mark.parametrize("seed", sorted(OPTIONS))
def test_ptransform_gives_the_records_of_the_command(tmp_path, seed):
    check_same(tmp_path, seed, [])


@pytest.mark.multiprocess
def test_ptransform_gives_the_records_of_the_command_multiprocess(tmp_path):
    check_same(tmp_path, 1, MULTIPROCESS)


def test_an_empty_model_pcollection_gives_the_records_of_a_model_without_valid_rows(tmp_path):
    lines = make_rows(3)
    expected, _, _ = run_command(tmp_path, lines, [])
    inputs = {name: [json.loads(line) for line in rows] for name, rows in lines.items()}
    inputs["empty"] = []
    records, _, _ = run_ptransform(tmp_path, inputs, RetrievalConfig(), [])
    assert metrics_lines(records) == expected
    empty = [r for r in records if r["model"] == "empty"]
    assert empty and all(r["value"] == 0 for r in empty)


def test_rows_of_a_query_without_metadata_take_the_values_of_its_rows_that_have_some(tmp_path):
    """A query's slice values come from its rows with a metadata object; rows are checked as
    JSONL lines are (wrong types, a slice value that is not finite, a number out of range, a
    repeated pair: every copy)."""
    qrels = [{"query_id": "q1", "doc_id": "d1", "relevance": 1},
             {"query_id": "q1", "doc_id": "d2", "relevance": 0, "metadata": {"topic": "a"}},
             {"query_id": "q2", "doc_id": "d1", "relevance": 2, "metadata": {"topic": "b"}},
             {"query_id": "q2", "doc_id": "d1", "relevance": 1, "metadata": {"topic": "b"}},
             {"query_id": "q3", "doc_id": "d1", "relevance": True},
             {"query_id": "q3", "doc_id": "d1", "relevance": 1, "metadata": {"topic": float("inf")}},
             {"query_id": "q4", "doc_id": "d1", "relevance": 1, "metadata": {"topic": "c"}}]
    run = [{"query_id": "q1", "doc_id": "d1", "score": 1.0}, {"query_id": "q2", "doc_id": "d1", "score": 1},
           {"query_id": "q4", "doc_id": "d1", "score": 10 ** 400}, {"query_id": "q4", "doc_id": 7, "score": 1.0}]
    records, counts, rejects = run_ptransform(tmp_path, {"groundtruths": qrels, "m": run},
                                              RetrievalConfig(ks=(1,)), [])
    queries = {json.dumps(r["slice"]): r["value"] for r in records if r["type"] == "Queries"}
    # q1 takes "a" from its second row; q2 lost both copies of its judgment
    assert queries == {"{}": 1, '{"topic": "a"}': 1, '{"hard": null, "topic": "a"}': 1}
    assert counts == {"groundtruths": {"rows_read": 7, "rows_rejected": 4, "rows_evaluated": 3},
                      "m": {"rows_read": 4, "rows_rejected": 2, "rows_evaluated": 2}}
    assert sorted(r["reason"] for r in rejects) == sorted([
        "duplicate (query, doc) pair ('q2', 'd1'): 2 rows of groundtruths",
        "duplicate (query, doc) pair ('q2', 'd1'): 2 rows of groundtruths",
        "relevance True is not an integer",
        "metadata 'topic' is inf: a slice value must be a string, a finite number, a boolean or null",
        "score is out of range",
        "doc_id must be a string, got int"])
    assert all(r["file"] == r["source"] and r["row"] is None for r in rejects)


def test_a_row_with_a_lone_surrogate_is_rejected():
    """Beam's coders cannot carry such a string between steps, but a row built in the step before
    (text decoded with errors="surrogateescape") reaches the reader."""
    from evalbeam.transforms.io import TAG_REJECTED, TAG_STATS
    from evalbeam.transforms.retrieval import RetrievalRowsFromDicts

    rows = [{"query_id": "q\ud800", "doc_id": "d1", "relevance": 1},
            {"query_id": "q1", "doc_id": "d1", "relevance": 1, "metadata": {"topic": "\udc80"}},
            {"query_id": "q1", "doc_id": "d2", "relevance": 1}]
    out = list(RetrievalRowsFromDicts(["topic"], 2).process(("groundtruths", rows)))
    rejected = [o.value for o in out if isinstance(o, beam.pvalue.TaggedOutput) and o.tag == TAG_REJECTED]
    stats = [o.value for o in out if isinstance(o, beam.pvalue.TaggedOutput) and o.tag == TAG_STATS]
    pieces = [o for o in out if not isinstance(o, beam.pvalue.TaggedOutput)]
    assert [r["reason"] for r in rejected] == [
        "the value of 'query_id' holds a lone UTF-16 surrogate (an escape such as \\ud800 without its "
        "pair): not valid Unicode text",
        "the value of 'topic' holds a lone UTF-16 surrogate (an escape such as \\ud800 without its "
        "pair): not valid Unicode text"]
    assert stats == [(("rows_read", "groundtruths"), 3), (("rows_rejected", "groundtruths"), 2)]
    [(_, (source, _, columns, row_slices))] = pieces
    assert source == "groundtruths" and columns.doc.to_pylist() == ["d2"] and row_slices == [None]
