"""``mae map INDEX --out map.png [--max-points N] [--seed S] [--perplexity P] [--thumbnails] [--title T]``:
a 2-D t-SNE map of an embedding index, coloured by label (``mae.apps.embeddings.map_job``)."""

from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.apps.embeddings.embedding_map import DEFAULT_MAX_POINTS, DEFAULT_PERPLEXITY
from mae.apps.embeddings.map_job import DrawnMap, MapSettings, map_index
from mae.cli.command import command_parser, parse_and_run, settings_from
from mae.cli.command_options import add_option, argparse_int, positive_float

DESCRIPTION = (
    "A 2-D map of an index (mae embed): scikit-learn's t-SNE of its vectors (L2-normalised, PCA to 50 "
    "dimensions), one dot per image, coloured by label where the index has labels, as a PNG. t-SNE keeps "
    "near neighbours near; distances between clusters and cluster sizes mean little."
)


def build_parser() -> ArgumentParser:
    parser = command_parser("mae map", DESCRIPTION)
    parser.add_argument("index", type=Path, help="FILE.parquet or FILE.npy from mae embed")
    parser.add_argument(
        "--max-points",
        type=argparse_int,
        default=DEFAULT_MAX_POINTS,
        help="a larger index is mapped through a random sample of this many rows (drawn with --seed)",
    )
    parser.add_argument("--seed", type=argparse_int, default=0, help="the sample's, PCA's and t-SNE's seed")
    parser.add_argument(
        "--perplexity",
        type=positive_float,
        default=DEFAULT_PERPLEXITY,
        help="t-SNE's perplexity (about the neighbours each point keeps near); clipped below the point count",
    )
    parser.add_argument(
        "--thumbnails",
        action="store_true",
        help="draw the images of a spread-out sample of points (up to 64) over the map",
    )
    parser.add_argument("--title", default=None, help="the panel's title (default: the index's file name)")
    add_option(parser, "out", "the map (PNG)", default=Path("map.png"))
    return parser


def run(args: Namespace) -> DrawnMap:
    return map_index(args.index, args.out, settings_from(MapSettings, args))


def main(argv: list[str] | None = None) -> DrawnMap:
    return parse_and_run(build_parser(), run, argv)
