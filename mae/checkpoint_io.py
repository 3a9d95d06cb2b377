"""Atomic checkpoint writing: a kill during a save never leaves a truncated checkpoint behind."""

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes to a temporary file in the target folder, fsyncs it, then renames it into place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
