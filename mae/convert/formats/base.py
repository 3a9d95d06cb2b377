"""The interface of a checkpoint format: ``CheckpointFormat``, one row of the table
``mae.convert.sources.CHECKPOINT_FORMATS``, and ``CheckpointPath``, the path every row's ``detect`` and
``read`` are given (a file is read once, as untrusted input, however many rows look at it)."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.safe_load import read_safetensors, safe_torch_load


@dataclass
class CheckpointPath:
    """A checkpoint file or folder and, read on first use, what a file holds."""

    path: Path
    _contents: Any = field(default=None, init=False, repr=False)

    @property
    def contents(self) -> Any:
        """What the file holds: a ``.safetensors`` file's tensors, else what ``safe_torch_load`` reads
        (tensors, plain containers and ``argparse.Namespace`` only); None for a folder.

        Raises:
            MissingFileError, InputError: no such file, or not a checkpoint (``mae.convert.safe_load``).
        """
        if self.path.is_dir():
            return None
        if self._contents is None:
            read = read_safetensors if self.path.suffix == ".safetensors" else safe_torch_load
            self._contents = read(self.path)
        return self._contents

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """The file's contents when they are a plain state dict (every value a tensor), else None."""
        contents = self.contents
        if isinstance(contents, dict) and all(isinstance(v, torch.Tensor) for v in contents.values()):
            return contents
        return None

    def describe(self) -> str:
        """What the path holds, in words, for the error that no format recognises it."""
        if self.path.is_dir():
            return f"a folder of {sorted(p.name for p in self.path.iterdir())[:8]}"
        if isinstance(self.contents, dict):
            return f"a dict of top-level keys {sorted(map(str, self.contents))[:8]}"
        return f"a {type(self.contents).__name__}"


@dataclass(frozen=True)
class CheckpointFormat:
    """One checkpoint format: how to recognise it and how to read it.

    Attributes:
        name: what the format is, in words ("timm folder").
        format: the name ``read_checkpoint(format=...)`` and ``--checkpoint-format`` take, and
            ``MAECheckpoint.format`` says; several rows may share one ("timm": a file or a folder).
        looks_for: what ``detect`` looks for, in words (the error for a path no row recognises lists it).
        detect: whether the path is one of this format's; only reads what it must.
        read: the path as an ``MAECheckpoint``; raises ``mae.errors`` types naming the file.
    """

    name: str
    format: str
    looks_for: str
    detect: Callable[[CheckpointPath], bool]
    read: Callable[[CheckpointPath], MAECheckpoint]
