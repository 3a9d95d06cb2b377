"""Reading images of any channel count and bit depth as arrays: 8- and 16-bit PNG (and any format
PIL reads), TIFF (grayscale, RGB, multi-band; 8/16-bit, float) through ``tifffile``, and ``.npy``
arrays stored (H, W, C).

Values are scaled by their type's range to [0, 1] (uint8 / 255, uint16 / 65535); float data is
kept in its own units (the data's ``mean`` / ``std`` normalise it).
"""

import io
import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

ARRAY_EXTENSIONS = (".npy", ".tif", ".tiff")
# PIL modes -> (channels, numpy dtype of their pixels); others are converted to RGB first.
_PIL_MODES = {
    "1": (1, "uint8"), "L": (1, "uint8"), "LA": (2, "uint8"), "RGB": (3, "uint8"), "RGBA": (4, "uint8"),
    "P": (3, "uint8"), "CMYK": (3, "uint8"), "YCbCr": (3, "uint8"), "I;16": (1, "uint16"), "I;16L": (1, "uint16"),
    "I;16B": (1, "uint16"), "I;16N": (1, "uint16"), "I": (1, "int32"), "F": (1, "float32"),
}  # fmt: skip
_UNIT_SCALE = {"uint8": 255.0, "uint16": 65535.0}


class EncodedImage:
    """An image file's encoded bytes (JPEG, PNG, ...) and the name to report it by, e.g. a shard's
    ``s3://bucket/train:class/img.jpg``."""

    def __init__(self, data: bytes | memoryview | bytearray, name: str) -> None:
        self.data = data
        self.name = name

    def tensor(self) -> torch.Tensor:
        """The bytes as a 1-D uint8 tensor: over a ``bytearray``'s memory, else over a copy (tensors
        need writable memory)."""
        data = self.data if isinstance(self.data, bytearray) else bytearray(self.data)
        return torch.frombuffer(data, dtype=torch.uint8)

    def file(self) -> io.BytesIO:
        """A new file object over the bytes, for readers that take one."""
        return io.BytesIO(self.data)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"EncodedImage({self.name}, {len(self.data)} bytes)"


Source = "str | os.PathLike | EncodedImage"  # a file, or a file's bytes held in memory (a shard's sample)


def _suffix(path: Source) -> str:
    return Path(path.name if isinstance(path, EncodedImage) else path).suffix.lower()


def _file(path: Source) -> "str | os.PathLike | BinaryIO":
    """What a reader library opens: the path, or a file object over the bytes."""
    return path.file() if isinstance(path, EncodedImage) else path


def open_pil(path: Source) -> Image.Image:
    """``Image.open`` of a file or a sample's bytes; an unidentifiable one names the file or sample."""
    try:
        return Image.open(_file(path))
    except UnidentifiedImageError as err:
        raise UnidentifiedImageError(f"cannot identify image file {path}") from err


def _unreadable(path: str | os.PathLike, kind: str, err: Exception) -> ValueError:
    """The error for a file its library could not parse (corrupt, truncated, misnamed): names it, and
    is a ``ValueError`` so the datasets skip it by name like any unreadable image."""
    return ValueError(f"cannot read {path} as {kind}: {type(err).__name__}: {err}")


def _tiff_layout(path: Source) -> tuple[tuple[int, ...], str, str]:
    """(shape, dtype name, axes) of a TIFF's first image series, from its header."""
    import tifffile

    try:
        with tifffile.TiffFile(_file(path)) as tif:
            series = tif.series[0]
            return tuple(series.shape), series.dtype.name, series.axes
    except (tifffile.TiffFileError, IndexError, KeyError, ValueError, EOFError, struct.error) as err:
        raise _unreadable(path, "a TIFF", err) from err


def _load_npy(path: Source, mmap: bool) -> np.ndarray:
    try:
        source, mmap_mode = (path.file(), None) if isinstance(path, EncodedImage) else (path, "r" if mmap else None)
        array = np.load(source, mmap_mode=mmap_mode)
    except (ValueError, EOFError, OSError) as err:  # truncated, pickled objects, not an .npy at all
        raise _unreadable(path, "an .npy array", err) from err
    if not isinstance(array, np.ndarray):  # an .npz archive under an .npy name
        raise ValueError(f"cannot read {path} as an .npy array: it holds a {type(array).__name__} (an .npz archive?)")
    return array


def _channels_last(array: np.ndarray, axes: str, path: str | os.PathLike) -> np.ndarray:
    """(H, W, C) of a TIFF array with ``axes`` (e.g. ``YX``, ``YXS``, ``CYX``, ``SYX``)."""
    if array.ndim == 2:
        return array[:, :, None]
    if array.ndim == 3 and axes[-2:] == "YX":
        return np.moveaxis(array, 0, -1)
    if array.ndim == 3 and axes[:2] == "YX":
        return array
    raise ValueError(f"cannot read {path} as one image: its axes are {axes!r}, shape {array.shape}")


def probe(path: Source) -> tuple[int, str]:
    """(channels, dtype name) of an image file, read from its header only.

    Raises:
        OSError, ValueError: unreadable file, naming it.
    """
    suffix = _suffix(path)
    if suffix == ".npy":
        array = _load_npy(path, mmap=True)
        if array.ndim not in (2, 3):
            raise ValueError(f"{path} holds an array of shape {array.shape}; expected (H, W) or (H, W, C)")
        return (1 if array.ndim == 2 else array.shape[2]), array.dtype.name
    if suffix in (".tif", ".tiff"):
        shape, dtype, axes = _tiff_layout(path)
        if len(shape) == 2:
            return 1, dtype
        return (shape[0] if axes[-2:] == "YX" else shape[-1]), dtype
    with open_pil(path) as img:
        return _PIL_MODES.get(img.mode, (3, "uint8"))


def header_size(path: Source) -> tuple[int, int]:
    """(width, height) of an image file, from its header only."""
    suffix = _suffix(path)
    if suffix == ".npy":
        shape = _load_npy(path, mmap=True).shape
        return shape[1], shape[0]
    if suffix in (".tif", ".tiff"):
        shape, _, axes = _tiff_layout(path)
        return shape[axes.index("X")], shape[axes.index("Y")]
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # asking the size of a huge image is not decoding it
    try:
        with open_pil(path) as img:
            return img.size
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def read_array(path: Source) -> np.ndarray:
    """The pixels of an image file as (H, W, C), in their stored dtype."""
    suffix = _suffix(path)
    if suffix == ".npy":
        array = _load_npy(path, mmap=False)
        return array[:, :, None] if array.ndim == 2 else array
    if suffix in (".tif", ".tiff"):
        import tifffile

        _, _, axes = _tiff_layout(path)
        try:
            pixels = tifffile.imread(_file(path))
        except (tifffile.TiffFileError, IndexError, KeyError, ValueError, EOFError, struct.error) as err:
            raise _unreadable(path, "a TIFF", err) from err
        return _channels_last(pixels, axes, path)
    with open_pil(path) as img:
        if img.mode not in _PIL_MODES or img.mode in ("P", "CMYK", "YCbCr", "1"):
            img = img.convert("RGB" if img.mode != "1" else "L")
        array = np.asarray(img)
    return array[:, :, None] if array.ndim == 2 else array


def to_unit_range(array: np.ndarray, path: str | os.PathLike) -> np.ndarray:
    """float32 (H, W, C): integers scaled by their type's range to [0, 1], floats as they are.

    Raises:
        ValueError: naming the file, for integer types other than 8/16-bit (16-bit data stored as
            int32, as PIL's ``I`` mode does, is accepted when its values fit) or non-finite floats.
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
        array = array.astype(np.float32)
        if not np.isfinite(array).all():
            raise ValueError(f"{path} holds non-finite values (NaN or inf)")
        return array
    raise ValueError(f"{path}: pixels of dtype {dtype} are not an image's")


def adapt_channels(array: np.ndarray, in_chans: int, path: str | os.PathLike) -> np.ndarray:
    """(H, W, C) -> (H, W, ``in_chans``): equal counts pass, and grayscale repeats to 3 channels (as an
    RGB conversion does). A fourth band is never dropped silently: it may be data, not alpha.

    Raises:
        ValueError: naming the file, its channel count and ``data.in_chans``.
    """
    channels = array.shape[2]
    if channels == in_chans:
        return array
    if channels == 1 and in_chans == 3:
        return np.repeat(array, 3, axis=2)
    raise ValueError(f"{path} has {channels} channel(s) but data.in_chans is {in_chans}; set data.in_chans: {channels}")
