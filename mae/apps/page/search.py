"""The page's "Similar images" tab (``mae demo --checkpoint CKPT --index FILE``): upload or pick
an image and see its nearest images in an index of ``mae embed``, with their cosine similarity.

As the rest of the page, it names files, never server paths, and every failure is a message on the page."""

import contextlib
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from mae.apps.embeddings.embedding_index import EmbeddingIndex
from mae.apps.embeddings.image_search import index_embedder, search_images
from mae.apps.embeddings.neighbours_figure import MIN_PANEL, picture, shown_range
from mae.apps.page.demo import image_chooser, shown_image
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError
from mae.inference.images import IMAGE_ERRORS

MAX_K = 32  # the slider's end


class SearchSession:
    """An index and the encoder that made it (``mae.apps.embeddings.image_search.index_embedder``: the
    checkpoint the index records, or ``checkpoint`` with the same weights), on the CPU."""

    def __init__(
        self,
        index: str | Path,
        checkpoint: str | Path | None = None,
        format: str = "auto",
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.index = EmbeddingIndex(index)
        self.embedder = index_embedder(self.index, checkpoint, format, "cpu", max_pixels)
        self.name = Path(index).name
        self._lock = threading.Lock()  # the page's events may call show at once; one index file reader

    def show(self, path: str | Path | None, name: str | None, k) -> tuple[list[tuple[Image.Image, str]], str]:
        """(gallery items: the query, then its ``k`` nearest images, each (picture, caption); Markdown
        details), or no items and a message saying what is wrong. Never raises."""
        if not isinstance(k, int | float) or isinstance(k, bool) or k != int(k) or not 1 <= k <= MAX_K:
            return (
                [],
                f"**Check the settings:** the number of neighbours must be a whole number from 1 to {MAX_K}.",
            )
        if path is None:
            return [], "**Upload an image or pick an example.**"
        try:
            with self._lock:
                matches, unreadable = search_images(self.index, self.embedder, [path], int(k))
            if unreadable:
                raise ConfigError(unreadable[0][1])
            match = matches[0]
            value_range = shown_range([path, *(n.path for n in match.neighbours)])
            side = max(MIN_PANEL, *self.embedder.img_size)
            items = [(picture(path, self.embedder, value_range, side), f"query: {name}")]
            for rank, n in enumerate(match.neighbours, start=1):
                label = "" if n.label is None else f", label {n.label}"
                items.append(
                    (
                        picture(n.path, self.embedder, value_range, side),
                        f"#{rank} {n.score:.3f}: {Path(n.path).name}{label}",
                    )
                )
        except Exception as err:  # whatever one image raises is a message on the page
            from mae.apps.page.demo import readable_error

            if not isinstance(err, IMAGE_ERRORS):
                traceback.print_exc()  # unexpected: the whole story for whoever runs the server
            return [], f"**Could not search with this image:** {readable_error(err, Path(path), name)}"
        meta = self.index.meta
        details = (
            f"**{name}**: its {len(match.neighbours)} nearest of {len(self.index):,} images in `{self.name}` "
            f"by cosine similarity (1: the same direction) of {meta.pool}-pooled embeddings, exact. Pictures "
            f"show the images as the model saw them ({meta.img_size[1]}x{meta.img_size[0]})."
        )
        return items, details


@contextlib.contextmanager
def search_tabs(session: SearchSession | None, examples: list[Path]) -> Iterator[None]:
    """Inside a page's ``gr.Blocks``: without a ``session``, nothing; with one, the page's own content (the
    ``with`` body) becomes the first tab, "Reconstruction", and a "Similar images" tab follows it."""
    if session is None:
        yield
        return
    import gradio as gr

    with gr.Tabs():
        with gr.Tab("Reconstruction", elem_id="tab-reconstruction"):
            yield
        with gr.Tab("Similar images", elem_id="tab-search"):
            similar_images_tab(session, examples)


def similar_images_tab(session: SearchSession, examples: list[Path]) -> None:
    """The tab's controls and results, in the current Gradio block."""
    import gradio as gr

    by_name = {path.name: Path(path) for path in examples}

    def shown(upload, example) -> tuple[str | Path | None, str | None]:
        return shown_image(upload, example, by_name)

    def on_search(upload, example, k) -> tuple:
        return session.show(*shown(upload, example), k)

    def on_upload(upload, k) -> tuple:
        return None, *session.show(*shown(upload, None), k)  # clears the example box

    def on_example(example, k) -> tuple:
        return None, *session.show(*shown(None, example), k)  # clears the upload

    gr.Markdown(f"## Similar images\nIndex: `{session.name}`, {len(session.index):,} images.")
    with gr.Row():
        with gr.Column(scale=1):
            upload, example = image_chooser(by_name, prefix="search-")
            k = gr.Slider(1, MAX_K, value=8, step=1, label="neighbours", elem_id="search-k")
            run = gr.Button("Search", variant="primary", elem_id="search-run")
        with gr.Column(scale=3):
            gallery = gr.Gallery(
                label="the query, then its nearest images", columns=5, elem_id="search-gallery"
            )
            details = gr.Markdown(elem_id="search-details")
    upload.upload(on_upload, [upload, k], [example, gallery, details])
    example.input(on_example, [example, k], [upload, gallery, details])
    for event in (run.click, k.release):
        event(on_search, [upload, example, k], [gallery, details])
