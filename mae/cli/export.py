"""``mae export --checkpoint CKPT --out OUT.safetensors`` (the encoder as a plain timm ViT + its arguments)
or ``mae export --checkpoint CKPT --out OUT.onnx`` (the encoder as ONNX, checked with onnxruntime): the
output's suffix chooses the kind; ``--checkpoint-format`` names the checkpoint's format.
``mae export --checkpoint CKPT --to timm|huggingface --out DIR`` writes a folder timm or transformers loads,
with its model card (``mae.convert.folders``)."""

import importlib
import json
import math
from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_option, argparse_float, argparse_int
from mae.convert.export import export_encoder, is_exported_encoder
from mae.convert.folders import TARGETS, export_folder, is_export_folder
from mae.convert.sources import FORMATS, read_checkpoint
from mae.errors import ConfigError, UsageError
from mae.eval.features import POOLS
from mae.io.outputs import Output, check_outputs

COMMAND = "mae.export"

# Options of the ONNX output only, with their defaults (a .safetensors export refuses them).
ONNX_OPTIONS = {
    "pool": None,
    "dynamic_batch": False,
    "img_size": None,
    "opset": None,
    "atol": None,
    "mean": None,
    "std": None,
}


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae export",
        "Export a pretrained encoder: --out OUT.safetensors writes a plain timm ViT (safetensors + a JSON "
        "of its timm arguments); --out OUT.onnx writes an ONNX file of the encoder, checked with "
        "onnxruntime against torch; --to timm|huggingface --out DIR writes a folder timm or Hugging Face "
        "transformers loads, with a README.md model card.",
    )
    add_option(parser, "checkpoint", "the encoder", required=True)
    add_option(
        parser,
        "out",
        "OUT.safetensors (a .json with the timm arguments is written beside it), OUT.onnx, or with --to "
        "a folder",
        type=str,
        required=True,
    )
    add_option(parser, "checkpoint_format", "--out's suffix sets the output's", choices=FORMATS)
    parser.add_argument(
        "--num-heads", type=argparse_int, default=None, help="attention heads, for files that do not say"
    )
    parser.add_argument(
        "--ema",
        action="store_true",
        help="export the EMA weights of a mae finetune --ema.decay checkpoint (OUT.safetensors only)",
    )
    folders = parser.add_argument_group("folder output (--to)")
    folders.add_argument(
        "--to",
        choices=TARGETS,
        default=None,
        help="write --out as a folder: timm's hub layout (config.json + model.safetensors, for "
        'timm.create_model("local-dir:DIR", pretrained=True)) or a Hugging Face transformers ViTMAE '
        "folder (ViTMAEForPreTraining when the checkpoint has a decoder, else ViTMAEModel, and its image "
        "processor); each with a README.md model card",
    )
    folders.add_argument(
        "--encoder-only",
        action="store_true",
        help="--to huggingface: the encoder alone (ViTMAEModel) even when the checkpoint has a decoder",
    )
    onnx = parser.add_argument_group("ONNX output (--out OUT.onnx; needs the onnx extra)")
    onnx.add_argument(
        "--pool",
        choices=POOLS,
        default=None,
        help="output the pooled embedding (N, D) as kNN / the probe pool it: cls token, mean of the "
        "patch tokens, or both side by side (default: every token, (N, 1 + L, D))",
    )
    onnx.add_argument("--dynamic-batch", action="store_true", help="any batch size (default: batch 1)")
    add_option(onnx, "img_size", "default: the checkpoint's; position embeddings are resampled")
    onnx.add_argument("--opset", type=argparse_int, default=None, help="ONNX opset (default: the exporter's)")
    onnx.add_argument(
        "--atol",
        type=argparse_float,
        default=None,
        help="largest max abs difference of onnxruntime to torch accepted (default: 1e-4)",
    )
    add_option(onnx, "mean", "recorded in the file (default: the checkpoint's record)")
    add_option(onnx, "std", "recorded in the file (default: the checkpoint's record)")
    return parser


def run(args: Namespace):
    """Write the export the suffix of ``args.out`` names. Returns (weights, sidecar) for safetensors,
    the ``OnnxExport`` for ONNX.

    Raises:
        UsageError: ONNX options for a .safetensors output, --mean without --std, a size below 1.
    """
    if args.ema and (args.to is not None or Path(args.out).suffix == ".onnx"):
        raise UsageError("--ema: for --out OUT.safetensors only; export the EMA weights there")
    if args.to is not None:
        return run_folder(args)
    if args.encoder_only:
        raise UsageError("--encoder-only: for --to huggingface only")
    if Path(args.out).suffix == ".onnx":
        return run_onnx(args)
    given = [f"--{name.replace('_', '-')}" for name, default in ONNX_OPTIONS.items() if args[name] != default]
    if given:
        raise UsageError(
            f"{', '.join(given)}: for ONNX output only (an --out ending in .onnx); leave out for .safetensors"
        )
    if Path(args.out).suffix != ".safetensors":
        raise UsageError(
            f"--out must end in .safetensors (a timm ViT) or .onnx (an ONNX file), got {args.out}"
        )
    out = Path(args.out)
    check_outputs(
        COMMAND,
        [
            Output(out, "--out", ours=is_exported_encoder),
            Output(out.with_suffix(".json"), "the JSON beside --out", ours=is_exported_encoder),
        ],
        [args.checkpoint],
    )
    weights, sidecar = export_encoder(
        args.checkpoint, args.out, args.checkpoint_format, args.num_heads, ema=args.ema
    )
    for note in read_checkpoint(args.checkpoint, args.checkpoint_format).notes:
        print(f"note: {note}")
    meta = json.loads(Path(sidecar).read_text())
    print(f"wrote {weights} and {sidecar}")
    print(
        f'load with timm alone: timm.create_model("{meta["architecture"]}", pretrained=True, '
        f'pretrained_cfg_overlay=dict(file="{weights}"), **json.load(open("{sidecar}"))["model_args"])'
    )
    return weights, sidecar


def run_folder(args: Namespace):
    """``--to timm|huggingface``: the folder ``args.out`` with its model card. Returns the
    ``FolderExport``."""
    given = [f"--{name.replace('_', '-')}" for name, default in ONNX_OPTIONS.items() if args[name] != default]
    if given:
        raise UsageError(f"{', '.join(given)}: for ONNX output only (an --out ending in .onnx), not --to")
    if args.encoder_only and args.to != "huggingface":
        raise UsageError("--encoder-only: for --to huggingface only (a timm folder is always the encoder)")
    out = Path(args.out)
    if out.suffix in (".safetensors", ".onnx"):
        raise UsageError(f"--to {args.to} writes a folder: give --out a folder path, not {out}")
    check_outputs(COMMAND, [Output(out, "--out", "folder", is_export_folder)], [args.checkpoint])
    export = export_folder(
        args.checkpoint, out, args.to, args.checkpoint_format, args.encoder_only, args.num_heads
    )
    for note in export.notes:
        print(f"note: {note}")
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    what = "encoder and decoder" if export.has_decoder else "encoder"
    print(f"wrote the {what} to {out}/ ({files})")
    if args.to == "timm":
        print(f'load with timm: timm.create_model("local-dir:{out}", pretrained=True)')
    else:
        cls = "ViTMAEForPreTraining" if export.has_decoder else "ViTMAEModel"
        print(f'load with transformers: {cls}.from_pretrained("{out}")')
    print(f"upload: hf upload USER/REPO {out} .")
    return export


def run_onnx(args: Namespace):
    if (args.mean is None) != (args.std is None):
        raise UsageError("give --mean and --std together")
    if args.img_size is not None and args.img_size < 1:
        raise UsageError(f"--img-size must be a positive number of pixels, got {args.img_size}")
    if args.atol is not None and not (math.isfinite(args.atol) and args.atol >= 0):
        raise UsageError(f"--atol must be a finite difference >= 0 (default 1e-4), got {args.atol}")
    for package in ("onnx", "onnxscript", "onnxruntime"):
        try:
            importlib.import_module(package)
        except ImportError as err:
            raise ConfigError(f'ONNX export needs the onnx extra: pip install -e ".[onnx]" ({err})') from None
    from mae.apps.onnx_encoder import describe, export_onnx, is_onnx_encoder
    from mae.convert.onnx import DEFAULT_ATOL

    check_outputs(COMMAND, [Output(Path(args.out), "--out", ours=is_onnx_encoder)], [args.checkpoint])
    export = export_onnx(
        args.checkpoint,
        args.out,
        args.checkpoint_format,
        args.pool,
        args.dynamic_batch,
        args.img_size,
        args.opset,
        DEFAULT_ATOL if args.atol is None else args.atol,
        args.num_heads,
        args.mean,
        args.std,
    )
    print("\n".join(describe(export)))
    return export


def main(argv: list[str] | None = None):
    return parse_and_run(build_parser(), run, argv)
