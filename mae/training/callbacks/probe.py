"""The fast linear probe as a pretraining monitor, next to the kNN one."""

import lightning.pytorch as pl

from mae.data import ImageDataModule
from mae.errors import ConfigError
from mae.eval.probe import Pool, ProbeSettings, evaluate
from mae.training.base import MAETrainingModule
from mae.training.callbacks.monitor import PeriodicMonitor, evaluating, evaluation_data


class ProbeCallback(PeriodicMonitor):
    """Every ``every_n_epochs`` epochs (and after the last), log ``val/probe_acc1`` / ``val/probe_acc5``:
    the linear probe on the encoder's frozen features (``mae.eval.probe.evaluate``), trained on the
    data module's training split (evaluation view), scored on its validation split. Runs on global
    rank 0 only; skipped when the data has no validation split.

    Args:
        every_n_epochs: period in epochs; 0 disables the monitor.
        pool: "cls", "avg" or "both".
        lrs, weight_decays: the grid (default: ``mae.eval.probe.DEFAULT_LRS`` / ``DEFAULT_WEIGHT_DECAYS``).
        max_epochs, patience: the heads' training cap and early stop.
        max_train: training-split size cap (a fixed random subset).
    """

    def __init__(
        self,
        every_n_epochs: int = 0,
        pool: Pool = "cls",
        lrs: list[float] | None = None,
        weight_decays: list[float] | None = None,
        max_epochs: int = 100,
        patience: int = 10,
        max_train: int = 50_000,
    ) -> None:
        if every_n_epochs < 0:
            raise ConfigError(f"probe.every_n_epochs must be >= 0, got {every_n_epochs}")
        super().__init__(every_n_epochs)
        self.settings = ProbeSettings(
            pool, lrs=lrs, weight_decays=weight_decays, max_epochs=max_epochs, patience=patience
        )
        self.max_train = max_train

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
        if not trainer.is_global_zero or data is None:
            return
        with evaluating(pl_module, pl_module.encoder) as encoder:
            result, _, _ = evaluate(encoder, data, self.settings, pl_module.device, max_train=self.max_train)
        pl_module.log_dict(
            {"val/probe_acc1": result.val_acc1, "val/probe_acc5": result.val_acc5}, rank_zero_only=True
        )
