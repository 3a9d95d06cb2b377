"""kNN accuracy of the encoder during pretraining: a free monitor of the representation."""

import lightning.pytorch as pl
import torch
from jsonargparse.typing import NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from mae.convert.pooling import feature_depth, resolve_blocks
from mae.data import ImageDataModule
from mae.eval.knn import knn_evaluate
from mae.training.callbacks.monitor import FeatureMonitor


class KNNCallback(FeatureMonitor):
    """Every ``every_n_epochs`` epochs (and after the last), log ``val/knn_acc1`` / ``val/knn_acc5``
    of the encoder's default pooled features (a ViT's cls token, a CNN's mean map;
    ``mae.eval.knn.knn_evaluate`` on the data module; the run, its data and its lines on stderr as
    ``FeatureMonitor`` says).

    Args:
        every_n_epochs: period in epochs; 0 disables the monitor.
        k: neighbours.
        temperature: vote temperature.
        max_train: memory-bank size cap (a fixed random subset of the training split).
        max_val: query count cap (a fixed random subset of the validation split).
        feature_blocks: the encoder blocks read (negative from the end; several concatenated:
            ``mae.convert.pooling.pooled``); None: the last. Checked against the encoder when the run starts.
    """

    section = "knn"

    def __init__(
        self,
        every_n_epochs: NonNegativeInt = 10,
        k: PositiveInt = 20,
        temperature: PositiveFloat = 0.07,
        max_train: PositiveInt = 50_000,
        max_val: PositiveInt = 50_000,
        feature_blocks: list[int] | None = None,
    ):
        super().__init__(every_n_epochs, max_train, max_val, k=k, temperature=temperature)
        self.k, self.temperature, self.feature_blocks = k, temperature, feature_blocks

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.every_n_epochs:  # a block the encoder does not have fails now, not at the first kNN epoch
            resolve_blocks(self.feature_blocks, feature_depth(pl_module.encoder), option="knn.feature_blocks")

    def measure(
        self, encoder: nn.Module, data: ImageDataModule, trainer: pl.Trainer, device: torch.device
    ) -> dict[str, float]:
        extraction = self.extraction(trainer)
        acc1, acc5, _ = knn_evaluate(
            encoder,
            data,
            self.k,
            self.temperature,
            device,
            notes=trainer.is_global_zero,
            blocks=self.feature_blocks,
            **extraction,
        )
        return {"val/knn_acc1": acc1, "val/knn_acc5": acc5}

    def announce(self, train_images: int, val_images: int) -> None:
        rank_zero_info(
            f"kNN monitor: extracting features of {val_images:,} validation and {train_images:,} "
            "training images (knn.max_val, knn.max_train limit them; knn.every_n_epochs: 0 turns it off)"
        )
