"""Surviving preemption and kills: a resumable checkpoint on SIGTERM, and no leftovers of a kill
during a save.

A scheduler signals the whole job: every DDP process and every loader worker gets the SIGTERM
(workers leave it to their main process, ``mae.data.sources.loader_workers``). Lightning's own SIGTERM
handler runs a collective inside the signal handler and forwards the signal to the other ranks,
so with a job-wide signal a rank runs that collective twice and the processes desynchronise
(gloo: "Received data size doesn't match expected size"). ``PreemptionSignals`` only records the
signal; ``SigtermCheckpoint`` then agrees across ranks at the end of a training step, so that every
process stops after the same step and saves the same checkpoint.
"""

import logging
import signal
from pathlib import Path

import lightning.pytorch as pl
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from mae.compat.lightning import SignalConnector, install_signal_connector, signal_connector
from mae.training.checkpointing import AtomicCheckpointIO, remove_orphan_temporaries

# The exit status after a SIGTERM checkpoint: 128 + SIGTERM, the shell's own code for a process
# ended by SIGTERM, so `mae pretrain ... && next_step` and schedulers see an unfinished run.
PREEMPTED_EXIT_CODE = 143


log = logging.getLogger(__name__)


class PreemptionSignals(SignalConnector):
    """Lightning's signal handling (SLURM's requeue signal included) with a SIGTERM handler that does
    no collective: it records the signal, forwards it once to the ranks this process launched, and
    in a single process stops the run as Lightning does (after the running step or validation batch).
    With several processes ``SigtermCheckpoint`` makes the stop collective."""

    def __init__(self, trainer: pl.Trainer) -> None:
        super().__init__(trainer)
        self.requested = False

    def register_signal_handlers(self) -> None:
        self.requested = False
        super().register_signal_handlers()

    def on_sigterm(self, signum: int | signal.Signals) -> None:
        if not self.requested:
            log.info(f"[rank: {self.trainer.global_rank}] Received SIGTERM: stopping after the running step")
            launcher = self.trainer.strategy.launcher
            if launcher is not None:  # ranks started by this process (when only this one was signalled)
                launcher.kill(signum)
        self.requested = True
        if self.trainer.world_size == 1:
            self.received_sigterm = True


class SigtermCheckpoint(pl.Callback):
    """On SIGTERM write a resumable ``last.ckpt`` before exiting.

    Lightning turns SIGTERM into an exception after the running step; other exceptions (a
    non-finite loss, a bug) do not save, so a broken state never overwrites a good checkpoint.
    With several processes the ranks agree at the end of every training step whether any of them
    was signalled (one all-reduce of a flag), so all stop after the same step; a validation that is
    running then finishes first (ranks may hold different numbers of validation batches, so none
    can stop alone).
    """

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:
        signals = signal_connector(trainer)
        if trainer.world_size > 1 and isinstance(signals, PreemptionSignals):
            if trainer.strategy.reduce_boolean_decision(signals.requested, all=False):
                signals.requested = signals.received_sigterm = True

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return  # an evaluation has no training state to save
        callback = trainer.checkpoint_callback
        folder = (
            Path(callback.dirpath)
            if callback is not None and callback.dirpath
            else Path(trainer.default_root_dir)
        )
        path = folder / "last.ckpt"
        if callback is not None and hasattr(callback, "last_model_path"):
            # Recorded in the checkpoint: on resume, the checkpoint callback then keeps writing this
            # last.ckpt instead of starting a last-v1.ckpt beside it (as it would when the SIGTERM
            # comes before it has saved a last.ckpt of its own, i.e. in the first epoch).
            callback.last_model_path = str(path)
        trainer.save_checkpoint(path)
        rank_zero_info(
            f"SIGTERM: saved {path} at step {trainer.global_step}; resume with --ckpt_path {path} (or "
            f"--ckpt_path last); exiting with status {PREEMPTED_EXIT_CODE}"
        )


class RemoveOrphanTemporaries(pl.Callback):
    """At the start of a run, delete the temporary checkpoint files (``.<name>.tmp-<pid>``) that a
    process killed during a save left in the checkpoint folder, and say which."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        callback = trainer.checkpoint_callback
        if (
            trainer.is_global_zero
            and callback is not None
            and callback.dirpath
            and Path(callback.dirpath).is_dir()
        ):
            for path in remove_orphan_temporaries(callback.dirpath):
                rank_zero_info(f"removed {path}, left by a process killed while saving a checkpoint")


def harden_trainer(trainer: pl.Trainer) -> None:
    """Atomic checkpoint writes (temporary file, then rename), a checkpoint on SIGTERM (sent to one
    process or to the whole job), and no temporary files left over from a kill during an earlier save."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()
    install_signal_connector(trainer, PreemptionSignals(trainer))
    trainer.callbacks += [SigtermCheckpoint(), RemoveOrphanTemporaries()]
