"""One stage of a run (``trainer.fit`` or ``trainer.validate``) in a run folder of its own, and how it ends:
a SIGTERM or Ctrl-C exits with its own status, not 0, and a run that never took a step leaves no run folder
behind (so the next run does not become ``version_1``)."""

import sys
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from mae.errors import INTERRUPTED_EXIT_CODE
from mae.training.callbacks.preemption import stop_exit_code
from mae.training.resume import start_run_folder
from mae.training.trackers import TRACKER_FILE

# What a run writes into its run folder before its first step (LightningCLI's config, the logger's files).
BEFORE_FIRST_STEP = ("config.yaml", "hparams.yaml", "metrics.csv", TRACKER_FILE)


def run_stage(
    trainer: pl.Trainer,
    model: pl.LightningModule,
    datamodule: pl.LightningDataModule,
    stage: Literal["fit", "validate"],
    ckpt_path: str | None,
) -> Any:
    """``trainer.fit`` or ``trainer.validate`` in a run folder of its own (``start_run_folder``: claimed
    before anything is written, so runs started at the same moment never share one); returns what it returns.

    After a SIGTERM or a first Ctrl-C (and, when fitting, its checkpoint) exit with
    ``PREEMPTED_EXIT_CODE`` or ``INTERRUPTED_EXIT_CODE``, not 0; a second Ctrl-C, or one during
    start-up, exits with ``INTERRUPTED_EXIT_CODE`` at once. A run that fails or is stopped before its
    first step (e.g. 0 steps), and an evaluation that fails, remove the run folder they created
    (``remove_unused_run_folder``)."""
    created = None  # (run folder, folders above it made for it)

    def remove_unused() -> None:
        if created is not None and (stage != "fit" or trainer.global_step == 0):
            remove_unused_run_folder(*created)

    try:
        created = start_run_folder(trainer)
        return getattr(trainer, stage)(model, datamodule=datamodule, ckpt_path=ckpt_path)
    except SIGTERMException:
        remove_unused()
        sys.exit(stop_exit_code(trainer))
    except (KeyboardInterrupt, SystemExit) as stop:
        # Lightning ends a KeyboardInterrupt itself (teardown, then exit status 1)
        if isinstance(stop, SystemExit) and not isinstance(stop.__context__, KeyboardInterrupt):
            raise
        remove_unused()
        rank_zero_info(
            f"Ctrl-C: stopped at step {trainer.global_step} without saving a checkpoint; exiting with "
            f"status {INTERRUPTED_EXIT_CODE}"
        )
        sys.exit(INTERRUPTED_EXIT_CODE)
    except Exception:
        remove_unused()
        raise


def remove_unused_run_folder(folder: Path, new_parents: list[Path]) -> None:
    """Remove ``folder`` if it holds only what a run writes before its first step (``BEFORE_FIRST_STEP``),
    then those of ``new_parents`` (created by this run, deepest first) left empty; nothing else is touched."""
    if folder.is_dir() and all(p.is_file() and p.name in BEFORE_FIRST_STEP for p in folder.iterdir()):
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
        for parent in new_parents:
            if not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()
