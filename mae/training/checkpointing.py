"""Checkpoints of a training run: atomic writes, and a resume checkpoint validated before any work."""

import os
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from torch.distributed.tensor import DTensor

from mae.convert.architecture import ARCHITECTURE_KEY, MAE_CLASS
from mae.convert.report import state_dict_mismatch
from mae.convert.sharded_checkpoint import (
    is_sharded_checkpoint,
    read_sharded_checkpoint,
    read_training_checkpoint,
)
from mae.errors import ConfigError, MissingFileError
from mae.io.atomic import atomic_write
from mae.models.decoder_switches import switch_differences


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes to a temporary file in the target folder, fsyncs it, then renames it into place; a
    checkpoint the free space cannot hold is refused before writing, naming the bytes."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        atomic_write(path, lambda tmp: torch.save(checkpoint, tmp), size=tensor_bytes(checkpoint))

    def load_checkpoint(
        self, path: str | Path, map_location: Any = None, weights_only: bool | None = None
    ) -> dict:
        """A ``.ckpt`` file as Lightning reads it, or a sharded checkpoint folder (a run under FSDP2)
        consolidated in this process (``mae.convert.sharded_checkpoint``)."""
        if is_sharded_checkpoint(Path(path)):
            return read_sharded_checkpoint(path)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def tensor_bytes(tree: Any) -> int:
    """Bytes of the tensor storages in a nested dict / list / tuple, each storage once (what
    ``torch.save`` of it mostly writes); of a sharded tensor, this process's shard."""
    storages: dict[tuple[str, int], int] = {}

    def visit(node: Any) -> None:
        if isinstance(node, DTensor):
            node = node.to_local()  # this process's shard
        if isinstance(node, torch.Tensor) and node.device.type != "meta":
            storage = node.untyped_storage()
            storages[(str(node.device), storage.data_ptr())] = storage.nbytes()
        elif isinstance(node, dict):
            for value in node.values():
                visit(value)
        elif isinstance(node, list | tuple):
            for value in node:
                visit(value)

    visit(tree)
    return sum(storages.values())


def check_resume_checkpoint(path: str | Path, module: pl.LightningModule) -> int:
    """Before any training: ``path`` exists, is a readable Lightning checkpoint, and fits ``module``.
    Returns the checkpoint's global step.

    Raises:
        FileNotFoundError, ValueError: naming the file and what is wrong (missing, corrupt, other
            architecture: the differing keys and shapes).
    """
    path = Path(path)
    if path.is_dir() and not is_sharded_checkpoint(path):
        raise ConfigError(
            f"--ckpt_path {path} is a folder but not a sharded checkpoint (one holds meta.pt, .metadata and "
            "a .distcp file per process); give the .ckpt file or checkpoint folder a run wrote"
        )
    if not path.is_file() and not is_sharded_checkpoint(path):
        raise MissingFileError(
            f"--ckpt_path {path} does not exist (expected a .ckpt file or a sharded checkpoint folder "
            "written by this tool)"
        )
    ckpt = read_training_checkpoint(path)
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "optimizer_states" not in ckpt:
        raise ConfigError(
            f"--ckpt_path {path} is not a Lightning training checkpoint (no state_dict / optimizer_states); "
            f"to start from pretrained weights use model.encoder.checkpoint instead"
        )
    check_same_decoder_switches(path, ckpt.get(ARCHITECTURE_KEY), module)
    problems = state_dict_mismatch(module.state_dict(), ckpt["state_dict"])
    if problems:
        shown = "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else "")
        raise ConfigError(
            f"--ckpt_path {path} was written for another model architecture than this config builds: {shown}"
        )
    return int(ckpt.get("global_step", 0))


def check_same_decoder_switches(path: Path, saved: dict | None, module: pl.LightningModule) -> None:
    """A pretraining run resumes with the decoder switches it was written with (``decoder_type``,
    ``decoder_keep_ratio``, ``decoder_encoder_layers``; a checkpoint without them has the paper's).

    Raises:
        ValueError: naming each differing ``model.<key>``, both values, the allowed ones and the fix.
    """
    record = getattr(module, "architecture_record", lambda: None)()
    if not saved or not record or saved.get("class") != MAE_CLASS or record.get("class") != MAE_CLASS:
        return
    differences = switch_differences(saved.get("args") or {}, record["args"])
    if differences:
        raise ConfigError(
            f"--ckpt_path {path} was written with other decoder switches than this config sets: model."
            + "; model.".join(differences)
            + ". Set them to the checkpoint's values to resume it, or start a new run from its weights with "
            "model.init_from"
        )


def remove_orphan_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files (and sharded checkpoint folders) that a process killed during a save
    left in ``folder`` (``.<name>.tmp-<pid>`` of a process no longer running); returns them."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():  # this process is not writing anything yet
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
