"""The encoder ``mae export --out OUT.safetensors`` writes (``mae.convert.export.export_encoder``):
``OUT.safetensors``, a timm ``VisionTransformer`` state dict, and ``OUT.json`` beside it, its record::

    {"architecture": "vit_base_patch16_224",  # a timm model name that builds it with model_args
     "model_args": {...},                      # timm.create_model arguments (num_classes=0: features)
     "mae": {...},                             # the MAE configuration it came from
     "source": "...", "source_format": "lightning"}

Anyone with timm alone builds the encoder from the two files::

    args = json.load(open("OUT.json"))
    model = timm.create_model(args["architecture"], pretrained=True,
                              pretrained_cfg_overlay=dict(file="OUT.safetensors"), **args["model_args"])

Read back, it is a timm state dict whose heads, input size, LayerNorm eps and target (``target``, or
``norm_pix_loss`` before 0.5.0) come from the record rather than from assumptions.
"""

import json
from pathlib import Path

from safetensors.torch import save_file

from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.families import CNN_PREFIX, family_of
from mae.convert.formats.base import CheckpointFormat, CheckpointPath
from mae.convert.shapes import infer_config
from mae.errors import ConfigError
from mae.io.atomic import atomic_write

RECORD_KEYS = frozenset({"architecture", "model_args", "mae", "source"})


def is_exported_encoder(path: Path) -> bool:
    """Whether ``path`` (``X.safetensors`` or its ``X.json``) is an encoder ``write`` wrote: the JSON beside
    the weights holds its record (architecture, timm arguments, the MAE configuration, the source)."""
    try:
        record = json.loads(Path(path).with_suffix(".json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and RECORD_KEYS <= record.keys()


def detect(checkpoint: CheckpointPath) -> bool:
    return not checkpoint.path.is_dir() and is_exported_encoder(checkpoint.path)


def read(checkpoint: CheckpointPath) -> MAECheckpoint:
    record = json.loads(checkpoint.path.with_suffix(".json").read_text())
    recorded = record.get("mae", {})
    if isinstance(recorded, dict) and family_of(recorded) == "cnn":  # the record is the CNN's config
        config = {**recorded, "img_size": tuple(recorded["img_size"])}
        state = {f"{CNN_PREFIX}{k}": v for k, v in checkpoint.contents.items()}
        return MAECheckpoint(str(checkpoint.path), "timm", state, config, family="cnn")
    args = record.get("model_args", {})
    hints = {k: args[k] for k in ("img_size", "num_heads") if k in args}
    hints.update({k: v for k, v in recorded.items() if k in ("layer_norm_eps", "norm_pix_loss", "target")})
    config, notes = infer_config(checkpoint.contents, hints, checkpoint.path)
    return MAECheckpoint(str(checkpoint.path), "timm", checkpoint.contents, config, notes)


def check(ckpt: MAECheckpoint) -> None:
    """Refuse an encoder that a timm ``VisionTransformer`` would compute differently.

    Raises:
        ConfigError: a LayerNorm eps other than timm's 1e-6, naming the value.
    """
    if ckpt.model_family.layer_norm_eps and ckpt.config["layer_norm_eps"] != 1e-6:
        raise ConfigError(
            f"{ckpt.source} uses LayerNorm eps {ckpt.config['layer_norm_eps']:g}; a timm ViT uses 1e-6, so "
            "its features would differ: use mae.load_backbone for this checkpoint instead"
        )


def write(ckpt: MAECheckpoint, out: Path) -> tuple[Path, Path]:
    """Write the encoder of ``ckpt`` as ``out`` (``.safetensors``) and its record as ``out`` with ``.json``,
    each to a temporary name first and then renamed, so an interrupted export leaves nothing half-written.

    Raises:
        ConfigError: ``out`` does not end in ``.safetensors``, or ``check`` refuses the encoder.
        InputError: a weight is NaN or infinite (``check_finite``).
    """
    if out.suffix != ".safetensors":
        raise ConfigError(f"export target {out} must end in .safetensors (or .onnx for an ONNX file)")
    check(ckpt)
    family = ckpt.model_family
    record = {
        "architecture": family.timm_architecture(ckpt.config),
        "model_args": family.timm_model_args(ckpt.config),
        "mae": {**ckpt.config, "img_size": list(ckpt.config["img_size"])},
        "source": ckpt.source,
        "source_format": ckpt.format,
    }
    sidecar = out.with_suffix(".json")
    state = ckpt.encoder_state_dict()
    state = ckpt.model_family.features_state(ckpt.config, state)  # a CNN classifier's head left out
    tensors = {k: v.detach().contiguous() for k, v in state.items()}
    check_finite(tensors, ckpt.source)
    atomic_write(out, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    atomic_write(sidecar, lambda tmp: tmp.write_text(json.dumps(record, indent=2)))
    return out, sidecar


FORMAT = CheckpointFormat(
    name="exported encoder (mae export --out OUT.safetensors)",
    format="timm",
    looks_for="a weights file with an X.json record beside it (architecture, model_args, mae, source)",
    detect=detect,
    read=read,
)
