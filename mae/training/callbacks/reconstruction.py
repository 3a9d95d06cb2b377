"""Periodic reconstruction figures of a fixed batch, saved as PNG and sent to the run's tracker."""

from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchvision.utils import save_image

from mae.data import ImageDataModule
from mae.errors import ConfigError
from mae.inference.reconstruction import reconstruct, reconstruction_grid
from mae.training.callbacks.monitor import PeriodicMonitor, evaluating
from mae.training.pretrain import MAEPretrainModule
from mae.training.trackers import log_figure


class ReconstructionCallback(PeriodicMonitor):
    """Every ``every_n_epochs`` epochs (and after the last), render ``num_images`` fixed images.

    A model whose decoder predicts no pixels (``model.target`` hog, ...) has no reconstruction to draw:
    the callback then says so once and draws nothing.

    The images come from the validation split when there is one (else the training split, drawn
    once); the masks are fixed by ``seed``, so figures from different epochs are comparable.
    Files: ``<log_dir>/reconstructions/epoch_0005.png`` and so on.

    Args:
        every_n_epochs: render period in epochs; 0 disables the callback.
        num_images: rows in the figure.
        seed: seed of the fixed masks.
        bands: three channel indices drawn as RGB, for data with other than 1 or 3 channels (default:
            the first three).
    """

    folder = "reconstructions"

    def __init__(
        self, every_n_epochs: int = 1, num_images: int = 8, seed: int = 0, bands: list[int] | None = None
    ) -> None:
        if every_n_epochs < 0 or num_images < 1:
            raise ConfigError(
                f"need every_n_epochs >= 0 and num_images >= 1, got {every_n_epochs}, {num_images}"
            )
        if bands is not None and (len(bands) != 3 or min(bands) < 0):
            raise ConfigError(f"reconstruction.bands must be 3 channel indices, got {bands}")
        super().__init__(every_n_epochs)
        self.bands = bands
        self.num_images = num_images
        self.seed = seed
        self.images: torch.Tensor | None = None
        self.last_path: Path | None = None  # known on global rank 0 only
        self.skipped = False  # said once that the model's target is not pixels

    def _fixed_images(self, trainer: pl.Trainer) -> torch.Tensor:
        datamodule = trainer.datamodule
        if not isinstance(datamodule, ImageDataModule):  # its batches are model input as they are
            return next(iter(trainer.train_dataloader))[0][: self.num_images]
        dataset = datamodule.val_set or datamodule.train_set
        count = min(self.num_images, len(dataset))
        # across classes, not the first few
        spread = torch.linspace(0, len(dataset) - 1, count).long().tolist()
        return datamodule.normalize(torch.stack([dataset[i][0] for i in spread]))

    @staticmethod
    def _display(trainer: pl.Trainer) -> dict:
        """How the data's values are drawn: its mean / std, and black and white at 0 and 1 (float
        data: at its minimum and maximum)."""
        datamodule = trainer.datamodule
        if not isinstance(datamodule, ImageDataModule):
            return {}
        pixels = datamodule.expected_pixels
        floats = pixels is not None and pixels[1].startswith("float")
        return {"mean": datamodule.mean, "std": datamodule.std, "value_range": None if floats else (0.0, 1.0)}

    def monitor(self, trainer: pl.Trainer, pl_module: MAEPretrainModule, epoch: int) -> None:
        target = pl_module.network.target
        if not target.pixels:
            if not self.skipped:
                rank_zero_info(
                    f"reconstruction figures skipped: model.target {target.name} predicts {target.described} "
                    "of each masked patch, not pixels, so there is no reconstruction to draw"
                )
                self.skipped = True
            return
        grid = self.reconstruction_grid(trainer, pl_module)
        if trainer.is_global_zero:  # the figure is written once
            self.last_path = self.save(trainer, grid, self.out_dir / f"epoch_{epoch:04d}.png")

    @staticmethod
    def save(trainer: pl.Trainer, grid: torch.Tensor, path: Path) -> Path:
        """Write the figure ``grid`` at ``path``, send it to the run's tracker and return ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        save_image(grid, path)
        log_figure(trainer, "reconstructions", grid)
        return path

    def reconstruction_grid(self, trainer: pl.Trainer, pl_module: MAEPretrainModule) -> torch.Tensor:
        """The figure's image grid: the fixed images, masked, reconstructed and pasted, one band each."""
        model = pl_module.network
        with evaluating(pl_module, model):  # drawing the images may run random transforms: the RNG is forked
            if self.images is None:
                self.images = self._fixed_images(trainer)
            imgs = self.images.to(pl_module.device, next(model.parameters()).dtype)
            generator = torch.Generator().manual_seed(self.seed)
            noise = model.sample_noise(imgs.shape[0], pl_module.mask_ratio, "cpu", generator).to(imgs.device)
            views = reconstruct(model, imgs, pl_module.mask_ratio, noise)
            return reconstruction_grid(views, bands=self.bands, **self._display(trainer))
