"""``mae embed``'s whole job: its outputs checked and its images listed before the encoder is loaded, the
images embedded into the index (``mae.apps.embeddings.embed_run``, resumable), a report of what was
written and skipped, and the index's map when asked (``mae.apps.embeddings.map_job``)."""

import sys
from dataclasses import dataclass
from pathlib import Path

from mae.apps.embeddings.embed_run import PartsFolder, embed_images, listed_images
from mae.apps.embeddings.embedder import load_embedder
from mae.apps.embeddings.embedding_index import IndexMeta, index_outputs
from mae.apps.embeddings.embedding_map import MIN_POINTS, check_map_path, is_map, require_plotting
from mae.apps.embeddings.map_job import draw_map
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import UsageError
from mae.eval.features import Pool
from mae.inference.normalization import Normalization
from mae.io.outputs import Output, check_outputs

OWNER = "mae.embed"  # the command whose index, parts and map the outputs may replace (``mae.io.outputs``)


@dataclass(frozen=True)
class EmbedSettings:
    """What ``mae embed`` does: embed ``images`` (files, or folders of them) with the encoder of
    ``checkpoint`` into the index ``out`` (``.parquet``, or ``.npy`` with its ``.csv`` and ``.json``).

    ``pool``: "cls", "avg" or "both", None: the encoder's default (a ViT's cls token, a CNN's "avg");
    ``feature_blocks``: the encoder blocks read (negative from the end; several concatenated), None: the last;
    ``img_size`` (pixels), ``mean`` / ``std`` (one per channel): the
    checkpoint's when None; ``part_size``: images per resumable part; ``max_image_pixels``: larger images are
    skipped; ``map``: also draw the index's t-SNE map to this PNG."""

    images: list[str]
    checkpoint: str | Path
    out: Path
    checkpoint_format: str = "auto"
    pool: Pool | None = None
    feature_blocks: list[int] | None = None
    batch_size: int = 256
    workers: int = 2
    part_size: int = 4096
    img_size: int | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    device: str = "cpu"
    max_image_pixels: int | None = DEFAULT_MAX_PIXELS
    no_progress: bool = False
    map: Path | None = None

    def normalization(self) -> Normalization | None:
        """``mean`` / ``std`` as the encoder's input normalisation; None: the checkpoint's record."""
        return None if self.mean is None else Normalization(len(self.mean), tuple(self.mean), tuple(self.std))


def embed_files(settings: EmbedSettings) -> IndexMeta:
    """Embed the images into ``settings.out``, print what was written (and each image skipped, on stderr),
    then draw the map when asked.

    Raises:
        UsageError: a part size below 1; ``map`` with fewer than ``MIN_POINTS`` images.
        OutputError: an output this command did not write (``mae.io.outputs``).
        MissingFileError: an input that does not exist or holds no image.
    """
    if settings.part_size < 1:
        raise UsageError(f"--part-size must be at least 1, got {settings.part_size}")
    maps = (
        [] if settings.map is None else [Output(check_map_path(settings.map, "--map"), "--map", ours=is_map)]
    )
    if maps:
        require_plotting()
    outputs = [*index_outputs(settings.out), PartsFolder(settings.out).output(), *maps]
    check_outputs(OWNER, outputs, settings.images)
    items = listed_images(settings.images)  # before loading the model: a mistyped folder fails at once
    if maps and len(items) < MIN_POINTS:
        raise UsageError(f"--map needs at least {MIN_POINTS} images to map, got {len(items)}")
    embedder = load_embedder(
        settings.checkpoint,
        settings.pool,
        settings.checkpoint_format,
        settings.img_size,
        settings.normalization(),
        settings.device,
        settings.max_image_pixels,
        blocks=settings.feature_blocks,
    )
    meta = embed_images(
        embedder,
        items,
        settings.out,
        settings.batch_size,
        settings.workers,
        settings.part_size,
        progress=not settings.no_progress,
    )
    print_index(meta, settings.out)
    if settings.map is not None:
        draw_map(settings.out, settings.map, OWNER)
    return meta


def print_index(meta: IndexMeta, out: Path) -> None:
    """Each image skipped (stderr), then one line: what ``out`` holds."""
    for skip in meta.skipped:
        print(f"skipped {skip['path']}: {skip['error']}", file=sys.stderr)
    skipped = "" if not meta.skipped else f", {len(meta.skipped)} unreadable image(s) skipped (listed above)"
    blocks = "" if meta.feature_blocks is None else f" of blocks {', '.join(map(str, meta.feature_blocks))}"
    print(
        f"wrote {out}: {meta.count} vectors of length {meta.dim} ({meta.pool} pooling{blocks}, input "
        f"{meta.img_size[1]}x{meta.img_size[0]}){skipped}"
    )
