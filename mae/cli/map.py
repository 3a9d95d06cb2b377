"""``mae map INDEX --out map.png [--max-points N] [--seed S] [--perplexity P] [--thumbnails] [--title T]``:
a 2-D t-SNE map of an embedding index, coloured by label."""

import sys
from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.apps.embeddings.embedding_map import (
    DEFAULT_MAX_POINTS,
    DEFAULT_PERPLEXITY,
    MIN_POINTS,
    DrawnMap,
    check_map_path,
    is_map,
    map_figure,
    map_points,
    require_plotting,
)
from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_option, argparse_int, positive_float
from mae.errors import UsageError
from mae.io.outputs import Output, check_outputs

COMMAND = "mae.map"


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae map",
        "A 2-D map of an index (mae embed): scikit-learn's t-SNE of its vectors (L2-normalised, PCA to 50 "
        "dimensions), one dot per image, coloured by label where the index has labels, as a PNG. t-SNE keeps "
        "near neighbours near; distances between clusters and cluster sizes mean little.",
    )
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


def draw_map(
    index: Path,
    out: Path,
    command: str,
    max_points: int = DEFAULT_MAX_POINTS,
    seed: int = 0,
    perplexity: float = DEFAULT_PERPLEXITY,
    thumbnails: bool = False,
    title: str | None = None,
) -> DrawnMap:
    """Map the index, write the figure to ``out`` as ``command``'s, and say what it shows (the thumbnails
    left out on stderr). The output was checked before (``check_map_path``, ``check_outputs``)."""
    points = map_points(index, max_points, seed, perplexity)
    drawn = map_figure([(title or Path(index).name, points)], thumbnails)
    for skip in drawn.record["skipped"]:
        print(f"thumbnail skipped, {skip['path']}: {skip['error']}", file=sys.stderr)
    drawn.save(out, command)
    colours = drawn.record["colours"]
    coloured = f"coloured by label ({len(colours)} legend entries)" if colours else "no labels: one colour"
    shown = f"; {len(drawn.record['thumbnails'])} thumbnails" if thumbnails else ""
    print(f"wrote {out}: {points.description()}; {coloured}{shown}")
    return drawn


def run(args: Namespace) -> DrawnMap:
    """Check the output, map the index, write the figure.

    Raises:
        UsageError: --max-points below 3.
    """
    if args.max_points < MIN_POINTS:
        raise UsageError(f"--max-points must be at least {MIN_POINTS}, got {args.max_points}")
    check_map_path(args.out, "--out")
    check_outputs(COMMAND, [Output(args.out, "--out", ours=is_map)], [args.index])
    require_plotting()
    return draw_map(
        args.index,
        args.out,
        COMMAND,
        args.max_points,
        args.seed,
        args.perplexity,
        args.thumbnails,
        args.title,
    )


def main(argv: list[str] | None = None) -> DrawnMap:
    return parse_and_run(build_parser(), run, argv)
