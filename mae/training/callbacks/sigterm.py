"""A resumable checkpoint when the scheduler sends SIGTERM (its preemption notice)."""

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


class SigtermCheckpoint(pl.Callback):
    """On SIGTERM write a resumable ``last.ckpt`` before exiting.

    Lightning turns SIGTERM into an exception after the running step; other exceptions (a
    non-finite loss, a bug) do not save, so a broken state never overwrites a good checkpoint.
    """

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        callback = trainer.checkpoint_callback
        folder = Path(callback.dirpath) if callback is not None and callback.dirpath else Path(trainer.default_root_dir)
        path = folder / "last.ckpt"
        if callback is not None and hasattr(callback, "last_model_path"):
            # Recorded in the checkpoint: on resume, the checkpoint callback then keeps writing this
            # last.ckpt instead of starting a last-v1.ckpt beside it (as it would when the SIGTERM
            # comes before it has saved a last.ckpt of its own, i.e. in the first epoch).
            callback.last_model_path = str(path)
        trainer.save_checkpoint(path)
        rank_zero_info(f"SIGTERM: saved {path} at step {trainer.global_step}; resume with --ckpt_path {path}")
