"""What ``mae anomaly`` writes into its output folder besides metrics.json: ``scores.csv`` (``scores_csv``),
``heatmaps/`` (a figure per test image), ``predicted_masks/`` (the same relative names: each test image's
predicted defect mask) and ``overview.png`` (``write_figures``). Every file is written atomically."""

import csv
import io
from pathlib import Path

import numpy as np
from PIL import Image

from mae.apps.anomaly.evaluation import AnomalyResult, load_images, relative_name
from mae.apps.anomaly.figures import color_range, heat_map_figure
from mae.apps.anomaly.layout import TestSet
from mae.apps.anomaly.threshold import Decision
from mae.inference.images import display_range
from mae.inference.normalization import Normalization
from mae.io.atomic import atomic_write

OVERVIEW_PER_KIND = 4  # images of each class folder in overview.png


def write_figures(
    out: Path,
    every_image: bool,
    test_set: TestSet,
    result: AnomalyResult,
    size: tuple[int, int],
    norm: Normalization,
    decision: Decision | None,
    max_pixels: int | None,
) -> None:
    """``out/overview.png`` (the first ``OVERVIEW_PER_KIND`` images of each class folder) and, when
    ``every_image``, ``out/heatmaps/<relative name>.png`` per test image and, given a decision, its
    predicted defect mask ``out/predicted_masks/<relative name>.png`` (0 / 255 at the (H, W) ``size`` of
    the maps; a tree of its own, so no test image's name can be another's mask); each row marked with the
    decision when there is one. The images are read at ``size`` with ``norm``."""
    colors = color_range(result.maps)
    paths = [i.path for i in test_set.images]
    value_range = display_range(paths)
    predicted = decision.masks(result.maps) if decision is not None else None
    flagged = decision.anomalous(result.scores) if decision is not None else None

    def figure(picks: list[int]) -> Image.Image:
        imgs = load_images([paths[i] for i in picks], size, norm, max_pixels)
        truth = result.truth[picks] if result.truth is not None else None
        names = [relative_name(paths[i], test_set.root) for i in picks]
        return heat_map_figure(
            imgs,
            result.maps[picks],
            names,
            result.scores[picks].tolist(),
            norm,
            colors,
            truth,
            value_range,
            predicted=predicted[picks] if predicted is not None else None,
            anomalous=flagged[picks].tolist() if flagged is not None else None,
        )

    if every_image:
        for i, path in enumerate(paths):
            name = relative_name(path, test_set.root)
            name = name if path.suffix.lower() == ".png" else f"{name}.png"
            image = figure([i])
            atomic_write(out / "heatmaps" / name, lambda tmp, image=image: image.save(tmp, format="PNG"))
            if predicted is not None:
                mask = Image.fromarray(predicted[i].numpy().astype(np.uint8) * 255)
                atomic_write(
                    out / "predicted_masks" / name, lambda tmp, mask=mask: mask.save(tmp, format="PNG")
                )
    picks = []
    for kind in test_set.kinds if test_set.labelled else [None]:
        picks += [j for j, image in enumerate(test_set.images) if image.kind == kind][:OVERVIEW_PER_KIND]
    overview = figure(picks)
    atomic_write(out / "overview.png", lambda tmp: overview.save(tmp, format="PNG"))


def scores_csv(test_set: TestSet, result: AnomalyResult, decision: Decision | None) -> str:
    """scores.csv's text: one row per test image (path relative to the test folder, class folder, label,
    score to 6 significant digits, ``is_anomalous`` 1 / 0 at the decision's threshold, empty without one)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["path", "kind", "label", "score", "is_anomalous"])
    flags = [""] * len(result.scores)
    if decision is not None:
        flags = decision.anomalous(result.scores).int().tolist()
    for image, score, flag in zip(test_set.images, result.scores.tolist(), flags, strict=True):
        label = "" if image.label is None else image.label
        name = relative_name(image.path, test_set.root)
        writer.writerow([name, image.kind or "", label, f"{score:.6g}", flag])
    return text.getvalue()
