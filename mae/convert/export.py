"""Export a pretrained encoder as a plain timm ViT: ``export_encoder`` writes ``OUT.safetensors`` (a timm
``VisionTransformer`` state dict) and ``OUT.json`` (its timm model arguments), the format of
``mae.convert.formats.exported_encoder``. Anyone with timm alone can then build the encoder::

    args = json.load(open("OUT.json"))
    model = timm.create_model(args["architecture"], pretrained=True,
                              pretrained_cfg_overlay=dict(file="OUT.safetensors"), **args["model_args"])

``model_args`` has ``num_classes=0`` (features only); for a classifier pass
``**{**args["model_args"], "num_classes": 10, "global_pool": "avg"}``. ``mae export`` reaches it as the
``safetensors`` target (``mae.convert.exports.targets``).
"""

from dataclasses import replace
from pathlib import Path

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.formats import exported_encoder
from mae.convert.sources import ema_checkpoint, read_checkpoint


def export_encoder(
    source: str | Path, out: str | Path, format: str = "auto", num_heads: int | None = None, ema: bool = False
) -> tuple[Path, Path]:
    """Write the encoder of ``source`` as ``out`` (safetensors) and ``out`` with ``.json`` (timm arguments).

    ``num_heads`` overrides the head count for files that do not record it; ``ema``: the EMA weights of a
    ``mae finetune --ema.decay`` checkpoint instead of its live ones (``mae.convert.sources.ema_checkpoint``).

    Both files are written to temporary names first and renamed, so an interrupted export leaves
    nothing half-written.

    Raises:
        ConfigError: ``out`` does not end in ``.safetensors``, or a LayerNorm eps timm does not use.
        InputError: no EMA weights with ``ema``, or NaN / infinite weights, naming the file.
    """
    return exported_encoder.write(encoder_checkpoint(source, format, num_heads, ema), Path(out))


def encoder_checkpoint(
    source: str | Path, format: str = "auto", num_heads: int | None = None, ema: bool = False
) -> MAECheckpoint:
    """``source`` read as ``export_encoder`` exports it: ``num_heads`` set, the EMA weights with ``ema``."""
    ckpt = read_checkpoint(source, format)
    if ema:
        ckpt = ema_checkpoint(ckpt)
    if num_heads:
        ckpt = replace(ckpt, config={**ckpt.config, "num_heads": num_heads})
    return ckpt
