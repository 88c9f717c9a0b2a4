"""Mask and label-map files (PNG or any image Pillow reads, or NumPy .npy): the checks and the
decoding of a file's bytes once read. Reading them (through Beam's FileSystems, so local paths,
gs:// and s3:// work the same inside workers) is transforms/mask_files.py's read_array.

A file named by a row is untrusted, so reading one costs bounded work (schemas/limits.py):
- local paths must be regular files: a FIFO would block the worker forever, a device such as
  /dev/zero never ends (transforms.io.open_input refuses both);
- at most `max_mask_bytes` bytes are read: a longer file is refused without reading the rest
  (the reader reads one byte past the bound; array_of_bytes refuses such data);
- the image's height x width, taken from the PNG or .npy header before any pixel is decoded,
  must be at most `max_pixels`: a small file can claim a size that would take all memory.
Every refusal is a MaskFileError whose message becomes the rejection reason of the row.
"""

from __future__ import annotations

import io

import numpy as np

from evalbeam.schemas.limits import ImageLimits, file_size_problem, image_size_problem

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Pillow image modes of single-channel images (grey, bilevel, palette indices)
SINGLE_CHANNEL = ("1", "L", "P", "I", "I;16", "I;16B", "I;16L")


class MaskFileError(Exception):
    """A mask file that cannot be read or is not a single-channel 2-D array; the message says why
    and becomes the rejection reason of the row."""


def array_of_bytes(data: bytes, uri: str, limits: ImageLimits = ImageLimits(),
                   what: str = "mask_uri") -> np.ndarray:
    """A 2-D integer or bool array from the bytes of a .npy file or a single-channel image (8- or
    16-bit grey, or palette indices) named `uri`. Colour images are refused: a label map must
    hold class ids. data holds more than limits.max_mask_bytes bytes: refused (the reader read
    one byte past the bound to tell). `what` names the file in messages ("mask_uri",
    "label_map_uri")."""
    name = f"{what} {uri}"
    problem = file_size_problem(len(data), limits.max_mask_bytes, name)
    if problem:
        raise MaskFileError(problem)
    if uri.lower().endswith(".npy"):
        array = _npy_array(data, limits.max_pixels, name)
    else:
        array = _image_array(data, limits.max_pixels, name)
    if array.ndim != 2:
        raise MaskFileError(f"{name} has shape {list(array.shape)}; a mask or label map is 2-D")
    return array


def _npy_array(data: bytes, max_pixels: int, name: str) -> np.ndarray:
    """The array of a .npy file, its header checked first: integer or bool values, 2-D, at most
    max_pixels, and data long enough for the shape (np.load would allocate the claimed shape
    before finding out)."""
    from numpy.lib import format as npy

    stream = io.BytesIO(data)
    try:
        version = npy.read_magic(stream)
        read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read_header(stream)
    except Exception as error:
        raise MaskFileError(f"{name} is not a NumPy .npy array: {first_line(error)}") from None
    if dtype.kind not in "biu":
        raise MaskFileError(f"{name} holds {dtype} values; masks and label maps hold integers or "
                            "booleans")
    if len(shape) != 2:
        raise MaskFileError(f"{name} has shape {list(shape)}; a mask or label map is 2-D")
    problem = image_size_problem(int(shape[0]), int(shape[1]), max_pixels, name)
    if problem:
        raise MaskFileError(problem)
    expected = int(shape[0]) * int(shape[1]) * dtype.itemsize
    if len(data) - stream.tell() < expected:
        raise MaskFileError(f"{name} is cut short: its header claims {list(shape)} {dtype} values "
                            f"({expected:,} bytes) but {len(data) - stream.tell():,} bytes follow")
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as error:
        raise MaskFileError(f"{name} is not a NumPy .npy array: {first_line(error)}") from None


def _image_array(data: bytes, max_pixels: int, name: str) -> np.ndarray:
    """The pixels of a single-channel image, its size checked before decoding.

    Opening reads only the header (Pillow decodes on first access). PNG files are opened with
    Pillow's PNG reader directly: Image.open would also apply Pillow's own fixed bound (warning
    above 89 megapixels, refusing above 179), which --max_image_pixels replaces. Other formats
    go through Image.open and keep Pillow's bound as well."""
    from PIL import Image, PngImagePlugin, UnidentifiedImageError

    png = data.startswith(PNG_SIGNATURE)
    try:
        image = PngImagePlugin.PngImageFile(io.BytesIO(data)) if png else Image.open(io.BytesIO(data))
    except UnidentifiedImageError:   # Pillow's message names the buffer object, not the file
        raise MaskFileError(f"{name} is not a PNG or .npy image (nor another image format "
                            "Pillow reads)") from None
    except Exception as error:
        what = "a damaged PNG file" if png else "not a readable image"
        raise MaskFileError(f"{name} is {what}: {first_line(error)}") from None
    with image:
        problem = image_size_problem(image.height, image.width, max_pixels, name)
        if problem:
            raise MaskFileError(problem)
        if image.mode not in SINGLE_CHANNEL:
            raise MaskFileError(f"{name} is a {image.mode} image; masks and label maps must be "
                                "single-channel (grey or palette) images")
        try:
            return np.asarray(image)
        except Exception as error:   # truncated or corrupt pixel data
            raise MaskFileError(f"{name} cannot be decoded: {first_line(error)}") from None


def first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
