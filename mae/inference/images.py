"""One image file as a trained model's input: the files a command was given, each read, resized,
centre-cropped and normalised as the model's training data was (``load_image``), and what reading one
file may raise (``IMAGE_ERRORS``: a command names the file and goes on with the others)."""

import os
from pathlib import Path

import torch
from PIL import Image

from mae.data import DEFAULT_MAX_PIXELS
from mae.data.decoding.formats import READERS
from mae.data.decoding.image import pixel_format, read_image
from mae.data.decoding.units import chw_tensor
from mae.data.views.arrays import ArrayView
from mae.errors import InputError, MissingFileError
from mae.inference.normalization import Normalization

IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)  # what load_image raises


def image_paths(sources: list[str | os.PathLike]) -> list[Path]:
    """Files given, and the image files (sorted) inside folders given."""
    paths = []
    for source in map(Path, sources):
        if source.is_dir():
            paths += sorted(p for p in source.rglob("*") if p.suffix.lower() in READERS)
        else:
            paths.append(source)
    return paths


def load_image(
    path: str | os.PathLike,
    size: tuple[int, int],
    norm: Normalization,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> torch.Tensor:
    """(C, H, W) model input of one image file: resized (short side) and centre-cropped to ``size``,
    scaled and normalised as training did (8-bit images as RGB for 3-channel models). The file is
    refused before it is decoded (or resized) when it is over ``max_pixels``: its pixels, its bands'
    memory, or its resized view (``mae.data.decoding.limits``).

    Raises:
        OSError, ValueError, PIL.Image.DecompressionBombError: naming the file, and nothing else:
            whatever reading this one file raises otherwise (``MemoryError``, ``IndexError``, ...) is a
            ``ValueError`` naming it, so a command skips the file and goes on with the others.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path} does not exist")
    try:
        view = ArrayView(
            "eval", size, norm.in_chans, norm.mean, norm.std, crop_ratio=1.0, max_pixels=max_pixels
        )
        pixels = chw_tensor(read_image(path, norm.in_chans, max_pixels, view.eval_short_side))
        return view.view(pixels)
    except IMAGE_ERRORS:
        raise
    except Exception as err:  # one file's problem (MemoryError, IndexError, ...), never the command's
        raise InputError(f"cannot read {path}: {type(err).__name__}: {err}") from err


def display_range(paths: list[str | os.PathLike]) -> tuple[float, float] | None:
    """(0, 1) for 8/16-bit images (their scaled range), None (each figure's own minimum to maximum)
    when any image holds float data in its own units."""
    return None if any(pixel_format(path).dtype.startswith("float") for path in paths) else (0.0, 1.0)
