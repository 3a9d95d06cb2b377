"""``mae reconstruct --checkpoint CKPT IMAGE_OR_FOLDER...``: a reconstruction figure of your images."""

import sys
from pathlib import Path

import torch
from jsonargparse import ArgumentParser, Namespace
from PIL import Image

from mae.apps.reconstruction_figure import Figure, reconstruction_figure
from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_option, argparse_float, argparse_int
from mae.convert.sources import FORMATS
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError, UsageError
from mae.inference.images import display_range, image_paths, load_image
from mae.inference.reconstruction import load_reconstructor
from mae.io.atomic import atomic_write
from mae.io.outputs import Output, check_outputs, png_info, png_is_from
from mae.models.masking import MASK_STRATEGIES

COMMAND = "mae.reconstruct"


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae reconstruct",
        "Mask your own images, reconstruct them with a pretrained MAE, and draw one row per image: "
        "original | masked | reconstruction | reconstruction with the visible patches pasted back.",
    )
    parser.add_argument(
        "images", nargs="+", help="image files or folders (any format and channel count the data path reads)"
    )
    add_option(
        parser, "checkpoint", "a checkpoint with a decoder (ours, official full, Hugging Face)", required=True
    )
    add_option(parser, "checkpoint_format", choices=FORMATS)
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
        help="norm_pix_loss models: draw masked patches with the true patches' statistics (patch, "
        "leaks them) or the raw normalised prediction (none)",
    )
    add_option(parser, "img_size", "default: the checkpoint's")
    add_option(parser, "mean", "default: the checkpoint's record")
    add_option(parser, "std", "default: the checkpoint's record")
    parser.add_argument(
        "--bands", type=argparse_int, nargs=3, default=None, help="channels drawn as RGB (multi-band data)"
    )
    add_option(
        parser,
        "max_image_pixels",
        "larger images are refused as decompression bombs",
        default=DEFAULT_MAX_PIXELS,
    )
    parser.add_argument(
        "--attention",
        action="store_true",
        help="add the last block's cls-token attention (mean of the heads, and each head; the "
        "encoder on every patch, no masking) to each row",
    )
    add_option(parser, "out", "the figure (PNG)", default=Path("reconstruction.png"))
    return parser


def run(args: Namespace) -> Figure:
    """Read the images (skipping, with a note on stderr, those that cannot be read), draw the figure,
    write it to ``args.out`` and print each image's masked-patch loss.

    Raises:
        UsageError: a mask ratio outside (0, 1), a size below 1, --mean without --std (or the
            reverse), or statistics of another channel count than the model's.
    """
    if not 0 < args.mask_ratio < 1:  # NaN fails this too
        raise UsageError(
            f"--mask-ratio must be in (0, 1), the fraction of patches hidden; got {args.mask_ratio}"
            + (" (0 hides nothing: there is nothing to reconstruct)" if args.mask_ratio == 0 else "")
        )
    if args.img_size is not None and args.img_size < 1:
        raise UsageError(f"--img-size must be a positive number of pixels, got {args.img_size}")
    if (args.mean is None) != (args.std is None):
        raise UsageError("give --mean and --std together")
    check_outputs(
        COMMAND, [Output(args.out, "--out", ours=png_is_from(COMMAND))], [*args.images, args.checkpoint]
    )
    model, norm = load_reconstructor(
        args.checkpoint, args.checkpoint_format, args.img_size, args.mean, args.std
    )
    in_chans = model.config["in_chans"]
    if len(norm.mean) != in_chans or len(norm.std) != in_chans:
        raise UsageError(f"--mean and --std need {in_chans} values, one per channel of the model")
    images, names = [], []
    for path in image_paths(args.images):
        try:
            images.append(load_image(path, tuple(model.config["img_size"]), norm, args.max_image_pixels))
            names.append(str(path))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            print(f"skipped {path}: {err}", file=sys.stderr)
    if not images:
        shown = ", ".join(map(str, args.images))
        raise ConfigError(
            f"no readable image among {shown} (each skipped one is named above, with why): give image "
            "files, or folders of them, that the skips do not name"
        )
    figure = reconstruction_figure(
        model,
        torch.stack(images),
        names,
        norm,
        args.mask_ratio,
        args.seed,
        args.same_mask,
        args.unnormalize,
        args.bands,
        strategy=args.mask_strategy,
        value_range=display_range(names),
        attention=args.attention,
    )
    atomic_write(args.out, lambda tmp: figure.image.save(tmp, format="PNG", pnginfo=png_info(COMMAND)))
    for name, loss in zip(names, figure.losses, strict=True):
        print(f"{name}: masked-patch loss {loss:.4f}")
    print(f"note: {figure.caption}")
    print(f"wrote {args.out}")
    return figure


def main(argv: list[str] | None = None) -> Figure:
    return parse_and_run(build_parser(), run, argv)
