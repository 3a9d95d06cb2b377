"""Pretraining input pipeline throughput per loader worker: ours (from the folder and from local
shards) vs torchvision ``ImageFolder`` + PIL.

All read the same JPEGs and apply MAE's pretraining augmentation
(RandomResizedCrop 0.2-1 bicubic + horizontal flip + ImageNet normalisation), batched by a
``DataLoader`` with ``num_workers=0``, so images/s is what one worker process delivers. Ours is
``ImageFolderDataModule``'s training loader (``PretrainCrop``: libjpeg-turbo decoding into a tensor,
vectorised uint8 resize, uint8 samples); a worker does not normalise, the training step does
(``normalize_batch``, on the GPU in GPU runs), so it is reported both without and with that cost.
"streamed" is ``StreamingDataModule`` reading the same images from shards on local disk
(``mae shard``, the files' original bytes) with the same crop. Rounds rotate between
the contenders; the table reports medians.

    python benchmarks/dataloader.py                       # generated ~500x375 JPEGs, 224 and 112 px crops
    python benchmarks/dataloader.py --root /data/imagenet/train --img-sizes 224
    python benchmarks/dataloader.py --decode-device cuda --img-sizes 224   # + decoding on the GPU

With ``--decode-device`` it also measures ``data.decode_on: gpu``: a worker that only reads the
encoded bytes from the shards, and the batched decode + crop on that device (nvJPEG on CUDA), and
prints how many loader workers a GPU training at ``--target`` img/s needs with and without it.
"""

import argparse
import json
import math
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

from mae.cli.main import invoke
from mae.data import ImageFolderDataModule, StreamingDataModule
from mae.data.sources.shard_format import read_metadata
from mae.data.sources.streaming import DecodeSample, ResumableStreamingLoader, ShardedImages
from mae.data.views.gpu import collate_encoded, decode_pretrain_batch
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD, normalize_batch


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
    transform = T.Compose(
        [
            T.RandomResizedCrop(img_size, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    return DataLoader(ImageFolder(str(root), transform=transform), batch_size, shuffle=True, drop_last=True)


def our_loader(root: Path, img_size: int, batch_size: int) -> DataLoader:
    data = ImageFolderDataModule(
        str(root.parent),
        train_split=root.name,
        val_split=None,
        img_size=img_size,
        batch_size=batch_size,
        num_workers=0,
    )
    data.setup("fit")
    return data.train_dataloader()


def streaming_loader(shards: Path, img_size: int, batch_size: int) -> DataLoader:
    data = StreamingDataModule(
        str(shards),
        val_split=None,
        img_size=img_size,
        batch_size=batch_size,
        num_workers=0,
        cache_dir=str(shards.parent / "cache"),
    )
    data.setup("fit")
    return data.train_dataloader()


def encoded_loader(shards: Path, batch_size: int) -> DataLoader:
    """The loader of ``decode_on: gpu``: samples stay encoded (the worker reads bytes only)."""
    url = str(shards / "train")
    dataset = ShardedImages(
        url,
        read_metadata(str(shards))["classes"],
        DecodeSample(None, url),
        shuffle=True,
        cache_dir=str(shards.parent / "cache"),
    )
    return ResumableStreamingLoader(
        dataset, batch_size=batch_size, drop_last=True, collate_fn=collate_encoded
    )


def gpu_decode_rates(shards: Path, img_size: int, device: str, args: argparse.Namespace) -> dict[str, float]:
    """Median img/s of a worker reading encoded batches, and of decoding + cropping them on ``device``."""
    loader = encoded_loader(shards, args.batch_size)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    read, decode = [], []
    for r in range(args.rounds + 1):  # the first round warms the device up
        batches, start = [], time.perf_counter()
        for i, batch in enumerate(loader):
            batches.append(batch)
            if i + 1 == args.batches:
                break
        read_seconds = time.perf_counter() - start
        sync()
        start = time.perf_counter()
        for batch in batches:
            decode_pretrain_batch(batch.images, batch.names, (img_size, img_size), device)
        sync()
        if r:
            count = sum(len(b.images) for b in batches)
            read.append(count / read_seconds)
            decode.append(count / (time.perf_counter() - start))
    return {"encoded_worker": statistics.median(read), "device_decode": statistics.median(decode)}


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


def bench(root: Path, shards: Path, img_size: int, args: argparse.Namespace) -> dict[str, float]:
    """Median images/s of torchvision, of our folder loader, of our loader plus the batch normalisation
    that the training step does (on the training device; counted here as if on the CPU), and of our
    streaming loader on local shards."""
    loaders = {
        "torchvision": torchvision_loader(root, img_size, args.batch_size),
        "ours": our_loader(root, img_size, args.batch_size),
        "streamed": streaming_loader(shards, img_size, args.batch_size),
    }
    torch.manual_seed(0)
    names = list(loaders)
    results = {"torchvision": [], "ours": [], "ours + normalise": [], "streamed": []}
    for r in range(args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            count, load, normalize = timed_batches(loaders[name], args.batches, normalize=name == "ours")
            results[name].append(count / load)
            if name == "ours":
                results["ours + normalise"].append(count / (load + normalize))
    return {name: statistics.median(v) for name, v in results.items()}


def build_parser() -> argparse.ArgumentParser:
    """The script's options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--root", type=Path, default=None, help="a folder of <class>/<image> JPEGs (default: generate)"
    )
    p.add_argument("--images", type=int, default=400, help="images to generate (10 classes)")
    p.add_argument("--img-sizes", type=int, nargs="+", default=[224, 112])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=12, help="batches per timed round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--decode-device", default=None, help="also measure decoding batches there (cuda, cpu)")
    p.add_argument(
        "--target",
        type=float,
        default=4900,
        help="training img/s per GPU to size workers for "
        "(default: ViT-B/16 pretraining on an H200, docs/performance.md)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)  # a loader worker computes on one thread
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or write_photos(Path(tmp) / "images" / "train", 10, max(1, args.images // 10))
        shards = Path(tmp) / "shards"  # outside the image folder, as the shard tool requires
        invoke(
            "shard",
            [
                str(root.parent),
                "--out",
                str(shards),
                "--train-split",
                root.name,
                "--val-split",
                "",
                "--workers",
                "1",
                "--start-method",
                "fork",
            ],
        )
        print(f"images: {root}, per worker (num_workers=0, 1 thread), batch {args.batch_size}")
        print(
            "| crop | torchvision ImageFolder + PIL img/s | ours img/s (worker) | ours / torchvision "
            "| ours + batch normalisation img/s | ratio | streamed from local shards img/s | ratio |"
            "\n|---|---:|---:|---:|---:|---:|---:|---:|"
        )
        rows = []
        for size in args.img_sizes:
            r = bench(root, shards, size, args)
            reference, ours, ours_norm, streamed = (
                r["torchvision"],
                r["ours"],
                r["ours + normalise"],
                r["streamed"],
            )
            rows.append(
                dict(
                    img_size=size,
                    torchvision=reference,
                    ours=ours,
                    ours_normalised=ours_norm,
                    ratio=ours / reference,
                    ratio_normalised=ours_norm / reference,
                    streamed=streamed,
                    ratio_streamed=streamed / reference,
                )
            )
            print(
                f"| {size} px | {reference:.0f} | {ours:.0f} | {ours / reference:.2f}x | {ours_norm:.0f} "
                f"| {ours_norm / reference:.2f}x | {streamed:.0f} | {streamed / reference:.2f}x |",
                flush=True,
            )
        if args.decode_device:
            print(
                f"\ndecode_on gpu ({args.decode_device}); loader workers needed for {args.target:.0f} img/s\n"
                "| crop | worker img/s, decoding | worker img/s, bytes only "
                "| batch decode + crop on device img/s | workers, decoding | workers, bytes only |\n"
                "|---|---:|---:|---:|---:|---:|"
            )
            for row in rows:
                row.update(gpu_decode_rates(shards, row["img_size"], args.decode_device, args))
                row["workers_cpu_decode"] = math.ceil(args.target / row["streamed"])
                row["workers_gpu_decode"] = math.ceil(args.target / row["encoded_worker"])
                print(
                    f"| {row['img_size']} px | {row['streamed']:.0f} | {row['encoded_worker']:.0f} | "
                    f"{row['device_decode']:.0f} | {row['workers_cpu_decode']} | "
                    f"{row['workers_gpu_decode']} |",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
