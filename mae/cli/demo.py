"""``mae demo --checkpoint CKPT``: the local reconstruction page (needs the demo extra)."""

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_option, argparse_float, argparse_int
from mae.convert.sources import FORMATS
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae demo", "A local page that reconstructs your images with a pretrained MAE (Gradio)."
    )
    add_option(
        parser, "checkpoint", "a checkpoint with a decoder (ours, official full, Hugging Face)", required=True
    )
    add_option(parser, "checkpoint_format", choices=FORMATS)
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
        type=argparse_int,
        default=None,
        help="port to serve on (default: the first free one from 7860)",
    )
    add_option(
        parser,
        "max_image_pixels",
        "larger images are refused as decompression bombs",
        default=DEFAULT_MAX_PIXELS,
    )
    parser.add_argument(
        "--max-upload-mb", type=argparse_float, default=100, help="larger uploads are refused (default: 100)"
    )
    return parser


def run(args: Namespace) -> None:
    """Load the model and serve the page until it is stopped."""
    from mae.apps.page.demo import ReconstructionSession, build_page, choose_port, example_images, serve

    try:
        port = choose_port(args.host, args.port)
    except OSError as err:
        raise ConfigError(str(err)) from None
    try:
        import gradio  # noqa: F401
    except ImportError as err:
        raise ConfigError(f'the demo page needs Gradio: pip install -e ".[demo]" ({err})') from None
    if args.port is None:
        print(f"serving on port {port} (choose another with --port N)")
    session = ReconstructionSession(args.checkpoint, args.checkpoint_format, args.max_image_pixels)
    search = None
    if args.index is not None:
        from mae.apps.page.search import SearchSession, search_tabs

        search = SearchSession(args.index, max_pixels=args.max_image_pixels)
    with example_images(args.examples) as examples:  # built-in examples are removed when the page stops
        page = build_page(session, examples, search_tabs(search, examples) if search else None)
        try:
            serve(page, args.host, port, args.max_upload_mb)
        except OSError:  # Gradio's own port check: the port was taken after ours
            raise ConfigError(
                f"port {port} on {args.host} was taken as the page started: "
                "start it again, or choose another with --port N"
            ) from None


def main(argv: list[str] | None = None) -> None:
    parse_and_run(build_parser(), run, argv)
