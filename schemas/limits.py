"""What one input row may cost: the bounds that keep a hostile or mistaken row from taking a
worker's memory, and the messages that name the option raising each bound.

A row beyond a bound is rejected with a reason (never allocated, never a crash); the tasks'
options (`--max_image_pixels`, ...) raise the bounds for inputs that really are that large. The
bounds on names that end up in metric records (MAX_LABEL_CHARS, MAX_SLICE_CHARS) and on the ids
that outputs repeat (MAX_UID_CHARS) have no option.
"""

from __future__ import annotations

from dataclasses import dataclass

# 100 megapixels: a 10,000 x 10,000 image. A datum takes, while it is matched, a few bytes a
# pixel (3 for RLE segment rows, 4 for 8-bit label maps, 8 for rows of mask files and 16-bit
# label maps) on top of the worker's own memory; a larger image (a 13,000 x 13,000 label map
# needs --max_image_pixels 169000000) takes that much more per worker at a time.
MAX_IMAGE_PIXELS = 100_000_000
# pycocotools keeps RLE run lengths in 32-bit unsigned integers: no image can be larger.
MAX_RLE_PIXELS = 2**32 - 1
# The bytes read from one mask or label-map file (PNG, .npy): a 100-megapixel 8- or 16-bit
# image fits with room; reading stops at the bound, so /dev/zero-like inputs cost nothing more.
MAX_MASK_BYTES = 256 << 20
# Segments of one row: their numbers are stored as uint16 pixel ids (0 = no segment). RLE
# segments cost one pass over the image and their runs however many there are (overlaps are found
# from the runs, not by decoding each segment); mask files are bounded by MASK_FILE_IMAGES_PER_ROW.
MAX_SEGMENTS_PER_ROW = 65_535
# The pixels of one segmentation row's mask files (mask_uri), in all, as images of
# --max_image_pixels pixels: each file is read and decoded whole (PNG decoding, then painting:
# time in proportion to its pixels), so without a bound a row could name the same 100-megapixel
# PNG 65,535 times and take more than a day. 40 images' worth (4 billion pixels by default) is 40
# full-sized masks, or 2,000 two-megapixel (Cityscapes-sized) ones; RLE segments and label maps
# cost one pass whatever their number, and are the way past the bound.
MASK_FILE_IMAGES_PER_ROW = 40
# Distinct labels of a segmentation run: each (model, slice) keeps a dense (K + 1)^2 int64 pixel
# matrix, 32 MB at 2,000 labels (LVIS has 1,203 classes, ADE20K-847 has 847), 32 GiB at 65,536.
MAX_LABELS = 2_000
# Characters (Unicode code points) of one label: a classification label key or value, a detection
# or segmentation label, a COCO category name, a --label_names name. A label names metric records
# and is copied into each of them (every score threshold, both axes of a confusion matrix, every
# model and slice), and into every shard's piece of the input, so one label of megabytes makes
# outputs and a worker's memory of gigabytes. Real class names are words or short phrases
# (COCO's longest, "baseball glove", has 14 characters); 1,024 leaves room for long synonym
# lists, paths or composite names, and keeps a label's cost in the records near that of its
# numbers. No option raises it: a longer label is a mistake (a caption or a file's contents in
# the label field), and an id with the long text kept elsewhere is the fix.
MAX_LABEL_CHARS = 1_024
# Characters of one --slice value written as canonical JSON (schemas/slices.py), as it appears
# in every record of its slice ("slice": {"region": "eu"}); the same reasoning and number as
# MAX_LABEL_CHARS. Quotes and escapes count: the string "eu" is 4 characters.
MAX_SLICE_CHARS = 1_024
# Characters of one id that outputs write out: a datum_uid (classification, detection,
# segmentation, text) and a retrieval query id. An id is written once per score row of its datum
# (every metric of every model: scores.jsonl), per per-query record, in the example lists of
# classification's confusion-matrix records and detection's curves, and in rejected.jsonl, and
# every shard piece of its rows carries it: one id of megabytes makes outputs and a worker's
# memory of gigabytes, as a long label does. 4,096 is Linux's PATH_MAX, so a
# local path, a URL or an object-store URI used as the id fits (gs:// and s3:// object names are
# at most 1,024 bytes, bucket names at most 222 characters); hashes, UUIDs and database keys are
# far shorter. An id at the bound costs a score row about 4 KB, the order of the row's own text.
# No option raises it: a longer id is the datum's text or a mistake, and a hash of it is the fix.
# Retrieval's document ids are not bounded: no output repeats them (pipelines/tasks/retrieval.md).
MAX_UID_CHARS = 4_096
# Characters of a text run's response and of each of its references (`--max_text_chars` raises
# it). ROUGE-L's longest common subsequence costs the product of the two texts' token counts,
# so two texts of megabytes would take hours. 200,000 characters is some 35,000 words, a long
# report, and one pair at the bound takes a fraction of a second. The other text metrics are
# linear in the text.
MAX_TEXT_CHARS = 200_000

# (prediction, ground truth) pairs one model's predictions make with the ground truths of one
# detection image (`--max_image_pairs` raises it). Matching computes an IoU for every such pair
# and keeps them all while it walks them: under the valor protocol, every prediction of the
# image with every ground truth (the confusion matrix pairs labels across); under the coco
# protocol, per category, the top 100 predictions (maxDets) with the category's ground truths.
# Time and memory grow with the pairs: 100M pairs take a worker's memory of many gigabytes.
# Real dense images have hundreds to a few thousand objects (SKU-110K up to ~700, DOTA's largest
# a few thousand) and detectors keep 100 to 1,000 boxes: 10M pairs is 3,162 boxes a side, and
# one image at the bound fits a worker of a few GB (polygons piled on one spot, each
# overlapping pair a shapely intersection, take the longest).
MAX_IMAGE_PAIRS = 10_000_000


@dataclass(frozen=True)
class ImageLimits:
    """The per-row bounds of image inputs: max_pixels (height x width of an RLE, a mask, a label
    map or a row's shape) and max_mask_bytes (bytes read from one mask or label-map file)."""

    max_pixels: int = MAX_IMAGE_PIXELS
    max_mask_bytes: int = MAX_MASK_BYTES


def image_size_problem(height, width, limit: int = MAX_IMAGE_PIXELS, what: str = "image") -> str | None:
    """Why an image (mask, raster, label map) of this size is not evaluated, or None: the
    dimensions must be non-negative integers and height x width at most `limit` pixels."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (height, width)):
        return f"{what} size must be two non-negative integers, got {[height, width]}"
    if height * width > limit:
        return (f"{what} of {height} x {width} = {height * width:,} pixels exceeds the limit of "
                f"{limit:,} pixels per row (--max_image_pixels raises it)")
    return None


def mask_files_problem(n_files: int, height: int, width: int,
                       max_pixels: int = MAX_IMAGE_PIXELS) -> str | None:
    """Why a segmentation row of height x width pixels whose segments name n_files mask files is
    not evaluated, or None: the files' pixels, n_files x height x width, must be at most
    MASK_FILE_IMAGES_PER_ROW x max_pixels (so one file of max_pixels always fits)."""
    pixels, limit = n_files * height * width, MASK_FILE_IMAGES_PER_ROW * max_pixels
    if pixels <= limit:
        return None
    return (f"the row's {n_files:,} mask files of {height} x {width} pixels are {pixels:,} pixels to "
            f"decode, more than the limit of {limit:,} per row ({MASK_FILE_IMAGES_PER_ROW} x "
            "--max_image_pixels): give the segments as RLEs, or the row as one label map")


def file_size_problem(n_bytes: int, limit: int, what: str) -> str | None:
    """Why a file of n_bytes (or more: readers stop at limit + 1) is not read, or None."""
    if n_bytes > limit:
        return (f"{what} holds more than {limit:,} bytes, the limit per mask or label-map file "
                "(--max_mask_bytes raises it)")
    return None


def label_length_problem(what: str, length: int, limit: int = MAX_LABEL_CHARS) -> str | None:
    """Why a label of `length` characters is not evaluated (what: "label value", "category
    name", ...), or None when length <= limit. The reason gives the length, never the text."""
    if length <= limit:
        return None
    return (f"{what} is {length:,} characters long, more than the limit of {limit:,} for a label "
            "(it would be copied into every metric record of its label): use a shorter name")


def label_problem(label, what: str, missing: str) -> str | None:
    """Why a label (what: "label", "segment label") is not evaluated, or None: it is not a
    non-empty string (the reason is `missing`, in the row format's words), or it is longer than
    MAX_LABEL_CHARS characters (label_length_problem)."""
    if not isinstance(label, str) or not label:
        return missing
    return label_length_problem(what, len(label))


def row_uid_problem(row) -> str | None:
    """Why a parsed row of the JSON row formats (detection, segmentation, text) has no usable
    datum_uid, or None: the row is not a JSON object, or its datum_uid is missing, not a string,
    empty, or longer than MAX_UID_CHARS characters (uid_length_problem)."""
    if not isinstance(row, dict):
        return "row must be a JSON object"
    uid = row.get("datum_uid")
    if not isinstance(uid, str) or not uid:
        return "missing or empty datum_uid"
    return uid_length_problem("datum_uid", len(uid))


def uid_length_problem(what: str, length: int, limit: int = MAX_UID_CHARS) -> str | None:
    """Why an id of `length` characters is not evaluated (what: "datum_uid", "query_id"), or None
    when length <= limit. The reason gives the length, never the text."""
    if length <= limit:
        return None
    return (f"{what} is {length:,} characters long, more than the limit of {limit:,} for an id "
            "(outputs would repeat it in every score, example or per-query record of its row): "
            "use a shorter id, such as a hash of it")


def text_length_problem(what: str, length: int, limit: int = MAX_TEXT_CHARS) -> str | None:
    """Why a text (what: "response", "reference 2") of `length` characters is not evaluated, or
    None when length <= limit."""
    if length <= limit:
        return None
    return (f"{what} is {length:,} characters long, more than the limit of {limit:,} "
            "(ROUGE-L's cost grows with the product of two texts' lengths; --max_text_chars "
            "raises the limit)")


def slice_length_reason(key: str, limit: int = MAX_SLICE_CHARS) -> str:
    """The rejection reason of a row whose metadata value for the --slice key `key` is longer
    than `limit` characters as canonical JSON."""
    return (f"metadata {key!r} is longer than {limit:,} characters as JSON, the limit for a slice "
            "value (it would be copied into every metric record of its slice): slice on a "
            "shorter value, such as an id")


def pair_count_problem(n_predictions: int, n_groundtruths: int, pairs: int,
                       limit: int = MAX_IMAGE_PAIRS, per_category: int | None = None) -> str | None:
    """Why one model's predictions on one detection image are not matched, or None when the
    (prediction, ground truth) pairs matching would compute are at most `limit`. per_category:
    the coco protocol's maxDets, which caps the predictions each category pairs."""
    if pairs <= limit:
        return None
    kept = f" (the top {per_category} of each category)" if per_category is not None else ""
    hint = "" if per_category is not None else "; or keep each image's top-scoring predictions"
    return (f"the image's {n_predictions:,} predictions{kept} and {n_groundtruths:,} ground truths "
            f"make {pairs:,} (prediction, ground truth) pairs to match, more than the limit of "
            f"{limit:,} per image and model (--max_image_pairs raises it{hint})")
