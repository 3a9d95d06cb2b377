"""Prediction figures of the dense modules: boxes and instance masks, or class masks, over fixed
validation images, written to the run folder every few epochs."""

import colorsys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks, make_grid, save_image

from mae.errors import ConfigError
from mae.io.atomic import atomic_write
from mae.training.callbacks.monitor import PeriodicMonitor, evaluating
from mae.training.trackers import log_figure

SMALL = 192  # panels smaller than this many pixels a side are enlarged by a whole factor


def palette(count: int) -> list[tuple[int, int, int]]:
    """``count`` distinct RGB colours (hues evenly spaced; the same colour for a class in every figure)."""
    hues = ((i * 0.618034) % 1.0 for i in range(count))  # golden-ratio steps keep neighbouring classes apart
    return [tuple(round(c * 255) for c in colorsys.hsv_to_rgb(hue, 0.8, 1.0)) for hue in hues]


def as_uint8(image: torch.Tensor) -> torch.Tensor:
    """(C, H, W) values in [0, 1] -> (3, H, W) uint8 (one channel repeated; the first three of more)."""
    image = (image.detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8)
    return image.expand(3, -1, -1) if image.shape[0] == 1 else image[:3]


def detection_panel(
    image: torch.Tensor, found: dict[str, torch.Tensor], names: list[str], score_threshold: float
) -> torch.Tensor:
    """(3, H, W) uint8: ``image`` in [0, 1] with the detections scoring at least ``score_threshold``:
    masks (when predicted), boxes and "name score" labels; ``names[label - 1]`` names a label."""
    keep = found["scores"] >= score_threshold
    labels = found["labels"][keep].tolist()
    colours = palette(max(len(names), 1))
    drawn = as_uint8(image)
    if "masks" in found and keep.any():
        masks = found["masks"][keep][:, 0] > 0.5
        drawn = draw_segmentation_masks(
            drawn, masks, alpha=0.45, colors=[colours[label - 1] for label in labels]
        )
    scores = found["scores"][keep].tolist()
    captions = [f"{names[label - 1]} {score:.2f}" for label, score in zip(labels, scores, strict=True)]
    return draw_bounding_boxes(
        drawn, found["boxes"][keep].cpu(), captions, [colours[label - 1] for label in labels]
    )


def segmentation_panel(
    image: torch.Tensor,
    classes: torch.Tensor,
    num_classes: int,
    ignore_index: int,
    clear: tuple[int, ...] = (),
) -> torch.Tensor:
    """(3, H, W) uint8: ``image`` in [0, 1] with (H, W) ``classes`` painted over it (``ignore_index`` and the
    classes in ``clear``, e.g. a background class, left unpainted)."""
    classes = classes.cpu()
    present = [
        c for c in classes.unique().tolist() if c != ignore_index and c not in clear and 0 <= c < num_classes
    ]
    if not present:
        return as_uint8(image)
    masks = torch.stack([classes == c for c in present])
    colours = palette(num_classes)
    return draw_segmentation_masks(as_uint8(image), masks, alpha=0.55, colors=[colours[c] for c in present])


class PredictionFigures(PeriodicMonitor):
    """Every ``every_n_epochs`` epochs (and after the last), draw the model's predictions on
    ``num_images`` fixed validation images next to the ground truth: one row per image, ground truth
    left, prediction right. Files: ``<log_dir>/predictions/epoch_0005.png`` and so on.

    The module draws its own panels (``figure_rows(images, targets)``: the detection and segmentation
    modules have one); the data module gives the images (``val_set``, items ``(image, target)``).

    Args:
        every_n_epochs: period in epochs; 0 disables the figures.
        num_images: rows in the figure.
        score_threshold: detections drawn from this score up.
    """

    folder = "predictions"

    def __init__(self, every_n_epochs: int = 5, num_images: int = 4, score_threshold: float = 0.5) -> None:
        if every_n_epochs < 0 or num_images < 1 or not 0 <= score_threshold <= 1:
            raise ConfigError(
                f"figures: need every_n_epochs >= 0, num_images >= 1 and score_threshold in [0, 1]; got "
                f"{every_n_epochs}, {num_images}, {score_threshold}"
            )
        super().__init__(every_n_epochs)
        self.num_images = num_images
        self.score_threshold = score_threshold
        self.last_path: Path | None = None  # known on global rank 0 only

    def monitor(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epoch: int) -> None:
        dataset = getattr(trainer.datamodule, "val_set", None)
        if dataset is None or not len(dataset):
            return
        spread = torch.linspace(0, len(dataset) - 1, min(self.num_images, len(dataset))).long().tolist()
        with evaluating(pl_module, pl_module.network):
            items = [dataset[i] for i in spread]
            images = [image.to(pl_module.device) for image, _ in items]
            with torch.no_grad():
                rows = pl_module.figure_rows(images, [target for _, target in items], self.score_threshold)
        if trainer.is_global_zero:  # the figure is written once
            self.last_path = self.save(trainer, rows, self.out_dir / f"epoch_{epoch:04d}.png")

    @staticmethod
    def save(trainer: pl.Trainer, rows: list[list[torch.Tensor]], path: Path) -> Path:
        """Write the figure of ``rows`` (uint8 (3, H, W) panels, one row per image) at ``path``, send it
        to the run's tracker and return ``path``."""
        panels = [panel for row in rows for panel in row]
        height = max(p.shape[1] for p in panels)
        width = max(p.shape[2] for p in panels)
        panels = [torch.nn.functional.pad(p, (0, width - p.shape[2], 0, height - p.shape[1])) for p in panels]
        if max(height, width) < SMALL:  # small images (the digit scenes) drawn larger, pixels kept sharp
            factor = -(-SMALL // max(height, width))
            panels = [p.repeat_interleave(factor, 1).repeat_interleave(factor, 2) for p in panels]
        grid = make_grid(torch.stack(panels).float() / 255, nrow=len(rows[0]), padding=2, pad_value=1.0)
        atomic_write(path, lambda tmp: save_image(grid, tmp, format="png"))
        log_figure(trainer, "predictions", grid)
        return path
