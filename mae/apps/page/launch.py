"""``mae demo``'s whole job: the port chosen and Gradio checked before the model is loaded, the
reconstruction page built (``mae.apps.page.demo``, with the "Similar images" tab of ``mae.apps.page.search``
when an index is given) and served until it is stopped."""

from dataclasses import dataclass
from pathlib import Path

from mae.apps.page.demo import ReconstructionSession, build_page, choose_port, example_images, serve
from mae.apps.page.search import SearchSession, search_tabs
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError


@dataclass(frozen=True)
class DemoSettings:
    """What ``mae demo`` serves: the page of ``checkpoint`` (a MAE with its decoder) on ``host:port``
    (``port`` None: the first free one from 7860); ``index``: an index of ``mae embed`` searched in a second
    tab; ``examples``: a folder of images to pick from (default: a few digits); ``max_image_pixels``: larger
    images are refused; ``max_upload_mb``: larger uploads are refused."""

    checkpoint: str | Path
    checkpoint_format: str = "auto"
    index: str | Path | None = None
    examples: str | Path | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    max_image_pixels: int | None = DEFAULT_MAX_PIXELS
    max_upload_mb: float = 100


def serve_demo(settings: DemoSettings) -> None:
    """Load the model and serve the page until Ctrl-C or SIGTERM.

    Raises:
        ConfigError: the port is busy or not this machine's, Gradio is not installed, or the port was taken
            as the page started.
    """
    try:
        port = choose_port(settings.host, settings.port)
    except OSError as err:
        raise ConfigError(str(err)) from None
    try:
        import gradio  # noqa: F401
    except ImportError as err:
        raise ConfigError(f'the demo page needs Gradio: pip install -e ".[demo]" ({err})') from None
    if settings.port is None:
        print(f"serving on port {port} (choose another with --port N)")
    session = ReconstructionSession(
        settings.checkpoint, settings.checkpoint_format, settings.max_image_pixels
    )
    search = (
        None
        if settings.index is None
        else SearchSession(settings.index, max_pixels=settings.max_image_pixels)
    )
    with example_images(settings.examples) as examples:  # built-in examples are removed when the page stops
        page = build_page(session, examples, None if search is None else search_tabs(search, examples))
        try:
            serve(page, settings.host, port, settings.max_upload_mb)
        except OSError:  # Gradio's own port check: the port was taken after ours
            raise ConfigError(
                f"port {port} on {settings.host} was taken as the page started: "
                "start it again, or choose another with --port N"
            ) from None
