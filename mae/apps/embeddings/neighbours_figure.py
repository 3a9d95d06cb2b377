"""Pictures of search results: one row per query, the query then its neighbours best first, each with its
cosine similarity, name and label; every image drawn as the model saw it (resized and centre-cropped,
in the data's display range), as the reconstruction figures draw theirs
(``mae.apps.reconstruction_figure``)."""

import textwrap
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mae.apps.embeddings.embedder import Embedder
from mae.apps.embeddings.image_search import Match
from mae.inference.images import IMAGE_ERRORS, display_range
from mae.inference.reconstruction import denormalize, to_display

MIN_PANEL = 128  # pixels: panels are enlarged (nearest neighbour) to at least this
LINE = 14  # pixels per line of text


def picture(
    path: str | Path, embedder: Embedder, value_range: tuple[float, float] | None, side: int
) -> Image.Image:
    """The image at ``path`` as ``embedder`` sees it, enlarged by a whole factor (nearest neighbour) to
    at most ``side`` pixels; a grey square saying so when it cannot be read (e.g. moved since it was
    indexed)."""
    try:
        img = embedder.load(path)[None]  # (1, C, H, W)
    except IMAGE_ERRORS:
        blank = Image.new("RGB", (side, side), (200, 200, 200))
        ImageDraw.Draw(blank).text((6, side // 2 - LINE), "cannot be read", fill="black")
        return blank
    data = denormalize(img.float(), embedder.norm.mean, embedder.norm.std)
    if value_range is None:  # float data in its own units: this image's minimum to maximum
        value_range = (data.min().item(), data.max().item())
    pixels = to_display(data, None, value_range)[0].permute(1, 2, 0).numpy()
    shown = Image.fromarray((pixels * 255).round().astype(np.uint8))
    scale = max(1, side // max(shown.size))
    return shown.resize((shown.width * scale, shown.height * scale), Image.NEAREST)


def shown_range(paths: list[str]) -> tuple[float, float] | None:
    """``display_range`` of the readable ones among ``paths``."""
    readable = [path for path in paths if Path(path).is_file()]
    try:
        return display_range(readable)
    except IMAGE_ERRORS:
        return None


def neighbours_figure(
    matches: list[Match], embedder: Embedder, caption: str, min_panel: int = MIN_PANEL
) -> Image.Image:
    """One row per query: the query, then its neighbours with "#rank score", file name and label below
    each; ``caption`` under the rows."""
    paths = [p for match in matches for p in (match.query, *(n.path for n in match.neighbours))]
    value_range = shown_range(paths)
    side = max(min_panel, *embedder.img_size)
    columns = 1 + max(len(match.neighbours) for match in matches)
    cell_w, cell_h, gap = side + 8, LINE + side + 2 * LINE + 8, 12
    width = columns * cell_w + gap
    lines = textwrap.wrap(caption, width // 7)
    canvas = Image.new("RGB", (width, len(matches) * cell_h + LINE * (len(lines) + 1)), "white")
    draw = ImageDraw.Draw(canvas)
    for row, match in enumerate(matches):
        top = row * cell_h
        cells = [("query", match.query, None)] + [
            (f"#{rank} {n.score:.3f}", n.path, n.label) for rank, n in enumerate(match.neighbours, start=1)
        ]
        for column, (title, path, label) in enumerate(cells):
            left = column * cell_w + (gap if column else 0)  # a gap between the query and its neighbours
            image = picture(path, embedder, value_range, side)
            canvas.paste(image, (left, top + LINE))
            draw.text((left, top + 1), title, fill="black")
            draw.text((left, top + LINE + side + 2), Path(path).name[: side // 7], fill="black")
            if label is not None:
                draw.text((left, top + 2 * LINE + side + 2), f"label {label}"[: side // 7], fill="black")
    for i, text in enumerate(lines):
        draw.text((6, len(matches) * cell_h + 4 + i * LINE), text, fill="black")
    return canvas
