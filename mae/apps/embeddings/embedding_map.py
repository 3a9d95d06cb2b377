"""A 2-D map of an embedding index (``mae map``, ``mae embed --map``): scikit-learn's t-SNE of a sample of
its vectors, drawn with matplotlib as one panel per index, coloured by label where the index has labels,
with the images of a spread-out sample of points drawn on the map if asked.

The vectors are L2-normalised first (so the map's neighbours are ``mae search``'s cosine neighbours),
then reduced to at most ``PCA_DIMS`` dimensions by PCA, as is usual before t-SNE. t-SNE keeps near
neighbours near; the distances between clusters and their sizes carry little meaning. Vectors with no
spread (every one the same direction, within ``SAME_DIRECTION``: an index of copies of one image) have
no map to find: t-SNE's PCA start would divide by their zero spread. They are drawn as what they are,
every point at one place, and the map says so.
"""

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mae.apps.embeddings.embedding_index import REBUILD, EmbeddingIndex, IndexMeta
from mae.errors import ConfigError, InputError
from mae.inference.images import IMAGE_ERRORS, display_range, load_image
from mae.inference.reconstruction import denormalize, to_display
from mae.io.atomic import atomic_write
from mae.io.outputs import PNG_KEY

MIN_POINTS = 3  # t-SNE's perplexity must lie below the point count, and 1-2 points make no map
DEFAULT_MAX_POINTS = 5000
DEFAULT_PERPLEXITY = 30.0
PCA_DIMS = 50
# Up to this many points t-SNE runs exact (quadratic, under a second here); above, Barnes-Hut. Barnes-Hut's
# OpenMP threads spin-wait: on 2 busy cores they took 8 s of CPU for 30 points, exact 0.1 s.
EXACT_MAX_POINTS = 100
CHUNK_ROWS = 65536
# L2-normalised vectors all within this distance of the first are one direction: float32 rounding (the
# same image embedded in another batch) moves a unit vector by about 1e-7; two images, far more.
SAME_DIRECTION = 1e-6
# The PNG text key holding what a map shows (``DrawnMap.record``, JSON); with ``PNG_KEY`` it marks a map.
RECORD_KEY = "mae-map"
MAP_COMMANDS = ("mae.map", "mae.embed")  # the commands whose maps each of them may replace
UNLABELLED = "#3f4c5a"  # every point of an index without labels (slate: no grey of antialiased text)
NO_LABEL = "#c7c7c7"  # a point without a label in an index where others have one
OTHER = "#7f7f7f"  # the labels past the first ``len(PALETTE) - 1``, as one entry
# tab20 without its two greys: its 9 dark colours, then their 9 light partners.
PALETTE = (
    "#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #bcbd22 #17becf "
    "#aec7e8 #ffbb78 #98df8a #ff9896 #c5b0d5 #c49c94 #f7b6d2 #dbdb8d #9edae5"
).split()
PANEL_INCHES, LEGEND_INCHES, DPI = 7.0, 2.2, 100
THUMBNAIL_GRID = 8  # thumbnails: at most one per cell of a GRID x GRID division of a panel
THUMBNAIL_POINTS = 36  # a thumbnail's longer side, in points (1/72 inch)
CAVEAT = "t-SNE keeps near neighbours near; distances between clusters and cluster sizes mean little."


@dataclass
class MapPoints:
    """The 2-D map of (a sample of) an index.

    Attributes:
        coords: (N, 2) float32 t-SNE coordinates (no unit), one row per point.
        labels: the N labels (None for an image outside a class folder), or None when no row has one.
        paths: the N image paths.
        rows: the index's row count (N is at most ``rows``; fewer when sampled).
        perplexity: the t-SNE perplexity used (the asked value, clipped below N).
        seed: the seed of the sample, PCA and t-SNE.
        same_direction: every vector points the same way (no spread): no t-SNE ran, every point is at
            (0, 0).
        meta: the index's record (for reading the images as the encoder saw them).
        index: the index file.
    """

    coords: np.ndarray
    labels: list[str | None] | None
    paths: list[str]
    rows: int
    perplexity: float
    seed: int
    meta: IndexMeta
    index: Path
    same_direction: bool = False

    def description(self) -> str:
        """One line: how many points of how many, the vectors, the perplexity and the seed (or that the
        vectors have no spread)."""
        n = len(self.paths)
        sample = f"all {n:,}" if n == self.rows else f"a random sample of {n:,} of {self.rows:,}"
        if self.same_direction:
            return (
                f"{sample} {self.meta.pool}-pooled vectors ({self.meta.dim} values) point the same way "
                "(copies of one image?): no t-SNE, every point drawn at one place"
            )
        return (
            f"t-SNE of {sample} {self.meta.pool}-pooled vectors ({self.meta.dim} values), "
            f"perplexity {self.perplexity:g}, seed {self.seed}"
        )


def require_plotting() -> None:
    """Raises:
    ConfigError: matplotlib is not installed, naming the extra that installs it.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ConfigError(f'the embedding map needs matplotlib: pip install -e ".[embed]" ({err})') from None


def map_points(
    index_path: str | Path,
    max_points: int = DEFAULT_MAX_POINTS,
    seed: int = 0,
    perplexity: float = DEFAULT_PERPLEXITY,
) -> MapPoints:
    """The t-SNE map of the index ``index_path``: of all its rows, or of a random sample of
    ``max_points`` of them (drawn with ``seed``, kept in index order). Memory: the sample's vectors.

    Raises:
        ConfigError: ``max_points`` below ``MIN_POINTS``, ``perplexity`` not above 0.
        InputError, MissingFileError: not a readable index (``EmbeddingIndex``), one of fewer than
            ``MIN_POINTS`` rows, or one holding NaN or infinite values.
    """
    if max_points < MIN_POINTS:
        raise ConfigError(
            f"max_points must be at least {MIN_POINTS} (a map of fewer means nothing), got {max_points}"
        )
    if not perplexity > 0:
        raise ConfigError(f"perplexity must be above 0, got {perplexity}")
    index = EmbeddingIndex(index_path)
    rows = len(index)
    if rows < MIN_POINTS:
        raise InputError(
            f"{index.path} holds {rows} vector(s): a map needs at least {MIN_POINTS}; embed more images"
        )
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(rows, max_points, replace=False)) if rows > max_points else np.arange(rows)
    parts = []
    for start, chunk in index.vector_chunks(CHUNK_ROWS):
        wanted = chosen[(chosen >= start) & (chosen < start + len(chunk))]
        parts.append(chunk.numpy()[wanted - start])
    vectors = np.concatenate(parts).astype(np.float64)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        first = int(chosen[np.argmin(finite)])
        raise InputError(
            f"{index.path} has {int((~finite).sum())} vector(s) with NaN or infinite values (the first: "
            f"row {first}, {index.rows_at([first])[first][0]}): the encoder gave no usable embedding; "
            f"check the checkpoint and {REBUILD}"
        )
    found = index.rows_at(chosen.tolist())
    paths = [found[int(row)][0] for row in chosen]
    labels = [found[int(row)][1] for row in chosen]
    used = min(float(perplexity), len(chosen) - 1.0)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    same = bool(np.linalg.norm(unit - unit[0], axis=1).max() <= SAME_DIRECTION)
    return MapPoints(
        coords=np.zeros((len(unit), 2), np.float32) if same else _tsne(unit, used, seed),
        labels=labels if any(label is not None for label in labels) else None,
        paths=paths,
        rows=rows,
        perplexity=used,
        seed=seed,
        meta=index.meta,
        index=index.path,
        same_direction=same,
    )


def _tsne(unit: np.ndarray, perplexity: float, seed: int) -> np.ndarray:
    """(N, 2) t-SNE of the (N, D) L2-normalised vectors (not all one direction) after PCA to at most
    ``PCA_DIMS``; exact up to ``EXACT_MAX_POINTS`` points, Barnes-Hut above."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    if unit.shape[1] > PCA_DIMS:
        unit = PCA(min(PCA_DIMS, len(unit)), random_state=seed).fit_transform(unit)
    method = "exact" if len(unit) <= EXACT_MAX_POINTS else "barnes_hut"
    tsne = TSNE(2, perplexity=perplexity, init="pca", learning_rate="auto", method=method, random_state=seed)
    return tsne.fit_transform(unit).astype(np.float32)


def label_colours(label_lists: list[list[str | None] | None]) -> dict[str, str]:
    """{legend entry: colour} over the labels of every panel (one colour per label in all panels): each
    label its own ``PALETTE`` colour, in name order, while they fit; past that the most frequent
    ``len(PALETTE) - 1`` labels keep theirs and the rest share ``OTHER`` as "other (K labels)"; rows
    without a label are "(no label)". {} when no panel has labels."""
    counts = Counter(label for labels in label_lists if labels is not None for label in labels)
    named = sorted((label for label in counts if label is not None), key=str)
    if len(named) > len(PALETTE):
        kept = sorted(sorted(named, key=lambda label: (-counts[label], label))[: len(PALETTE) - 1])
    else:
        kept = named
    colours = dict(zip(kept, PALETTE, strict=False))
    if len(kept) < len(named):
        colours[f"other ({len(named) - len(kept)} labels)"] = OTHER
    if None in counts:
        colours["(no label)"] = NO_LABEL
    return colours


def _point_colours(labels: list[str | None] | None, colours: dict[str, str]) -> list[str] | str:
    if labels is None:
        return UNLABELLED
    return [NO_LABEL if label is None else colours.get(label, OTHER) for label in labels]


@dataclass
class DrawnMap:
    """A drawn map: the matplotlib ``figure`` and its ``record`` (what it shows: each panel's index, point
    count, perplexity and seed, the legend's colours, the thumbnails drawn and those skipped with their
    errors)."""

    figure: Any  # matplotlib.figure.Figure
    record: dict

    def save(self, path: str | Path, command: str) -> Path:
        """Write the figure as a PNG, atomically, marked as ``command``'s (``PNG_KEY``) with the record
        (``RECORD_KEY``, JSON)."""
        metadata = {PNG_KEY: command, RECORD_KEY: json.dumps(self.record)}
        return atomic_write(path, lambda tmp: self.figure.savefig(tmp, format="png", metadata=metadata))


def map_figure(
    panels: list[tuple[str, MapPoints]], thumbnails: bool = False, title: str | None = None
) -> DrawnMap:
    """One panel per (name, points), side by side, one legend of labels for all of them; with
    ``thumbnails``, the images of up to ``THUMBNAIL_GRID`` squared points per panel (the point nearest
    each occupied cell's centre) drawn over the map, framed in their label's colour; an image that
    cannot be read any more is left out and recorded."""
    require_plotting()
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    colours = label_colours([points.labels for _, points in panels])
    legend = LEGEND_INCHES if colours else 0.0
    figure = Figure(
        figsize=(PANEL_INCHES * len(panels) + legend, PANEL_INCHES + 0.8), dpi=DPI, layout="constrained"
    )
    record: dict = {"panels": [], "colours": colours, "thumbnails": [], "skipped": []}
    for ax, (name, points) in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        size = float(np.clip(2000 / len(points.paths), 3, 30))
        ax.scatter(*points.coords.T, c=_point_colours(points.labels, colours), s=size, linewidths=0)
        ax.set_title(f"{name}\n{points.description()}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.margins(0.06)  # room for the thumbnails of the outermost points
        record["panels"].append(
            {
                "name": name,
                "index": str(points.index),
                "rows": points.rows,
                "points": len(points.paths),
                "perplexity": points.perplexity,
                "seed": points.seed,
                "labelled": points.labels is not None,
                "same_direction": points.same_direction,
            }
        )
        if thumbnails:
            _draw_thumbnails(ax, points, colours, record)
    if colours:
        handles = [
            Line2D([], [], marker="o", linestyle="", color=colour, label=name)
            for name, colour in colours.items()
        ]
        figure.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False, title="label")
    if title:
        figure.suptitle(title)
    figure.supxlabel(CAVEAT, fontsize=8, color="#555555")
    return DrawnMap(figure, record)


def thumbnail_rows(coords: np.ndarray, grid: int = THUMBNAIL_GRID) -> list[int]:
    """The rows of ``coords`` (N, 2) drawn as thumbnails: in each occupied cell of a ``grid`` x ``grid``
    division of their bounding box, the point nearest the cell's centre."""
    low, high = coords.min(0), coords.max(0)
    scaled = (coords - low) / np.maximum(high - low, 1e-12) * grid
    cells = np.minimum(scaled.astype(int), grid - 1)
    distance = np.linalg.norm(scaled - (cells + 0.5), axis=1)
    best: dict[tuple[int, int], int] = {}
    for row in np.argsort(distance, kind="stable"):
        best.setdefault((int(cells[row, 0]), int(cells[row, 1])), int(row))
    return sorted(best.values())


def _draw_thumbnails(ax: Any, points: MapPoints, colours: dict[str, str], record: dict) -> None:
    from matplotlib.offsetbox import AnnotationBbox, OffsetImage

    frame = _point_colours(points.labels, colours)
    for row in thumbnail_rows(points.coords):
        path = points.paths[row]
        try:
            pixels = _picture(path, points.meta)
        except IMAGE_ERRORS as err:
            record["skipped"].append({"path": path, "error": str(err)})
            continue
        image = OffsetImage(pixels, zoom=THUMBNAIL_POINTS / max(pixels.shape[:2]))
        edge = frame if isinstance(frame, str) else frame[row]
        box = AnnotationBbox(
            image, points.coords[row], pad=0.1, bboxprops={"edgecolor": edge, "linewidth": 1.5}
        )
        ax.add_artist(box)
        record["thumbnails"].append(path)


def _picture(path: str, meta: IndexMeta) -> np.ndarray:
    """(H, W, 3) float in [0, 1]: the image at ``path`` as the index's encoder saw it (``mae search``'s
    figure shows the same).

    Raises:
        OSError, ValueError, ...: ``IMAGE_ERRORS``, naming the file (moved, deleted or damaged since).
    """
    size = (meta.img_size[0], meta.img_size[1])
    data = denormalize(load_image(path, size, meta.norm())[None].float(), meta.mean, meta.std)
    value_range = display_range([path])
    if value_range is None:  # float data in its own units: this image's minimum to maximum
        value_range = (data.min().item(), data.max().item())
    return to_display(data, None, value_range)[0].permute(1, 2, 0).numpy()


def is_map(path: Path) -> bool:
    """Whether ``path`` is a map that ``mae map`` or ``mae embed --map`` wrote (its PNG text)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return (
                image.format == "PNG" and image.info.get(PNG_KEY) in MAP_COMMANDS and RECORD_KEY in image.info
            )
    except (OSError, ValueError, Image.DecompressionBombError):
        return False


def map_record(path: str | Path) -> dict:
    """The record (``DrawnMap.record``) of a map written by ``DrawnMap.save``."""
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.info[RECORD_KEY])


def check_map_path(path: Path, option: str) -> Path:
    """Raises:
    ConfigError: ``path`` does not end in .png, naming ``option``.
    """
    if Path(path).suffix.lower() != ".png":
        raise ConfigError(f"{option} {path}: the map is written as a PNG image; give a path ending in .png")
    return Path(path)
