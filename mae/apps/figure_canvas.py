"""Figures of image panels in rows, as PIL images (the reconstruction and anomaly figures): a grid of
panels enlarged to a picture (``enlarged``), and a white canvas with the picture, a header above each column
of panels, room for row labels on its left and for text below (``headed_canvas``)."""

import numpy as np
import torch
from PIL import Image, ImageDraw


def enlarged(grid: torch.Tensor, panel_size: tuple[int, int], min_panel: int) -> Image.Image:
    """(3, H', W') grid in [0, 1] -> an RGB picture, enlarged (nearest neighbour) by the smallest whole
    factor that makes a panel of ``panel_size`` (h, w) pixels at least ``min_panel`` pixels on its short
    side."""
    scale = max(1, -(-min_panel // min(panel_size)))
    picture = Image.fromarray((grid.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    return picture.resize((picture.width * scale, picture.height * scale), Image.NEAREST)


def headed_canvas(
    picture: Image.Image,
    headers: list[str] | tuple[str, ...],
    label_width: int,
    line: int,
    below: int,
    margin: int,
) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    """A white canvas: ``label_width`` pixels for row labels on the left, a ``line``-pixel row with each
    column's header (``headers``: one per panel of a row, ``margin`` pixels into it), ``picture`` and
    ``below`` pixels under it; and the canvas's drawing context, to write the labels."""
    canvas = Image.new("RGB", (label_width + picture.width, line + picture.height + below), "white")
    canvas.paste(picture, (label_width, line))
    draw = ImageDraw.Draw(canvas)
    panel = picture.width / len(headers)
    for i, header in enumerate(headers):
        draw.text((label_width + i * panel + margin, 2), header, fill="black")
    return canvas, draw
