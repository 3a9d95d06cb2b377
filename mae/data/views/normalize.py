"""Normalisation: the data's per-channel mean and std (ImageNet's for RGB by default), checked once
where they enter, and applied to every batch in one place (``ImageDataModule.normalize``)."""

import functools
import math
from collections.abc import Sequence

import torch
from timm.data import IMAGENET_DEFAULT_MEAN as IMAGENET_MEAN
from timm.data import IMAGENET_DEFAULT_STD as IMAGENET_STD

from mae.errors import ConfigError


def normalization(
    in_chans: int, mean: list[float] | None, std: list[float] | None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel: as given, or ImageNet's for 3 channels.

    Raises:
        ValueError: a channel count below 1, missing statistics for other channel counts, lengths
            that differ from ``in_chans``, or a non-positive std, naming the keys.
    """
    if in_chans < 1:
        raise ConfigError(f"data.in_chans must be >= 1, got {in_chans}")
    if mean is None and std is None and in_chans == 3:
        return tuple(IMAGENET_MEAN), tuple(IMAGENET_STD)
    if mean is None or std is None:
        raise ConfigError(
            f"data.mean and data.std are needed for {in_chans}-channel data (ImageNet's are for RGB): "
            f"compute them with `mae stats ROOT --in-chans {in_chans}` and paste the lines it prints"
        )
    if len(mean) != in_chans or len(std) != in_chans:
        raise ConfigError(
            f"data.mean and data.std need {in_chans} values (data.in_chans), got {len(mean)} and {len(std)}"
        )
    check_statistics(mean, std)
    return tuple(float(m) for m in mean), tuple(float(v) for v in std)


def check_statistics(
    mean: Sequence[float], std: Sequence[float], names: str = "data.mean / data.std"
) -> None:
    """Raises ValueError, naming ``names``, for a mean that is not finite or a std that is not finite
    and positive: images divided by them would be NaN or infinite, and so would the loss."""
    if not all(math.isfinite(v) for v in mean) or not all(math.isfinite(v) and v > 0 for v in std):
        raise ConfigError(
            f"{names} need finite means and positive, finite standard deviations; got mean {list(mean)}, "
            f"std {list(std)}"
        )


def normalize_batch(
    imgs: torch.Tensor, mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD
) -> torch.Tensor:
    """uint8 (N, C, H, W) in [0, 255] -> float normalised by ``mean`` / ``std`` (per channel, in [0, 1]
    units; ImageNet's by default), in the input's memory format; float batches pass unchanged."""
    if imgs.dtype != torch.uint8:
        return imgs
    N, C, H, W = imgs.shape
    pixels = imgs.permute(0, 2, 3, 1)
    if pixels.is_contiguous() and not imgs.is_contiguous():  # channels last (``collate_images``)
        # Per-channel constants broadcast along rows of W * C values, so the loop vectorises (a
        # size-C innermost broadcast runs about 5x slower).
        mean, inv_std = _normalization_constants(imgs.device, tuple(mean), tuple(std), W)
        rows = pixels.reshape(N * H, W * C).float().sub_(mean).mul_(inv_std)
        return rows.view(N, H, W, C).permute(0, 3, 1, 2)
    mean, inv_std = _normalization_constants(imgs.device, tuple(mean), tuple(std))
    return imgs.float().sub_(mean).mul_(inv_std)  # one new tensor, two in-place passes


@functools.cache
def _normalization_constants(
    device: torch.device, mean: tuple[float, ...], std: tuple[float, ...], row_width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and 1/std in 0-255 units, made once per device (no copy to it every step): (1, C, 1, 1),
    or repeated along a channels-last row of ``row_width`` pixels, (row_width * C,)."""
    mean = torch.tensor(mean, device=device) * 255
    inv_std = 1 / (torch.tensor(std, device=device) * 255)
    if row_width is None:
        return mean.view(1, -1, 1, 1), inv_std.view(1, -1, 1, 1)
    return mean.repeat(row_width), inv_std.repeat(row_width)
