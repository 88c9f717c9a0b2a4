"""`evalbeam retrieval` end to end: trec_eval's reference outputs through the CLI (default, -c,
graded -l2), per-query output, JSONL inputs equal to TREC files, bad lines, slices, determinism."""

from __future__ import annotations

import json

import pytest

from helpers import MULTIPROCESS, read_jsonl, write_jsonl

def run_retrieval(*args) -> int:
    from evalbeam.pipelines.tasks.retrieval import run

    return run([str(a) for a in args])


def trec_values(path) -> dict:
    """{(measure, query or "all"): value} of a trec_eval output file."""
    out = {}
    for line in path.read_text().splitlines():
        measure, query, value = line.split()
        try:
            out[(measure, query)] = float(value)
        except ValueError:      # relstring and run ids are not numbers
            pass
    return out


def trec_name(record: dict) -> str | None:
    kind, k = record["type"], record["parameters"].get("k")
    single = {"MAP": "map", "MRR": "recip_rank", "RPrecision": "Rprec", "NDCG": "ndcg"}
    if k is None:
        return single.get(kind)
    family = {"Precision": "P", "Recall": "recall", "Hit": "success", "MAP": "map_cut",
              "NDCG": "ndcg_cut"}.get(kind)
    return f"{family}_{k}" if family else None


@pytest.mark.parametrize("case", ["aq", "aqc", "aql"])
def test_cli_reproduces_trec_eval(tmp_path, shared_reference, case):
    base = shared_reference / "retrieval" / "trec_eval"
    qrels, run, extra = {"aq": ("qrels.test", "results.test", []),
                         "aqc": ("qrels.test", "results.trunc", ["--complete"]),
                         "aql": ("qrels.rel_level", "results.test", ["--relevance_level", "2"])}[case]
    assert run_retrieval("--groundtruths", base / qrels, "--predictions", f"run={base / run}",
                         "--output", tmp_path / "out", "--quiet", "--per_query",
                         "--k", "5,10,15,20,30,100,200,500,1000", *extra) == 0
    expected = trec_values(base / f"out.test.{case}")
    checked = 0
    for record in read_jsonl(tmp_path / "out" / "metrics.jsonl"):
        name = trec_name(record)
        if name and (name, "all") in expected:
            assert record["value"] == pytest.approx(expected[(name, "all")], abs=5e-5), name
            checked += 1
    assert checked >= 20
    for row in read_jsonl(tmp_path / "out" / "per_query.jsonl"):
        for name, value in row["measures"].items():
            if (name, row["query_id"]) in expected:
                assert value == pytest.approx(expected[(name, row["query_id"])], abs=5e-5), (name, row["query_id"])


def test_jsonl_inputs_equal_trec_files_and_shards_do_not_matter(tmp_path, shared_reference):
    base = shared_reference / "retrieval" / "trec_eval"
    qrels = [dict(zip(("query_id", "_", "doc_id", "relevance"), line.split()))
             for line in (base / "qrels.test").read_text().splitlines() if line.strip()]
    for row in qrels:
        row.pop("_")
        row["relevance"] = int(row["relevance"])
        row["metadata"] = {"odd": int(row["query_id"]) % 2 == 1}
    run = [{"query_id": f[0], "doc_id": f[2], "score": float(f[4])}
           for f in (line.split() for line in (base / "results.test").read_text().splitlines() if line.strip())]
    write_jsonl(tmp_path / "qrels.jsonl", qrels)
    write_jsonl(tmp_path / "run.jsonl", run[::-1])
    outputs = []
    for name, files, extra in (("trec", (base / "qrels.test", base / "results.test"), ["--num_shards", "1"]),
                               ("jsonl", (tmp_path / "qrels.jsonl", tmp_path / "run.jsonl"), ["--num_shards", "5"]),
                               ("multi", (tmp_path / "qrels.jsonl", tmp_path / "run.jsonl"),
                                ["--num_shards", "3", *MULTIPROCESS])):
        assert run_retrieval("--groundtruths", files[0], "--predictions", f"run={files[1]}",
                             "--output", tmp_path / name, "--quiet", *extra) == 0
        outputs.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    # slices from the JSONL qrels' metadata: queries 301 and 303 are odd
    assert run_retrieval("--groundtruths", tmp_path / "qrels.jsonl", "--predictions", f"run={tmp_path / 'run.jsonl'}",
                         "--output", tmp_path / "sliced", "--quiet", "--slice", "odd") == 0
    queries = {json.dumps(r["slice"]): r["value"] for r in read_jsonl(tmp_path / "sliced" / "metrics.jsonl")
               if r["type"] == "Queries"}
    assert queries == {"{}": 3, '{"odd": true}': 2, '{"odd": false}': 1}
    assert run_retrieval("--groundtruths", base / "qrels.test", "--predictions", f"run={base / 'results.test'}",
                         "--output", tmp_path / "bad", "--slice", "odd") == 2   # TREC qrels have no metadata


def test_bad_lines_are_rejected_with_their_line(tmp_path):
    (tmp_path / "qrels").write_text("q1 0 d1 1\nq1 0 d2 x\nq1 0 d3\nq1 0 d1 2\nq2 0 d9 1\n")
    (tmp_path / "run").write_text("q1 Q0 d1 1 0.9 t\nq1 Q0 d2 2 nan t\nq1 Q0 d4 3 0.5 t\nq2 Q0 d9 1 1.0 t\n"
                                  "q3 Q0 d1 1 2.0 t\nshort line\n")
    assert run_retrieval("--groundtruths", tmp_path / "qrels", "--predictions", f"m={tmp_path / 'run'}",
                         "--output", tmp_path / "out", "--quiet", "--per_query") == 1
    found = {(r["source"], r["line"]) for r in read_jsonl(tmp_path / "out" / "rejected.jsonl")}
    # qrels: a bad level (2), 3 fields (3), q1/d1 twice (1 and 4); run: a NaN score (2), 2 fields (6)
    assert found == {("groundtruths", 1), ("groundtruths", 2), ("groundtruths", 3), ("groundtruths", 4),
                     ("m", 2), ("m", 6)}
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"] == {"groundtruths": {"rows_read": 5, "rows_evaluated": 1, "rows_rejected": 4},
                              "m": {"rows_read": 6, "rows_evaluated": 4, "rows_rejected": 2}}
    per_query = {r["query_id"]: r["measures"] for r in read_jsonl(tmp_path / "out" / "per_query.jsonl")}
    assert set(per_query) == {"q2"}                       # q1 lost its judgments, q3 has none
    assert per_query["q2"]["map"] == 1.0 and per_query["q2"]["recip_rank"] == 1.0
