"""Decoded pixels in the data's units, the last stop of every file's reading: integers scaled by their
type's range to [0, 1] (uint8 / 255, uint16 / 65535), float data kept in its own units (the data's
``mean`` / ``std`` normalise it) but refused when it holds NaN, inf or no-data fills; the channels
adapted to the model's (``adapt_channels``), and the (C, H, W) tensor (``chw_tensor``)."""

import numpy as np
import torch

from mae.data.decoding.formats import Source
from mae.errors import InputError

# Float values this large are no measurement in any unit but a no-data fill (GeoTIFF's is -3.4e38,
# float32's extreme); float16 data's fill is its own extreme (+-65504), so the bound is the smaller.
FILL_MAGNITUDE = 1e30
_UNIT_SCALE = {"uint8": 255.0, "uint16": 65535.0}


def to_unit_range(array: np.ndarray, path: Source) -> np.ndarray:
    """float32 (H, W, C): integers scaled by their type's range to [0, 1], floats as they are.

    Raises:
        ValueError: naming the file, for integer types other than 8/16-bit (16-bit data stored as
            int32, as PIL's ``I`` mode does, is accepted when its values fit), non-finite floats, or
            no-data fills (``FILL_MAGNITUDE`` or more, or the float type's extreme).
    """
    dtype = array.dtype.name
    if dtype in _UNIT_SCALE:
        return array.astype(np.float32) / _UNIT_SCALE[dtype]
    if array.dtype.kind in "iu":
        low, high = int(array.min()), int(array.max())
        if 0 <= low and high <= 65535:
            return array.astype(np.float32) / 65535.0
        raise InputError(
            f"{path}: {dtype} values {low}..{high} are outside 8- or 16-bit range; store it as "
            f"uint8, uint16 or float"
        )
    if array.dtype.kind == "f":
        fill = min(FILL_MAGNITUDE, float(np.finfo(array.dtype).max))
        if not (np.abs(array) < fill).all():  # NaN compares False too
            _refuse_non_measurements(array, fill, path)
        return array.astype(np.float32)
    raise InputError(f"{path}: pixels of dtype {dtype} are not an image's")


def _refuse_non_measurements(values: np.ndarray, fill: float, path: Source) -> None:
    """Raises the ``ValueError`` for NaN / inf, or for finite no-data fills, naming the file."""
    finite = np.isfinite(values)
    if not finite.all():
        raise InputError(f"{path} holds non-finite values (NaN or inf)")
    fills = np.abs(values) >= fill
    raise InputError(
        f"{path} holds {int(fills.sum()):,} value(s) of magnitude {fill:g} or more (e.g. "
        f"{values[fills][0]:g}): no-data fills (GeoTIFF writes -3.4e38), not measurements; replace them "
        "(e.g. by the band's mean) or leave the file out"
    )


def check_channels(channels: int, in_chans: int, path: Source) -> None:
    """Raises ValueError, naming the file, its channel count and ``data.in_chans``, unless an image
    of ``channels`` channels is read for an ``in_chans`` model (``adapt_channels``)."""
    if channels != in_chans and not (channels == 1 and in_chans == 3):
        raise InputError(
            f"{path} has {channels} channel(s) but data.in_chans is {in_chans}; set data.in_chans: {channels}"
        )


def adapt_channels(array: np.ndarray, in_chans: int, path: Source) -> np.ndarray:
    """(H, W, C) -> (H, W, ``in_chans``): equal counts pass, and grayscale repeats to 3 channels (as an
    RGB conversion does). A fourth band is never dropped silently: it may be data, not alpha.

    Raises:
        ValueError: naming the file, its channel count and ``data.in_chans`` (``check_channels``).
    """
    check_channels(array.shape[2], in_chans, path)
    return np.repeat(array, 3, axis=2) if array.shape[2] != in_chans else array


def chw_tensor(array: np.ndarray) -> torch.Tensor:
    """(H, W, C) pixels as a contiguous (C, H, W) tensor."""
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
