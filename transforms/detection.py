"""Beam plumbing of object detection: COCO files or native rows, COCO or Valor protocol.

The reading (COCO files, native rows, row dicts) is transforms/detection_reading.py: images,
annotations and detections split by shard (FNV-1a of the image id). MatchDetection computes each model's
DetectionState (transforms/kernels/detection.py) per shard and slice; combine_states
(transforms/merge.py) merges the states of each (model, slice), and records_of turns each merged
state into records with the kernel's state_records (pycocotools' accumulate and summarize, or
Valor's metrics). Without --score_bins and --bootstrap the merge and the accumulation run per
(model, slice, category) instead (_records_by_category; pipelines/tasks/detection.md).
"""

from __future__ import annotations

import json
import typing
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa

from evalbeam.schemas.coco import to_rle
from evalbeam.schemas.coco_rows import (BoxRows, ImageRows)
from evalbeam.schemas.detection_rows import RowIndex, geometry_area, stable_id
from evalbeam.schemas.formats import position_name
from evalbeam.schemas.hashing import fnv1a_64
from evalbeam.schemas.limits import pair_count_problem
from evalbeam.schemas.rejections import reject
from evalbeam.schemas.slices import canonical_json
from evalbeam.transforms.detection_reading import (TAG_CATEGORIES, TAG_SIZES, DetectionRowsFromDicts,
                                                   DetectionSizes, LabelUnion, ReadCocoFile,
                                                   ReadNativeFile, concat_boxes, concat_images,
                                                   concat_rows, split_detections, take_images)
from evalbeam.transforms.graph import (TAG_PRESENCE, EvaluateFiles, EvaluateRows, MatchContext,
                                       Merged, TaskGraph)
from evalbeam.transforms.io import (GROUNDTRUTHS, TAG_REJECTED, TAG_STATS, ProgressDoFn)
from evalbeam.transforms.kernels.detection import (COCO, VALOR, CocoState, DetailedState,
                                                   DetectionConfig, DetectionState, Protocol,
                                                   coco_state, detailed_curve, image_pair_counts,
                                                   category_parts, category_records,
                                                   category_result, label_spans,
                                                   pair_box_iou, span_part, splits_by_category,
                                                   state_records)
from evalbeam.transforms.kernels.detection_confusion import ConfusionState, confusion_state
from evalbeam.transforms.kernels.masks import as_polygon, pair_geometry_iou, pair_mask_iou
from evalbeam.transforms.merge import (STATE_KEY, combine_states, merged_records, metered_states,
                                      records_of)

# what one bootstrap weight is drawn for, as the intervals name it (its Task's interval_unit)
INTERVAL_UNIT = "image"


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
    located = LocatedBoxes(dts, dt_image, dt_label, gts, gt_image, gt_label, uids, hashes)
    detailed, confusion = _valor_states(kept, matched_gt[:, 0, t], located, pair_iou, protocol,
                                        category_id.size, pairs)
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


class LocatedBoxes(NamedTuple):
    """One shard's detections and ground truths with where they belong: dts, gts (BoxRows);
    dt_image, gt_image: each row's image index; dt_label, gt_label: each row's label index;
    uids, hashes: each image's datum_uid and its uint64 stable hash."""

    dts: BoxRows
    dt_image: np.ndarray
    dt_label: np.ndarray
    gts: BoxRows
    gt_image: np.ndarray
    gt_label: np.ndarray
    uids: list
    hashes: np.ndarray


def _valor_states(kept, taken, located: LocatedBoxes, pair_iou, protocol, n_labels: int,
                  pairs=None) -> tuple[DetailedState, ConfusionState]:
    """The DetailedState (at the PR curve's IoU threshold; kept and taken come from coco_match)
    and the ConfusionState of one shard. pairs: (d, g, iou) of _image_pairs, if computed."""
    dts, dt_image, dt_label, gts, gt_image, gt_label, uids, hashes = located
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
    context.presence (with or without config.bootstrap): tagged TAG_PRESENCE, per slice, (slice JSON,
    ("groundtruths", uint64 hashes of the slice's images)) and (slice JSON, (model, hashes of
    those images with a prediction of the model: a valid native prediction row, or at least one
    valid COCO detection)), for the paired comparisons' coverage counts."""

    def __init__(self, config: DetectionConfig, context: MatchContext):
        super().__init__(context.quiet, context.started)
        self.bootstrap = config.bootstrap
        self.presence = context.presence
        self.protocol = config.protocol
        self.native = config.native
        self.models = list(context.models)
        self.slice_specs = [tuple(s) for s in context.slices]
        self.iou_type = config.iou_type
        self.max_image_pairs = config.max_image_pairs
        self.files = context.files

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
            images = take_images(images, keep)
            gts = gts.take(np.flatnonzero(~np.isin(gts.image_id, dropped)))
        else:
            outputs = []
        return images, gts, outputs, repeated.size

    def process(self, element, categories):
        shard, pieces = element
        category_id = np.array(categories["id"], dtype=np.int64)
        gt_pieces = [p for source, p in pieces if source == GROUNDTRUTHS]
        images = concat_images([p[0] for p in gt_pieces]) if gt_pieces else None
        gts = concat_boxes([p[1] for p in gt_pieces]) if gt_pieces else None
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
                dts = concat_boxes([p[1] for p in parts])
                rows = concat_rows([p[2] for p in parts])
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
                dts = concat_boxes([p[1] for p in parts])
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
                parts = shard_state(take_images(images, image_index), sub_gts, sub_dts,
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


def record_sort_key(record: dict):
    """model, slice, type, then threshold and label (category id for COCO records)."""
    params = record["parameters"]
    return (record["model"], len(record["slice"]), json.dumps(record["slice"], sort_keys=True),
            RECORD_ORDER.index(record["type"]), params.get("iou_threshold", -1.0),
            params.get("score_threshold", -1.0), params.get("category_id", -1),
            str(params.get("label", "")), params.get("bound", ""))


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
               | "Records" >> beam.FlatMap(records_of, category_records, config, categories))
    return records, metered_states(parts, combined)


class DetectionGraph(TaskGraph):
    """Detection in the one graph (transforms/graph.py), on COCO files or native rows. Side
    states: the categories (COCO: the instances file's; native rows: the labels of ground truths
    and predictions alike, LabelUnion), which the matcher and the records read ("categories"),
    and every model's detections per category (DetectionSizes), by which the largest categories'
    merges are split by spans of IoU thresholds (_records_by_category). Problems: the label
    findings of native rows (label_findings); COCO detections of unknown categories are rejected
    row by row instead. With a bootstrap the scalar records carry their replicates (per field
    for the COCO summaries)."""

    name = "detection"
    read_tags = (TAG_CATEGORIES, TAG_SIZES)
    match_sides = ("categories",)
    interval_unit = INTERVAL_UNIT
    record_order = RECORD_ORDER

    def prepare(self, config: DetectionConfig, context, sources):
        return config._replace(bootstrap=context.bootstrap), context

    def file_reader(self, config, context, sources):
        if config.native:
            return ReadNativeFile(sources, context.slice_keys, context.num_shards, context.quiet,
                                  context.started, config.iou_type, config.max_image_pixels)
        return ReadCocoFile(sources, config.iou_type, context.slice_keys, context.num_shards,
                            context.quiet, context.started, config.max_image_pixels)

    def rows_reader(self, config, context):
        return DetectionRowsFromDicts(context.slice_keys, context.num_shards, config.iou_type)

    def side_states(self, pbegin, read, shards, config, context):
        found = read.tagged[TAG_CATEGORIES]
        if config.native:  # labels of ground truths and predictions alike
            categories = found | "Labels" >> beam.CombineGlobally(LabelUnion())
        else:  # the categories of the instances file
            categories = found
        sizes = read.tagged[TAG_SIZES] | "Sizes" >> beam.CombineGlobally(DetectionSizes())
        return {"categories": beam.pvalue.AsSingleton(categories),
                "sizes": beam.pvalue.AsSingleton(sizes)}

    def matcher(self, config, context):
        return MatchDetection(config, context)

    def merge(self, partials, sides, config, spill_dir):
        if splits_by_category(config):
            records, meters = _records_by_category(partials, sides["categories"], sides["sizes"],
                                                   config, spill_dir)
        else:
            records, meters, _ = merged_records(partials, state_records, config,
                                                sides["categories"], spill_dir=spill_dir)
        return Merged(records, meters)

    def problems(self, stages, config, context):
        if not config.native:
            return None
        return (stages.read.tagged[TAG_CATEGORIES]
                | "LabelsBySource" >> beam.combiners.ToList()
                | "LabelFindings" >> beam.FlatMap(label_findings, list(context.models)))

    record_sort_key = staticmethod(record_sort_key)


class EvaluateDetectionFiles(EvaluateFiles):
    """COCO files or native rows (job.sources) -> Evaluated (transforms/graph.py, DetectionGraph)."""

    graph = DetectionGraph()


def users_default_config() -> DetectionConfig:
    """EvaluateDetection's default: native bounding boxes, Valor's protocol and thresholds."""
    return DetectionConfig(protocol=VALOR, native=True)


class EvaluateDetection(EvaluateRows):
    """Detection metrics for a user's own pipeline, on native rows (transforms.graph.EvaluateRows).
    config: a kernels.detection.DetectionConfig (default users_default_config; native is
    implied); its iou_type "bbox" or "segm" (polygons and rasters), protocol, and
    max_image_pairs as --max_image_pairs (pipelines/tasks/detection.md, crowded images).
    Intervals are per image."""

    graph = DetectionGraph()
    default_config = users_default_config

    def __init__(self, config: DetectionConfig | None = None, *args, **kwargs):
        config = (config or users_default_config())._replace(native=True)
        if config.iou_type == "segm" and config.protocol.name == "coco":
            raise ValueError("native segm rows need the valor protocol (no image sizes to rasterise)")
        if config.max_image_pairs < 1:
            raise ValueError(f"max_image_pairs must be at least 1; got {config.max_image_pairs}")
        super().__init__(config, *args, **kwargs)
        if config.protocol.score_bins and self.bootstrap.enabled:
            raise ValueError("score_bins and bootstrap do not go together: the binned state keeps no "
                             "replicates")
