"""The ``onnx`` target: the encoder as one ONNX file, run by onnxruntime against torch before it lands
(``mae.convert.onnx_encoder.export_onnx``). Needs the ``onnx`` extra."""

import importlib
import math
from pathlib import Path

from mae.convert.exports.base import ExportRequest, ExportTarget
from mae.convert.onnx import DEFAULT_ATOL
from mae.convert.onnx_encoder import OnnxExport, describe, export_onnx, is_onnx_encoder
from mae.errors import ConfigError, UsageError
from mae.io.outputs import Output

OPTIONS = {
    "pool": None,
    "dynamic_batch": False,
    "img_size": None,
    "opset": None,
    "atol": None,
    "mean": None,
    "std": None,
}
EXTRA = ("onnx", "onnxscript", "onnxruntime")


def check(request: ExportRequest) -> None:
    """Refuse the options' values that cannot make a file, and a missing ``onnx`` extra.

    Raises:
        UsageError: a tolerance that is not finite and >= 0 (``mae export``'s parser checks --img-size,
            --mean and --std: ``mae.cli.command_options``).
        ConfigError: a package of the extra is not installed, naming it.
    """
    atol = request.options.get("atol")
    if atol is not None and not (math.isfinite(atol) and atol >= 0):
        raise UsageError(f"--atol must be a finite difference >= 0 (default 1e-4), got {atol}")
    for package in EXTRA:
        try:
            importlib.import_module(package)
        except ImportError as err:
            raise ConfigError(f'ONNX export needs the onnx extra: pip install -e ".[onnx]" ({err})') from None


def outputs(out: Path) -> list[Output]:
    return [Output(out, "--out", ours=is_onnx_encoder)]


def export(request: ExportRequest) -> OnnxExport:
    options = {**OPTIONS, **request.options}
    return export_onnx(
        request.checkpoint,
        request.out,
        request.checkpoint_format,
        options["pool"],
        options["dynamic_batch"],
        options["img_size"],
        options["opset"],
        DEFAULT_ATOL if options["atol"] is None else options["atol"],
        request.num_heads,
        options["mean"],
        options["std"],
    )


TARGET = ExportTarget(
    name="onnx",
    suffix=".onnx",
    options=OPTIONS,
    applies="ONNX output only (an --out ending in .onnx)",
    outputs=outputs,
    export=export,
    describe=describe,
    check=check,
)
