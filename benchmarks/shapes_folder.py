"""A class-folder image dataset that needs no download, for benchmarks beside the built-in digits:
coloured shapes (circle, square, triangle, cross) of random size, position, rotation and colours on a
noisy background, written as PNG files in ``ROOT/{train,val}/<class>/``.

    python benchmarks/shapes_folder.py --out data/shapes        # 250 + 50 images a class, 32x32
    python benchmarks/time_to_quality.py --data imagefolder --root data/shapes --seeds 0

The folder is refused if it exists (nothing is overwritten).
"""

import argparse
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle", "cross")


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if kind == "square":
        corners = [(-1, -1), (1, -1), (1, 1), (-1, 1)]
    elif kind == "triangle":
        corners = [(math.cos(a), math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    else:  # cross: a plus sign of width 0.4 r
        w = 0.35
        corners = [
            (-w, -1),
            (w, -1),
            (w, -w),
            (1, -w),
            (1, w),
            (w, w),
            (w, 1),
            (-w, 1),
            (-w, w),
            (-1, w),
            (-1, -w),
            (-w, -w),
        ]
    cos, sin = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * cos - y * sin), cy + r * (x * sin + y * cos)) for x, y in corners]


def draw_shape(kind: str, size: int, rng: np.random.Generator) -> Image.Image:
    """One ``size`` x ``size`` RGB image of ``kind``."""
    background = rng.integers(0, 256, 3)
    noise = rng.normal(0, 18, (size, size, 3))
    pixels = np.clip(background + noise, 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    foreground = tuple(int(v) for v in (background + rng.choice([-1, 1], 3) * rng.integers(80, 160, 3)) % 256)
    r = rng.uniform(0.18, 0.38) * size
    cx, cy = rng.uniform(r, size - r, 2)
    draw = ImageDraw.Draw(image)
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=foreground)
    else:
        draw.polygon(_polygon(kind, cx, cy, r, rng.uniform(0, 2 * math.pi)), fill=foreground)
    return image


def write_shapes(root: Path, train: int, val: int, size: int, seed: int) -> None:
    if root.exists():
        raise SystemExit(f"error: --out {root} exists; choose a new folder (nothing is overwritten)")
    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for kind in CLASSES:
            folder = root / split / kind
            folder.mkdir(parents=True)
            for i in range(count):
                draw_shape(kind, size, rng).save(folder / f"{i:04d}.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train", type=int, default=250, help="training images per class")
    parser.add_argument("--val", type=int, default=50, help="validation images per class")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write_shapes(args.out, args.train, args.val, args.size, args.seed)
    print(f"wrote {len(CLASSES) * (args.train + args.val)} images under {args.out}")


if __name__ == "__main__":
    main()
