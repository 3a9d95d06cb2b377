"""What the anomaly tests score: smooth random images, a planted defect, a tiny MVTec AD tree of them,
scores.csv's rows, and the F1-maximising threshold by brute force."""

import csv
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD

SIZE = 16  # the fixture model's input: a 4 x 4 grid of 4 x 4 patches
DEFECT = (slice(1, 6), slice(9, 14))  # rows, columns of the planted defect: patches (0..1, 2..3)


def smooth_images(count: int, seed: int) -> np.ndarray:
    """(count, SIZE, SIZE, 3) uint8: a random colour with a gentle random gradient each."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(-1, 1, SIZE)
    base = rng.uniform(0.3, 0.7, (count, 1, 1, 3))
    slope = rng.uniform(-0.1, 0.1, (count, 2, 1, 1, 3))
    pixels = base + slope[:, 0] * ramp[:, None, None] + slope[:, 1] * ramp[None, :, None]
    return np.round(pixels.clip(0, 1) * 255).astype(np.uint8)


def plant_defect(image: np.ndarray) -> np.ndarray:
    """A flat square over ``DEFECT``, each channel 64 levels brighter or darker than the image there: a
    colour within the normal images' range, flat like them, but a step no smooth image has. A model that
    learnt nothing scores good images as high as these (checked: untrained, the scores overlap)."""
    damaged = image.astype(int)
    colour = damaged[DEFECT].mean(axis=(0, 1))
    damaged[DEFECT] = np.where(colour < 128, colour + 64, colour - 64).round()
    return damaged.astype(np.uint8)


def normalised(pixels: np.ndarray) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float, normalised as a checkpoint without a data record is read."""
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255
    return (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)


def write_tree(root: Path) -> Path:
    """A tiny MVTec AD layout of smooth images: train/good, test/good, test/checker, ground_truth/checker."""
    normal, test = smooth_images(8, seed=2), smooth_images(6, seed=3)
    for i, pixels in enumerate(normal):
        save(pixels, root / "train" / "good" / f"{i:03d}.png")
    for i, pixels in enumerate(test[:3]):
        save(pixels, root / "test" / "good" / f"{i:03d}.png")
    for i, pixels in enumerate(test[3:]):
        save(plant_defect(pixels), root / "test" / "checker" / f"{i:03d}.png")
        mask = np.zeros((SIZE, SIZE), np.uint8)
        mask[DEFECT] = 255
        save(mask, root / "ground_truth" / "checker" / f"{i:03d}_mask.png")
    return root


def save(pixels: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def brute_force_f1_max(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(threshold, F1): every cut below each distinct score s tried as ``scores >= s``, the fewest flagged
    of the best F1; the threshold of ``scores > t`` that flags the same: the next lower distinct score, or
    the float just below the lowest (in ``scores``' dtype)."""
    distinct = np.unique(scores)
    best = (-1.0, 0)
    for i, s in enumerate(distinct):
        predicted = scores >= s
        tp = np.sum(predicted & labels)
        f1 = 2 * tp / (predicted.sum() + labels.sum())
        if f1 > best[0] + 1e-12 or (abs(f1 - best[0]) <= 1e-12 and i > best[1]):
            best = (f1, i)
    cut = best[1]
    threshold = distinct[cut - 1] if cut > 0 else np.nextafter(distinct[0], -np.inf)
    return float(threshold), best[0]
