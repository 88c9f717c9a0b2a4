"""Reading mask and label-map files (PNG or any image Pillow reads, or NumPy .npy) through Beam's
FileSystems, so local paths, gs:// and s3:// work the same inside workers."""

from __future__ import annotations

import io

import numpy as np


class MaskFileError(Exception):
    """A mask file that cannot be read or is not a single-channel 2-D array; the message says why
    and becomes the rejection reason of the row."""


def read_array(uri: str) -> np.ndarray:
    """A 2-D integer or bool array from a .npy file or a single-channel image (8- or 16-bit
    grey, or palette indices). Colour images are refused: a label map must hold class ids."""
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.open(uri, compression_type="uncompressed") as stream:
            data = stream.read()
    except Exception as error:  # missing file, permissions, bad scheme: say which and why
        raise MaskFileError(f"cannot read {uri}: {_first_line(error)}") from None
    if uri.lower().endswith(".npy"):
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as error:
            raise MaskFileError(f"{uri} is not a NumPy .npy array: {_first_line(error)}") from None
        if array.dtype.kind not in "biu":
            raise MaskFileError(f"{uri} holds {array.dtype} values; masks and label maps hold "
                                "integers or booleans")
    else:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as image:
                if image.mode not in ("1", "L", "P", "I", "I;16", "I;16B", "I;16L"):
                    raise MaskFileError(f"{uri} is a {image.mode} image; masks and label maps must "
                                        "be single-channel (grey or palette) images")
                array = np.asarray(image)
        except MaskFileError:
            raise
        except Exception as error:
            raise MaskFileError(f"{uri} is not a readable image: {_first_line(error)}") from None
    if array.ndim != 2:
        raise MaskFileError(f"{uri} has shape {list(array.shape)}; a mask or label map is 2-D")
    return array


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
