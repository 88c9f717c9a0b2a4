"""Beam plumbing of object detection: COCO files or native rows, COCO or Valor protocol.

ReadCocoFile (a COCO file) and ReadNativeFile (native JSONL/Parquet rows) load each file in a
worker, validate it into columns (schemas/coco_rows.py, schemas/detection_rows.py) and split
images, annotations and detections by shard (FNV-1a of the image id); DetectionRowsFromDicts
does the same for row dicts of a user's PCollections. MatchDetection computes each model's
DetectionState (transforms/kernels/detection.py) per shard and slice; combine_states
(transforms/merge.py) merges the states of each (model, slice), and records_of turns each merged
state into records with the kernel's state_records (pycocotools' accumulate and summarize, or
Valor's metrics). Without --score_bins and --bootstrap the merge and the accumulation run per
(model, slice, category) instead (_records_by_category; pipelines/detection.md).
"""

from __future__ import annotations

import json
import os
import typing

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalbeam.schemas.coco import to_rle
from evalbeam.schemas.coco_rows import (INT64, MAX_DOCUMENT_NESTING, BoxRows, ImageRows, box_rows,
                                        coco_document, coco_piece, image_rows)
from evalbeam.schemas.detection_rows import RowIndex, geometry_area, labels_of, native_rows, stable_id
from evalbeam.schemas.formats import position_name
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.schemas.json_pieces import array_pieces
from evalbeam.schemas.limits import (MAX_IMAGE_PAIRS, MAX_IMAGE_PIXELS, label_length_problem,
                                     pair_count_problem)
from evalbeam.schemas.rejections import reject
from evalbeam.schemas.slices import canonical_json
from evalbeam.transforms.evaluated import Evaluated, EvaluateRows
from evalbeam.transforms.grouping import group_by_shard
from evalbeam.transforms.io import (GROUNDTRUTHS, TAG_REJECTED, TAG_STATS, ProgressDoFn, ReadError,
                                    ReadFiles, ReadRowFile, line_splittable, open_input,
                                    read_pcollections, span_text)
from evalbeam.transforms.kernels.detection import (COCO, VALOR, CocoState, DetailedState,
                                                   DetectionConfig, DetectionState, Protocol,
                                                   coco_state, detailed_curve, image_pair_counts,
                                                   SPLIT_MIN_DETECTIONS, category_parts,
                                                   category_records, category_result,
                                                   label_spans, pair_box_iou, span_part,
                                                   splits_by_category, state_records)
from evalbeam.transforms.kernels.detection_confusion import ConfusionState, confusion_state
from evalbeam.transforms.kernels.masks import as_polygon, pair_geometry_iou, pair_mask_iou
from evalbeam.transforms.merge import (STATE_KEY, combine_states, merged_records, metered_states,
                                      records_of)

TAG_CATEGORIES = "categories"
TAG_SIZES = "sizes"     # (model, {category id: detections}) of each piece read (DetectionSizes)
TAG_PRESENCE = "presence"
# what one bootstrap weight is drawn for, as the intervals name it (SPEC.interval_unit too)
INTERVAL_UNIT = "image"
PARTIAL = typing.Tuple[typing.Tuple[str, str], typing.Any]


def image_shards(image_id: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard of each image: FNV-1a of the decimal image id, mod num_shards.

    Each distinct id is hashed once (a results file names each image ~50 times), its decimal
    text made by Arrow's cast, which writes int64 as str() does: 0.64 s -> 0.05 s for 2.8 M
    detections of 50,000 images."""
    distinct, inverse = np.unique(np.asarray(image_id, dtype=np.int64), return_inverse=True)
    hashes = fnv1a_64(pc.cast(pa.array(distinct, pa.int64()), pa.string()))
    return (hashes % np.uint64(num_shards)).astype(np.int64)[inverse.reshape(-1)]


def _split(shards: np.ndarray, num_shards: int):
    """{shard: indices} of the rows of each shard present."""
    order = np.argsort(shards, kind="stable")
    bounds = np.searchsorted(shards[order], np.arange(num_shards + 1))
    return {s: order[bounds[s]:bounds[s + 1]] for s in range(num_shards) if bounds[s + 1] > bounds[s]}


def _concat_images(parts: list[ImageRows]) -> ImageRows:
    return ImageRows(
        np.concatenate([p.image_id for p in parts]), np.concatenate([p.height for p in parts]),
        np.concatenate([p.width for p in parts]),
        {k: sum((p.slices[k] for p in parts), []) for k in parts[0].slices},
        np.concatenate([p.position for p in parts]), np.concatenate([p.file_id for p in parts]),
        sum((p.uid for p in parts), []))


def _take_images(images: ImageRows, index: np.ndarray) -> ImageRows:
    return ImageRows(images.image_id[index], images.height[index], images.width[index],
                     {k: [v[i] for i in index] for k, v in images.slices.items()},
                     images.position[index], images.file_id[index],
                     [images.uid[i] for i in np.asarray(index, dtype=np.int64)])


def _concat_rows(parts: list[RowIndex]) -> RowIndex:
    return RowIndex(np.concatenate([p.image_id for p in parts]), sum((p.uid for p in parts), []),
                    np.concatenate([p.position for p in parts]),
                    np.concatenate([p.file_id for p in parts]))


def _concat_boxes(parts: list[BoxRows]) -> BoxRows:
    return BoxRows(
        np.concatenate([p.image_id for p in parts]), np.concatenate([p.category_id for p in parts]),
        np.concatenate([p.bbox for p in parts]), np.concatenate([p.value for p in parts]),
        np.concatenate([p.crowd for p in parts]),
        None if parts[0].segmentation is None else sum((p.segmentation for p in parts), []),
        np.concatenate([p.position for p in parts]))


class ReadCocoFile(ProgressDoFn):
    """(source name, file id) -> shard pieces of one COCO file.

    Ground truth: (shard, (GROUNDTRUTHS, (ImageRows, BoxRows, rejected image ids))) and the
    categories as TAG_CATEGORIES {"id": [...], "name": [...]}; results: (shard, (model,
    (area_from_bbox, BoxRows))). Bad rows leave through TAG_REJECTED; counts through TAG_STATS.
    A file that is not one usable COCO document (cut short, not JSON, nested too deep, of the
    wrong shape, repeated category ids, a category name longer than MAX_LABEL_CHARS characters)
    raises transforms.io.ReadError: the launcher reports it as an input error (exit 2).

    Rows are checked here on their own; the checks of an annotation against the images and
    categories (its image exists and was not rejected, its category exists) are
    MatchDetection's, which sees each shard's images and every category: so the annotations
    need not be read where the images are. The rejected image ids go to their shards for that.

    ReadFiles cuts an uncompressed file larger than the split size into pieces (cuttable, cut;
    transforms.io.CutFiles): a results file's array, an instances file's "annotations" array.
    This reads each piece, (source name, file id, start, end, first element, last,
    area_from_bbox), as the shard pieces of its elements, positions counted from the array's
    first; an instances file's rest, (source name, file id, start, end, None, None, None), is
    the document with the annotations array (bytes start to end) replaced by []. A piece that
    does not parse makes its worker parse the file whole for the error a whole read gives."""

    def __init__(self, sources, iou_type: str, slice_keys: list[str], num_shards: int,
                 quiet: bool, started: float, max_pixels: int = MAX_IMAGE_PIXELS):
        super().__init__(quiet, started)
        self.sources = sources
        self.iou_type = iou_type
        self.slice_keys = slice_keys
        self.num_shards = num_shards
        self.max_pixels = max_pixels

    def _rejects(self, name, path, bad, what=""):
        for position, reason in bad:
            yield beam.pvalue.TaggedOutput(
                TAG_REJECTED, reject(name, path, int(position), what + reason, None, "row"))

    def process(self, element):
        if len(element) > 2:
            yield from self._piece(*element)
            return
        name, file_id = element
        path = self.sources[name].files[file_id]
        with open_input(path) as stream:
            obj, reason = coco_document(stream.read())
        if reason:
            raise ReadError(f"{path} (given for {name}) {reason}. Nothing of it was used.")
        segm = self.iou_type == "segm"
        if name == GROUNDTRUTHS:
            yield from self._groundtruth(name, path, obj, segm)
        else:
            yield from self._results(name, path, obj, segm)
        self.progress.say(path, f"read {path}", force=True)

    def cuttable(self, name, path) -> bool:
        """Whether ReadFiles may cut the file into pieces: uncompressed."""
        return line_splittable(path)

    def cut(self, name, file_id, path, split_bytes: int) -> list[tuple] | None:
        """The pieces of about split_bytes each of a results file's array, or of an instances
        file's "annotations" array and the rest of it; None: read it whole."""
        groundtruth = name == GROUNDTRUTHS
        area_from_bbox = None
        with open_input(path) as stream:
            cut = array_pieces(stream, split_bytes, MAX_DOCUMENT_NESTING,
                               "annotations" if groundtruth else None)
            if cut is None:
                return None
            if not groundtruth:
                stream.seek(cut.head[0])
                head = coco_piece(stream.read(cut.head[1] - cut.head[0]), False, False)
                # a first element that does not parse fails its piece, and the run, anyway
                area_from_bbox = _areas_from_boxes(head or [])
        last = len(cut.pieces) - 1
        self.progress.say(path, f"cut {path} into {last + 1} pieces", force=True)
        rest = [(name, file_id, *cut.span, None, None, None)] if groundtruth else []
        return rest + [(name, file_id, start, end, first, k == last, area_from_bbox)
                       for k, (start, end, first) in enumerate(cut.pieces)]

    def _piece(self, name, file_id, start, end, first, last, area_from_bbox):
        path = self.sources[name].files[file_id]
        with open_input(path) as stream:
            if first is None:     # an instances file without its annotations
                raw = stream.read(start) + b"[]"
                stream.seek(end)
                obj, reason = coco_document(raw + stream.read())
                obj = None if reason else obj
            else:
                stream.seek(start)
                obj = coco_piece(stream.read(end - start), first == 0, last)
        if obj is None:
            raise self._whole_error(name, path) or ReadError(
                f"{path} (given for {name}) {_UNCUT}. Nothing of it was used.")
        segm = self.iou_type == "segm"
        if first is None:
            try:
                outputs = list(self._groundtruth(name, path, obj, segm))
            except ReadError as error:
                # a whole read names the JSON's error first, which a piece may hold
                raise self._whole_error(name, path) or error from None
            yield from outputs
            self.progress.say(path, f"read {path} but its annotations")
        elif name == GROUNDTRUTHS:
            yield from self._annotations(name, path, obj, segm, first)
            self.progress.say(path, f"read {path}{span_text(start, end)}")
        else:
            yield from self._results(name, path, obj, segm, area_from_bbox, first)
            self.progress.say(path, f"read {path}{span_text(start, end)}")

    def _whole_error(self, name, path) -> ReadError | None:
        """The error of parsing the file whole, if it has one."""
        with open_input(path) as stream:
            _, reason = coco_document(stream.read())
        return reason and ReadError(f"{path} (given for {name}) {reason}. Nothing of it was used.")

    def _groundtruth(self, name, path, obj, segm):
        """The images, categories and annotations of an instances file (the annotations of a
        cut one are [] here: its pieces hold them)."""
        if not isinstance(obj, dict):
            raise ReadError(f"{path} (given for {name}) is not a COCO instances file (a JSON "
                            "object). Nothing of it was used.")
        lists = {key: obj.get(key, []) for key in ("images", "annotations", "categories")}
        wrong = [key for key, value in lists.items() if not isinstance(value, list)]
        if wrong:
            raise ReadError(f"{path} (given for {name}) is not a COCO instances file: its "
                            f"\"{wrong[0]}\" is not a JSON array. Nothing of it was used.")
        images, bad_images = image_rows(lists["images"], self.slice_keys, need_size=segm,
                                        max_pixels=self.max_pixels)
        categories = sorted((c for c in lists["categories"]
                             if isinstance(c, dict) and isinstance(c.get("id"), int)
                             and not isinstance(c["id"], bool) and INT64[0] <= c["id"] <= INT64[1]),
                            key=lambda c: c["id"])
        category_id = np.array([c["id"] for c in categories], dtype=np.int64)
        if category_id.size != np.unique(category_id).size:
            raise ReadError(f"{path} (given for {name}) has category ids that are not unique, so "
                            "a category_id cannot name one category. Nothing of it was used.")
        category_name = [str(c.get("name", c["id"])) for c in categories]
        too_long = next(filter(None, (label_length_problem(f"the name of category {c['id']}", len(n))
                                      for c, n in zip(categories, category_name))), None)
        if too_long:
            # the categories are the file's vocabulary, not rows: rejecting one would reject all
            # its annotations and change what the metrics mean, so the file is refused whole
            raise ReadError(f"{path} (given for {name}) cannot be used: {too_long}. Nothing of "
                            "it was used.")
        # images rejected for their own reasons (a repeated id, a slice value, a size) still
        # have ids: MatchDetection rejects their annotations as such, not as naming no image
        rejected_ids = np.array(sorted({im["id"] for im in lists["images"] if isinstance(im, dict)
                                        and isinstance(im.get("id"), int)
                                        and INT64[0] <= im["id"] <= INT64[1]}
                                       - set(images.image_id.tolist())), dtype=np.int64)
        yield from self._rejects(name, path, bad_images, "image: ")
        n_images = len(lists["images"])
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", name), n_images))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", name), len(bad_images)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", name), n_images - len(bad_images)))
        yield beam.pvalue.TaggedOutput(TAG_CATEGORIES, {"id": category_id.tolist(),
                                                        "name": category_name})
        image_parts = _split(image_shards(images.image_id, self.num_shards), self.num_shards)
        rejected_parts = _split(image_shards(rejected_ids, self.num_shards), self.num_shards)
        anns = yield from self._annotation_rows(name, path, lists["annotations"], segm)
        ann_parts = _split(image_shards(anns.image_id, self.num_shards), self.num_shards)
        empty = np.zeros(0, np.int64)
        for shard in sorted(set(image_parts) | set(rejected_parts) | set(ann_parts)):
            yield shard, (name, (_take_images(images, image_parts.get(shard, empty)),
                                 anns.take(ann_parts.get(shard, empty)),
                                 rejected_ids[rejected_parts.get(shard, empty)]))

    def _annotations(self, name, path, annotations: list, segm: bool, first: int):
        """Shard pieces of a piece of an instances file's annotations, whose first is the
        array's element `first`."""
        anns = yield from self._annotation_rows(name, path, annotations, segm, first)
        images = _no_images(self.slice_keys)
        no_ids = np.zeros(0, np.int64)
        for shard, index in _split(image_shards(anns.image_id, self.num_shards),
                                   self.num_shards).items():
            yield shard, (name, (images, anns.take(index), no_ids))

    def _annotation_rows(self, name, path, annotations: list, segm: bool, first: int = 0):
        """Yields the rejects and counts of annotations whose first is the array's element
        `first`; returns the valid ones (BoxRows, positions counted from the array's first)."""
        anns, bad = box_rows(annotations, detections=False, need_segmentation=segm,
                             max_pixels=self.max_pixels)
        if first:
            anns.position += first
            bad = [(position + first, reason) for position, reason in bad]
        yield from self._rejects(name, path, bad)
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", name), len(annotations)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", name), len(bad)))
        return anns

    def _results(self, name, path, obj, segm, area_from_bbox=None, first=0):
        """Shard pieces of results obj, a whole file's or a piece's whose first element is the
        file's element `first` (positions count from the file's first element)."""
        if not isinstance(obj, list):
            raise ReadError(f"{path} (given for {name}) is not a COCO results file (a JSON array "
                            "of detections). Nothing of it was used.")
        if area_from_bbox is None:
            area_from_bbox = _areas_from_boxes(obj)
        dts, bad = box_rows(obj, detections=True, need_segmentation=segm, max_pixels=self.max_pixels)
        if first:
            dts.position += first
            bad = [(position + first, reason) for position, reason in bad]
        yield from self._rejects(name, path, bad)
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", name), len(obj)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", name), len(bad)))
        yield beam.pvalue.TaggedOutput(TAG_SIZES, (name, detection_sizes(dts.category_id)))
        for shard, index in _split(image_shards(dts.image_id, self.num_shards), self.num_shards).items():
            yield shard, (name, (area_from_bbox, dts.take(index)))


def _no_images(slice_keys: list[str]) -> ImageRows:
    empty = np.zeros(0, np.int64)
    return ImageRows(empty, empty, empty, {key: [] for key in slice_keys}, empty,
                     np.zeros(0, np.int32), [])


def _areas_from_boxes(results: list) -> bool:
    """pycocotools' loadRes: when the first result has a bbox, detection areas are box areas."""
    return bool(results) and isinstance(results[0], dict) and bool(results[0].get("bbox"))


# a piece that does not parse while the whole document does: the cut was wrong
_UNCUT = ("could not be read in pieces, though it parses whole: please report this; "
          "--input_split_bytes 0 reads every file whole")


class ReadNativeFile(ReadRowFile):
    """(source name, file id) -> shard pieces of a native JSONL/Parquet detection file.

    Ground truth: (shard, (GROUNDTRUTHS, (ImageRows, BoxRows))); predictions: (shard, (model,
    (True, BoxRows, RowIndex))). TAG_CATEGORIES: (source name, the set of labels seen)."""

    def __init__(self, sources, slice_keys: list[str], num_shards: int, quiet: bool, started: float,
                 iou_type: str = "bbox", max_pixels: int = MAX_IMAGE_PIXELS):
        super().__init__(sources, slice_keys, num_shards, quiet, started)
        self.geometry = "polygon" if iou_type == "segm" else "bbox"
        self.max_pixels = max_pixels

    def pieces(self, name, rows, positions, rejected, path, file_id, where):
        return native_pieces(name, rows, positions, rejected, path, file_id, self.slice_keys,
                             self.num_shards, self.geometry, where, self.max_pixels)


def native_pieces(name, rows, positions, rejected, path, file_id, slice_keys, num_shards, geometry,
                  where, max_pixels: int = MAX_IMAGE_PIXELS):
    """Shard pieces (main output), rejects, stats and (source, labels) (tagged) of parsed native
    rows of one source. Rows from a PCollection have position None (-1 inside the arrays) and
    name their source as the file."""
    scored = name != GROUNDTRUTHS
    first, boxes, bad = native_rows(rows, [-1 if p is None else p for p in positions], scored,
                                    slice_keys if not scored else [], file_id, geometry, max_pixels)
    for position, uid, reason in rejected + bad:
        position = None if position is None or position < 0 else position
        yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(name, path, position, reason, uid, where))
    yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_read", name), len(rows) + len(rejected)))
    yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", name), len(rejected) + len(bad)))
    yield beam.pvalue.TaggedOutput(TAG_CATEGORIES, (name, labels_of(rows)))
    if scored:
        yield beam.pvalue.TaggedOutput(TAG_SIZES, (name, detection_sizes(boxes.category_id)))
    row_parts = _split(image_shards(first.image_id, num_shards), num_shards)
    box_parts = _split(image_shards(boxes.image_id, num_shards), num_shards)
    empty = np.zeros(0, np.int64)
    for shard in sorted(set(row_parts) | set(box_parts)):
        index, box_index = row_parts.get(shard, empty), box_parts.get(shard, empty)
        if scored:
            yield shard, (name, (True, boxes.take(box_index), first.take(index)))
        else:
            yield shard, (name, (_take_images(first, index), boxes.take(box_index)))


class DetectionRowsFromDicts(beam.DoFn):
    """(source, [row dict, ...]) batches -> shard pieces, like ReadNativeFile for files."""

    def __init__(self, slice_keys: list[str], num_shards: int, iou_type: str):
        self.slice_keys = slice_keys
        self.num_shards = num_shards
        self.geometry = "polygon" if iou_type == "segm" else "bbox"

    def process(self, element):
        source, batch = element
        yield from native_pieces(source, batch, [None] * len(batch), [], source, 0, self.slice_keys,
                                 self.num_shards, self.geometry, "row")


def category_table(labels: set) -> dict:
    """{"id": sorted label ids, "name": labels in the same order} for native rows."""
    names = sorted(labels)
    ids = stable_id(names) if names else np.zeros(0, np.int64)
    order = np.argsort(ids)
    return {"id": ids[order].tolist(), "name": [names[i] for i in order]}


class LabelUnion(beam.CombineFn):
    """(source, labels) -> the category table of all sources' labels together."""

    def create_accumulator(self):
        return set()

    def add_input(self, acc, source_labels):
        acc.update(source_labels[1])
        return acc

    def merge_accumulators(self, accs):
        return set().union(*accs)

    def extract_output(self, acc):
        return category_table(acc)


SIZED_CATEGORIES = 16     # the most categories a piece reports to DetectionSizes


def detection_sizes(category_id: np.ndarray) -> dict:
    """{category id: its detections} of one piece's boxes, for its SIZED_CATEGORIES largest
    categories (ties: the smaller id). Only a category holding a quarter of a model's
    detections is ever split, and it is among the largest of nearly every piece; the ids are
    unchecked here (unknown ones are rejected later), so a file of distinct junk ids must not
    make the side input as large as itself. A category left out of some pieces is undercounted,
    which changes only whether it is split, never a record."""
    ids, counts = np.unique(category_id, return_counts=True)
    keep = np.lexsort((ids, -counts))[:SIZED_CATEGORIES]
    return dict(zip(ids[keep].tolist(), counts[keep].tolist()))


class DetectionSizes(beam.CombineFn):
    """(model, {category id: detections}) of every piece -> {model: {category id: detections}}
    over the whole input: what _by_category splits the largest labels by."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, model_sizes):
        model, sizes = model_sizes
        held = acc.setdefault(model, {})
        for category, n in sizes.items():
            held[category] = held.get(category, 0) + n
        return acc

    def merge_accumulators(self, accs):
        total: dict = {}
        for acc in accs:
            for model, sizes in acc.items():
                self.add_input(total, (model, sizes))
        return total

    def extract_output(self, acc):
        return acc


def split_detections() -> int:
    """SPLIT_MIN_DETECTIONS, or EVALBEAM_SPLIT_DETECTIONS where the pipeline is built (the tests
    set 0 to split small inputs' labels)."""
    return int(os.environ.get("EVALBEAM_SPLIT_DETECTIONS", SPLIT_MIN_DETECTIONS))


def image_hashes(images: ImageRows) -> np.ndarray:
    """uint64[I]: the datum hash of each image, FNV-1a 64 of its datum_uid (native rows: the
    datum_uid; COCO files: the decimal image id, e.g. "139"). A bootstrap weight is drawn per
    hash, so an image has the same weight in every shard, slice and model."""
    return fnv1a_64(pa.array([str(u) for u in images.uid], pa.string()))


def shard_state(images: ImageRows, gts: BoxRows, dts: BoxRows, category_id: np.ndarray,
                iou_type: str, area_from_bbox: bool, protocol: Protocol = COCO,
                bootstrap=None) -> CocoState:
    """CocoState of the given images (gts and dts must belong to them); with the valor protocol
    the tuple (CocoState, DetailedState, ConfusionState). MatchDetection wraps either in a
    DetectionState. An enabled bootstrap (kernels.bootstrap.Bootstrap) adds the replicate parts
    to the CocoState (image hashes of the rows, weighted ground-truth counts)."""
    order = np.argsort(images.image_id)
    image_id = images.image_id[order]
    boot = {}
    if bootstrap is not None and bootstrap.enabled:
        boot = {"bootstrap": bootstrap, "image_hash": image_hashes(images)[order]}
    gt_image = np.searchsorted(image_id, gts.image_id)
    dt_image = np.searchsorted(image_id, dts.image_id)
    crowd = gts.crowd if protocol.name == "coco" else np.zeros_like(gts.crowd)
    if iou_type == "segm" and gts.segmentation is not None and _are_shapes(gts.segmentation, dts.segmentation):
        dt_area = geometry_area(dts.segmentation or [])
        pair_iou = pair_geometry_iou(dts.segmentation, gts.segmentation)
    elif iou_type == "segm":
        from pycocotools import mask as mask_utils

        height, width = images.height[order], images.width[order]
        gt_rles = [to_rle(s, int(height[i]), int(width[i])) for s, i in zip(gts.segmentation, gt_image)]
        dt_rles = [to_rle(s, int(height[i]), int(width[i])) for s, i in zip(dts.segmentation, dt_image)]
        mask_area = np.array([mask_utils.area(r) for r in dt_rles], dtype=np.float64)
        box_area = dts.bbox[:, 2] * dts.bbox[:, 3]
        dt_area = np.where(np.isnan(box_area) | (not area_from_bbox), mask_area, box_area)
        pair_iou = pair_mask_iou(dt_rles, gt_rles, crowd)
    else:
        dt_area = dts.bbox[:, 2] * dts.bbox[:, 3]
        pair_iou = pair_box_iou(dts.bbox, gts.bbox, crowd)
    pairs = None
    if protocol.detailed and iou_type == "segm":
        # Mask and polygon IoUs cost microseconds each: the confusion matrix needs every pair of
        # an image, matching those of one label, so each is computed once and looked up.
        d, g = _image_pairs(dt_image, gt_image)
        pairs = (d, g, pair_iou(d, g) if d.size else np.zeros(0))
        pair_iou = _looked_up(*pairs, gts.value.size)
    gt_label = np.searchsorted(category_id, gts.category_id)
    dt_label = np.searchsorted(category_id, dts.category_id)
    result = coco_state(image_id, category_id.size, gt_image, gt_label, gts.value, crowd,
                        dt_image, dt_label, dts.value, dt_area, pair_iou,
                        with_matches=protocol.detailed, **boot, **protocol.options)
    if not protocol.detailed:
        return result
    state, kept, matched_gt = result
    t = list(protocol.matching_thresholds).index(protocol.pr_curve_iou_threshold)
    uids = [images.uid[i] for i in order]
    hashes = stable_id(uids).view(np.uint64) if uids else np.zeros(0, np.uint64)
    detailed, confusion = _valor_states(kept, matched_gt[:, 0, t], dt_image, dt_label, dts,
                                        gt_image, gt_label, gts, pair_iou, protocol,
                                        category_id.size, uids, hashes, pairs)
    return state, detailed, confusion


def _looked_up(d: np.ndarray, g: np.ndarray, iou: np.ndarray, n_gt: int):
    """pair_iou reading the IoUs of computed pairs (d, g, iou; _image_pairs' order, which
    sorts d * n_gt + g) instead of computing them again."""
    key = d * n_gt + g

    def lookup(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        return iou[np.searchsorted(key, dt_index * n_gt + gt_index)]
    return lookup


def _image_pairs(dt_image: np.ndarray, gt_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (detection, ground truth) pair of the same image, as index arrays."""
    gt_order = np.argsort(gt_image, kind="stable")
    n_images = int(max(dt_image.max(initial=-1), gt_image.max(initial=-1))) + 1
    per_image = np.bincount(gt_image, minlength=n_images)
    first = np.r_[0, np.cumsum(per_image)[:-1]]
    counts = per_image[dt_image]
    dt_index = np.repeat(np.arange(dt_image.size), counts)
    offset = np.arange(dt_index.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return dt_index, gt_order[np.repeat(first[dt_image], counts) + offset]


def _geojson(box, shape) -> dict | None:
    if shape is not None:
        import shapely

        return json.loads(shapely.to_geojson(as_polygon(shape)))
    if np.isnan(box).any():
        return None
    x, y, w, h = (float(v) for v in box)
    return {"type": "Polygon", "coordinates": [[[x, y], [x + w, y], [x + w, y + h], [x, y + h], [x, y]]]}


def _valor_states(kept, taken, dt_image, dt_label, dts, gt_image, gt_label, gts, pair_iou,
                  protocol, n_labels, uids, hashes, pairs=None) -> tuple[DetailedState, ConfusionState]:
    """The DetailedState (at the PR curve's IoU threshold; kept and taken come from coco_match)
    and the ConfusionState of one shard. pairs: (d, g, iou) of _image_pairs, if computed."""
    score = dts.value
    if pairs is None:
        d, g = _image_pairs(dt_image, gt_image)
        pairs = (d, g, pair_iou(d, g) if d.size else np.zeros(0))
    d, g, iou = pairs
    shapes = dts.segmentation if _are_shapes(dts.segmentation or [], gts.segmentation or []) else None
    gt_shapes = gts.segmentation if shapes is not None or _are_shapes(gts.segmentation or []) else None

    def dt_example(i: int) -> dict:
        return {"datum_uid": uids[dt_image[i]], "score": float(score[i]),
                "geometry": _geojson(dts.bbox[i], shapes[i] if shapes else None)}

    def gt_example(i: int) -> dict:
        return {"datum_uid": uids[gt_image[i]],
                "geometry": _geojson(gts.bbox[i], gt_shapes[i] if gt_shapes else None)}

    dt_hash = hashes[dt_image] if score.size else np.zeros(0, np.uint64)
    gt_hash = hashes[gt_image] if gts.value.size else np.zeros(0, np.uint64)
    # Examples: smallest (datum hash, row position); annotations of one row keep their order.
    dt_index, gt_index = np.arange(score.size), np.arange(gts.value.size)

    # other-label overlaps at the PR curve's IoU threshold
    other = (dt_label[d] != gt_label[g]) & (iou >= min(protocol.pr_curve_iou_threshold, 1 - 1e-10))
    misclassified = np.zeros(score.size, dtype=bool)
    misclassified[d[other]] = True
    other_best = np.full(gts.value.size, -1.0)
    np.maximum.at(other_best, g[other], score[d[other]])
    taker = np.full(gts.value.size, -1.0)
    took = taken >= 0
    taker[taken[took]] = score[kept[took]]
    matched = np.zeros(score.size, dtype=bool)
    matched[kept[took]] = True
    detailed = detailed_curve(
        dt_label, score, matched, misclassified, gt_label, taker, other_best, n_labels,
        np.array(protocol.pr_curve_thresholds), protocol.max_examples,
        (dt_hash, dts.position, dt_index), (gt_hash, gts.position, gt_index),
        lambda kind, i: dt_example(i) if kind == 0 else gt_example(i))

    def describe(kind: int, i: int, j: int) -> dict:
        if kind == 1:
            return gt_example(j)
        if kind == 2:
            return dt_example(i)
        pair = dt_example(i)
        pair["prediction"] = pair.pop("geometry")
        pair["groundtruth"] = gt_example(j)["geometry"]
        return pair

    confusion = confusion_state(
        d, g, iou, dt_label, score, gt_label, n_labels, np.array(protocol.iou_thresholds),
        np.array(protocol.score_thresholds), protocol.max_examples, (dt_hash, dts.position),
        (gt_hash, gts.position), describe)
    return detailed, confusion


def _are_shapes(*lists) -> bool:
    """Whether segmentations are shapely geometries (native polygons) rather than COCO objects."""
    for items in lists:
        if items:
            return not isinstance(items[0], (dict, list))
    return False


class MatchDetection(ProgressDoFn):
    """(shard, pieces) -> ((model, slice JSON), DetectionState) per model and slice; rejects
    detections whose image or category the ground truth does not have, and annotations of an
    instances file whose image or category it does not have (_coco_groundtruth).

    config.bootstrap (enabled): each CocoState also carries its replicate parts (shard_state).
    presence (with or without config.bootstrap): tagged TAG_PRESENCE, per slice, (slice JSON,
    ("groundtruths", uint64 hashes of the slice's images)) and (slice JSON, (model, hashes of
    those images with a prediction of the model: a valid native prediction row, or at least one
    valid COCO detection)), for the paired comparisons' coverage counts."""

    def __init__(self, config: DetectionConfig, models, slice_specs, files, quiet, started,
                 presence: bool = False):
        super().__init__(quiet, started)
        self.bootstrap = config.bootstrap if config.bootstrap is not None and config.bootstrap.enabled else None
        self.presence = bool(presence)
        self.protocol = config.protocol
        self.native = config.native
        self.models = models
        self.slice_specs = [tuple(s) for s in slice_specs]
        self.iou_type = config.iou_type
        self.max_image_pairs = config.max_image_pairs
        self.files = files

    def _reject_rows(self, source, index: RowIndex, where, reason_of):
        files = self.files.get(source)
        for i in where:
            path = files[int(index.file_id[i])] if files else source
            position = int(index.position[i])
            yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(
                source, path, position if position >= 0 else None, reason_of(i), index.uid[i],
                position_name(path) if files else "row"))

    def _native_groundtruth(self, images: ImageRows, gts: BoxRows):
        """Reject every copy of a datum_uid that appears more than once (native rows)."""
        _, inverse, counts = np.unique(images.image_id, return_inverse=True, return_counts=True)
        repeated = np.flatnonzero(counts[inverse] > 1)
        if repeated.size:
            index = RowIndex(images.image_id, [None] * images.image_id.size, images.position,
                             images.file_id)
            times = counts[inverse]
            outputs = list(self._reject_rows(GROUNDTRUTHS, index, repeated,
                                             lambda i: f"datum_uid appears {times[i]} times in groundtruths"))
            keep = np.flatnonzero(counts[inverse] == 1)
            dropped = images.image_id[repeated]
            images = _take_images(images, keep)
            gts = gts.take(np.flatnonzero(~np.isin(gts.image_id, dropped)))
        else:
            outputs = []
        return images, gts, outputs, repeated.size

    def process(self, element, categories):
        shard, pieces = element
        category_id = np.array(categories["id"], dtype=np.int64)
        gt_pieces = [p for source, p in pieces if source == GROUNDTRUTHS]
        images = _concat_images([p[0] for p in gt_pieces]) if gt_pieces else None
        gts = _concat_boxes([p[1] for p in gt_pieces]) if gt_pieces else None
        if self.native and images is not None:
            images, gts, outputs, n_dropped = self._native_groundtruth(images, gts)
            yield from outputs
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", GROUNDTRUTHS), n_dropped))
            yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", GROUNDTRUTHS), images.image_id.size))
        elif images is not None:
            images, gts = yield from self._coco_groundtruth(gt_pieces, images, gts, category_id)
        groups = self._slice_groups(images) if images is not None else []
        hashes = image_hashes(images) if self.presence and images is not None else None
        if hashes is not None:
            for slice_json, image_index in groups:
                yield beam.pvalue.TaggedOutput(TAG_PRESENCE, (slice_json, (GROUNDTRUTHS, hashes[image_index])))
        for model in self.models:
            parts = [p for source, p in pieces if source == model]
            if not parts:
                dts, predicted = None, np.zeros(0, np.int64)
            elif self.native:
                area_from_bbox = True
                dts = _concat_boxes([p[1] for p in parts])
                rows = _concat_rows([p[2] for p in parts])
                _, inverse, counts = np.unique(rows.image_id, return_inverse=True, return_counts=True)
                repeated = counts[inverse] > 1
                known = (np.isin(rows.image_id, images.image_id) if images is not None
                         else np.zeros(rows.image_id.size, bool))
                yield from self._reject_rows(model, rows, np.flatnonzero(repeated), lambda i: (
                    f"datum_uid appears {counts[inverse][i]} times in the predictions of {model}"))
                yield from self._reject_rows(model, rows, np.flatnonzero(~repeated & ~known),
                                             lambda i: "no valid ground truth for this datum_uid")
                ok = ~repeated & known
                dts = dts.take(np.flatnonzero(np.isin(dts.image_id, rows.image_id[ok])))
                crowded = self._crowded(gts, dts, category_id) if images is not None else {}
                if crowded:
                    over = ok & np.isin(rows.image_id, list(crowded))
                    yield from self._reject_rows(model, rows, np.flatnonzero(over),
                                                 lambda i: crowded[int(rows.image_id[i])])
                    ok &= ~over
                    dts = dts.take(np.flatnonzero(~np.isin(dts.image_id, list(crowded))))
                yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", model), int((~ok).sum())))
                yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", model), int(ok.sum())))
                predicted = rows.image_id[ok]
            else:
                area_from_bbox = parts[0][0]
                dts = _concat_boxes([p[1] for p in parts])
                if len(parts) > 1:
                    # pieces of a cut file arrive in any order; ties of score are broken by
                    # file order (coco_match), so the file's order is restored
                    dts = dts.take(np.argsort(dts.position, kind="stable"))
                known_image = (np.isin(dts.image_id, images.image_id) if images is not None
                               else np.zeros(len(dts.image_id), bool))
                known_category = np.isin(dts.category_id, category_id)
                path = self.files[model][0]
                for p in dts.position[~known_image]:
                    yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(
                        model, path, int(p), "no ground-truth image with this image_id", None, "row"))
                for p in dts.position[known_image & ~known_category]:
                    yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(
                        model, path, int(p), "category_id is not a ground-truth category", None, "row"))
                ok = known_image & known_category
                dts = dts.take(np.flatnonzero(ok))
                crowded = self._crowded(gts, dts, category_id) if images is not None else {}
                n_over = 0
                if crowded:
                    over = np.isin(dts.image_id, list(crowded))
                    for p, image in zip(dts.position[over], dts.image_id[over]):
                        yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(
                            model, path, int(p), f"image {int(image)}: {crowded[int(image)]}", None, "row"))
                    n_over = int(over.sum())
                    dts = dts.take(np.flatnonzero(~over))
                yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", model), int((~ok).sum()) + n_over))
                yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", model), int(ok.sum()) - n_over))
                predicted = dts.image_id
            if images is None:
                continue
            if dts is None:
                dts, area_from_bbox = _empty_boxes(gts.segmentation is not None), True
            for slice_json, image_index in groups:
                chosen = images.image_id[image_index]
                if hashes is not None and predicted.size:
                    with_prediction = image_index[np.isin(chosen, predicted)]
                    yield beam.pvalue.TaggedOutput(TAG_PRESENCE, (slice_json, (model, hashes[with_prediction])))
                sub_gts = gts.take(np.flatnonzero(np.isin(gts.image_id, chosen)))
                sub_dts = dts.take(np.flatnonzero(np.isin(dts.image_id, chosen)))
                parts = shard_state(_take_images(images, image_index), sub_gts, sub_dts,
                                    category_id, self.iou_type, area_from_bbox, self.protocol,
                                    self.bootstrap)
                state = DetectionState(*parts) if isinstance(parts, tuple) else DetectionState(parts)
                if self.protocol.score_bins:
                    state = self.protocol.binned(state)
                yield (model, slice_json), state
        self.progress.say("match", f"matched shard {shard}")

    def _coco_groundtruth(self, pieces: list, images: ImageRows, gts: BoxRows,
                          category_id: np.ndarray):
        """Checks the annotations of an instances file that fall in this shard against the
        shard's images and the categories: an annotation of an image rejected by the reader
        (its id is in a piece's rejected ids), of no image, or of no category is rejected.
        Yields the rejects and counts; returns (images, valid annotations in file order), or
        (None, None) when the shard has no valid image."""
        if len(pieces) > 1:
            # pieces of a cut file arrive in any order; matching takes ground truths in file
            # order (ties of IoU), so the file's order is restored
            gts = gts.take(np.argsort(gts.position, kind="stable"))
        known_image = np.isin(gts.image_id, images.image_id)
        of_rejected = np.isin(gts.image_id, np.concatenate([p[2] for p in pieces]))
        known_category = np.isin(gts.category_id, category_id)
        bad = [(p, "image_id names an image that was rejected (see its entry in \"images\")")
               for p in gts.position[of_rejected].tolist()]
        bad += [(p, "image_id has no entry in \"images\"")
                for p in gts.position[~known_image & ~of_rejected].tolist()]
        bad += [(p, "category_id has no entry in \"categories\"")
                for p in gts.position[known_image & ~known_category].tolist()]
        path = self.files[GROUNDTRUTHS][0]
        for position, reason in sorted(bad):
            yield beam.pvalue.TaggedOutput(TAG_REJECTED, reject(GROUNDTRUTHS, path, position,
                                                                reason, None, "row"))
        ok = known_image & known_category
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_rejected", GROUNDTRUTHS), len(bad)))
        yield beam.pvalue.TaggedOutput(TAG_STATS, (("rows_evaluated", GROUNDTRUTHS), int(ok.sum())))
        if not images.image_id.size:
            return None, None
        return images, gts.take(np.flatnonzero(ok))

    def _crowded(self, gts: BoxRows, dts: BoxRows, category_id: np.ndarray) -> dict:
        """{image id: rejection reason} for the images where one model's predictions `dts` make
        more (prediction, ground truth) pairs than config.max_image_pairs (image_pair_counts).
        Matching keeps every pair of an image at once, so one image of 30,000 boxes a side
        (900M pairs) would take more memory than a worker has; checked on counts alone."""
        if not dts.image_id.size or not gts.image_id.size:
            return {}
        ids, index = np.unique(np.r_[gts.image_id, dts.image_id], return_inverse=True)
        n_gt = gts.image_id.size
        labels = np.searchsorted(category_id, np.r_[gts.category_id, dts.category_id])
        pairs, predictions = image_pair_counts(index[:n_gt], labels[:n_gt], index[n_gt:],
                                               labels[n_gt:], ids.size, self.protocol.max_det)
        over = np.flatnonzero(pairs > self.max_image_pairs)
        if not over.size:
            return {}
        ground = np.bincount(index[:n_gt], minlength=ids.size)
        return {int(ids[i]): pair_count_problem(int(predictions[i]), int(ground[i]), int(pairs[i]),
                                                self.max_image_pairs, self.protocol.max_det)
                for i in over}

    def _slice_groups(self, images: ImageRows):
        groups = [("{}", np.arange(images.image_id.size))]
        for spec in self.slice_specs:
            combos: dict = {}
            for i, values in enumerate(zip(*(images.slices[k] for k in spec))):
                combos.setdefault(values, []).append(i)
            for values in sorted(combos):
                parsed = {k: json.loads(v) for k, v in zip(spec, values)}
                groups.append((canonical_json(parsed), np.array(combos[values], dtype=np.int64)))
        return groups


def _empty_boxes(with_segmentation: bool) -> BoxRows:
    return BoxRows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 4)), np.zeros(0),
                   np.zeros(0, bool), [] if with_segmentation else None, np.zeros(0, np.int64))


def label_findings(source_labels: list, models: list) -> list[dict]:
    """The run's findings on label vocabularies of native rows, from (source, labels) pairs:
    transforms.outputs.label_problems (an error when none of a model's labels is a ground-truth
    label: no prediction can be right), plus a warning per model some of whose labels no ground
    truth has (those predictions can only be false positives; the labels get AP 0)."""
    from evalbeam.transforms.outputs import WARNING, label_problems, problem

    labels: dict = {}
    for source, found in source_labels:
        labels.setdefault(source, set()).update(found)
    truth = labels.get(GROUNDTRUTHS, set())
    found = []
    for model in sorted(models):
        predicted = labels.get(model, set())
        errors = label_problems({None: truth}, {model: {None: predicted}})
        found += errors
        extra = predicted - truth
        if extra and not errors:
            shown = ", ".join(repr(v) for v in sorted(extra)[:5]) + (
                f", ... ({len(extra)} in all)" if len(extra) > 5 else "")
            found.append(problem(WARNING, "label_values_unmatched",
                                 f"model {model!r} predicts labels that no ground truth has "
                                 f"({shown}): those predictions count only as false positives "
                                 "(AP 0 for those labels, which lowers mAP)."))
    return found


RECORD_ORDER = ("COCOSummary", "COCOClassSummary", "mAP", "AP", "mAPAveragedOverIOUs",
                "APAveragedOverIOUs", "mAR", "AR", "mARAveragedOverScores", "ARAveragedOverScores",
                "Counts", "Precision", "Recall", "F1", "PrecisionRecallCurve",
                "InterpolatedPrecisionRecallCurve", "DetailedPrecisionRecallCurve", "ConfusionMatrix")
# every record type this task can write (gates check names against it)
METRIC_TYPES = RECORD_ORDER


def record_sort_key(record: dict):
    """model, slice, type, then threshold and label (category id for COCO records)."""
    params = record["parameters"]
    return (record["model"], len(record["slice"]), json.dumps(record["slice"], sort_keys=True),
            RECORD_ORDER.index(record["type"]), params.get("iou_threshold", -1.0),
            params.get("score_threshold", -1.0), params.get("category_id", -1),
            str(params.get("label", "")), params.get("bound", ""))


class EvaluateDetectionFiles(beam.PTransform):
    """COCO files or native rows (job.sources) -> Evaluated (transforms.evaluated).

    problems: the run's findings (transforms.outputs.problem dicts) on label vocabularies of
    native rows (label_findings); none for COCO files, whose detections of unknown categories
    are rejected row by row. With job.bootstrap (replicates > 0) the scalar records carry
    their replicates ("_replicates"; per field for the COCO summaries) and, with job.compare_to
    too, Evaluated.presence the images of each side; job.presence: Evaluated.presence anyway."""

    def __init__(self, config: DetectionConfig, job):
        super().__init__()
        bootstrap = getattr(job, "bootstrap", None)
        self.config = config._replace(
            bootstrap=bootstrap if bootstrap is not None and bootstrap.enabled else None)
        self.compare_to = getattr(job, "compare_to", None)
        self.presence = bool(getattr(job, "presence", False))
        self.native = config.native
        self.sources = job.sources
        self.models = list(job.models)
        self.slices = list(job.slices)
        self.num_shards = job.num_shards
        self.quiet = job.quiet
        self.started = job.started
        self.spill_dir = job.temp("pieces")

    def expand(self, pbegin):
        slice_keys = sorted({k for spec in self.slices for k in spec})
        iou_type, max_pixels = self.config.iou_type, self.config.max_image_pixels
        reader = (ReadNativeFile(self.sources, slice_keys, self.num_shards, self.quiet, self.started,
                                 iou_type, max_pixels)
                  if self.native else
                  ReadCocoFile(self.sources, iou_type, slice_keys, self.num_shards,
                               self.quiet, self.started, max_pixels))
        read = pbegin | "ReadFiles" >> ReadFiles(self.sources, reader,
                                                 (TAG_REJECTED, TAG_STATS, TAG_CATEGORIES, TAG_SIZES))
        if self.native:  # labels of ground truths and predictions alike
            categories = beam.pvalue.AsSingleton(
                read[TAG_CATEGORIES] | "Labels" >> beam.CombineGlobally(LabelUnion()))
            problems = (read[TAG_CATEGORIES]
                        | "LabelsBySource" >> beam.combiners.ToList()
                        | "LabelFindings" >> beam.FlatMap(label_findings, list(self.models)))
        else:  # the categories of the instances file
            categories = beam.pvalue.AsSingleton(read[TAG_CATEGORIES])
            problems = pbegin | "NoFindings" >> beam.Create([])
        metrics, rejected, stats, presence = _evaluate(
            read, categories, _sizes(read), self.config, self.models, self.slices,
            {n: s.files for n, s in self.sources.items()}, self.quiet, self.started,
            self.compare_to, self.presence, self.spill_dir)
        return Evaluated(metrics, rejected, stats, problems, presence=presence)


def _sizes(read):
    """The side input of every model's detections per category (DetectionSizes)."""
    return beam.pvalue.AsSingleton(read[TAG_SIZES] | "Sizes" >> beam.CombineGlobally(DetectionSizes()))


def _evaluate(read, categories, sizes, config: DetectionConfig, models, slices, files, quiet,
              started, compare_to=None, presence: bool = False, spill_dir: str | None = None):
    """The shared tail: match per shard (the pieces through grouping.group_by_shard, spilled
    to spill_dir when given), merge the states per (model, slice) (per category, and for the
    largest categories per span of IoU thresholds, by sizes: _records_by_category), records. Returns
    (metrics, rejected, stats, presence); presence is None unless config.bootstrap is set and
    there is a compare_to model, or presence=True."""
    presence = bool(presence) or (config.bootstrap is not None and compare_to is not None)
    shards, shard_meter = group_by_shard(read.pieces, spill_dir)
    matched = (shards
               | "Match" >> beam.ParDo(MatchDetection(config, models, slices, files, quiet, started,
                                                      presence), categories)
               .with_output_types(PARTIAL)
               .with_outputs(TAG_REJECTED, TAG_STATS, TAG_PRESENCE, main="partials"))
    if splits_by_category(config):
        metrics, state_meters = _records_by_category(matched.partials, categories, sizes, config,
                                                     spill_dir)
    else:
        metrics, state_meters = merged_records(matched.partials, state_records, categories, config,
                                               spill_dir=spill_dir)
    rejected = (read[TAG_REJECTED], matched[TAG_REJECTED]) | "Rejected" >> beam.Flatten()
    stats = ((read[TAG_STATS], matched[TAG_STATS], shard_meter, state_meters)
             | "AllStats" >> beam.Flatten())
    return metrics, rejected, stats, (matched[TAG_PRESENCE] if presence else None)


def _by_category(element, categories: dict, sizes: dict, n_thresholds: int, min_detections: int):
    """((model, slice JSON), state) -> (((model, slice JSON), label, t0, t1), the label's part)
    per label of the state (kernels.detection.category_parts) and span of IoU thresholds
    (label_spans of the model's detections of that label in the whole input, sizes; (0, T)
    for the placeholder and WHOLE keys)."""
    key, state = element
    counts = sizes.get(key[0], {})
    total = sum(counts.values())
    for k, part in category_parts(state):
        spans = (label_spans(counts.get(categories["id"][k], 0), total, n_thresholds, min_detections)
                 if k >= 0 else [(0, n_thresholds)])
        for t0, t1 in spans:
            yield (key, k, t0, t1), span_part(part, t0, t1, n_thresholds)


def _category_result(element, config: DetectionConfig):
    (key, k, t0, t1), state = element
    return key, ((k, t0, t1), category_result(k, state, config, (t0, t1)))


def _records_by_category(partials, categories, sizes, config: DetectionConfig, spill_dir):
    """merged_records for the states that split by category (kernels.detection
    splits_by_category): the states merged per (model, slice, label, span of IoU thresholds)
    and accumulated there, on as many keys as labels and the largest labels' spans, then each
    (model, slice)'s results gathered into its records. Returns (records, meter stats);
    MergeStates counts the label parts."""
    parts = partials | "ByCategory" >> beam.FlatMap(
        _by_category, categories, sizes, len(config.protocol.matching_thresholds), split_detections())
    combined = combine_states(parts, spill_dir, key_type=typing.Tuple[STATE_KEY, int, int, int])
    records = (combined
               | "CategoryResults" >> beam.Map(_category_result, config)
               | "GatherCategories" >> beam.GroupByKey()
               | "Records" >> beam.FlatMap(records_of, category_records, categories, config))
    return records, metered_states(parts, combined)


class EvaluateDetection(EvaluateRows):
    """Detection metrics for a user's own pipeline, on native rows.

    Input: a dict of PCollections of row dicts, {"groundtruths": ..., "<model name>": ...} (native
    rows as in the README). Output: a PCollection of metric records; with with_diagnostics=True,
    (records, rejects, stats). protocol: a Protocol (default Valor's, with its default
    thresholds); iou_type "bbox" or "segm" (polygons and rasters); bootstrap, compare_to: as
    transforms.evaluated.EvaluateRows (intervals per image); max_image_pairs: as
    --max_image_pairs (pipelines/detection.md, crowded images)."""

    def __init__(self, iou_type: str = "bbox", protocol: Protocol = VALOR, slices=(),
                 num_shards: int = 16, batch_size: int = 1000, with_diagnostics: bool = False,
                 bootstrap=None, compare_to: str | None = None,
                 max_image_pairs: int = MAX_IMAGE_PAIRS):
        if iou_type == "segm" and protocol.name == "coco":
            raise ValueError("native segm rows need the valor protocol (no image sizes to rasterise)")
        super().__init__(None, slices, num_shards, batch_size, with_diagnostics, bootstrap, compare_to)
        if protocol.score_bins and self.bootstrap.enabled:
            raise ValueError("score_bins and bootstrap do not go together: the binned state keeps no "
                             "replicates")
        if max_image_pairs < 1:
            raise ValueError(f"max_image_pairs must be at least 1; got {max_image_pairs}")
        self.iou_type = iou_type
        self.protocol = protocol
        self.max_image_pairs = max_image_pairs

    def expand(self, pcolls):
        reader = DetectionRowsFromDicts(self.slice_keys, self.num_shards, self.iou_type)
        models, read = read_pcollections(pcolls, self.batch_size, reader,
                                         (TAG_REJECTED, TAG_STATS, TAG_CATEGORIES, TAG_SIZES),
                                         "EvaluateDetection")
        categories = beam.pvalue.AsSingleton(
            read[TAG_CATEGORIES] | "Labels" >> beam.CombineGlobally(LabelUnion()))
        config = DetectionConfig(self.iou_type, self.protocol, native=True,
                                 bootstrap=self.bootstrap if self.bootstrap.enabled else None,
                                 max_image_pairs=self.max_image_pairs)
        metrics, rejected, stats, presence = _evaluate(read, categories, _sizes(read), config, models,
                                                       self.slices, {}, True, 0.0, self.compare_to)
        metrics = self.uncertain(metrics, presence, None, unit=INTERVAL_UNIT)
        return (metrics, rejected, self.row_counters(stats)) if self.with_diagnostics else metrics
