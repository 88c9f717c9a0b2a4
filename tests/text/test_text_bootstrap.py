"""Bootstrap intervals of the text metrics (issue 16): each replicate of ROUGE, BLEU, CorpusBLEU,
the rule evaluators and the judge metrics equals the metric of the dataset in which every datum
appears w times (rouge-score, nltk, sacreBLEU, and evalbeam's own point path on that dataset),
whatever the shards; the CLI gives the same intervals for any shard count, input order and
runner, with the point values of a run without --bootstrap; rule outcomes and presence for the
paired comparisons."""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pyarrow as pa
import pytest

from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.schemas.text_rows import GroundTruthRow, PredictionRow
from evalbeam.transforms.kernels.bootstrap import PROPORTION, REPLICATES, Bootstrap
from evalbeam.transforms.kernels.judge_state import JudgeMetricState
from evalbeam.transforms.kernels.text import TextConfig, TextState, score_datum, state_records
from evalbeam.transforms.kernels.text_overlap import valor_tokens

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "café", "東京",
         "revenue", "was", "15,969", "million", "$100", "3.14", "don't", "Brazil"]
RULES = ("TextMatching", "PIILeakage", "SensitiveDataLeakage", "EncodingGuardrail", "LoopingDetection")
OVERLAP = ("ROUGE", "BLEU", "CorpusBLEU")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def run_text(*args) -> int:
    from evalbeam.pipelines.tasks.text import run

    return run([str(a) for a in args])


def make_datums(seed: int, n: int = 40):
    """[(GroundTruthRow, PredictionRow or None)]: some datums without references or prediction,
    repeated (tied) responses, empty and multi-line texts, PII, loops, conditions, contexts."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14)))
                for _ in range(rng.choice([0, 1, 1, 2, 3]))]
        if i % 11 == 5 and refs:
            refs[0] += "\nand a second line"
        condition = rng.choice([None, '"cat"', '"Brazil" OR regexp("15,?969")'])
        truth = GroundTruthRow(f"d{i:03d}", i, 0, query="what?", references=refs, condition=condition,
                               slices={"g": json.dumps("xy"[i % 2])})
        r = rng.random()
        if r < 0.1:
            prediction = None
        else:
            if r < 0.25 and refs:
                text = refs[0]                                     # ties: equal texts score equally
            elif r < 0.3:
                text = ""
            else:
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
            if rng.random() < 0.1:
                text += " mail jo@example.org"
            if rng.random() < 0.1:
                text = "I repeat myself here again. " * 6
            contexts = None
            if rng.random() < 0.5:
                contexts = [rng.choice(["cat facts", "call 555-123-4567", "Brazil 15,969"])]
            prediction = PredictionRow(truth.uid, i, 0, response=text, contexts=contexts)
        out.append((truth, prediction))
    return out


def bootstrapped_state(datums, config, bootstrap, shards: int, seed: int = 0) -> TextState:
    """Datums split at random into shards; each shard scored with its bootstrap columns and
    sealed, then the shard states merged in a random order (as Match and MergeStates do)."""
    rng = random.Random(seed)
    parts = [[] for _ in range(shards)]
    for datum in datums:
        parts[rng.randrange(shards)].append(datum)
    states = []
    for part in parts:
        part.sort(key=lambda d: d[0].uid)
        state = TextState()
        weights = bootstrap.weights(fnv1a_64(pa.array([t.uid for t, _ in part], pa.string())))
        for column, (truth, prediction) in enumerate(part):
            score_datum(config, truth, prediction, "m", [state], column)
        states.append(state.seal(weights))
    rng.shuffle(states)
    merged = states[0].copy()
    for state in states[1:]:
        merged.merge(state)
    return merged


def weights_of(datums, bootstrap) -> np.ndarray:
    """uint8[R, n] of the datums in their order."""
    return bootstrap.weights(fnv1a_64(pa.array([t.uid for t, _ in datums], pa.string())))


def point_records(datums, config, repeats=None) -> list[dict]:
    """state_records of the plain (not bootstrapped) state of the datums, datum i added
    repeats[i] times: the metric of the duplicated dataset by evalbeam's point path."""
    state = TextState()
    for i, (truth, prediction) in enumerate(datums):
        for _ in range(1 if repeats is None else int(repeats[i])):
            score_datum(config, truth, prediction, "m", [state])
    return state_records(state, config)


def by_identity(records):
    return {(r["type"], json.dumps(r["parameters"], sort_keys=True)): r for r in records}


def reference_overlap(datums, repeats):
    """rouge-score, nltk and sacreBLEU on the dataset where datum i appears repeats[i] times
    (datums with references only; a missing prediction is an empty response)."""
    import sacrebleu
    from nltk.translate import bleu_score
    from rouge_score.rouge_scorer import RougeScorer

    scorer = RougeScorer(list(ROUGE_TYPES))
    rouge = {t: [] for t in ROUGE_TYPES}
    bleu, hyps, refs = [], [], []
    for (truth, prediction), w in zip(datums, repeats):
        if not truth.references:
            continue
        response = prediction.response if prediction is not None else ""
        scores = scorer.score_multi(truth.references, response)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b = bleu_score.sentence_bleu([valor_tokens(r) for r in truth.references], valor_tokens(response))
        for _ in range(int(w)):
            for t in ROUGE_TYPES:
                rouge[t].append((scores[t].precision, scores[t].recall, scores[t].fmeasure))
            bleu.append(b if b >= 1e-9 else 0.0)
            hyps.append(response)
            refs.append(truth.references)
    if not hyps:
        return None
    width = max(len(r) for r in refs)
    corpus = sacrebleu.corpus_bleu(hyps, [[r[i] if i < len(r) else None for r in refs] for i in range(width)])
    return ({t: np.mean(v, axis=0) for t, v in rouge.items()}, float(np.mean(bleu)),
            float(corpus.score), float(corpus.bp))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlap_replicates_equal_the_reference_packages_on_the_duplicated_dataset(seed):
    datums = make_datums(seed)
    config = TextConfig(metrics=frozenset(OVERLAP))
    bootstrap = Bootstrap(12, 0.9, seed * 7 + 1)
    records = by_identity(state_records(bootstrapped_state(datums, config, bootstrap, 4, seed), config))
    weights = weights_of(datums, bootstrap)
    checked = 0
    for r in range(bootstrap.replicates):
        expected = reference_overlap(datums, weights[r])
        if expected is None:
            continue
        rouge, bleu, corpus_score, corpus_bp = expected
        for t in ROUGE_TYPES:
            got = records[("ROUGE", json.dumps({"rouge_type": t, "rouge_use_stemmer": False}, sort_keys=True))]
            for j, field in enumerate(("precision", "recall", "fmeasure")):
                assert got[REPLICATES][field][r] == pytest.approx(rouge[t][j], abs=1e-12)
        bleu_record = next(v for k, v in records.items() if k[0] == "BLEU")
        assert bleu_record[REPLICATES][r] == pytest.approx(bleu, abs=1e-12)
        corpus_record = next(v for k, v in records.items() if k[0] == "CorpusBLEU")
        assert corpus_record[REPLICATES]["score"][r] == pytest.approx(corpus_score, abs=1e-12)
        assert corpus_record[REPLICATES]["bp"][r] == pytest.approx(corpus_bp, abs=1e-12)
        checked += 1
    assert checked == bootstrap.replicates


@pytest.mark.parametrize("seed", [3, 4])
def test_every_replicate_is_the_point_path_on_the_duplicated_dataset_exactly(seed):
    """Bit for bit: replicate r of every field (overlap, rules, looping means) equals the value
    evalbeam computes without bootstrap when datum i is added w[r, i] times; PROPORTION is the
    point numerator and denominator."""
    datums = make_datums(seed, 36)
    config = TextConfig(metrics=frozenset(OVERLAP + RULES))
    bootstrap = Bootstrap(6, 0.95, seed)
    boot = by_identity(state_records(bootstrapped_state(datums, config, bootstrap, 3, seed), config))
    plain = by_identity(point_records(datums, config))
    assert boot.keys() == plain.keys()
    for key, record in boot.items():
        assert record["value"] == plain[key]["value"]       # the point estimate is today's
    weights = weights_of(datums, bootstrap)
    for r in range(bootstrap.replicates):
        duplicated = by_identity(point_records(datums, config, weights[r]))
        for key, record in boot.items():
            replicates, value = record[REPLICATES], duplicated[key]["value"]
            if isinstance(replicates, dict):
                assert replicates, key
                for field, values in replicates.items():
                    assert values[r] == value[field], (key, field, r)
            else:
                assert replicates[r] == value, (key, r)
    for kind in RULES:
        record = boot[(kind, "{}")]
        counts = record["value"]
        assert record[PROPORTION]["pass"] == [round(counts["pass"] * counts["datums"]), counts["datums"]]
        assert set(record[PROPORTION]) <= set(record[REPLICATES])
    assert {"unique_sentences", "compression_ratio"} <= set(boot[("LoopingDetection", "{}")][REPLICATES])


def test_replicates_do_not_depend_on_shards_or_merge_order():
    datums = make_datums(5, 50)
    config = TextConfig(metrics=frozenset(OVERLAP + RULES))
    bootstrap = Bootstrap(10, 0.95, 11)
    runs = [state_records(bootstrapped_state(datums, config, bootstrap, shards, seed), config)
            for shards, seed in ((1, 0), (5, 1), (9, 2))]
    assert runs[0] == runs[1] == runs[2]
    other_seed = state_records(bootstrapped_state(datums, config, Bootstrap(10, 0.95, 12), 1), config)
    assert [r[REPLICATES] for r in other_seed] != [r[REPLICATES] for r in runs[0]]


def test_degenerate_cases():
    config = TextConfig(metrics=frozenset(OVERLAP + ("TextMatching", "PIILeakage")))
    bootstrap = Bootstrap(5, 0.95, 0)
    # no datum has references or a condition: those values are 0 by convention, with no interval
    datums = [(GroundTruthRow(f"u{i}", i, 0), PredictionRow(f"u{i}", i, 0, response="x")) for i in range(4)]
    records = by_identity(state_records(bootstrapped_state(datums, config, bootstrap, 2), config))
    for key, record in records.items():
        if key[0] in OVERLAP:
            assert REPLICATES not in record and record["value"] in (0.0, record["value"])
    assert ("TextMatching", "{}") not in records
    pii = records[("PIILeakage", "{}")]
    assert "retrieval_failure" not in pii[REPLICATES] and "retrieval_failure" not in pii[PROPORTION]
    assert pii[PROPORTION]["pass"] == [4, 4]
    # one datum: replicates where its weight is 0 are undefined, the others are its value
    one = [(GroundTruthRow("only", 0, 0, references=["a b c"]), PredictionRow("only", 0, 0, response="a b"))]
    weights = weights_of(one, Bootstrap(40, 0.95, 0))[:, 0]
    record = by_identity(state_records(bootstrapped_state(one, config, Bootstrap(40, 0.95, 0), 3), config))
    bleu = next(v for k, v in record.items() if k[0] == "BLEU")
    assert 0 in weights and weights.max() > 1
    assert [v is None for v in bleu[REPLICATES]] == list(weights == 0)
    assert {v for v in bleu[REPLICATES] if v is not None} == {bleu["value"]}
    # bootstrap off: no internal field, the records of today
    plain = point_records(make_datums(6, 20), TextConfig(metrics=frozenset(OVERLAP + RULES)))
    assert not any(REPLICATES in r or PROPORTION in r for r in plain)
    state = TextState()
    assert state.replicates == {} and state.replicate_count == 0


def test_judge_metric_replicates_are_weighted_means_over_the_ok_datums():
    rng = np.random.default_rng(0)
    statuses = rng.choice(["ok", "ok", "ok", "timeout", "not_applicable"], 300)
    values = rng.choice([0.0, 0.25, 1 / 3, 0.5, 1.0], 300)
    binary = rng.integers(0, 2, 300).astype(float)
    bootstrap = Bootstrap(25, 0.95, 4)
    hashes = fnv1a_64(pa.array([f"j{i}" for i in range(300)], pa.string()))
    weights = bootstrap.weights(hashes)
    parts = []
    for shard in range(3):
        share = JudgeMetricState("Faithfulness", {"p": 1})
        flags = JudgeMetricState("Sexism", {}, binary=True)
        cols = np.flatnonzero(hashes % np.uint64(3) == shard)
        for column, i in enumerate(cols):
            share.add(values[i] if statuses[i] == "ok" else None, statuses[i], column)
            flags.add(binary[i] if statuses[i] == "ok" else None, statuses[i], column)
        share.seal(weights[:, cols])
        flags.seal(weights[:, cols])
        parts.append((share, flags))
    share, flags = parts[2][0].copy(), parts[2][1].copy()
    for s, f in parts[1::-1]:
        share.merge(s)
        flags.merge(f)
    ok = statuses == "ok"
    (share_record,), (flag_record,) = share.records(), flags.records()
    assert share_record["counts"]["timeout"] == int(np.sum(statuses == "timeout"))   # failures counted
    for r in range(bootstrap.replicates):
        w = weights[r] * ok
        assert share_record[REPLICATES][r] == pytest.approx(np.sum(w * values) / np.sum(w), abs=1e-12)
        assert flag_record[REPLICATES][r] == pytest.approx(np.sum(w * binary) / np.sum(w), abs=1e-12)
    assert flag_record[PROPORTION] == [int(np.sum(binary[ok])), int(ok.sum())]
    assert PROPORTION not in share_record
    nothing_ok = JudgeMetricState("Bias", {})
    nothing_ok.add(None, "timeout", 0)
    nothing_ok.seal(weights[:, :1])
    assert REPLICATES not in nothing_ok.records()[0] and nothing_ok.records()[0]["value"] is None


def test_rule_outcomes_and_presence_for_the_paired_comparisons():
    """MatchText's tagged outputs when comparing: presence per slice and source, and per rule
    evaluator the pass/fail of each datum its rate counts."""
    from evalbeam.transforms.graph import MatchContext
    from evalbeam.transforms.text import TAG_OUTCOMES, TAG_PRESENCE, MatchText

    datums = make_datums(7, 30)
    truths = [t for t, _ in datums]
    preds = [p for _, p in datums if p is not None]
    config = TextConfig(metrics=frozenset({"BLEU", "TextMatching", "PIILeakage"}))
    fn = MatchText(config, MatchContext(("a", "b"), (("g",),), bootstrap=Bootstrap(4, 0.95, 0),
                                        compare=True, presence=True))
    fn.setup()
    fn.start_bundle()
    out = list(fn.process((0, [("groundtruths", truths), ("a", preds), ("b", preds[::2])])))
    tagged = {}
    for item in out:
        if hasattr(item, "tag"):
            tagged.setdefault(item.tag, []).append(item.value)
    hash_of = dict(zip([t.uid for t in truths], fnv1a_64(pa.array([t.uid for t in truths], pa.string()))))
    presence = {(group, source): set(h.tolist()) for group, (source, h) in tagged[TAG_PRESENCE]}
    assert presence[("{}", "groundtruths")] == set(hash_of.values())
    assert presence[("{}", "b")] == {int(hash_of[p.uid]) for p in preds[::2]}
    assert presence[('{"g":"x"}', "a")] == {int(hash_of[p.uid]) for p in preds if int(p.uid[1:]) % 2 == 0}
    outcomes = {(key, model): (h, passed) for key, (model, h, passed) in tagged[TAG_OUTCOMES]}
    identity = json.dumps(["TextMatching", {"field": "pass"}], separators=(",", ":"))
    h, passed = outcomes[((identity, "{}"), "b")]
    with_condition = [t for t in truths if t.condition is not None]
    assert sorted(h.tolist()) == sorted(int(hash_of[t.uid]) for t in with_condition)
    states = dict(item for item in out if not hasattr(item, "tag"))
    counts = states[("b", "{}")].rules["TextMatching"].counts
    assert int(passed.sum()) == counts.passed and passed.size == counts.cases
    # no compare_to: neither output
    fn = MatchText(config, MatchContext(("a",), (), bootstrap=Bootstrap(4, 0.95, 0)))
    fn.setup()
    fn.start_bundle()
    assert not [x for x in fn.process((0, [("groundtruths", truths), ("a", preds)])) if hasattr(x, "tag")
                and x.tag in (TAG_PRESENCE, TAG_OUTCOMES)]


# --------------------------------------------------------------------------------------------
# the CLI

def write_inputs(folder, seed=8, n=60):
    rng = random.Random(seed)
    gt, preds = [], []
    for i in range(n):
        refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
                for _ in range(rng.choice([0, 1, 2]))]
        gt.append({"datum_uid": f"q{i:03d}", "references": refs, "metadata": {"topic": "xy"[i % 2]},
                   **({"condition": '"cat" OR "dog"'} if i % 3 else {})})
        if i % 8:
            base = refs[0].split(" ") if refs else ["nothing"]
            preds.append({"datum_uid": f"q{i:03d}", "response": " ".join(w for w in base if rng.random() < 0.8)})
    shuffled = gt[:]
    rng.shuffle(shuffled)
    write_jsonl(folder / "gt.jsonl", gt)
    write_jsonl(folder / "gt_shuffled.jsonl", shuffled)
    write_jsonl(folder / "m.jsonl", preds)
    write_jsonl(folder / "m_shuffled.jsonl", preds[::-1])


def strip_uncertainty(records):
    return [{k: v for k, v in r.items() if k not in ("interval", "wilson")} for r in records]


def test_cli_intervals_same_for_shards_order_and_runner_and_equal_to_recomputed_percentiles(tmp_path):
    write_inputs(tmp_path)
    metrics = "ROUGE,BLEU,CorpusBLEU,TextMatching"
    base = ["--metrics", metrics, "--slice", "topic", "--quiet"]
    boot = ["--bootstrap", "20", "--bootstrap_seed", "3"]
    runs = {}
    for name, gt, pred, extra in (("one", "gt.jsonl", "m.jsonl", ["--num_shards", "1", *boot]),
                                  ("seven", "gt_shuffled.jsonl", "m_shuffled.jsonl", ["--num_shards", "7", *boot]),
                                  ("multi", "gt.jsonl", "m.jsonl", ["--num_shards", "3", *boot, *MULTIPROCESS]),
                                  ("plain", "gt.jsonl", "m.jsonl", [])):
        assert run_text("--groundtruths", tmp_path / gt, "--predictions", f"m={tmp_path / pred}",
                        "--output", tmp_path / name, *base, *extra) == 0
        runs[name] = (tmp_path / name / "metrics.jsonl").read_bytes()
    assert runs["one"] == runs["seven"] == runs["multi"]
    records = read_jsonl(tmp_path / "one" / "metrics.jsonl")
    assert strip_uncertainty(records) == read_jsonl(tmp_path / "plain" / "metrics.jsonl")
    assert all("interval" not in r for r in read_jsonl(tmp_path / "plain" / "metrics.jsonl"))
    assert not any(k.startswith("_") for r in records for k in r)

    # recompute from the per-datum scores and the weights of the datum ids
    scores = read_jsonl(tmp_path / "one" / "scores.jsonl")
    truth = {r["datum_uid"]: r for r in read_jsonl(tmp_path / "gt.jsonl")}
    bootstrap = Bootstrap(20, 0.95, 3)
    for topic, slice_value in ((None, {}), ("y", {"topic": "y"})):
        mine = {(r["type"], r["parameters"].get("rouge_type")): r for r in records if r["slice"] == slice_value}

        def per_datum(metric, rouge_type=None):
            rows = [s for s in scores if s["metric"] == metric and s["value"] is not None
                    and s["parameters"].get("rouge_type") == rouge_type
                    and (topic is None or truth[s["datum_uid"]]["metadata"]["topic"] == topic)]
            w = bootstrap.weights(fnv1a_64(pa.array([s["datum_uid"] for s in rows], pa.string())))
            return np.array([s["value"] for s in rows]), w.astype(float)

        def check(interval, replicate_values):
            low, high = np.percentile([v for v in replicate_values if v is not None], [2.5, 97.5])
            assert interval["low"] == pytest.approx(low, abs=1e-12)
            assert interval["high"] == pytest.approx(high, abs=1e-12)
            assert interval["replicates"] == sum(v is not None for v in replicate_values)
            assert interval["unit"] == "datum" and interval["confidence"] == 0.95

        values, w = per_datum("ROUGE", "rougeL")
        check(mine[("ROUGE", "rougeL")]["interval"]["fmeasure"],
              [float(w[r] @ values / w[r].sum()) if w[r].sum() else None for r in range(20)])
        values, w = per_datum("BLEU")
        check(mine[("BLEU", None)]["interval"], [float(w[r] @ values / w[r].sum()) for r in range(20)])
        values, w = per_datum("TextMatching")
        matching = mine[("TextMatching", None)]
        check(matching["interval"]["pass"], [float(w[r] @ values / w[r].sum()) for r in range(20)])
        wilson = matching["wilson"]["pass"]
        assert (wilson["successes"], wilson["trials"]) == (int(values.sum()), values.size)
        from evalbeam.transforms.kernels.bootstrap import wilson_interval

        assert (wilson["low"], wilson["high"]) == wilson_interval(int(values.sum()), values.size, 0.95)
        assert mine[("CorpusBLEU", None)]["interval"]["score"]["replicates"] == 20


def test_cli_compare_to_gives_paired_comparisons_and_counts_missing_datums(tmp_path):
    write_inputs(tmp_path)
    preds = read_jsonl(tmp_path / "m.jsonl")
    write_jsonl(tmp_path / "other.jsonl", [{**p, "response": p["response"] + " cat"} for p in preds[::2]])
    assert run_text("--groundtruths", tmp_path / "gt.jsonl", "--predictions", f"base={tmp_path / 'm.jsonl'}",
                    "--predictions", f"other={tmp_path / 'other.jsonl'}", "--output", tmp_path / "out",
                    "--metrics", "BLEU,TextMatching", "--bootstrap", "30", "--compare_to", "base",
                    "--quiet") == 0
    records = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    comparisons = [r for r in records if r["type"] == "Comparison" and r["slice"] == {}]
    bleu = next(r for r in comparisons if r["parameters"]["metric"] == "BLEU")
    values = {(r["model"], r["type"]): r["value"] for r in records if r["slice"] == {}}
    assert bleu["model"] == "other" and bleu["value"] == values[("other", "BLEU")] - values[("base", "BLEU")]
    assert bleu["comparison"]["datums"] == 60
    assert bleu["comparison"]["model_lacks"] == 60 - len(preds[::2])
    assert bleu["comparison"]["baseline_lacks"] == 60 - len(preds)
    assert 0 < bleu["comparison"]["p_value"] <= 1 and "p_value_adjusted" in bleu["comparison"]


def test_cli_judge_metric_intervals_with_the_stand_in_endpoint(tmp_path):
    """Judge metrics: the interval is the percentile of the replicate means over the datums
    scored ok (recomputed from scores.jsonl and the weights); a verdict metric (Sexism) is a
    share of datums and gets its Wilson interval; failures and not_applicable stay counted."""
    from evalbeam.pipelines.runners.judge_server import StandInServer
    from evalbeam.pipelines.demo.synthetic_rag import write_rag_dataset
    from evalbeam.transforms.kernels.bootstrap import percentile_interval, wilson_interval

    data = write_rag_dataset(str(tmp_path / "data"), 80, seed=2, models=("alpha",))
    with StandInServer() as server:
        assert run_text("--groundtruths", data["groundtruths"], "--predictions", f"alpha={data['alpha']}",
                        "--output", tmp_path / "out", "--metrics", "Faithfulness,Sexism,ContextRelevance",
                        "--judge_url", server.url, "--judge_rpm", "1000000", "--judge_concurrency", "16",
                        "--bootstrap", "20", "--bootstrap_seed", "9", "--confidence", "0.9", "--quiet") == 0
    records = {r["type"]: r for r in read_jsonl(tmp_path / "out" / "metrics.jsonl") if r["slice"] == {}}
    scores = read_jsonl(tmp_path / "out" / "scores.jsonl")
    bootstrap = Bootstrap(20, 0.9, 9)
    for kind in ("Faithfulness", "Sexism", "ContextRelevance"):
        rows = [s for s in scores if s["metric"] == kind]
        ok = [s for s in rows if s["status"] == "ok"]
        assert sum(records[kind]["counts"].values()) == len(rows) == 80
        values = np.array([s["value"] for s in ok])
        w = bootstrap.weights(fnv1a_64(pa.array([s["datum_uid"] for s in ok], pa.string()))).astype(float)
        replicates = [float(w[r] @ values / w[r].sum()) if w[r].sum() else None for r in range(20)]
        low, high, kept = percentile_interval(replicates, 0.9)
        interval = records[kind]["interval"]
        assert interval["low"] == pytest.approx(low, abs=1e-12)
        assert interval["high"] == pytest.approx(high, abs=1e-12)
        assert interval["replicates"] == kept == 20 and interval["confidence"] == 0.9
        if kind == "Sexism":
            k = int(values.sum())
            assert records[kind]["wilson"]["successes"] == k and records[kind]["wilson"]["trials"] == values.size
            wilson = records[kind]["wilson"]
            assert (wilson["low"], wilson["high"]) == wilson_interval(k, values.size, 0.9)
        else:
            assert "wilson" not in records[kind]
