"""Reading every MAE checkpoint format people have into one layout, the official MAE / timm names
(``MAECheckpoint``): ``read_checkpoint`` walks ``CHECKPOINT_FORMATS``, one row a format, in order, and
reads the path with the first row that recognises it (or, with ``format=``, the first of that name).

The formats, one module each in ``mae.convert.formats``: sharded training checkpoint folders, our
Lightning checkpoints (version 0.1 on), the official MAE's files, timm hub folders (``mae export --to
timm``), Hugging Face ViTMAE / ViT folders (``mae export --to huggingface``) and weights files, our
exported encoders (``mae export --out OUT.safetensors``) and plain timm state dicts. A new format is a
module there and one row here.
"""

from dataclasses import replace
from pathlib import Path

from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.formats import (
    exported_encoder,
    huggingface,
    lightning,
    official,
    sharded,
    timm,
    timm_folder,
)
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.safe_load import safe_torch_load
from mae.errors import InputError

# A folder format and a file format never both recognise one path; among the files, an exported encoder
# before the plain state dict it also is, Hugging Face names before timm's, and any dict of tensors last.
CHECKPOINT_FORMATS: tuple[CheckpointFormat, ...] = (
    sharded.FORMAT,
    lightning.FORMAT,
    official.FORMAT,
    timm_folder.FORMAT,
    huggingface.FOLDER_FORMAT,
    exported_encoder.FORMAT,
    huggingface.FILE_FORMAT,
    timm.FORMAT,
)
FORMATS = ("auto", *dict.fromkeys(row.format for row in CHECKPOINT_FORMATS))


def read_checkpoint(source: str | Path, format: str = "auto") -> MAECheckpoint:
    """Read ``source`` (a file or a folder) as untrusted input, in the first format of
    ``CHECKPOINT_FORMATS`` that recognises it; ``format``: "auto", or only the rows of that name.

    Raises:
        MissingFileError: no such file.
        InputError: an unknown ``format``; a path no format recognises, naming each format tried and
            what it looked for; or what the format's reader refuses, naming the file.
    """
    if format not in FORMATS:
        raise InputError(f"checkpoint format {format!r} is unknown; expected one of {FORMATS}")
    checkpoint = CheckpointPath(Path(source))
    tried = [row for row in CHECKPOINT_FORMATS if format in ("auto", row.format)]
    for row in tried:
        if row.detect(checkpoint):
            return row.read(checkpoint)
    looked_for = "; ".join(f"{row.name}: {row.looks_for}" for row in tried)
    raise InputError(
        f"no checkpoint format recognises {checkpoint.path}, which holds {checkpoint.describe()}; tried "
        f"{looked_for}. Name the format with format= (Python) or --checkpoint-format (commands) if it is one "
        "of these"
    )


# Where ``mae finetune --ema.decay`` keeps the EMA weights in its checkpoints: under
# ``checkpoint["callbacks"]["EMA"]`` (``mae.training.callbacks.ema``), named as the live weights are in
# ``MAECheckpoint.state_dict``.
EMA_WEIGHTS_KEY = "ema_state_dict"


def ema_checkpoint(ckpt: MAECheckpoint) -> MAECheckpoint:
    """``ckpt``, one of our Lightning checkpoints as ``read_checkpoint`` read it, with the EMA weights its run
    kept in place of the live weights.

    Raises:
        InputError: ``ckpt`` holds no EMA weights (not a run with ``--ema.decay``), or EMA weights whose names
            or shapes differ from the live weights'.
    """
    state = None
    if ckpt.format == "lightning":
        callbacks = safe_torch_load(Path(ckpt.source)).get("callbacks") or {}
        state = (callbacks.get("EMA") or {}).get(EMA_WEIGHTS_KEY)
    if not isinstance(state, dict):
        raise InputError(
            f"{ckpt.source} holds no EMA weights (only runs with --ema.decay keep them): export it "
            "without --ema"
        )
    shapes = {name: tuple(tensor.shape) for name, tensor in ckpt.state_dict.items()}
    if {name: tuple(tensor.shape) for name, tensor in state.items()} != shapes:
        raise InputError(
            f"{ckpt.source}: its EMA weights do not match its weights (names or shapes); the file is damaged "
            "or was edited"
        )
    return replace(ckpt, state_dict=state)


__all__ = [
    "CHECKPOINT_FORMATS",
    "EMA_WEIGHTS_KEY",
    "FORMATS",
    "MAECheckpoint",
    "check_finite",
    "ema_checkpoint",
    "read_checkpoint",
]
