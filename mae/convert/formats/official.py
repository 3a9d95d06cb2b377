"""Files of the official MAE code: ``{"model": state_dict, ["optimizer", "epoch", "args"]}``, full (with
the decoder) or encoder-only, pretrained or fine-tuned. The tensors already have the official names; the
architecture is read off their shapes (``mae.convert.shapes``), with the heads and the input size from the
pickled ``args`` of the training script when it is there."""

from typing import Any

import torch

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.shapes import infer_config
from mae.models.factory import MODEL_REGISTRY, create_model


def detect(checkpoint: CheckpointPath) -> bool:
    contents = checkpoint.contents
    return isinstance(contents, dict) and isinstance(contents.get("model"), dict)


def read(checkpoint: CheckpointPath) -> MAECheckpoint:
    state = checkpoint.contents["model"]
    args = checkpoint.contents.get("args")
    hints = _hints(args, state) if args is not None else {}
    config, notes = infer_config(state, hints, checkpoint.path)
    return MAECheckpoint(str(checkpoint.path), "official", state, config, notes)


def _hints(args: Any, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What the training script's ``args`` say that the shapes cannot: the heads of the named model
    size (only when the weights really are that size), the input size, ``norm_pix_loss``."""
    hints: dict[str, Any] = {}
    name = getattr(args, "model", None)
    if name in MODEL_REGISTRY or f"mae_{name}" in MODEL_REGISTRY:
        with torch.device("meta"):
            factory = create_model(name if name in MODEL_REGISTRY else f"mae_{name}").config
        for heads, width, weight in (
            ("num_heads", "embed_dim", "patch_embed.proj.weight"),
            ("decoder_num_heads", "decoder_embed_dim", "decoder_embed.weight"),
        ):
            if weight in state and state[weight].shape[0] == factory[width]:
                hints[heads] = factory[heads]
    if getattr(args, "input_size", None):
        hints["img_size"] = args.input_size
    if getattr(args, "norm_pix_loss", None) is not None:
        hints["norm_pix_loss"] = bool(args.norm_pix_loss)
    return hints


FORMAT = CheckpointFormat(
    name="official MAE file",
    format="official",
    looks_for="a dict with a 'model' state dict",
    detect=detect,
    read=read,
)
