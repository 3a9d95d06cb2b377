"""``mae reconstruct --checkpoint CKPT IMAGE_OR_FOLDER...``: a reconstruction figure of your images
(``mae.apps.reconstruction_job``)."""

from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.apps.reconstruction_job import Figure, ReconstructionSettings, reconstruct_files
from mae.cli.command import command_parser, parse_and_run, settings_from
from mae.cli.command_options import (
    DECODER_CHECKPOINT,
    add_checkpoint,
    add_option,
    argparse_float,
    argparse_int,
)
from mae.convert.sources import FORMATS
from mae.models.masking import MASK_STRATEGIES


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae reconstruct",
        "Mask your own images, reconstruct them with a pretrained MAE, and draw one row per image: "
        "original | masked | reconstruction | reconstruction with the visible patches pasted back.",
    )
    parser.add_argument(
        "images", nargs="+", help="image files or folders (any format and channel count the data path reads)"
    )
    add_checkpoint(parser, FORMATS, DECODER_CHECKPOINT, required=True)
    parser.add_argument("--mask-ratio", type=argparse_float, default=0.75)
    parser.add_argument(
        "--mask-strategy",
        choices=MASK_STRATEGIES,
        default=None,
        help="default: the checkpoint's (random for other files)",
    )
    parser.add_argument("--seed", type=argparse_int, default=0, help="seed of the masks")
    parser.add_argument("--same-mask", action="store_true", help="one mask for every image")
    parser.add_argument(
        "--unnormalize",
        choices=("patch", "none"),
        default="patch",
        help="target norm_pix models: draw masked patches with the true patches' statistics (patch, "
        "leaks them) or the raw normalised prediction (none)",
    )
    for name in ("img_size", "mean", "std"):
        add_option(parser, name)
    parser.add_argument(
        "--bands", type=argparse_int, nargs=3, default=None, help="channels drawn as RGB (multi-band data)"
    )
    add_option(parser, "max_image_pixels")
    parser.add_argument(
        "--attention",
        action="store_true",
        help="add the last block's cls-token attention (mean of the heads, and each head; the "
        "encoder on every patch, no masking) to each row",
    )
    add_option(parser, "out", "the figure (PNG)", default=Path("reconstruction.png"))
    return parser


def run(args: Namespace) -> Figure:
    return reconstruct_files(settings_from(ReconstructionSettings, args))


def main(argv: list[str] | None = None) -> Figure:
    return parse_and_run(build_parser(), run, argv)
