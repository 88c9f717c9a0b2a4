"""The length bounds of the strings that name metric records or that outputs repeat
(schemas/limits.py): label keys and values, detection and segmentation labels, COCO category
names, --label_names, --slice values, datum_uids and retrieval query ids in every task. A row
beyond a bound is rejected with a reason naming the length; its text never reaches a vocabulary,
a category table, a record or rejected.jsonl. Unit tests on the row readers, plus one end-to-end
classification run for the rejected rows, the exit code and the counts."""

from __future__ import annotations

import json
import tracemalloc
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import read_jsonl, run_classification, write_jsonl
from evalbeam.schemas.limits import MAX_LABEL_CHARS, MAX_SLICE_CHARS, MAX_UID_CHARS

LONG = "x" * (MAX_LABEL_CHARS + 1)
FITS = "x" * MAX_LABEL_CHARS
LABEL_REASON = f"label value is {MAX_LABEL_CHARS + 1:,} characters long, more than the limit of 1,024"
SLICE_REASON = "metadata 'region' is longer than 1,024 characters as JSON, the limit for a slice value"
LONG_UID = "u" * (MAX_UID_CHARS + 1)
FITS_UID = "u" * MAX_UID_CHARS
UID_REASON = f"datum_uid is {MAX_UID_CHARS + 1:,} characters long, more than the limit of 4,096 for an id"


def jsonl(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


# ----------------------------------------------------------------------------- the bounds

def test_slice_length_counts_canonical_json_and_stops_early():
    """A slice value is measured as canonical JSON (quotes and escapes count); the exact bound
    passes, one character more does not; a value far beyond it is refused without the text
    being made (a 50 MB string allocates next to nothing)."""
    from evalbeam.schemas.safe_json import slice_value_problem
    from evalbeam.schemas.slices import slice_text

    fits = "a" * (MAX_SLICE_CHARS - 2)                 # plus its two quotes: exactly the bound
    assert slice_text("region", fits) == (json.dumps(fits), None)
    for too_long in (fits + "a", "\n" * 600, ["ab"] * 300, {"k" * 600: "v" * 600}, 10 ** 3000):
        assert slice_value_problem("region", too_long).startswith(SLICE_REASON)
    assert slice_value_problem("region", float("nan")).startswith("metadata 'region' is nan")
    assert slice_value_problem("region", {"a": [1, 2.5, None, True, "eu"]}) is None

    huge = "x" * (50 << 20)
    tracemalloc.start()
    try:
        assert slice_value_problem("region", huge).startswith(SLICE_REASON)
        assert slice_value_problem("region", [huge] * 1000).startswith(SLICE_REASON)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_uid_bound_and_rejected_records_never_carry_a_long_uid():
    from evalbeam.schemas.limits import uid_length_problem
    from evalbeam.schemas.rejections import reject

    assert uid_length_problem("datum_uid", MAX_UID_CHARS) is None
    assert uid_length_problem("datum_uid", MAX_UID_CHARS + 1).startswith(UID_REASON)
    assert reject("m", "m.jsonl", 3, "why", FITS_UID)["datum_uid"] == FITS_UID
    assert reject("m", "m.jsonl", 3, "why", LONG_UID) == {"source": "m", "file": "m.jsonl",
                                                           "line": 3, "reason": "why"}


# ----------------------------------------------------------------------------- classification

def test_classification_rejects_long_labels_and_slices_on_every_reader(tmp_path):
    """JSONL (Arrow's fast path and the line-by-line path), Parquet and Python rows give the same
    reasons; the rejected names are not in the validated rows' key or value names (which every
    shard piece carries)."""
    from evalbeam.schemas.classification_rows import (CLASSIFICATION_GROUNDTRUTH as GT,
                                                      CLASSIFICATION_PREDICTION as PRED,
                                                      dict_rows_table, parquet_tables,
                                                      parse_jsonl_block, validate)

    def gt(uid, value="cat", region="eu", key="class"):
        return {"datum_uid": uid, "metadata": {"region": region},
                "labels": [{"key": key, "value": value}]}

    rows = [gt("ok"), gt("fits", value=FITS), gt("value", value=LONG), gt("slice", region=LONG),
            gt("key", key=LONG)]
    expected = [(3, "value", LABEL_REASON), (4, "slice", SLICE_REASON),
                (5, "key", LABEL_REASON.replace("value", "key"))]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gt.parquet")
    with open(tmp_path / "gt.parquet", "rb") as stream:
        parquet = next(parquet_tables(stream, GT, ["region"]))
    slow = jsonl(rows) + b"\n" + b'{"datum_uid": "ok2", "labels": [{"key": "class", "value": 3}]}\n'
    tables = {"fast": parse_jsonl_block(jsonl(rows), 1, GT, ["region"]),
              "slow": parse_jsonl_block(slow, 1, GT, ["region"]),    # ints and strings mixed
              "parquet": (parquet, []),
              "dicts": dict_rows_table(rows, 1, GT, ["region"])}
    for name, (table, unparsed) in tables.items():
        kept, rejects = validate(table, scored=False, file_id=0)
        found = sorted([(p + (name == "parquet"), u, r) for p, u, r in rejects]
                       + [(p, uid, r) for p, r in unparsed
                          for uid in [rows[p - 1]["datum_uid"]]])
        assert [(p, u) for p, u, _ in found] == [(p, u) for p, u, _ in expected], name
        assert all(r.startswith(e) for (_, _, r), (_, _, e) in zip(found, expected)), (name, found)
        assert kept.uid.to_pylist()[:2] == ["ok", "fits"], name
        assert max(map(len, kept.key_names + kept.value_names)) == MAX_LABEL_CHARS, name
        assert all(len(v) <= MAX_SLICE_CHARS for v in kept.slices["region"].to_pylist()), name

    # a prediction's long value among short ones, and an integer label of 2,001 digits
    scored = [{"datum_uid": "a", "labels": [{"key": "class", "value": "cat", "score": 0.5},
                                            {"key": "class", "value": LONG, "score": 0.5}]}]
    kept, rejects = validate(parse_jsonl_block(jsonl(scored), 1, PRED, [])[0], True, 0)
    assert rejects[0][2].startswith(LABEL_REASON) and LONG not in kept.value_names
    _, unparsed = dict_rows_table([{"datum_uid": "b", "labels": [
        {"key": "class", "value": 10 ** 2000, "score": 0.5}]}], 0, PRED, [])
    assert unparsed[0][1].startswith("label value is 2,001 characters long")


def test_classification_rejects_long_uids_on_every_reader_before_copying_them(tmp_path):
    """Ground truth and predictions, JSONL (both paths), Parquet and Python rows: a datum_uid of
    MAX_UID_CHARS characters is kept, one more rejects the row before its labels are looked at;
    the reject does not copy the uid (None) and the validated rows, which become the shard
    pieces, do not hold it."""
    from evalbeam.schemas.classification_rows import (CLASSIFICATION_GROUNDTRUTH as GT,
                                                      CLASSIFICATION_PREDICTION as PRED,
                                                      dict_rows_table, parquet_tables,
                                                      parse_jsonl_block, validate)

    for schema, scored in ((GT, False), (PRED, True)):
        def row(uid, value="cat"):
            label = {"key": "class", "value": value, **({"score": 0.5} if scored else {})}
            return {"datum_uid": uid, "labels": [label]}

        rows = [row("ok"), row(FITS_UID), row(LONG_UID), row(LONG_UID, value=LONG)]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
        with open(tmp_path / "rows.parquet", "rb") as stream:
            parquet = next(parquet_tables(stream, schema, []))
        mixed = b'{"datum_uid": "int", "labels": [{"key": "k", "value": 3, "score": 0.5}]}\n'
        tables = {"fast": parse_jsonl_block(jsonl(rows), 1, schema, []),
                  "slow": parse_jsonl_block(jsonl(rows) + mixed, 1, schema, []),
                  "parquet": (parquet, []),
                  "dicts": dict_rows_table(rows, 1, schema, [])}
        for name, (table, unparsed) in tables.items():
            kept, rejects = validate(table, scored=scored, file_id=0)
            found = sorted([(p + (name == "parquet"), u, r) for p, u, r in rejects]
                           + [(p, None, r) for p, r in unparsed])
            assert [(p, u) for p, u, _ in found] == [(3, None), (4, None)], (name, scored)
            assert all(r.startswith(UID_REASON) for _, _, r in found), (name, scored)
            assert kept.uid.to_pylist()[:2] == ["ok", FITS_UID], (name, scored)


def test_classification_run_rejects_long_rows_and_counts_add_up(tmp_path):
    """End to end: a long label value, a long label key, a long slice value and a long
    datum_uid (ground truth and prediction) are rejected rows (file, line, reason; the uid left
    out), the outputs hold none of them, and run.json's counts add up."""
    truth = [{"datum_uid": f"d{i}", "metadata": {"region": "eu" if i % 2 else "us"},
              "labels": [{"key": "class", "value": "cat" if i % 3 else "dog"}]} for i in range(8)]
    truth += [{"datum_uid": "long-value", "metadata": {"region": "eu"},
               "labels": [{"key": "class", "value": LONG}]},
              {"datum_uid": "long-slice", "metadata": {"region": LONG},
               "labels": [{"key": "class", "value": "cat"}]},
              {"datum_uid": LONG_UID, "metadata": {"region": "eu"},
               "labels": [{"key": "class", "value": "cat"}]}]
    preds = [{"datum_uid": f"d{i}", "labels": [{"key": "class", "value": "cat", "score": 0.6},
                                               {"key": "class", "value": "dog", "score": 0.4}]}
             for i in range(8)]
    preds += [{"datum_uid": "d0", "labels": [{"key": LONG, "value": "cat", "score": 0.6}]},
              {"datum_uid": LONG_UID, "labels": [{"key": "class", "value": "cat", "score": 0.6}]}]
    out = tmp_path / "out"
    code = run_classification(["--groundtruths", write_jsonl(tmp_path / "gt.jsonl", truth),
                               "--predictions", f"m={write_jsonl(tmp_path / 'm.jsonl', preds)}",
                               "--output", out, "--quiet", "--slice", "region",
                               "--num_shards", "1", "--metrics", "Counts",
                               "--max_rejected_fraction", "0.3"])
    assert code == 0
    rejected = {(r["source"], r["line"]): r["reason"] for r in read_jsonl(out / "rejected.jsonl")}
    assert sorted(rejected) == [("groundtruths", 9), ("groundtruths", 10), ("groundtruths", 11),
                                ("m", 9), ("m", 10)]
    assert rejected["groundtruths", 9].startswith(LABEL_REASON)
    assert rejected["groundtruths", 10].startswith(SLICE_REASON)
    assert rejected["groundtruths", 11].startswith(UID_REASON)
    assert rejected["m", 9].startswith(LABEL_REASON.replace("value", "key"))
    assert rejected["m", 10].startswith(UID_REASON)
    assert "xxxx" not in (out / "metrics.jsonl").read_text()
    assert not any("uuuu" in (out / name).read_text() for name in ("metrics.jsonl", "rejected.jsonl"))
    info = json.loads((out / "run.json").read_text())
    assert info["counts"] == {
        "groundtruths": {"rows_read": 11, "rows_evaluated": 8, "rows_rejected": 3},
        "m": {"rows_read": 10, "rows_evaluated": 8, "rows_rejected": 2}}
    assert (info["rows_read"], info["rows_rejected"]) == (21, 5)


# ----------------------------------------------------------------------------- detection

def test_detection_native_rows_reject_long_labels_and_slices():
    from evalbeam.schemas.detection_rows import labels_of, native_rows

    def row(uid, label="cat", region="eu"):
        return {"datum_uid": uid, "metadata": {"region": region},
                "annotations": [{"label": "dog", "bbox": [0, 0, 1, 1]},
                                {"label": label, "bbox": [0, 0, 2, 2]}]}

    rows = [row("ok", label=FITS), row("label", label=LONG), row("slice", region=LONG)]
    images, boxes, bad = native_rows(rows, [1, 2, 3], False, ["region"])
    assert [(p, u) for p, u, _ in bad] == [(2, "label"), (3, "slice")]
    assert bad[0][2].startswith("annotation 1: label is 1,025 characters long, more than the limit")
    assert bad[1][2].startswith(SLICE_REASON)
    assert images.uid == ["ok"] and len(boxes.image_id) == 2
    assert labels_of(rows) == {"dog", "cat", FITS}   # a long label names no category


def test_coco_long_category_name_stops_the_run_and_long_image_slice_is_rejected(tmp_path):
    """A category name beyond the bound is a file-level problem: ReadCocoFile refuses the file
    with a one-paragraph message (an input error, exit 2). An image whose slice value is too long
    is a rejected image."""
    from evalbeam.schemas.coco_rows import image_rows
    from evalbeam.transforms.detection_reading import ReadCocoFile
    from evalbeam.transforms.io import ReadError

    images = [{"id": 1, "metadata": {"region": "eu"}}, {"id": 2, "metadata": {"region": LONG}}]
    kept, bad = image_rows(images, ["region"])
    assert kept.image_id.tolist() == [1] and bad[0][0] == 1 and bad[0][1].startswith(SLICE_REASON)

    coco = {"images": [{"id": 1}], "annotations": [],
            "categories": [{"id": 1, "name": "cat"}, {"id": 7, "name": LONG}]}
    (tmp_path / "gt.json").write_text(json.dumps(coco))
    sources = {"groundtruths": SimpleNamespace(files=[str(tmp_path / "gt.json")])}
    reader = ReadCocoFile(sources, "bbox", [], 2, True, 0.0)
    reader.setup()
    with pytest.raises(ReadError) as error:
        list(reader.process(("groundtruths", 0)))
    message = error.value.message
    assert "gt.json (given for groundtruths) cannot be used: the name of category 7 is 1,025 " \
           "characters long, more than the limit of 1,024" in message
    assert "\n" not in message and LONG not in message
    coco["categories"][1]["name"] = FITS
    (tmp_path / "gt.json").write_text(json.dumps(coco))
    assert list(reader.process(("groundtruths", 0)))


# ----------------------------------------------------------------------------- segmentation

def test_segmentation_rejects_long_labels_and_slices_and_label_names():
    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.tasks.segmentation import parse_label_names
    from evalbeam.schemas.segmentation_rows import segment_rows

    def row(uid, label="car", region="eu"):
        return {"datum_uid": uid, "metadata": {"region": region}, "shape": [1, 2],
                "segments": [{"label": label, "rle": {"size": [1, 2], "counts": [0, 2]}}]}

    good, bad = segment_rows([row("ok", FITS), row("label", LONG), row("slice", region=LONG)],
                             [1, 2, 3], "rows.jsonl", 0, ["region"])
    assert [r.uid for r in good] == ["ok"] and good[0].labels == [FITS]
    assert [(p, u) for p, u, _ in bad] == [(2, "label"), (3, "slice")]
    assert bad[0][2].startswith("segment label is 1,025 characters long, more than the limit")
    assert bad[1][2].startswith(SLICE_REASON)
    assert parse_label_names(f"road,{FITS}") == {0: "road", 1: FITS}
    with pytest.raises(UsageError, match="the name of class id 1 is 1,025 characters long"):
        parse_label_names(f"road,{LONG}")


# ----------------------------------------------------------------------------- text, retrieval

def test_text_and_retrieval_reject_long_slice_values():
    from evalbeam.schemas.retrieval_rows import slice_values
    from evalbeam.schemas.text_rows import text_rows

    rows = [{"datum_uid": "ok", "metadata": {"region": "eu"}, "references": ["a"]},
            {"datum_uid": "long", "metadata": {"region": LONG}, "references": ["a"]}]
    good, bad = text_rows(rows, [1, 2], False, 0, ["region"])
    assert [r.uid for r in good] == ["ok"] and good[0].slices == {"region": '"eu"'}
    assert [(p, u) for p, u, _ in bad] == [(2, "long")] and bad[0][2].startswith(SLICE_REASON)

    qrel = {"query_id": "q", "doc_id": "d", "relevance": 1}
    assert slice_values(dict(qrel, metadata={"region": "eu"}), ["region"]) == (('"eu"',), None)
    values, reason = slice_values(dict(qrel, metadata={"region": LONG}), ["region"])
    assert values is None and reason.startswith(SLICE_REASON)


# ----------------------------------------------------------------------------- ids

def test_detection_segmentation_and_text_reject_long_uids():
    """Ground truth and predictions of the tasks whose readers parse rows one by one: a
    datum_uid of MAX_UID_CHARS characters is kept, one more rejects its row first."""
    from evalbeam.schemas.detection_rows import native_rows
    from evalbeam.schemas.segmentation_rows import segment_rows
    from evalbeam.schemas.text_rows import text_rows

    def rows(**fields):
        return [dict(fields, datum_uid=uid) for uid in ("ok", FITS_UID, LONG_UID)]

    def check(uids, bad):
        assert uids == ["ok", FITS_UID]
        assert [p for p, _, _ in bad] == [3] and bad[0][2].startswith(UID_REASON)

    for scored in (False, True):
        box = {"label": "cat", "bbox": [0, 0, 1, 1], **({"score": 0.5} if scored else {})}
        first, _, bad = native_rows(rows(annotations=[box]), [1, 2, 3], scored, [])
        check(first.uid, bad)
        text = {"response": "a"} if scored else {"references": ["a"]}
        good, bad = text_rows(rows(**text), [1, 2, 3], scored, 0, [])
        check([row.uid for row in good], bad)
    segment = {"label": "car", "rle": {"size": [1, 2], "counts": [0, 2]}}
    good, bad = segment_rows(rows(shape=[1, 2], segments=[segment]), [1, 2, 3], "rows.jsonl", 0, [])
    check([row.uid for row in good], bad)


def test_retrieval_rejects_long_query_ids_on_every_reader_and_keeps_long_doc_ids():
    """TREC and JSONL, qrels and runs, Arrow's fast path and the line-by-line one (the same
    block, the same result), and Python rows: a query id of MAX_UID_CHARS characters is kept,
    one more rejects its line with its length (per_query.jsonl writes the id in every record of
    its query); a document id of any length is kept (no output repeats it)."""
    from evalbeam.schemas import retrieval_rows as rr

    fits, long, doc = "q" * MAX_UID_CHARS, "q" * (MAX_UID_CHARS + 1), "d" * 100_000
    rows = [("q1", doc, 1), (fits, "d", 2), (long, "d", 3)]
    for kind, value, trec_line in (("qrels", "relevance", "{} 0 {} {}\n"),
                                   ("run", "score", "{} Q0 {} 1 {} tag\n")):
        trec = "".join(trec_line.format(*row) for row in rows).encode()
        lines = jsonl([{"query_id": q, "doc_id": d, value: v} for q, d, v in rows])
        for data, fast, slow, what in ((trec, rr._trec_fast, rr._trec_slow, "query id"),
                                       (lines, rr._jsonl_fast, rr._jsonl_slow, "query_id")):
            reason = (f"{what} is {MAX_UID_CHARS + 1:,} characters long, more than the limit of "
                      "4,096 for an id")
            for query, docs, _, numbers, rejects in (fast(data, 0, len(data), 1, kind),
                                                     slow(data, 1, kind)):
                assert query.to_pylist() == ["q1", fits] and docs.to_pylist() == [doc, "d"]
                assert numbers.tolist() == [1, 2]
                assert [(line, r.startswith(reason)) for line, r in rejects] == [(3, True)]
        row = {"query_id": long, "doc_id": doc, value: 1}
        assert rr.dict_row_problem(row, kind).startswith("query_id is 4,097 characters long")
        assert rr.dict_row_problem(dict(row, query_id=fits), kind) is None


def test_text_rejects_a_response_or_reference_past_max_text_chars():
    """ROUGE-L's LCS costs the product of two texts' lengths: a response or reference longer
    than max_text_chars rejects its row with the field and the length; contexts and the query
    are not bounded (no metric compares them pairwise); --max_text_chars moves the bound and
    must be at least 1."""
    from evalbeam.pipelines.launch.common import UsageError
    from evalbeam.pipelines.launch.launcher import parse_command
    from evalbeam.pipelines.tasks.text import TASK
    from evalbeam.schemas.limits import MAX_TEXT_CHARS
    from evalbeam.schemas.text_rows import text_rows

    fits, long = "a" * MAX_TEXT_CHARS, "a" * (MAX_TEXT_CHARS + 1)
    truths = [{"datum_uid": "1", "references": [fits]}, {"datum_uid": "2", "references": ["x", long]},
              {"datum_uid": "3", "references": ["x"], "query": long}]
    good, bad = text_rows(truths, [1, 2, 3], False, 0, [])
    assert [r.uid for r in good] == ["1", "3"]
    assert [(p, u) for p, u, _ in bad] == [(2, "2")]
    assert bad[0][2].startswith(f"reference 2 is {MAX_TEXT_CHARS + 1:,} characters long")
    responses = [{"datum_uid": "1", "response": fits}, {"datum_uid": "2", "response": long},
                 {"datum_uid": "3", "response": "x", "contexts": [long]}]
    good, bad = text_rows(responses, [1, 2, 3], True, 0, [])
    assert [r.uid for r in good] == ["1", "3"] and [(p, u) for p, u, _ in bad] == [(2, "2")]
    assert "--max_text_chars raises the limit" in bad[0][2]
    good, bad = text_rows(responses, [1, 2, 3], True, 0, [], max_text_chars=10)
    assert [r.uid for r in good] == ["3"] and len(bad) == 2
    good, bad = text_rows(responses, [1, 2, 3], True, 0, [], max_text_chars=MAX_TEXT_CHARS + 1)
    assert len(good) == 3 and not bad
    args = ["--groundtruths", "g.jsonl", "--predictions", "m=p.jsonl", "--output", "o"]
    assert parse_command(TASK, args + ["--max_text_chars", "5"])[1].max_text_chars == 5
    with pytest.raises(UsageError, match="--max_text_chars must be at least 1"):
        parse_command(TASK, args + ["--max_text_chars", "0"])
