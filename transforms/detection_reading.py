"""Detection's reading: COCO instances and results files (ReadCocoFile), native rows
(ReadNativeFile, DetectionRowsFromDicts) into shard pieces keyed by image, and the side states
found while reading (the categories, LabelUnion; every model's detections per category,
DetectionSizes). The graph they feed is transforms/detection.py's DetectionGraph.
"""

from __future__ import annotations

import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalbeam.schemas.coco_rows import (INT64, MAX_DOCUMENT_NESTING, BoxRows, ImageRows, box_rows,
                                        coco_document, coco_piece, image_rows)
from evalbeam.schemas.detection_rows import RowIndex, labels_of, native_rows, stable_id
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.schemas.json_pieces import array_pieces
from evalbeam.schemas.limits import MAX_IMAGE_PIXELS, label_length_problem
from evalbeam.schemas.rejections import reject
from evalbeam.transforms.io import (GROUNDTRUTHS, TAG_REJECTED, TAG_STATS, ParsedRows, ProgressDoFn,
                                    ReadError, ReadRowFile, line_splittable, open_input, span_text)
from evalbeam.transforms.kernels.detection import SPLIT_MIN_DETECTIONS

TAG_CATEGORIES = "categories"
TAG_SIZES = "sizes"     # (model, {category id: detections}) of each piece read (DetectionSizes)


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


def concat_images(parts: list[ImageRows]) -> ImageRows:
    return ImageRows(
        np.concatenate([p.image_id for p in parts]), np.concatenate([p.height for p in parts]),
        np.concatenate([p.width for p in parts]),
        {k: sum((p.slices[k] for p in parts), []) for k in parts[0].slices},
        np.concatenate([p.position for p in parts]), np.concatenate([p.file_id for p in parts]),
        sum((p.uid for p in parts), []))


def take_images(images: ImageRows, index: np.ndarray) -> ImageRows:
    return ImageRows(images.image_id[index], images.height[index], images.width[index],
                     {k: [v[i] for i in index] for k, v in images.slices.items()},
                     images.position[index], images.file_id[index],
                     [images.uid[i] for i in np.asarray(index, dtype=np.int64)])


def concat_rows(parts: list[RowIndex]) -> RowIndex:
    return RowIndex(np.concatenate([p.image_id for p in parts]), sum((p.uid for p in parts), []),
                    np.concatenate([p.position for p in parts]),
                    np.concatenate([p.file_id for p in parts]))


def concat_boxes(parts: list[BoxRows]) -> BoxRows:
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
            yield shard, (name, (take_images(images, image_parts.get(shard, empty)),
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

    def pieces(self, parsed: ParsedRows):
        return native_pieces(parsed, self.slice_keys, self.num_shards, self.geometry,
                             self.max_pixels)


def native_pieces(parsed: ParsedRows, slice_keys, num_shards: int, geometry: str,
                  max_pixels: int = MAX_IMAGE_PIXELS):
    """Shard pieces (main output), rejects, stats and (source, labels) (tagged) of parsed native
    rows of one source (positions None inside a PCollection's batch, -1 inside the arrays)."""
    name = parsed.name
    scored = name != GROUNDTRUTHS
    first, boxes, bad = native_rows(parsed.rows, parsed.positions_or_minus_one(), scored,
                                    slice_keys if not scored else [], parsed.file_id, geometry,
                                    max_pixels)
    yield from parsed.outcome(bad)
    yield beam.pvalue.TaggedOutput(TAG_CATEGORIES, (name, labels_of(parsed.rows)))
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
            yield shard, (name, (take_images(first, index), boxes.take(box_index)))


class DetectionRowsFromDicts(beam.DoFn):
    """(source, [row dict, ...]) batches -> shard pieces, like ReadNativeFile for files."""

    def __init__(self, slice_keys: list[str], num_shards: int, iou_type: str):
        self.slice_keys = slice_keys
        self.num_shards = num_shards
        self.geometry = "polygon" if iou_type == "segm" else "bbox"

    def process(self, element):
        source, batch = element
        yield from native_pieces(ParsedRows.of_batch(source, batch), self.slice_keys,
                                 self.num_shards, self.geometry)


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


