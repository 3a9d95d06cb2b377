"""The fast linear probe as a pretraining monitor, next to the kNN one."""

import lightning.pytorch as pl
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch.utilities import rank_zero_info

from mae.data import ImageDataModule
from mae.errors import ConfigError
from mae.eval.probe import Pool, ProbeSettings, evaluate
from mae.training.base import MAETrainingModule
from mae.training.callbacks.monitor import PeriodicMonitor, check_bounds, evaluating, evaluation_data
from mae.training.sharding import is_sharded


class ProbeCallback(PeriodicMonitor):
    """Every ``every_n_epochs`` epochs (and after the last), log ``val/probe_acc1`` / ``val/probe_acc5``:
    the linear probe on the encoder's frozen features (``mae.eval.probe.evaluate``), trained on the
    data module's training split (evaluation view), scored on its validation split. Runs on global
    rank 0 only; skipped when the data has no validation split. Each run prints one line naming what it
    extracts and the settings that limit it or turn it off, and shows its progress on stderr unless the
    trainer's progress bar is off (``trainer.enable_progress_bar: false``).

    Args:
        every_n_epochs: period in epochs; 0 disables the monitor.
        pool: "cls", "avg" or "both".
        lrs, weight_decays: the grid (default: ``mae.eval.probe.DEFAULT_LRS`` / ``DEFAULT_WEIGHT_DECAYS``).
        max_epochs, patience: the heads' training cap and early stop.
        max_train: training-split size cap (a fixed random subset).
        max_val: validation-split size cap (a fixed random subset).
    """

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
    ) -> None:
        check_bounds(
            "probe",
            ProbeCallback.__init__,
            every_n_epochs=every_n_epochs,
            max_epochs=max_epochs,
            patience=patience,
            max_train=max_train,
            max_val=max_val,
        )
        super().__init__(every_n_epochs)
        self.settings = ProbeSettings(
            pool, lrs=lrs, weight_decays=weight_decays, max_epochs=max_epochs, patience=patience
        )
        self.max_train, self.max_val = max_train, max_val

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # At start-up, not at the first probe epoch hours into the run.
        data = trainer.datamodule
        if self.every_n_epochs and isinstance(data, ImageDataModule) and data.num_labels < 2:
            raise ConfigError(
                f"probe.every_n_epochs={self.every_n_epochs}: a linear probe needs labelled data with 2 or "
                f"more classes; {type(data).__name__} has {data.num_labels}; set probe.every_n_epochs: 0"
            )

    def monitor(self, trainer: pl.Trainer, pl_module: MAETrainingModule, epoch: int) -> None:
        data = evaluation_data(trainer)
        # Under FSDP2 every process takes part in each forward (gathering the shards): all evaluate, rank 0
        # logs.
        if data is None or not (trainer.is_global_zero or is_sharded(trainer)):
            return

        def announce(train_images: int, val_images: int) -> None:
            rank_zero_info(
                f"linear probe monitor: extracting features of {val_images:,} validation and "
                f"{train_images:,} training images, then training the heads (probe.max_val, probe.max_train "
                "limit them, probe.max_epochs the heads' epochs; probe.every_n_epochs: 0 turns it off)"
            )

        with evaluating(pl_module, pl_module.encoder) as encoder:
            result, _, _ = evaluate(
                encoder,
                data,
                self.settings,
                pl_module.device,
                max_train=self.max_train,
                max_val=self.max_val,
                progress=trainer.is_global_zero and trainer.progress_bar_callback is not None,
                announce=announce,
            )
        pl_module.log_dict(
            {"val/probe_acc1": result.val_acc1, "val/probe_acc5": result.val_acc5}, rank_zero_only=True
        )
