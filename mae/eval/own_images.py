"""Reconstructions of your own images: read as the model's training read its data, masked, rebuilt,
and drawn with each image's masked-patch loss and an honest caption."""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from PIL import Image, ImageDraw
from torchvision.utils import make_grid

from mae.convert.backbone import load_mae
from mae.convert.sources import read_checkpoint
from mae.data import DEFAULT_MAX_PIXELS
from mae.data.decoding.arrays import chw_tensor, pixel_format
from mae.data.decoding.formats import READERS
from mae.data.decoding.image import read_image
from mae.data.views.arrays import ArrayView
from mae.data.views.normalize import check_statistics, normalization
from mae.eval.attention import attention_caption, attention_panels, cls_attention_maps
from mae.eval.visualize import reconstruct, reconstruction_grid
from mae.models.mae import MaskedAutoencoderViT
from mae.models.masking import check_mask_ratio, check_visible_patches, sample_noise

Unnormalize = Literal["patch", "none"]


@dataclass
class Normalization:
    """How the model's training data was normalised: ``in_chans`` channels, ``mean`` / ``std`` each."""

    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        check_statistics(self.mean, self.std, "the normalisation's mean / std")

    @classmethod
    def of(cls, data: dict | None, in_chans: int, source: str) -> "Normalization":
        """From a checkpoint's ``mae_data`` record; ImageNet's for 3-channel files without one.

        Raises:
            ValueError: a file of another channel count that does not record its statistics.
        """
        if data is not None:
            return cls(data["in_chans"], tuple(data["mean"]), tuple(data["std"]))
        if in_chans != 3:
            raise ValueError(f"{source} does not record its data's mean and std: pass --mean and --std")
        return cls(3, *normalization(3, None, None))  # the data modules' default for RGB: ImageNet's


def load_reconstructor(
    checkpoint: str | os.PathLike,
    format: str = "auto",
    img_size: int | None = None,
    mean: list[float] | None = None,
    std: list[float] | None = None,
) -> tuple[MaskedAutoencoderViT, Normalization]:
    """The MAE (encoder and decoder) of ``checkpoint`` (any format ``mae.load_mae`` reads; at input size
    ``img_size`` when given, else the checkpoint's), in evaluation mode, and how its inputs are
    normalised: ``mean`` / ``std`` when given, else as the checkpoint records (``Normalization.of``)."""
    ckpt = read_checkpoint(checkpoint, format)
    model, _ = load_mae(ckpt, **({"img_size": img_size} if img_size else {}))
    in_chans = model.config["in_chans"]
    if mean:
        return model.eval(), Normalization(in_chans, tuple(mean), tuple(std))
    return model.eval(), Normalization.of(ckpt.data, in_chans, str(checkpoint))


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
    path: str | os.PathLike, size: tuple[int, int], norm: Normalization, max_pixels: int | None = DEFAULT_MAX_PIXELS
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
        raise FileNotFoundError(f"{path} does not exist")
    try:
        array = read_image(path, norm.in_chans, max_pixels)
        pixels = chw_tensor(array)
        view = ArrayView("eval", size, norm.in_chans, norm.mean, norm.std, crop_ratio=1.0, max_pixels=max_pixels)
        return view.view(pixels, path)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise
    except Exception as err:  # one file's problem (MemoryError, IndexError, ...), never the command's
        raise ValueError(f"cannot read {path}: {type(err).__name__}: {err}") from err


def display_range(paths: list[str | os.PathLike]) -> tuple[float, float] | None:
    """(0, 1) for 8/16-bit images (their scaled range), None (each figure's own minimum to maximum)
    when any image holds float data in its own units."""
    return None if any(pixel_format(path).dtype.startswith("float") for path in paths) else (0.0, 1.0)


def caption_of(model: MaskedAutoencoderViT, unnormalize: Unnormalize) -> str:
    """What the reconstruction panels show, honestly."""
    if not model.norm_pix_loss:
        return "Pixel-target model: the reconstruction is its prediction as it is."
    if unnormalize == "patch":
        return (
            "norm_pix_loss model: it predicts each masked patch's normalised pattern only; the patches are drawn "
            "with the TRUE patches' mean and variance, which the model never saw, so the picture shows more than "
            "it knows (--unnormalize none: the raw prediction)."
        )
    return (
        "norm_pix_loss model, raw prediction: each masked patch's normalised pattern (zero mean, unit variance) "
        "drawn as a normalised image: what the model really predicts."
    )


def mask_noise(
    model: MaskedAutoencoderViT,
    count: int,
    mask_ratio: float,
    seed: int,
    same_mask: bool,
    strategy: str | None = None,
) -> torch.Tensor:
    """(count, L) masking scores drawn from ``seed`` with ``strategy`` ("random", "block", "grid";
    default: the model's): one mask repeated for every image with ``same_mask``.

    Raises:
        ValueError: a ratio the strategy cannot produce, or one that leaves no visible patch.
    """
    strategy = strategy or model.mask_strategy
    check_mask_ratio(mask_ratio, strategy)
    check_visible_patches(model.grid_size, mask_ratio)
    generator = torch.Generator().manual_seed(seed)
    noise = sample_noise(strategy, 1 if same_mask else count, model.grid_size, mask_ratio,
                         "cpu", generator)  # fmt: skip
    return noise.expand(count, -1).contiguous()


@dataclass
class Figure:
    image: Image.Image  # the captioned picture
    losses: list[float]  # each image's masked-patch loss
    caption: str
    attention: torch.Tensor | None = None  # (N, heads, H', W') cls attention maps, when drawn


@torch.no_grad()
def reconstruction_figure(
    model: MaskedAutoencoderViT,
    imgs: torch.Tensor,
    names: list[str],
    norm: Normalization,
    mask_ratio: float = 0.75,
    seed: int = 0,
    same_mask: bool = False,
    unnormalize: Unnormalize = "patch",
    bands: list[int] | None = None,
    min_panel: int = 160,
    strategy: str | None = None,
    value_range: tuple[float, float] | None = (0.0, 1.0),
    attention: bool = False,
) -> Figure:
    """One row per image: original | masked | reconstruction | reconstruction with the visible patches
    pasted back (| with ``attention``: the last block's cls attention, mean of the heads | each head,
    ``mae.eval.attention``), the image's name and masked-patch loss beside it, the caption below.

    ``imgs``: (N, C, H, W) normalised model input. The masks are drawn from ``seed`` with
    ``strategy`` (default: the model's; one mask for every row with ``same_mask``); panels are
    enlarged (nearest neighbour) to at least ``min_panel`` pixels. ``value_range``: the data values
    drawn black and white (``display_range``).
    """
    model.eval()
    noise = mask_noise(model, len(imgs), mask_ratio, seed, same_mask, strategy).to(imgs.device)
    views = reconstruct(model, imgs, mask_ratio, noise, unnormalize)
    grid = reconstruction_grid(views, norm.mean, norm.std, bands, value_range)
    height, width = imgs.shape[-2:]
    headers = ("original", "masked", "reconstruction", "+ visible patches")
    caption = caption_of(model, unnormalize)
    maps = None
    if attention:
        maps = cls_attention_maps(model, imgs).cpu()  # the encoder on every patch: no masking
        mean, heads = attention_panels(maps, (height, width))
        extra = make_grid(torch.stack([mean, heads], dim=1).flatten(0, 1), nrow=2, padding=2, pad_value=1.0)
        grid = torch.cat([grid, extra[:, :, 2:]], dim=2)  # its left border is the grid's right one
        headers += ("attention (mean)", "attention per head")
        caption = f"{caption} {attention_caption(maps.shape[1])}"
    scale = max(1, -(-min_panel // min(height, width)))
    picture = Image.fromarray((grid.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    picture = picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST)

    losses = views["loss"].tolist()
    label_width, line = 220, 18
    lines = _wrap(caption, (label_width + picture.width) // 7)
    canvas = Image.new("RGB", (label_width + picture.width, line + picture.height + line * (len(lines) + 1)), "white")
    canvas.paste(picture, (label_width, line))
    draw = ImageDraw.Draw(canvas)
    panel = picture.width / len(headers)
    for i, header in enumerate(headers):
        draw.text((label_width + i * panel + 6, 2), header, fill="black")
    row = picture.height / len(imgs)
    for i, (name, loss) in enumerate(zip(names, losses, strict=True)):
        draw.text((6, line + i * row + row / 2 - line), Path(name).name[:30], fill="black")
        draw.text((6, line + i * row + row / 2), f"masked-patch loss {loss:.4f}", fill="black")
    for i, text in enumerate(lines):
        draw.text((6, line + picture.height + 6 + i * line), text, fill="black")
    return Figure(canvas, losses, caption, maps)


def _wrap(text: str, width: int) -> list[str]:
    lines, current = [], ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    return lines + ([current] if current else [])
