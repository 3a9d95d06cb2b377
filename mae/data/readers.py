"""Reading images of any channel count and bit depth as arrays: 8- and 16-bit PNG (and any format
PIL reads), TIFF (grayscale, RGB, multi-band; 8/16-bit, float) through ``tifffile``, and ``.npy``
arrays stored (H, W, C).

Every read starts from the file's header (``read_header``): its dimensions and pixel type are
checked, and its size against the pixel limit (``check_decoded_size``), before any pixel is read, so
one file can neither crash a run nor ask for more memory than the limit allows. Whatever a reader
library raises for one file is that file's error: ``OSError``, ``ValueError`` or
``PIL.Image.DecompressionBombError`` naming it, which every consumer skips by name.

Values are scaled by their type's range to [0, 1] (uint8 / 255, uint16 / 65535); float data is
kept in its own units (the data's ``mean`` / ``std`` normalise it).
"""

import contextlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

ARRAY_EXTENSIONS = (".npy", ".tif", ".tiff")
# PIL's own default limit (about 89.5 megapixels), above which an image is treated as a decompression bomb.
DEFAULT_MAX_PIXELS = 89_478_485
# Memory an image may take per pixel of the limit: three float32 values (an RGB image at the limit, as
# ``to_unit_range`` makes it). Multi-band and 64-bit images are bounded by their bytes, not only pixels.
BYTES_PER_LIMIT_PIXEL = 3 * 4
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


def _suffix(path: Source) -> str:
    return Path(path.name if isinstance(path, EncodedImage) else path).suffix.lower()


def _file(path: Source) -> "str | os.PathLike | BinaryIO":
    """What a reader library opens: the path, or a file object over the bytes."""
    return path.file() if isinstance(path, EncodedImage) else path


def _kind(path: Source) -> str:
    """The format's name for messages."""
    suffix = _suffix(path)
    return "an .npy array" if suffix == ".npy" else "a TIFF" if suffix in (".tif", ".tiff") else "an image"


def open_pil(path: Source) -> Image.Image:
    """``Image.open`` of a file or a sample's bytes; an unidentifiable one names the file or sample."""
    try:
        return Image.open(_file(path))
    except UnidentifiedImageError as err:
        raise UnidentifiedImageError(f"cannot identify image file {path}") from err


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

    with tifffile.TiffFile(_file(path)) as tif:
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
    with _unlimited_pil():  # asking the size of a huge image is not decoding it
        with open_pil(path) as img:
            channels, dtype = _PIL_MODES.get(img.mode, (3, "uint8"))
            width, height = img.size
    return _checked_header(path, (height, width, channels), np.dtype(dtype))


@contextlib.contextmanager
def _unlimited_pil() -> Iterator[None]:
    """PIL's own decompression-bomb check off: the callers check ``max_pixels`` themselves."""
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        yield
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def read_header(path: Source) -> ImageHeader:
    """The (H, W, C) and dtype ``read_array`` will return for an image file, from its header only.

    Raises:
        OSError, ValueError: naming the file: unreadable, truncated (``.npy``), not one 2-D image
            (a 0-d, empty or 4-D array, negative dimensions), or pixels that are not numbers.
    """
    with _reading(path):
        suffix = _suffix(path)
        if suffix == ".npy":
            return _npy_header(path)
        if suffix in (".tif", ".tiff"):
            return _tiff_header(path)
        return _pil_header(path)


def probe(path: Source) -> tuple[int, str]:
    """(channels, dtype name) of an image file, read from its header only (``read_header``)."""
    header = read_header(path)
    return header.channels, header.dtype.name


def header_size(path: Source) -> tuple[int, int]:
    """(width, height) of an image file, from its header only (``read_header``)."""
    header = read_header(path)
    return header.width, header.height


def check_pixel_count(path: Source, width: int, height: int, max_pixels: int | None) -> None:
    """Raises ``PIL.Image.DecompressionBombError`` when ``width x height`` exceeds ``max_pixels``."""
    if max_pixels is not None and width * height > max_pixels:
        raise Image.DecompressionBombError(
            f"image {path} is {width}x{height} = {width * height:,} pixels, over data.max_image_pixels="
            f"{max_pixels:,} (--max-image-pixels of the commands; a decompression bomb, or a huge scan: raise "
            f"the limit if it is genuine)"
        )


def check_decoded_size(path: Source, header: ImageHeader, max_pixels: int | None) -> None:
    """Refuse, before decoding, an image over ``max_pixels`` pixels, or one whose float32 pixels (or
    stored ones, when wider) take more than ``BYTES_PER_LIMIT_PIXEL`` bytes per pixel of the limit
    (many bands, 64-bit values).

    Raises:
        PIL.Image.DecompressionBombError: naming the file, its size and the limit's option.
    """
    check_pixel_count(path, header.width, header.height, max_pixels)
    if max_pixels is None:
        return
    needed = header.height * header.width * header.channels * max(header.dtype.itemsize, 4)
    allowed = max_pixels * BYTES_PER_LIMIT_PIXEL
    if needed > allowed:
        raise Image.DecompressionBombError(
            f"image {path} is {header.width}x{header.height} with {header.channels} band(s) of {header.dtype}: "
            f"{needed / 2**30:.2f} GiB decoded, over the {allowed / 2**30:.2f} GiB that data.max_image_pixels="
            f"{max_pixels:,} allows (--max-image-pixels of the commands; {BYTES_PER_LIMIT_PIXEL} bytes per pixel "
            f"of the limit): raise the limit if it is genuine"
        )


def resized_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """(H, W) of an image whose short side is resized to ``short_side`` and long side in proportion
    (rounded down), as ``torchvision.transforms.Resize(short_side)`` sizes it."""
    if height <= width:
        return short_side, int(short_side * width / height)
    return int(short_side * height / width), short_side


def check_view_size(path: Source, height: int, width: int, channels: int, short_side: int,
                    max_pixels: int | None) -> None:  # fmt: skip
    """Refuse an image whose view resized to ``short_side`` (the evaluation view) would be over the
    limit (``check_decoded_size``): a 1 x 1,000,000 image at short side 32 is 32 x 32,000,000.

    Raises:
        PIL.Image.DecompressionBombError: naming the file, the view's size and the limit's option.
    """
    if max_pixels is None:
        return
    view_h, view_w = resized_size(height, width, short_side)
    needed = view_h * view_w * channels * 4
    if view_h * view_w > max_pixels or needed > max_pixels * BYTES_PER_LIMIT_PIXEL:
        raise Image.DecompressionBombError(
            f"image {path} is {width}x{height}: resized to short side {short_side} for the evaluation view it "
            f"would be {view_w}x{view_h} = {view_w * view_h:,} pixels ({needed / 2**30:.2f} GiB), over what "
            f"data.max_image_pixels={max_pixels:,} allows (--max-image-pixels of the commands); crop such an "
            f"elongated image, or raise the limit"
        )


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
        suffix = _suffix(path)
        if suffix == ".npy":
            array = _read_npy(path)
        elif suffix in (".tif", ".tiff"):
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

    with tifffile.TiffFile(_file(path)) as tif:
        axes = tif.series[0].axes
        array = tif.asarray()  # the first series, as read_header described it
    if array.ndim == 2:
        return array[:, :, None]
    return np.moveaxis(array, 0, -1) if axes[-2:] == "YX" else array


def _read_pil(path: Source) -> np.ndarray:
    with _unlimited_pil(), open_pil(path) as img:
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


def adapt_channels(array: np.ndarray, in_chans: int, path: Source) -> np.ndarray:
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
