"""Semantic segmentation: the pixel kernel against scikit-learn, the metrics against valor-lite's
formulas, every input form (RLE, PNG and .npy masks, label maps) against a brute-force count, the
ignore and unlabeled ids, bad input, the PTransform, and determinism across runner modes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from sklearn.metrics import confusion_matrix

from evalbeam.pipelines.launch.common import local_pipeline
from helpers import MULTIPROCESS, read_jsonl, write_jsonl
from evalbeam.transforms.kernels.segmentation import (IGNORED, UNLABELED, UnknownIds, pixel_confusion,
                                             segmentation_metrics)

LABELS = ["building", "car", "road", "sky", "tree"]


def run_segmentation(*args) -> int:
    from evalbeam.pipelines.tasks.segmentation import run

    return run([str(a) for a in args])


# ----------------------------------------------------------------------------- kernel


def confusion_of_codes(gt: np.ndarray, pd: np.ndarray | None, K: int, dtype=np.uint8) -> np.ndarray:
    """pixel_confusion of label-code maps (-2 ignored, -1 unlabeled, 0..K-1 labels), through ids
    code + 2 and the table [IGNORED, UNLABELED, 0, ..., K-1]."""
    table = np.array([IGNORED, UNLABELED, *range(K)], dtype=np.int32)
    return pixel_confusion((gt + 2).astype(dtype), None if pd is None else (pd + 2).astype(dtype),
                           table, table, K)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.uint8, np.int32])   # the bincount and the np.unique paths
def test_pixel_confusion_equals_sklearn(seed, dtype):
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 9))
    h, w = (int(v) for v in rng.integers(1, 50, 2))
    gt = rng.integers(-2, K, (h, w))                          # with ignored and unlabeled pixels
    pd = rng.integers(-1, K, (h, w))
    matrix = confusion_of_codes(gt, pd, K, dtype)
    keep = gt.ravel() != IGNORED
    expected = confusion_matrix(gt.ravel()[keep], pd.ravel()[keep], labels=list(range(-1, K)))
    assert np.array_equal(matrix, expected)
    assert matrix.sum() == keep.sum()
    # no prediction: every counted pixel is predicted "no label"
    alone = confusion_of_codes(gt, None, K, dtype)
    assert np.array_equal(alone[:, 0], expected.sum(axis=1)) and alone[:, 1:].sum() == 0


@pytest.mark.parametrize("dtypes", [(np.uint8, np.uint8), (np.uint16, np.uint8), (np.int32, np.int32)])
def test_pair_counts_in_chunks_equal_all_at_once(dtypes):
    """Large images are counted a chunk at a time (bounded memory): the same pairs and counts,
    with chunk boundaries inside rows and a last chunk shorter than the others."""
    from evalbeam.transforms.kernels.segmentation import pair_counts

    rng = np.random.default_rng(7)
    g = rng.integers(0, 6, (37, 41)).astype(dtypes[0])
    p = rng.integers(0, 4, (37, 41)).astype(dtypes[1])
    for prediction in (p, None):
        whole = pair_counts(g, prediction, chunk=g.size)
        for chunk in (1, 100, 1000):
            parts = pair_counts(g, prediction, chunk=chunk)
            order = np.lexsort((parts[1], parts[0]))
            assert all(np.array_equal(a[order], b) for a, b in zip(parts, whole)), (chunk, prediction is None)


def test_unknown_ids_are_reported_by_side():
    table = np.array([UNLABELED, 0, 1, -3], dtype=np.int32)     # id 3 names nothing
    ok = np.array([[0, 1], [2, 2]], np.uint8)
    with pytest.raises(UnknownIds) as found:
        pixel_confusion(np.array([[0, 3], [5, 1]], np.uint8), ok, table, table, 2)
    assert found.value.side == "groundtruth" and found.value.ids == [5]   # beyond the table first
    with pytest.raises(UnknownIds) as found:
        pixel_confusion(ok, np.array([[3, 3], [0, 1]], np.uint8), table, table, 2)
    assert found.value.side == "prediction" and found.value.ids == [3]


def test_pixel_confusion_degenerate_cases():
    empty = np.zeros((0, 0), np.int64)
    assert confusion_of_codes(empty, empty, 3).sum() == 0
    everything_ignored = np.full((4, 4), IGNORED)
    assert confusion_of_codes(everything_ignored, np.zeros((4, 4), np.int64), 2).sum() == 0
    m = segmentation_metrics(np.zeros((3, 3), np.int64))
    assert m["accuracy"] == 0.0 and m["mIOU"] == 0.0 and not m["precision"].any()
    assert segmentation_metrics(np.zeros((1, 1), np.int64))["mIOU"] == 0.0     # no labels


@pytest.mark.parametrize("seed", range(5))
def test_metrics_equal_valor_lite_formulas(seed):
    computation = pytest.importorskip("valor_lite.semantic_segmentation.computation",
                                      reason="valor-lite (a test extra) is the oracle")
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 7))
    matrix = rng.integers(0, 50, (K + 1, K + 1))
    matrix[rng.random((K + 1, K + 1)) < 0.3] = 0                 # empty rows/columns too
    precision, recall, f1, accuracy, ious, unmatched_pd, unmatched_gt = computation.compute_metrics(
        matrix.astype(np.uint64))
    m = segmentation_metrics(matrix)
    for ours, theirs in ((m["precision"], precision), (m["recall"], recall), (m["f1"], f1),
                         (m["iou"], ious), (m["unmatched_prediction_ratio"], unmatched_pd),
                         (m["unmatched_groundtruth_ratio"], unmatched_gt)):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    assert m["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert m["mIOU"] == pytest.approx(ious.diagonal().mean(), abs=1e-12)


def test_metrics_by_hand():
    """2x3 image, labels a (0) and b (1); ground truth [[a, a, b], [-, b, b]], prediction
    [[a, b, b], [a, -, b]]. a: gt 2, predicted 2, tp 1 -> P = R = 1/2, IOU = 1/(2 + 2 - 1) = 1/3;
    b: gt 3, predicted 3, tp 2 -> P = R = 2/3, IOU = 2/(3 + 3 - 2) = 1/2; mIOU 5/12; accuracy
    3/6. Unmatched: one b pixel predicted as nothing (1/3 of b's), one a prediction where nothing
    is (1/2 of a's predictions); a predicted as b once: iou[a, b] = 1/(2 + 3 - 1)."""
    gt = np.array([[0, 0, 1], [UNLABELED, 1, 1]])
    pd = np.array([[0, 1, 1], [0, UNLABELED, 1]])
    m = segmentation_metrics(confusion_of_codes(gt, pd, 2))
    assert m["precision"] == pytest.approx([1 / 2, 2 / 3])
    assert m["recall"] == pytest.approx([1 / 2, 2 / 3])
    assert m["IOU"] == pytest.approx([1 / 3, 1 / 2])
    assert m["mIOU"] == pytest.approx(5 / 12)
    assert m["accuracy"] == pytest.approx(0.5)
    assert m["unmatched_groundtruth_ratio"] == pytest.approx([0, 1 / 3])
    assert m["unmatched_prediction_ratio"] == pytest.approx([1 / 2, 0])
    assert m["iou"][0, 1] == pytest.approx(1 / 4) and m["iou"][1, 0] == 0


# ----------------------------------------------------------------------------- inputs


def rle_of(mask: np.ndarray, compressed: bool = True) -> dict:
    if compressed:
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        return {"size": list(mask.shape), "counts": rle["counts"].decode()}
    flat = mask.ravel(order="F").astype(int)
    change = np.flatnonzero(np.diff(np.r_[0, flat, 1 - flat[-1]]))
    return {"size": list(mask.shape), "counts": np.diff(np.r_[0, change]).tolist()}


def random_maps(seed: int, n: int = 12):
    """{uid: (gt codes, {model: prediction codes}, site)}: blocky maps with some unlabeled pixels,
    shapes varying per datum; model "good" mostly right, model "noisy" mostly random."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        h, w = int(rng.integers(8, 40)), int(rng.integers(8, 40))
        coarse = rng.integers(-1, len(LABELS) - 1, (h // 4 + 1, w // 4 + 1))   # "tree" never in gt
        gt = np.kron(coarse, np.ones((4, 4), int))[:h, :w].astype(np.int32)
        good = np.where(rng.random((h, w)) < 0.8, gt, rng.integers(-1, len(LABELS), (h, w))).astype(np.int32)
        noisy = rng.integers(-1, len(LABELS), (h, w)).astype(np.int32)
        out[f"img-{i:02d}"] = (gt, {"good": good, "noisy": noisy}, "ab"[i % 2])
    return out


def write_inputs(folder, maps, form: str):
    """Write the maps as rows of one form: "rle", "rle_list", "png", "npy" (segments) or
    "labelmap" (PNG class ids, unlabeled = id 0, label k = id k + 1)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = {"groundtruths": [], "good": [], "noisy": []}
    for uid, (gt, preds, site) in maps.items():
        for source, codes in [("groundtruths", gt), *preds.items()]:
            row = {"datum_uid": uid}
            if source == "groundtruths":
                row["metadata"] = {"site": site}
            if form == "labelmap":
                name = f"{source}-{uid}.png"
                Image.fromarray((codes + 1).astype(np.uint8)).save(folder / name)
                row["label_map_uri"] = name
            else:
                row["shape"] = list(codes.shape)
                row["segments"] = []
                for k in np.unique(codes[codes >= 0]).tolist():
                    mask = codes == k
                    segment = {"label": LABELS[k]}
                    if form in ("rle", "rle_list"):
                        segment["rle"] = rle_of(mask, form == "rle")
                    elif form == "png":
                        name = f"{source}-{uid}-{k}.png"
                        Image.fromarray(mask.astype(np.uint8) * 255).save(folder / name)
                        segment["mask_uri"] = name
                    else:
                        name = f"{source}-{uid}-{k}.npy"
                        np.save(folder / name, mask)
                        segment["mask_uri"] = str(folder / name)        # absolute works too
                    row["segments"].append(segment)
            rows[source].append(row)
    for source, items in rows.items():
        write_jsonl(folder / f"{source}.jsonl", items)
    return folder


def brute_force(maps, model: str, site: str | None = None) -> dict:
    """The metrics from all pixels at once: scikit-learn's confusion matrix, then the formulas."""
    gts = [gt.ravel() for gt, _, s in maps.values() if site in (None, s)]
    pds = [preds[model].ravel() for gt, preds, s in maps.values() if site in (None, s)]
    matrix = confusion_matrix(np.concatenate(gts), np.concatenate(pds), labels=list(range(-1, len(LABELS))))
    return segmentation_metrics(matrix)


def by_key(path) -> dict:
    return {(r["model"], json.dumps(r["slice"]), r["type"], r["parameters"].get("label")): r["value"]
            for r in read_jsonl(path / "metrics.jsonl")}


def check_against_brute_force(records: dict, maps):
    for model in ("good", "noisy"):
        for site, slice_json in ((None, "{}"), ("a", '{"site": "a"}'), ("b", '{"site": "b"}')):
            m = brute_force(maps, model, site)
            assert records[(model, slice_json, "Accuracy", None)] == pytest.approx(m["accuracy"], abs=1e-12)
            assert records[(model, slice_json, "mIOU", None)] == pytest.approx(m["mIOU"], abs=1e-12)
            for k, label in enumerate(LABELS):
                assert records[(model, slice_json, "IOU", label)] == pytest.approx(m["IOU"][k], abs=1e-12)
                assert records[(model, slice_json, "Precision", label)] == pytest.approx(m["precision"][k], abs=1e-12)
                assert records[(model, slice_json, "Recall", label)] == pytest.approx(m["recall"][k], abs=1e-12)
                assert records[(model, slice_json, "F1", label)] == pytest.approx(m["f1"][k], abs=1e-12)
            cm = records[(model, slice_json, "ConfusionMatrix", None)]
            for i, g in enumerate(LABELS):
                assert cm["unmatched_ground_truths"][g]["ratio"] == pytest.approx(
                    m["unmatched_groundtruth_ratio"][i], abs=1e-12)
                for j, p in enumerate(LABELS):
                    assert cm["confusion_matrix"][g][p]["iou"] == pytest.approx(m["iou"][i, j], abs=1e-12)


LABEL_NAMES = ",".join(f"{k + 1}={name}" for k, name in enumerate(LABELS))


@pytest.mark.parametrize("form", ["rle", "rle_list", "png", "npy", "labelmap"])
def test_every_input_form_gives_the_brute_force_numbers(tmp_path, form):
    maps = random_maps(1)
    folder = write_inputs(tmp_path / "in", maps, form)
    extra = ["--label_names", LABEL_NAMES, "--unlabeled_id", "0"] if form == "labelmap" else []
    assert run_segmentation("--groundtruths", folder / "groundtruths.jsonl",
                            "--predictions", f"good={folder / 'good.jsonl'}",
                            "--predictions", f"noisy={folder / 'noisy.jsonl'}",
                            "--output", tmp_path / "out", "--slice", "site", "--quiet", *extra) == 0
    check_against_brute_force(by_key(tmp_path / "out"), maps)
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"]["groundtruths"] == {"rows_read": 12, "rows_evaluated": 12, "rows_rejected": 0}


def test_valor_lite_agrees(tmp_path):
    semantic = pytest.importorskip("valor_lite.semantic_segmentation", reason="valor-lite is the oracle")
    maps = random_maps(2)
    folder = write_inputs(tmp_path / "in", maps, "labelmap")
    assert run_segmentation("--groundtruths", folder / "groundtruths.jsonl",
                            "--predictions", f"good={folder / 'good.jsonl'}",
                            "--output", tmp_path / "out", "--quiet",
                            "--label_names", LABEL_NAMES, "--unlabeled_id", "0") == 0
    ours = {(r["type"], r["parameters"].get("label")): r["value"]
            for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")}
    loader = semantic.Loader.in_memory()
    loader.add_data([semantic.Segmentation(uid=uid, groundtruths=(gt + 1).astype(np.uint16),
                                           predictions=(preds["good"] + 1).astype(np.uint16),
                                           labels=LABELS)
                     for uid, (gt, preds, _) in maps.items()])
    theirs = loader.finalize().compute_precision_recall_iou()
    n = 0
    for metrics in theirs.values():
        for metric in metrics:
            d = metric.to_dict()
            value = ours[(d["type"], d["parameters"].get("label"))]
            if d["type"] == "ConfusionMatrix":   # ours adds pixel counts to each cell
                value = json.loads(json.dumps(value))
                for part in value.values():
                    for cell in part.values():
                        for v in (cell.values() if "count" not in cell else [cell]):
                            v.pop("count", None)
                assert _close(value, d["value"])
            else:
                assert value == pytest.approx(d["value"], abs=1e-12), d
            n += 1
    assert n == 3 + 4 * len(LABELS)


def _close(a, b) -> bool:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return all(_close(a[k], b[k]) for k in a)
    assert a == pytest.approx(b, abs=1e-12)
    return True


def test_ignore_and_unlabeled_ids(tmp_path):
    """Ground truth id 255 is left out everywhere; in a prediction it means 'no label'. Id 0 is
    a class here (--unlabeled_id none)."""
    gt = np.array([[0, 0, 255], [1, 1, 255]], np.uint8)
    pd = np.array([[0, 255, 1], [1, 0, 0]], np.uint8)
    Image.fromarray(gt).save(tmp_path / "gt.png")
    Image.fromarray(pd).save(tmp_path / "pd.png")
    write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "label_map_uri": "gt.png"}])
    write_jsonl(tmp_path / "pd.jsonl", [{"datum_uid": "a", "label_map_uri": "pd.png"}])
    assert run_segmentation("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                            "--output", tmp_path / "out", "--quiet", "--label_names", "x,y") == 0
    r = {(x["type"], x["parameters"].get("label")): x["value"] for x in read_jsonl(tmp_path / "out" / "metrics.jsonl")}
    # counted pixels: gt x,x,y,y vs pd x,(none),y,0->x ; x: tp 1, gt 2, pd 2; y: tp 1, gt 2, pd 1
    assert r["Accuracy", None] == pytest.approx(2 / 4)
    assert r["Precision", "x"] == pytest.approx(1 / 2) and r["Recall", "x"] == pytest.approx(1 / 2)
    assert r["Precision", "y"] == pytest.approx(1.0) and r["Recall", "y"] == pytest.approx(1 / 2)
    cm = r["ConfusionMatrix", None]
    assert cm["unmatched_ground_truths"]["x"] == {"ratio": 0.5, "count": 1}
    assert cm["confusion_matrix"]["y"]["x"]["count"] == 1
    # with ignore switched off, 255 is an unknown id: the ground-truth row is rejected, so
    # nothing can be evaluated and the run is incomplete (exit 4), not merely over its rejections
    assert run_segmentation("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                            "--output", tmp_path / "out2", "--quiet", "--label_names", "x,y",
                            "--ignore_id", "none") == 4
    reasons = [x["reason"] for x in read_jsonl(tmp_path / "out2" / "rejected.jsonl")]
    assert reasons == ["the ground truth label map has ids that --label_names does not name: [255]",
                       "no valid ground truth for this datum_uid"]


# ----------------------------------------------------------------------------- bad input


def test_bad_rows_are_rejected_with_their_reason(tmp_path):
    good = np.zeros((4, 4), bool)
    good[:2] = True
    Image.fromarray(np.zeros((4, 5), np.uint8)).save(tmp_path / "wide.png")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "rgb.png")
    (tmp_path / "junk.png").write_bytes(b"not an image")
    gt = [
        {"datum_uid": "ok", "shape": [4, 4], "segments": [{"label": "a", "rle": rle_of(good)}]},
        {"datum_uid": "overlap", "shape": [4, 4], "segments": [{"label": "a", "rle": rle_of(good)},
                                                               {"label": "b", "rle": rle_of(good)}]},
        {"datum_uid": "wrong-size", "shape": [4, 4], "segments": [{"label": "a", "mask_uri": "wide.png"}]},
        {"datum_uid": "rgb", "shape": [4, 4], "segments": [{"label": "a", "mask_uri": "rgb.png"}]},
        {"datum_uid": "junk", "shape": [4, 4], "segments": [{"label": "a", "mask_uri": "junk.png"}]},
        {"datum_uid": "missing", "shape": [4, 4], "segments": [{"label": "a", "mask_uri": "nowhere.png"}]},
        {"datum_uid": "rle-size", "shape": [4, 5], "segments": [{"label": "a", "rle": rle_of(good)}]},
        {"datum_uid": "no-shape", "segments": []},
        {"datum_uid": "both", "shape": [4, 4], "segments": [], "label_map_uri": "x.png"},
        "{broken",
        {"datum_uid": "dup", "shape": [4, 4], "segments": []},
        {"datum_uid": "dup", "shape": [4, 4], "segments": []},
    ]
    preds = [
        {"datum_uid": "ok", "shape": [4, 4], "segments": [{"label": "a", "rle": rle_of(good)},
                                                          {"label": "b", "rle": rle_of(~good)}]},
        {"datum_uid": "overlap", "shape": [4, 4], "segments": []},
        {"datum_uid": "stranger", "shape": [4, 4], "segments": []},
    ]
    write_jsonl(tmp_path / "gt.jsonl", gt)
    write_jsonl(tmp_path / "pd.jsonl", preds)
    assert run_segmentation("--groundtruths", tmp_path / "gt.jsonl", "--predictions", f"m={tmp_path / 'pd.jsonl'}",
                            "--output", tmp_path / "out", "--quiet", *MULTIPROCESS) == 1
    found = {(r["source"], r["line"]): r["reason"] for r in read_jsonl(tmp_path / "out" / "rejected.jsonl")}
    assert found[("groundtruths", 2)] == "ground-truth segments overlap on 8 pixels (each pixel takes one label)"
    assert "mask shape [4, 5] differs from the row's shape [4, 4]" in found[("groundtruths", 3)]
    assert "RGB image" in found[("groundtruths", 4)]
    assert found[("groundtruths", 5)] == (f"segment 0 (a): mask_uri {tmp_path / 'junk.png'} is not a PNG "
                                          "or .npy image (nor another image format Pillow reads)")
    assert found[("groundtruths", 6)] == f"segment 0 (a): mask_uri: cannot open {tmp_path / 'nowhere.png'}: No such file or directory"
    assert found[("groundtruths", 7)] == "rle size [4, 4] differs from the row's shape [4, 5]"
    assert found[("groundtruths", 8)] == "shape must be [height, width] with positive integers"
    assert "not both" in found[("groundtruths", 9)]
    assert found[("groundtruths", 10)].startswith("malformed JSON")
    assert found[("groundtruths", 11)] == found[("groundtruths", 12)] == "datum_uid appears 2 times in groundtruths"
    assert found[("m", 2)] == found[("m", 3)] == "no valid ground truth for this datum_uid"
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["counts"] == {"groundtruths": {"rows_read": 12, "rows_evaluated": 1, "rows_rejected": 11},
                              "m": {"rows_read": 3, "rows_evaluated": 1, "rows_rejected": 2}}
    r = {(x["type"], x["parameters"].get("label")): x["value"] for x in read_jsonl(tmp_path / "out" / "metrics.jsonl")}
    # the one datum: a predicted exactly; b predicted where nothing is
    assert r["IOU", "a"] == 1.0 and r["Precision", "b"] == 0.0 and r["Accuracy", None] == 0.5
    assert r["ConfusionMatrix", None]["unmatched_predictions"]["b"] == {"ratio": 1.0, "count": 8}


def test_label_maps_without_label_names_stop_at_once(tmp_path, capsys):
    write_jsonl(tmp_path / "gt.jsonl", [{"datum_uid": "a", "label_map_uri": "a.png"}])
    write_jsonl(tmp_path / "pd.jsonl", [{"datum_uid": "a", "label_map_uri": "b.png"}])
    assert run_segmentation("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                            "--output", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "--label_names is not set" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()   # stopped before any work: nothing on disk changed
    for bad in (["--label_names", "0=a,b"], ["--label_names", "0=a,0=b"], ["--ignore_id", "x"],
                ["--label_names", "a,b", "--ignore_id", "1"], ["--unlabeled_id", "255"]):
        assert run_segmentation("--groundtruths", tmp_path / "gt.jsonl", "--predictions", tmp_path / "pd.jsonl",
                                "--output", tmp_path / "out", *bad) == 2, bad


# ----------------------------------------------------------------------------- determinism, PTransform


def test_same_bytes_for_any_shards_order_and_runner(tmp_path):
    maps = random_maps(3)
    folder = write_inputs(tmp_path / "in", maps, "png")
    rows = read_jsonl(folder / "groundtruths.jsonl")
    write_jsonl(folder / "gt_reversed.jsonl", rows[::-1])
    outputs = []
    for name, gt, extra in (("a", "groundtruths.jsonl", ["--num_shards", "1"]),
                            ("b", "gt_reversed.jsonl", ["--num_shards", "7"]),
                            ("c", "groundtruths.jsonl", ["--num_shards", "3", *MULTIPROCESS])):
        assert run_segmentation("--groundtruths", folder / gt, "--predictions", f"good={folder / 'good.jsonl'}",
                                "--output", tmp_path / name, "--quiet", "--slice", "site", *extra) == 0
        outputs.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]


def test_ptransform_in_a_users_pipeline(tmp_path):
    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from evalbeam.transforms.segmentation import EvaluateSegmentation

    maps = random_maps(4, n=6)
    folder = write_inputs(tmp_path / "in", maps, "rle")
    gt_rows = read_jsonl(folder / "groundtruths.jsonl")
    pd_rows = read_jsonl(folder / "good.jsonl") + [{"datum_uid": "x"}]      # one bad row
    expected = brute_force(maps, "good")

    with local_pipeline() as p:
        records, rejected, _, _ = ({"groundtruths": p | "G" >> beam.Create(gt_rows),
                                    "good": p | "P" >> beam.Create(pd_rows)}
                                   | EvaluateSegmentation(with_diagnostics=True))

        def has_expected_miou(found):
            miou = [r["value"] for r in found if r["type"] == "mIOU"]
            assert miou == [pytest.approx(expected["mIOU"], abs=1e-12)], miou

        def has_one_reject(found):
            assert [r["reason"] for r in found] == ["missing segments (or label_map_uri)"], found

        assert_that(records, has_expected_miou, label="metrics")
        assert_that(rejected, has_one_reject, label="rejects")


def test_rle_round_trips_through_decode():
    """Masks encoded by pycocotools (compressed strings and run-length lists) decode to the same
    pixels through the segment path, and label_ids numbers them in segment order."""
    from evalbeam.schemas.segmentation_rows import SegmentRow
    from evalbeam.transforms.segmentation import decode

    rng = np.random.default_rng(5)
    for h, w in ((1, 1), (7, 3), (31, 64), (64, 31)):
        masks = []
        taken = np.zeros((h, w), bool)
        for _ in range(3):
            mask = (rng.random((h, w)) < 0.3) & ~taken
            taken |= mask
            masks.append(mask)
        for compressed in (True, False):
            segments = [(LABELS[k], "rle", rle_of(m, compressed)) for k, m in enumerate(masks)]
            row = SegmentRow("x", 1, 0, (h, w), segments)
            ids, table, codes = decode(row, {name: i for i, name in enumerate(LABELS)}, None, True)
            assert codes == [0, 1, 2] and table.tolist() == [UNLABELED, 0, 1, 2]
            expected = np.zeros((h, w), np.uint8)
            for k, m in enumerate(masks):
                expected[m] = k + 1
                # and pycocotools agrees on each mask's own round trip
                back = mask_utils.decode(mask_utils.encode(np.asfortranarray(m.astype(np.uint8))))
                assert np.array_equal(back.astype(bool), m)
            assert np.array_equal(ids, expected)
