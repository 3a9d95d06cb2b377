"""What an image file is by its name, decided once for every consumer (folder data, shards, statistics,
reconstructions): which file endings are images and which library decodes each (``READERS``), and a
file's bytes held in memory (``EncodedImage``). The first stop of every file's reading: its header
next (``headers``), then its path (``route``), the limits, the pixels (``rgb`` / ``arrays``) and their
units (``units``); ``image`` goes through them in that order.
"""

import io
from pathlib import Path
from typing import Literal

import torch

Reader = Literal["pil", "tiff", "npy"]
# Every file ending read as an image (torchvision ImageFolder's, in its order, then ours), and the library
# that decodes it: PIL (JPEG, 8/16-bit PNG, ...), tifffile (any band count and bit depth), numpy (``.npy``
# arrays stored (H, W) or (H, W, C)).
READERS: dict[str, Reader] = {
    ".jpg": "pil",
    ".jpeg": "pil",
    ".png": "pil",
    ".ppm": "pil",
    ".bmp": "pil",
    ".pgm": "pil",
    ".tif": "tiff",
    ".tiff": "tiff",
    ".webp": "pil",
    ".gif": "pil",
    ".npy": "npy",
}
# Endings that only the array path reads (PIL reads few TIFF layouts, and no .npy).
ARRAY_EXTENSIONS = tuple(ending for ending, reader in READERS.items() if reader != "pil")
# Not listed in dataset folders (torchvision's ImageFolder lists none either): a GIF is an animation
# or a palette icon more often than a photograph. Given by name (a reconstruction), it is read.
NOT_IN_DATASETS = (".gif",)


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
