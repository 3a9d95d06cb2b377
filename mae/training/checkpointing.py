"""Checkpoints of a training run: atomic writes, and a resume checkpoint validated before any work."""

import os
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from torch.distributed.tensor import DTensor

from mae.convert.architecture import ARCHITECTURE_KEY, CNN_MAE_CLASS, MAE_CLASS
from mae.convert.report import state_dict_mismatch
from mae.convert.sharded_checkpoint import (
    is_sharded_checkpoint,
    read_sharded_checkpoint,
    read_training_checkpoint,
)
from mae.errors import ConfigError, MissingFileError, OutputExistsError
from mae.io.atomic import atomic_write, replace_folder
from mae.models.decoder_switches import switch_differences


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes to a temporary file in the target folder, fsyncs it, then renames it into place; a
    checkpoint the free space cannot hold is refused before writing, naming the bytes. A sharded checkpoint
    folder at the target (a run under FSDP2 resumed by one process) is replaced as a whole once the file is
    written (``mae.io.atomic.replace_folder``); any other folder there is refused, not replaced."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        path, size = Path(path), tensor_bytes(checkpoint)
        if not path.is_dir():
            atomic_write(path, lambda tmp: torch.save(checkpoint, tmp), size=size)
            return
        check_replaceable_checkpoint(path)
        staged = path.with_name(f".{path.name}.file.tmp-{os.getpid()}")  # removed by a later run if killed
        atomic_write(staged, lambda tmp: torch.save(checkpoint, tmp), size=size)
        replace_folder(staged, path)

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


def check_replaceable_checkpoint(path: Path) -> None:
    """A checkpoint is about to be written at ``path``: what is there must be a checkpoint (a file, or a
    sharded checkpoint folder), which the run replaces; a folder of anything else is the user's.

    Raises:
        OutputExistsError: ``path`` is a folder but not a sharded checkpoint; naming it and the fix.
    """
    if path.is_dir() and not is_sharded_checkpoint(path):
        raise OutputExistsError(
            f"cannot write the checkpoint {path}: a folder that is not a checkpoint is there (a sharded "
            "checkpoint holds meta.pt, .metadata and a .distcp file per process); move it away or set "
            "checkpoint.dirpath to another folder"
        )


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
    check_same_cnn(path, ckpt.get(ARCHITECTURE_KEY), module)
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


# What a CNN pretraining run resumes with unchanged: the timm model, the decoder and the mask grid.
CNN_KEYS = ("encoder", "decoder", "mask_unit")


def check_same_cnn(path: Path, saved: dict | None, module: pl.LightningModule) -> None:
    """A CNN pretraining run resumes with its model family, timm ``encoder``, ``decoder`` and ``mask_unit``
    (the mask grid); a ViT run does not resume as a CNN, nor a CNN run as a ViT.

    Raises:
        ConfigError: naming the checkpoint's and this config's class, or each differing
            ``model.model_kwargs.<key>`` with both values, and the fix.
    """
    record = getattr(module, "architecture_record", lambda: None)()
    if not saved or not record or CNN_MAE_CLASS not in (saved.get("class"), record.get("class")):
        return
    if saved.get("class") != record.get("class"):
        classes = f"holds a {saved.get('class')} and this config builds a {record.get('class')}"
        raise ConfigError(
            f"--ckpt_path {path} {classes}: resume it with the model of the run that wrote it (its "
            "config.yaml), or start a new run"
        )
    before, now = saved.get("args") or {}, record["args"]
    differences = [
        f"{key} {before.get(key)!r} (this config: {now.get(key)!r})"
        for key in CNN_KEYS
        if before.get(key) != now.get(key)
    ]
    if differences:
        raise ConfigError(
            f"--ckpt_path {path} was written with another CNN model than this config builds: "
            "model.model_kwargs." + "; model.model_kwargs.".join(differences) + ". Set them to the "
            "checkpoint's values to resume it, or start a new run from its weights with model.init_from"
        )


def restore_moved_aside(folder: str | Path) -> list[tuple[Path, Path]]:
    """Put back what ``mae.io.atomic.replace_folder`` had moved aside when its process was killed between
    its two renames: a ``.<name>.old.tmp-<pid>`` of a process no longer running, in ``folder``, whose
    ``<name>`` is missing (a ``last.ckpt`` replaced by a run's next save) is renamed back to ``<name>``, so
    that ``--ckpt_path last`` finds it and ``remove_orphan_temporaries`` does not delete it. Returns
    (the copy beside, the path it was put back at) for each."""
    restored = []
    for old in sorted(Path(folder).glob(".*.old.tmp-*")):
        name, _, pid = old.name[1:].rpartition(".old.tmp-")
        path = old.with_name(name)
        if not name or not pid.isdigit() or _running(int(pid)) or path.exists() or path.is_symlink():
            continue
        try:
            old.rename(path)
        except FileNotFoundError:  # another process of the run put it back first
            continue
        restored.append((old, path))
    return restored


def remove_orphan_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files (and sharded checkpoint folders) that a process killed during a save
    left in ``folder`` (``.<name>.tmp-<pid>`` of a process no longer running), once what such a process had
    moved aside is put back (``restore_moved_aside``); returns them."""
    restore_moved_aside(folder)
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
