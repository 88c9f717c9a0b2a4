"""Reading mask and label-map files through transforms.io.open_input (Beam's FileSystems), so
local paths, gs:// and s3:// work the same inside workers; the bytes are checked and decoded by
schemas/mask_files.py, whose docstring lists the bounds."""

from __future__ import annotations

import numpy as np

from evalbeam.schemas.limits import ImageLimits
from evalbeam.schemas.mask_files import MaskFileError, array_of_bytes, first_line
from evalbeam.transforms.io import InputError, open_input


def read_array(uri: str, limits: ImageLimits = ImageLimits(), what: str = "mask_uri") -> np.ndarray:
    """A 2-D integer or bool array from a .npy file or a single-channel image (8- or 16-bit
    grey, or palette indices), or MaskFileError. Colour images are refused: a label map must
    hold class ids. `what` names the file in messages ("mask_uri", "label_map_uri")."""
    return array_of_bytes(read_bounded(uri, limits.max_mask_bytes, what), uri, limits, what)


def read_bounded(uri: str, max_bytes: int, what: str) -> bytes:
    """The file's first max_bytes + 1 bytes (one byte past the bound, so that a longer file is
    told apart without reading the rest), read through open_input, or MaskFileError when it is
    not a regular file or cannot be opened."""
    try:
        with open_input(uri) as stream:
            return stream.read(max_bytes + 1)
    except InputError as error:   # missing, not a regular file, truncated compressed data
        raise MaskFileError(f"{what}: {getattr(error, 'message', error)}") from None
    except Exception as error:  # permissions, bad scheme, remote errors: say which and why
        raise MaskFileError(f"cannot read {what} {uri}: {first_line(error)}") from None
