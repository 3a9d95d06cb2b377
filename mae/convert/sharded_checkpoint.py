"""Sharded training checkpoints (``mae.training.sharding``: a folder of torch distributed checkpoint
shards plus Lightning's ``meta.pt``) read by one process as the checkpoint dict a ``.ckpt`` file holds,
with no consolidation step and no code run from the files.

torch's own reader unpickles the folder's ``.metadata`` and its non-tensor entries (the optimizer's
parameter groups) with plain ``pickle``; here the metadata is unpickled with only the checkpoint
format's own classes allowed, and every entry with ``torch.load(weights_only=True)``.
"""

import io
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from mae.compat.torch import EmptyStateDictLoadPlanner, load_distributed_checkpoint
from mae.convert.safe_load import safe_torch_load
from mae.errors import InputError

META_FILE = "meta.pt"  # Lightning's: everything of the checkpoint but the model and optimizer states
SHARDS_METADATA = ".metadata"  # torch distributed checkpoint's index of the shards
MODEL_KEY = "state_dict"
OPTIMIZER_PREFIX = "optimizer_"

# The objects a distributed checkpoint's .metadata is pickled from (torch 2.4 - 2.14), by the exact (module,
# name) pair a pickle names each with: never a module's whole namespace (the metadata module imports os),
# never a dotted attribute path (a protocol-4 pickle may name "os.mkdir" in a module that imports os).
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_METADATA_GLOBALS = frozenset(
    {
        (_METADATA_MODULE, "Metadata"),
        (_METADATA_MODULE, "MetadataIndex"),
        (_METADATA_MODULE, "StorageMeta"),
        (_METADATA_MODULE, "TensorStorageMetadata"),
        (_METADATA_MODULE, "BytesStorageMetadata"),
        (_METADATA_MODULE, "TensorProperties"),
        (_METADATA_MODULE, "ChunkStorageMetadata"),
        (_METADATA_MODULE, "_MEM_FORMAT_ENCODING"),
        ("torch", "Size"),
        ("torch", "float64"),
        ("torch", "float32"),
        ("torch", "float16"),
        ("torch", "bfloat16"),
        ("torch", "int64"),
        ("torch", "int32"),
        ("torch", "int16"),
        ("torch", "int8"),
        ("torch", "uint8"),
        ("torch", "bool"),
        ("torch", "strided"),
        ("torch", "contiguous_format"),
        ("torch.serialization", "_get_layout"),  # a layout from its name, as torch.load's weights_only allows
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # a shard's file, offset and length
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "slice"),
    }
)


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a folder a sharded save wrote (its shards' index and Lightning's ``meta.pt``)."""
    path = Path(path)
    return path.is_dir() and (path / META_FILE).is_file() and (path / SHARDS_METADATA).is_file()


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles only the objects of ``_METADATA_GLOBALS``, each by its exact (module, name) pair."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _METADATA_GLOBALS:  # no allowed name holds a dot: one attribute, no path
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")
        return super().find_class(module, name)


def read_metadata(path: Path) -> Metadata:
    """The index of the sharded checkpoint folder ``path``: every entry's name, shape and dtype.

    Raises:
        InputError: naming the file, when it names other objects than the checkpoint format's (it could
            run code) or is not a distributed checkpoint's index.
    """
    file = Path(path) / SHARDS_METADATA
    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as err:
        raise InputError(
            f"{file} would run code when loaded ({err}): a sharded checkpoint's index holds only the "
            "distributed checkpoint format's own records"
        ) from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise InputError(
            f"could not read {file}: truncated or corrupt ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(metadata, Metadata):
        raise InputError(
            f"{file} is not a distributed checkpoint's index (it holds a {type(metadata).__name__})"
        )
    for info in (metadata.storage_data or {}).values():
        shard = Path(str(getattr(info, "relative_path", "")))
        if shard.is_absolute() or ".." in shard.parts:
            raise InputError(
                f"{file} names a shard outside its folder ({shard}): a sharded checkpoint reads only the "
                "files beside its index"
            )
    return metadata


class _SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # as torch's reader does
        return metadata


class _SafePlanner(EmptyStateDictLoadPlanner):
    """Builds the state dict from the index, reading non-tensor entries as tensors and plain data only;
    ``refused``: the error of an entry that would run code (torch wraps what a planner raises)."""

    refused: InputError | None = None

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        data = value.read()
        try:
            torch.load(io.BytesIO(data), weights_only=True)  # checked, then loaded by torch's planner
        except pickle.UnpicklingError as err:
            named = re.findall(r"GLOBAL ([\w.]+)", str(err))
            what = f"it names {named[0]}" if named else "it holds objects that are not tensors or plain data"
            self.refused = InputError(
                f"the entry {read_item.dest_index.fqn} would run code when loaded: {what}"
            )
            raise self.refused from None
        super().load_bytes(read_item, io.BytesIO(data))


def read_training_checkpoint(path: str | Path, model_only: bool = False) -> Any:
    """A checkpoint file (``mae.convert.safe_load.safe_torch_load``) or a sharded checkpoint folder
    (``read_sharded_checkpoint``), as the dict a ``.ckpt`` file holds."""
    if is_sharded_checkpoint(Path(path)):
        return read_sharded_checkpoint(path, model_only)
    return safe_torch_load(path)


def read_sharded_checkpoint(path: str | Path, model_only: bool = False) -> dict[str, Any]:
    """The Lightning checkpoint dict of the sharded checkpoint folder ``path``, as a ``.ckpt`` file of
    the same run holds it: ``state_dict`` whole, ``optimizer_states`` keyed by parameter index (the
    layout ``torch.optim.Optimizer.load_state_dict`` takes), and every other entry of ``meta.pt``.
    ``model_only``: without the optimizer states (a third of the reading for AdamW).

    Raises:
        InputError: naming the folder or file that is incomplete, corrupt, or would run code.
    """
    path = Path(path)
    if not is_sharded_checkpoint(path):
        raise InputError(
            f"{path} is not a sharded checkpoint folder (expected {META_FILE} and {SHARDS_METADATA} in it)"
        )
    checkpoint = safe_torch_load(path / META_FILE)
    if not isinstance(checkpoint, dict):
        raise InputError(f"{path / META_FILE} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    metadata = read_metadata(path)
    entries = {fqn.split(".", 1)[0] for fqn in metadata.state_dict_metadata}
    optimizers = sorted(
        (name for name in entries if name.startswith(OPTIMIZER_PREFIX)), key=lambda n: int(n.split("_")[1])
    )
    if MODEL_KEY not in entries:
        raise InputError(f"{path} holds no model weights ({MODEL_KEY}): an incomplete sharded checkpoint")
    keys = {MODEL_KEY} if model_only else {MODEL_KEY, *optimizers}
    state: dict[str, Any] = {}
    planner = _SafePlanner(keys=keys)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            load_distributed_checkpoint(state, _SafeReader(path), planner)
    except (Exception, CheckpointException) as err:  # torch wraps what a planner or a reader raises
        if planner.refused is not None:  # an entry that would run code
            raise InputError(f"{path}: {planner.refused}") from None
        # a missing or short shard
        raise InputError(
            f"could not read the sharded checkpoint {path}: a shard is missing, truncated or corrupt "
            f"({type(err).__name__}: {str(err).strip().splitlines()[-1] if str(err).strip() else ''})"
        ) from err
    checkpoint[MODEL_KEY] = state[MODEL_KEY]
    if not model_only:
        checkpoint["optimizer_states"] = [indexed_optimizer_state(state[name]) for name in optimizers]
    return checkpoint


def indexed_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (what a sharded save writes) keyed by parameter index
    instead, the indices counted through the parameter groups in order, as ``Optimizer.state_dict``
    numbers them."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        groups.append({**group, "params": [index.setdefault(name, len(index)) for name in group["params"]]})
    return {
        "state": {index[name]: value for name, value in state.get("state", {}).items()},
        "param_groups": groups,
    }
