"""What a detection run evaluates (Protocol, DetectionConfig) and the partial state of one
(model, slice) (DetectionState, which wraps the protocol's states). They live together because
Protocol.binned turns a shard's DetectionState into its --score_bins form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from evalbeam.schemas.limits import MAX_IMAGE_PAIRS, MAX_IMAGE_PIXELS
from evalbeam.transforms.kernels.detection_binned import BinnedState
from evalbeam.transforms.kernels.detection_coco import IOU_THRESHOLDS, MAX_DETS, CocoState
from evalbeam.transforms.kernels.detection_confusion import ConfusionState
from evalbeam.transforms.kernels.detection_detailed import DetailedState
from evalbeam.transforms.kernels.detection_valor import VALOR_AREA_RANGES, ValorBinnedState


@dataclass(frozen=True)
class Protocol:
    """How detections are matched and averaged: "coco" (pycocotools: maxDets, four area ranges,
    crowd regions) or "valor" (every detection, one area range, crowd flags ignored)."""

    name: str = "coco"
    iou_thresholds: tuple = tuple(IOU_THRESHOLDS.tolist())
    score_thresholds: tuple = (0.5,)
    pr_curve_thresholds: tuple = tuple(round(0.05 * i, 2) for i in range(1, 20))
    pr_curve_iou_threshold: float = 0.5
    score_bins: int | None = None   # constant-memory state, AP as [lower, upper] bounds
    max_examples: int = 1

    @property
    def detailed(self) -> bool:
        """The valor protocol also builds the DetailedPrecisionRecallCurve."""
        return self.name == "valor"

    @property
    def matching_thresholds(self) -> tuple:
        """The IoU thresholds matched: the metric thresholds plus the PR curve's (valor)."""
        if self.name == "coco":
            return self.iou_thresholds
        return tuple(sorted(set(self.iou_thresholds) | {self.pr_curve_iou_threshold}))

    @property
    def counted_score_thresholds(self) -> np.ndarray:
        """Score thresholds with exact counts under --score_bins (valor: metrics and curve)."""
        return np.array(sorted(set(self.score_thresholds) | set(self.pr_curve_thresholds)))

    def binned(self, state: "DetectionState") -> "DetectionState":
        """The constant-memory form of a shard's state (--score_bins)."""
        thresholds = np.array(self.matching_thresholds)
        if self.name == "coco":
            return DetectionState(BinnedState.from_state(state.matches, self.score_bins, thresholds,
                                                         MAX_DETS))
        return DetectionState(ValorBinnedState.from_state(state.matches, self.score_bins, thresholds,
                                                          self.counted_score_thresholds),
                              state.detailed, state.confusion)

    @property
    def max_det(self) -> int | None:
        """Detections kept per image and category before matching (coco: maxDets' largest)."""
        return MAX_DETS[-1] if self.name == "coco" else None

    @property
    def options(self) -> dict:
        thresholds = np.array(self.matching_thresholds)
        if self.name == "coco":
            return {"thresholds": thresholds}
        return {"thresholds": thresholds, "max_det": None, "area_ranges": VALOR_AREA_RANGES}


COCO = Protocol()
VALOR = Protocol("valor")


class DetectionConfig(NamedTuple):
    """What `evalbeam detection` evaluates: iou_type "bbox" or "segm"; protocol (COCO or a
    valor Protocol); native: the inputs are native rows (else COCO files); max_image_pixels:
    the largest mask a row may hold; bootstrap: a kernels.bootstrap.Bootstrap with replicates
    > 0 (the states carry replicate parts and the records "_replicates"), or None;
    max_image_pairs: the most (prediction, ground truth) pairs one model may make in one image
    (image_pair_counts), beyond which its predictions there are rejected."""

    iou_type: str = "bbox"
    protocol: Protocol = COCO
    native: bool = False
    max_image_pixels: int = MAX_IMAGE_PIXELS
    bootstrap: object = None
    max_image_pairs: int = MAX_IMAGE_PAIRS


@dataclass
class DetectionState:
    """The partial state of one (model, slice): matches, a CocoState (exact) or, under
    --score_bins, a BinnedState (coco protocol) or ValorBinnedState (valor protocol); with the
    valor protocol also the DetailedState (DetailedPrecisionRecallCurve) and the ConfusionState
    (ConfusionMatrix), None otherwise. Merging merges each part (exact and order-free)."""

    matches: "CocoState | BinnedState | ValorBinnedState"
    detailed: "DetailedState | None" = None
    confusion: "ConfusionState | None" = None

    def copy(self) -> "DetectionState":
        return DetectionState(self.matches.copy(),
                              None if self.detailed is None else self.detailed.copy(),
                              None if self.confusion is None else self.confusion.copy())

    def merge(self, other: "DetectionState") -> "DetectionState":
        self.matches = self.matches.merge(other.matches)
        if self.detailed is not None:
            self.detailed = self.detailed.merge(other.detailed)
        if self.confusion is not None:
            self.confusion = self.confusion.merge(other.confusion)
        return self

    @staticmethod
    def merge_all(states: list["DetectionState"]) -> "DetectionState":
        """The sum of states, the states unchanged: the exact CocoStates' rows concatenated once
        (CocoState.merge_all), the bounded parts (binned states, DetailedState,
        ConfusionState) merged pairwise into a copy of the first's."""
        first = states[0]
        if len(states) == 1 or not isinstance(first.matches, CocoState):
            merged = first.copy()
            for other in states[1:]:
                merged = merged.merge(other)
            return merged
        merged = DetectionState(CocoState.merge_all([s.matches for s in states]),
                                None if first.detailed is None else first.detailed.copy(),
                                None if first.confusion is None else first.confusion.copy())
        for other in states[1:]:
            if merged.detailed is not None:
                merged.detailed = merged.detailed.merge(other.detailed)
            if merged.confusion is not None:
                merged.confusion = merged.confusion.merge(other.confusion)
        return merged
