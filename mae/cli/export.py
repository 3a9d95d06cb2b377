"""``mae export --checkpoint CKPT --out OUT``: the encoder as one of the targets of
``mae.convert.exports.targets`` (a plain timm model ``.safetensors``, an ONNX file checked with onnxruntime,
a timm or Hugging Face folder with its model card). ``--to`` names the target; ``--out x.safetensors`` and
``--out x.onnx`` are shorthands for ``--to safetensors`` and ``--to onnx``."""

from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_checkpoint, add_option, argparse_float, argparse_int
from mae.convert.exports.base import ExportRequest
from mae.convert.exports.targets import EXPORT_TARGETS, TARGET_OPTIONS, check_options, choose_target
from mae.convert.pooling import POOLS
from mae.convert.sources import FORMATS
from mae.io.outputs import check_outputs

COMMAND = "mae.export"

# The options of one target only (``ExportTarget.options``), by group: (flags, argparse settings).
TARGET_FLAGS = {
    "safetensors (--out OUT.safetensors)": {
        "ema": ("export the EMA weights of a mae finetune --ema.decay checkpoint", {"action": "store_true"}),
    },
    "Hugging Face folder (--to huggingface)": {
        "encoder_only": (
            "the encoder alone (ViTMAEModel) even when the checkpoint has a decoder or a classifier's head",
            {"action": "store_true"},
        ),
    },
    "ONNX (--out OUT.onnx; needs the onnx extra)": {
        "pool": (
            "output the pooled embedding (N, D) as kNN / the probe pool it: cls token, mean of the patch "
            "tokens, or both side by side (default: every token, (N, 1 + L, D)); a CNN: avg, its last map's "
            "mean (default: the map, (N, C, h, w))",
            {"choices": POOLS, "default": None},
        ),
        "dynamic_batch": ("any batch size (default: batch 1)", {"action": "store_true"}),
        "opset": ("ONNX opset (default: the exporter's)", {"type": argparse_int, "default": None}),
        "atol": (
            "largest max abs difference of onnxruntime to torch accepted (default: 1e-4)",
            {"type": argparse_float, "default": None},
        ),
    },
}
# Shared options (``mae.cli.command_options``: their values checked by the parser) that are the ONNX
# target's own here.
ONNX_SHARED = {
    "img_size": "position embeddings are resampled",
    "mean": "recorded in the file",
    "std": "recorded in the file",
}


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae export",
        "Export a pretrained encoder: --to safetensors (or --out OUT.safetensors) writes a plain timm model "
        "(a ViT, or a CNN checkpoint's timm CNN itself: safetensors + a JSON of its timm arguments); --to "
        "onnx (or --out OUT.onnx) an ONNX file of the encoder, checked with onnxruntime against torch; --to "
        "timm|huggingface --out DIR a folder timm or Hugging Face transformers loads, with a README.md model "
        "card.",
    )
    add_checkpoint(parser, FORMATS, "the encoder", required=True)
    out_help = (
        "a file (.safetensors, .onnx) or, for a folder target, a folder (a link to one is written through)"
    )
    add_option(parser, "out", out_help, type=str, required=True)
    parser.add_argument(
        "--to",
        choices=list(EXPORT_TARGETS),
        default=None,
        help="what to write; left out, --out's suffix chooses",
    )
    parser.add_argument(
        "--num-heads", type=argparse_int, default=None, help="attention heads, for files that do not say"
    )
    for title, flags in TARGET_FLAGS.items():
        group = parser.add_argument_group(title)
        for name, (help_text, settings) in flags.items():
            group.add_argument(f"--{name.replace('_', '-')}", help=help_text, **settings)
    for name, help_text in ONNX_SHARED.items():
        add_option(group, name, help_text)  # the ONNX group, the last
    return parser


def run(args: Namespace):
    """Write the export of the target ``--to`` (or ``--out``'s suffix) names; print what was written and
    how to load it. Returns what the target's export returned.

    Raises:
        UsageError: no target chosen, an ``--out`` the target cannot write, another target's options.
    """
    target = choose_target(args.to, args.out)
    options = {name: args[name] for name in TARGET_OPTIONS}
    check_options(target, options)
    request = ExportRequest(args.checkpoint, Path(args.out), args.checkpoint_format, args.num_heads, options)
    target.check(request)
    check_outputs(COMMAND, target.outputs(request.out), [args.checkpoint])
    export = target.export(request)
    print("\n".join(target.describe(export)))
    return export


def main(argv: list[str] | None = None):
    return parse_and_run(build_parser(), run, argv)
