"""Retrieval kernel and readers: trec_eval's reference outputs, pytrec_eval on random inputs,
the id encoding, the ranking rule and the TREC / JSONL readers with their rejects."""

from __future__ import annotations

import json
import math
import os
import re

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

import evalbeam.schemas.retrieval_rows as rows
import evalbeam.transforms.kernels.retrieval as kernel
from evalbeam.schemas.retrieval_rows import read_qrels, read_run
from evalbeam.transforms.kernels.retrieval import (
    RetrievalConfig,
    RetrievalState,
    aggregate,
    common_prefix,
    encode_ids,
    evaluate,
    judged_queries,
    measure_names,
    rank_run,
    sorted_codes,
    state_records,
)

# ---------------------------------------------------------------------------------------------
# Helpers


def evaluate_dicts(qrels: dict, run: dict, config: RetrievalConfig):
    """(ids, query codes, {measure: values}) of the kernel on {qid: {docno: level}} and
    {qid: {docno: score}}."""
    qq = [q for q, docs in qrels.items() for _ in docs]
    qd = [d for docs in qrels.values() for d in docs]
    qr = np.array([v for docs in qrels.values() for v in docs.values()], np.int64)
    rq = [q for q, docs in run.items() for _ in docs]
    rd = [d for docs in run.values() for d in docs]
    rs = np.array([v for docs in run.values() for v in docs.values()], np.float64)
    ids = encode_ids(qq, qd, rq, rd)
    codes, values = evaluate(ids.qrels_query, ids.qrels_doc, qr, ids.run_query, ids.run_doc, rs, config)
    return ids, codes, values


def evaluate_ids(qrels: dict, run: dict, config: RetrievalConfig | None = None,
                 complete: bool = False) -> dict[str, dict[str, float]]:
    """{query id: {measure: value}} from {qid: {docno: level}} and {qid: {docno: score}}."""
    config = config or RetrievalConfig()
    ids, codes, values = evaluate_dicts(qrels, run, replace(config, complete=complete))
    names = ids.query_ids.to_pylist()
    return {names[c]: {m: float(v[i]) for m, v in values.items()} for i, c in enumerate(codes)}


def evaluate_columns(qrels_cols, run_cols, config: RetrievalConfig, complete: bool = False):
    ids = encode_ids(qrels_cols.query, qrels_cols.doc, run_cols.query, run_cols.doc)
    codes, values = evaluate(ids.qrels_query, ids.qrels_doc, qrels_cols.relevance, ids.run_query,
                             ids.run_doc, run_cols.score, replace(config, complete=complete))
    return [ids.query_ids[int(c)].as_py() for c in codes], values


# ---------------------------------------------------------------------------------------------
# trec_eval's own test outputs

# Measures of all_trec the kernel does not compute (each value of out.* is either compared or
# matched by one of these patterns, so that a misnamed measure cannot be skipped silently).
UNSUPPORTED = re.compile(r"^(runid|relstring(_20)?|gm_map|gm_bpref|Rndcg|G|binG|infAP|Rprec_mult_.*|"
                         r"utility.*|11pt_avg.*|relative_P_.*|set_.*|rbp|rbp_resid|unj_.*|"
                         r"ndcg_1=3,2=9,4=4.5)$")
TOLERANCE = 5e-5  # the files print 4 decimals


def reference(path) -> dict[tuple[str, str], str]:
    out = {}
    for line in path.read_text().splitlines():
        measure, query, value = line.split("\t")
        out[(measure.strip(), query.strip())] = value.strip()
    return out


def compare_with_reference(base, qrels_name, run_name, out_name, config, complete=False):
    qrels_cols, qrels_rejects = read_qrels((base / qrels_name).read_bytes(), "trec")
    run_cols, run_rejects = read_run((base / run_name).read_bytes(), "trec")
    assert qrels_rejects == [] and run_rejects == []
    queries, values = evaluate_columns(qrels_cols, run_cols, config, complete)
    expected = reference(base / out_name)
    totals = aggregate(values)
    compared, unsupported = 0, set()
    for (measure, query), text in expected.items():
        if measure == "num_q":
            assert len(queries) == int(text)
            continue
        if measure not in values:
            assert UNSUPPORTED.match(measure), f"{measure} is neither computed nor known unsupported"
            unsupported.add(measure)
            continue
        mine = totals[measure] if query == "all" else values[measure][queries.index(query)]
        assert abs(mine - float(text)) <= TOLERANCE, (out_name, measure, query, text, mine)
        compared += 1
    return compared, unsupported


def test_trec_eval_default_measures(shared_reference):
    base = shared_reference / "retrieval" / "trec_eval"
    config = RetrievalConfig(ks=(5, 10, 15, 20, 30, 100, 200, 500, 1000))
    compared, unsupported = compare_with_reference(base, "qrels.test", "results.test", "out.test", config)
    # num_ret, num_rel, num_rel_ret, map, Rprec, bpref, recip_rank, 11 iprec, 9 P.
    assert compared == 27
    assert unsupported == {"runid", "gm_map"}


def test_trec_eval_all_measures_per_query(shared_reference):
    base = shared_reference / "retrieval" / "trec_eval"
    config = RetrievalConfig(ks=(1, 5, 10, 15, 20, 30, 100, 200, 500, 1000))
    compared, _ = compare_with_reference(base, "qrels.test", "results.test", "out.test.aq", config)
    # Per line (3 topics + all): 4 counts, map, Rprec, bpref, recip_rank, ndcg, ndcg_rel,
    # 11 iprec_at_recall, 9 each of P, recall, ndcg_cut, map_cut and success_1,5,10.
    assert compared == 4 * 60


def test_trec_eval_complete_average_over_truncated_run(shared_reference):
    """-c: topic 302 has no retrieved document; it counts with zeros (but its num_rel)."""
    base = shared_reference / "retrieval" / "trec_eval"
    config = RetrievalConfig(ks=(1, 5, 10, 15, 20, 30, 100, 200, 500, 1000))
    compared, _ = compare_with_reference(base, "qrels.test", "results.trunc", "out.test.aqc",
                                         config, complete=True)
    assert compared == 4 * 60
    # Without -c the topic is not evaluated at all.
    qrels_cols, _ = read_qrels((base / "qrels.test").read_bytes(), "trec")
    run_cols, _ = read_run((base / "results.trunc").read_bytes(), "trec")
    queries, _ = evaluate_columns(qrels_cols, run_cols, config)
    assert queries == ["301", "303"]


def test_trec_eval_graded_relevance_level_2(shared_reference):
    """-l2 on graded qrels (levels -1..4): binary measures count level >= 2, nDCG gains are
    the levels themselves, level 1 included."""
    base = shared_reference / "retrieval" / "trec_eval"
    config = RetrievalConfig(ks=(1, 5, 10, 15, 20, 30, 100, 200, 500, 1000), relevance_level=2)
    compared, _ = compare_with_reference(base, "qrels.rel_level", "results.test", "out.test.aql", config)
    assert compared == 4 * 60


def test_trec_eval_measure_parameters(shared_reference):
    """P.5,7,3 recall.20,2000 ndcg_cut.10,20,23.4 (trec_eval truncates 23.4 to 23, and so do we)
    success.2,5,20 iprec_at_recall..10,.20,.25,.75,.50."""
    base = shared_reference / "retrieval" / "trec_eval"
    config = RetrievalConfig(ks=(2, 3, 5, 7, 10, 20, int(23.4), 2000),
                             recall_points=(0.1, 0.2, 0.25, 0.5, 0.75))
    compared, unsupported = compare_with_reference(base, "qrels.test", "results.test",
                                                   "out.test.meas_params", config)
    # Per line (3 topics + all): 5 iprec, 3 P, 2 recall, 3 ndcg_cut, 3 success.
    assert compared == 4 * 16
    assert unsupported == {"Rprec_mult_0.20", "Rprec_mult_0.35", "Rprec_mult_5.00",
                           "utility_2,-1,0,0", "11pt_avg_.25,.5,.75", "ndcg_1=3,2=9,4=4.5"}


def test_trec_eval_readme_values(shared_reference):
    base = shared_reference / "retrieval" / "trec_eval"
    qrels_cols, _ = read_qrels((base / "qrels.test").read_bytes(), "trec")
    run_cols, _ = read_run((base / "results.test").read_bytes(), "trec")
    _, values = evaluate_columns(qrels_cols, run_cols, RetrievalConfig(ks=(10, 100)))
    totals = aggregate(values)
    for measure, value in {"map": 0.1785, "P_10": 0.3000, "recall_100": 0.4980, "ndcg": 0.4021,
                           "ndcg_cut_10": 0.3016, "recip_rank": 0.4064}.items():
        assert abs(totals[measure] - value) <= TOLERANCE, measure


# ---------------------------------------------------------------------------------------------
# pytrec_eval (trec_eval compiled in) on random inputs

KS = (1, 3, 5, 10, 100)
PYTREC_MEASURES = {
    "P." + ",".join(map(str, KS)), "recall." + ",".join(map(str, KS)),
    "success." + ",".join(map(str, KS)), "map_cut." + ",".join(map(str, KS)),
    "ndcg_cut." + ",".join(map(str, KS)), "map", "ndcg", "ndcg_rel", "recip_rank", "Rprec",
    "bpref", "iprec_at_recall", "num_ret", "num_rel", "num_rel_ret", "num_nonrel_judged_ret",
}
DOCS = [f"d{i:03d}" for i in range(70)] + ["D1", "d", "d0", "Zz", "a", "é", "doc-10", "doc-9"]


def random_case(seed: int) -> tuple[dict, dict]:
    """Graded qrels (levels -1..3) and a run with many tied scores. q3 has no relevant doc,
    q5 is only in the qrels, q7 only in the run; run lengths include 1 and more than 100."""
    rng = np.random.default_rng(seed)
    qrels, run = {}, {}
    for q in range(9):
        qid = f"q{q}"
        if q != 7:
            judged = rng.choice(len(DOCS), int(rng.integers(1, 40)), replace=False)
            levels = rng.integers(-1, 4, judged.size)
            if q == 3:
                levels = np.minimum(levels, 0)
            qrels[qid] = {DOCS[j]: int(v) for j, v in zip(judged, levels)}
        if q != 5:
            size = [1, 2, 7, 40, len(DOCS)][int(rng.integers(0, 5))] if q != 0 else 1
            retrieved = rng.choice(len(DOCS), size, replace=False)
            scores = np.round(rng.normal(size=size) * 2) / 2  # few distinct values: many ties
            run[qid] = {DOCS[j]: float(s) for j, s in zip(retrieved, scores)}
    return qrels, run


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("level", [1, 2])
def test_against_pytrec_eval(seed, level):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels, run = random_case(seed)
    # pytrec_eval embeds a trec_eval older than the reference outputs: iprec_at_recall rounds
    # the number of relevant docs as p R + 0.9 truncated ("legacy").
    config = RetrievalConfig(ks=KS, relevance_level=level, iprec_rounding="legacy")
    expected = pytrec_eval.RelevanceEvaluator(qrels, PYTREC_MEASURES, relevance_level=level).evaluate(run)
    mine = evaluate_ids(qrels, run, config)
    assert set(mine) == set(expected) == {"q0", "q1", "q2", "q3", "q4", "q6", "q8"}
    compared = 0
    for query, measures in expected.items():
        for measure, value in measures.items():
            assert mine[query][measure] == pytest.approx(value, abs=1e-9), (query, measure)
            compared += 1
        for k in KS:
            p, r = measures[f"P_{k}"], measures[f"recall_{k}"]
            assert mine[query][f"F1_{k}"] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0, abs=1e-12)
    assert compared == 7 * (5 * len(KS) + 6 + 11 + 4)


def test_iprec_rounding_rules_differ():
    """With R = 10 relevant docs, recall 0.25 needs round(2.5) = 3 relevant docs
    (trec_eval >= 9.0.8) or int(2.5 + 0.9) = 3; recall 0.15: 2 or int(1.5 + 0.9) = 2; recall
    0.11: 1 or int(1.1 + 0.9) = 2 (the rules part here)."""
    qrels = {"q": {f"r{i}": 1 for i in range(10)}}
    # Relevant at ranks 1 and 4: precision 1 then 0.5.
    run = {"q": {"r0": 9.0, "x1": 8.0, "x2": 7.0, "r1": 6.0}}
    points = (0.11, 0.15)
    nearest = evaluate_ids(qrels, run, RetrievalConfig(recall_points=points))["q"]
    legacy = evaluate_ids(qrels, run, RetrievalConfig(recall_points=points, iprec_rounding="legacy"))["q"]
    assert nearest["iprec_at_recall_0.11"] == 1.0 and legacy["iprec_at_recall_0.11"] == 0.5
    assert nearest["iprec_at_recall_0.15"] == legacy["iprec_at_recall_0.15"] == 0.5


def test_tie_rule_is_doc_id_descending_bytewise():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    # "a" > "Z" > "D1" byte-wise; "é" (0xC3 0xA9) is above every ASCII id.
    qrels = {"q": {"a": 1, "Z": 0, "é": 0, "D1": 1}}
    run = {"q": {"D1": 1.0, "a": 1.0, "Z": 1.0, "é": 1.0}}
    mine = evaluate_ids(qrels, run, RetrievalConfig(ks=(1, 2, 3)))["q"]
    # Ranking é, a, Z, D1: relevant at ranks 2 and 4.
    assert mine["recip_rank"] == 0.5
    assert mine["P_1"] == 0.0 and mine["P_2"] == 0.5 and mine["P_3"] == pytest.approx(1 / 3)
    expected = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "map"}).evaluate(run)["q"]
    assert mine["recip_rank"] == expected["recip_rank"] and mine["map"] == pytest.approx(expected["map"])


def test_rank_run_orders_by_query_score_and_doc_descending():
    query = np.array([1, 0, 1, 1, 0, 1])
    doc = np.array([5, 2, 7, 6, 9, 4])
    score = np.array([0.5, 1.0, 0.9, 0.5, 1.0, -0.0])
    order, rank = rank_run(query, doc, score, max_docs=None)
    # Query 0: docs 9, 2 tied at 1.0 -> 9 first. Query 1: 7 (0.9), then 6, 5 tied, then 4.
    assert doc[order].tolist() == [9, 2, 7, 6, 5, 4]
    assert rank.tolist() == [1, 2, 1, 2, 3, 4]
    order, rank = rank_run(query, doc, score, max_docs=2)
    assert doc[order].tolist() == [9, 2, 7, 6] and rank.tolist() == [1, 2, 1, 2]
    # Input already in rank order takes the path without a score sort: same answer.
    pre = np.array([4, 1, 2, 3, 0, 5])
    order2, _ = rank_run(query[pre], doc[pre], score[pre], max_docs=None)
    assert doc[pre][order2].tolist() == [9, 2, 7, 6, 5, 4]


def test_cut_at_max_docs_happens_after_the_tie_break():
    qrels = {"q": {f"d{i:04d}": 1 for i in range(0, 1500, 3)}}
    scores = {f"d{i:04d}": float(i // 10) for i in range(1500)}  # tied in tens
    run = {"q": scores}
    cut = evaluate_ids(qrels, run, RetrievalConfig(ks=(10, 1000)))["q"]
    kept = dict(sorted(scores.items(), key=lambda kv: (-kv[1], tuple(-b for b in kv[0].encode())))[:1000])
    truncated = evaluate_ids(qrels, {"q": kept}, RetrievalConfig(ks=(10, 1000), max_docs_per_query=None))["q"]
    full = evaluate_ids(qrels, run, RetrievalConfig(ks=(10, 1000), max_docs_per_query=None))["q"]
    assert cut["num_ret"] == 1000 and full["num_ret"] == 1500
    assert cut == truncated
    assert cut["map"] < full["map"]
    pytrec_eval = pytest.importorskip("pytrec_eval")
    expected = pytrec_eval.RelevanceEvaluator(qrels, {"map", "ndcg", "P.10"}).evaluate({"q": kept})["q"]
    for measure, value in expected.items():
        assert cut[measure] == pytest.approx(value, abs=1e-9)


def test_degenerate_inputs():
    qrels = {"q1": {"a": 1, "b": 2}, "q2": {"a": 0}}
    # Empty run: nothing to evaluate (trec_eval refuses); with -c every qrels query scores 0.
    assert evaluate_ids(qrels, {}) == {}
    complete = evaluate_ids(qrels, {}, complete=True)
    assert set(complete) == {"q1", "q2"}
    assert complete["q1"]["num_rel"] == 2 and complete["q1"]["num_ret"] == 0
    assert all(v == 0 for m, v in complete["q1"].items() if m != "num_rel")
    # Single retrieved doc, k larger than the run; q2 has no relevant doc.
    one = evaluate_ids(qrels, {"q1": {"b": 0.0}, "q2": {"a": 3.0}, "q9": {"a": 1.0}},
                       RetrievalConfig(ks=(1, 5)))
    assert set(one) == {"q1", "q2"}
    q1 = one["q1"]
    assert q1["P_1"] == 1.0 and q1["P_5"] == 0.2 and q1["recall_5"] == 0.5 and q1["success_5"] == 1.0
    assert q1["F1_5"] == pytest.approx(2 * 0.2 * 0.5 / 0.7)
    assert q1["dcg_cut_5"] == 2.0  # gain 2 at rank 1: 2 / log2(2)
    assert q1["ndcg_cut_5"] == pytest.approx(2.0 / (2.0 + 1.0 / math.log2(3)))
    assert q1["map"] == 0.5 and q1["Rprec"] == 0.5 and q1["recip_rank"] == 1.0
    assert all(v == 0 for m, v in one["q2"].items() if m not in ("num_ret", "num_nonrel_judged_ret"))
    assert one["q2"]["num_ret"] == 1 and one["q2"]["num_nonrel_judged_ret"] == 1
    with pytest.raises(ValueError):
        evaluate(np.array([0, 0]), np.array([1, 1]), np.array([1, 1]), np.array([0]), np.array([1]),
                 np.array([1.0]))


def test_dcg_uses_levels_as_gains_and_ignores_negative_levels():
    qrels = {"q": {"a": 3, "b": -1, "c": 1, "d": 0}}
    run = {"q": {"b": 4.0, "c": 3.0, "a": 2.0, "x": 1.0}}
    q = evaluate_ids(qrels, run, RetrievalConfig(ks=(2, 3), relevance_level=2))["q"]
    assert q["dcg_cut_2"] == pytest.approx(1 / math.log2(3))
    assert q["dcg_cut_3"] == pytest.approx(1 / math.log2(3) + 3 / math.log2(4))
    ideal = 3 + 1 / math.log2(3)
    assert q["ndcg"] == pytest.approx(q["dcg_cut_3"] / ideal)
    # Binary measures: only "a" (3 >= 2) is relevant; "b" (-1) is not judged non-relevant.
    assert q["num_rel"] == 1 and q["P_3"] == pytest.approx(1 / 3) and q["num_nonrel_judged_ret"] == 1


def test_per_query_values_add_up_across_shards():
    """Shards by query: concatenating per-shard rows gives the whole evaluation's rows."""
    qrels, run = random_case(3)
    whole = evaluate_ids(qrels, run, RetrievalConfig(ks=KS), complete=True)
    parts = {}
    for shard in (["q0", "q1", "q2", "q7"], ["q3", "q4", "q5", "q6", "q8"]):
        parts.update(evaluate_ids({q: d for q, d in qrels.items() if q in shard},
                                  {q: d for q, d in run.items() if q in shard},
                                  RetrievalConfig(ks=KS), complete=True))
    assert parts == whole
    assert judged_queries(np.array([3, 1, 3])).tolist() == [1, 3]


@pytest.mark.parametrize("seed", [1, 4, 9])
def test_states_merge_exactly_in_any_order_into_the_average(seed):
    """RetrievalState of parts of the queries, merged in any order, gives the records of the
    state of all of them: the mean of each measure (sum of the counts), as aggregate()."""
    qrels, run = random_case(seed)
    config = RetrievalConfig(ks=KS, complete=seed % 2 == 1)
    per_query = evaluate_ids(qrels, run, config, complete=config.complete)
    names = measure_names(config)
    values = {n: np.array([per_query[q][n] for q in sorted(per_query)]) for n in names}
    everything = RetrievalState().add_queries(values, np.arange(len(per_query)))
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(len(per_query) + 1, 2))
    order = rng.permutation(len(per_query))
    parts = [RetrievalState().add_queries(values, index) for index in np.split(order, cuts)]
    forward = parts[0].copy().merge(parts[1]).merge(parts[2])
    backward = parts[2].copy().merge(parts[1].copy().merge(parts[0]))
    expected = list(state_records(everything, config))
    assert list(state_records(forward, config)) == expected == list(state_records(backward, config))
    assert expected[0] == {"type": "Queries", "value": len(per_query),
                           "parameters": {"relevance_level": 1, "max_docs": 1000, "complete": config.complete}}
    means = aggregate(values)
    for record in expected[1:]:
        assert list(record) == ["type", "value", "parameters"]
    by_name = {(r["type"], r["parameters"].get("k")): r["value"] for r in expected}
    assert by_name[("MAP", None)] == pytest.approx(means["map"], abs=1e-12)
    assert by_name[("Precision", KS[0])] == pytest.approx(means[f"P_{KS[0]}"], abs=1e-12)
    copy = everything.copy()
    copy.merge(everything)
    assert copy.queries == 2 * everything.queries          # a copy shares nothing with its origin
    assert list(state_records(everything, config)) == expected
    assert list(state_records(RetrievalState(), config))[1:] == []


def test_input_order_does_not_matter():
    qrels, run = random_case(5)
    qq = [q for q, docs in qrels.items() for _ in docs]
    qd = [d for docs in qrels.values() for d in docs]
    qr = np.array([v for docs in qrels.values() for v in docs.values()], np.int64)
    rq = [q for q, docs in run.items() for _ in docs]
    rd = [d for docs in run.values() for d in docs]
    rs = np.array([v for docs in run.values() for v in docs.values()])
    ids = encode_ids(qq, qd, rq, rd)
    config = RetrievalConfig(ks=KS)
    codes, values = evaluate(ids.qrels_query, ids.qrels_doc, qr, ids.run_query, ids.run_doc, rs, config)
    rng = np.random.default_rng(0)
    for _ in range(3):
        p, r = rng.permutation(len(qq)), rng.permutation(len(rq))
        codes2, values2 = evaluate(ids.qrels_query[p], ids.qrels_doc[p], qr[p], ids.run_query[r],
                                   ids.run_doc[r], rs[r], config)
        assert codes2.tolist() == codes.tolist()
        assert all(values2[m].tolist() == values[m].tolist() for m in values)


def test_measure_names_follow_trec_eval():
    names = measure_names(RetrievalConfig(ks=(5,), recall_points=(0.5,)))
    assert names == ["num_ret", "num_rel", "num_rel_ret", "num_nonrel_judged_ret", "map", "Rprec",
                     "bpref", "recip_rank", "ndcg", "ndcg_rel", "P_5", "recall_5", "F1_5",
                     "success_5", "map_cut_5", "dcg_cut_5", "ndcg_cut_5", "iprec_at_recall_0.50"]
    with pytest.raises(ValueError):
        RetrievalConfig(ks=(0,))


# ---------------------------------------------------------------------------------------------
# Id encoding


def check_codes(strings: list[str], cut: int) -> None:
    """sorted_codes of strings split at cut into a string and a large_string part: codes in the
    bytes' order, and each distinct string's first place."""
    first_part = pa.array(strings[:cut], pa.string())
    second_part = pa.chunked_array([pa.array(strings[cut:], pa.large_string())])
    (a, b), first = sorted_codes(first_part, second_part)
    distinct = sorted({s.encode() for s in strings})
    assert np.r_[a, b].tolist() == [distinct.index(s.encode()) for s in strings]
    assert [strings[i].encode() for i in first] == distinct


@pytest.mark.parametrize("seed", range(4))
def test_sorted_codes_order_like_bytes(seed):
    rng = np.random.default_rng(seed)
    alphabet = ["a", "b", "\x00", "é", "Z", "0", "9", "-", "\U0001F600"]
    for _ in range(60):
        prefix = "".join(rng.choice(alphabet, int(rng.integers(0, 12))))
        strings = [prefix + "".join(rng.choice(alphabet[: int(rng.integers(1, 10))],
                                               int(rng.integers(0, 20))))
                   for _ in range(int(rng.integers(1, 50)))]
        strings += list(rng.choice(strings, 10))
        cut = int(rng.integers(0, len(strings)))
        check_codes(strings, cut)


def test_long_ids_order_like_bytes_and_share_prefixes_exactly():
    # Ids past MAX_ID_WORDS words (ranked by Arrow) among short ones: the same codes as the bytes'
    # order, whatever the prefix they share, where they differ or whether they hold a 0 byte.
    rng = np.random.default_rng(7)
    base = "x" * 300
    strings = [base, base + "\x00", base + "a", base[:299] + "a", "x", "", "y" * 5000,
               base[:260] + "\x00" + base[261:], "x" * 1000, "xx", "x" * 300 + "é", base, "x" * 1000]
    strings += ["x" * int(rng.integers(0, 700)) + rng.choice(["", "a", "\x00"]) for _ in range(40)]
    for cut in (0, 5, len(strings)):
        check_codes(strings, cut)
    for group in (strings, [base, base + "a"], ["d" * 5000, "d" * 4999 + "e"], [base, base], ["a", ""]):
        expected = len(os.path.commonprefix([s.encode() for s in group]))
        assert common_prefix([pa.array(group[:1]), pa.array(group[1:])]) == expected


def test_one_long_id_costs_a_bounded_number_of_words(monkeypatch):
    # One 1 MB doc id, alone in its query's shard or among short ids: reading it as 8-byte words
    # took one Python step per word (47 s a run for 1 MB, unbounded for 50 MB). Now it costs a
    # bounded number of words, and the codes and duplicates are still exact.
    read = []

    def counted(strings, width, skip=0, rows_at_once=1 << 16):
        read.append(width)
        return rows.iter_string_words(strings, width, skip, rows_at_once)

    monkeypatch.setattr(kernel, "iter_string_words", counted)
    long_id = "d" * (1 << 20)
    ids = encode_ids(["qlong"], [long_id], ["qlong"], [long_id])
    assert ids.qrels_doc.tolist() == [0] and ids.run_doc.tolist() == [0] and ids.n_docs == 1
    docs = [f"doc{i}" for i in range(50)]
    ids = encode_ids(["q"] * 51, docs + [long_id], ["q"] * 51, [long_id] + docs)
    order = sorted(docs + [long_id])  # "d" * 2**20 < "doc0" < "doc1" < "doc10" < ...
    assert ids.qrels_doc.tolist() == [order.index(d) for d in docs + [long_id]]
    assert ids.run_doc.tolist() == [order.index(d) for d in [long_id] + docs]
    assert sum(read) <= 100
    hashed_words = []
    real = rows.iter_string_words
    monkeypatch.setattr(rows, "iter_string_words",
                        lambda strings, width, *a: hashed_words.append(width) or real(strings, width, *a))
    groups = rows.duplicate_groups(pa.array(["q", "q", "q", "q"]),
                                   pa.array([long_id, long_id[:-1] + "e", "doc1", long_id]))
    assert [g.tolist() for g in groups] == [[0, 3]]
    assert sum(hashed_words) <= 2 * rows.MAX_ID_WORDS


def test_encode_ids_shares_codes_between_qrels_and_run():
    ids = encode_ids(["q2", "q10"], ["doc-b", "doc-a"], np.array(["q10", "q3"]),
                     pa.chunked_array([pa.array(["doc-a", "doc-c"])]))
    assert ids.query_ids.to_pylist() == ["q10", "q2", "q3"]
    assert ids.qrels_query.tolist() == [1, 0] and ids.run_query.tolist() == [0, 2]
    assert ids.qrels_doc.tolist() == [1, 0] and ids.run_doc.tolist() == [0, 2]
    assert ids.n_docs == 3


# ---------------------------------------------------------------------------------------------
# Readers

TREC_QRELS = (b"q1 0 d1 1\n"
              b"\n"
              b"q1\t0  d2   2  \r\n"
              b"  q2 0 d1 -1\n"
              b"q2 0 d3 0\t\n")


def test_trec_qrels_messy_whitespace():
    cols, rejects = read_qrels(TREC_QRELS, "trec")
    assert rejects == []
    assert cols.query.to_pylist() == ["q1", "q1", "q2", "q2"]
    assert cols.doc.to_pylist() == ["d1", "d2", "d1", "d3"]
    assert cols.relevance.tolist() == [1, 2, -1, 0]
    assert cols.line.tolist() == [1, 3, 4, 5]


def test_trec_run_messy_whitespace_and_extra_fields():
    data = (b"q1 Q0 d1 1 2.5 run\n"
            b"\n"
            b"q1\tQ0\td2\t2\t-1e-3\trun\n"
            b"q1 Q0 d3  3   +4 run  trailing junk \n"
            b"   \n"
            b"q2 Q0 d1 1 0 run")
    cols, rejects = read_run(data, "trec")
    assert rejects == []
    assert cols.query.to_pylist() == ["q1", "q1", "q1", "q2"]
    assert cols.doc.to_pylist() == ["d1", "d2", "d3", "d1"]
    assert cols.score.tolist() == [2.5, -0.001, 4.0, 0.0]
    assert cols.line.tolist() == [1, 3, 4, 6]


def test_trec_rejects_with_line_numbers():
    qrels = (b"q1 0 d1 1\n"
             b"q1 0 d2\n"
             b"q1 0 d3 1 extra\n"
             b"q1 0 d4 1.5\n"
             b"q1 0 d5 high\n"
             b"q1 0 d6 1_0\n"
             b"q1 0 d\xff 1\n"
             b"q1 0 d7 99999999999999999999\n"
             b"q1 0 d1 0\n"
             b"q1 0 d8 2\n")
    cols, rejects = read_qrels(qrels, "trec")
    assert cols.doc.to_pylist() == ["d8"] and cols.line.tolist() == [10]
    duplicate = "duplicate (query, doc) pair ('q1', 'd1') on lines 1, 9"
    assert rejects == [
        (1, duplicate),
        (2, "expected 4 fields (query iter doc relevance), found 3"),
        (3, "expected 4 fields (query iter doc relevance), found 5"),
        (4, "relevance '1.5' is not an integer"),
        (5, "relevance 'high' is not an integer"),
        (6, "relevance '1_0' is not an integer"),
        (7, "query or doc id is not valid UTF-8"),
        (8, "relevance '99999999999999999999' is out of range"),
        (9, duplicate),
    ]
    run = (b"q1 Q0 d1 1 1.0 t\n"
           b"q1 Q0 d2 2 1.0\n"
           b"q1 Q0 d3 3 abc t\n"
           b"q1 Q0 d4 4 nan t\n"
           b"q1 Q0 d5 5 -inf t\n"
           b"q1 Q0 d6 6 1e999 t\n"
           b"q1 Q0 d1 7 0.5 t\n"
           b"q1 Q0 d1 8 0.2 t\n"
           b"q2 Q0 d1 1 0.1 t\n")
    cols, rejects = read_run(run, "trec")
    assert cols.query.to_pylist() == ["q2"] and cols.line.tolist() == [9]
    duplicate = "duplicate (query, doc) pair ('q1', 'd1') on lines 1, 7, 8"
    assert rejects == [
        (1, duplicate),
        (2, "expected at least 6 fields (query Q0 doc rank score tag), found 5"),
        (3, "score 'abc' is not a number"),
        (4, "score nan is not finite"),
        (5, "score -inf is not finite"),
        (6, "score inf is not finite"),
        (7, duplicate),
        (8, duplicate),
    ]


def test_jsonl_rows_and_rejects():
    lines = [
        {"query_id": "q1", "doc_id": "d1", "relevance": 2, "metadata": {"judge": "x", "n": [1]}},
        "",
        {"query_id": "q1", "doc_id": "d2", "relevance": -1},
        "{not json",
        "[1, 2]",
        {"doc_id": "d3", "relevance": 1},
        {"query_id": 7, "doc_id": "d3", "relevance": 1},
        {"query_id": "q1", "doc_id": "", "relevance": 1},
        {"query_id": "q1", "doc_id": "d4", "relevance": 1.5},
        {"query_id": "q1", "doc_id": "d5", "relevance": True},
        {"query_id": "q1", "doc_id": "d6"},
        {"query_id": "q1", "doc_id": "d2", "relevance": 0},
        "   ",
    ]
    data = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines).encode()
    cols, rejects = read_qrels(data, "jsonl")
    assert cols.doc.to_pylist() == ["d1"] and cols.relevance.tolist() == [2] and cols.line.tolist() == [1]
    duplicate = "duplicate (query, doc) pair ('q1', 'd2') on lines 3, 12"
    assert [r[0] for r in rejects] == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert rejects[0] == (3, duplicate) and rejects[-1] == (12, duplicate)
    assert rejects[1][1].startswith("malformed JSON")
    assert rejects[2:9] == [(5, "row must be a JSON object"), (6, "missing query_id"),
                            (7, "query_id must be a string, got int"), (8, "empty doc_id"),
                            (9, "relevance 1.5 is not an integer"),
                            (10, "relevance True is not an integer"), (11, "missing relevance")]
    run_lines = [
        {"query_id": "q1", "doc_id": "d1", "score": 3},
        {"query_id": "q1", "doc_id": "d2", "score": 0.25, "extra": [1]},
        '{"query_id": "q1", "doc_id": "d3", "score": NaN}',
        {"query_id": "q1", "doc_id": "d4", "score": "1"},
        {"query_id": "q1", "doc_id": "d5", "score": False},
        {"query_id": "q1", "doc_id": "d6"},
        '{"query_id": "q1", "doc_id": "d7", "score": 1e999}',
    ]
    data = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in run_lines).encode()
    cols, rejects = read_run(data, "jsonl")
    assert cols.doc.to_pylist() == ["d1", "d2"] and cols.score.tolist() == [3.0, 0.25]
    assert rejects == [(3, "score nan is not finite"), (4, "score '1' is not a number"),
                       (5, "score False is not a number"), (6, "missing score"),
                       (7, "score inf is not finite")]


def messy_trec_run(rng, n_lines: int) -> bytes:
    separators = [" ", "\t", "  ", " \t "]
    out = []
    for i in range(n_lines):
        kind = rng.integers(0, 20)
        if kind == 0:
            out.append("")
            continue
        fields = [f"q{rng.integers(0, 5)}", "Q0", f"d{rng.integers(0, 300)}", str(i),
                  repr(float(rng.normal())), "tag"]
        if kind == 1:
            fields = fields[:4]
        elif kind == 2:
            fields[4] = "nan"
        elif kind == 3:
            fields.append("junk")
        sep = separators[int(rng.integers(0, 4))] if rng.integers(0, 4) == 0 else " "
        out.append(sep.join(fields) + (" " if kind == 4 else ""))
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("fmt", ["trec", "jsonl"])
def test_fast_and_slow_paths_agree_across_blocks(monkeypatch, fmt):
    """Small blocks mix the Arrow path and the line-by-line path in one file: columns, lines
    and rejects must be those of the line-by-line reader alone."""
    rng = np.random.default_rng(7)
    if fmt == "trec":
        # Mostly clean, single-space lines, with a few messy blocks.
        clean = b"".join(f"q{i // 50} Q0 d{i % 97} {i} {rng.normal()!r} t\n".encode() for i in range(2000))
        data = clean[:30000] + messy_trec_run(rng, 200) + clean[30000:]
    else:
        rows_ = [json.dumps({"query_id": f"q{i // 50}", "doc_id": f"d{i % 97}", "score": float(rng.normal())})
                 for i in range(2000)]
        rows_[500:510] = ['{"query_id": "q1", "doc_id": 5, "score": 1}', ""] * 5
        data = ("\n".join(rows_) + "\n").encode()
    monkeypatch.setattr(rows, "BLOCK_BYTES", 4096)
    fast_cols, fast_rejects = read_run(data, fmt)
    monkeypatch.setattr(rows, "_trec_fast", lambda *args: None)
    monkeypatch.setattr(rows, "_jsonl_fast", lambda *args: None)
    slow_cols, slow_rejects = read_run(data, fmt)
    assert fast_rejects == slow_rejects and len(fast_rejects) > 0
    assert fast_cols.query.to_pylist() == slow_cols.query.to_pylist()
    assert fast_cols.doc.to_pylist() == slow_cols.doc.to_pylist()
    assert fast_cols.score.tolist() == slow_cols.score.tolist()
    assert fast_cols.line.tolist() == slow_cols.line.tolist()
    assert len(fast_cols) + len(fast_rejects) > 1900


def test_fast_path_is_taken_on_clean_input(monkeypatch):
    calls = []
    slow = rows._trec_slow
    monkeypatch.setattr(rows, "_trec_slow", lambda *args: calls.append(1) or slow(*args))
    data = b"".join(f"q{i % 7} Q0 d{i} {i} {i / 3!r} t\n".encode() for i in range(1000))
    cols, rejects = read_run(data, "trec")
    assert len(cols) == 1000 and rejects == [] and calls == []
    tabs, _ = read_run(data.replace(b" ", b"\t"), "trec")
    assert calls == [] and tabs.score.tolist() == cols.score.tolist()
    read_run(data.replace(b"\n", b"\r\n"), "trec")
    assert calls == []


def test_a_double_space_is_not_an_empty_field():
    """"q1 Q0  3 1.5 t" has 5 fields, but splitting on single spaces finds 6, one empty."""
    run = b"q1 Q0 d1 1 2.0 t\nq1 Q0  3 1.5 t\nq1 Q0 d2 3 1.0 t\n"
    cols, rejects = read_run(run, "trec")
    assert cols.doc.to_pylist() == ["d1", "d2"]
    assert rejects == [(2, "expected at least 6 fields (query Q0 doc rank score tag), found 5")]
    cols, rejects = read_qrels(b"q1 0 d1 1\nq1  d2 1\n", "trec")
    assert cols.doc.to_pylist() == ["d1"]
    assert rejects == [(2, "expected 4 fields (query iter doc relevance), found 3")]


def test_readers_feed_the_kernel():
    qrels = b"q1 0 a 1\nq1 0 b 0\nq2 0 c 2\n"
    run_trec = b"q1 Q0 b 1 2.0 t\nq1 Q0 a 2 1.0 t\nq2 Q0 c 1 5 t\nq3 Q0 a 1 1 t\n"
    run_jsonl = b"".join(json.dumps({"query_id": q, "doc_id": d, "score": s}).encode() + b"\n"
                         for q, d, s in [("q1", "b", 2.0), ("q1", "a", 1.0), ("q2", "c", 5), ("q3", "a", 1)])
    qrels_cols, _ = read_qrels(qrels, "trec")
    results = []
    for data, fmt in [(run_trec, "trec"), (run_jsonl, "jsonl")]:
        run_cols, rejects = read_run(data, fmt)
        assert rejects == []
        results.append(evaluate_columns(qrels_cols, run_cols, RetrievalConfig(ks=(1,))))
    (queries, values), (queries2, values2) = results
    assert queries == queries2 == ["q1", "q2"]
    assert values["recip_rank"].tolist() == [0.5, 1.0]
    assert all(np.array_equal(values[m], values2[m]) for m in values)
    assert rows.format_of("run.jsonl") == "jsonl" and rows.format_of("run.txt") == "trec"
    with pytest.raises(ValueError):
        read_run(run_trec, "csv")
