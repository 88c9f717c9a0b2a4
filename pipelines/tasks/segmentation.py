"""`evalbeam segmentation`: semantic segmentation metrics on Apache Beam, end to end.

    evalbeam segmentation --groundtruths PATH --predictions [NAME=]PATH ... --output DIR
        [--label_names MAP] [--ignore_id ID] [--max_image_pixels N] [--max_mask_bytes N]
        [--max_labels N] [options] [Beam pipeline options]
    python -m evalbeam.pipelines.tasks.segmentation ...   (same flags)

The task's declaration (pipelines/tasks/task.py); the launcher (pipelines/launch/launcher.py) does the rest.
Reference: pipelines/tasks/segmentation.md.
"""

from __future__ import annotations


from evalbeam.pipelines.launch.common import UsageError, parse_optional_number
from evalbeam.pipelines.tasks.summary import inputs_table, metric_records, text_table
from evalbeam.pipelines.tasks.task import Task
from evalbeam.schemas.formats import format_of
from evalbeam.schemas.limits import (MAX_IMAGE_PIXELS, MAX_LABELS, MAX_MASK_BYTES, MAX_RLE_PIXELS,
                                     ImageLimits, label_length_problem)
from evalbeam.transforms.kernels.segmentation import SegmentationConfig

NAME = "segmentation"
# decoding masks is the work: enough shards for the workers to share it evenly
MIN_SHARDS = 16


def label_names_file(text: str | None) -> str | None:
    """The file --label_names names (a .json), or None when it gives the names themselves."""
    return text if isinstance(text, str) and text.lower().endswith(".json") else None


def parse_label_names(text: str | None) -> dict[int, str] | None:
    """{class id: label name} from --label_names (see build_parser). A name longer than
    MAX_LABEL_CHARS characters is a usage error, like a repeated or empty one."""
    if text is None:
        return None
    if label_names_file(text):
        from evalbeam.transforms.input_files import MAX_SETTINGS_BYTES, FileRefused, load_json

        try:   # a regular file, size and depth bounded, strict JSON
            value = load_json(text, MAX_SETTINGS_BYTES, what=f"--label_names file {text}")
        except FileRefused as error:
            raise UsageError(error.message) from None
        items = list(enumerate(value)) if isinstance(value, list) else \
            list(value.items()) if isinstance(value, dict) else None
        if items is None:
            raise UsageError(f"--label_names file {text} must hold an object or a list")
    else:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if all("=" in p for p in parts):
            items = [tuple(p.split("=", 1)) for p in parts]
        elif not any("=" in p for p in parts):
            items = list(enumerate(parts))
        else:
            raise UsageError("--label_names: use either ID=NAME pairs or names only, not both")
    out: dict[int, str] = {}
    for key, name in items:
        try:
            key = int(str(key).strip())
        except ValueError:
            raise UsageError(f"--label_names: {key!r} is not an integer class id") from None
        if not 0 <= key <= 65535:
            raise UsageError(f"--label_names: class id {key} is outside 0..65535")
        if not isinstance(name, str) or not name.strip():
            raise UsageError(f"--label_names: class id {key} needs a non-empty name")
        if key in out:
            raise UsageError(f"--label_names names class id {key} twice")
        too_long = label_length_problem(f"the name of class id {key}", len(name.strip()))
        if too_long:
            raise UsageError(f"--label_names: {too_long}")
        out[key] = name.strip()
    if not out:
        raise UsageError("--label_names is empty")
    return out


def _first_row(path: str):
    """The first row of a JSONL or Parquet file (None if there is none or it is not usable JSON:
    too deep, too long or malformed lines are the readers' to reject, not a reason to stop)."""
    from evalbeam.schemas.safe_json import loads_row
    from evalbeam.transforms.io import open_input
    from evalbeam.transforms.preflight import head_lines

    with open_input(path) as stream:
        if format_of(path) == "parquet":
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(stream)
            table = parquet.read_row_group(0) if parquet.num_row_groups else None
            return table.slice(0, 1).to_pylist()[0] if table is not None and table.num_rows else None
        lines = head_lines(stream, 1)
    return loads_row(lines[0])[0] if lines else None


def segmentation_summary(metrics_path: str, counts: dict) -> str:
    """One row per (model, slice): mIOU and pixel accuracy."""
    found: dict = {}
    for record in metric_records(metrics_path):
        if record["type"] in ("mIOU", "Accuracy"):
            where = ", ".join(f"{k}={v}" for k, v in record["slice"].items()) or "(all)"
            found.setdefault((record["model"], where), {})[record["type"]] = record["value"]
    rows = [[model, where, f"{v.get('mIOU', 0):.4f}", f"{v.get('Accuracy', 0):.4f}"]
            for (model, where), v in found.items()]
    inputs = inputs_table(counts)
    return f"\nSemantic segmentation summary\n{text_table(['model', 'slice', 'mIOU', 'accuracy'], rows)}\n\n{inputs}"


def segmentation_report_blocks(records, charts) -> list:
    """The report's tables and charts of one model and slice's records (Task.report_blocks)."""
    from evalbeam.pipelines.report.blocks import bars, label_of, scalar_rows
    from evalbeam.pipelines.report.elements import table, value_text
    from evalbeam.pipelines.report import charts as report_charts

    blocks = []
    head = scalar_rows(records, ("Accuracy", "mIOU"), lambda r: r["type"])
    if head:
        blocks.append(table("Overall", ["metric", "type", "parameters", "value", "interval"], head))
    per: dict = {}
    for r in records:
        if r["type"] in ("IOU", "Precision", "Recall", "F1"):
            per.setdefault(label_of(r), {})[r["type"]] = r
    if per:
        blocks.append(table("Per label", ["label", "IOU", "precision", "recall", "F1"],
                            [[label] + [value_text(v[t]["value"], v[t].get("interval"))
                                        if t in v else "–" for t in ("IOU", "Precision", "Recall", "F1")]
                             for label, v in sorted(per.items())]))
        blocks.append(bars([r for r in records if r["type"] == "IOU"], ("IOU",), charts,
                            "IOU per label", label_of, "IOU"))
    confusion = [r for r in records if r["type"] == "ConfusionMatrix"]
    return [b for b in blocks + [charts.add(report_charts.confusion_heatmap(r)) for r in confusion] if b]


class SegmentationTask(Task):
    """`evalbeam segmentation`: the task's command-side declaration (pipelines/tasks/task.py)."""

    name = NAME
    summary = "evaluate semantic segmentation masks of one or more models against ground truth"
    input_help = ".jsonl or .parquet rows with segments or label_map_uri"
    plumbing = "evalbeam.transforms.segmentation"
    min_shards = MIN_SHARDS
    report_blocks = staticmethod(segmentation_report_blocks)   # (records, charts) -> blocks
    headlines = ("mIOU", "Accuracy")

    def add_arguments(self, parser) -> None:
        parser.add_argument("--label_names", default=None, metavar="MAP",
                            help="class id -> label name of label-map images: 'ID=NAME,ID=NAME,...', "
                                 "'NAME,NAME,...' (ids 0, 1, ...), or a .json file ({\"ID\": NAME} or "
                                 "[NAME, ...]); required for label_map_uri rows")
        parser.add_argument("--ignore_id", default="255", metavar="ID",
                            help="label-map id of ground-truth pixels left out of every count; in a "
                                 "prediction it means 'no label' (default 255; 'none' to switch off)")
        parser.add_argument("--unlabeled_id", default="none", metavar="ID",
                            help="label-map id meaning 'no label' in ground truth and predictions "
                                 "alike (Valor's background: counted in Accuracy, the source of "
                                 "unmatched pixels; default none)")
        parser.add_argument("--max_image_pixels", type=int, default=MAX_IMAGE_PIXELS, metavar="N",
                            help="largest image a row may hold, in pixels (height x width of its "
                                 "shape, RLEs, masks and label map; default 100000000: about 0.4-0.8 "
                                 "GB per worker while such a datum is matched); larger rows are rejected")
        parser.add_argument("--max_mask_bytes", type=int, default=MAX_MASK_BYTES, metavar="N",
                            help="most bytes read from one mask or label-map file (default 268435456, "
                                 "256 MiB); larger files are rejected")
        parser.add_argument("--max_labels", type=int, default=MAX_LABELS, metavar="N",
                            help="most distinct labels in a run (default 2000): each (model, slice) "
                                 "keeps a (labels + 1)^2 pixel matrix; more stop the run")

    def configure(self, args) -> SegmentationConfig:
        label_names = parse_label_names(args.label_names)
        ignore_id = parse_optional_number(args.ignore_id, "--ignore_id", int, 0, 65535)
        unlabeled_id = parse_optional_number(args.unlabeled_id, "--unlabeled_id", int, 0, 65535)
        for flag, value in (("--ignore_id", ignore_id), ("--unlabeled_id", unlabeled_id)):
            if value is not None and label_names and value in label_names:
                raise UsageError(f"{flag} {value} is also a class in --label_names "
                                 f"({label_names[value]!r}); pick another id or 'none'")
        if ignore_id is not None and ignore_id == unlabeled_id:
            raise UsageError("--ignore_id and --unlabeled_id must differ")
        if not 1 <= args.max_image_pixels <= MAX_RLE_PIXELS:
            raise UsageError(f"--max_image_pixels must lie in [1, {MAX_RLE_PIXELS}] (pycocotools' "
                             f"RLE run lengths are 32-bit); got {args.max_image_pixels}")
        for flag, value in (("--max_mask_bytes", args.max_mask_bytes), ("--max_labels", args.max_labels)):
            if value < 1:
                raise UsageError(f"{flag} must be 1 or more; got {value}")
        return SegmentationConfig(label_names, ignore_id, unlabeled_id,
                                  ImageLimits(args.max_image_pixels, args.max_mask_bytes), args.max_labels)

    def options(self, config: SegmentationConfig, args) -> dict:
        return {"label_names": {str(k): v for k, v in sorted((config.label_names or {}).items())},
                "ignore_id": config.ignore_id, "unlabeled_id": config.unlabeled_id,
                "max_image_pixels": config.limits.max_pixels, "max_mask_bytes": config.limits.max_mask_bytes,
                "max_labels": config.max_labels}

    def option_files(self, args) -> tuple:
        return tuple(filter(None, [label_names_file(args.label_names)]))

    def check_source(self, name: str, source, config: SegmentationConfig, slices) -> None:
        label_names = config.label_names
        from evalbeam.transforms.io import InputError
        from evalbeam.transforms.preflight import preflight

        for path in source.files:
            if format_of(path) not in ("jsonl", "parquet") or path.lower().endswith(".json"):
                raise InputError(f"{path} (given for {name}) is not a .jsonl or .parquet file of "
                                 "segmentation rows; see pipelines/tasks/segmentation.md for the format.")
        preflight(source, None, ("datum_uid",), [], task=NAME)
        if label_names is None:
            for path in source.files:
                row = _first_row(path)
                if isinstance(row, dict) and row.get("label_map_uri") is not None:
                    raise InputError(f"{path} (given for {name}) holds label maps (label_map_uri) but "
                                     "--label_names is not set: say which label each class id is, e.g. "
                                     "--label_names 0=road,1=car or --label_names names.json.")

    def summarize(self, metrics_path: str, info: dict, config: SegmentationConfig) -> str:
        return segmentation_summary(metrics_path, info["counts"])


TASK = SegmentationTask()


run = TASK.run

if __name__ == "__main__":
    TASK.main()
