"""Retrieval intervals (issue 16): a replicate's measure is the measure of the dataset in which
each query appears w times under new query ids (pytrec_eval on that dataset, and evalbeam's own
point computation on it), its sums are exact however the queries are split, the Hit records are
proportions of queries, and the command's intervals are numpy's percentiles of replicate values
recomputed here, the same for any shard count, input order and runner mode."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.transforms.kernels.bootstrap import PROPORTION, REPLICATES, Bootstrap
from evalbeam.transforms.kernels.exact_sum import total_value, weighted_exact_totals, weighted_totals
from evalbeam.transforms.kernels.retrieval import (FAMILIES, SINGLE, RetrievalConfig,
                                                   RetrievalState, state_records)
from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from test_retrieval_kernel import KS, evaluate_dicts, random_case

PYTREC = {"P", "recall", "success", "map_cut", "ndcg_cut", "map", "ndcg", "recip_rank", "Rprec"}


def weights_of(query_ids: list[str], bootstrap: Bootstrap) -> np.ndarray:
    return bootstrap.weights(fnv1a_64(pa.array(query_ids, pa.string())))


def kernel_state(qrels: dict, run: dict, config: RetrievalConfig, bootstrap: Bootstrap | None,
                 keep=None) -> RetrievalState:
    """The state MatchRetrieval builds for one model and the whole set (or the queries `keep`)."""
    ids, codes, values = evaluate_dicts(qrels, run, config)
    query_ids = ids.query_ids.take(pa.array(codes, pa.int64()))
    index = np.arange(codes.size) if keep is None else \
        np.array([i for i, q in enumerate(query_ids.to_pylist()) if q in keep], np.int64)
    weights = None if bootstrap is None else bootstrap.weights(fnv1a_64(query_ids))
    return RetrievalState().add_queries(values, index, weights)


def repeated(cases: dict, weights: np.ndarray, ids: list[str]) -> dict:
    """{query: docs} with query q copied w(q) times as q#0, q#1, ..."""
    w = dict(zip(ids, weights.tolist()))
    return {f"{q}#{j}": docs for q, docs in cases.items() for j in range(w.get(q, 0))}


def by_measure(records) -> dict:
    """{measure name: record} of the measure records."""
    names = {}
    for record in records:
        if record["type"] == "Queries":
            continue
        params = record["parameters"]
        names[(record["type"], params.get("k"))] = record
    return names


def measure_of(kind: str, k) -> str:
    """trec_eval's name of a record (record_of the other way round)."""
    if k is None:
        return next(name for name, single in SINGLE.items() if single == kind)
    return next(f"{family}_{k}" for family, name in FAMILIES.items() if name == kind)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("level, complete", [(1, False), (2, False), (1, True)])
def test_replicates_equal_the_measures_of_the_repeated_queries(seed, level, complete):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels, run = random_case(seed)
    config = RetrievalConfig(ks=KS, relevance_level=level, iprec_rounding="legacy", complete=complete)
    bootstrap = Bootstrap(24, seed=seed + 100)
    records = list(state_records(kernel_state(qrels, run, config, bootstrap), config))
    point = list(state_records(kernel_state(qrels, run, config, None), config))
    assert [{k: v for k, v in r.items() if k not in (REPLICATES, PROPORTION)} for r in records] == point
    ids = sorted(set(qrels) | set(run))
    weights = weights_of(ids, bootstrap)
    measures = by_measure(records)
    compared = 0
    for r in range(bootstrap.replicates):
        dup_qrels, dup_run = repeated(qrels, weights[r], ids), repeated(run, weights[r], ids)
        own = by_measure(state_records(kernel_state(dup_qrels, dup_run, config, None), config))
        evaluated = [q for q in dup_qrels if complete or q in dup_run]
        names = "P.{0} recall.{0} success.{0} map_cut.{0} ndcg_cut.{0}".format(",".join(map(str, KS))).split()
        expected = pytrec_eval.RelevanceEvaluator(
            dup_qrels, set(names) | {"map", "ndcg", "recip_rank", "Rprec"}, relevance_level=level).evaluate(dup_run)
        for key, record in measures.items():
            value = record[REPLICATES][r]
            if not evaluated:
                assert value is None
                continue
            # evalbeam's own measure of the repeated dataset: the same bits
            assert value == own[key]["value"], (r, key)
            name = measure_of(*key)
            if name.rpartition("_")[0] in PYTREC or name in PYTREC:
                # pytrec_eval's per-query values, averaged exactly (-c: missing queries score 0)
                total = math.fsum(expected[q][name] for q in evaluated if q in expected)
                assert value == pytest.approx(total / len(evaluated), abs=1e-12, rel=0), (r, key)
                compared += 1
    assert compared >= bootstrap.replicates * 20
    hit = measures[("Hit", 10)]
    queries = next(r["value"] for r in records if r["type"] == "Queries")
    assert hit[PROPORTION] == [round(hit["value"] * queries), queries]
    assert all(PROPORTION not in r for key, r in measures.items() if key[0] != "Hit")


def test_single_query_and_empty_replicates():
    """One query: a replicate without it has no value (None); the others give the query's own
    value. A state of no query has None everywhere and a 0/0 proportion."""
    qrels = {"only": {"a": 1, "b": 0}}
    run = {"only": {"a": 0.5, "b": 0.9, "c": 0.1}}
    config = RetrievalConfig(ks=(1, 2))
    bootstrap = Bootstrap(40, seed=1)
    w = weights_of(["only"], bootstrap)[:, 0]
    assert (w == 0).any() and (w > 0).any()
    records = by_measure(state_records(kernel_state(qrels, run, config, bootstrap), config))
    assert records[("MRR", None)][REPLICATES] == [None if x == 0 else 0.5 for x in w]
    assert records[("Hit", 1)][PROPORTION] == [0, 1] and records[("Hit", 2)][PROPORTION] == [1, 1]
    empty = by_measure(state_records(kernel_state(qrels, run, config, bootstrap, keep=set()), config))
    assert all(v is None for r in empty.values() for v in r[REPLICATES])
    assert empty[("Hit", 1)][PROPORTION] == [0, 0]


@pytest.mark.parametrize("seed", range(3))
def test_replicate_sums_are_exact_and_merge_in_any_split(seed):
    rng = np.random.default_rng(seed)
    n = 500
    values = np.stack([rng.random(n), rng.integers(0, 4, n) / 3.0, np.zeros(n),
                       rng.random(n) * np.exp(rng.normal(0, 20, n)),    # exponents far apart
                       np.where(rng.random(n) < 0.3, 1.0, 0.0), -rng.random(n)], axis=1)
    weights = Bootstrap(16, seed=seed).weights(rng.integers(0, 2 ** 63, n).astype(np.uint64))
    sums = weighted_totals(values, weights)
    for j in range(values.shape[1]):
        slow = weighted_exact_totals(values[:, j], weights)
        for r in range(weights.shape[0]):
            exact = sum((Fraction(float(v)) * int(x) for v, x in zip(values[:, j], weights[r])), Fraction(0))
            assert sum(Fraction(s) * Fraction(2) ** e for e, s in sums[j][r].items()) == exact
            assert total_value(sums[j][r]) == total_value(slow[r])
    # states of any split of the queries merge into the same replicate means
    names = [f"P_{k}" for k in (1, 2, 3)] + ["map"]
    per_query = {name: values[:, i] for i, name in enumerate(names)}
    whole = RetrievalState().add_queries(per_query, np.arange(n), weights)
    order = rng.permutation(n)
    parts = [RetrievalState().add_queries(per_query, np.sort(part), weights)
             for part in np.array_split(order, 7)]
    merged = parts[3].copy()
    for part in parts[:3] + parts[4:]:
        merged.merge(part)
    config = RetrievalConfig(ks=(1, 2, 3))
    assert list(state_records(merged, config)) == list(state_records(whole, config))


# ----------------------------------------------------------------------------- the command


def run_retrieval(*args) -> int:
    from evalbeam.pipelines.tasks.retrieval import run

    return run([str(a) for a in args])


def write_case(folder, seed: int):
    """JSONL qrels (with a "half" metadata key) and two runs of random_case; run "b" answers
    fewer queries."""
    qrels, run = random_case(seed)
    other_qrels, other_run = random_case(seed + 50)
    qrels.update({f"x{q}": docs for q, docs in other_qrels.items()})
    run.update({f"x{q}": docs for q, docs in other_run.items()})
    rows = [{"query_id": q, "doc_id": d, "relevance": v, "metadata": {"half": q < "q4"}}
            for q, docs in qrels.items() for d, v in docs.items()]
    write_jsonl(folder / "qrels.jsonl", rows)
    write_jsonl(folder / "qrels_reversed.jsonl", rows[::-1])
    write_jsonl(folder / "a.jsonl", [{"query_id": q, "doc_id": d, "score": s}
                                     for q, docs in run.items() for d, s in docs.items()])
    b = {q: {d: -s for d, s in docs.items()} for q, docs in run.items() if q not in ("q1", "xq2")}
    write_jsonl(folder / "b.jsonl", [{"query_id": q, "doc_id": d, "score": s}
                                     for q, docs in b.items() for d, s in docs.items()])
    return qrels, {"a": run, "b": b}


@pytest.mark.multiprocess
def test_command_intervals_are_percentiles_and_do_not_depend_on_sharding(tmp_path):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels, runs = write_case(tmp_path, 3)
    common = ["--predictions", f"a={tmp_path / 'a.jsonl'}", "--predictions", f"b={tmp_path / 'b.jsonl'}",
              "--quiet", "--slice", "half", "--k", "1,3,5,10,100"]
    boot = ["--bootstrap", "20", "--bootstrap_seed", "3"]
    outputs = []
    for name, gt, extra in (("one", "qrels.jsonl", ["--num_shards", "1", *boot]),
                            ("seven", "qrels_reversed.jsonl", ["--num_shards", "7", *boot]),
                            ("multi", "qrels.jsonl", ["--num_shards", "3", *boot, *MULTIPROCESS]),
                            ("off", "qrels.jsonl", [])):
        assert run_retrieval("--groundtruths", tmp_path / gt, "--output", tmp_path / name, *common, *extra) == 0
        outputs.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    found = read_jsonl(tmp_path / "one" / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if k not in ("interval", "wilson")} for r in found] == \
        read_jsonl(tmp_path / "off" / "metrics.jsonl")
    bootstrap = Bootstrap(20, seed=3)
    checked = 0
    for model, run in runs.items():
        per_query = pytrec_eval.RelevanceEvaluator(
            qrels, {"P.1,3,5,10,100", "success.1,3,5,10,100", "map", "recip_rank", "ndcg_cut.10"}).evaluate(run)
        for record in found:
            if record["model"] != model:
                continue
            if record["type"] == "Queries":
                assert "interval" not in record and "wilson" not in record
                continue
            name = measure_of(record["type"], record["parameters"].get("k"))
            if name not in next(iter(per_query.values())):
                continue
            half = record["slice"].get("half")
            queries = sorted(q for q in per_query if half is None or (q < "q4") == half)
            weights = weights_of(queries, bootstrap)
            replicates = []
            for r in range(bootstrap.replicates):
                if weights[r].sum():
                    total = sum((Fraction(per_query[q][name]) * int(w) for q, w in zip(queries, weights[r])),
                                Fraction(0))
                    replicates.append(float(total / int(weights[r].sum())))
            interval = record["interval"]
            assert interval["unit"] == "query" and interval["replicates"] == len(replicates)
            low, high = np.percentile(replicates, [2.5, 97.5])
            assert interval["low"] == pytest.approx(low, abs=1e-12, rel=0), (model, name)
            assert interval["high"] == pytest.approx(high, abs=1e-12, rel=0), (model, name)
            if record["type"] == "Hit":
                hits = sum(int(per_query[q][name]) for q in queries)
                assert {k: record["wilson"][k] for k in ("successes", "trials")} == \
                    {"successes": hits, "trials": len(queries)}
            else:
                assert "wilson" not in record
            checked += 1
    assert checked == 2 * 3 * 13


def test_rows_api_gives_the_command_records_and_comparisons(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from evalbeam.pipelines.launch.common import local_pipeline
    from evalbeam.transforms.retrieval import EvaluateRetrieval

    write_case(tmp_path, 6)
    assert run_retrieval("--groundtruths", tmp_path / "qrels.jsonl", "--predictions", f"a={tmp_path / 'a.jsonl'}",
                         "--predictions", f"b={tmp_path / 'b.jsonl'}", "--output", tmp_path / "out",
                         "--quiet", "--slice", "half", "--bootstrap", "15", "--bootstrap_seed", "2",
                         "--compare_to", "a") == 0
    expected = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    comparisons = [r for r in expected if r["type"] == "Comparison"]
    assert comparisons and {r["model"] for r in comparisons} == {"b"}
    overall = next(r for r in comparisons if r["parameters"]["metric"] == "MAP" and r["slice"] == {})
    # 16 qrels queries (q7 and xq7 are only in the runs); a answers all but q5 and xq5, b
    # also lacks q1 and xq2
    assert {k: overall["comparison"][k] for k in ("datums", "datums_both", "model_lacks", "baseline_lacks")} == \
        {"datums": 16, "datums_both": 12, "model_lacks": 4, "baseline_lacks": 2}
    assert overall["comparison"]["test"] == "paired bootstrap"

    def canonical(records):
        return sorted(json.dumps(r, sort_keys=True) for r in records)

    with local_pipeline() as p:
        pcolls = {name: p | name >> beam.Create(read_jsonl(tmp_path / f"{file}.jsonl"))
                  for name, file in (("groundtruths", "qrels"), ("a", "a"), ("b", "b"))}
        records = pcolls | EvaluateRetrieval(RetrievalConfig(), slices=[("half",)], num_shards=4,
                                             bootstrap=Bootstrap(15, seed=2), compare_to="a")

        def same_as_command(found):
            assert canonical(found) == canonical(expected)

        assert_that(records, same_as_command)


def test_bootstrap_off_changes_nothing():
    qrels, run = random_case(1)
    config = RetrievalConfig(ks=KS)
    state = kernel_state(qrels, run, config, Bootstrap(0))
    assert state.replicate_totals is None
    assert all(REPLICATES not in r and PROPORTION not in r for r in state_records(state, config))
    assert replace(config) == config
