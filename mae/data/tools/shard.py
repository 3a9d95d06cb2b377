"""Convert an ImageFolder (e.g. an ImageNet subset) into streaming shards, local or on S3.

    mae shard /data/imagenet --out /data/imagenet-shards --class-list mae/configs/imagenet100_classes.txt
    mae shard /data/imagenet --out s3://bucket/imagenet100 --num-classes 100 --workers 16

Each split (``train``, and ``val`` when it exists) becomes a litdata folder ``OUT/<split>/``
(``index.json`` + ``chunk-*.bin``) of samples ``{"image": the file's original bytes, "label": class
index, "index": position in the sorted listing, "name": "<class>/<file>"}``: no re-encoding, so the
pixels are the file's, at any bit depth and band count (8/16-bit PNG, TIFF, ``.npy``, as the
folder data module reads them). Samples are written in a seeded random order: litdata shuffles whole shards
and then samples within a window, so class-sorted shards would give batches of few classes, and
in random order any run of samples (e.g. the first N, for a kNN memory bank) is a random sample.
Every file is decoded once while sharding, and unreadable ones (corrupt, truncated, not an image,
over the pixel limit) are skipped by name, as the folder data module does. ``OUT/mae_shards.json``
(format, version, classes, per-split counts) is written last, so a folder without it is an
unfinished conversion. ``--overwrite`` deletes exactly the files an earlier conversion wrote
(named in its records: ``mae_shards.json``, the splits' ``index.json``, ``mae_shards.partial.json``
of an interrupted one, also one killed part-way, whose rerun with ``--overwrite`` completes it) and
the tool refuses an OUT holding anything else, naming it.
``mae.data.StreamingDataModule`` reads the result.
"""

import json
import os
import random
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from mae.data.decoding.formats import EncodedImage, dataset_extensions
from mae.data.decoding.image import pixel_format, read_pixels
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.decoding.rgb import read_rgb
from mae.data.sources.folder import ImageFolderSubset
from mae.data.sources.layout import sample_pixels, selected_classes, train_folder
from mae.data.sources.shard_format import FORMAT, METADATA, PARTIAL, VERSION
from mae.data.tools.shard_destination import check_destination, clear_destination, private_workspace
from mae.errors import InputError, UsageError
from mae.io import storage
from mae.io.file_names import storable_name

# Shard files (litdata "chunks") of about this size: large enough for few object-storage requests
# per epoch, small enough that the local cache and a shuffle window hold many of them.
DEFAULT_CHUNK_BYTES = "64MB"


_KINDS_NOTED: set[tuple[str, tuple[int, str]]] = set()  # per process: (kinds_dir, kind) already written


def note_kind(kinds_dir: str, image: EncodedImage) -> None:
    """Record ``image``'s (channels, dtype) in a JSON file of its own in ``kinds_dir`` the first time
    this process sees that kind, so the main process learns every kind in the data without a second
    pass. File names are data (they may hold newlines), so each note is a JSON document, not a line."""
    kind = pixel_format(image).kind
    if (kinds_dir, kind) not in _KINDS_NOTED:
        _KINDS_NOTED.add((kinds_dir, kind))
        note = {"channels": kind[0], "dtype": kind[1], "file": storable_name(str(image.name))}
        (Path(kinds_dir) / f"{uuid.uuid4().hex}.json").write_text(json.dumps(note))


def noted_kinds(kinds_dir: str) -> dict[tuple[int, str], str]:
    """{(channels, dtype): the first (sorted) noted file of that kind} from all workers' ``note_kind``
    files."""
    kinds: dict[tuple[int, str], str] = {}
    for path in Path(kinds_dir).glob("*.json"):
        note = json.loads(path.read_text())
        kind = (int(note["channels"]), note["dtype"])
        kinds[kind] = min(kinds.get(kind, note["file"]), note["file"])
    return dict(sorted(kinds.items()))


def encode_sample(
    item: tuple[str, int, int, str, int | None, tuple[int, str] | None, str],
) -> Iterator[dict[str, Any]]:
    """litdata ``optimize`` function: one sample for a readable image file, none for an unreadable one.

    Args:
        item: (path, label, index, name, max_pixels, pixels, kinds_dir): ``pixels`` is the
            (channels, dtype) every file of array-path data must have, None for 8-bit images;
            ``kinds_dir`` collects the kinds seen (``note_kind``).

    Yields:
        {"image": the file's bytes, "label", "index", "name"}, after the bytes decoded as the data
        module will decode them (to RGB, or to an array of the expected channels and dtype).
    """
    path, label, index, name, max_pixels, pixels, kinds_dir = item
    try:
        with open(path, "rb") as f:
            data = f.read()
        if pixels is None:
            read_rgb(
                EncodedImage(data, path), max_pixels
            )  # the reader's own check: what decodes here streams
        else:
            read_pixels(EncodedImage(data, path), None, pixels, max_pixels)  # as the array path reads it
        note_kind(kinds_dir, EncodedImage(data, path))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        print(f"skipping unreadable image {path} ({err})", file=sys.stderr, flush=True)
        return
    yield {"image": data, "label": label, "index": index, "name": name}


def list_split(
    folder: Path, classes: list[str], max_per_class: int | None, arrays: bool = False
) -> list[tuple[str, int, str]]:
    """(path, label, "<class>/<relative path>") of the image files of ``folder/<class>`` (sorted, each
    folder listed once as the folder data module lists it), at most ``max_per_class`` per class;
    with ``arrays`` also ``.npy`` files."""
    listing = ImageFolderSubset(folder, classes, max_per_class, extensions=dataset_extensions(arrays))
    return [(path, label, storable_name(os.path.relpath(path, folder))) for path, label in listing.samples]


def describe_pixels(folder: Path, classes: list[str]) -> dict[str, Any]:
    """What the data module needs to know before reading: ``array`` (TIFF, ``.npy`` or not 8-bit: the
    array path, which keeps bit depth and bands) and ``pixels``, the (channels, dtype) of a sample of
    the files (None when 8-bit files differ, e.g. RGB and grayscale, which the RGB path converts).

    Raises:
        ValueError: array-path files that differ in channels or bit depth, naming two.
    """
    sample = sample_pixels(folder, classes)
    arrays = not sample.rgb_readable
    if arrays and sample.kinds:
        return {"array": True, "pixels": list(sample.one_kind()[0])}
    return {"array": arrays, "pixels": list(next(iter(sample.kinds))) if len(sample.kinds) == 1 else None}


def write_split(
    samples: list[tuple[str, int, str]],
    out: str,
    settings: "ShardSettings",
    pixels: tuple[int, str] | None,
    kinds_dir: str,
) -> dict[str, int]:
    """Shard ``samples`` into the empty litdata folder ``out``, checking array-path files against
    ``pixels`` (``encode_sample``); returns its counts (images, bytes, shards, skipped)."""
    from litdata import optimize

    inputs = [
        (path, label, i, name, settings.max_image_pixels, pixels, kinds_dir)
        for i, (path, label, name) in enumerate(samples)
    ]
    random.Random(settings.seed).shuffle(inputs)
    optimize(
        fn=encode_sample,
        inputs=inputs,
        output_dir=out,
        chunk_bytes=settings.chunk_bytes,
        num_workers=settings.workers,
        mode=None,  # OUT/<split> is empty here: shard() cleared exactly what an earlier conversion wrote
        storage_options=settings.storage_options or {},
        reorder_files=False,
        start_method=settings.start_method,
    )
    index = storage.read_json(storage.join(out, "index.json"), settings.storage_options)
    if index is None:
        raise storage.StorageError(f"litdata wrote no index.json to {out}")
    chunks = index.get("chunks", [])
    images = sum(c["chunk_size"] for c in chunks)
    return {
        "images": images,
        "bytes": sum(c["chunk_bytes"] for c in chunks),
        "shards": len(chunks),
        "skipped": len(samples) - images,
    }


@dataclass(frozen=True)
class ShardSettings:
    """What ``shard`` converts: ``root``'s ``train_split`` (and ``val_split`` when it exists; "": none)
    into shards at ``out`` (a folder or ``s3://bucket/prefix``, at ``endpoint_url``: default
    ``AWS_ENDPOINT_URL``). Classes: ``num_classes`` of them (``class_selection`` "first" or "random"), or
    the folder names in the file ``class_list``, or all; at most ``max_images_per_class`` training images
    per class. ``seed``: the samples' order (and a random class selection); ``max_image_pixels``: larger
    images are skipped; ``workers``: processes that read files (started with ``start_method``, litdata's
    default spawn); ``chunk_bytes``: shard size ("64MB"); ``overwrite``: replace an earlier conversion."""

    root: str | Path
    out: str
    train_split: str = "train"
    val_split: str = "val"
    num_classes: int | None = None
    class_list: str | None = None
    class_selection: str = "first"
    seed: int = 0
    max_images_per_class: int | None = None
    max_image_pixels: int | None = DEFAULT_MAX_PIXELS
    workers: int = 1
    chunk_bytes: str | int = DEFAULT_CHUNK_BYTES
    endpoint_url: str | None = None
    overwrite: bool = False
    start_method: str | None = None

    @property
    def storage_options(self) -> dict | None:
        return {"endpoint_url": self.endpoint_url} if self.endpoint_url else None


def shard(settings: ShardSettings) -> dict[str, Any]:
    """Convert ``settings.root`` into shards at ``settings.out``; returns the metadata written.

    Raises:
        UsageError: ``max_images_per_class`` below 1.
        InputError: ``workers`` below 1; no readable training image.
        OutputError: ``out`` holds files no earlier conversion wrote (``check_destination``).
    """
    if settings.max_images_per_class is not None and settings.max_images_per_class < 1:
        raise UsageError(f"--max-images-per-class must be >= 1, got {settings.max_images_per_class}")
    if settings.workers < 1:
        raise InputError(f"--workers must be >= 1, got {settings.workers}")
    root, out, options = Path(settings.root), str(settings.out), settings.storage_options
    train_dir = train_folder(root, settings.train_split, "--train-split")
    earlier = check_destination(root, out, settings.overwrite, options)
    classes = selected_classes(
        train_dir, settings.class_list, settings.num_classes, settings.class_selection, settings.seed
    )
    described = describe_pixels(train_dir, classes)
    storage.allow_plain_http(options)
    arrays = described["array"]
    splits = {settings.train_split: list_split(train_dir, classes, settings.max_images_per_class, arrays)}
    if settings.val_split and (root / settings.val_split).is_dir():
        splits[settings.val_split] = list_split(root / settings.val_split, classes, None, arrays)
    clear_destination(out, earlier, list(splits), options)
    pixels = tuple(described["pixels"]) if arrays else None  # what every array-path file must have
    counts, kinds = write_splits(splits, settings, pixels)
    counts = without_empty_splits(counts, root, settings)
    # Every kind the workers saw, not the start-up sample's: grayscale among RGB is fine for the RGB
    # path, but not for reading with another in_chans, which the data module then refuses.
    if len(kinds) == 1:
        described["pixels"] = list(next(iter(kinds)))
    elif len(kinds) > 1:
        described["pixels"] = None
        described["kinds"] = [[c, dtype, example] for (c, dtype), example in kinds.items()]
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "id": uuid.uuid4().hex[:12],
        "classes": classes,
        "train_split": settings.train_split,
        "splits": counts,
        "order": f"random, seed {settings.seed}",
        **described,
        "source": str(root.resolve()),
        "split_folders": list(splits),  # all written, also a dropped empty one
    }
    storage.write_json(storage.join(out, METADATA), metadata, options)
    storage.delete(storage.join(out, PARTIAL), options)
    print_counts(counts, len(classes), out)
    return metadata


def write_splits(
    splits: dict[str, list[tuple[str, int, str]]], settings: ShardSettings, pixels: tuple[int, str] | None
) -> tuple[dict[str, dict[str, int]], dict[tuple[int, str], str]]:
    """Shard each split into ``OUT/<split>`` (``write_split``); returns their counts and every (channels,
    dtype) kind the workers saw (``noted_kinds``)."""
    counts = {}
    with private_workspace() as work:
        kinds_dir = os.path.join(work, "kinds")
        os.mkdir(kinds_dir)
        for name, samples in splits.items():
            split_out = storage.join(str(settings.out), name)
            print(
                f"sharding {len(samples)} images of {Path(settings.root) / name} into {split_out}", flush=True
            )
            counts[name] = write_split(samples, split_out, settings, pixels, kinds_dir)
        return counts, noted_kinds(kinds_dir)


def without_empty_splits(counts: dict[str, dict[str, int]], root: Path, settings: ShardSettings) -> dict:
    """``counts`` without a split of which every file was skipped (said so).

    Raises:
        InputError: every training file was skipped: nothing is written.
    """
    for name, c in list(counts.items()):
        if c["images"] == 0 and name == settings.train_split:
            raise InputError(
                f"no readable image in {root / name}: all {c['skipped']} files were skipped (see the "
                f"messages above); nothing was written to {storage.join(str(settings.out), METADATA)}"
            )
        if c["images"] == 0:
            print(
                f"{name}: all {c['skipped']} files were skipped; the shards have no {name} split", flush=True
            )
            del counts[name]
    return counts


def print_counts(counts: dict[str, dict[str, int]], classes: int, out: str) -> None:
    """Each split's images, bytes, shards and skipped files, then how to train on the shards."""
    for name, c in counts.items():
        print(
            f"{name}: {c['images']} images in {classes} classes, {c['bytes'] / 1e6:.1f} MB in "
            f"{c['shards']} shard(s), {c['skipped']} unreadable file(s) skipped"
        )
    print(
        f"wrote {storage.join(out, METADATA)}; train with data.class_path: mae.data.StreamingDataModule, "
        f"data.root: {out}"
    )
