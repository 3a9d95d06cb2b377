"""``python -m mae.export CHECKPOINT OUT.safetensors``: the encoder as a plain timm ViT + its arguments."""

import json
from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.command import argparse_int, command_parser, parse_and_run
from mae.convert.export import export_encoder
from mae.convert.sources import FORMATS, read_checkpoint


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "python -m mae.export",
        "Export a pretrained encoder as a plain timm ViT (safetensors + a JSON of its timm arguments).",
    )
    parser.add_argument(
        "checkpoint", help="our .ckpt, an official MAE .pth, a timm state dict or a Hugging Face folder"
    )
    parser.add_argument("out", help="output .safetensors path (a .json with the timm arguments is written beside it)")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="source format (default: detect)")
    parser.add_argument(
        "--num_heads", type=argparse_int, default=None, help="attention heads, for files that do not say"
    )
    return parser


def run(args: Namespace) -> tuple[Path, Path]:
    """Write the weights and their JSON sidecar; print how to load them. Returns (weights, sidecar)."""
    weights, sidecar = export_encoder(args.checkpoint, args.out, args.format, args.num_heads)
    for note in read_checkpoint(args.checkpoint, args.format).notes:
        print(f"note: {note}")
    meta = json.loads(Path(sidecar).read_text())
    print(f"wrote {weights} and {sidecar}")
    print(
        f'load with timm alone: timm.create_model("{meta["architecture"]}", pretrained=True, '
        f'pretrained_cfg_overlay=dict(file="{weights}"), **json.load(open("{sidecar}"))["model_args"])'
    )
    return weights, sidecar


def main(argv: list[str] | None = None) -> None:
    parse_and_run(build_parser(), run, argv)
