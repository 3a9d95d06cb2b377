"""Sharded training checkpoints: the folder a sharded save writes (torch distributed checkpoint shards
plus Lightning's ``meta.pt``), read in one process by ``mae.convert.sharded_checkpoint`` as the dict a
``.ckpt`` file holds, then as one of our Lightning checkpoints (``mae.convert.formats.lightning``).
Training writes this format (``mae.training.sharding``)."""

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats import lightning
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.sharded_checkpoint import (
    META_FILE,
    SHARDS_METADATA,
    is_sharded_checkpoint,
    read_sharded_checkpoint,
)


def detect(checkpoint: CheckpointPath) -> bool:
    return is_sharded_checkpoint(checkpoint.path)


def read(checkpoint: CheckpointPath) -> MAECheckpoint:
    """The model weights only (no optimizer states), consolidated in this process."""
    return lightning.read_dict(checkpoint.path, read_sharded_checkpoint(checkpoint.path, model_only=True))


FORMAT = CheckpointFormat(
    name="sharded checkpoint folder",
    format="lightning",
    looks_for=f"a folder with {META_FILE} and {SHARDS_METADATA}",
    detect=detect,
    read=read,
)
