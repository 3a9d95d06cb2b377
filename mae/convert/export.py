"""Export a pretrained encoder as a plain timm ViT (``mae export --checkpoint CKPT --out OUT.safetensors``).

Writes ``OUT.safetensors`` (a timm ``VisionTransformer`` state dict) and ``OUT.json`` (its timm model
arguments). Anyone with timm alone can then build the encoder::

    args = json.load(open("OUT.json"))
    model = timm.create_model(args["architecture"], pretrained=True,
                              pretrained_cfg_overlay=dict(file="OUT.safetensors"), **args["model_args"])

``model_args`` has ``num_classes=0`` (features only); for a classifier pass
``**{**args["model_args"], "num_classes": 10, "global_pool": "avg"}``.
"""

import json
from pathlib import Path

import timm
from safetensors.torch import save_file

from mae.convert.backbone import vit_args
from mae.convert.sources import check_finite, ema_checkpoint, read_checkpoint
from mae.errors import ConfigError
from mae.io.atomic import atomic_write

# timm names of the standard widths/depths; any other shape is built from a base name plus model_args.
_TIMM_NAMES = {
    (192, 12): "vit_tiny",
    (384, 12): "vit_small",
    (768, 12): "vit_base",
    (1024, 24): "vit_large",
    (1280, 32): "vit_huge",
}


def timm_architecture(config: dict) -> str:
    """A registered timm model name for the encoder (``model_args`` still set every dimension)."""
    size = _TIMM_NAMES.get((config["embed_dim"], config["depth"]), "vit_base")
    name = f"{size}_patch{config['patch_size']}_224"
    return name if name in timm.list_models(name) else "vit_base_patch16_224"


def is_exported_encoder(path: Path) -> bool:
    """Whether ``path`` (``X.safetensors`` or its ``X.json``) is an encoder this module exported: the JSON
    beside the weights holds its record (architecture, timm arguments, the MAE configuration)."""
    try:
        meta = json.loads(Path(path).with_suffix(".json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and {"architecture", "model_args", "mae", "source"} <= meta.keys()


def export_encoder(
    source: str | Path, out: str | Path, format: str = "auto", num_heads: int | None = None, ema: bool = False
) -> tuple[Path, Path]:
    """Write the encoder of ``source`` as ``out`` (safetensors) and ``out`` with ``.json`` (timm arguments).

    ``num_heads`` overrides the head count for files that do not record it; ``ema``: the EMA weights of a
    ``mae finetune --ema.decay`` checkpoint instead of its live ones (``mae.convert.sources.ema_checkpoint``).

    Both files are written to temporary names first and renamed, so an interrupted export leaves
    nothing half-written.
    """
    ckpt = read_checkpoint(source, format)
    if ema:
        ckpt = ema_checkpoint(ckpt)
    out = Path(out)
    if out.suffix != ".safetensors":
        raise ConfigError(f"export target {out} must end in .safetensors (or .onnx for an ONNX file)")
    config = {**ckpt.config, **({"num_heads": num_heads} if num_heads else {})}
    if config["layer_norm_eps"] != 1e-6:
        raise ConfigError(
            f"{source} uses LayerNorm eps {config['layer_norm_eps']:g}; a timm ViT uses 1e-6, so its "
            "features would differ: use mae.load_backbone for this checkpoint instead"
        )
    model_args = vit_args(config)
    model_args.update(img_size=list(model_args["img_size"]), num_classes=0)  # a backbone: no head
    meta = {
        "architecture": timm_architecture(config),
        "model_args": model_args,
        "mae": {**config, "img_size": list(config["img_size"])},
        "source": str(source),
        "source_format": ckpt.format,
    }
    sidecar = out.with_suffix(".json")
    tensors = {k: v.detach().contiguous() for k, v in ckpt.encoder_state_dict().items()}
    check_finite(tensors, ckpt.source)
    atomic_write(out, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    atomic_write(sidecar, lambda tmp: tmp.write_text(json.dumps(meta, indent=2)))
    return out, sidecar
