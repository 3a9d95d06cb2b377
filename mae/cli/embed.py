"""``mae embed --checkpoint CKPT ROOT_OR_FILES... --out FILE``: an embedding of every image."""

import sys
from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.apps.embeddings.embed_run import PartsFolder, embed_images, listed_images
from mae.apps.embeddings.embedder import load_embedder
from mae.apps.embeddings.embedding_index import IndexMeta, index_outputs
from mae.apps.embeddings.embedding_map import MIN_POINTS, check_map_path, is_map, require_plotting
from mae.cli.map import draw_map
from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_option, argparse_int
from mae.convert.sources import FORMATS
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import UsageError
from mae.eval.features import POOLS
from mae.inference.normalization import Normalization
from mae.io.outputs import Output, check_outputs

COMMAND = "mae.embed"


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae embed",
        "Embed every image of folders and files with a pretrained encoder into an index (Parquet, or .npy + "
        "CSV), for mae search. A stopped run continues where it stopped when started again.",
    )
    parser.add_argument(
        "images",
        nargs="+",
        help="image files, or folders of them (an ImageFolder root: "
        "<root>/<class>/... gives each image its class as label)",
    )
    add_option(parser, "checkpoint", "the encoder", required=True)
    add_option(parser, "checkpoint_format", choices=FORMATS)
    add_option(
        parser,
        "out",
        "the index: FILE.parquet, or FILE.npy (with FILE.csv and FILE.json beside it)",
        required=True,
    )
    parser.add_argument(
        "--pool",
        choices=POOLS,
        default="cls",
        help="the normed cls token, the mean patch token, or both side by side",
    )
    add_option(parser, "batch_size", default=256)
    add_option(parser, "workers", "image-reading processes", default=2)
    add_option(parser, "img_size", "default: the checkpoint's")
    add_option(parser, "mean", "default: the checkpoint's record")
    add_option(parser, "std", "default: the checkpoint's record")
    parser.add_argument(
        "--part-size",
        type=argparse_int,
        default=4096,
        help="images per resumable part (a stopped run loses at most one part)",
    )
    add_option(parser, "device", "where the encoder runs")
    add_option(
        parser,
        "max_image_pixels",
        "larger images are skipped as decompression bombs",
        default=DEFAULT_MAX_PIXELS,
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--map",
        type=Path,
        default=None,
        help="also draw the index's 2-D t-SNE map to this PNG, as mae map INDEX --out MAP draws it",
    )
    return parser


def run(args: Namespace) -> IndexMeta:
    """Embed the images into ``args.out`` and print what was written and what was skipped.

    Raises:
        UsageError: a batch, part or input size below 1, negative workers, --mean without --std.
    """
    sizes = (
        ("--batch-size", args.batch_size, 1),
        ("--part-size", args.part_size, 1),
        ("--workers", args.workers, 0),
        ("--img-size", args.img_size, 1),
    )
    for flag, value, low in sizes:
        if value is not None and value < low:
            raise UsageError(f"{flag} must be at least {low}, got {value}")
    if (args.mean is None) != (args.std is None):
        raise UsageError("give --mean and --std together")
    maps = []
    if args.map is not None:
        maps = [Output(check_map_path(args.map, "--map"), "--map", ours=is_map)]
        require_plotting()
    check_outputs(COMMAND, [*index_outputs(args.out), PartsFolder(args.out).output(), *maps], args.images)
    items = listed_images(args.images)  # before loading the model: a mistyped folder fails at once
    if args.map is not None and len(items) < MIN_POINTS:
        raise UsageError(f"--map needs at least {MIN_POINTS} images to map, got {len(items)}")
    norm = None
    if args.mean is not None:
        if len(args.mean) != len(args.std):
            raise UsageError("--mean and --std need the same number of values, one per channel")
        norm = Normalization(len(args.mean), tuple(args.mean), tuple(args.std))
    embedder = load_embedder(
        args.checkpoint,
        args.pool,
        args.checkpoint_format,
        args.img_size,
        norm,
        args.device,
        args.max_image_pixels,
    )
    meta = embed_images(
        embedder,
        items,
        args.out,
        args.batch_size,
        args.workers,
        args.part_size,
        progress=not args.no_progress,
    )
    for skip in meta.skipped:
        print(f"skipped {skip['path']}: {skip['error']}", file=sys.stderr)
    skipped = "" if not meta.skipped else f", {len(meta.skipped)} unreadable image(s) skipped (listed above)"
    print(
        f"wrote {args.out}: {meta.count} vectors of length {meta.dim} ({meta.pool} pooling, input "
        f"{meta.img_size[1]}x{meta.img_size[0]}){skipped}"
    )
    if args.map is not None:
        draw_map(args.out, args.map, COMMAND)
    return meta


def main(argv: list[str] | None = None) -> IndexMeta:
    return parse_and_run(build_parser(), run, argv)
