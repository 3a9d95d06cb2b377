"""The fast linear probe as a pretraining monitor, next to the kNN one."""

import lightning.pytorch as pl
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from mae.convert.pooling import encoder_family, feature_depth, resolve_blocks
from mae.data import ImageDataModule
from mae.errors import ConfigError
from mae.eval.probe import Pool, ProbeSettings, evaluate
from mae.training.callbacks.monitor import FeatureMonitor


class ProbeCallback(FeatureMonitor):
    """Every ``every_n_epochs`` epochs (and after the last), log ``val/probe_acc1`` / ``val/probe_acc5``:
    the linear probe on the encoder's frozen features (``mae.eval.probe.evaluate``), trained on the
    data module's training split (evaluation view), scored on its validation split (the run, its data and
    its lines on stderr as ``FeatureMonitor`` says).

    Args:
        every_n_epochs: period in epochs; 0 disables the monitor.
        pool: "cls", "avg" or "both"; a CNN takes "avg" alone.
        lrs, weight_decays: the grid (default: ``mae.eval.probe.DEFAULT_LRS`` / ``DEFAULT_WEIGHT_DECAYS``).
        max_epochs, patience: the heads' training cap and early stop.
        max_train: training-split size cap (a fixed random subset).
        max_val: validation-split size cap (a fixed random subset).
        feature_blocks: the encoder blocks read (negative from the end; several: their pooled vectors
            concatenated, ``mae.convert.pooling.pooled``); None: the last. Checked against the encoder when
            the run starts.
    """

    section = "probe"

    def __init__(
        self,
        every_n_epochs: NonNegativeInt = 0,
        pool: Pool = "cls",
        lrs: list[float] | None = None,
        weight_decays: list[float] | None = None,
        max_epochs: PositiveInt = 100,
        patience: PositiveInt = 10,
        max_train: PositiveInt = 50_000,
        max_val: PositiveInt = 50_000,
        feature_blocks: list[int] | None = None,
    ) -> None:
        super().__init__(every_n_epochs, max_train, max_val, max_epochs=max_epochs, patience=patience)
        self.settings = ProbeSettings(
            pool,
            lrs=lrs,
            weight_decays=weight_decays,
            max_epochs=max_epochs,
            patience=patience,
            blocks=feature_blocks,
        )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # At start-up, not at the first probe epoch hours into the run.
        if self.every_n_epochs:  # a block the encoder does not have
            resolve_blocks(
                self.settings.blocks, feature_depth(pl_module.encoder), option="probe.feature_blocks"
            )
        if self.every_n_epochs and encoder_family(pl_module.network) == "cnn" and self.settings.pool != "avg":
            raise ConfigError(
                f"probe.pool {self.settings.pool}: a CNN's features are maps, with no cls token; set "
                "probe.pool: avg (the mean of its last map, as timm pools it)"
            )
        data = trainer.datamodule
        if self.every_n_epochs and isinstance(data, ImageDataModule) and data.num_labels < 2:
            raise ConfigError(
                f"probe.every_n_epochs={self.every_n_epochs}: a linear probe needs labelled data with 2 or "
                f"more classes; {type(data).__name__} has {data.num_labels}; set probe.every_n_epochs: 0"
            )

    def measure(
        self, encoder: nn.Module, data: ImageDataModule, trainer: pl.Trainer, device: torch.device
    ) -> dict[str, float]:
        result, _, _ = evaluate(encoder, data, self.settings, device, **self.extraction(trainer))
        return {"val/probe_acc1": result.val_acc1, "val/probe_acc5": result.val_acc5}

    def announce(self, train_images: int, val_images: int) -> None:
        rank_zero_info(
            f"linear probe monitor: extracting features of {val_images:,} validation and "
            f"{train_images:,} training images, then training the heads (probe.max_val, probe.max_train "
            "limit them, probe.max_epochs the heads' epochs; probe.every_n_epochs: 0 turns it off)"
        )
