"""``mae embed --checkpoint CKPT ROOT_OR_FILES... --out FILE``: an embedding of every image
(``mae.apps.embeddings.embed_job``)."""

from pathlib import Path

from jsonargparse import ArgumentParser, Namespace

from mae.apps.embeddings.embed_job import EmbedSettings, IndexMeta, embed_files
from mae.cli.command import command_parser, parse_and_run, settings_from
from mae.cli.command_options import add_checkpoint, add_option, positive_int
from mae.convert.sources import FORMATS
from mae.eval.features import POOLS


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
    add_checkpoint(parser, FORMATS, "the encoder", required=True)
    add_option(
        parser,
        "out",
        "the index: FILE.parquet, or FILE.npy (with FILE.csv and FILE.json beside it)",
        required=True,
    )
    parser.add_argument(
        "--pool",
        choices=POOLS,
        default=None,
        help="the normed cls token, the mean patch token, or both side by side (default: cls for a ViT; a "
        "CNN's only pool, avg, the mean of its last map)",
    )
    add_option(parser, "feature_blocks")
    add_option(parser, "batch_size", default=256)
    add_option(parser, "workers", "image-reading processes", default=2)
    for name in ("img_size", "mean", "std"):
        add_option(parser, name)
    parser.add_argument(
        "--part-size",
        type=positive_int,
        default=4096,
        help="images per resumable part (a stopped run loses at most one part)",
    )
    add_option(parser, "device", "where the encoder runs")
    add_option(parser, "max_image_pixels")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--map",
        type=Path,
        default=None,
        help="also draw the index's 2-D t-SNE map to this PNG, as mae map INDEX --out MAP draws it",
    )
    return parser


def run(args: Namespace) -> IndexMeta:
    return embed_files(settings_from(EmbedSettings, args))


def main(argv: list[str] | None = None) -> IndexMeta:
    return parse_and_run(build_parser(), run, argv)
