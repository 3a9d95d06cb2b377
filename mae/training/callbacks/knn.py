"""kNN accuracy of the encoder during pretraining: a free monitor of the representation."""

import lightning.pytorch as pl

from mae.errors import ConfigError
from mae.eval.knn import knn_evaluate
from mae.training.base import MAETrainingModule
from mae.training.callbacks.monitor import PeriodicMonitor, evaluating, evaluation_data


class KNNCallback(PeriodicMonitor):
    """Every ``every_n_epochs`` epochs (and after the last), log ``val/knn_acc1`` / ``val/knn_acc5``
    of the encoder's cls token (``mae.eval.knn.knn_evaluate`` on the data module). Runs on global
    rank 0 only; skipped when the data has no validation split.

    Args:
        every_n_epochs: period in epochs; 0 disables the monitor.
        k: neighbours.
        temperature: vote temperature.
        max_train: memory-bank size cap (a fixed random subset of the training split).
    """

    def __init__(
        self, every_n_epochs: int = 10, k: int = 20, temperature: float = 0.07, max_train: int = 50_000
    ):
        if every_n_epochs < 0 or k < 1 or temperature <= 0:
            raise ConfigError(
                f"need every_n_epochs >= 0, k >= 1, temperature > 0; got {every_n_epochs}, {k}, {temperature}"
            )
        super().__init__(every_n_epochs)
        self.k, self.temperature, self.max_train = k, temperature, max_train

    def monitor(self, trainer: pl.Trainer, pl_module: MAETrainingModule, epoch: int) -> None:
        data = evaluation_data(trainer)
        if not trainer.is_global_zero or data is None:
            return
        with evaluating(pl_module, pl_module.encoder) as encoder:
            acc1, acc5, _ = knn_evaluate(
                encoder, data, self.k, self.temperature, pl_module.device, self.max_train
            )
        pl_module.log_dict({"val/knn_acc1": acc1, "val/knn_acc5": acc5}, rank_zero_only=True)
