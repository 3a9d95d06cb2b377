"""What an image file is, decided once for every consumer (folder data, shards, statistics,
reconstructions): which file endings are images and which library decodes each (``READERS``), a
file's bytes held in memory (``EncodedImage``), what its pixels are (``PixelFormat``), and the one
rule that sends data down the 8-bit RGB path or the array path (``reads_as_rgb``).
"""

import contextlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import torch
from PIL import Image, UnidentifiedImageError

Reader = Literal["pil", "tiff", "npy"]
# Every file ending read as an image (torchvision ImageFolder's, in its order, then ours), and the library that
# decodes it: PIL (JPEG, 8/16-bit PNG, ...), tifffile (any band count and bit depth), numpy (``.npy`` arrays
# stored (H, W) or (H, W, C)).
READERS: dict[str, Reader] = {
    ".jpg": "pil", ".jpeg": "pil", ".png": "pil", ".ppm": "pil", ".bmp": "pil", ".pgm": "pil", ".tif": "tiff",
    ".tiff": "tiff", ".webp": "pil", ".gif": "pil", ".npy": "npy",
}  # fmt: skip
# Endings that only the array path reads (PIL reads few TIFF layouts, and no .npy).
ARRAY_EXTENSIONS = tuple(ending for ending, reader in READERS.items() if reader != "pil")
# Not listed in dataset folders (torchvision's ImageFolder lists none either): a GIF is an animation
# or a palette icon more often than a photograph. Given by name (a reconstruction), it is read.
NOT_IN_DATASETS = (".gif",)
RGB_DTYPE = "uint8"  # the only pixel type the RGB path reads without losing values


def dataset_extensions(arrays: bool) -> tuple[str, ...]:
    """The file endings listed in a dataset folder: ``.npy`` only when the data is read as arrays."""
    return tuple(e for e in READERS if e not in NOT_IN_DATASETS and (arrays or e != ".npy"))


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


def suffix_of(source: Source) -> str:
    """The file ending of a path or a sample's name, lower case."""
    return Path(source.name if isinstance(source, EncodedImage) else source).suffix.lower()


def reader_of(source: Source) -> Reader:
    """The library that decodes ``source`` (``READERS``; PIL for endings it does not list)."""
    return READERS.get(suffix_of(source), "pil")


def is_array_file(source: Source) -> bool:
    """Whether only the array path reads ``source`` (TIFF, ``.npy``)."""
    return reader_of(source) != "pil"


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


@dataclass(frozen=True)
class PixelFormat:
    """What a file's pixels are, from its header (``mae.data.decoding.arrays.pixel_format``): the
    channels and stored dtype the array path returns, and whether the file is one only the array
    path reads."""

    channels: int
    dtype: str
    array_file: bool = False

    @property
    def kind(self) -> tuple[int, str]:
        """(channels, dtype name): what every file of array-path data must share (recorded in shards)."""
        return self.channels, self.dtype

    @property
    def rgb_readable(self) -> bool:
        """8-bit pixels in a file PIL reads: the RGB path converts them without loss."""
        return self.dtype == RGB_DTYPE and not self.array_file


def reads_as_rgb(in_chans: int, rgb_readable: bool) -> bool:
    """The one rule for how data is read: 8-bit files PIL reads (RGB, grayscale, palette, RGBA,
    CMYK: converted to RGB) take the 8-bit RGB path for a 3-channel model; any other channel count,
    16-bit, float, TIFF and ``.npy`` data the array path, which keeps bit depth and bands.

    ``rgb_readable``: whether every file of the data is ``PixelFormat.rgb_readable``."""
    return in_chans == 3 and rgb_readable
