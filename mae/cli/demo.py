"""``mae demo --checkpoint CKPT``: the local reconstruction page (needs the demo extra;
``mae.apps.page.launch``)."""

from jsonargparse import ArgumentParser, Namespace

from mae.apps.page.launch import DemoSettings, serve_demo
from mae.cli.command import command_parser, parse_and_run, settings_from
from mae.cli.command_options import (
    DECODER_CHECKPOINT,
    add_checkpoint,
    add_option,
    positive_float,
    positive_int,
)
from mae.convert.sources import FORMATS


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae demo", "A local page that reconstructs your images with a pretrained MAE (Gradio)."
    )
    add_checkpoint(parser, FORMATS, DECODER_CHECKPOINT, required=True)
    parser.add_argument(
        "--index",
        default=None,
        help='an index of mae embed: adds a "Similar images" tab searching it with the checkpoint it records',
    )
    parser.add_argument(
        "--examples", default=None, help="a folder of images to pick from (default: a few digits)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: this machine only)"
    )
    parser.add_argument(
        "--port",
        type=positive_int,
        default=None,
        help="port to serve on (default: the first free one from 7860)",
    )
    add_option(parser, "max_image_pixels")
    parser.add_argument(
        "--max-upload-mb", type=positive_float, default=100, help="larger uploads are refused (default: 100)"
    )
    return parser


def run(args: Namespace) -> None:
    serve_demo(settings_from(DemoSettings, args))


def main(argv: list[str] | None = None) -> None:
    parse_and_run(build_parser(), run, argv)
