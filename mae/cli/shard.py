"""``mae shard ROOT --out OUT``: parse, then one call to ``mae.data.tools.shard.shard`` (the converter and
what it writes are described there)."""

import os
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import command_parser, parse_and_run, settings_from
from mae.cli.command_options import add_option, argparse_int
from mae.data.tools import shard as shard_module
from mae.data.tools.shard import DEFAULT_CHUNK_BYTES, ShardSettings, shard


def build_parser() -> ArgumentParser:
    p = command_parser("mae shard", shard_module.__doc__.split("\n\n")[0])
    p.add_argument(
        "root", help="dataset folder: ROOT/<train-split>/<class>/<image> (and ROOT/<val-split>/...)"
    )
    add_option(p, "out", "output folder or s3://bucket/prefix", type=str, required=True)
    p.add_argument("--train-split", default="train")
    p.add_argument(
        "--val-split", default="val", help="sharded with the same classes when it exists ('' : none)"
    )
    selection = p.add_mutually_exclusive_group()
    selection.add_argument("--num-classes", type=argparse_int, default=None, help="use this many classes")
    selection.add_argument("--class-list", default=None, help="file with one class folder name per line")
    p.add_argument("--class-selection", choices=["first", "random"], default="first")
    p.add_argument(
        "--seed",
        type=argparse_int,
        default=0,
        help="seed of the samples' order (and of a random class selection)",
    )
    p.add_argument(
        "--max-images-per-class", type=argparse_int, default=None, help="cap on training images per class"
    )
    add_option(p, "max_image_pixels")
    add_option(p, "workers", "processes that read files", default=min(8, os.cpu_count() or 1))
    p.add_argument("--chunk-bytes", default=DEFAULT_CHUNK_BYTES, help="shard size, e.g. 64MB")
    p.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (default: AWS_ENDPOINT_URL)")
    p.add_argument("--overwrite", action="store_true", help="replace shards already at --out")
    p.add_argument(
        "--start-method",
        choices=["spawn", "fork", "forkserver"],
        default=None,
        help="multiprocessing start method of the workers (litdata's default: spawn)",
    )
    return p


def run(args: Namespace) -> dict[str, Any]:
    return shard(settings_from(ShardSettings, args))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``mae shard ROOT --out OUT``."""
    return parse_and_run(build_parser(), run, argv)
