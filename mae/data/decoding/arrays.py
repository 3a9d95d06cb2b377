"""Reading images of any channel count and bit depth as arrays: 8- and 16-bit PNG (and any format
PIL reads), TIFF (grayscale, RGB, multi-band; 8/16-bit, float) through ``tifffile``, and ``.npy``
arrays stored (H, W, C). ``read_pixels`` is the entry point every consumer of the array path calls.

Every read starts from the file's header (``read_header``): its dimensions and pixel type are
checked, and its size against the pixel limit (``check_decoded_size``), before any pixel is read, so
one file can neither crash a run nor ask for more memory than the limit allows. Whatever a reader
library raises for one file is that file's error: ``OSError``, ``ValueError`` or
``PIL.Image.DecompressionBombError`` naming it, which every consumer skips by name.

Values are scaled by their type's range to [0, 1] (uint8 / 255, uint16 / 65535); float data is
kept in its own units (the data's ``mean`` / ``std`` normalise it).
"""

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image

from mae.data.decoding.formats import (
    EncodedImage,
    PixelFormat,
    Source,
    is_array_file,
    open_pil,
    opened,
    reader_of,
    unlimited_pil,
)
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS, check_decoded_size

# Float values this large are no measurement in any unit but a no-data fill (GeoTIFF's is -3.4e38,
# float32's extreme); float16 data's fill is its own extreme (+-65504), so the bound is the smaller.
FILL_MAGNITUDE = 1e30
# PIL modes -> (channels, numpy dtype of their pixels); others are converted to RGB first.
_PIL_MODES = {
    "1": (1, "uint8"), "L": (1, "uint8"), "LA": (2, "uint8"), "RGB": (3, "uint8"), "RGBA": (4, "uint8"),
    "P": (3, "uint8"), "CMYK": (3, "uint8"), "YCbCr": (3, "uint8"), "I;16": (1, "uint16"), "I;16L": (1, "uint16"),
    "I;16B": (1, "uint16"), "I;16N": (1, "uint16"), "I": (1, "int32"), "F": (1, "float32"),
}  # fmt: skip
_UNIT_SCALE = {"uint8": 255.0, "uint16": 65535.0}


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says its pixels are, as ``read_array`` returns them: (H, W, C) of
    ``dtype``."""

    height: int
    width: int
    channels: int
    dtype: np.dtype

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.height, self.width, self.channels


def _kind(path: Source) -> str:
    """The format's name for messages."""
    return {"npy": "an .npy array", "tiff": "a TIFF"}.get(reader_of(path), "an image")


def _unreadable(path: Source, kind: str, err: Exception) -> ValueError:
    """The error for a file its library could not parse (corrupt, truncated, misnamed): names it, and
    is a ``ValueError`` so the datasets skip it by name like any unreadable image."""
    return ValueError(f"cannot read {path} as {kind}: {type(err).__name__}: {err}")


class InvalidHeaderError(ValueError):
    """A header that describes no image (raised by the checks here, already naming the file)."""


@contextlib.contextmanager
def _reading(path: Source) -> Iterator[None]:
    """Whatever a reader library raises for this one file (``MemoryError``, ``IndexError``, a codec's
    ``RuntimeError``, ...) as a ``ValueError`` naming it; ``OSError`` (PIL's "truncated", the OS's
    "no such file") and our own errors pass as they are."""
    try:
        yield
    except (OSError, Image.DecompressionBombError, InvalidHeaderError):
        raise
    except Exception as err:
        raise _unreadable(path, _kind(path), err) from err


def _checked_header(path: Source, shape: tuple[int, ...], dtype: np.dtype) -> ImageHeader:
    """The header of (H, W) or (H, W, C) pixels of ``dtype``, refused unless every dimension is
    positive and the dtype holds numbers."""
    if len(shape) not in (2, 3):
        raise InvalidHeaderError(f"{path} holds an array of shape {shape}; expected (H, W) or (H, W, C)")
    if min(shape) < 1:
        raise InvalidHeaderError(f"{path} holds an array of shape {shape}: every dimension must be at least 1")
    if dtype.kind not in "uif" or dtype.fields is not None:
        raise InvalidHeaderError(f"{path} holds {dtype} values, not pixels; store it as uint8, uint16 or float")
    return ImageHeader(shape[0], shape[1], 1 if len(shape) == 2 else shape[2], dtype)


def _npy_layout(f: BinaryIO, path: Source) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, Fortran order, data bytes) from an open ``.npy`` file's header, leaving ``f``
    at the first data byte; the file must hold every byte the header promises."""
    if f.read(4) == b"PK\x03\x04":  # a zip archive: what np.savez writes
        raise InvalidHeaderError(f"cannot read {path} as an .npy array: it holds a NpzFile (an .npz archive?)")
    f.seek(0)
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise InvalidHeaderError(f"cannot read {path} as an .npy array: format version {version} is not one of "
                                 f"a plain array (1.0, 2.0)")  # fmt: skip
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran_order, dtype = read(f)
    data_start = f.tell()
    stored = f.seek(0, os.SEEK_END) - data_start
    f.seek(data_start)
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize if shape and min(shape) > 0 else 0
    if stored < needed:
        raise InvalidHeaderError(f"cannot read {path} as an .npy array: its header promises {shape} of {dtype} "
                                 f"({needed:,} bytes), the file holds {stored:,}: truncated")  # fmt: skip
    return tuple(shape), dtype, fortran_order, needed


def _open_npy(path: Source) -> BinaryIO:
    return path.file() if isinstance(path, EncodedImage) else open(path, "rb")


def _npy_header(path: Source) -> ImageHeader:
    with _open_npy(path) as f:
        shape, dtype, _, _ = _npy_layout(f, path)
    return _checked_header(path, shape, dtype)


def _tiff_layout(path: Source) -> tuple[tuple[int, ...], np.dtype, str]:
    """(shape, dtype, axes) of a TIFF's first image series, from its header."""
    import tifffile

    with tifffile.TiffFile(opened(path)) as tif:
        series = tif.series[0]
        if series.dtype is None:
            raise InvalidHeaderError(f"cannot read {path} as a TIFF: its first image has no pixel type")
        return tuple(series.shape), np.dtype(series.dtype), series.axes


def _tiff_header(path: Source) -> ImageHeader:
    """Axes ``YX``, ``YXS`` (interleaved) or ``?YX`` (planar: ``CYX``, ``SYX``, pages as bands)."""
    shape, dtype, axes = _tiff_layout(path)
    planar = len(shape) == 3 and axes[-2:] == "YX"
    if not (len(shape) == 2 or planar or len(shape) == 3 and axes[:2] == "YX"):
        raise InvalidHeaderError(f"cannot read {path} as one image: its axes are {axes!r}, shape {shape}")
    return _checked_header(path, (*shape[1:], shape[0]) if planar else shape, dtype)


def _pil_header(path: Source) -> ImageHeader:
    with unlimited_pil():  # asking the size of a huge image is not decoding it
        with open_pil(path) as img:
            channels, dtype = _PIL_MODES.get(img.mode, (3, "uint8"))
            width, height = img.size
    return _checked_header(path, (height, width, channels), np.dtype(dtype))


def read_header(path: Source) -> ImageHeader:
    """The (H, W, C) and dtype ``read_array`` will return for an image file, from its header only.

    Raises:
        OSError, ValueError: naming the file: unreadable, truncated (``.npy``), not one 2-D image
            (a 0-d, empty or 4-D array, negative dimensions), or pixels that are not numbers.
    """
    with _reading(path):
        reader = reader_of(path)
        if reader == "npy":
            return _npy_header(path)
        if reader == "tiff":
            return _tiff_header(path)
        return _pil_header(path)


def pixel_format(path: Source) -> PixelFormat:
    """What ``read_array`` will return for an image file (channels, dtype) and whether only the array
    path reads it, from its header only (``read_header``)."""
    header = read_header(path)
    return PixelFormat(header.channels, header.dtype.name, is_array_file(path))


def read_array(path: Source, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """The pixels of an image file as (H, W, C), in their stored dtype; its header is checked
    (``read_header``) and its size against ``max_pixels`` (``check_decoded_size``) first.

    Raises:
        OSError, ValueError: naming the file, for anything that makes it unreadable, whatever its
            reader library raised (a ``MemoryError`` or ``IndexError`` is a ``ValueError`` here).
        PIL.Image.DecompressionBombError: over the limit, before any pixel is read.
    """
    header = read_header(path)
    check_decoded_size(path, header, max_pixels)
    with _reading(path):
        reader = reader_of(path)
        if reader == "npy":
            array = _read_npy(path)
        elif reader == "tiff":
            array = _read_tiff(path)
        else:
            array = _read_pil(path)
    if array.shape != header.shape or array.dtype != header.dtype:
        raise ValueError(f"cannot read {path}: its pixels are {array.shape} of {array.dtype}, but its header "
                         f"says {header.shape} of {header.dtype}")  # fmt: skip
    return array


def _read_npy(path: Source) -> np.ndarray:
    with _open_npy(path) as f:
        shape, dtype, fortran_order, size = _npy_layout(f, path)
        data = bytearray(size)  # writable memory for the array
        f.readinto(data)
    array = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran_order else "C")
    return array[:, :, None] if array.ndim == 2 else array


def _read_tiff(path: Source) -> np.ndarray:
    import tifffile

    with tifffile.TiffFile(opened(path)) as tif:
        axes = tif.series[0].axes
        array = tif.asarray()  # the first series, as read_header described it
    if array.ndim == 2:
        return array[:, :, None]
    return np.moveaxis(array, 0, -1) if axes[-2:] == "YX" else array


def _read_pil(path: Source) -> np.ndarray:
    with unlimited_pil(), open_pil(path) as img:
        if img.mode not in _PIL_MODES or img.mode in ("P", "CMYK", "YCbCr", "1"):
            img = img.convert("RGB" if img.mode != "1" else "L")
        array = np.asarray(img)
    return array[:, :, None] if array.ndim == 2 else array


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
        raise ValueError(f"{path}: {dtype} values {low}..{high} are outside 8- or 16-bit range; store it as "
                         f"uint8, uint16 or float")  # fmt: skip
    if array.dtype.kind == "f":
        fill = min(FILL_MAGNITUDE, float(np.finfo(array.dtype).max))
        if not (np.abs(array) < fill).all():  # NaN compares False too
            _refuse_non_measurements(array, fill, path)
        return array.astype(np.float32)
    raise ValueError(f"{path}: pixels of dtype {dtype} are not an image's")


def _refuse_non_measurements(values: np.ndarray, fill: float, path: Source) -> None:
    """Raises the ``ValueError`` for NaN / inf, or for finite no-data fills, naming the file."""
    finite = np.isfinite(values)
    if not finite.all():
        raise ValueError(f"{path} holds non-finite values (NaN or inf)")
    fills = np.abs(values) >= fill
    raise ValueError(
        f"{path} holds {int(fills.sum()):,} value(s) of magnitude {fill:g} or more (e.g. {values[fills][0]:g}): "
        f"no-data fills (GeoTIFF writes -3.4e38), not measurements; replace them (e.g. by the band's mean) "
        f"or leave the file out"
    )


def check_channels(channels: int, in_chans: int, path: Source) -> None:
    """Raises ValueError, naming the file, its channel count and ``data.in_chans``, unless an image
    of ``channels`` channels is read for an ``in_chans`` model (``adapt_channels``)."""
    if channels != in_chans and not (channels == 1 and in_chans == 3):
        raise ValueError(
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


def read_pixels(
    path: Source,
    in_chans: int | None = None,
    expected: tuple[int, str] | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> np.ndarray:
    """The array path's reading of one image file: float32 (H, W, C) in the data's units
    (``to_unit_range``), with ``in_chans`` channels (``adapt_channels``; None: as stored).

    Args:
        expected: (channels, dtype name) the file must have (``PixelFormat.kind``), as the rest of
            its folder or shards do; None: any.
        max_pixels: the pixel limit, checked from the header before decoding (None: none).

    Raises:
        OSError, ValueError, PIL.Image.DecompressionBombError: naming the file.
    """
    array = read_array(path, max_pixels)
    if expected is not None and (array.shape[2], array.dtype.name) != tuple(expected):
        raise ValueError(
            f"{path} has {array.shape[2]} channel(s) of {array.dtype.name}, unlike the rest of the folder "
            f"({expected[0]} of {expected[1]})"
        )
    array = to_unit_range(array, path)
    return array if in_chans is None else adapt_channels(array, in_chans, path)


def chw_tensor(array: np.ndarray) -> torch.Tensor:
    """(H, W, C) pixels as a contiguous (C, H, W) tensor."""
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
