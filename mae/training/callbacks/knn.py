"""kNN accuracy of the encoder during pretraining: a free monitor of the representation."""

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_only

from mae.eval.knn import knn_evaluate


class KNNCallback(pl.Callback):
    """Every ``every_n_epochs`` epochs (and after the last), log ``val/knn_acc1`` / ``val/knn_acc5``
    of the encoder's cls token (``mae.eval.knn.knn_evaluate`` on the data module). Runs on global
    rank 0 only; skipped when the data has no validation split.

    Args:
        every_n_epochs: period in epochs; 0 disables the monitor.
        k: neighbours.
        temperature: vote temperature.
        max_train: memory-bank size cap (a fixed random subset of the training split).
    """

    def __init__(self, every_n_epochs: int = 10, k: int = 20, temperature: float = 0.07, max_train: int = 50_000):
        if every_n_epochs < 0 or k < 1 or temperature <= 0:
            raise ValueError(
                f"need every_n_epochs >= 0, k >= 1, temperature > 0; got {every_n_epochs}, {k}, {temperature}"
            )
        self.every_n_epochs, self.k, self.temperature, self.max_train = every_n_epochs, k, temperature, max_train

    @rank_zero_only
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch + 1
        if not self.every_n_epochs or (epoch % self.every_n_epochs and epoch != trainer.max_epochs):
            return
        if getattr(trainer.datamodule, "val_set", None) is None:  # set up by now; no split, no queries
            return
        model = pl_module.model
        was_training = model.training
        model.eval()
        # Loaders draw seeds from the global RNG: fork it, so monitoring never changes the training run.
        with torch.random.fork_rng(devices=[pl_module.device] if pl_module.device.type == "cuda" else []):
            acc1, acc5, _ = knn_evaluate(
                model, trainer.datamodule, self.k, self.temperature, pl_module.device, self.max_train
            )
        model.train(was_training)
        pl_module.log_dict({"val/knn_acc1": acc1, "val/knn_acc5": acc5}, rank_zero_only=True)
