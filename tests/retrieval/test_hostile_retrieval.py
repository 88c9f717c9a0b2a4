"""Retrieval under hostile input (issue 14): repeated (query, doc) pairs however the input is split,
truncated compressed files, rows that are too deep, hold a lone surrogate or a non-finite slice
value, runs that the qrels do not judge, and files of another task."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import evalbeam.schemas.retrieval_rows as retrieval_rows
from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from evalbeam.schemas.retrieval_rows import read_qrels, read_run


def run_retrieval(*args) -> int:
    from evalbeam.pipelines.tasks.retrieval import run

    return run([str(a) for a in args])


# ---------------------------------------------------------------------------------------------
# Repeated (query, doc) pairs: the same rejects and the same numbers for any split

DOCS = [f"d{i:02d}" for i in range(30)]
# evalbeam record (type, k) -> trec_eval measure
MEASURES = {("MAP", None): "map", ("MRR", None): "recip_rank", ("Precision", 10): "P_10",
            ("Recall", 10): "recall_10", ("NDCG", None): "ndcg", ("NDCG", 10): "ndcg_cut_10",
            ("RPrecision", None): "Rprec"}
PYTREC_MEASURES = {"map", "recip_rank", "P.10", "recall.10", "ndcg", "ndcg_cut.10", "Rprec"}


def duplicate_case():
    """(qrels, run, copies): the input without its repeated pairs as {qid: {doc: value}}, and the
    repeated rows [(source, query, doc, value)]. Scores have ties; copies of one pair differ in
    value (a doc judged twice differently, retrieved with different scores)."""
    rng = np.random.default_rng(14)
    qrels, run = {}, {}
    for q in range(6):
        qid = f"q{q}"
        judged = rng.choice(len(DOCS), 12, replace=False)
        qrels[qid] = {DOCS[j]: int(v) for j, v in zip(judged, rng.integers(0, 3, judged.size))}
        retrieved = rng.choice(len(DOCS), 15, replace=False)
        run[qid] = {DOCS[j]: float(s) for j, s in zip(retrieved, np.round(rng.normal(size=15), 1))}
    # Repeated pairs, each ranked first or relevant if a copy were kept, so that keeping any copy
    # would change the numbers. dup-a: judged twice and retrieved twice; dup-b: judged once
    # (kept) and retrieved three times; dup-c: judged twice, retrieved once (kept, unjudged).
    copies = [("qrels", "q1", "dup-a", 2), ("qrels", "q1", "dup-a", 0),
              ("run", "q1", "dup-a", 9.0), ("run", "q1", "dup-a", 8.0),
              ("run", "q2", "dup-b", 7.0), ("run", "q2", "dup-b", 0.5), ("run", "q2", "dup-b", 7.0),
              ("qrels", "q3", "dup-c", 1), ("qrels", "q3", "dup-c", 2)]
    qrels["q2"]["dup-b"] = 2
    run["q3"]["dup-c"] = 5.0
    return qrels, run, copies


def trec_line(source: str, query: str, doc: str, value) -> str:
    return f"{query} 0 {doc} {value}" if source == "qrels" else f"{query} Q0 {doc} 1 {value} t"


def json_line(source: str, query: str, doc: str, value) -> str:
    key = "relevance" if source == "qrels" else "score"
    return json.dumps({"query_id": query, "doc_id": doc, key: value})


def write_split(folder: Path, source: str, rows: list, copies: list, names: list[str]) -> None:
    """rows spread round-robin over the files `names` (a .jsonl name gets JSONL lines, others
    TREC lines); the i-th copy of a pair goes to file i % len(names), so copies of one pair
    sit in different files (and formats), or far apart in one file."""
    lines = {name: [] for name in names}
    for i, (query, doc, value) in enumerate(rows):
        name = names[i % len(names)]
        lines[name].append((json_line if name.endswith(".jsonl") else trec_line)(source, query, doc, value))
    seen: dict = {}
    for kind, query, doc, value in copies:
        if kind != source:
            continue
        i = seen[(query, doc)] = seen.get((query, doc), -1) + 1
        name = names[i % len(names)]
        at = len(lines[name]) * (i + 1) // 4   # far apart, between other rows
        lines[name].insert(at, (json_line if name.endswith(".jsonl") else trec_line)(source, query, doc, value))
    folder.mkdir(parents=True)
    for name, text in lines.items():
        (folder / name).write_text("\n".join(text) + "\n")


def test_repeated_pairs_are_rejected_whatever_the_split(tmp_path, monkeypatch):
    """Every copy of a pair repeated within one source is rejected with its own file and line,
    whether the copies share a file (and a block, or not) or sit in different files, in TREC or
    JSONL; the metrics equal pytrec_eval on the input without the repeated pairs, for 1, 3 and 4
    shards, in-process and multi-process. Before the fix, copies in two run files were both
    evaluated (recall above 1) and copies in two qrels files stopped the pipeline."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels, run, copies = duplicate_case()
    qrels_rows = [(q, d, v) for q, docs in qrels.items() for d, v in docs.items()]
    run_rows = [(q, d, v) for q, docs in run.items() for d, v in docs.items()]
    write_split(tmp_path / "one" / "qrels", "qrels", qrels_rows, copies, ["qrels"])
    write_split(tmp_path / "one" / "run", "run", run_rows, copies, ["run"])
    write_split(tmp_path / "many" / "qrels", "qrels", qrels_rows, copies, ["a", "b.jsonl"])
    write_split(tmp_path / "many" / "run", "run", run_rows, copies, ["a", "b.jsonl", "c"])
    # One file read in blocks of about three lines: copies of a pair fall in different blocks.
    monkeypatch.setattr(retrieval_rows, "BLOCK_BYTES", 64)
    outputs = {}
    # (name, qrels split, run split, Beam options): copies in one file (in different blocks),
    # run copies in different files (multi-process), all copies in different files.
    for name, qrels_split, run_split, extra in (
            ("one", "one", "one", ["--num_shards", "1"]),
            ("runs", "one", "many", ["--num_shards", "3", *MULTIPROCESS]),
            ("many", "many", "many", ["--num_shards", "4"])):
        out = tmp_path / f"out-{name}"
        assert run_retrieval("--groundtruths", tmp_path / qrels_split / "qrels" / "*",
                             "--predictions", f"m={tmp_path / run_split / 'run' / '*'}",
                             "--output", out, "--quiet", "--k", "10", *extra) == 1, name
        outputs[name] = out
        rejected = read_jsonl(out / "rejected.jsonl")
        # every copy, and only copies: the line each record names holds the repeated pair
        assert len(rejected) == len(copies), name
        for record in rejected:
            text = Path(record["file"]).read_text().splitlines()[record["line"] - 1]
            assert "dup-" in text, (name, record)
            assert record["reason"].startswith("duplicate (query, doc) pair ("), record
        by_pair = {}
        for record in rejected:
            by_pair.setdefault((record["source"], record["reason"]), []).append(record)
        assert sorted((source, len(v)) for (source, _), v in by_pair.items()) == [
            ("groundtruths", 2), ("groundtruths", 2), ("m", 2), ("m", 3)], name
        counts = json.loads((out / "run.json").read_text())["counts"]
        assert counts == {
            "groundtruths": {"rows_read": len(qrels_rows) + 4, "rows_evaluated": len(qrels_rows),
                             "rows_rejected": 4},
            "m": {"rows_read": len(run_rows) + 5, "rows_evaluated": len(run_rows), "rows_rejected": 5}}
    # the reason of copies in different files lists each copy as file:line
    reasons = {r["reason"] for r in read_jsonl(outputs["many"] / "rejected.jsonl")}
    assert any(f"{tmp_path / 'many' / 'run' / 'a'}:" in r and f"{tmp_path / 'many' / 'run' / 'b.jsonl'}:" in r
               for r in reasons)
    single = {r["reason"] for r in read_jsonl(outputs["one"] / "rejected.jsonl")}
    assert "duplicate (query, doc) pair ('q2', 'dup-b') on lines" in "".join(single)
    metrics = [(outputs[name] / "metrics.jsonl").read_bytes() for name in ("one", "runs", "many")]
    assert metrics[0] == metrics[1] == metrics[2]
    expected = pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES).evaluate(run)
    mine = {(r["type"], r["parameters"].get("k")): r["value"]
            for r in read_jsonl(outputs["one"] / "metrics.jsonl") if not r["slice"]}
    assert mine[("Queries", None)] == len(expected) == 6
    for key, measure in MEASURES.items():
        mean = sum(values[measure] for values in expected.values()) / len(expected)
        assert mine[key] == pytest.approx(mean, abs=1e-12), measure
    assert mine[("Recall", 10)] <= 1.0 and mine[("NDCG", None)] <= 1.0


@pytest.mark.parametrize("block_bytes", [64 << 20, 16])
def test_readers_reject_copies_with_different_values_in_both_formats(monkeypatch, block_bytes):
    """Within one file the rule is the same for TREC and JSONL, for copies whose relevance or
    score differ, and for copies in different blocks of the reader (16 bytes: one line each)."""
    monkeypatch.setattr(retrieval_rows, "BLOCK_BYTES", block_bytes)
    trec_run = b"q1 Q0 d1 1 0.9 t\nq1 Q0 d2 2 0.8 t\nq1 Q0 d1 3 0.1 t\n"
    jsonl_run = b"".join(json.dumps({"query_id": "q1", "doc_id": d, "score": s}).encode() + b"\n"
                         for d, s in (("d1", 0.9), ("d2", 0.8), ("d1", 0.1)))
    for data, fmt in ((trec_run, "trec"), (jsonl_run, "jsonl")):
        columns, rejects = read_run(data, fmt)
        assert columns.doc.to_pylist() == ["d2"]
        assert rejects == [(1, "duplicate (query, doc) pair ('q1', 'd1') on lines 1, 3"),
                           (3, "duplicate (query, doc) pair ('q1', 'd1') on lines 1, 3")]
    columns, rejects = read_qrels(b'{"query_id": "q", "doc_id": "d", "relevance": 2}\n'
                                  b'{"query_id": "q", "doc_id": "d", "relevance": 0}\n', "jsonl")
    assert len(columns) == 0 and [line for line, _ in rejects] == [1, 2]


# ---------------------------------------------------------------------------------------------
# Compressed inputs


def test_truncated_gzip_is_an_input_error(tmp_path, capsys):
    """A .gz cut short (on a line boundary of its content) is an input error, exit 2, whether the
    cut shows in the first lines (found before the run: nothing written) or later (found by the
    reader: run.json "failed", no metrics). Before the fix the readable half was evaluated."""
    qrels = "".join(f"q{i} 0 d{j} {j % 2}\n" for i in range(20) for j in range(5))
    (tmp_path / "qrels").write_text(qrels)
    full = gzip.compress(qrels.encode())
    (tmp_path / "qrels.gz").write_bytes(full[: len(full) // 2])
    (tmp_path / "run").write_text("q1 Q0 d1 1 0.9 t\n")
    assert run_retrieval("--groundtruths", tmp_path / "qrels.gz", "--predictions", f"m={tmp_path / 'run'}",
                         "--output", tmp_path / "out1", "--quiet") == 2
    assert "qrels.gz does not end as a complete compressed file" in capsys.readouterr().err
    assert not (tmp_path / "out1").exists()
    # Past the first MiB of content: only the reader meets the cut.
    lines = [f"q{i} Q0 doc{j:04d} {j} {1 - j / 1000:.4f} run\n".encode() for i in range(20) for j in range(4000)]
    data = b"".join(lines)
    compressed = gzip.compress(data)
    cut = compressed[: int(len(compressed) * 0.8)]
    assert len(data) > 2 << 20   # the launcher's look at the first line reads 1 MiB
    (tmp_path / "run.gz").write_bytes(cut)
    assert run_retrieval("--groundtruths", tmp_path / "qrels", "--predictions", f"m={tmp_path / 'run.gz'}",
                         "--output", tmp_path / "out2", "--quiet") == 2
    err = capsys.readouterr().err
    assert "run.gz does not end as a complete compressed file" in err and "Traceback" not in err
    info = json.loads((tmp_path / "out2" / "run.json").read_text())
    assert info["status"] == "failed" and not (tmp_path / "out2" / "metrics.jsonl").exists()


def test_compressed_jsonl_is_read_as_jsonl(tmp_path):
    """qrels.jsonl.gz is JSONL (the suffix under the compression decides); before, any name not
    ending in .jsonl was read as TREC and the file refused."""
    rows = [{"query_id": "q1", "doc_id": "d1", "relevance": 1}, {"query_id": "q1", "doc_id": "d2", "relevance": 0}]
    (tmp_path / "qrels.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    (tmp_path / "run").write_text("q1 Q0 d2 1 0.9 t\nq1 Q0 d1 2 0.8 t\n")
    assert retrieval_rows.format_of("a/qrels.jsonl.gz") == "jsonl"
    assert retrieval_rows.format_of("a/qrels.gz") == "trec"
    assert run_retrieval("--groundtruths", tmp_path / "qrels.jsonl.gz", "--predictions",
                         f"m={tmp_path / 'run'}", "--output", tmp_path / "out", "--quiet", "--k", "1") == 0
    mrr = [r["value"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl") if r["type"] == "MRR"]
    assert mrr == [0.5]


# ---------------------------------------------------------------------------------------------
# Hostile JSONL rows


def test_hostile_jsonl_rows_are_rejected_with_a_reason(tmp_path, monkeypatch, capsys):
    """NaN / Infinity in metadata used by --slice, JSON nested 2,000 and 100,000 deep, a lone
    surrogate and a line longer than the row limit: each row is rejected with its reason, the
    others evaluated; the run ends with exit 1, not a crash (before: "Out of range float values
    are not JSON compliant" at WriteMetrics, exit 3, and deep or surrogate rows accepted)."""
    monkeypatch.setattr(retrieval_rows, "MAX_ROW_BYTES", 250_000, raising=False)
    deep = '{"query_id": "q1", "doc_id": "d7", "relevance": 1, "x": %s}'
    qrels = [
        {"query_id": "q1", "doc_id": "d1", "relevance": 1, "metadata": {"lang": float("nan")}},  # 1
        {"query_id": "q1", "doc_id": "d2", "relevance": 1, "metadata": {"lang": "en"}},          # 2
        {"query_id": "q2", "doc_id": "d1", "relevance": 1, "metadata": {"lang": float("inf")}},  # 3
        {"query_id": "q2", "doc_id": "d3", "relevance": 1, "metadata": {"lang": "fr", "n": float("nan")}},  # 4
        deep % ("[" * 2000 + "]" * 2000),                                                         # 5
        deep % ("[" * 100_000 + "]" * 100_000),                                                   # 6
        '{"query_id": "q1", "doc_id": "d8", "relevance": 1, "note": "\\ud800"}',                  # 7
        json.dumps({"query_id": "q1", "doc_id": "d9", "relevance": 1, "pad": "x" * 300_000}),    # 8
        '{"query_id": "q3", "doc_id": "d1", "relevance": 1, "metadata": {"lang": "\\ud83d\\ude00"}}',  # 9
        json.dumps({"query_id": "q1", "doc_id": "d4", "relevance": 0, "metadata": {"n": [[[1]]]}}),  # 10
    ]
    write_jsonl(tmp_path / "qrels.jsonl", qrels)
    run = [{"query_id": q, "doc_id": d, "score": s}
           for q, d, s in (("q1", "d1", 3.0), ("q1", "d2", 2.0), ("q1", "d7", 1.0), ("q2", "d3", 1.0),
                           ("q2", "d1", 2.0), ("q3", "d1", 1.0))]
    run += ['{"query_id": "q2\\udc00", "doc_id": "d1", "score": 1}',
            '{"query_id": "q2", "doc_id": "d5", "score": 1, "x": %s}' % ("{\"a\": " * 3000 + "1" + "}" * 3000)]
    write_jsonl(tmp_path / "run.jsonl", run)
    assert run_retrieval("--groundtruths", tmp_path / "qrels.jsonl", "--predictions", f"m={tmp_path / 'run.jsonl'}",
                         "--output", tmp_path / "out", "--slice", "lang", "--quiet", "--k", "1") == 1
    assert "Traceback" not in capsys.readouterr().err
    reasons = {(r["source"], r["line"]): r["reason"] for r in read_jsonl(tmp_path / "out" / "rejected.jsonl")}
    assert reasons == {
        ("groundtruths", 1): "metadata 'lang' is nan: a slice value must be a string, a finite "
                             "number, a boolean or null",
        ("groundtruths", 3): "metadata 'lang' is inf: a slice value must be a string, a finite "
                             "number, a boolean or null",
        ("groundtruths", 5): "JSON nested deeper than 64 levels",
        ("groundtruths", 6): "JSON nested deeper than 64 levels",
        ("groundtruths", 7): "the value of 'note' holds a lone UTF-16 surrogate (an escape such as "
                             "\\ud800 without its pair): not valid Unicode text",
        ("groundtruths", 8): "line longer than 250,000 bytes",
        ("m", 7): "the value of 'query_id' holds a lone UTF-16 surrogate (an escape such as \\ud800 "
                  "without its pair): not valid Unicode text",
        ("m", 8): "JSON nested deeper than 64 levels",
    }
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"]["groundtruths"] == {"rows_read": 10, "rows_evaluated": 4, "rows_rejected": 6}
    # q1 is sliced by its first valid row with a usable value (row 2, "en"); row 4's NaN is under
    # "n", not a --slice key, so q2 is "fr"; a surrogate pair is text, so q3 keeps its emoji.
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    queries = {json.dumps(r["slice"], ensure_ascii=False): r["value"] for r in records if r["type"] == "Queries"}
    assert queries == {"{}": 3, '{"lang": "en"}': 1, '{"lang": "fr"}': 1, '{"lang": "😀"}': 1}
    # P@1: q1 ranks d1 first, whose judgment (row 1) was rejected: 0; q2 ranks d1 (rejected) first: 0
    precision = {json.dumps(r["slice"], ensure_ascii=False): r["value"] for r in records if r["type"] == "Precision"}
    assert precision == {"{}": pytest.approx(1 / 3), '{"lang": "en"}': 0.0, '{"lang": "fr"}': 0.0,
                         '{"lang": "😀"}': 1.0}


def test_jsonl_fast_path_never_sees_deep_or_surrogate_lines(monkeypatch):
    """The Arrow block reader is skipped for a block with a line of more than 64 opening
    brackets or a surrogate escape; the line reader then decides row by row (a line with many
    brackets inside a string is not deep, a surrogate pair is text)."""
    seen = []
    real = retrieval_rows._jsonl_fast

    def spy(data, start, end, first_line, kind):
        result = real(data, start, end, first_line, kind)
        seen.append(result is not None)
        return result

    monkeypatch.setattr(retrieval_rows, "_jsonl_fast", spy)
    clean = b"".join(json.dumps({"query_id": "q", "doc_id": f"d{i}", "score": i}).encode() + b"\n"
                     for i in range(200))
    read_run(clean, "jsonl")
    assert seen == [True]
    for extra, accepted in ((b'{"query_id": "q", "doc_id": "x", "score": 1, "s": "' + b"{" * 80 + b'"}\n', True),
                            (b'{"query_id": "q", "doc_id": "x", "score": 1, "s": "\\ud83d\\ude00"}\n', True),
                            (b'{"query_id": "q", "doc_id": "x", "score": 1, "s": "\\ud83d"}\n', False),
                            (b'{"query_id": "q", "doc_id": "x", "score": 1, "s": ' + b"[" * 65 + b"]" * 65 + b"}\n",
                             False)):
        seen.clear()
        columns, rejects = read_run(clean + extra, "jsonl")
        assert seen == [False], extra[:60]
        assert len(columns) == 200 + accepted and len(rejects) == 1 - accepted, extra[:60]


# ---------------------------------------------------------------------------------------------
# Runs the qrels do not judge


def test_run_without_judged_queries_is_incomplete(tmp_path, capsys):
    """A run none of whose queries is in the qrels (ids written differently) makes the run
    "incomplete" (exit 4) with an error naming the ids; a run most of whose queries lack
    judgments gets warnings; a matching run none. Before the fix: exit 0, a table of zeros."""
    (tmp_path / "qrels").write_text("".join(f"q{i} 0 d{j} {int(j == i)}\n" for i in range(1, 5) for j in range(1, 5)))
    (tmp_path / "good").write_text("".join(f"q{i} Q0 d{i} 1 1.0 t\n" for i in range(1, 5)))
    (tmp_path / "bad").write_text("".join(f"Q{i} Q0 d{i} 1 1.0 t\n" for i in range(1, 5)))
    (tmp_path / "partial").write_text("q1 Q0 d1 1 1.0 t\nx2 Q0 d2 1 1.0 t\nx3 Q0 d3 1 1.0 t\n")
    assert run_retrieval("--groundtruths", tmp_path / "qrels", "--predictions", f"good={tmp_path / 'good'}",
                         "--predictions", f"bad={tmp_path / 'bad'}", "--predictions", f"partial={tmp_path / 'partial'}",
                         "--output", tmp_path / "out", "--quiet", "--k", "1") == 4
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["status"] == "incomplete"
    found = {(p["severity"], p["code"]): p["message"] for p in info["problems"]}
    assert set(found) == {("error", "no_judged_queries"), ("warning", "unjudged_queries"),
                          ("warning", "unanswered_queries")}
    assert found[("error", "no_judged_queries")].startswith(
        "model 'bad': none of the 4 queries of its run has a judgment in the qrels, so every measure is "
        "an average over no query. Its query ids ('Q1', 'Q2', 'Q3', ...) and the qrels' ('q1', 'q2', 'q3', ...)")
    assert found[("warning", "unjudged_queries")].startswith(
        "model 'partial': 2 of the 3 queries of its run have no judgment in the qrels (e.g. 'x2', 'x3')")
    assert found[("warning", "unanswered_queries")].startswith("model 'partial' answers 1 of the 4 queries")
    err = capsys.readouterr().err
    assert "the run is incomplete" in err and "model 'bad': none of the 4 queries" in err
    queries = {r["model"]: r["value"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl") if r["type"] == "Queries"}
    assert queries == {"good": 4, "bad": 0, "partial": 1}


def test_coverage_problems_rules():
    from evalbeam.transforms.retrieval import QueryCoverage, coverage_problems

    def codes(coverage, complete=False):
        return [(p["severity"], p["code"]) for p in coverage_problems(coverage, complete)]

    half = QueryCoverage(run_queries=4, judged=2, qrels_queries=4)
    assert codes([("m", half)]) == []                            # exactly half unjudged: no warning
    assert codes([("m", QueryCoverage(5, 2, 4, ("a",)))]) == [("warning", "unjudged_queries")]
    assert codes([("m", QueryCoverage(3, 3, 7))]) == [("warning", "unanswered_queries")]
    assert codes([("m", QueryCoverage(3, 3, 7))], complete=True) == []
    nothing = coverage_problems([("m", QueryCoverage(2, 0, 3, ("A", "B"), ("a", "b", "c")))], True)
    assert nothing[0]["severity"] == "error" and "every qrels query scores 0 (--complete)" in nothing[0]["message"]
    assert codes([("m", QueryCoverage(0, 0, 3))]) == []           # no rows: count_problems' finding
    merged = QueryCoverage(2, 1, 3, ("b", "d"), ("a",)).merge(QueryCoverage(3, 0, 0, ("a", "c", "e"), ()))
    assert merged == QueryCoverage(5, 1, 3, ("a", "b", "c"), ("a",))
    # the pairs of every shard are merged per model first: 1 of 4 queries judged (a warning),
    # not a shard with no judged query (an error)
    shards = [("m", QueryCoverage(2, 1, 2, ("x",), ("q",))), ("m", QueryCoverage(2, 0, 0, ("y",), ()))]
    assert codes(shards) == [("warning", "unjudged_queries")]


# ---------------------------------------------------------------------------------------------
# Files of another task


def test_a_file_of_another_task_names_its_command(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from evalbeam.pipelines.tasks.retrieval import TASK
    from evalbeam.transforms.io import InputError, Source

    check_source = TASK.check_source

    write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "labels": {"digit": "1"}}])
    write_jsonl(tmp_path / "det.jsonl", [{"datum_uid": "a", "annotations": []}])
    write_jsonl(tmp_path / "run.txt", [{"query_id": "q", "doc_id": "d", "score": 1.0}])
    pq.write_table(pa.table({"image_id": [1], "category_id": [2], "score": [0.5]}), tmp_path / "det.parquet")
    pq.write_table(pa.table({"query_id": ["q"]}), tmp_path / "other.parquet")
    (tmp_path / "run").write_text("q Q0 d 1 1.0 t\n")

    def message(name, path):
        with pytest.raises(InputError) as error:
            check_source(name, Source(name, str(path), (str(path),)), None, ())
        return str(error.value)

    assert message("groundtruths", tmp_path / "gt.jsonl").endswith(
        "holds classification rows (fields ['datum_uid', 'labels']), not retrieval rows: evaluate it "
        "with 'evalbeam classification'.")
    assert "evaluate it with 'evalbeam detection'" in message("m", tmp_path / "det.jsonl")
    assert "evaluate it with 'evalbeam detection'" in message("m", tmp_path / "det.parquet")
    assert "is a Parquet file; evalbeam retrieval reads TREC" in message("m", tmp_path / "other.parquet")
    assert "holds JSON rows, but only names ending in .jsonl" in message("m", tmp_path / "run.txt")
    check_source("m", Source("m", str(tmp_path / "run"), (str(tmp_path / "run"),)), None, ())   # a TREC run passes
    assert run_retrieval("--groundtruths", tmp_path / "gt.jsonl", "--predictions", f"m={tmp_path / 'run'}",
                         "--output", tmp_path / "out", "--quiet") == 2
    assert "evaluate it with 'evalbeam classification'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# A UTF-8 byte order mark: dropped at byte 0 of a file, whatever else the file holds and however
# it is split, and nowhere else


def test_bom_is_dropped_at_the_start_of_a_file_only_whatever_its_other_lines():
    """Before the fix a bad line sent the block to the line-by-line reader, which kept the BOM
    in the first query id ('\\ufeffq9'), while Arrow's reader dropped it; and a span that began
    at a BOM line past byte 0 had it dropped too."""
    bom = "\ufeff"
    good = f"{bom}q9 0 doc0 1\nq7 0 doc2 0\n{bom}q6 0 doc3 2\n"
    texts = (good, good + "q8 0 doc1 1.5\n", good.replace(" ", "\t"))
    for text in texts:
        columns, rejects = retrieval_rows.parse_qrels(text.encode(), "trec")
        assert columns.query.to_pylist() == ["q9", "q7", f"{bom}q6"], text
        assert len(rejects) == text.count("1.5")
    # every cut at a line start: the span past byte 0 keeps a BOM it starts with
    for data in (text.encode() for text in texts):
        for cut in (i + 1 for i, byte in enumerate(data) if byte == ord("\n")):
            head, _ = retrieval_rows.parse_qrels(data[:cut], "trec")
            tail, _ = retrieval_rows.parse_qrels(data[cut:], "trec", data.count(b"\n", 0, cut) + 1, cut)
            assert head.query.to_pylist() + tail.query.to_pylist() == ["q9", "q7", f"{bom}q6"]
    run = (f"{bom}q9 Q0 doc0 1 1.0 t\n").encode()
    assert retrieval_rows.parse_run(run, "trec")[0].query.to_pylist() == ["q9"]
    assert retrieval_rows.parse_run(run + b"q8 Q0 d 1 x t\n", "trec")[0].query.to_pylist() == ["q9"]


def test_bom_gives_the_same_metrics_for_any_input_split_bytes(tmp_path):
    """A BOM line, 290 good lines and a bad one: 290 queries with the default split and 291 with
    --input_split_bytes 1000 before the fix; 291 for every split now, the same bytes."""
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("\ufeffq0 0 doc0 1\n" + "".join(f"q{i} 0 doc{i} 1\n" for i in range(1, 291))
                     + "qbad 0 docx 1.5\n", encoding="utf-8")
    run = tmp_path / "run.trec"
    run.write_text("".join(f"q{i} Q0 doc{i} 1 1.0 t\n" for i in range(291)))
    metrics = []
    for split in ("0", "1000", "777"):
        out = tmp_path / f"out-{split}"
        assert run_retrieval("--groundtruths", qrels, "--predictions", f"m={run}", "--output", out,
                             "--quiet", "--input_split_bytes", split) == 1
        assert [r["line"] for r in read_jsonl(out / "rejected.jsonl")] == [292]
        metrics.append((out / "metrics.jsonl").read_bytes())
        values = {(r["type"], r["parameters"].get("k")): r["value"]
                  for r in read_jsonl(out / "metrics.jsonl") if not r["slice"]}
        assert values[("Queries", None)] == 291 and values[("MAP", None)] == 1.0, split
    assert metrics[0] == metrics[1] == metrics[2]


def test_a_jsonl_line_that_starts_with_a_bom_is_a_bad_row_wherever_the_span_starts(tmp_path):
    """JSONL qrels: the file's BOM (byte 0) is dropped; line 3 starts with one (files that each
    had one, joined) and is rejected, also when a span starts at it, where Arrow's reader (the
    parser's fast path) would drop it. Before the fix line 3 was a row, wherever it fell."""
    import apache_beam as beam

    from evalbeam.schemas.safe_json import BOM, BOM_REASON
    from evalbeam.transforms.io import Source
    from evalbeam.transforms.retrieval import ReadRetrievalFile

    lines = [json.dumps({"query_id": f"q{i}", "doc_id": "d", "relevance": 1}).encode() for i in range(5)]
    data = BOM + b"\n".join([lines[0], b"{bad", BOM + lines[2]] + lines[3:]) + b"\n"
    path = tmp_path / "qrels.jsonl"
    path.write_bytes(data)
    reader = ReadRetrievalFile({"groundtruths": Source("groundtruths", str(path), (str(path),))}, 1, True, 0.0)
    reader.setup()
    for cut in [0] + [i + 1 for i, byte in enumerate(data) if byte == ord("\n")][:-1]:
        first = 1 + data.count(b"\n", 0, cut)
        spans = [(0, cut, 1), (cut, len(data), first)] if cut else [(0, len(data), 1)]
        queries, rejected = [], []
        for start, end, first_line in spans:
            for out in reader.process(("groundtruths", 0, start, end, first_line)):
                if isinstance(out, beam.pvalue.TaggedOutput):
                    if out.tag == "rejected":
                        rejected.append((out.value["line"], out.value["reason"].split(":")[0]))
                else:
                    queries += out[1][2].query.to_pylist()
        assert sorted(queries) == ["q0", "q3", "q4"], cut
        assert sorted(rejected) == [(2, "malformed JSON"), (3, BOM_REASON)], cut


# ---------------------------------------------------------------------------------------------
# A bad first row is one rejected row, not a refused file (issue 39)

SURROGATE = "the value of 'note' holds a lone UTF-16 surrogate (an escape such as \\ud800 without its " \
            "pair): not valid Unicode text"
# the three kinds of bad row: (line, the start of its rejection reason)
BAD_ROWS = {
    "surrogate": ('{"query_id": "q1", "doc_id": "d1", "%s": 1, "note": "\\ud800"}', SURROGATE),
    "deep": ('{"query_id": "q1", "doc_id": "d1", "%s": 1, "x": ' + "[" * 70 + "]" * 70 + "}",
             "JSON nested deeper than 64 levels"),
    "broken": ('{"query_id": "q1", "doc_id": "d1", "%s": 1', "malformed JSON: "),
}


def first_row_case(folder: Path, bad: dict, at_byte: int | None = None) -> tuple[Path, Path]:
    """qrels.jsonl and run.jsonl in folder: 4 queries x 8 docs, graded judgments, scores with a
    tie, and the bad rows of bad ({"qrels"|"run": [row text, ...]}): the first at line 1, the
    second (if any) as the first line that starts at byte at_byte or later (the first line of
    the second span when the file is read in spans of at_byte bytes). Each bad row names a
    (query, doc) pair of a good row, so a bad row kept by mistake would be a repeated pair."""
    rng = np.random.default_rng(39)
    rows = {"qrels": [], "run": []}
    for q in range(4):
        for d in range(8):
            rows["qrels"].append(json_line("qrels", f"q{q}", f"d{d}", int(rng.integers(0, 3))))
            rows["run"].append(json_line("run", f"q{q}", f"d{d}", float(rng.integers(0, 5))))
    paths = []
    for source, lines in rows.items():
        extra = list(bad.get(source, []))
        if extra:
            lines.insert(0, extra.pop(0))
        if extra:
            start, at = 0, 0
            while start < at_byte:
                start += len(lines[at]) + 1
                at += 1
            lines.insert(at, extra.pop(0))
        paths.append(Path(write_jsonl(folder / f"{source}.jsonl", lines)))
    return paths[0], paths[1]


def run_case(qrels: Path, run: Path, out: Path, *options) -> int:
    return run_retrieval("--groundtruths", qrels, "--predictions", f"m={run}", "--output", out,
                         "--quiet", "--k", "1,3,5", "--per_query", *options)


@pytest.fixture(scope="module")
def clean_metrics(tmp_path_factory):
    """metrics.jsonl and per_query.jsonl of the case without bad rows."""
    folder = tmp_path_factory.mktemp("clean")
    qrels, run = first_row_case(folder, {})
    assert run_case(qrels, run, folder / "out") == 0
    return (folder / "out" / "metrics.jsonl").read_bytes(), (folder / "out" / "per_query.jsonl").read_bytes()


def check_rejected(out: Path, qrels: Path, run: Path, expected: list[tuple], clean_metrics) -> None:
    """expected: (source, file, line, reason start) of every rejected row; the counts add up
    (32 good rows in each file) and the metrics are those of the files without the bad rows."""
    rejected = read_jsonl(out / "rejected.jsonl")
    assert sorted((r["source"], r["file"], r["line"]) for r in rejected) == \
        sorted((source, str(path), line) for source, path, line, _ in expected)
    reasons = {(r["source"], r["line"]): r["reason"] for r in rejected}
    for source, _, line, reason in expected:
        assert reasons[(source, line)].startswith(reason), (source, line, reasons[(source, line)])
    counts = json.loads((out / "run.json").read_text())["counts"]
    for source, name in (("groundtruths", "groundtruths"), ("m", "m")):
        bad = sum(1 for e in expected if e[0] == source)
        assert counts[name] == {"rows_read": 32 + bad, "rows_evaluated": 32, "rows_rejected": bad}
    assert (out / "metrics.jsonl").read_bytes() == clean_metrics[0]
    assert (out / "per_query.jsonl").read_bytes() == clean_metrics[1]


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_a_bad_first_row_is_rejected_and_the_file_read_on(tmp_path, capsys, kind, clean_metrics):
    """A lone surrogate, JSON nested 70 deep or broken JSON on line 1 of the JSONL qrels and of
    the JSONL run: one rejected row each (file, line 1, the reason), the rest evaluated as if
    the line were not there. Before the fix each file was refused at the start (exit 2, "does
    not start with a JSON object with [...]", false for the surrogate row, which is one)."""
    line, reason = BAD_ROWS[kind]
    qrels, run = first_row_case(tmp_path, {"qrels": [line % "relevance"], "run": [line % "score"]})
    assert run_case(qrels, run, tmp_path / "out") == 1      # rejected rows: exit 1, metrics written
    assert "Traceback" not in capsys.readouterr().err
    check_rejected(tmp_path / "out", qrels, run,
                   [("groundtruths", qrels, 1, reason), ("m", run, 1, reason)], clean_metrics)


def test_a_bad_first_row_and_a_bad_row_that_starts_a_span_multiprocess(tmp_path, clean_metrics):
    """The same on two worker processes, the files read in spans of 400 bytes, each with a bad
    row on line 1 and another as the first line of its second span (the span reader's line 1)."""
    rows = {source: [BAD_ROWS[kind][0] % value for kind in kinds]
            for source, value, kinds in (("qrels", "relevance", ("surrogate", "deep")),
                                         ("run", "score", ("broken", "surrogate")))}
    qrels, run = first_row_case(tmp_path, rows, at_byte=400)
    lines = {path: path.read_bytes().split(b"\n") for path in (qrels, run)}
    second = {path: next(i for i in range(len(ls)) if sum(len(x) + 1 for x in ls[:i]) >= 400) + 1
              for path, ls in lines.items()}
    for path in (qrels, run):       # the second bad row starts the second span
        assert sum(len(x) + 1 for x in lines[path][:second[path] - 1]) >= 400
        assert sum(len(x) + 1 for x in lines[path][:second[path] - 2]) < 400
        assert lines[path][second[path] - 1].startswith(b'{"query_id": "q1", "doc_id": "d1"')
    assert run_case(qrels, run, tmp_path / "out", "--input_split_bytes", "400", *MULTIPROCESS) == 1
    check_rejected(tmp_path / "out", qrels, run,
                   [("groundtruths", qrels, 1, SURROGATE),
                    ("groundtruths", qrels, second[qrels], BAD_ROWS["deep"][1]),
                    ("m", run, 1, "malformed JSON: "), ("m", run, second[run], SURROGATE)],
                   clean_metrics)


def test_a_file_without_rows_at_its_start_is_refused_with_what_it_holds(tmp_path, capsys):
    """Refused up front, each with a true message: a JSONL file none of whose first 100 lines is
    a row of its kind (a run given as qrels, a file of only bad rows), a TREC file none of whose
    lines has the right field count; a TREC file whose first line is bad but whose next is a
    row passes (the bad line is rejected when the file is read)."""
    from evalbeam.pipelines.tasks.retrieval import TASK
    from evalbeam.transforms.io import InputError, Source

    check_source = TASK.check_source

    def message(name, path):
        with pytest.raises(InputError) as error:
            check_source(name, Source(name, str(path), (str(path),)), None, ())
        return str(error.value).replace(str(path), "FILE")

    write_jsonl(tmp_path / "run.jsonl", ['{"broken', {"query_id": "q", "doc_id": "d", "score": 1.0}])
    assert message("groundtruths", tmp_path / "run.jsonl") == (
        "FILE (given for groundtruths) holds no qrels rows: none of its 2 non-blank lines is a JSON "
        "object with ['query_id', 'doc_id', 'relevance'] (the first: malformed JSON: Unterminated "
        "string starting at: line 1 column 2 (char 1)); see pipelines/tasks/retrieval.md for the formats.")
    write_jsonl(tmp_path / "lone.jsonl", [BAD_ROWS["surrogate"][0] % "score"])
    assert message("m", tmp_path / "lone.jsonl") == (
        "FILE (given for m) holds no run rows: its only non-blank line is not a JSON object with "
        f"['query_id', 'doc_id', 'score'] ({SURROGATE}); see pipelines/tasks/retrieval.md for the formats.")
    write_jsonl(tmp_path / "lists.jsonl", [[1, 2]] * 150)
    assert "none of its first 100 non-blank lines is a JSON object with ['query_id', 'doc_id', " \
           "'score'] (the first: not a JSON object)" in message("m", tmp_path / "lists.jsonl")
    (tmp_path / "run").write_text("q Q0 d 1 1.0\n" * 3)
    assert message("m", tmp_path / "run") == (
        "FILE (given for m) holds no TREC run lines 'query Q0 doc rank score tag': none of its 3 "
        "non-blank lines is a line of 6 or more fields (the first: a line of 5 fields); JSONL rows "
        "are read from files named .jsonl.")
    (tmp_path / "qrels").write_text("# judgments\nq 0 d 1\n")
    check_source("groundtruths", Source("groundtruths", str(tmp_path / "qrels"), (str(tmp_path / "qrels"),)),
                 None, ())
    assert run_retrieval("--groundtruths", tmp_path / "run.jsonl", "--predictions", f"m={tmp_path / 'run'}",
                         "--output", tmp_path / "out", "--quiet") == 2
    assert "holds no qrels rows" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
