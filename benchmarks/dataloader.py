"""Pretraining input pipeline throughput per loader worker: ours vs torchvision ``ImageFolder`` + PIL.

Both read the same ImageFolder of JPEGs and apply MAE's pretraining augmentation
(RandomResizedCrop 0.2-1 bicubic + horizontal flip + ImageNet normalisation), batched by a
``DataLoader`` with ``num_workers=0``, so images/s is what one worker process delivers. Ours is
``ImageFolderDataModule``'s training loader (``PretrainCrop``: libjpeg-turbo decoding into a tensor,
vectorised uint8 resize, uint8 samples); a worker does not normalise, the training step does
(``normalize_batch``, on the GPU in GPU runs), so it is reported both without and with that cost.
Rounds rotate between the contenders; the table reports medians.

    python benchmarks/dataloader.py                       # generated ~500x375 JPEGs, 224 and 112 px crops
    python benchmarks/dataloader.py --root /data/imagenet/train --img-sizes 224
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms as T
from torchvision.datasets import ImageFolder

from mae.data import ImageFolderDataModule
from mae.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_batch


def write_photos(root: Path, classes: int, per_class: int, size=(500, 375), seed: int = 0) -> Path:
    """JPEGs (quality 90) of ImageNet's typical size with photo-like content: smooth colour fields,
    edges and sensor noise, which compress (and so decode) like photographs, unlike pure noise."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    for c in range(classes):
        (root / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            fx, fy, phase = rng.uniform(0.005, 0.05, 2).tolist() + [rng.uniform(0, 6.3)]
            base = rng.uniform(40, 215, 3)
            field = np.sin(xx * fx + phase)[..., None] * 50 + np.cos(yy * fy)[..., None] * 40 + base
            cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(40, 160)
            field[(xx - cx) ** 2 + (yy - cy) ** 2 < r**2] += rng.uniform(-80, 80, 3)  # an object with edges
            pixels = np.clip(field + rng.normal(0, 6, field.shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class_{c:03d}" / f"img_{i:04d}.jpg", quality=90)
    return root


def torchvision_loader(root: Path, img_size: int, batch_size: int) -> DataLoader:
    transform = T.Compose([
        T.RandomResizedCrop(img_size, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])  # fmt: skip
    return DataLoader(ImageFolder(str(root), transform=transform), batch_size, shuffle=True, drop_last=True)


def our_loader(root: Path, img_size: int, batch_size: int) -> DataLoader:
    data = ImageFolderDataModule(
        str(root.parent), train_split=root.name, val_split=None, img_size=img_size, batch_size=batch_size,
        num_workers=0,
    )  # fmt: skip
    data.setup("fit")
    return data.train_dataloader()


def timed_batches(loader: DataLoader, batches: int, normalize: bool) -> tuple[int, float, float]:
    """(images, seconds spent loading them, seconds spent normalising the batches) over ``batches``
    batches; the normalisation is timed on the same batches, so both rates see the same loads."""
    count, load_seconds, normalize_seconds = 0, 0.0, 0.0
    start = time.perf_counter()
    for i, (imgs, _) in enumerate(loader):
        loaded = time.perf_counter()
        load_seconds += loaded - start
        if normalize:
            imgs = normalize_batch(imgs)
        count += imgs.shape[0]
        start = time.perf_counter()
        normalize_seconds += start - loaded
        if i + 1 == batches:
            break
    return count, load_seconds, normalize_seconds


def bench(root: Path, img_size: int, args: argparse.Namespace) -> dict[str, float]:
    """Median images/s of torchvision, of our loader, and of our loader plus the batch normalisation
    that the training step does (on the training device; counted here as if on the CPU)."""
    loaders = {"torchvision": torchvision_loader(root, img_size, args.batch_size),
               "ours": our_loader(root, img_size, args.batch_size)}  # fmt: skip
    torch.manual_seed(0)
    names = list(loaders)
    results = {"torchvision": [], "ours": [], "ours + normalise": []}
    for r in range(args.rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            count, load, normalize = timed_batches(loaders[name], args.batches, normalize=name == "ours")
            results[name].append(count / load)
            if name == "ours":
                results["ours + normalise"].append(count / (load + normalize))
    return {name: statistics.median(v) for name, v in results.items()}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=None, help="a folder of <class>/<image> JPEGs (default: generate)")
    p.add_argument("--images", type=int, default=400, help="images to generate (10 classes)")
    p.add_argument("--img-sizes", type=int, nargs="+", default=[224, 112])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=12, help="batches per timed round")
    p.add_argument("--rounds", type=int, default=6)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    torch.set_num_threads(1)  # a loader worker computes on one thread
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or write_photos(Path(tmp) / "train", 10, max(1, args.images // 10))
        print(f"images: {root}, per worker (num_workers=0, 1 thread), batch {args.batch_size}")
        print(
            "| crop | torchvision ImageFolder + PIL img/s | ours img/s (worker) | ours / torchvision "
            "| ours + batch normalisation img/s | ratio |\n|---|---:|---:|---:|---:|---:|"
        )
        rows = []
        for size in args.img_sizes:
            r = bench(root, size, args)
            reference, ours, ours_norm = r["torchvision"], r["ours"], r["ours + normalise"]
            rows.append(dict(img_size=size, torchvision=reference, ours=ours, ours_normalised=ours_norm,
                             ratio=ours / reference, ratio_normalised=ours_norm / reference))  # fmt: skip
            print(
                f"| {size} px | {reference:.0f} | {ours:.0f} | {ours / reference:.2f}x | {ours_norm:.0f} "
                f"| {ours_norm / reference:.2f}x |",
                flush=True,
            )
    return rows


if __name__ == "__main__":
    main()
