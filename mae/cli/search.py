"""``mae search --index FILE QUERY_IMAGES... [-k 8] --out grid.png``: similar images in an index."""

import sys
from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.apps.embeddings.embed_run import listed_images
from mae.apps.embeddings.embedding_index import EmbeddingIndex
from mae.apps.embeddings.image_search import CHUNK_ROWS, Match, index_embedder, search_images
from mae.apps.embeddings.neighbours_figure import neighbours_figure
from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_option, argparse_int
from mae.convert.sources import FORMATS
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError, UsageError
from mae.io.atomic import atomic_write
from mae.io.outputs import Output, check_outputs, png_info, png_is_from

COMMAND = "mae.search"


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae search",
        "The nearest images of an index (mae embed) to each query image, by cosine similarity of "
        "their embeddings (exact), drawn as one row per query.",
    )
    parser.add_argument("queries", nargs="+", help="query image files or folders")
    parser.add_argument("--index", type=Path, required=True, help="FILE.parquet or FILE.npy from mae embed")
    add_option(parser, "k", "per query", default=8)
    add_option(
        parser,
        "checkpoint",
        "the index's weights in another file or format (default: the checkpoint the index records)",
        default=None,
    )
    add_option(parser, "checkpoint_format", choices=FORMATS)
    parser.add_argument(
        "--chunk-rows",
        type=argparse_int,
        default=CHUNK_ROWS,
        help="index rows compared at a time (bounds the memory)",
    )
    add_option(parser, "device", "where the encoder and the products run")
    add_option(
        parser,
        "max_image_pixels",
        "larger images are refused as decompression bombs",
        default=DEFAULT_MAX_PIXELS,
    )
    add_option(parser, "out", "the figure (PNG)", default=Path("neighbours.png"))
    return parser


def run(args: Namespace) -> list[Match]:
    """Search, print each query's neighbours, write the figure.

    Raises:
        UsageError: k or the chunk size below 1.
    """
    if args.k < 1 or args.chunk_rows < 1:
        raise UsageError(f"-k and --chunk-rows must be at least 1, got {args.k} and {args.chunk_rows}")
    inputs = [*args.queries, args.index] + ([args.checkpoint] if args.checkpoint else [])
    check_outputs(COMMAND, [Output(args.out, "--out", ours=png_is_from(COMMAND))], inputs)
    index = EmbeddingIndex(args.index)
    queries = [item.path for item in listed_images(args.queries)]
    embedder = index_embedder(
        index, args.checkpoint, args.checkpoint_format, args.device, args.max_image_pixels
    )
    matches, unreadable = search_images(index, embedder, queries, args.k, args.chunk_rows)
    for path, error in unreadable:
        print(f"skipped {path}: {error}", file=sys.stderr)
    if not matches:
        raise ConfigError(
            f"none of the {len(queries)} query images could be read (the first, {unreadable[0][0]}: "
            f"{unreadable[0][1]})"
        )
    for match in matches:
        print(match.query)
        for rank, n in enumerate(match.neighbours, start=1):
            print(f"  #{rank} {n.score:.4f} {n.path}" + ("" if n.label is None else f" (label {n.label})"))
    meta = index.meta
    caption = (
        f"Cosine similarity of {meta.pool}-pooled embeddings ({meta.dim} values) by "
        f"{Path(meta.checkpoint).name}, exact, over {len(index):,} images; images shown as the model saw "
        f"them ({meta.img_size[1]}x{meta.img_size[0]})."
    )
    figure = neighbours_figure(matches, embedder, caption)
    atomic_write(args.out, lambda tmp: figure.save(tmp, format="PNG", pnginfo=png_info(COMMAND)))
    print(f"wrote {args.out}")
    return matches


def main(argv: list[str] | None = None) -> list[Match]:
    return parse_and_run(build_parser(), run, argv)
