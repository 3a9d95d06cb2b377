"""Convert an ImageFolder (e.g. an ImageNet subset) into streaming shards, local or on S3.

    python -m mae.data.shard /data/imagenet /data/imagenet-shards --class-list configs/imagenet100_classes.txt
    python -m mae.data.shard /data/imagenet s3://bucket/imagenet100 --num-classes 100 --workers 16

Each split (``train``, and ``val`` when it exists) becomes a litdata folder ``OUT/<split>/``
(``index.json`` + ``chunk-*.bin``) of samples ``{"image": the file's original bytes, "label": class
index, "index": position in the sorted listing, "name": "<class>/<file>"}``: no re-encoding, so the
pixels are the file's. Samples are written in a seeded random order: litdata shuffles whole shards
and then samples within a window, so class-sorted shards would give batches of few classes, and
in random order any run of samples (e.g. the first N, for a kNN memory bank) is a random sample.
Every file is decoded once while sharding, and unreadable ones (corrupt, truncated, not an image,
over the pixel limit) are skipped by name, as the folder data module does. ``OUT/mae_shards.json``
(format, version, classes, per-split counts) is written last, so a folder without it is an
unfinished conversion. ``mae.data.StreamingDataModule`` reads the result.
"""

import argparse
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

from mae.data import storage
from mae.data.datasets import ImageFolderSubset, sample_files, select_classes
from mae.data.readers import ARRAY_EXTENSIONS, probe
from mae.data.transforms import DEFAULT_MAX_PIXELS, EncodedImage, _decode_rgb

FORMAT = "mae-shards"
VERSION = 1
METADATA = "mae_shards.json"
# Shard files (litdata "chunks") of about this size: large enough for few object-storage requests
# per epoch, small enough that the local cache and a shuffle window hold many of them.
DEFAULT_CHUNK_BYTES = "64MB"


def encode_sample(item: tuple[str, int, int, str, int | None]) -> Iterator[dict[str, Any]]:
    """litdata ``optimize`` function: one sample for a readable image file, none for an unreadable one.

    Args:
        item: (path, label, index, name, max_pixels).

    Yields:
        {"image": the file's bytes, "label", "index", "name"}, after the bytes decoded to RGB.
    """
    path, label, index, name, max_pixels = item
    try:
        with open(path, "rb") as f:
            data = f.read()
        _decode_rgb(EncodedImage(data, path), max_pixels)  # the reader's own check: what decodes here streams
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        print(f"skipping unreadable image {path} ({err})", file=sys.stderr, flush=True)
        return
    yield {"image": data, "label": label, "index": index, "name": name}


def list_split(folder: Path, classes: list[str], max_per_class: int | None) -> list[tuple[str, int, str]]:
    """(path, label, "<class>/<relative path>") of the image files of ``folder/<class>`` (sorted, each
    folder listed once as the folder data module lists it), at most ``max_per_class`` per class."""
    listing = ImageFolderSubset(folder, classes, max_per_class, extensions=IMG_EXTENSIONS)
    return [(path, label, os.path.relpath(path, folder)) for path, label in listing.samples]


def check_eight_bit(folder: Path, classes: list[str]) -> None:
    """Refuse folders that the folder data module reads as arrays (16-bit, float, ``.npy``, multi-band):
    shards hold 8-bit images, which would lose their precision or bands.

    Raises:
        ValueError: naming the first such file.
    """
    for path in sample_files(folder, classes, IMG_EXTENSIONS + ARRAY_EXTENSIONS):
        try:
            channels, dtype = probe(path)
        except (OSError, ValueError, SyntaxError):
            continue  # unreadable: skipped by name while sharding
        if path.suffix.lower() == ".npy" or dtype != "uint8" or channels not in (1, 3):
            raise ValueError(
                f"{path} has {channels} channel(s) of {dtype}: shards hold 8-bit grayscale or RGB images "
                f"(JPEG, PNG, ...); train on this folder with mae.data.ImageFolderDataModule, which reads any "
                f"bit depth and band count"
            )


def write_split(
    samples: list[tuple[str, int, str]], out: str, args: argparse.Namespace, storage_options: dict | None
) -> dict[str, int]:
    """Shard ``samples`` into the litdata folder ``out``; returns its counts (images, bytes, shards, skipped)."""
    from litdata import optimize

    inputs = [(path, label, i, name, args.max_image_pixels) for i, (path, label, name) in enumerate(samples)]
    random.Random(args.seed).shuffle(inputs)
    optimize(
        fn=encode_sample,
        inputs=inputs,
        output_dir=out,
        chunk_bytes=args.chunk_bytes,
        num_workers=args.workers,
        mode="overwrite" if args.overwrite else None,
        storage_options=storage_options or {},
        reorder_files=False,
        start_method=args.start_method,
    )
    index = storage.read_json(storage.join(out, "index.json"), storage_options)
    if index is None:
        raise storage.StorageError(f"litdata wrote no index.json to {out}")
    chunks = index.get("chunks", [])
    images = sum(c["chunk_size"] for c in chunks)
    return {"images": images, "bytes": sum(c["chunk_bytes"] for c in chunks), "shards": len(chunks),
            "skipped": len(samples) - images}  # fmt: skip


def shard(args: argparse.Namespace) -> dict[str, Any]:
    """Convert ``args.root`` into shards at ``args.out``; returns the metadata written."""
    root, out = Path(args.root), str(args.out)
    storage_options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else None
    train_dir = root / args.train_split
    if not train_dir.is_dir():
        raise FileNotFoundError(
            f"training folder {train_dir} does not exist; expected {root}/{args.train_split}/<class>/<image> "
            f"(set --train-split)"
        )
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    available, _ = find_classes(str(train_dir))
    selected = select_classes(available, args.class_list, args.num_classes, args.class_selection, args.seed)
    classes = sorted(selected) if selected is not None else available
    check_eight_bit(train_dir, classes)
    if not storage.is_remote(out) and Path(out).is_file():
        raise FileExistsError(f"{out} is a file; give a folder (or an s3:// URL) for the shards")
    if storage.exists_any(out, storage_options) and not args.overwrite:
        raise FileExistsError(f"{out} is not empty; choose an empty folder or prefix, or pass --overwrite")
    storage.allow_plain_http(storage_options)
    storage.delete(storage.join(out, METADATA), storage_options)  # --overwrite: unfinished until rewritten

    splits = {args.train_split: list_split(train_dir, classes, args.max_images_per_class)}
    if args.val_split and (root / args.val_split).is_dir():
        splits[args.val_split] = list_split(root / args.val_split, classes, None)
    counts = {}
    for name, samples in splits.items():
        print(f"sharding {len(samples)} images of {root / name} into {storage.join(out, name)}", flush=True)
        counts[name] = write_split(samples, storage.join(out, name), args, storage_options)
    metadata = {
        "format": FORMAT, "version": VERSION, "classes": classes, "train_split": args.train_split,
        "splits": counts, "order": f"random, seed {args.seed}", "source": str(root.resolve()),
    }  # fmt: skip
    storage.write_json(storage.join(out, METADATA), metadata, storage_options)
    for name, c in counts.items():
        print(f"{name}: {c['images']} images in {len(classes)} classes, {c['bytes'] / 1e6:.1f} MB in {c['shards']} "
              f"shard(s), {c['skipped']} unreadable file(s) skipped")  # fmt: skip
    print(f"wrote {storage.join(out, METADATA)}; train with data.class_path: mae.data.StreamingDataModule, "
          f"data.root: {out}")  # fmt: skip
    return metadata


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m mae.data.shard")
    p.add_argument("root", help="dataset folder: ROOT/<train-split>/<class>/<image> (and ROOT/<val-split>/...)")
    p.add_argument("out", help="output folder or s3://bucket/prefix")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val", help="sharded with the same classes when it exists ('' : none)")
    selection = p.add_mutually_exclusive_group()
    selection.add_argument("--num-classes", type=int, default=None, help="use this many classes")
    selection.add_argument("--class-list", default=None, help="file with one class folder name per line")
    p.add_argument("--class-selection", choices=["first", "random"], default="first")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples' order (and of a random class selection)")
    p.add_argument("--max-images-per-class", type=int, default=None, help="cap on training images per class")
    p.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="larger images are skipped")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="processes that read files")
    p.add_argument("--chunk-bytes", default=DEFAULT_CHUNK_BYTES, help="shard size, e.g. 64MB")
    p.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (default: AWS_ENDPOINT_URL)")
    p.add_argument("--overwrite", action="store_true", help="replace shards already at OUT")
    p.add_argument("--start-method", choices=["spawn", "fork", "forkserver"], default=None,
                   help="multiprocessing start method of the workers (litdata's default: spawn)")  # fmt: skip
    args = p.parse_args(argv)
    if args.max_images_per_class is not None and args.max_images_per_class < 1:
        p.error(f"--max-images-per-class must be >= 1, got {args.max_images_per_class}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return shard(parse(argv))


if __name__ == "__main__":
    main()
