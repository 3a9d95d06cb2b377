"""Sharded training checkpoints: the folder a sharded save writes (torch distributed checkpoint shards
plus Lightning's ``meta.pt``), read in one process by ``mae.convert.sharded_checkpoint`` as the dict a
``.ckpt`` file holds, then as one of our Lightning checkpoints (``mae.convert.formats.lightning``).
Training writes this format (``mae.training.sharding``).

A folder with any of the format's files (the shards' index ``.metadata``, a ``*.distcp`` shard,
``meta.pt``) is recognised as one, so that a folder missing the others (copied in part, a file removed) is
refused naming the missing file, not as a folder no format knows."""

from pathlib import Path

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats import lightning
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.sharded_checkpoint import (
    META_FILE,
    SHARDS_METADATA,
    is_sharded_checkpoint,
    read_sharded_checkpoint,
)
from mae.errors import InputError

SHARD_SUFFIX = ".distcp"  # torch distributed checkpoint's shard files, one a process


def detect(checkpoint: CheckpointPath) -> bool:
    folder = checkpoint.path
    if not folder.is_dir():
        return False
    own = (folder / META_FILE).is_file() or (folder / SHARDS_METADATA).is_file()
    return own or any(folder.glob(f"*{SHARD_SUFFIX}"))


def read(checkpoint: CheckpointPath) -> MAECheckpoint:
    """The model weights only (no optimizer states), consolidated in this process.

    Raises:
        InputError: the folder misses ``meta.pt`` or ``.metadata``, naming it.
    """
    _check_complete(checkpoint.path)
    return lightning.read_dict(checkpoint.path, read_sharded_checkpoint(checkpoint.path, model_only=True))


def _check_complete(folder: Path) -> None:
    if is_sharded_checkpoint(folder):
        return
    shards = len(list(folder.glob(f"*{SHARD_SUFFIX}")))
    missing = [name for name in (META_FILE, SHARDS_METADATA) if not (folder / name).is_file()]
    what = {
        META_FILE: f"{META_FILE}, Lightning's record of the run (step, hyperparameters, architecture)",
        SHARDS_METADATA: f"{SHARDS_METADATA}, the index of its shards",
    }
    raise InputError(
        f"{folder} is a sharded checkpoint folder ({shards} {SHARD_SUFFIX} shard file(s)) missing "
        f"{' and '.join(what[name] for name in missing)}: a sharded save writes them together, so the "
        "folder was copied in part or a file was removed; copy the whole folder again, or use another "
        "checkpoint of the run"
    )


FORMAT = CheckpointFormat(
    name="sharded checkpoint folder",
    format="lightning",
    looks_for=f"a folder with {META_FILE}, {SHARDS_METADATA} and {SHARD_SUFFIX} shards",
    detect=detect,
    read=read,
)
