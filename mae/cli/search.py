"""``mae search --index FILE QUERY_IMAGES... [-k 8] --out grid.png``: similar images in an index
(``mae.apps.embeddings.search_job``)."""

from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.apps.embeddings.image_search import CHUNK_ROWS
from mae.apps.embeddings.search_job import Match, SearchSettings, search_files
from mae.cli.command import command_parser, parse_and_run, settings_from
from mae.cli.command_options import add_checkpoint, add_option, positive_int
from mae.convert.sources import FORMATS


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae search",
        "The nearest images of an index (mae embed) to each query image, by cosine similarity of "
        "their embeddings (exact), drawn as one row per query.",
    )
    parser.add_argument("queries", nargs="+", help="query image files or folders")
    parser.add_argument("--index", type=Path, required=True, help="FILE.parquet or FILE.npy from mae embed")
    add_option(parser, "k", "per query", default=8)
    add_checkpoint(
        parser, FORMATS, "default: the checkpoint the index records (the same weights, any format)"
    )
    parser.add_argument(
        "--chunk-rows",
        type=positive_int,
        default=CHUNK_ROWS,
        help="index rows compared at a time (bounds the memory)",
    )
    add_option(parser, "device", "where the encoder and the products run")
    add_option(parser, "max_image_pixels")
    add_option(parser, "out", "the figure (PNG)", default=Path("neighbours.png"))
    return parser


def run(args: Namespace) -> list[Match]:
    return search_files(settings_from(SearchSettings, args))


def main(argv: list[str] | None = None) -> list[Match]:
    return parse_and_run(build_parser(), run, argv)
