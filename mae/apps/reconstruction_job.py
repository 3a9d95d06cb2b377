"""``mae reconstruct``'s whole job: its output checked before any work, the model of a checkpoint and how
its inputs are normalised (``mae.inference.reconstruction.load_reconstructor``), every readable image of the
files and folders given (each unreadable one named on stderr), their figure
(``mae.apps.reconstruction_figure``) written as a PNG, and each image's masked-patch loss printed."""

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from mae.apps.reconstruction_figure import Figure, reconstruction_figure
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError, UsageError
from mae.inference.images import IMAGE_ERRORS, display_range, image_paths, load_image
from mae.inference.normalization import Normalization
from mae.inference.reconstruction import Unnormalize, load_reconstructor
from mae.io.atomic import atomic_write
from mae.io.outputs import Output, check_outputs, png_info, png_is_from

OWNER = "mae.reconstruct"  # the command whose figures ``--out`` may replace (``mae.io.outputs``)


@dataclass(frozen=True)
class ReconstructionSettings:
    """What ``mae reconstruct`` draws: ``images`` (files or folders) masked with ``mask_ratio`` of the
    patches hidden (masks drawn from ``seed`` with ``mask_strategy``, default the checkpoint's; one for
    every image with ``same_mask``) and reconstructed by the MAE of ``checkpoint``, drawn to the PNG ``out``.

    ``unnormalize``: how a ``norm_pix_loss`` model's patches are drawn ("patch" or "none"); ``img_size``,
    ``mean`` / ``std``: the checkpoint's when None; ``bands``: the three channels drawn as RGB;
    ``attention``: add the last block's cls attention to each row."""

    images: list[str]
    checkpoint: str | Path
    out: Path = Path("reconstruction.png")
    checkpoint_format: str = "auto"
    mask_ratio: float = 0.75
    mask_strategy: str | None = None
    seed: int = 0
    same_mask: bool = False
    unnormalize: Unnormalize = "patch"
    img_size: int | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    bands: list[int] | None = None
    max_image_pixels: int | None = DEFAULT_MAX_PIXELS
    attention: bool = False


def reconstruct_files(settings: ReconstructionSettings) -> Figure:
    """Draw the figure of the readable images, write it and print each image's masked-patch loss.

    Raises:
        UsageError: a mask ratio outside (0, 1), or statistics of another channel count than the model's.
        ConfigError: no image could be read.
        OutputError: ``out`` is a file this command did not write (``mae.io.outputs``).
    """
    if not 0 < settings.mask_ratio < 1:  # NaN fails this too
        raise UsageError(
            f"--mask-ratio must be in (0, 1), the fraction of patches hidden; got {settings.mask_ratio}"
            + (" (0 hides nothing: there is nothing to reconstruct)" if settings.mask_ratio == 0 else "")
        )
    inputs = [*settings.images, settings.checkpoint]
    check_outputs(OWNER, [Output(settings.out, "--out", ours=png_is_from(OWNER))], inputs)
    model, norm = load_reconstructor(
        settings.checkpoint, settings.checkpoint_format, settings.img_size, settings.mean, settings.std
    )
    if len(norm.mean) != model.config["in_chans"]:
        raise UsageError(
            f"--mean and --std need {model.config['in_chans']} values, one per channel of the model"
        )
    imgs, names = read_images(
        settings.images, tuple(model.config["img_size"]), norm, settings.max_image_pixels
    )
    figure = reconstruction_figure(
        model,
        imgs,
        names,
        norm,
        settings.mask_ratio,
        settings.seed,
        settings.same_mask,
        settings.unnormalize,
        settings.bands,
        strategy=settings.mask_strategy,
        value_range=display_range(names),
        attention=settings.attention,
    )
    atomic_write(settings.out, lambda tmp: figure.image.save(tmp, format="PNG", pnginfo=png_info(OWNER)))
    for name, loss in zip(names, figure.losses, strict=True):
        print(f"{name}: masked-patch loss {loss:.4f}")
    print(f"note: {figure.caption}\nwrote {settings.out}")
    return figure


def read_images(
    sources: list[str], size: tuple[int, int], norm: Normalization, max_pixels: int | None
) -> tuple[torch.Tensor, list[str]]:
    """The (N, C, H, W) model input of every readable image of ``sources`` (files, folders) and their names;
    each unreadable one is named on stderr, with why.

    Raises:
        ConfigError: none could be read.
    """
    images, names = [], []
    for path in image_paths(sources):
        try:
            images.append(load_image(path, size, norm, max_pixels))
            names.append(str(path))
        except IMAGE_ERRORS as err:
            print(f"skipped {path}: {err}", file=sys.stderr)
    if not images:
        raise ConfigError(
            f"no readable image among {', '.join(map(str, sources))} (each skipped one is named above, with "
            "why): give image files, or folders of them, that the skips do not name"
        )
    return torch.stack(images), names
