"""Surviving preemption and kills: a resumable checkpoint on SIGTERM, and no leftovers of a kill
during a save."""

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from mae.training.checkpointing import remove_orphan_temporaries

# The exit status after a SIGTERM checkpoint: 128 + SIGTERM, the shell's own code for a process
# ended by SIGTERM, so `train.py ... && next_step` and schedulers see an unfinished run.
PREEMPTED_EXIT_CODE = 143


class SigtermCheckpoint(pl.Callback):
    """On SIGTERM write a resumable ``last.ckpt`` before exiting.

    Lightning turns SIGTERM into an exception after the running step; other exceptions (a
    non-finite loss, a bug) do not save, so a broken state never overwrites a good checkpoint.
    """

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return  # an evaluation has no training state to save
        callback = trainer.checkpoint_callback
        folder = Path(callback.dirpath) if callback is not None and callback.dirpath else Path(trainer.default_root_dir)
        path = folder / "last.ckpt"
        if callback is not None and hasattr(callback, "last_model_path"):
            # Recorded in the checkpoint: on resume, the checkpoint callback then keeps writing this
            # last.ckpt instead of starting a last-v1.ckpt beside it (as it would when the SIGTERM
            # comes before it has saved a last.ckpt of its own, i.e. in the first epoch).
            callback.last_model_path = str(path)
        trainer.save_checkpoint(path)
        rank_zero_info(
            f"SIGTERM: saved {path} at step {trainer.global_step}; resume with --ckpt_path {path} (or --ckpt_path "
            f"last); exiting with status {PREEMPTED_EXIT_CODE}"
        )


class RemoveOrphanTemporaries(pl.Callback):
    """At the start of a run, delete the temporary checkpoint files (``.<name>.tmp-<pid>``) that a
    process killed during a save left in the checkpoint folder, and say which."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        callback = trainer.checkpoint_callback
        if trainer.is_global_zero and callback is not None and callback.dirpath and Path(callback.dirpath).is_dir():
            for path in remove_orphan_temporaries(callback.dirpath):
                rank_zero_info(f"removed {path}, left by a process killed while saving a checkpoint")
