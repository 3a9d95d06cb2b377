"""The ``safetensors`` target: the encoder as a plain timm ViT, ``OUT.safetensors`` and its ``OUT.json``
(``mae.convert.export.export_encoder`` from Python; the format: ``mae.convert.formats.exported_encoder``)."""

from dataclasses import dataclass, replace
from pathlib import Path

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.exports.base import ExportRequest, ExportTarget
from mae.convert.families import check_num_heads
from mae.convert.formats import exported_encoder
from mae.convert.sources import ema_checkpoint, read_checkpoint
from mae.io.outputs import Output


@dataclass(frozen=True)
class EncoderExport:
    weights: Path
    sidecar: Path
    architecture: str  # the timm model name the sidecar records
    notes: list[str]  # the checkpoint's load notes


def outputs(out: Path) -> list[Output]:
    ours = exported_encoder.is_exported_encoder
    return [
        Output(out, "--out", ours=ours),
        Output(out.with_suffix(".json"), "the JSON beside --out", ours=ours),
    ]


def encoder_checkpoint(
    source: str | Path, format: str = "auto", num_heads: int | None = None, ema: bool = False
) -> MAECheckpoint:
    """``source`` read as it is exported: ``num_heads`` set, the EMA weights with ``ema``
    (``mae.convert.sources.ema_checkpoint``)."""
    ckpt = read_checkpoint(source, format)
    if ema:
        ckpt = ema_checkpoint(ckpt)
    check_num_heads(ckpt, num_heads)
    if num_heads:
        ckpt = replace(ckpt, config={**ckpt.config, "num_heads": num_heads})
    return ckpt


def export(request: ExportRequest) -> EncoderExport:
    ckpt = encoder_checkpoint(
        request.checkpoint, request.checkpoint_format, request.num_heads, request.options.get("ema", False)
    )
    weights, sidecar = exported_encoder.write(ckpt, request.out)
    return EncoderExport(weights, sidecar, ckpt.model_family.timm_architecture(ckpt.config), list(ckpt.notes))


def describe(export: EncoderExport) -> list[str]:
    return [
        *(f"note: {note}" for note in export.notes),
        f"wrote {export.weights} and {export.sidecar}",
        f'load with timm alone: timm.create_model("{export.architecture}", pretrained=True, '
        f'pretrained_cfg_overlay=dict(file="{export.weights}"), **json.load(open("{export.sidecar}"))'
        '["model_args"])',
    ]


TARGET = ExportTarget(
    name="safetensors",
    suffix=".safetensors",
    options={"ema": False},
    applies="--out OUT.safetensors only",
    outputs=outputs,
    export=export,
    describe=describe,
)
