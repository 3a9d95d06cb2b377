"""Heat-map figures: one row per test image, image | heat map | heat map over the image | ground truth |
predicted defect mask, the image's name, score and decision beside it; one colour scale for every image, so
that colours compare."""

import torch
from PIL import Image
from torchvision.utils import make_grid

from mae.apps.figure_canvas import enlarged, headed_canvas
from mae.inference.normalization import Normalization
from mae.inference.reconstruction import denormalize, to_display

HEADERS = ("image", "heat map", "overlay")
OVERLAY_OPACITY = 0.6  # of the hottest colour over the image


def hot(values: torch.Tensor) -> torch.Tensor:
    """(...,) in [0, 1] -> (..., 3) RGB in [0, 1]: black, red, yellow, white (the "hot" colour map)."""
    return torch.stack([(3 * values - k).clamp(0, 1) for k in range(3)], dim=-1)


def color_range(maps: torch.Tensor) -> tuple[float, float]:
    """(low, high) of the colour scale: 0 to the 99.5th percentile of every map's values (drawn white),
    so that one bright outlier does not turn every other defect black."""
    high = torch.quantile(maps.flatten().float()[:: max(1, maps.numel() // 1_000_000)], 0.995).item()
    return 0.0, max(high, 1e-12)


def heat_map_figure(
    imgs: torch.Tensor,
    maps: torch.Tensor,
    names: list[str],
    scores: list[float],
    norm: Normalization,
    colors: tuple[float, float],
    truth: torch.Tensor | None = None,
    value_range: tuple[float, float] | None = (0.0, 1.0),
    min_panel: int = 96,
    predicted: torch.Tensor | None = None,
    anomalous: list[bool] | None = None,
) -> Image.Image:
    """The figure of N test images.

    Args:
        imgs: (N, C, H, W) normalised model input.
        maps: (N, H, W) heat maps.
        names, scores: each image's name and score, written beside its row.
        norm: the model's normalisation (to draw the images in their own units).
        colors: (low, high) map values drawn black and white (``color_range``).
        truth: (N, H, W) bool ground truth: a fourth panel when given.
        value_range: image values drawn black and white (``mae.inference.images.display_range``).
        min_panel: panels are enlarged (nearest neighbour) to at least this many pixels.
        predicted: (N, H, W) bool predicted defect masks: a last panel when given.
        anomalous: each image's decision, written under its score ("ANOMALOUS" / "normal") when given.
    """
    shown = to_display(
        denormalize(imgs.float().cpu(), norm.mean, norm.std),
        value_range=value_range or _own_range(imgs, norm),
    )
    low, high = colors
    heat = ((maps.float().cpu() - low) / (high - low)).clamp(0, 1)
    colour = hot(heat).permute(0, 3, 1, 2)  # (N, 3, H, W)
    opacity = OVERLAY_OPACITY * heat[:, None]
    panels = [shown, colour, shown * (1 - opacity) + colour * opacity]
    headers = list(HEADERS)
    for header, masks in (("ground truth", truth), ("predicted", predicted)):
        if masks is not None:
            panels.append(masks[:, None].float().cpu().expand(-1, 3, -1, -1))
            headers.append(header)
    grid = make_grid(torch.stack(panels, dim=1).flatten(0, 1), nrow=len(panels), padding=2, pad_value=1.0)
    picture = enlarged(grid, tuple(imgs.shape[-2:]), min_panel)
    label_width, line = 200, 16
    canvas, draw = headed_canvas(picture, headers, label_width, line, below=2 * line, margin=4)
    row = picture.height / len(imgs)
    for i, (name, score) in enumerate(zip(names, scores, strict=True)):
        draw.text((4, line + i * row + row / 2 - line), name[-32:], fill="black")
        draw.text((4, line + i * row + row / 2), f"score {score:.4g}", fill="black")
        if anomalous is not None:
            mark, colour_name = ("ANOMALOUS", "red") if anomalous[i] else ("normal", "black")
            draw.text((4, line + i * row + row / 2 + line), mark, fill=colour_name)
    caption = f"colour scale: {low:.3g} (black) to {high:.3g} (white), the same for every row"
    draw.text((4, line + picture.height + 4), caption, fill="black")
    return canvas


def _own_range(imgs: torch.Tensor, norm: Normalization) -> tuple[float, float]:
    data = denormalize(imgs.float().cpu(), norm.mean, norm.std)
    return data.min().item(), data.max().item()
