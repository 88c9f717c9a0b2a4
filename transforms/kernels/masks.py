"""Mask IoU through pycocotools' C mask API (run-length encoded masks, no decoding), and the IoU
of native geometries (shapely polygons and Rasters, schemas/detection_rows.py)."""

from __future__ import annotations

import numpy as np

from evalbeam.schemas.detection_rows import Raster
from evalbeam.transforms.kernels.detection_geometry import PAIR_CHUNK


def pair_mask_iou(dt_rles: list, gt_rles: list, gt_crowd: np.ndarray):
    """pair_iou for compressed RLEs: one pycocotools mask.iou call per (detection, gt image
    category group) block of pairs, crowd IoU as pycocotools computes it."""
    from pycocotools import mask as mask_utils

    def iou(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        out = np.zeros(dt_index.size)
        if not dt_index.size:
            return out
        # Pairs arrive grouped by detection, and the detections of one (image, category) group
        # are consecutive with the same ground-truth list: one C call per group.
        starts = np.flatnonzero(np.r_[True, dt_index[1:] != dt_index[:-1]])
        ends = np.r_[starts[1:], dt_index.size]
        block_start = 0
        for b in range(starts.size):
            s, e = starts[b], ends[b]
            last = b + 1 == starts.size
            if not last:
                ns, ne = starts[b + 1], ends[b + 1]
                if ne - ns == e - s and np.array_equal(gt_index[ns:ne], gt_index[s:e]):
                    continue  # the next detection shares this ground-truth list
            gts = gt_index[s:e]
            dts = dt_index[starts[block_start]:e:(e - s)]
            values = mask_utils.iou([dt_rles[d] for d in dts], [gt_rles[g] for g in gts],
                                    [int(c) for c in gt_crowd[gts]])
            out[starts[block_start]:e] = np.asarray(values, dtype=np.float64).reshape(-1)
            block_start = b + 1
        return out
    return iou


def pair_polygon_iou(dt_shapes: list, gt_shapes: list):
    """pair_iou for shapely polygons: exact areas, intersection / union (0 for empty unions).

    Only pairs whose bounding boxes overlap with a positive area are intersected (the others
    have no common area: IoU 0), PAIR_CHUNK pairs at a time: most pairs of a dense image are
    far apart, and each intersection is a new geometry object."""
    import shapely

    dt = np.array(dt_shapes, dtype=object)
    gt = np.array(gt_shapes, dtype=object)
    dt_bounds = shapely.bounds(dt).reshape(-1, 4)
    gt_bounds = shapely.bounds(gt).reshape(-1, 4)
    dt_area, gt_area = shapely.area(dt), shapely.area(gt)

    def chunk(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        d, g = dt_bounds[dt_index], gt_bounds[gt_index]
        near = np.flatnonzero((np.minimum(d[:, 2], g[:, 2]) > np.maximum(d[:, 0], g[:, 0]))
                              & (np.minimum(d[:, 3], g[:, 3]) > np.maximum(d[:, 1], g[:, 1])))
        out = np.zeros(dt_index.size)
        if near.size:
            i, j = dt_index[near], gt_index[near]
            inter = shapely.area(shapely.intersection(dt[i], gt[j]))
            union = dt_area[i] + gt_area[j] - inter
            out[near] = np.divide(inter, union, out=np.zeros(near.size), where=union > 0)
        return out

    def iou(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        out = np.zeros(dt_index.size)
        for start in range(0, dt_index.size, PAIR_CHUNK):
            end = start + PAIR_CHUNK
            out[start:end] = chunk(dt_index[start:end], gt_index[start:end])
        return out
    return iou


def as_polygon(geometry):
    """A shapely geometry of a raster (the union of its pixel squares) or the geometry itself."""
    import shapely

    if not isinstance(geometry, Raster):
        return geometry
    from pycocotools import mask as mask_utils

    mask = mask_utils.decode(geometry.rle)
    if not mask.any():
        return shapely.Polygon()
    # vertical runs of set pixels, column by column: each is one rectangle of the union
    edges = np.diff(np.pad(mask, ((1, 1), (0, 0))).astype(np.int8), axis=0)
    start_x, start_y = np.nonzero(edges.T == 1)
    _, end_y = np.nonzero(edges.T == -1)
    boxes = shapely.box(start_x, start_y, start_x + 1, end_y)
    return shapely.union_all(boxes)


def pair_geometry_iou(dt_geometries: list, gt_geometries: list):
    """pair_iou for native geometries (shapely polygons and Rasters mixed): two rasters of one
    size are compared as masks (pycocotools), every other pair as polygons, rasters converted
    with as_polygon (Valor's rule: a raster against a polygon is compared as a polygon)."""
    dt_raster = np.array([isinstance(g, Raster) for g in dt_geometries], dtype=bool)
    gt_raster = np.array([isinstance(g, Raster) for g in gt_geometries], dtype=bool)
    if not dt_raster.any() and not gt_raster.any():
        return pair_polygon_iou(dt_geometries, gt_geometries)
    dt_size = np.array([g.size if isinstance(g, Raster) else (-1, -1) for g in dt_geometries]).reshape(-1, 2)
    gt_size = np.array([g.size if isinstance(g, Raster) else (-1, -1) for g in gt_geometries]).reshape(-1, 2)
    dt_rles = [g.rle if isinstance(g, Raster) else None for g in dt_geometries]
    gt_rles = [g.rle if isinstance(g, Raster) else None for g in gt_geometries]
    masks = pair_mask_iou(dt_rles, gt_rles, np.zeros(len(gt_geometries), dtype=bool))
    cache: dict = {}

    def polygons(geometries, index, tag):
        out = []
        for i in index.tolist():
            key = (tag, i)
            if key not in cache:
                cache[key] = as_polygon(geometries[i])
            out.append(cache[key])
        return out

    def iou(dt_index: np.ndarray, gt_index: np.ndarray) -> np.ndarray:
        out = np.zeros(dt_index.size)
        both = (dt_raster[dt_index] & gt_raster[gt_index]
                & (dt_size[dt_index] == gt_size[gt_index]).all(axis=1))
        if both.any():
            out[both] = masks(dt_index[both], gt_index[both])
        rest = np.flatnonzero(~both)
        if rest.size:
            d, g = dt_index[rest], gt_index[rest]
            out[rest] = pair_polygon_iou(polygons(dt_geometries, d, 0), polygons(gt_geometries, g, 1))(
                np.arange(rest.size), np.arange(rest.size))
        return out
    return iou
