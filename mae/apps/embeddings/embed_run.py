"""Embedding every image of folders and files into an index, in parts that survive a kill.

The listed images are cut into parts of ``part_size`` consecutive images. Each finished part is one
file in ``FILE.parts/``, written atomically (``mae.io.atomic``), beside a manifest of the run's settings
and inputs. A run that finds the manifest of the same run there embeds only the parts that are missing,
so a run stopped at any moment (SIGTERM, SIGKILL, a lost node) and started again with the same command
line writes every image's row exactly once. The index is assembled from the parts at the end, then the
folder is removed.
"""

import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from mae.apps.embeddings.embedder import Embedder
from mae.apps.embeddings.embedding_index import IndexMeta, Rows, check_suffix, write_index
from mae.data import Loader
from mae.data.decoding.formats import READERS
from mae.errors import ConfigError, MissingFileError
from mae.inference.images import IMAGE_ERRORS, image_paths, load_image
from mae.inference.normalization import Normalization
from mae.io.atomic import atomic_write
from mae.io.file_names import storable_name
from mae.io.outputs import Output

# The record of the run a parts folder belongs to.
MANIFEST = "manifest.json"
# A part, or the temporary file of one (or of the manifest) whose write a kill interrupted.
PART_FILE = re.compile(r"part-\d{6}\.npz|\.(part-\d{6}\.npz|manifest\.json)\.tmp-\d+")


@dataclass(frozen=True)
class ImageItem:
    """One image to embed: its absolute ``path`` and its ``label``, the class folder it sits in under an
    ImageFolder root given on the command line (None for a file given by name or one in the root itself)."""

    path: str
    label: str | None


def listed_images(sources: list[str | os.PathLike]) -> list[ImageItem]:
    """The images of ``sources`` (files, and folders searched recursively, as ``image_paths`` lists
    them), each once, in order.

    Raises:
        FileNotFoundError: a source that does not exist, or a folder without an image file.
    """
    items, seen = [], set()
    for source in map(Path, sources):
        if not source.exists():
            raise MissingFileError(f"{source} does not exist: give image files or folders of them")
        paths = image_paths([source])
        if not paths:
            raise MissingFileError(
                f"{source} holds no image file (looked for {', '.join(READERS)} in it and its "
                "sub-folders): give a folder of images, or the files themselves"
            )
        for path in paths:
            absolute = os.path.abspath(path)
            if absolute in seen:
                continue
            seen.add(absolute)
            inside = path.relative_to(source).parts if source.is_dir() else ()
            items.append(ImageItem(absolute, inside[0] if len(inside) > 1 else None))
    return items


def inputs_digest(items: list[ImageItem]) -> str:
    """SHA-256 of the listed images (paths and labels, in order)."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(os.fsencode(f"{item.path}\t{item.label}\n"))
    return digest.hexdigest()


class ImageFiles(Dataset):
    """Item i: (i, (C, H, W) model input or None, the error that made it None or None)."""

    def __init__(self, paths: list[str], size: tuple[int, int], norm: Normalization, max_pixels: int | None):
        self.paths, self.size, self.norm, self.max_pixels = paths, size, norm, max_pixels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str | None]:
        try:
            return i, load_image(self.paths[i], self.size, self.norm, self.max_pixels), None
        except IMAGE_ERRORS as err:
            return i, None, str(err) or type(err).__name__


def collate_loaded(samples: list) -> tuple[list[int], torch.Tensor | None, list[tuple[int, str]]]:
    """(indices of the images read, their (n, C, H, W) batch or None, (index, error) of the others)."""
    good = [(i, img) for i, img, _ in samples if img is not None]
    errors = [(i, error) for i, img, error in samples if img is None]
    return [i for i, _ in good], torch.stack([img for _, img in good]) if good else None, errors


@dataclass
class Part:
    """One part's outcome: its rows and the images it skipped ({"path", "error"})."""

    rows: Rows
    skipped: list[dict[str, str]]


class PartsFolder:
    """``FILE.parts/``: ``manifest.json`` (the run it belongs to) and ``part-NNNNNN.npz`` files."""

    def __init__(self, out: Path) -> None:
        self.folder = out.with_name(out.name + ".parts")

    def _part(self, number: int) -> Path:
        return self.folder / f"part-{number:06d}.npz"

    def resume(self, manifest: dict) -> set[int]:
        """The numbers of the parts already written for the run ``manifest`` describes; another run's
        parts are removed first (with a note). The folder must hold only parts (``is_ours``)."""
        existing = self.folder / MANIFEST
        if self.folder.is_dir():
            for leftover in self.folder.glob(".*.tmp-*"):  # a write that a kill interrupted
                leftover.unlink(missing_ok=True)
            if existing.is_file() and json.loads(existing.read_text()) == manifest:
                return {int(p.stem.split("-")[1]) for p in self.folder.glob("part-*.npz")}
            if any(self.folder.glob("part-*.npz")):
                print(
                    f"note: {self.folder} holds the parts of another run (other images, checkpoint or "
                    "settings): starting over",
                    file=sys.stderr,
                )
            self.remove()
        self.folder.mkdir(parents=True)
        atomic_write(existing, lambda tmp: tmp.write_text(json.dumps(manifest)))
        return set()

    @staticmethod
    def is_ours(folder: Path) -> bool:
        """Whether ``folder`` holds the parts of a run of this module and nothing else: its manifest,
        part files, and temporary files of writes a kill interrupted."""
        if not (folder / MANIFEST).is_file():
            return False
        return all(PART_FILE.fullmatch(p.name) or p.name == MANIFEST for p in folder.iterdir())

    def output(self) -> Output:
        """The parts folder as an output to check (``mae.io.outputs``)."""
        return Output(self.folder, "beside --out", kind="folder", ours=self.is_ours)

    def write(self, number: int, part: Part) -> None:
        def save(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a name
                np.savez(
                    f,
                    vectors=part.rows.vectors,
                    paths=np.array(part.rows.paths, dtype=str),
                    labels=np.array([label or "" for label in part.rows.labels], dtype=str),
                    labelled=np.array([label is not None for label in part.rows.labels], dtype=bool),
                    skipped=np.array([s["path"] for s in part.skipped], dtype=str),
                    errors=np.array([s["error"] for s in part.skipped], dtype=str),
                )

        atomic_write(self._part(number), save)

    def read(self, number: int) -> Part:
        with np.load(self._part(number), allow_pickle=False) as f:
            labels = [
                str(label) if labelled else None
                for label, labelled in zip(f["labels"], f["labelled"], strict=True)
            ]
            rows = Rows([str(p) for p in f["paths"]], labels, f["vectors"])
            skipped = [
                {"path": str(p), "error": str(e)} for p, e in zip(f["skipped"], f["errors"], strict=True)
            ]
        return Part(rows, skipped)

    def summary(self, number: int) -> tuple[int, list[dict[str, str]]]:
        """(rows, skipped images) of a part, without reading its vectors or paths."""
        with np.load(self._part(number), allow_pickle=False) as f:
            skipped = [
                {"path": str(p), "error": str(e)} for p, e in zip(f["skipped"], f["errors"], strict=True)
            ]
            return len(f["labelled"]), skipped

    def remove(self) -> None:
        """Delete the parts and the manifest, then the folder if that left it empty."""
        for path in self.folder.iterdir():
            if PART_FILE.fullmatch(path.name) or path.name == MANIFEST:
                path.unlink()
        if not any(self.folder.iterdir()):
            self.folder.rmdir()


class PartRows:
    """The rows of parts ``0 .. count - 1``, read from disk one part at a time on every pass."""

    def __init__(self, parts: PartsFolder, count: int) -> None:
        self.parts, self.count = parts, count

    def __iter__(self) -> Iterator[Rows]:
        return (self.parts.read(number).rows for number in range(self.count))


def part_batches(
    numbers: list[int], part_size: int, total: int, batch_size: int
) -> tuple[list[list[int]], set[int]]:
    """The batches (image indices) of parts ``numbers`` of ``total`` images, none across two parts, and
    the positions of the batches that finish a part."""
    batches, ends = [], set()
    for number in numbers:
        first, stop = number * part_size, min((number + 1) * part_size, total)
        batches += [
            list(range(start, min(start + batch_size, stop))) for start in range(first, stop, batch_size)
        ]
        ends.add(len(batches) - 1)
    return batches, ends


def embed_images(
    embedder: Embedder,
    items: list[ImageItem],
    out: str | Path,
    batch_size: int = 256,
    workers: int = 2,
    part_size: int = 4096,
    progress: bool = True,
) -> IndexMeta:
    """Embed ``items`` with ``embedder`` into the index ``out`` (.parquet or .npy), resuming a stopped
    run of the same command (see the module doc); unreadable images are skipped and recorded.

    Returns:
        The index's record (``meta.skipped``: the images skipped, with their errors).

    Raises:
        FileNotFoundError: no image given.
        ValueError: no image could be read, or an output that is not .parquet / .npy.
    """
    out = check_suffix(out)
    if not items:
        raise MissingFileError("no image to embed: give image files or folders of them")
    meta = _index_meta(embedder, items)
    parts = PartsFolder(out)
    count = math.ceil(len(items) / part_size)
    done = parts.resume({**meta.run(), "part_size": part_size, "count": count})
    batches, ends = part_batches(sorted(set(range(count)) - done), part_size, len(items), batch_size)
    dataset = ImageFiles([item.path for item in items], embedder.img_size, embedder.norm, embedder.max_pixels)
    loader = Loader(
        dataset, batch_sampler=batches, num_workers=workers if batches else 0, collate_fn=collate_loaded
    )
    remaining = sum(len(batch) for batch in batches)
    with tqdm(total=len(items), initial=len(items) - remaining, unit="img", disable=not progress) as bar:
        indices, vectors, skipped = [], [], []
        for position, (good, imgs, errors) in enumerate(loader):
            if imgs is not None:
                indices += good
                vectors.append(embedder(imgs).numpy())
            skipped += [{"path": storable_name(items[i].path), "error": error} for i, error in errors]
            if position in ends:
                rows = Rows(
                    [storable_name(items[i].path) for i in indices],
                    [None if items[i].label is None else storable_name(items[i].label) for i in indices],
                    np.concatenate(vectors) if vectors else np.zeros((0, meta.dim), np.float32),
                )
                parts.write(batches[position][0] // part_size, Part(rows, skipped))
                indices, vectors, skipped = [], [], []
            bar.update(len(batches[position]))
    return _assemble(parts, count, meta, out)


def _index_meta(embedder: Embedder, items: list[ImageItem]) -> IndexMeta:
    """The record of an index of ``items`` by ``embedder``, before any row is counted."""
    norm = embedder.norm
    return IndexMeta(
        embedder.checkpoint,
        embedder.fingerprint,
        embedder.pool,
        embedder.dim,
        list(embedder.img_size),
        norm.in_chans,
        list(norm.mean),
        list(norm.std),
        inputs_digest(items),
        feature_blocks=embedder.blocks,
    )


def _assemble(parts: PartsFolder, count: int, meta: IndexMeta, out: Path) -> IndexMeta:
    """Write the index ``out`` from the ``count`` finished parts (their rows and skipped images counted into
    ``meta``), then remove the parts.

    Raises:
        ConfigError: no image could be read.
    """
    for number in range(count):
        rows, skips = parts.summary(number)
        meta.count += rows
        meta.skipped += skips
    if meta.count == 0:
        parts.remove()
        first = meta.skipped[0]
        raise ConfigError(
            f"none of the {len(meta.skipped)} images could be read (the first, {first['path']}: "
            f"{first['error']})"
        )
    write_index(out, meta, PartRows(parts, count))
    parts.remove()
    return meta
