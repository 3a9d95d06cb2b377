"""kNN accuracy of the encoder during pretraining: a free monitor of the representation."""

import lightning.pytorch as pl
from jsonargparse.typing import NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch.utilities import rank_zero_info

from mae.eval.knn import knn_evaluate
from mae.training.base import MAETrainingModule
from mae.training.callbacks.monitor import PeriodicMonitor, check_bounds, evaluating, evaluation_data
from mae.training.sharding import is_sharded


class KNNCallback(PeriodicMonitor):
    """Every ``every_n_epochs`` epochs (and after the last), log ``val/knn_acc1`` / ``val/knn_acc5``
    of the encoder's cls token (``mae.eval.knn.knn_evaluate`` on the data module). Runs on global
    rank 0 only; skipped when the data has no validation split. Each run prints one line naming what it
    extracts and the settings that limit it or turn it off, and shows the extraction's progress on
    stderr unless the trainer's progress bar is off (``trainer.enable_progress_bar: false``).

    Args:
        every_n_epochs: period in epochs; 0 disables the monitor.
        k: neighbours.
        temperature: vote temperature.
        max_train: memory-bank size cap (a fixed random subset of the training split).
        max_val: query count cap (a fixed random subset of the validation split).
    """

    def __init__(
        self,
        every_n_epochs: NonNegativeInt = 10,
        k: PositiveInt = 20,
        temperature: PositiveFloat = 0.07,
        max_train: PositiveInt = 50_000,
        max_val: PositiveInt = 50_000,
    ):
        check_bounds(
            "knn",
            KNNCallback.__init__,
            every_n_epochs=every_n_epochs,
            k=k,
            temperature=temperature,
            max_train=max_train,
            max_val=max_val,
        )
        super().__init__(every_n_epochs)
        self.k, self.temperature, self.max_train, self.max_val = k, temperature, max_train, max_val

    def monitor(self, trainer: pl.Trainer, pl_module: MAETrainingModule, epoch: int) -> None:
        data = evaluation_data(trainer)
        # Under FSDP2 every process takes part in each forward (gathering the shards): all evaluate, rank 0
        # logs.
        if data is None or not (trainer.is_global_zero or is_sharded(trainer)):
            return

        def announce(train_images: int, val_images: int) -> None:
            rank_zero_info(
                f"kNN monitor: extracting features of {val_images:,} validation and {train_images:,} "
                "training images (knn.max_val, knn.max_train limit them; knn.every_n_epochs: 0 turns it off)"
            )

        with evaluating(pl_module, pl_module.encoder) as encoder:
            acc1, acc5, _ = knn_evaluate(
                encoder,
                data,
                self.k,
                self.temperature,
                pl_module.device,
                self.max_train,
                self.max_val,
                progress=trainer.is_global_zero and trainer.progress_bar_callback is not None,
                announce=announce,
                notes=trainer.is_global_zero,
            )
        pl_module.log_dict({"val/knn_acc1": acc1, "val/knn_acc5": acc5}, rank_zero_only=True)
