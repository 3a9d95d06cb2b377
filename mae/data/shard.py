"""Convert an ImageFolder (e.g. an ImageNet subset) into streaming shards, local or on S3.

    python -m mae.data.shard /data/imagenet /data/imagenet-shards --class-list configs/imagenet100_classes.txt
    python -m mae.data.shard /data/imagenet s3://bucket/imagenet100 --num-classes 100 --workers 16

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
of an interrupted one) and the tool refuses an OUT holding anything else, naming it.
``mae.data.StreamingDataModule`` reads the result.
"""

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS

from mae.data import storage
from mae.data.datasets import ImageFolderSubset, class_folders, one_kind, sample_pixels, select_classes
from mae.data.readers import EncodedImage, probe, read_array, to_unit_range
from mae.data.transforms import DEFAULT_MAX_PIXELS, _decode_rgb

FORMAT = "mae-shards"
VERSION = 1
METADATA = "mae_shards.json"
# Shard files (litdata "chunks") of about this size: large enough for few object-storage requests
# per epoch, small enough that the local cache and a shuffle window hold many of them.
DEFAULT_CHUNK_BYTES = "64MB"


_KINDS_NOTED: set[tuple[str, tuple[int, str]]] = set()  # per process: (kinds_dir, kind) already written


def note_kind(kinds_dir: str, image: EncodedImage) -> None:
    """Record ``image``'s (channels, dtype) in a JSON file of its own in ``kinds_dir`` the first time
    this process sees that kind, so the main process learns every kind in the data without a second
    pass. File names are data (they may hold newlines), so each note is a JSON document, not a line."""
    kind = probe(image)
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
            _decode_rgb(EncodedImage(data, path), max_pixels)  # the reader's own check: what decodes here streams
        else:
            check_array(EncodedImage(data, path), pixels, max_pixels)
        note_kind(kinds_dir, EncodedImage(data, path))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        print(f"skipping unreadable image {path} ({err})", file=sys.stderr, flush=True)
        return
    yield {"image": data, "label": label, "index": index, "name": name}


def check_array(image: EncodedImage, pixels: tuple[int, str], max_pixels: int | None) -> None:
    """Read ``image`` as the array path does: the expected (channels, dtype), values in range.

    Raises:
        ValueError, OSError, DecompressionBombError: naming the file.
    """
    array = read_array(image, max_pixels)
    if (array.shape[2], array.dtype.name) != tuple(pixels):
        raise ValueError(f"{image} has {array.shape[2]} channel(s) of {array.dtype.name}, unlike the rest of the "
                         f"folder ({pixels[0]} of {pixels[1]})")  # fmt: skip
    to_unit_range(array, image)


def list_split(
    folder: Path, classes: list[str], max_per_class: int | None, arrays: bool = False
) -> list[tuple[str, int, str]]:
    """(path, label, "<class>/<relative path>") of the image files of ``folder/<class>`` (sorted, each
    folder listed once as the folder data module lists it), at most ``max_per_class`` per class;
    with ``arrays`` also ``.npy`` files."""
    extensions = IMG_EXTENSIONS + ((".npy",) if arrays else ())
    listing = ImageFolderSubset(folder, classes, max_per_class, extensions=extensions)
    return [(path, label, storable_name(os.path.relpath(path, folder))) for path, label in listing.samples]


def storable_name(name: str) -> str:
    """``name`` as valid UTF-8 text, as litdata stores strings: a file name that is not UTF-8 (on
    Linux any bytes) keeps its other characters and shows the invalid bytes as ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def describe_pixels(folder: Path, classes: list[str]) -> dict[str, Any]:
    """What the data module needs to know before reading: ``array`` (TIFF, ``.npy`` or not 8-bit: the
    array path, which keeps bit depth and bands) and ``pixels``, the (channels, dtype) of a sample of
    the files (None when 8-bit files differ, e.g. RGB and grayscale, which the RGB path converts).

    Raises:
        ValueError: array-path files that differ in channels or bit depth, naming two.
    """
    needs_arrays, kinds = sample_pixels(folder, classes)
    if needs_arrays and kinds:
        kind, _ = one_kind(kinds, folder)
        return {"array": True, "pixels": list(kind)}
    return {"array": needs_arrays, "pixels": list(next(iter(kinds))) if len(kinds) == 1 else None}


def write_split(
    samples: list[tuple[str, int, str]],
    out: str,
    args: argparse.Namespace,
    storage_options: dict | None,
    pixels: tuple[int, str] | None,
    kinds_dir: str,
) -> dict[str, int]:
    """Shard ``samples`` into the empty litdata folder ``out``, checking array-path files against
    ``pixels`` (``encode_sample``); returns its counts (images, bytes, shards, skipped)."""
    from litdata import optimize

    inputs = [(path, label, i, name, args.max_image_pixels, pixels, kinds_dir)
              for i, (path, label, name) in enumerate(samples)]  # fmt: skip
    random.Random(args.seed).shuffle(inputs)
    optimize(
        fn=encode_sample,
        inputs=inputs,
        output_dir=out,
        chunk_bytes=args.chunk_bytes,
        num_workers=args.workers,
        mode=None,  # OUT/<split> is empty here: shard() cleared exactly what an earlier conversion wrote
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


# A file or object name litdata's converter writes into a split folder: shards, the index, and the
# per-worker indexes it merges (left behind by an interrupted conversion).
LITDATA_FILE = re.compile(r"chunk-\d+-\d+\.bin|(\d+-)?index\.json")
# Written before a conversion changes OUT, removed after METADATA: what it replaces and which split
# folders it writes, so that --overwrite can also clear a conversion that was interrupted.
PARTIAL = "mae_shards.partial.json"
# atomic_write's temporary files of the two records, left by a kill during their write.
RECORD_TEMPORARY = re.compile(r"\.mae_shards(\.partial)?\.json\.tmp-\d+")


def conversion_files(out: str, storage_options: dict | None) -> tuple[list[str], set[str]]:
    """What is stored at ``out`` and which of it earlier conversions of this tool wrote, by their
    records: ``METADATA`` and, for each split folder it names, ``index.json`` and the chunk files
    listed in it; an unfinished conversion's ``PARTIAL`` record, the files it was replacing and the
    litdata files in the split folders it was writing.

    Returns:
        (every file or object under ``out``, relative to it; the subset this tool wrote).
    """
    stored = storage.list_files(out, storage_options)
    present = set(stored)
    owned: set[str] = set()
    splits: set[str] = set()
    metadata = storage.read_json(storage.join(out, METADATA), storage_options) if METADATA in present else None
    if isinstance(metadata, dict) and metadata.get("format") == FORMAT:
        owned.add(METADATA)
        splits |= {s for s in metadata.get("split_folders", metadata.get("splits", {})) if _plain_folder(s)}
    partial = storage.read_json(storage.join(out, PARTIAL), storage_options) if PARTIAL in present else None
    if isinstance(partial, dict) and partial.get("format") == FORMAT:
        owned |= {PARTIAL, METADATA} | {f for f in partial.get("files", []) if isinstance(f, str)}
        owned |= {f for f in present if RECORD_TEMPORARY.fullmatch(f)}
        for split in filter(_plain_folder, partial.get("splits", [])):
            owned |= {f for f in present if f.startswith(split + "/") and LITDATA_FILE.fullmatch(f[len(split) + 1 :])}
    for split in splits:
        index = storage.read_json(storage.join(out, split, "index.json"), storage_options)
        if isinstance(index, dict):
            owned.add(f"{split}/index.json")
            chunks = [c.get("filename") for c in index.get("chunks", []) if isinstance(c, dict)]
            owned |= {f"{split}/{name}" for name in chunks if isinstance(name, str) and LITDATA_FILE.fullmatch(name)}
    return stored, owned & present


def _plain_folder(name: Any) -> bool:
    """A relative folder name that stays below OUT (a split name read from a record)."""
    return isinstance(name, str) and bool(name) and not name.startswith("/") and ".." not in name.split("/")


def check_destination(root: Path, out: str, overwrite: bool, storage_options: dict | None) -> list[str]:
    """Refuse an ``out`` this conversion may not write, and return what ``--overwrite`` must delete
    there: exactly the files an earlier conversion wrote (``conversion_files``).

    Raises:
        FileExistsError: ``out`` is a file; holds files no conversion wrote (naming them, whatever
            ``overwrite``); or holds an earlier conversion and ``overwrite`` is off.
        ValueError: ``out`` is inside ``root``, where the next listing of ``root`` would read it.
    """
    if not storage.is_remote(out):
        if Path(out).is_file():
            raise FileExistsError(f"{out} is a file; give a folder (or an s3:// URL) for the shards")
        source, target = Path(os.path.realpath(root)), Path(os.path.realpath(out))
        if target.is_relative_to(source):
            raise ValueError(f"the output folder {out} is inside the dataset folder {root}, where it would be read as "
                             f"images or a class by the next conversion or training run; choose a folder outside "
                             f"{root}")  # fmt: skip
    stored, owned = conversion_files(out, storage_options)
    foreign = [f for f in stored if f not in owned]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FileExistsError(f"{out} is not empty: it holds {len(foreign)} file(s) that no conversion of this "
                              f"tool wrote there ({shown}); choose an empty folder or prefix, or move them "
                              "away")  # fmt: skip
    if stored and not overwrite:
        raise FileExistsError(f"{out} is not empty: it holds the {len(stored)} file(s) of an earlier conversion "
                              f"(named in its {METADATA} and index.json files); pass --overwrite to replace them, or "
                              f"choose an empty folder or prefix")  # fmt: skip
    return stored


def clear_destination(out: str, earlier: list[str], splits: list[str], storage_options: dict | None) -> None:
    """Record this conversion in ``PARTIAL``, then delete ``earlier`` (an earlier conversion's files),
    its ``METADATA`` first: until the new one is written, ``out`` reads as an unfinished conversion."""
    record = {"format": FORMAT, "files": sorted(set(earlier) - {PARTIAL}), "splits": splits}
    storage.write_json(storage.join(out, PARTIAL), record, storage_options)
    storage.delete(storage.join(out, METADATA), storage_options)
    storage.delete_files(out, [f for f in earlier if f not in (PARTIAL, METADATA)], storage_options)


# litdata's converter caches (shards before upload, downloaded inputs): {variable: our sub-folder}.
LITDATA_CACHES = {"DATA_OPTIMIZER_CACHE_FOLDER": "chunks", "DATA_OPTIMIZER_DATA_CACHE_FOLDER": "data"}


@contextmanager
def private_workspace() -> Iterator[str]:
    """A temporary folder for one conversion, removed at the end: the workers' kinds notes, and
    litdata's caches. litdata otherwise uses the fixed ``TMPDIR/chunks`` and ``TMPDIR/data`` (and
    empties them at each start), which concurrent conversions would share; a folder the user chose
    with litdata's variables becomes the parent of ours."""
    chosen = {name: os.environ.get(name) for name in LITDATA_CACHES}
    with tempfile.TemporaryDirectory(prefix="mae-shard-") as work:
        private = {}
        for name, sub in LITDATA_CACHES.items():
            os.makedirs(chosen[name] or work, exist_ok=True)
            private[name] = tempfile.mkdtemp(prefix=f"mae-shard-{sub}-", dir=chosen[name] or work)
        os.environ.update(private)  # read by litdata here and in the workers it starts
        try:
            yield work
        finally:
            for name, value in chosen.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            for folder in private.values():
                shutil.rmtree(folder, ignore_errors=True)


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
    earlier = check_destination(root, out, args.overwrite, storage_options)
    available = class_folders(train_dir, warn=False)  # named when list_split lists the folder
    selected = select_classes(available, args.class_list, args.num_classes, args.class_selection, args.seed)
    classes = sorted(selected) if selected is not None else available
    described = describe_pixels(train_dir, classes)
    storage.allow_plain_http(storage_options)

    arrays = described["array"]
    pixels = tuple(described["pixels"]) if arrays else None  # what every array-path file must have
    splits = {args.train_split: list_split(train_dir, classes, args.max_images_per_class, arrays)}
    if args.val_split and (root / args.val_split).is_dir():
        splits[args.val_split] = list_split(root / args.val_split, classes, None, arrays)
    clear_destination(out, earlier, list(splits), storage_options)
    counts = {}
    with private_workspace() as work:
        kinds_dir = os.path.join(work, "kinds")
        os.mkdir(kinds_dir)
        for name, samples in splits.items():
            print(f"sharding {len(samples)} images of {root / name} into {storage.join(out, name)}", flush=True)
            counts[name] = write_split(samples, storage.join(out, name), args, storage_options, pixels, kinds_dir)
        kinds = noted_kinds(kinds_dir)
    for name, c in list(counts.items()):
        if c["images"] == 0 and name == args.train_split:
            raise ValueError(f"no readable image in {root / name}: all {c['skipped']} files were skipped (see the "
                             f"messages above); nothing was written to {storage.join(out, METADATA)}")  # fmt: skip
        if c["images"] == 0:
            print(f"{name}: all {c['skipped']} files were skipped; the shards have no {name} split", flush=True)
            del counts[name]
    # Every kind the workers saw, not the start-up sample's: grayscale among RGB is fine for the RGB
    # path, but not for reading with another in_chans, which the data module then refuses.
    if len(kinds) == 1:
        described["pixels"] = list(next(iter(kinds)))
    elif len(kinds) > 1:
        described["pixels"] = None
        described["kinds"] = [[c, dtype, example] for (c, dtype), example in kinds.items()]
    metadata = {
        "format": FORMAT, "version": VERSION, "id": uuid.uuid4().hex[:12], "classes": classes,
        "train_split": args.train_split, "splits": counts, "order": f"random, seed {args.seed}", **described,
        "source": str(root.resolve()), "split_folders": list(splits),  # all written, also a dropped empty one
    }  # fmt: skip
    storage.write_json(storage.join(out, METADATA), metadata, storage_options)
    storage.delete(storage.join(out, PARTIAL), storage_options)
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
    from mae.command import run_command

    run_command(main)
