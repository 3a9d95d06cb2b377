"""Export a pretrained encoder as a plain timm ViT: ``export_encoder`` writes ``OUT.safetensors`` (a timm
``VisionTransformer`` state dict) and ``OUT.json`` (its timm model arguments), the format of
``mae.convert.formats.exported_encoder``. Anyone with timm alone can then build the encoder::

    args = json.load(open("OUT.json"))
    model = timm.create_model(args["architecture"], pretrained=True,
                              pretrained_cfg_overlay=dict(file="OUT.safetensors"), **args["model_args"])

``model_args`` has ``num_classes=0`` (features only); for a classifier pass
``**{**args["model_args"], "num_classes": 10, "global_pool": "avg"}``. It is the ``safetensors`` row of
the export targets' table (``mae.convert.exports.targets``), as ``mae export --out OUT.safetensors`` is.
"""

from pathlib import Path

from mae.convert.exports.base import ExportRequest
from mae.convert.exports.targets import EXPORT_TARGETS


def export_encoder(
    source: str | Path, out: str | Path, format: str = "auto", num_heads: int | None = None, ema: bool = False
) -> tuple[Path, Path]:
    """Write the encoder of ``source`` as ``out`` (safetensors) and ``out`` with ``.json`` (timm arguments):
    the ``safetensors`` target of ``mae.convert.exports.targets`` (``mae.convert.exports.safetensors``).

    ``num_heads`` overrides the head count for files that do not record it; ``ema``: the EMA weights of a
    ``mae finetune --ema.decay`` checkpoint instead of its live ones (``mae.convert.sources.ema_checkpoint``).

    Both files are written to temporary names first and renamed, so an interrupted export leaves
    nothing half-written.

    Raises:
        ConfigError: ``out`` does not end in ``.safetensors``, or a LayerNorm eps timm does not use.
        InputError: no EMA weights with ``ema``, or NaN / infinite weights, naming the file.
    """
    target = EXPORT_TARGETS["safetensors"]
    request = ExportRequest(str(source), Path(out), format, num_heads, {"ema": ema})
    target.check(request)
    export = target.export(request)
    return export.weights, export.sidecar
