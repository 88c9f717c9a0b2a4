"""`evalbeam detection`: object detection metrics on Apache Beam (COCO or Valor protocol).

    evalbeam detection --groundtruths instances.json --predictions [NAME=]results.json ...
        --output DIR [--iou_type bbox|segm] [options] [Beam pipeline options]
    python -m evalbeam.pipelines.tasks.detection ...   (same flags)

The task's declaration (pipelines/tasks/task.py); the launcher (pipelines/launch/launcher.py) does the rest.
Reference: pipelines/tasks/detection.md.
"""

from __future__ import annotations

import json

from evalbeam.pipelines.launch.common import UsageError, parse_float_list
from evalbeam.pipelines.tasks.summary import inputs_table, metric_records, text_table
from evalbeam.pipelines.tasks.task import Task
from evalbeam.schemas.formats import format_of
from evalbeam.schemas.limits import MAX_IMAGE_PAIRS, MAX_IMAGE_PIXELS, MAX_RLE_PIXELS
from evalbeam.transforms.kernels.detection import COCO, DetectionConfig, Protocol

NAME = "detection"


def is_coco_name(path: str) -> bool:
    """COCO files are single JSON documents: .json, or .json.gz (any compression suffix
    transforms.io.open_input reads); native rows are .jsonl/.ndjson or Parquet."""
    lower = path.lower()
    return lower.endswith((".json", ".json.gz", ".json.bz2", ".json.xz", ".json.deflate"))


def check_coco_source(name: str, source) -> None:
    """A COCO file is one JSON document: an object with images and annotations (ground truth)
    or an array of detections (results). Only its first 64 KiB are read here (a UTF-8 byte
    order mark skipped); the whole document is checked by the worker that reads it."""
    from evalbeam.schemas.safe_json import BOM, loads_row
    from evalbeam.transforms.io import InputError, open_input

    if len(source.files) != 1:
        what = ("the ground truth must be one COCO instances JSON file" if name == "groundtruths"
                else f"the predictions of {name} must be one COCO results JSON file")
        raise InputError(f"{source.pattern!r} matches {len(source.files)} files; {what}.")
    for path in source.files:
        if not is_coco_name(path):
            raise InputError(f"{path} (given for {name}) is not a COCO JSON file; evalbeam "
                             "detection reads COCO instances (ground truth) and results (predictions) "
                             "JSON files so far.")
        try:
            with open_input(path) as stream:
                head = stream.read(1 << 16)
        except InputError:
            raise
        except Exception as error:
            raise InputError(f"cannot read {path} (given for {name}): {error}") from None
        head = (head[len(BOM):] if head.startswith(BOM) else head).lstrip()
        first, _ = loads_row(head.split(b"\n", 1)[0]) if b"\n" in head else (None, None)
        if isinstance(first, dict) and "datum_uid" in first:
            raise InputError(f"{path} (given for {name}) holds native detection rows (JSON lines "
                             "with datum_uid), but .json names a COCO file: name the native files "
                             ".jsonl (or .ndjson).")
        expected = b"{" if name == "groundtruths" else b"["
        if head[:1] != expected:
            kind = "an instances file (a JSON object)" if name == "groundtruths" else \
                "a results file (a JSON array of detections)"
            raise InputError(f"{path} (given for {name}) is not {kind}; see "
                             "pipelines/tasks/detection.md for the COCO formats evalbeam reads.")
        if name == "groundtruths" and b'"images"' not in head and b'"annotations"' not in head \
                and len(head) < (1 << 16):
            raise InputError(f"{path} (given for {name}) has no \"images\" or \"annotations\": it "
                             "is not a COCO instances file.")


def check_native_source(name: str, source) -> None:
    """Native rows: JSONL or Parquet files whose rows carry datum_uid and annotations."""
    from evalbeam.transforms.io import InputError
    from evalbeam.transforms.preflight import preflight

    for path in source.files:
        if format_of(path) not in ("jsonl", "parquet") or is_coco_name(path):
            raise InputError(f"{path} (given for {name}) is not a .jsonl or .parquet file; the ground "
                             "truth is native rows, so every input must be.")
    preflight(source, None, ("datum_uid", "annotations"), [], task=NAME)


def detection_summary(metrics_path: str, counts: dict) -> str:
    """COCO protocol: all 12 COCO statistics per (model, slice), in two tables of six columns
    (average precision, average recall) so each fits a terminal; "-" where a statistic is
    undefined (-1 in metrics.jsonl: no ground truth in that area range). Valor protocol: mAP
    averaged over the IoU thresholds."""
    precision = ("AP", "AP50", "AP75", "APsmall", "APmedium", "APlarge")
    recall = ("AR1", "AR10", "AR100", "ARsmall", "ARmedium", "ARlarge")
    rows, valor = [], []
    for record in metric_records(metrics_path):
        if record["type"] == "mAPAveragedOverIOUs":
            valor.append(record)
        if record["type"] != "COCOSummary":
            continue
        where = ", ".join(f"{k}={v}" for k, v in record["slice"].items()) or "(all)"
        if "bound" in record["parameters"]:
            where += f" [{record['parameters']['bound']} bound]"
        rows.append(([record["model"], where], record["value"]))
    inputs = inputs_table(counts)
    if valor:
        rows = [[r["model"], ", ".join(f"{k}={v}" for k, v in r["slice"].items()) or "(all)",
                 f"{r['value']:.4f}"] for r in valor]
        title = "\nDetection summary (valor protocol: mAP averaged over the IoU thresholds)"
        return f"{title}\n{text_table(['model', 'slice', 'mAP'], rows)}\n\n{inputs}"

    def stat(value) -> str:
        return "-" if value == -1 else f"{value:.4f}"

    tables = [text_table(["model", "slice", *names], [cells + [stat(value[n]) for n in names]
                                                  for cells, value in rows])
              for names in (precision, recall)]
    title = ("\nDetection summary (COCO protocol; IoU .50:.95 and maxDets 100 unless named)\n"
             "(\"-\": undefined, no ground truth in that area range)")
    return (f"{title}\nAverage precision\n{tables[0]}\n\nAverage recall\n{tables[1]}"
            f"\n\n{inputs}")


def detection_report_blocks(records, charts) -> list:
    """The report's tables and charts of one model and slice's records (Task.report_blocks)."""
    from evalbeam.pipelines.report.blocks import bars, label_of, record_charts, scalar_rows
    from evalbeam.pipelines.report.elements import fmt, interval_text, params_text, table, value_text
    from evalbeam.schemas.slices import canonical_json
    from evalbeam.pipelines.report import charts as report_charts

    blocks = []
    for r in records:
        if r["type"] == "COCOSummary":
            value = r.get("value") or {}
            interval = r.get("interval") or {}
            blocks.append(table(f"COCO summary ({params_text(r.get('parameters'), ('max_detections',))})",
                                ["statistic", "value", "interval"],
                                [[k, fmt(v), interval_text(interval.get(k))] for k, v in value.items()]))
    classes = [r for r in records if r["type"] == "COCOClassSummary"]
    if classes:
        fields = ["AP", "AP50", "AP75", "AR100"]
        # pycocotools' -1: a category with no ground truth, where AP and AR are undefined
        blocks.append(table("Per category (COCO)", ["label"] + fields,
                            [[label_of(r)] + [("no ground truth" if (r.get("value") or {}).get(f) == -1
                                                else fmt((r.get("value") or {}).get(f))) for f in fields]
                             for r in sorted(classes, key=label_of)]))
    head = scalar_rows(records, ("mAP", "mAPAveragedOverIOUs", "mAR", "mARAveragedOverScores"),
                        lambda r: r["type"], skip=("iou_thresholds",))
    if head:
        blocks.append(table("Overall", ["metric", "type", "parameters", "value", "interval"], head))
    aps = [r for r in records if r["type"] in ("AP", "APAveragedOverIOUs")]
    if aps:
        per: dict = {}
        for r in aps:
            params = r.get("parameters") or {}
            column = "AP@[.5:.95]" if r["type"] == "APAveragedOverIOUs" else f"AP@{fmt(params.get('iou_threshold'))}"
            per.setdefault(label_of(r), {})[column] = value_text(r["value"], r.get("interval"))
        columns = sorted({c for v in per.values() for c in v}, key=lambda c: (c != "AP@[.5:.95]", c))
        blocks.append(table("AP per label", ["label"] + columns,
                            [[label] + [v.get(c, "–") for c in columns] for label, v in sorted(per.items())]))
        chart = bars([r for r in aps if r["type"] == "APAveragedOverIOUs"] or aps[:0] or
                      [r for r in aps if (r.get("parameters") or {}).get("iou_threshold") == 0.5],
                      ("AP", "APAveragedOverIOUs"), charts, "AP per label", label_of, "AP")
        if chart:
            blocks.append(chart)
    curves: dict = {}
    for r in records:
        if r["type"] == "InterpolatedPrecisionRecallCurve":
            params = {k: v for k, v in (r.get("parameters") or {}).items() if k not in ("label", "category_id")}
            # category ids are per label: the chart's series
            label_params = dict(params, label=(r.get("parameters") or {}).get("label"))
            curves.setdefault(canonical_json(params), []).append(dict(r, parameters=label_params))
    for key in sorted(curves, key=lambda k: (json.loads(k).get("iou_threshold", 0), k)):
        blocks.append(charts.add(report_charts.interpolated_pr_curves(curves[key], series="label")))
    return [b for b in blocks + record_charts(records, charts) if b]


class DetectionTask(Task):
    """`evalbeam detection`: the task's command-side declaration (pipelines/tasks/task.py)."""

    name = NAME
    summary = ("evaluate object detections of one or more models against ground truth, with the "
               "COCO protocol (pycocotools' numbers) or the Valor protocol")
    input_help = ("a COCO instances .json with COCO results .json predictions, or native "
                  ".jsonl/.parquet rows for both")
    plumbing = "evalbeam.transforms.detection"
    report_blocks = staticmethod(detection_report_blocks)   # (records, charts) -> blocks
    headlines = ("mAPAveragedOverIOUs", "mAP[iou_threshold=0.5]")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--iou_type", choices=("bbox", "segm"), default="bbox",
                            help="geometry compared: boxes or segmentation masks (default bbox)")
        parser.add_argument("--protocol", choices=("coco", "valor"), default=None,
                            help="coco: pycocotools' COCOeval (maxDets 1/10/100, area ranges, crowd "
                                 "regions), 12 summary statistics; valor: every detection, no area "
                                 "ranges, no crowd rule, Valor's records (default: coco for COCO files, valor for "
                                 "native rows)")
        parser.add_argument("--iou_thresholds", default=None, metavar="T[,T...]",
                            help="IoU thresholds of the valor protocol (default 0.5,0.55,...,0.95; the "
                                 "coco protocol always uses these)")
        parser.add_argument("--score_thresholds", default="0.5", metavar="S[,S...]",
                            help="score thresholds of AR, Counts, Precision, Recall and F1 in the "
                                 "valor protocol (default 0.5)")
        parser.add_argument("--pr_curve_iou_threshold", type=float, default=0.5,
                            help="IoU threshold of the valor protocol's PrecisionRecallCurve (default 0.5)")
        parser.add_argument("--score_bins", type=int, default=None, metavar="N",
                            help="keep per-shard state as counts in N score bins (constant memory); "
                                 "AP statistics come as a lower and an upper bound that contain the "
                                 "exact value (recall, counts and curves stay exact)")
        parser.add_argument("--max_examples", type=int, default=1, metavar="N",
                            help="examples per observation of the valor protocol's "
                                 "DetailedPrecisionRecallCurve (default 1)")
        parser.add_argument("--pr_curve_thresholds", default=None, metavar="S[,S...]",
                            help="score thresholds of the PrecisionRecallCurve (default 0.05..0.95)")
        parser.add_argument("--max_image_pixels", type=int, default=MAX_IMAGE_PIXELS, metavar="N",
                            help="largest mask a row may hold, in pixels (height x width of a raster "
                                 "or RLE, and of an image whose polygons are rasterised with --iou_type "
                                 "segm; default 100000000); larger rows are rejected")
        parser.add_argument("--max_image_pairs", type=int, default=MAX_IMAGE_PAIRS, metavar="N",
                            help="most (prediction, ground truth) pairs one model's predictions may "
                                 "make in one image (valor: predictions x ground truths; coco: per "
                                 "category, the top 100 predictions x ground truths; default "
                                 "10000000); beyond it the model's predictions there are rejected")

    def configure(self, args):
        """A DetectionConfig (transforms.kernels.detection) from the options."""
        native = (format_of(args.groundtruths) in ("jsonl", "parquet")
                  and not is_coco_name(args.groundtruths))
        if args.protocol is None:
            args.protocol = "valor" if native else "coco"
        if native and args.iou_type == "segm" and args.protocol == "coco":
            raise UsageError("the coco protocol rasterises masks with each image's size, which native "
                             "rows do not carry: use --protocol valor (exact polygon IoU) or COCO files")
        if args.score_bins is not None and args.score_bins < 1:
            raise UsageError("--score_bins takes a number >= 1")
        if args.score_bins is not None and getattr(args, "bootstrap", 0):
            raise UsageError("--score_bins and --bootstrap do not go together: the binned state keeps "
                             "no replicates (its AP is already an interval, a lower and an upper "
                             "bound); drop one of them")
        if not 1 <= args.max_image_pixels <= MAX_RLE_PIXELS:
            raise UsageError(f"--max_image_pixels must lie in [1, {MAX_RLE_PIXELS}] (pycocotools' "
                             f"RLE run lengths are 32-bit); got {args.max_image_pixels}")
        if args.max_image_pairs < 1:
            raise UsageError(f"--max_image_pairs must be at least 1; got {args.max_image_pairs}")
        if args.protocol == "coco":
            if args.iou_thresholds is not None:
                raise UsageError("--iou_thresholds applies to --protocol valor; the coco protocol "
                                 "always uses 0.5:0.05:0.95")
            protocol = Protocol(score_bins=args.score_bins) if args.score_bins else COCO
        else:
            ious = (parse_float_list(args.iou_thresholds, "--iou_thresholds")
                    if args.iou_thresholds is not None else COCO.iou_thresholds)
            curve = (parse_float_list(args.pr_curve_thresholds, "--pr_curve_thresholds")
                     if args.pr_curve_thresholds is not None else COCO.pr_curve_thresholds)
            if not 0.0 <= args.pr_curve_iou_threshold <= 1.0:
                raise UsageError("--pr_curve_iou_threshold must lie in [0, 1]")
            protocol = Protocol("valor", tuple(sorted(set(ious))),
                                tuple(sorted(set(parse_float_list(args.score_thresholds,
                                                                  "--score_thresholds")))),
                                tuple(sorted(set(curve))), args.pr_curve_iou_threshold,
                                score_bins=args.score_bins, max_examples=args.max_examples)
            if args.max_examples < 0:
                raise UsageError("--max_examples must be 0 or more")
            if len(protocol.matching_thresholds) > 16:
                raise UsageError("at most 16 IoU thresholds, the PR curve's included")
        return DetectionConfig(args.iou_type, protocol, native, args.max_image_pixels,
                               max_image_pairs=args.max_image_pairs)

    def options(self, config, args) -> dict:
        protocol = config.protocol
        return {"iou_type": config.iou_type, "protocol": protocol.name,
                "score_bins": protocol.score_bins, "max_image_pixels": config.max_image_pixels,
                "max_image_pairs": config.max_image_pairs,
                "iou_thresholds": list(protocol.iou_thresholds),
                **({"score_thresholds": list(protocol.score_thresholds),
                    "pr_curve_thresholds": list(protocol.pr_curve_thresholds),
                    "pr_curve_iou_threshold": protocol.pr_curve_iou_threshold}
                   if protocol.name == "valor" else {})}

    def check_source(self, name: str, source, config, slices) -> None:
        if config.native:
            check_native_source(name, source)
        else:
            check_coco_source(name, source)

    def summarize(self, metrics_path: str, info: dict, config) -> str:
        return detection_summary(metrics_path, info["counts"])


TASK = DetectionTask()


run = TASK.run

if __name__ == "__main__":
    TASK.main()
