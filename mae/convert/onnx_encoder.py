"""The encoder as an ONNX file (``mae export --checkpoint CKPT --out OUT.onnx``; written and checked by
``mae.convert.onnx``).

The file computes the encoder's ``forward_features`` on every patch (no masking): ``pixels``
(N, C, H, W) float32 -> ``tokens`` (N, 1 + L, D), the cls token then the patch tokens in raster
order, after the final LayerNorm; or, with ``pool``, ``embedding`` (N, D) (2D for "both"), pooled
as ``mae.convert.pooling.pooled`` pools for kNN and the linear probe. How to prepare ``pixels`` (the
scaling, resize and crop, and the mean / std of the model's training data) is written into the
file's ``metadata_props`` (keys ``mae.*``) and ``doc_string``, so a runtime without Python knows how
to feed it.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from timm.layers import to_2tuple
from torch import nn

from mae.convert.backbone import load_backbone
from mae.convert.checkpoint import MAECheckpoint
from mae.convert.onnx import DEFAULT_ATOL, check_opset, write_onnx
from mae.convert.pooling import POOLS, Pool, encoder_family, pooled
from mae.convert.sources import read_checkpoint
from mae.data.views.normalize import check_statistics, normalization
from mae.errors import ConfigError

INPUT_NAME = "pixels"


class OnnxEncoder(nn.Module):
    """What the ONNX file computes: (N, C, H, W) normalised pixels -> (N, 1 + L, D) tokens, or the
    (N, D) embedding of ``pool`` (``mae.convert.pooling.pooled``)."""

    def __init__(self, backbone: nn.Module, pool: Pool | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.pool = pool
        self._encode = pooled(backbone, pool) if pool else backbone.forward_features

    @property
    def output_name(self) -> str:
        """The output's name: "embedding" pooled; else a ViT's "tokens", a CNN's "maps"."""
        if self.pool:
            return "embedding"
        return "maps" if encoder_family(self.backbone) == "cnn" else "tokens"

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self._encode(pixels)


@dataclass(frozen=True)
class InputStatistics:
    """The per-channel ``mean`` / ``std`` the file's input is normalised with, and where they come from
    (``how``: recorded in the checkpoint, ImageNet's, given at export)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    how: str

    @property
    def in_chans(self) -> int:
        return len(self.mean)


@dataclass
class OnnxExport:
    path: Path
    opset: int
    input_shape: list  # ints; "batch" for a dynamic batch
    output_shape: list
    differences: dict[int, float]  # batch size -> max abs difference of onnxruntime to torch
    metadata: dict[str, str]  # the file's metadata_props


def is_onnx_encoder(path: Path) -> bool:
    """Whether ``path`` is an ONNX file ``export_onnx`` wrote (its ``mae.*`` metadata_props)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # onnx raises its own DecodeError (and others) for a file that is not ONNX
        return False
    return any(prop.key == "mae.input" for prop in model.metadata_props)


def input_statistics(
    ckpt: MAECheckpoint, in_chans: int, mean: list[float] | None, std: list[float] | None
) -> InputStatistics:
    """The statistics to record: ``mean`` / ``std`` when given, else the checkpoint's ``mae_data`` record,
    else ImageNet's for a 3-channel model.

    Raises:
        ConfigError: not one value per channel, a std that is not positive, or a model of another channel
            count whose checkpoint records none.
    """
    if mean:
        given = InputStatistics(tuple(mean), tuple(std), "given at export")
    elif ckpt.data is not None:
        given = InputStatistics(
            tuple(ckpt.data["mean"]), tuple(ckpt.data["std"]), "recorded in the checkpoint"
        )
    elif in_chans != 3:
        raise ConfigError(f"{ckpt.source} does not record its data's mean and std: pass --mean and --std")
    else:
        given = InputStatistics(*normalization(3, None, None), "ImageNet's: the checkpoint records none")
    if len(given.mean) != in_chans or len(given.std) != in_chans:
        raise ConfigError(
            f"--mean and --std need {in_chans} values, one per input channel; got {len(given.mean)}"
        )
    check_statistics(given.mean, given.std, "the normalisation's mean / std")
    return given


def input_metadata(stats: InputStatistics, size: tuple[int, int], batch: str = "N") -> dict[str, str]:
    """The file's ``metadata_props`` on its input: what ``pixels`` must hold, in words and as JSON
    values. ``batch``: "N" for a file of any batch size, "1" for one that takes a single image."""
    height, width = size
    mean = ", ".join(f"{v:g}" for v in stats.mean)
    std = ", ".join(f"{v:g}" for v in stats.std)
    text = (
        f"{INPUT_NAME}: float32 ({batch}, {stats.in_chans}, {height}, {width}). From an image: take "
        f"{stats.in_chans} channel(s) (8-bit RGB for a 3-channel model); scale 8-bit values by 1/255 and "
        "16-bit values by 1/65535 (float data stays in its own units); resize so the short side is "
        f"{max(size)} pixels (bicubic, antialiased) and centre-crop {height}x{width}; then per channel c: (x "
        f"- mean[c]) / std[c] with mean = [{mean}], std = [{std}] ({stats.how})."
    )
    return {
        "mae.input": text,
        "mae.in_chans": str(stats.in_chans),
        "mae.img_size": json.dumps([height, width]),
        "mae.mean": json.dumps(list(stats.mean)),
        "mae.std": json.dumps(list(stats.std)),
        "mae.normalization_source": stats.how,
    }


def output_text(model: OnnxEncoder, dims: torch.Size, grid: tuple[int, int] | None, batch: str = "N") -> str:
    """The file's ``mae.output``: what its output holds, ``dims`` its shape without the ``batch``; ``grid``
    the ViT's patch grid, None for a CNN."""
    if grid is None:  # a CNN: its last map, or that map pooled
        if model.pool is None:
            return (
                f"{model.output_name}: float32 ({batch}, {dims[0]}, {dims[1]}, {dims[2]}): the CNN's last "
                f"feature map, {dims[0]} channels on a {dims[1]}x{dims[2]} grid (every cell, no masking)."
            )
        return (
            f"{model.output_name}: float32 ({batch}, {dims[0]}): the CNN's last feature map, pooled as timm "
            "pools it."
        )
    if model.pool is None:
        return (
            f"{model.output_name}: float32 ({batch}, {dims[0]}, {dims[1]}): the cls token, then the "
            f"{grid[0]}x{grid[1]} patch tokens in raster order, after the encoder's final LayerNorm (every "
            "patch, no masking)."
        )
    what = {
        "cls": "the cls token",
        "avg": "the mean of the patch tokens",
        "both": "the cls token and the mean of the patch tokens, side by side",
    }[model.pool]
    return f"{model.output_name}: float32 ({batch}, {dims[0]}): {what}, after the encoder's final LayerNorm."


def export_onnx(
    source: str | Path,
    out: str | Path,
    format: str = "auto",
    pool: Pool | None = None,
    dynamic_batch: bool = False,
    img_size: int | None = None,
    opset: int | None = None,
    atol: float = DEFAULT_ATOL,
    num_heads: int | None = None,
    mean: list[float] | None = None,
    std: list[float] | None = None,
) -> OnnxExport:
    """Write the encoder of ``source`` (any format ``load_backbone`` reads) to ``out`` (.onnx), checked
    with onnxruntime against torch on random inputs of batch 1 (and 3 with ``dynamic_batch``) first.

    Args:
        pool: None for every token (N, 1 + L, D); "cls", "avg" or "both" for the pooled embedding.
        dynamic_batch: a symbolic batch dimension; else the file takes batch 1 only.
        img_size: input size; the position embeddings are resampled as ``load_backbone`` does.
        opset: ONNX opset (``mae.convert.onnx.supported_opsets``); None: the exporter's default.
        atol: the largest max abs difference to torch accepted (fp32).
        mean, std: the input statistics to record; default: the checkpoint's record
            (``input_statistics``: ImageNet's for 3-channel files without one).

    Raises:
        ConfigError: a bad suffix, pool or opset, missing statistics, or a file that onnxruntime cannot
            load or that differs from torch by more than ``atol`` (``mae.convert.onnx.write_onnx``);
            nothing is then written at ``out``.
    """
    if Path(out).suffix != ".onnx":
        raise ConfigError(f"ONNX export target {out} must end in .onnx")
    if pool is not None and pool not in POOLS:
        raise ConfigError(f"--pool must be one of {', '.join(POOLS)}, got {pool!r}")
    check_opset(opset)  # before the checkpoint is read
    ckpt = read_checkpoint(source, format)
    backbone = load_backbone(ckpt, img_size=img_size, num_heads=num_heads).eval()
    if ckpt.family == "cnn":  # any input size: the one asked for, else the one it was trained at
        in_chans, size = ckpt.config["in_chans"], to_2tuple(img_size or ckpt.config["img_size"])
        grid = None
    else:
        in_chans, size = backbone.patch_embed.proj.in_channels, tuple(backbone.patch_embed.img_size)
        grid = backbone.patch_embed.grid_size
    stats = input_statistics(ckpt, in_chans, mean, std)
    model = OnnxEncoder(backbone, pool).eval()
    example = torch.randn(
        2 if dynamic_batch else 1, stats.in_chans, *size, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        dims = model(example[:1]).shape[1:]
    batch = "N" if dynamic_batch else "1"  # a file exported for batch 1 takes nothing else
    metadata = {
        **input_metadata(stats, size, batch),
        "mae.output": output_text(model, dims, grid, batch),
        "mae.pool": pool or "none",
        "mae.source": Path(source).name,
        "mae.source_format": ckpt.format,
    }
    doc = f"MAE encoder from {Path(source).name}. {metadata['mae.input']} {metadata['mae.output']}"
    written = write_onnx(
        model, out, example, INPUT_NAME, model.output_name, metadata, doc, dynamic_batch, opset, atol
    )
    batch = "batch" if dynamic_batch else 1
    shapes = [batch, stats.in_chans, *size], [batch, *dims]
    return OnnxExport(written.path, written.opset, *shapes, written.differences, metadata)


def describe(export: OnnxExport) -> list[str]:
    """Lines for the user: what was written, how well it agrees with torch, how to feed it."""
    output_name = export.metadata["mae.output"].split(":")[0]
    lines = [
        f"wrote {export.path} (opset {export.opset}): {INPUT_NAME} {export.input_shape} -> {output_name} "
        f"{export.output_shape}"
    ]
    for batch, diff in export.differences.items():
        lines.append(f"onnxruntime vs torch, batch {batch}: max abs difference {diff:.2e}")
    lines += [f"input: {export.metadata['mae.input']}", f"output: {export.metadata['mae.output']}"]
    lines.append("(both are in the file's metadata_props, keys mae.*)")
    return lines
