"""The built-in anomaly-detection task: scikit-learn's handwritten digits with synthetic defects, written
to disk in the MVTec AD layout so that the real reader (``mae.apps.anomaly.layout``) and the command line
see it as they would any other data.

Normal images are the training digits (``DigitsDataset``'s split: index % 5 != 0), the ones the default
pretraining run saw; the test images are the validation digits (index % 5 == 0), never seen in training,
a quarter left as they are and three quarters given one defect each: a ``scratch`` (an extra straight
stroke), a ``blob`` (a filled bright ellipse) or a ``missing_stroke`` (a disc of the digit erased). Every
image is the 8x8 scan upscaled to ``img_size`` with PIL's bicubic filter, as the digits data module's
evaluation view serves it (32 px: the pretraining size). Defects are drawn on the scan before the upscale
(at 4x its resolution, averaged down onto it), so they are exactly as blurred as the strokes: only their
shape is anomalous, not their sharpness. A defect's ground truth is the pixels it changed by more than
``CHANGED`` of full brightness: a scratch drawn over a bright stroke changes nothing there, and is not
marked there. Layout under ``root``::

    train/good/0001.png ...                8-bit grayscale PNG, img_size x img_size; the name is the
    test/good/0000.png ...                 scan's index in sklearn's load_digits()
    test/scratch/0005.png ...
    test/blob/... test/missing_stroke/...
    ground_truth/scratch/0005_mask.png ... 0 / 255, the size of its image
    anomalies.json                         the parameters the task was written with (written last)

The same parameters write the same bytes; the seed changes which digits get which defect, and where.
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mae.errors import ConfigError
from mae.io.atomic import write_folder_once

FORMAT = 1  # bumped when the same parameters would write different files
DEFECTS = ("scratch", "blob", "missing_stroke")
CHANGED = 0.15  # a pixel belongs to the ground truth when the defect changed it by more than this (0..1)
MIN_AREA = 6 / 1024  # a defect must change at least this fraction of the image (6 pixels at 32 x 32)
TRIES = 100  # random draws per defect before giving up on that digit
SUPERSAMPLE = 4  # defects are drawn at 4x the scan's 8 x 8 and averaged down onto it
RECORD = "anomalies.json"


def write_digit_anomalies(
    root: str | Path = "data/digit_anomalies",
    seed: int = 0,
    img_size: int = 32,
    num_normal: int | None = None,
    num_test: int | None = None,
) -> Path:
    """Write the digit anomaly task to ``root``, or reuse the one written there with the same parameters.

    Args:
        root: the task's folder; written whole into a temporary folder beside it and renamed at the end,
            so a killed run leaves no half-written task at ``root``.
        seed: which validation digits get which defect, and the defects' random geometry.
        img_size: side of every image in pixels (at least 16).
        num_normal: the first ``num_normal`` training digits (default: all 1,437).
        num_test: the first ``num_test`` validation digits (default: all 360), a quarter of them good.

    Returns:
        ``root``, as a ``Path``.

    Raises:
        ValueError: a bad parameter; or ``root`` holds something else (a task of other parameters, or
            files that are no task of this kind), naming ``root`` and the fix.
    """
    if img_size < 16:
        raise ConfigError(f"img_size must be at least 16 pixels for the defects to fit, got {img_size}")
    for name, value in (("num_normal", num_normal), ("num_test", num_test)):
        if value is not None and value < 4:
            raise ConfigError(f"{name} must be at least 4 (or None: all), got {value}")
    params = {
        "task": "mae digit anomalies",
        "format": FORMAT,
        "seed": seed,
        "img_size": img_size,
        "num_normal": num_normal,
        "num_test": num_test,
    }
    return write_folder_once(Path(root), params, RECORD, "digit anomaly tasks", _write_task)


def _write_task(folder: Path, params: dict) -> None:
    from sklearn.datasets import load_digits

    scans = load_digits().images / 16  # (1797, 8, 8) in [0, 1]
    index = np.arange(len(scans))
    size = params["img_size"]
    for i in index[index % 5 != 0][: params["num_normal"]]:
        _save_png(_upscale(scans[i], size), folder / "train" / "good" / f"{i:04d}.png")
    test = index[index % 5 == 0][: params["num_test"]]
    rng = np.random.default_rng(params["seed"])
    kinds = np.resize(np.arange(len(DEFECTS) + 1), len(test))  # 0 = good, k = DEFECTS[k - 1]: equal shares
    for i, kind in zip(test, rng.permutation(kinds), strict=True):
        image = _upscale(scans[i], size)
        if kind == 0:
            _save_png(image, folder / "test" / "good" / f"{i:04d}.png")
            continue
        defect = DEFECTS[kind - 1]
        damaged, mask = _with_defect(scans[i], image, defect, rng)
        _save_png(damaged, folder / "test" / defect / f"{i:04d}.png")
        _save_png(mask.astype(np.uint8) * 255, folder / "ground_truth" / defect / f"{i:04d}_mask.png")
    (folder / RECORD).write_text(json.dumps(params, indent=2) + "\n")  # written last: the task is whole


def _with_defect(
    scan: np.ndarray, image: np.ndarray, defect: str, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(damaged image, ground truth (H, W) bool) of one (8, 8) scan in [0, 1], its clean upscaled image
    and one defect kind. The defect is drawn on the scan, so the upscale blurs it as it blurs the strokes."""
    for _ in range(TRIES):
        damaged = _upscale(DRAW[defect](scan, rng), image.shape[0])
        mask = np.abs(damaged.astype(np.int16) - image) > CHANGED * 255
        if mask.mean() >= MIN_AREA:
            return damaged, mask
    raise RuntimeError(f"no visible {defect} after {TRIES} draws")  # unreachable on the digits


def _coverage(draw: Callable[[ImageDraw.ImageDraw], None]) -> np.ndarray:
    """(8, 8) in [0, 1]: how much of each scan pixel a shape covers, drawn at 4x the scan's resolution
    (32 x 32, whose coordinates ``draw`` uses) and averaged over each 4 x 4 block."""
    canvas = Image.new("L", (8 * SUPERSAMPLE, 8 * SUPERSAMPLE))
    draw(ImageDraw.Draw(canvas))
    fine = np.asarray(canvas, np.float32) / 255
    return fine.reshape(8, SUPERSAMPLE, 8, SUPERSAMPLE).mean(axis=(1, 3))


def _scratch(scan: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An extra straight stroke, 10-20 px long and 2-3 px wide (at 32 px), inside the image."""
    side = 8 * SUPERSAMPLE
    length, angle = rng.uniform(10, 20), rng.uniform(0, 2 * np.pi)
    dx, dy = length * np.cos(angle), length * np.sin(angle)
    x0 = rng.uniform(max(2, 2 - dx), min(side - 3, side - 3 - dx))  # both ends inside
    y0 = rng.uniform(max(2, 2 - dy), min(side - 3, side - 3 - dy))
    width = int(rng.integers(2, 4))
    line = _coverage(lambda d: d.line([(x0, y0), (x0 + dx, y0 + dy)], fill=255, width=width))
    return np.maximum(scan, line * rng.uniform(0.7, 1.0))


def _blob(scan: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A filled bright ellipse, radii 3-5 px (at 32 px), away from the border."""
    side = 8 * SUPERSAMPLE
    rx, ry = rng.uniform(3, 5, 2)
    cx, cy = rng.uniform(5, side - 5, 2)
    blob = _coverage(lambda d: d.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=255))
    return np.maximum(scan, blob * rng.uniform(0.6, 1.0))


def _missing_stroke(scan: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A disc of radius 4-6 px (at 32 px) around a bright part of the digit, erased."""
    rows, cols = np.nonzero(scan > 0.5)
    pick = rng.integers(len(rows))
    cy, cx = (np.array([rows[pick], cols[pick]]) + rng.uniform(0, 1, 2)) * SUPERSAMPLE
    r = rng.uniform(4, 6)
    disc = _coverage(lambda d: d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255))
    return scan * (1 - disc)


DRAW = {"scratch": _scratch, "blob": _blob, "missing_stroke": _missing_stroke}


def _upscale(scan: np.ndarray, size: int) -> np.ndarray:
    """An (8, 8) scan in [0, 1] as (size, size) uint8: 8-bit as ``DigitsDataset`` serves it, upscaled with
    PIL's bicubic filter as the digits' evaluation view does."""
    pixels = np.round(scan * 255).astype(np.uint8)
    return np.asarray(Image.fromarray(pixels).resize((size, size), Image.BICUBIC))


def _save_png(pixels: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="PNG")
