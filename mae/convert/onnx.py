"""Writing a model as an ONNX file that onnxruntime has checked against torch before it lands.

``write_onnx`` exports a module of one (N, C, H, W) input with ``torch.onnx.export(dynamo=True)``,
torch's default exporter since 2.9 (it needs ``onnxscript``): the older TorchScript exporter
(``dynamo=False``) still runs on torch 2.14 but warns that it will be removed, and it traces through
timm's Python-number shape arithmetic, where a batch size can be baked in silently; the dynamo
exporter records the batch dimension as a symbol and fails when the model would specialise it. The
file is then run by onnxruntime on seeded random inputs beside the module (``check_with_onnxruntime``)
and renamed into place only when the two agree. What the file holds for the encoder:
``mae.convert.onnx_encoder``.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mae.compat.torch import onnx_opset_range
from mae.errors import ConfigError
from mae.io.atomic import atomic_write

DEFAULT_ATOL = 1e-4  # fp32 agreement asked of onnxruntime against torch
MAX_ONNX_BYTES = 2**31 - 2**26  # one ONNX file (a protobuf) holds under 2 GiB; a margin for the graph


@dataclass
class OnnxFile:
    path: Path
    opset: int
    differences: dict[int, float]  # batch size -> max abs difference of onnxruntime to torch


def supported_opsets() -> tuple[int, int]:
    """(lowest, highest) ONNX opset the installed torch exporter writes natively: the opset its
    operator library (torchlib) is written in, up to torch's declared maximum. Below it the exporter
    tries a version converter that, when it fails, silently keeps its own opset."""
    return onnx_opset_range()


def check_opset(opset: int | None) -> None:
    """Raises ValueError naming ``opset`` and the installed exporter's range when it cannot write it."""
    if opset is None:
        return
    lowest, highest = supported_opsets()
    if not lowest <= opset <= highest:
        raise ConfigError(
            f"--opset {opset}: the installed ONNX exporter (torch {torch.__version__}) writes opsets "
            f"{lowest} to {highest}; choose one in that range (onnxruntime 1.14 and later read opset "
            f"{lowest})"
        )


def write_onnx(
    model: nn.Module,
    out: str | Path,
    example: torch.Tensor,
    input_name: str,
    output_name: str,
    metadata: dict[str, str],
    doc: str = "",
    dynamic_batch: bool = False,
    opset: int | None = None,
    atol: float = DEFAULT_ATOL,
    seed: int = 0,
) -> OnnxFile:
    """Export ``model`` ((N, C, H, W) ``input_name`` -> one tensor ``output_name``) to ``out`` (.onnx),
    with ``metadata`` as its ``metadata_props`` and ``doc`` as its ``doc_string``, after onnxruntime
    has run the file on seeded random inputs of batch 1 (and 3 with ``dynamic_batch``) within ``atol``
    of ``model``.

    Args:
        example: (N, C, H, W) an input of the shape to export (N = 2 with ``dynamic_batch``: torch's
            export specialises sizes 0 and 1).
        dynamic_batch: a symbolic batch dimension named "batch"; else the file takes N only.
        opset: ONNX opset (``supported_opsets``); None: the exporter's default.

    Raises:
        ValueError: a bad suffix or opset, weights over ONNX's 2 GB, or a file that onnxruntime cannot
            load or whose outputs differ from ``model``'s by more than ``atol``; nothing is then
            written at ``out``.
    """
    out = Path(out)
    _check_exportable(model, out, opset)
    model = model.eval()
    program = _export_program(model, example, input_name, output_name, dynamic_batch, opset)
    written_opset = program.model.opset_imports[""]
    if opset is not None and written_opset != opset:
        raise ConfigError(f"the exporter wrote opset {written_opset}, not the --opset {opset} asked for")
    program.model.metadata_props.update(metadata)
    program.model.doc_string = doc
    differences: dict[int, float] = {}

    def write_and_check(tmp: Path) -> None:
        program.save(tmp, external_data=False)
        differences.update(
            check_with_onnxruntime(model, tmp, (1, 3) if dynamic_batch else (len(example),), atol, seed)
        )

    atomic_write(out, write_and_check)
    return OnnxFile(out, written_opset, differences)


def _check_exportable(model: nn.Module, out: Path, opset: int | None) -> None:
    """Refuse, before the export, a path that is not ``.onnx``, an opset the exporter lacks, or weights
    over the 2 GiB one ONNX file holds."""
    if out.suffix != ".onnx":
        raise ConfigError(f"ONNX export target {out} must end in .onnx")
    check_opset(opset)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if weight_bytes > MAX_ONNX_BYTES:
        raise ConfigError(
            f"the weights take {weight_bytes / 2**30:.1f} GiB, over the 2 GiB one ONNX file holds; this "
            "command writes single files (a ViT-L encoder and smaller fit)"
        )


def _export_program(
    model: nn.Module,
    example: torch.Tensor,
    input_name: str,
    output_name: str,
    dynamic_batch: bool,
    opset: int | None,
) -> "torch.onnx.ONNXProgram":
    """torch's dynamo export of ``model`` on ``example``, the batch dimension a symbol with
    ``dynamic_batch``."""
    with torch.no_grad():
        return torch.onnx.export(
            model,
            (example,),
            input_names=[input_name],
            output_names=[output_name],
            opset_version=opset,
            dynamic_shapes=({0: torch.export.Dim("batch")},) if dynamic_batch else None,
            dynamo=True,
            external_data=False,
            verbose=False,
        )


def check_with_onnxruntime(
    model: Callable[[torch.Tensor], torch.Tensor],
    path: Path,
    batches: tuple[int, ...],
    atol: float = DEFAULT_ATOL,
    seed: int = 0,
) -> dict[int, float]:
    """{batch size: max abs difference} of onnxruntime's output for the ONNX file at ``path`` to
    ``model``'s ((N, C, H, W) -> output), on seeded standard-normal inputs (normalised pixels are
    about that).

    Raises:
        ValueError: onnxruntime cannot load the file, or a difference is over ``atol``.
    """
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own error types are not exceptions of this package
        raise ConfigError(
            f"onnxruntime {onnxruntime.__version__} cannot load the exported file ({err}); a lower --opset "
            "may be one it reads"
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
            raise ConfigError(
                f"onnxruntime's output differs from torch's by {differences[batch]:.3g} (max abs, batch "
                f"{batch}), over the {atol:g} allowed: the ONNX file was not written"
            )
    return differences


__all__ = [
    "DEFAULT_ATOL",
    "OnnxFile",
    "check_opset",
    "check_with_onnxruntime",
    "supported_opsets",
    "write_onnx",
]
