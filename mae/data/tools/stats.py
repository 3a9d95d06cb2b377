"""Per-channel mean and std of an image folder, for ``data.mean`` / ``data.std``:
``mae stats ROOT [--in-chans C]``.

Streams the images one at a time (memory stays one image, bounded by the pixel limit), in the units
the data path normalises (``mae.data.decoding.arrays.to_unit_range``: 8/16-bit scaled to [0, 1], float as
stored). Files the data path would skip (unreadable, over the limit, NaN or no-data fills) are
skipped and listed, so they do not move the statistics.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from mae.data.decoding.formats import dataset_extensions
from mae.data.decoding.image import read_pixels
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.sources.layout import has_extension, walk_once
from mae.errors import InputError, MissingFileError

_ROWS_PER_SUM = 1 << 20  # pixels summed in float64 at a time: the float64 copy stays small


@dataclass
class ChannelStats:
    mean: list[float]
    std: list[float]
    images: int
    pixels: int  # per channel
    skipped: list[str]

    def yaml(self) -> str:
        """The lines to paste into a config."""
        values = lambda xs: "[" + ", ".join(f"{x:.6g}" for x in xs) + "]"  # noqa: E731
        return (
            f"data:\n  init_args:\n    in_chans: {len(self.mean)}\n    mean: {values(self.mean)}\n"
            f"    std: {values(self.std)}\n"
        )


def image_files(root: str | Path) -> list[str]:
    """Every image file below ``root/train`` (or ``root`` when it has no ``train`` folder), sorted."""
    top = Path(root) / "train" if (Path(root) / "train").is_dir() else Path(root)
    if not top.is_dir():
        raise MissingFileError(f"{root} is not a folder of images")
    folders, _ = walk_once(str(top), set())
    extensions = dataset_extensions(arrays=True)
    return sorted(os.path.join(d, f) for d, files in folders for f in files if has_extension(f, extensions))


def channel_stats(
    root: str | Path,
    in_chans: int | None = None,
    max_images: int | None = None,
    progress: bool = True,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> ChannelStats:
    """Mean and std per channel over every pixel of the folder's images (``max_images`` evenly spread
    ones when set). ``in_chans`` defaults to the first image's channel count; files the data path
    skips (unreadable, over ``max_pixels`` as ``data.max_image_pixels``, NaN or no-data fills) are
    skipped and listed.

    Raises:
        ValueError: no readable image, naming the folder.
    """
    files = image_files(root)
    if max_images is not None and len(files) > max_images:
        files = [files[round(i)] for i in np.linspace(0, len(files) - 1, max_images)]
    total = total_sq = None
    count, images, skipped = 0, 0, []
    for path in tqdm(files, desc="images", unit="img", disable=not progress):
        try:
            array = read_pixels(path, in_chans, max_pixels=max_pixels)  # in_chans: the first readable image's
            channels = array.shape[2]
            pixels = array.reshape(-1, channels)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            skipped.append(f"{path} ({err})")
            continue
        in_chans = channels
        if total is None:
            total, total_sq = np.zeros(in_chans), np.zeros(in_chans)
        for start in range(0, len(pixels), _ROWS_PER_SUM):
            block = pixels[start : start + _ROWS_PER_SUM].astype(np.float64)
            total += block.sum(0)
            total_sq += (block * block).sum(0)
        count += len(pixels)
        images += 1
    if images == 0:
        raise InputError(f"no readable image in {root} ({len(skipped)} skipped)")
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - mean**2, 0.0))
    return ChannelStats(mean.tolist(), std.tolist(), images, count, skipped)
