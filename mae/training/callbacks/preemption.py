"""Surviving preemption, Ctrl-C and kills: a resumable checkpoint on SIGTERM or a first Ctrl-C (SIGINT),
and no leftovers of a kill during a save.

A scheduler signals the whole job: every DDP process and every loader worker gets the SIGTERM
(workers leave it to their main process, ``mae.data.sources.loader_workers``). Lightning's own SIGTERM
handler runs a collective inside the signal handler and forwards the signal to the other ranks,
so with a job-wide signal a rank runs that collective twice and the processes desynchronise
(gloo: "Received data size doesn't match expected size"). ``PreemptionSignals`` only records the
signal; ``SigtermCheckpoint`` then agrees across ranks at the end of a training step, so that every
process stops after the same step and saves the same checkpoint.

A user's Ctrl-C (SIGINT, which a terminal sends to the whole foreground process group) takes the same
path, exiting with ``INTERRUPTED_EXIT_CODE``; a second Ctrl-C interrupts at once (Lightning's
KeyboardInterrupt shutdown), without saving.
"""

import logging
import os
import signal
from pathlib import Path
from types import FrameType

import lightning.pytorch as pl
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from mae.compat.lightning import SignalConnector, install_signal_connector, signal_connector
from mae.errors import INTERRUPTED_EXIT_CODE
from mae.training.checkpointing import AtomicCheckpointIO, remove_orphan_temporaries

# The exit status after a SIGTERM checkpoint: 128 + SIGTERM, the shell's own code for a process
# ended by SIGTERM, so `mae pretrain ... && next_step` and schedulers see an unfinished run.
PREEMPTED_EXIT_CODE = 143
# The exit status after each stop signal; after a Ctrl-C (SIGINT), that of any command Ctrl-C ends.
_EXIT_CODES = {signal.SIGTERM: PREEMPTED_EXIT_CODE, signal.SIGINT: INTERRUPTED_EXIT_CODE}


log = logging.getLogger(__name__)


class PreemptionSignals(SignalConnector):
    """Lightning's signal handling (SLURM's requeue signal included) with a SIGTERM handler that does
    no collective: it records the signal, forwards it once to the ranks this process launched, and
    in a single process stops the run as Lightning does (after the running step or validation batch).
    With several processes ``SigtermCheckpoint`` makes the stop collective.

    A first Ctrl-C (SIGINT) is handled the same way, not forwarded (a terminal signals every process of
    the group; one rank signalled alone stops the others through ``SigtermCheckpoint``'s agreement); the
    next one raises KeyboardInterrupt at once. SIGINT is left alone where it is not Python's default
    (ignored, as in a job started in the background, or a caller's own handler)."""

    def __init__(self, trainer: pl.Trainer) -> None:
        super().__init__(trainer)
        self.requested = False
        self.stop_signal: signal.Signals | None = None

    def register_signal_handlers(self) -> None:
        self.requested = False
        self.stop_signal = None
        super().register_signal_handlers()  # also records SIGINT's handler, restored by ``teardown``
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.set_handler(signal.SIGINT, self._on_sigint)

    @property
    def exit_code(self) -> int:
        """The status to exit with after the stop: ``INTERRUPTED_EXIT_CODE`` when a Ctrl-C came first,
        else ``PREEMPTED_EXIT_CODE``."""
        return _EXIT_CODES.get(self.stop_signal, PREEMPTED_EXIT_CODE)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.set_handler(signal.SIGINT, signal.default_int_handler)  # the next Ctrl-C: at once
        if self.trainer.is_global_zero and not self.requested:
            # os.write: a print here could interrupt another write to the same buffered stream
            os.write(2, f"\n{_CTRL_C_NOTICE}\n".encode())
        self.on_sigterm(signum)

    def on_sigterm(self, signum: int | signal.Signals) -> None:
        """Record a stop signal (SIGTERM, or a first Ctrl-C): the run stops after the running step."""
        name = signal.Signals(signum).name
        if not self.requested:
            log.info(f"[rank: {self.trainer.global_rank}] Received {name}: stopping after the running step")
            launcher = self.trainer.strategy.launcher
            if launcher is not None and signum == signal.SIGTERM:
                launcher.kill(signum)  # ranks started by this process (when only this one was signalled)
        self.requested = True
        self.stop_signal = self.stop_signal or signal.Signals(signum)
        if self.trainer.world_size == 1:
            self.received_sigterm = True


_CTRL_C_NOTICE = (
    "Ctrl-C: stopping after the running step to save a checkpoint (press Ctrl-C again to stop at once, "
    "without saving)"
)


def stop_exit_code(trainer: pl.Trainer) -> int:
    """The exit status of a run stopped by a signal (``PreemptionSignals.exit_code``; a SIGTERM's
    without them)."""
    signals = signal_connector(trainer)
    return signals.exit_code if isinstance(signals, PreemptionSignals) else PREEMPTED_EXIT_CODE


def _stop_signal_name(trainer: pl.Trainer) -> str:
    signals = signal_connector(trainer)
    stop = signals.stop_signal if isinstance(signals, PreemptionSignals) else None
    return (stop or signal.SIGTERM).name


class SigtermCheckpoint(pl.Callback):
    """On SIGTERM (or a first Ctrl-C) write a resumable ``last.ckpt`` before exiting; before the first
    training step of a run there is nothing to save.

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
        name, code = _stop_signal_name(trainer), stop_exit_code(trainer)
        if trainer.global_step == 0:
            rank_zero_info(
                f"{name} before the first training step: nothing to save; exiting with status {code}"
            )
            return
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
        # the full training state; weights_only said, or Lightning logs its default on every rank
        trainer.save_checkpoint(path, weights_only=False)
        rank_zero_info(
            f"{name}: saved {path} at step {trainer.global_step}; resume with --ckpt_path {path} (or "
            f"--ckpt_path last); exiting with status {code}"
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
    process or to the whole job) or a first Ctrl-C, and no temporary files left over from a kill during an
    earlier save."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()
    install_signal_connector(trainer, PreemptionSignals(trainer))
    trainer.callbacks += [SigtermCheckpoint(), RemoveOrphanTemporaries()]
