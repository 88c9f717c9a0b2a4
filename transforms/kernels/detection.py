"""Object detection's kernel, by protocol and stage: this module only gathers the names the
plumbing (transforms/detection.py), the task declaration and the tests import. Pure numpy.

Where each part lives (all under transforms/kernels/):
- detection_geometry.py: box IoU of (detection, ground truth) pairs (pair_box_iou) and the pairs
  an image makes before any IoU is computed (image_pair_counts);
- detection_coco.py: the COCO protocol's constants (IOU_THRESHOLDS, MAX_DETS, AREA_RANGES, ...),
  its mergeable state (CocoState), pycocotools' accumulate() and summarize();
- detection_matching.py: pycocotools' greedy matching of a set of images into a CocoState
  (coco_state);
- detection_replicates.py: the bootstrap replicates of accumulate() and summarize();
- detection_binned.py: the constant-memory --score_bins state (BinnedState) and its bounds;
- detection_valor.py: the valor protocol's metrics (valor_metrics) and its --score_bins state;
- detection_detailed.py: Valor's DetailedPrecisionRecallCurve state (detailed_curve);
- detection_confusion.py: Valor's ConfusionMatrix state;
- detection_config.py: what a run evaluates (Protocol, COCO, VALOR, DetectionConfig) and the
  partial state of one (model, slice) (DetectionState);
- detection_records.py: a merged state -> records (state_records), the coco protocol's records;
- detection_valor_records.py: the valor protocol's records;
- detection_categories.py: states merged and accumulated per category and span of IoU thresholds
  (category_parts, label_spans, span_part, category_result, category_records).
"""

from __future__ import annotations

from evalbeam.transforms.kernels.detection_binned import BinnedState, accumulate_binned
from evalbeam.transforms.kernels.detection_categories import (SPLIT_MIN_DETECTIONS, category_parts,
                                                              category_records, category_result,
                                                              label_spans, span_part,
                                                              splits_by_category)
from evalbeam.transforms.kernels.detection_coco import (IOU_THRESHOLDS, MAX_DETS, RECALL_THRESHOLDS,
                                                        SUMMARY_NAMES, CocoState, accumulate,
                                                        summarize)
from evalbeam.transforms.kernels.detection_config import (COCO, VALOR, DetectionConfig,
                                                          DetectionState, Protocol)
from evalbeam.transforms.kernels.detection_detailed import DetailedState, detailed_curve
from evalbeam.transforms.kernels.detection_geometry import image_pair_counts, pair_box_iou
from evalbeam.transforms.kernels.detection_matching import coco_state
from evalbeam.transforms.kernels.detection_records import record_identity_of, state_records
from evalbeam.transforms.kernels.detection_replicates import (accumulate_replicates,
                                                              coco_summary_replicates,
                                                              summarize_replicates)
from evalbeam.transforms.kernels.detection_valor import valor_metrics
from evalbeam.transforms.kernels.detection_valor_records import (valor_records,
                                                                 valor_replicate_records)

# The names tests/detection/test_detection_bootstrap.py imports (they were private helpers of
# this module before it was split).
_identity = record_identity_of
_valor_records = valor_records
_valor_replicate_records = valor_replicate_records

__all__ = [
    # configuration and state (detection_config)
    "COCO", "VALOR", "Protocol", "DetectionConfig", "DetectionState",
    # constants, state, accumulate and summary of the COCO protocol (detection_coco)
    "IOU_THRESHOLDS", "MAX_DETS", "RECALL_THRESHOLDS", "SUMMARY_NAMES", "CocoState",
    "accumulate", "summarize",
    # geometry and matching
    "image_pair_counts", "pair_box_iou", "coco_state",
    # --score_bins, the valor protocol, its detailed curve
    "BinnedState", "accumulate_binned", "valor_metrics", "DetailedState", "detailed_curve",
    # bootstrap replicates
    "accumulate_replicates", "coco_summary_replicates", "summarize_replicates",
    # records, whole and per category
    "state_records", "record_identity_of", "valor_records", "valor_replicate_records",
    "SPLIT_MIN_DETECTIONS", "splits_by_category", "category_parts", "label_spans", "span_part",
    "category_result", "category_records",
    "_identity", "_valor_records", "_valor_replicate_records",
]
