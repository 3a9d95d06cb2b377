"""Resuming a run where it stopped, in its own folder, so a requeued job can repeat its command line.

``--ckpt_path last`` resumes from the newest ``last.ckpt`` of the configured run (or starts fresh
when there is none yet); a checkpoint inside ``<save_dir>/<name>/version_N/`` continues logging and
checkpointing in ``version_N`` (its ``metrics.csv`` kept and appended to) instead of a new version.
"""

import csv
import re
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info

from mae.compat.lightning import keeps_versions, set_version, version_chosen
from mae.training.checkpointing import check_resume_checkpoint

RESUME_LAST = "last"


def _versioned_logger(trainer: pl.Trainer):
    """The trainer's logger if it keeps each run in a folder of its own (``root_dir/<version>``, as
    the CSV and TensorBoard loggers do), else None."""
    logger = trainer.logger
    return logger if keeps_versions(logger) else None


def find_last_checkpoint(trainer: pl.Trainer) -> Path | None:
    """The newest ``last.ckpt`` of this run, where Lightning's checkpoint callback writes it:
    ``checkpoint.dirpath`` when set; else ``<save_dir>/<name>/<any version>/checkpoints`` of the
    first logger; else ``<default_root_dir>/checkpoints``. None when there is none."""
    callback = trainer.checkpoint_callback
    if callback is not None and getattr(callback, "dirpath", None):
        candidates = [Path(callback.dirpath) / "last.ckpt"]
    elif trainer.loggers:
        logger = trainer.loggers[0]
        root = Path(logger.save_dir or trainer.default_root_dir) / str(logger.name)
        candidates = list(root.glob("*/checkpoints/last.ckpt"))
    else:
        candidates = [Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"]
    existing = [path for path in candidates if path.is_file()]
    return max(existing, key=lambda path: path.stat().st_mtime) if existing else None


def resolve_ckpt_path(trainer: pl.Trainer, ckpt_path: str | None) -> str | None:
    """``ckpt_path`` with ``last`` resolved (None: start fresh, and say so)."""
    if ckpt_path != RESUME_LAST:
        return ckpt_path
    found = find_last_checkpoint(trainer)
    if found is None:
        rank_zero_info("--ckpt_path last: no last.ckpt of this run yet, starting from the beginning")
        return None
    rank_zero_info(f"--ckpt_path last: resuming from {found}")
    return str(found)


def continue_in_run_folder(trainer: pl.Trainer, ckpt_path: str, global_step: int) -> pl.Callback | None:
    """When ``ckpt_path`` lies in ``<logger root>/<version>/checkpoints/``, log and checkpoint into that
    version's folder (``version_N``, or a named version).

    Returns a callback that keeps the folder's ``metrics.csv`` rows up to ``global_step`` (Lightning's
    CSV writer would delete the file), or None when the run folder is not continued.
    """
    logger = _versioned_logger(trainer)
    if logger is None or version_chosen(logger):
        return None
    root = Path(logger.root_dir).resolve()
    path = Path(ckpt_path).resolve()
    if path.parent.name != "checkpoints" or path.parent.parent.parent != root:
        return None
    folder = path.parent.parent.name
    match = re.fullmatch(r"version_(\d+)", folder)
    set_version(logger, int(match.group(1)) if match else folder)
    rank_zero_info(f"resuming in the run folder {path.parent.parent}")
    metrics = path.parent.parent / "metrics.csv"
    if not isinstance(logger, CSVLogger) or not metrics.is_file():
        return None
    with open(metrics, newline="") as f:
        rows = [
            row for row in csv.DictReader(f) if row.get("step", "") == "" or int(row["step"]) < global_step
        ]
    return KeepMetrics(rows)


class KeepMetrics(pl.Callback):
    """Puts the metric rows of the interrupted run back in front of the resumed run's."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero and self.rows:
            experiment = trainer.logger.experiment  # created now: it has just removed the old file
            experiment.metrics[:0] = [{k: v for k, v in row.items() if v != ""} for row in self.rows]
            experiment.save()
            self.rows = []


def prepare_resume(
    trainer: pl.Trainer, model: pl.LightningModule, ckpt_path: str | None, fitting: bool
) -> tuple[str | None, int | None]:
    """``--ckpt_path`` resolved (``last``: ``resolve_ckpt_path``) and validated against ``model``
    before any work; when ``fitting``, the checkpoint's run folder is continued (an evaluation logs
    into a folder of its own). Returns the checkpoint to resume from and its global step (None, None:
    a fresh start)."""
    ckpt_path = resolve_ckpt_path(trainer, ckpt_path)
    if ckpt_path is None:
        return None, None
    step = check_resume_checkpoint(ckpt_path, model)
    keep_metrics = continue_in_run_folder(trainer, ckpt_path, step) if fitting else None
    if keep_metrics is not None:
        trainer.callbacks.append(keep_metrics)
    return ckpt_path, step
