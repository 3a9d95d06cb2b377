"""An image file opened once, its header read and checked before any pixel is (``open_image_file``): an
``ImageFile`` holds the open file (a PIL image, a ``.npy`` file at its first data byte, a
``tifffile.TiffFile``) and its ``ImageHeader``: the (H, W, C) and dtype its pixels are read as. Whatever
a reader library raises for one file is that file's error (``reading``): ``OSError``, ``ValueError`` or
``PIL.Image.DecompressionBombError`` naming it, which every consumer skips by name.

Which library opens a file is decided by its name before (``mae.data.decoding.formats.reader_of``);
what is done with the header after (``route``, ``limits``, then the pixel readers ``rgb`` / ``arrays``).
"""

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from PIL import Image, UnidentifiedImageError

from mae.data.decoding.formats import EncodedImage, Reader, Source
from mae.errors import InputError

# PIL modes -> (channels, numpy dtype of their pixels); others are converted to RGB first.
PIL_MODES = {
    "1": (1, "uint8"),
    "L": (1, "uint8"),
    "LA": (2, "uint8"),
    "RGB": (3, "uint8"),
    "RGBA": (4, "uint8"),
    "P": (3, "uint8"),
    "CMYK": (3, "uint8"),
    "YCbCr": (3, "uint8"),
    "I;16": (1, "uint16"),
    "I;16L": (1, "uint16"),
    "I;16B": (1, "uint16"),
    "I;16N": (1, "uint16"),
    "I": (1, "int32"),
    "F": (1, "float32"),
}
_KINDS = {"npy": "an .npy array", "tiff": "a TIFF", "pil": "an image"}  # the formats' names, for messages


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says its pixels are, as the array path returns them: (H, W, C) of
    ``dtype``."""

    height: int
    width: int
    channels: int
    dtype: np.dtype

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.height, self.width, self.channels


class ImageFileError(InputError):
    """An error about one image file that already names it: ``reading`` passes it as it is."""


class InvalidHeaderError(ImageFileError):
    """A header that describes no image (raised by the checks here, already naming the file)."""


def opened(source: Source) -> "str | os.PathLike | BinaryIO":
    """What a reader library opens: the path, or a file object over the bytes."""
    return source.file() if isinstance(source, EncodedImage) else source


def open_pil(source: Source) -> Image.Image:
    """``Image.open`` of a file or a sample's bytes; an unidentifiable one names the file or sample."""
    try:
        return Image.open(opened(source))
    except UnidentifiedImageError as err:
        raise UnidentifiedImageError(f"cannot identify image file {source}") from err


@contextlib.contextmanager
def unlimited_pil() -> Iterator[None]:
    """PIL's own decompression-bomb check off: the callers check ``max_pixels`` themselves
    (``mae.data.decoding.limits``), before decoding and with messages that name the option."""
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def unreadable(path: Source, reader: Reader, err: Exception) -> InputError:
    """The error for a file its library could not parse (corrupt, truncated, misnamed): names it, and
    is a ``ValueError`` (an ``InputError``) so the datasets skip it by name like any unreadable image."""
    return InputError(f"cannot read {path} as {_KINDS[reader]}: {type(err).__name__}: {err}")


@contextlib.contextmanager
def reading(path: Source, reader: Reader) -> Iterator[None]:
    """Whatever a reader library raises for this one file (``MemoryError``, ``IndexError``, a codec's
    ``RuntimeError``, ...) as a ``ValueError`` naming it; ``OSError`` (PIL's "truncated", the OS's
    "no such file") and our own errors pass as they are."""
    try:
        yield
    except (OSError, Image.DecompressionBombError, ImageFileError):
        raise
    except Exception as err:
        raise unreadable(path, reader, err) from err


def checked_header(path: Source, shape: tuple[int, ...], dtype: np.dtype) -> ImageHeader:
    """The header of (H, W) or (H, W, C) pixels of ``dtype``, refused unless every dimension is
    positive and the dtype holds numbers."""
    if len(shape) not in (2, 3):
        raise InvalidHeaderError(f"{path} holds an array of shape {shape}; expected (H, W) or (H, W, C)")
    if min(shape) < 1:
        raise InvalidHeaderError(
            f"{path} holds an array of shape {shape}: every dimension must be at least 1"
        )
    if dtype.kind not in "uif" or dtype.fields is not None:
        raise InvalidHeaderError(
            f"{path} holds {dtype} values, not pixels; store it as uint8, uint16 or float"
        )
    return ImageHeader(shape[0], shape[1], 1 if len(shape) == 2 else shape[2], dtype)


def npy_layout(f: BinaryIO, path: Source) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """(shape, dtype, Fortran order, data bytes) from an open ``.npy`` file's header, leaving ``f``
    at the first data byte; the file must hold every byte the header promises."""
    if f.read(4) == b"PK\x03\x04":  # a zip archive: what np.savez writes
        raise InvalidHeaderError(
            f"cannot read {path} as an .npy array: it holds a NpzFile (an .npz archive?)"
        )
    f.seek(0)
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise InvalidHeaderError(
            f"cannot read {path} as an .npy array: format version {version} is not one of "
            f"a plain array (1.0, 2.0)"
        )
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran_order, dtype = read(f)
    data_start = f.tell()
    stored = f.seek(0, os.SEEK_END) - data_start
    f.seek(data_start)
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize if shape and min(shape) > 0 else 0
    if stored < needed:
        raise InvalidHeaderError(
            f"cannot read {path} as an .npy array: its header promises {shape} of {dtype} "
            f"({needed:,} bytes), the file holds {stored:,}: truncated"
        )
    return tuple(shape), dtype, fortran_order, needed


@dataclass
class ImageFile:
    """One image file, open: its checked ``header``, and ``handle``, what the pixel readers read from: the
    PIL image (not yet decoded), the ``.npy`` file at its first data byte (with ``npy``: shape, dtype,
    Fortran order and data bytes), or the ``tifffile.TiffFile`` (with ``tiff_axes``: its first series' axes).
    """

    path: Source
    reader: Reader
    header: ImageHeader
    handle: Any
    npy: tuple[tuple[int, ...], np.dtype, bool, int] | None = None
    tiff_axes: str = ""


@contextlib.contextmanager
def open_image_file(path: Source, reader: Reader) -> Iterator[ImageFile]:
    """``path`` opened once by the library ``reader`` names, its header read and checked, for the pixel
    readers to read from inside the ``with`` block; closed after it. Inside the block, PIL's own pixel limit
    is off (the limits are checked from the header, ``mae.data.decoding.limits``) and whatever a reader
    library raises for this file is a ``ValueError`` naming it (``reading``).

    Raises:
        OSError, ValueError: naming the file: unreadable, truncated (``.npy``), not one 2-D image (a 0-d,
            empty or 4-D array, negative dimensions), or pixels that are not numbers.
    """
    with contextlib.ExitStack() as stack, unlimited_pil(), reading(path, reader):
        if reader == "npy":
            yield _npy_file(path, stack)
        elif reader == "tiff":
            yield _tiff_file(path, stack)
        else:
            yield _pil_file(path, stack)


def _npy_file(path: Source, stack: contextlib.ExitStack) -> ImageFile:
    handle = stack.enter_context(opened(path) if isinstance(path, EncodedImage) else open(path, "rb"))
    layout = npy_layout(handle, path)
    return ImageFile(path, "npy", checked_header(path, layout[0], layout[1]), handle, npy=layout)


def _tiff_file(path: Source, stack: contextlib.ExitStack) -> ImageFile:
    """Axes ``YX``, ``YXS`` (interleaved) or ``?YX`` (planar: ``CYX``, ``SYX``, pages as bands)."""
    import tifffile

    handle = stack.enter_context(tifffile.TiffFile(opened(path)))
    series = handle.series[0]
    if series.dtype is None:
        raise InvalidHeaderError(f"cannot read {path} as a TIFF: its first image has no pixel type")
    shape, axes = tuple(series.shape), series.axes
    planar = len(shape) == 3 and axes[-2:] == "YX"
    if not (len(shape) == 2 or planar or len(shape) == 3 and axes[:2] == "YX"):
        raise InvalidHeaderError(f"cannot read {path} as one image: its axes are {axes!r}, shape {shape}")
    header = checked_header(path, (*shape[1:], shape[0]) if planar else shape, np.dtype(series.dtype))
    return ImageFile(path, "tiff", header, handle, tiff_axes=axes)


def _pil_file(path: Source, stack: contextlib.ExitStack) -> ImageFile:
    handle = stack.enter_context(open_pil(path))
    if isinstance(path, EncodedImage):
        handle.filename = path.name  # errors name the sample
    channels, dtype = PIL_MODES.get(handle.mode, (3, "uint8"))
    width, height = handle.size
    return ImageFile(path, "pil", checked_header(path, (height, width, channels), np.dtype(dtype)), handle)
