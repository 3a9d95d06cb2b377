"""``mae stats ROOT [--in-chans C]``: parse, then one call to ``mae.data.tools.stats.channel_stats``; prints
the skipped files and the ``data.mean`` / ``data.std`` lines of a config."""

import sys

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_option, argparse_int
from mae.data.tools.stats import ChannelStats, channel_stats


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae stats",
        "Per-channel mean and std of an image folder (ROOT/train if it exists), printed as the "
        "data.mean / data.std lines of a config.",
    )
    parser.add_argument("root", help="dataset folder (ImageFolder layout) or any folder of images")
    parser.add_argument(
        "--in-chans", type=argparse_int, default=None, help="channels (default: the first image's)"
    )
    parser.add_argument(
        "--max-images", type=argparse_int, default=None, help="use this many images, spread evenly"
    )
    add_option(parser, "max_image_pixels")
    return parser


def run(args: Namespace) -> ChannelStats:
    """Print the skipped files (first 10, on stderr) and the config lines."""
    stats = channel_stats(args.root, args.in_chans, args.max_images, max_pixels=args.max_image_pixels)
    for line in stats.skipped[:10]:
        print(f"skipped {line}", file=sys.stderr)
    print(f"# {stats.images:,} images, {stats.pixels:,} pixels per channel")
    print(stats.yaml(), end="")
    return stats


def main(argv: list[str] | None = None) -> ChannelStats:
    """``mae stats ROOT``: per-channel mean and std to paste into a config."""
    return parse_and_run(build_parser(), run, argv)
