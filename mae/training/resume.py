"""Run folders: each run claims a folder of its own, and resuming a run continues in its folder, so a
requeued job can repeat its command line.

A fresh run claims the next free ``<save_dir>/<name>/version_N`` by creating it exclusively before it
starts (``claim_run_folder``), so runs started at the same moment (an array job, a sweep) never share a
folder. ``--ckpt_path last`` resumes from the newest ``last.ckpt`` of the configured run (or starts fresh
when there is none yet); a checkpoint inside ``<save_dir>/<name>/version_N/`` continues logging and
checkpointing in ``version_N`` (its ``metrics.csv`` kept and appended to) instead of a new version.
"""

import contextlib
import csv
import re
from pathlib import Path

import lightning.pytorch as pl
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info

from mae.compat.lightning import keeps_versions, set_version, version_chosen
from mae.convert.sharded_checkpoint import is_sharded_checkpoint
from mae.io.outputs import Output, check_outputs
from mae.training.checkpointing import (
    check_replaceable_checkpoint,
    check_resume_checkpoint,
    restore_moved_aside,
)

RESUME_LAST = "last"


def _versioned_logger(trainer: pl.Trainer):
    """The trainer's logger if it keeps each run in a folder of its own (``root_dir/<version>``, as
    the CSV and TensorBoard loggers do), else None."""
    logger = trainer.logger
    return logger if keeps_versions(logger) else None


# How many times a claim is tried again when the folder above the run folders vanishes meanwhile (a run
# refused at start removing the empty folders it made).
_CLAIM_TRIES = 100


def _next_version(root: Path) -> int:
    """One more than the highest ``version_N`` folder in ``root`` (0 when there is none), as Lightning's
    versioned loggers count."""
    numbers = [
        int(match.group(1))
        for path in (root.iterdir() if root.is_dir() else [])
        if path.is_dir() and (match := re.fullmatch(r"version_(\d+)", path.name))
    ]
    return max(numbers, default=-1) + 1


def claim_run_folder(root: Path) -> tuple[int, list[Path]]:
    """Create ``root/version_N`` for the next free ``N``, exclusively (``os.mkdir`` fails when it exists):
    of several processes claiming in ``root`` at the same moment each gets a folder of its own, and a
    folder another run has taken is never shared.

    Returns (``N``, the folders above it that did not exist and were created for it, deepest first).
    """
    missing = [path for path in [root, *root.parents] if not path.exists()]
    for _ in range(_CLAIM_TRIES):
        made = []
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):  # made by a run starting beside this one: shared
                path.mkdir()
                made.append(path)
        version = _next_version(root)
        while True:
            try:
                (root / f"version_{version}").mkdir()
                return version, made[::-1]
            except FileExistsError:
                version += 1  # taken since we looked (or a file of that name)
            except FileNotFoundError:
                break  # root was removed meanwhile: make it again
        missing = [path for path in [root, *root.parents] if not path.exists()]
    raise FileNotFoundError(f"could not create a run folder in {root}: it keeps disappearing")


class ShareRunVersion(pl.Callback):
    """At setup, every process takes the global-zero process's run version (which that process claimed
    before the run started), so that each names the same run folder."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        logger = _versioned_logger(trainer)
        if logger is not None:
            set_version(logger, trainer.strategy.broadcast(logger.version))


def planned_run_folder(trainer: pl.Trainer) -> Path:
    """The run folder the run about to start will write into, found without choosing it: a fresh run's
    next free ``version_N`` is only claimed when it starts (``start_run_folder``), and reading
    ``trainer.log_dir`` before then would fix that version for this process alone."""
    logger = _versioned_logger(trainer)
    if logger is None or version_chosen(logger):
        return Path(trainer.log_dir or trainer.default_root_dir)
    root = Path(logger.root_dir)
    return root / f"version_{_next_version(root)}"


def start_run_folder(trainer: pl.Trainer) -> tuple[Path, list[Path]] | None:
    """Fix the run folder of a run about to start; call it on every process, before ``fit`` or ``validate``.

    When the first logger keeps versions and none is chosen (no ``version`` given, not a resumed run's
    folder), the global-zero process claims the next free version on a local disk (``claim_run_folder``)
    and the others take it at setup (``ShareRunVersion``). Returns, on the global-zero process, (the run
    folder, the folders above it made for it) when this run creates the folder (claimed here, or a
    given version whose folder does not exist yet); else None.
    """
    logger = _versioned_logger(trainer)
    if logger is None or not isinstance(get_filesystem(logger.root_dir), LocalFileSystem):
        return None  # remote storage: Lightning's own choice of version
    if version_chosen(logger):
        folder = Path(logger.log_dir)
        if not trainer.is_global_zero or folder.exists():
            return None
        return folder, [path for path in folder.parents if not path.exists()]
    trainer.callbacks.insert(0, ShareRunVersion())
    if not trainer.is_global_zero:
        return None
    version, made = claim_run_folder(Path(logger.root_dir))
    set_version(logger, version)
    return Path(logger.log_dir), made


def find_last_checkpoint(trainer: pl.Trainer) -> Path | None:
    """The newest ``last.ckpt`` (a file, or a sharded checkpoint folder) of this run, where Lightning's
    checkpoint callback writes it: ``checkpoint.dirpath`` when set; else
    ``<save_dir>/<name>/<any version>/checkpoints`` of the first logger; else
    ``<default_root_dir>/checkpoints``. None when there is none. A ``last.ckpt`` that a process killed while
    replacing it had moved aside is put back first (``restore_moved_aside``, and said)."""
    callback = trainer.checkpoint_callback
    if callback is not None and getattr(callback, "dirpath", None):
        folders = [Path(callback.dirpath)]
    elif trainer.loggers:
        logger = trainer.loggers[0]
        root = Path(logger.save_dir or trainer.default_root_dir) / str(logger.name)
        folders = list(root.glob("*/checkpoints"))
    else:
        folders = [Path(trainer.default_root_dir) / "checkpoints"]
    for folder in folders:
        for old, path in restore_moved_aside(folder):
            rank_zero_info(
                f"restored {path} from {old}, left beside it by a process killed while replacing it"
            )
    candidates = [folder / "last.ckpt" for folder in folders]
    existing = [path for path in candidates if path.is_file() or is_sharded_checkpoint(path)]
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


def checkpoint_folder(trainer: pl.Trainer) -> tuple[Path, str] | None:
    """Where the run's checkpoint callback will write, as it finds the folder when the run starts, and how
    the user names it: ``checkpoint.dirpath`` when set; else ``<run folder>/checkpoints`` of a versioned first
    logger (``planned_run_folder``), or ``<default_root_dir>/checkpoints`` with no logger. None: no
    checkpoints, or a folder only the logger's own rules place (another logger, remote storage)."""
    callback, logger = trainer.checkpoint_callback, _versioned_logger(trainer)
    if callback is None:
        return None
    if getattr(callback, "dirpath", None):
        root, folder, option = callback.dirpath, Path(callback.dirpath), "checkpoint.dirpath"
    elif not trainer.loggers:
        root = trainer.default_root_dir
        folder, option = Path(root) / "checkpoints", "the checkpoint folder"
    elif logger is not None:
        root = logger.root_dir
        folder, option = planned_run_folder(trainer) / "checkpoints", "the checkpoint folder"
    else:
        return None
    return (folder, option) if isinstance(get_filesystem(str(root)), LocalFileSystem) else None


def check_checkpoint_folder(trainer: pl.Trainer) -> None:
    """Before any work: the run can write its checkpoints (``checkpoint_folder``): the folder, or the
    nearest one above it, is a folder this user can write, and a ``last.ckpt`` there is a checkpoint
    (a file or a sharded checkpoint folder, which the run replaces), not a folder of the user's.

    Raises:
        OutputError: naming the folder and what is wrong (``mae.io.outputs.check_outputs``).
        OutputExistsError: ``last.ckpt`` is a folder but no checkpoint
            (``mae.training.checkpointing.check_replaceable_checkpoint``).
    """
    found = checkpoint_folder(trainer)
    if found is None:
        return
    folder, option = found
    # Lightning writes its checkpoints beside whatever the folder holds, replacing none of it: all is kept
    check_outputs("training", [Output(folder, option, kind="folder", ours=lambda _: True)])
    callback = trainer.checkpoint_callback
    if getattr(callback, "save_last", False):
        check_replaceable_checkpoint(folder / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}")


def prepare_resume(
    trainer: pl.Trainer, model: pl.LightningModule, ckpt_path: str | None, fitting: bool
) -> tuple[str | None, int | None]:
    """``--ckpt_path`` resolved (``last``: ``resolve_ckpt_path``) and validated against ``model``
    before any work; when ``fitting``, the checkpoint's run folder is continued (an evaluation logs
    into a folder of its own) and the checkpoint folder checked (``check_checkpoint_folder``). Returns the
    checkpoint to resume from and its global step (None, None: a fresh start)."""
    ckpt_path = resolve_ckpt_path(trainer, ckpt_path)
    step = None if ckpt_path is None else check_resume_checkpoint(ckpt_path, model)
    keep_metrics = continue_in_run_folder(trainer, ckpt_path, step) if fitting and ckpt_path else None
    if keep_metrics is not None:
        trainer.callbacks.append(keep_metrics)
    if fitting:
        check_checkpoint_folder(trainer)
    return ckpt_path, step
