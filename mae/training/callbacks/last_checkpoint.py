"""``last.ckpt`` that holds the run's latest state."""

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from mae.compat.lightning import (
    checkpoint_period_epochs,
    checkpoints_at_train_epoch_end,
    refresh_last_checkpoint,
)
from mae.training.callbacks.monitor import is_last_epoch


class LastStateCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` (every setting as there), with ``last.ckpt`` (``save_last``) written at
    every ``every_n_epochs``-th epoch and at the end of the run's last epoch, whether or not a monitored
    metric improved.

    Lightning 2.6 rewrites ``last.ckpt`` only where a top-k checkpoint is saved: with ``monitor: val/loss``
    and ``save_top_k: 1``, a run whose loss did not improve in its last epochs ended with a ``last.ckpt``
    of an earlier epoch, which ``--ckpt_path last``, ``mae export`` and the run summary took for the
    trained model; with ``every_n_epochs: 10`` a 25-epoch run's last state was not saved at all.
    """

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if checkpoints_at_train_epoch_end(self, trainer):
            self._keep_last_current(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not checkpoints_at_train_epoch_end(self, trainer):
            self._keep_last_current(trainer)

    def _keep_last_current(self, trainer: pl.Trainer) -> None:
        period = checkpoint_period_epochs(self)
        due = period > 0 and (trainer.current_epoch + 1) % period == 0
        if due or is_last_epoch(trainer):
            refresh_last_checkpoint(self, trainer)
