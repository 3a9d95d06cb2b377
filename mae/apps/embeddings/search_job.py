"""``mae search``'s whole job: its output checked before any work, each query's nearest images in an index
(``mae.apps.embeddings.image_search``), printed and drawn as one row per query
(``mae.apps.embeddings.neighbours_figure``)."""

import sys
from dataclasses import dataclass
from pathlib import Path

from mae.apps.embeddings.embed_run import listed_images
from mae.apps.embeddings.embedding_index import EmbeddingIndex, IndexMeta
from mae.apps.embeddings.image_search import CHUNK_ROWS, Match, index_embedder, search_images
from mae.apps.embeddings.neighbours_figure import neighbours_figure
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError, UsageError
from mae.io.atomic import atomic_write
from mae.io.outputs import Output, check_outputs, png_info, png_is_from

OWNER = "mae.search"  # the command whose figures ``--out`` may replace (``mae.io.outputs``)


@dataclass(frozen=True)
class SearchSettings:
    """What ``mae search`` does: the ``k`` nearest rows of the index ``index`` to each image of ``queries``
    (files or folders), drawn to the PNG ``out``. ``checkpoint``: the index's weights in another file or
    format (default: the checkpoint the index records); ``chunk_rows``: index rows compared at a time;
    ``max_image_pixels``: larger query images are skipped."""

    queries: list[str]
    index: Path
    out: Path
    k: int = 8
    checkpoint: str | Path | None = None
    checkpoint_format: str = "auto"
    chunk_rows: int = CHUNK_ROWS
    device: str = "cpu"
    max_image_pixels: int | None = DEFAULT_MAX_PIXELS


def search_files(settings: SearchSettings) -> list[Match]:
    """Search, print each query's neighbours (each unreadable query on stderr), write the figure.

    Raises:
        UsageError: ``k`` or ``chunk_rows`` below 1.
        ConfigError: no query image could be read.
        OutputError: ``out`` is a file this command did not write (``mae.io.outputs``).
    """
    if settings.k < 1 or settings.chunk_rows < 1:
        raise UsageError(
            f"-k and --chunk-rows must be at least 1, got {settings.k} and {settings.chunk_rows}"
        )
    inputs = [*settings.queries, settings.index, *([settings.checkpoint] if settings.checkpoint else [])]
    check_outputs(OWNER, [Output(settings.out, "--out", ours=png_is_from(OWNER))], inputs)
    index = EmbeddingIndex(settings.index)
    queries = [item.path for item in listed_images(settings.queries)]
    embedder = index_embedder(
        index, settings.checkpoint, settings.checkpoint_format, settings.device, settings.max_image_pixels
    )
    matches, unreadable = search_images(index, embedder, queries, settings.k, settings.chunk_rows)
    for path, error in unreadable:
        print(f"skipped {path}: {error}", file=sys.stderr)
    if not matches:
        raise ConfigError(
            f"none of the {len(queries)} query images could be read (the first, {unreadable[0][0]}: "
            f"{unreadable[0][1]})"
        )
    print_matches(matches)
    figure = neighbours_figure(matches, embedder, caption(index.meta, len(index)))
    atomic_write(settings.out, lambda tmp: figure.save(tmp, format="PNG", pnginfo=png_info(OWNER)))
    print(f"wrote {settings.out}")
    return matches


def print_matches(matches: list[Match]) -> None:
    """Each query, then its neighbours best first: rank, cosine similarity, path and label."""
    for match in matches:
        print(match.query)
        for rank, n in enumerate(match.neighbours, start=1):
            print(f"  #{rank} {n.score:.4f} {n.path}" + ("" if n.label is None else f" (label {n.label})"))


def caption(meta: IndexMeta, rows: int) -> str:
    """What the figure shows: the similarity, the vectors, the encoder, the index's size, the input size."""
    return (
        f"Cosine similarity of {meta.pool}-pooled embeddings ({meta.dim} values) by "
        f"{Path(meta.checkpoint).name}, exact, over {rows:,} images; images shown as the model saw "
        f"them ({meta.img_size[1]}x{meta.img_size[0]})."
    )
