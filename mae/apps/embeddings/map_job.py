"""``mae map`` (and ``mae embed --map``): the map of an index drawn to a PNG, its output checked before any
work, and a line saying what it shows (``mae.apps.embeddings.embedding_map`` draws it)."""

import sys
from dataclasses import dataclass
from pathlib import Path

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
from mae.errors import UsageError
from mae.io.outputs import Output, check_outputs

OWNER = "mae.map"  # the command whose figures ``--out`` may replace (``mae.io.outputs``)


@dataclass(frozen=True)
class MapSettings:
    """What a map shows: t-SNE of at most ``max_points`` rows (a random sample, drawn with ``seed``, as are
    PCA and t-SNE) at ``perplexity``; ``thumbnails``: the images of a spread-out sample of points drawn over
    it; ``title``: the panel's (default: the index's file name)."""

    max_points: int = DEFAULT_MAX_POINTS
    seed: int = 0
    perplexity: float = DEFAULT_PERPLEXITY
    thumbnails: bool = False
    title: str | None = None


def draw_map(index: Path, out: Path, owner: str, settings: MapSettings = MapSettings()) -> DrawnMap:
    """Map the index, write the figure to ``out`` as ``owner``'s, and say what it shows (the thumbnails
    left out on stderr). The output was checked before (``check_map_path``, ``check_outputs``)."""
    points = map_points(index, settings.max_points, settings.seed, settings.perplexity)
    drawn = map_figure([(settings.title or Path(index).name, points)], settings.thumbnails)
    for skip in drawn.record["skipped"]:
        print(f"thumbnail skipped, {skip['path']}: {skip['error']}", file=sys.stderr)
    drawn.save(out, owner)
    colours = drawn.record["colours"]
    coloured = f"coloured by label ({len(colours)} legend entries)" if colours else "no labels: one colour"
    shown = f"; {len(drawn.record['thumbnails'])} thumbnails" if settings.thumbnails else ""
    print(f"wrote {out}: {points.description()}; {coloured}{shown}")
    return drawn


def map_index(index: Path, out: Path, settings: MapSettings = MapSettings()) -> DrawnMap:
    """``mae map INDEX --out OUT``: check the output and that matplotlib is there, then ``draw_map``.

    Raises:
        UsageError: ``settings.max_points`` below ``MIN_POINTS``.
        OutputError: ``out`` is not a PNG name, or a file this command did not write.
    """
    if settings.max_points < MIN_POINTS:
        raise UsageError(f"--max-points must be at least {MIN_POINTS}, got {settings.max_points}")
    check_map_path(out, "--out")
    check_outputs(OWNER, [Output(out, "--out", ours=is_map)], [index])
    require_plotting()
    return draw_map(index, out, OWNER, settings)
