"""A timm ``VisionTransformer`` state dict in one file (``.pth`` / ``.bin`` / ``.safetensors``): timm's
names are the official MAE encoder's, so the tensors are kept as they are and the architecture is read off
their shapes (``mae.convert.shapes``; the heads assumed from the width, as the load report notes). The
last row of the table: any plain state dict not recognised before it."""

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.shapes import infer_config


def detect(checkpoint: CheckpointPath) -> bool:
    return checkpoint.state_dict() is not None


def read(checkpoint: CheckpointPath) -> MAECheckpoint:
    state = checkpoint.state_dict()
    config, notes = infer_config(state, source=checkpoint.path)
    return MAECheckpoint(str(checkpoint.path), "timm", state, config, notes)


FORMAT = CheckpointFormat(
    name="timm state dict file",
    format="timm",
    looks_for="a plain state dict (every value a tensor)",
    detect=detect,
    read=read,
)
