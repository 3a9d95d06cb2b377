"""Reconstructions of your own images as one captioned picture (``mae reconstruct``): each
image masked, rebuilt and drawn with its masked-patch loss, the attention maps when asked, and an honest
caption."""

from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torchvision.utils import make_grid

from mae.apps.figure_canvas import enlarged, headed_canvas
from mae.inference.attention import attention_caption, attention_panels, cls_attention_maps
from mae.inference.normalization import Normalization
from mae.inference.reconstruction import Unnormalize, caption_of, mask_noise, reconstruct, reconstruction_grid
from mae.models.mae import MaskedAutoencoderViT


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
    ``mae.inference.attention``), the image's name and masked-patch loss beside it, the caption below.

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
    picture = enlarged(grid, (height, width), min_panel)
    losses = views["loss"].tolist()
    return Figure(_labelled(picture, headers, names, losses, caption), losses, caption, maps)


def _labelled(
    picture: Image.Image, headers: tuple[str, ...], names: list[str], losses: list[float], caption: str
) -> Image.Image:
    """``picture`` (one row per image) with its column headers above (``headed_canvas``), each row's name
    and loss on its left and the caption wrapped below."""
    label_width, line = 220, 18
    lines = _wrap(caption, (label_width + picture.width) // 7)
    canvas, draw = headed_canvas(picture, headers, label_width, line, line * (len(lines) + 1), 6)
    row = picture.height / len(names)
    for i, (name, loss) in enumerate(zip(names, losses, strict=True)):
        draw.text((6, line + i * row + row / 2 - line), Path(name).name[:30], fill="black")
        draw.text((6, line + i * row + row / 2), f"masked-patch loss {loss:.4f}", fill="black")
    for i, text in enumerate(lines):
        draw.text((6, line + picture.height + 6 + i * line), text, fill="black")
    return canvas


def _wrap(text: str, width: int) -> list[str]:
    lines, current = [], ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    return lines + ([current] if current else [])
