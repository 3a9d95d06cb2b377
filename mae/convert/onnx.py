"""The encoder as an ONNX file (``python -m mae.export CHECKPOINT OUT.onnx``), checked with onnxruntime.

The file computes the encoder's ``forward_features`` on every patch (no masking): ``pixels``
(N, C, H, W) float32 -> ``tokens`` (N, 1 + L, D), the cls token then the patch tokens in raster
order, after the final LayerNorm; or, with ``pool``, ``embedding`` (N, D) (``2D`` for "both"), pooled
as ``mae.eval.features.pooled`` pools for kNN and the linear probe. How to prepare ``pixels`` (the
scaling, resize and crop, and the mean / std of the model's training data) is written into the
file's ``metadata_props`` and ``doc_string``, so a runtime without Python knows how to feed it.

Exporter: ``torch.onnx.export(dynamo=True)``, torch's default since 2.9 (it needs ``onnxscript``).
The older TorchScript exporter (``dynamo=False``) still runs on torch 2.14 but warns that it will be
removed, and it traces through timm's Python-number shape arithmetic, where a batch size can be
baked in silently; the dynamo exporter records the batch dimension as a symbol (``--dynamic-batch``)
and fails when the model would specialise it.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mae.convert.backbone import load_backbone
from mae.convert.sources import read_checkpoint
from mae.eval.features import POOLS, Pool, pooled
from mae.eval.own_images import Normalization
from mae.io.atomic import atomic_write

INPUT_NAME = "pixels"
DEFAULT_ATOL = 1e-4  # fp32 agreement asked of onnxruntime against torch
MAX_ONNX_BYTES = 2**31 - 2**26  # one ONNX file (a protobuf) holds under 2 GiB; a margin for the graph


class OnnxEncoder(nn.Module):
    """What the ONNX file computes: (N, C, H, W) normalised pixels -> (N, 1 + L, D) tokens, or the
    (N, D) embedding of ``pool`` (``mae.eval.features.pooled``)."""

    def __init__(self, backbone: nn.Module, pool: Pool | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.pool = pool
        self._encode = pooled(backbone, pool) if pool else backbone.forward_features

    @property
    def output_name(self) -> str:
        return "embedding" if self.pool else "tokens"

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self._encode(pixels)


@dataclass
class OnnxExport:
    path: Path
    opset: int
    input_shape: list  # ints, "batch" for a dynamic batch
    output_shape: list
    differences: dict[int, float]  # batch size -> max abs difference of onnxruntime to torch
    metadata: dict[str, str]  # the file's metadata_props


def supported_opsets() -> tuple[int, int]:
    """(lowest, highest) ONNX opset the installed torch exporter writes natively: the opset its
    operator library (torchlib) is written in, up to torch's declared maximum. Below it the exporter
    tries a version converter that, when it fails, silently keeps its own opset."""
    from torch.onnx import _constants  # private: torch has no public name for these

    try:
        from torch.onnx._internal.exporter._constants import TORCHLIB_OPSET as lowest
    except ImportError:  # older or newer layout: the opset torch 2.5-2.14 implement
        lowest = 18
    return lowest, _constants.ONNX_MAX_OPSET


def check_opset(opset: int | None) -> None:
    """Raises ValueError naming ``opset`` and the installed exporter's range when it cannot write it."""
    if opset is None:
        return
    lowest, highest = supported_opsets()
    if not lowest <= opset <= highest:
        raise ValueError(
            f"--opset {opset}: the installed ONNX exporter (torch {torch.__version__}) writes opsets {lowest} to "
            f"{highest}; choose one in that range (onnxruntime 1.14 and later read opset {lowest})"
        )


def input_metadata(norm: Normalization, size: tuple[int, int], how: str) -> dict[str, str]:
    """The file's ``metadata_props`` on its input: what ``pixels`` must hold, in words and as JSON values.

    ``how``: where the mean / std come from (recorded in the checkpoint, ImageNet's, given)."""
    height, width = size
    mean = ", ".join(f"{v:g}" for v in norm.mean)
    std = ", ".join(f"{v:g}" for v in norm.std)
    text = (
        f"{INPUT_NAME}: float32 (N, {norm.in_chans}, {height}, {width}). From an image: take {norm.in_chans} "
        f"channel(s) (8-bit RGB for a 3-channel model); scale 8-bit values by 1/255 and 16-bit values by 1/65535 "
        f"(float data stays in its own units); resize so the short side is {max(size)} pixels (bicubic, "
        f"antialiased) and centre-crop {height}x{width}; then per channel c: (x - mean[c]) / std[c] with "
        f"mean = [{mean}], std = [{std}] ({how})."
    )
    return {
        "mae.input": text,
        "mae.in_chans": str(norm.in_chans),
        "mae.img_size": json.dumps([height, width]),
        "mae.mean": json.dumps(list(norm.mean)),
        "mae.std": json.dumps(list(norm.std)),
        "mae.normalization_source": how,
    }


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
    seed: int = 0,
) -> OnnxExport:
    """Write the encoder of ``source`` (any format ``load_backbone`` reads) to ``out`` (.onnx), after
    checking the written file with onnxruntime against torch on seeded random inputs of batch 1 (and
    3 with ``dynamic_batch``).

    Args:
        pool: None for every token (N, 1 + L, D); "cls", "avg" or "both" for the pooled embedding.
        dynamic_batch: a symbolic batch dimension; else the file takes batch 1 only.
        img_size: input size; the position embeddings are resampled as ``load_backbone`` does.
        opset: ONNX opset (``supported_opsets``); None: the exporter's default.
        atol: the largest max abs difference to torch accepted (fp32).
        mean, std: the input statistics to record; default: the checkpoint's record
            (``Normalization.of``: ImageNet's for 3-channel files without one).

    Raises:
        ValueError: a bad suffix, pool or opset, missing statistics, a model over ONNX's 2 GB, or a
            file that onnxruntime cannot load or whose outputs differ from torch's by more than
            ``atol``; then nothing is written at ``out``.
    """
    import onnx  # noqa: F401  (the extra's packages: fail here, before the checkpoint is read)
    import onnxruntime  # noqa: F401
    import onnxscript  # noqa: F401

    out = Path(out)
    if out.suffix != ".onnx":
        raise ValueError(f"ONNX export target {out} must end in .onnx")
    if pool is not None and pool not in POOLS:
        raise ValueError(f"--pool must be one of {', '.join(POOLS)}, got {pool!r}")
    check_opset(opset)
    ckpt = read_checkpoint(source, format)
    backbone = load_backbone(ckpt, img_size=img_size, num_heads=num_heads).eval()
    in_chans, size = backbone.patch_embed.proj.in_channels, tuple(backbone.patch_embed.img_size)
    if mean:
        norm, how = Normalization(in_chans, tuple(mean), tuple(std)), "given at export"
    else:
        norm = Normalization.of(ckpt.data, in_chans, str(source))
        how = "recorded in the checkpoint" if ckpt.data else "ImageNet's: the checkpoint records none"
    if len(norm.mean) != in_chans or len(norm.std) != in_chans:
        raise ValueError(f"--mean and --std need {in_chans} values, one per input channel; got {len(norm.mean)}")
    weight_bytes = sum(p.numel() * p.element_size() for p in backbone.parameters())
    if weight_bytes > MAX_ONNX_BYTES:
        raise ValueError(
            f"{source}: the encoder's weights take {weight_bytes / 2**30:.1f} GiB, over the 2 GiB one ONNX file "
            f"holds; this command writes single files (ViT-L and smaller fit)"
        )
    model = OnnxEncoder(backbone, pool).eval()
    example = torch.randn(2 if dynamic_batch else 1, in_chans, *size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        program = torch.onnx.export(
            model, (example,), input_names=[INPUT_NAME], output_names=[model.output_name], opset_version=opset,
            dynamic_shapes={INPUT_NAME: {0: torch.export.Dim("batch")}} if dynamic_batch else None,
            dynamo=True, external_data=False, verbose=False,
        )  # fmt: skip
    written_opset = program.model.opset_imports[""]
    if opset is not None and written_opset != opset:
        raise ValueError(f"the exporter wrote opset {written_opset}, not the --opset {opset} asked for")
    output_dim = model(example[:1]).shape[1:]
    batch = "batch" if dynamic_batch else 1
    metadata = {
        **input_metadata(norm, size, how),
        "mae.output": _output_text(model, output_dim, backbone.patch_embed.grid_size),
        "mae.pool": pool or "none",
        "mae.source": Path(source).name,
        "mae.source_format": ckpt.format,
    }
    program.model.metadata_props.update(metadata)
    program.model.doc_string = f"MAE encoder from {Path(source).name}. {metadata['mae.input']} {metadata['mae.output']}"
    differences: dict[int, float] = {}

    def write_and_check(tmp: Path) -> None:
        program.save(tmp, external_data=False)
        differences.update(check_with_onnxruntime(model, tmp, (1, 3) if dynamic_batch else (1,), atol, seed))

    atomic_write(out, write_and_check)
    return OnnxExport(out, written_opset, [batch, in_chans, *size], [batch, *output_dim], differences, metadata)


def _output_text(model: OnnxEncoder, dims: torch.Size, grid: tuple[int, int]) -> str:
    if model.pool is None:
        return (
            f"{model.output_name}: float32 (N, {dims[0]}, {dims[1]}): the cls token, then the {grid[0]}x{grid[1]} "
            f"patch tokens in raster order, after the encoder's final LayerNorm (every patch, no masking)."
        )
    what = {"cls": "the cls token", "avg": "the mean of the patch tokens",
            "both": "the cls token and the mean of the patch tokens, side by side"}[model.pool]  # fmt: skip
    return f"{model.output_name}: float32 (N, {dims[0]}): {what}, after the encoder's final LayerNorm."


def check_with_onnxruntime(
    model: Callable[[torch.Tensor], torch.Tensor],
    path: Path,
    batches: tuple[int, ...],
    atol: float = DEFAULT_ATOL,
    seed: int = 0,
) -> dict[int, float]:
    """{batch size: max abs difference} of onnxruntime's output for the ONNX file at ``path`` to
    ``model``'s ((N, C, H, W) -> outputs), on seeded standard-normal inputs (normalised pixels are about that).

    Raises:
        ValueError: onnxruntime cannot load the file, or a difference is over ``atol``.
    """
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own error types are not exceptions of this package
        raise ValueError(
            f"onnxruntime {onnxruntime.__version__} cannot load the exported file ({err}); a lower --opset may "
            f"be one it reads"
        ) from err
    (inp,) = session.get_inputs()
    generator = torch.Generator().manual_seed(seed)
    differences = {}
    for batch in batches:
        pixels = torch.randn(batch, *inp.shape[1:], generator=generator)
        with torch.no_grad():
            expected = model(pixels).numpy()
        (got,) = session.run(None, {inp.name: pixels.numpy()})
        differences[batch] = float(np.abs(got - expected).max())
        if not differences[batch] <= atol:  # NaN fails too
            raise ValueError(
                f"onnxruntime's output differs from torch's by {differences[batch]:.3g} (max abs, batch {batch}), "
                f"over the {atol:g} allowed: the ONNX file was not written"
            )
    return differences


def describe(export: OnnxExport) -> list[str]:
    """Lines for the user: what was written, how well it agrees with torch, how to feed it."""
    lines = [f"wrote {export.path} (opset {export.opset}): {INPUT_NAME} {export.input_shape} -> "
             f"{export.metadata['mae.output'].split(':')[0]} {export.output_shape}"]  # fmt: skip
    for batch, diff in export.differences.items():
        lines.append(f"onnxruntime vs torch, batch {batch}: max abs difference {diff:.2e}")
    lines += [f"input: {export.metadata['mae.input']}", f"output: {export.metadata['mae.output']}"]
    lines.append("(both are in the file's metadata_props, keys mae.*)")
    return lines


__all__ = ["OnnxEncoder", "OnnxExport", "check_opset", "describe", "export_onnx", "supported_opsets"]
