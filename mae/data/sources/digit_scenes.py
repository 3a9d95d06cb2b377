"""The built-in offline detection task: scenes of scikit-learn's handwritten digits, written to disk in
COCO format so that the real readers (``mae.dense.data.coco``) and a semantic-segmentation reader see them as
they would any other data.

Each scene is a dark, lightly noisy square canvas holding 1 to 3 digits whose boxes do not overlap, each a
real 8x8 scan upscaled (bilinear) to a random side in ``digit_size``: the sizes at which the pretrained
encoder saw these digits (32x32 with 4x4 patches). Training scenes draw only on the training split of
``DigitsDataset`` (index % 5 != 0), validation scenes only on its validation split (index % 5 == 0), so
no digit scan is in both. Layout under ``root``::

    images/train/000000.png ...           RGB PNG, canvas x canvas
    images/val/000000.png ...
    annotations/instances_train.json      COCO: categories 1..10 named "0".."9"; boxes [x, y, w, h] in
    annotations/instances_val.json        pixels; segmentation as uncompressed COCO RLE (column-major runs);
                                          digit_index: the scan's index in sklearn's load_digits()
    masks/train/000000.png ...            semantic masks, uint8 single-channel: 0 background, d + 1 for
    masks/val/000000.png ...              digit d
    scenes.json                           the parameters the task was written with
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.nn import functional as F

from mae.data.sources.loader_workers import MainProcessLoading
from mae.errors import ConfigError
from mae.io.atomic import write_folder_once

FORMAT = 1  # bumped when the same parameters would write different files
THRESHOLD = 0.3  # an upscaled digit's pixel belongs to its mask above this intensity (0..1)
PLACEMENT_TRIES = 100  # random positions tried per digit before the scene keeps fewer digits
CATEGORIES = [{"id": d + 1, "name": str(d), "supercategory": "digit"} for d in range(10)]
SPLITS = ("train", "val")
# Where each split's files are under ``root`` (the layout in the module docstring); the data modules read
# these.
IMAGES = "images/{split}"
MASKS = "masks/{split}"
ANNOTATIONS = "annotations/instances_{split}.json"
RECORD = "scenes.json"  # the parameters the task was written with, written last


def write_digit_scenes(
    root: str | Path = "data/digit_scenes",
    num_train: int = 1000,
    num_val: int = 200,
    canvas: int = 64,
    digit_size: tuple[int, int] = (20, 32),
    digits_per_scene: tuple[int, int] = (1, 3),
    noise: float = 0.1,
    seed: int = 0,
) -> Path:
    """Write the digit-scene task to ``root``, or reuse the one written there with the same parameters.

    Args:
        root: the task's folder; written whole into a temporary folder beside it and renamed at the end,
            so a killed run leaves no half-written task at ``root``.
        num_train, num_val: scenes per split.
        canvas: side of every scene in pixels.
        digit_size: (smallest, largest) side in pixels of an upscaled digit, drawn uniformly per digit.
        digits_per_scene: (fewest, most) digits per scene, drawn uniformly; a digit that finds no free
            place after ``PLACEMENT_TRIES`` random positions is left out (at the defaults, one digit of
            about one three-digit scene in ten).
        noise: the background's uniform noise, as a fraction of full brightness.
        seed: the scenes' random seed: the same parameters write the same bytes.

    Returns:
        ``root``, as a ``Path``.

    Raises:
        ValueError: a bad parameter; or ``root`` holds something else (digit scenes of other
            parameters, or files that are no task of this kind), naming ``root``.
    """
    params = _parameters(num_train, num_val, canvas, digit_size, digits_per_scene, noise, seed)
    return write_folder_once(Path(root), params, RECORD, "digit scenes", _write_task)


def _parameters(
    num_train: int,
    num_val: int,
    canvas: int,
    digit_size: tuple[int, int],
    digits_per_scene: tuple[int, int],
    noise: float,
    seed: int,
) -> dict:
    """The recorded parameters (``scenes.json``), after checking them."""
    low, high = digit_size
    if num_train < 1 or num_val < 1:
        raise ConfigError(
            f"digit scenes need at least one scene per split, got num_train={num_train}, num_val={num_val}"
        )
    if not 8 <= low <= high <= canvas:
        raise ConfigError(
            f"digit_size must be (low, high) with 8 <= low <= high <= canvas={canvas}, got {digit_size}"
        )
    if not 1 <= digits_per_scene[0] <= digits_per_scene[1]:
        raise ConfigError(
            f"digits_per_scene must be (fewest, most) with 1 <= fewest <= most, got {digits_per_scene}"
        )
    if not 0 <= noise < THRESHOLD:
        raise ConfigError(
            f"noise must be in [0, {THRESHOLD}) so the background stays darker than a digit, got {noise}"
        )
    return {
        "task": "mae digit scenes",
        "format": FORMAT,
        "num_train": num_train,
        "num_val": num_val,
        "canvas": canvas,
        "digit_size": [low, high],
        "digits_per_scene": list(digits_per_scene),
        "noise": noise,
        "seed": seed,
    }


def _write_task(folder: Path, params: dict) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    intensity = (digits.images / 16.0).astype(np.float32)  # (1797, 8, 8) in [0, 1]
    index = np.arange(len(intensity))
    for split_number, split in enumerate(SPLITS):
        # DigitsDataset's split: the validation scenes never show a scan the training scenes show
        pool = index[index % 5 == 0] if split == "val" else index[index % 5 != 0]
        rng = np.random.default_rng([params["seed"], split_number])
        images, annotations = [], []
        for number in range(params[f"num_{split}"]):
            image, semantic, instances = _scene(rng, pool, intensity, digits.target, params)
            name = f"{number:06d}.png"
            _save_png(Image.fromarray(image).convert("RGB"), folder / IMAGES.format(split=split) / name)
            _save_png(Image.fromarray(semantic), folder / MASKS.format(split=split) / name)
            canvas = params["canvas"]
            images.append({"id": number + 1, "file_name": name, "width": canvas, "height": canvas})
            for mask, digit, source in instances:
                annotations.append(_annotation(len(annotations) + 1, number + 1, digit, source, mask))
        coco = {
            "info": {"description": f"mae digit scenes ({split}): scikit-learn digits on a dark canvas"},
            "images": images,
            "annotations": annotations,
            "categories": CATEGORIES,
        }
        path = folder / ANNOTATIONS.format(split=split)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(coco))
    (folder / RECORD).write_text(json.dumps(params, indent=2) + "\n")  # written last: the task is whole


def _scene(
    rng: np.random.Generator, pool: np.ndarray, intensity: np.ndarray, labels: np.ndarray, params: dict
) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, int, int]]]:
    """(image (S, S) uint8, semantic mask (S, S) uint8, [(instance mask (S, S) bool, digit, scan index)]) of
    one scene."""
    size = params["canvas"]
    canvas = rng.uniform(0.0, params["noise"], (size, size)).astype(np.float32)
    semantic = np.zeros((size, size), np.uint8)
    placed: list[tuple[int, int, int, int]] = []  # (top, left, height, width) of each digit's patch
    instances = []
    for _ in range(rng.integers(params["digits_per_scene"][0], params["digits_per_scene"][1] + 1)):
        source = rng.choice(pool)
        side = int(rng.integers(params["digit_size"][0], params["digit_size"][1] + 1))
        digit = _trim(_upscale(intensity[source], side))
        spot = _free_spot(rng, placed, *digit.shape, size)
        if spot is None:
            continue
        placed.append((*spot, *digit.shape))
        window = (slice(spot[0], spot[0] + digit.shape[0]), slice(spot[1], spot[1] + digit.shape[1]))
        canvas[window] = np.maximum(canvas[window], digit)
        mask = np.zeros((size, size), bool)
        mask[window] = digit > THRESHOLD
        semantic[mask] = labels[source] + 1
        instances.append((mask, int(labels[source]), int(source)))
    return np.rint(canvas * 255).astype(np.uint8), semantic, instances


def _trim(digit: np.ndarray) -> np.ndarray:
    """An upscaled digit cut to its mask's tight box and a 1 px margin (the scan's empty border away, so
    digits pack closer; the margin keeps the stroke's faint edge)."""
    rows, cols = np.nonzero(digit > THRESHOLD)
    top, left = max(rows.min() - 1, 0), max(cols.min() - 1, 0)
    return digit[top : rows.max() + 2, left : cols.max() + 2]


def _free_spot(
    rng: np.random.Generator, placed: list, height: int, width: int, size: int
) -> tuple[int, int] | None:
    """(top, left) of a ``height`` x ``width`` patch inside the canvas that overlaps none of ``placed``, or
    None."""
    tops = rng.integers(0, size - height + 1, PLACEMENT_TRIES)
    lefts = rng.integers(0, size - width + 1, PLACEMENT_TRIES)
    free = np.ones(PLACEMENT_TRIES, bool)
    for t, l, h, w in placed:
        free &= (tops >= t + h) | (t >= tops + height) | (lefts >= l + w) | (l >= lefts + width)
    first = np.flatnonzero(free)
    return (int(tops[first[0]]), int(lefts[first[0]])) if first.size else None


def _upscale(digit: np.ndarray, side: int) -> np.ndarray:
    """An (8, 8) scan in [0, 1] as a (side, side) bilinear upscale."""
    pixels = torch.from_numpy(digit)[None, None]
    return F.interpolate(pixels, size=(side, side), mode="bilinear", align_corners=False)[0, 0].numpy()


def _annotation(ann_id: int, image_id: int, digit: int, source: int, mask: np.ndarray) -> dict:
    """The COCO annotation of one digit: the tight box of its mask, the mask as uncompressed RLE, and (our
    own field, which COCO readers ignore) ``digit_index``, the scan's index in ``load_digits()``."""
    rows, cols = np.nonzero(mask)
    x, y = int(cols.min()), int(rows.min())
    w, h = int(cols.max()) + 1 - x, int(rows.max()) + 1 - y
    segmentation = {"size": list(mask.shape), "counts": rle_counts(mask)}
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": digit + 1,
        "bbox": [x, y, w, h],
        "area": int(mask.sum()),
        "iscrowd": 0,
        "segmentation": segmentation,
        "digit_index": source,
    }


def rle_counts(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE of an (H, W) mask: the lengths of alternating runs of 0 and 1 in
    column-major order, starting with (possibly zero) 0s."""
    flat = mask.astype(np.uint8).flatten(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    ends = np.concatenate([changes, [flat.size]])
    runs = np.diff(np.concatenate([[0], ends])).tolist()
    return [0, *runs] if flat[0] else runs


def _save_png(image: Image.Image, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")


class DigitScenesOnDisk(MainProcessLoading):
    """What every data module of the built-in digit scenes shares (detection, segmentation, their images
    for pretraining): the scenes' parameters, the input size and the loader defaults of built-in data
    (``MainProcessLoading``), and the scenes written to ``root`` when first prepared, then reused: the same
    parameters give the same files whichever module wrote them. Put it before the data module's base class,
    which takes ``root`` (kept as ``self.root``) and ``img_size``.

    Args:
        root: where the scenes are written, or found.
        num_train: training scenes.
        num_val: validation scenes.
        canvas: side of every scene in pixels.
        seed: the scenes' random seed: the same parameters write the same files (``write_digit_scenes``).
        img_size: the input side in pixels; the canvas side keeps the digits at the size they were written.
        **kwargs: the settings of the data module's base class.
    """

    def __init__(
        self,
        root: str = "data/digit_scenes",
        num_train: int = 1000,
        num_val: int = 200,
        canvas: int = 64,
        seed: int = 0,
        img_size: int = 64,
        **kwargs: Any,
    ) -> None:
        super().__init__(root=root, img_size=img_size, **kwargs)
        self.scene_kwargs = dict(num_train=num_train, num_val=num_val, canvas=canvas, seed=seed)

    def prepare_data(self) -> None:
        write_digit_scenes(self.root, **self.scene_kwargs)

    def setup(self, stage: str | None = None) -> None:
        # a reuse check when prepare_data (rank 0) wrote them; writes them when it did not run
        self.prepare_data()
        super().setup(stage)
