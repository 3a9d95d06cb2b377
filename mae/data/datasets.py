"""Datasets: ImageNet-style folders with class subsets, local CIFAR files, and built-in digits."""

import logging
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision.datasets import CIFAR10, CIFAR100, ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from mae.data.transforms import DEFAULT_MAX_PIXELS, open_image, to_rgb

log = logging.getLogger(__name__)


def walk_once(top: str, seen: set[str]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """``os.walk(top, followlinks=True)`` that enters no folder whose resolved path is in ``seen``
    (and adds those it enters), so a symlink loop (``cat/parent -> ..``) or two links to one folder
    cannot repeat images. ``top`` itself is always entered.

    An entry that cannot be stat'ed (a dangling link, a link to itself such as ``loop.jpg ->
    loop.jpg``, a path the OS refuses) is listed as a file, as ``os.walk`` lists it: reading it then
    fails and names it like any unreadable file, instead of the listing stopping the run.

    Returns:
        ((folder, file names) for every folder entered, symlinked folders skipped as already seen).
    """
    seen.add(os.path.realpath(top))
    folders, skipped, pending = [], [], [top]
    while pending:
        folder = pending.pop()
        files = []
        with os.scandir(folder) as entries:
            for entry in entries:
                kind = _entry_kind(entry)
                if kind == "folder":
                    real = os.path.realpath(entry.path)
                    if real in seen:
                        skipped.append(entry.path)
                    else:
                        seen.add(real)
                        pending.append(entry.path)
                elif kind in ("file", "unreadable"):
                    files.append(entry.name)
        folders.append((folder, files))
    return folders, sorted(skipped)


def _entry_kind(entry: os.DirEntry) -> Literal["folder", "file", "unreadable", "other"]:
    """What a directory entry is after following links; "unreadable" when that cannot be known
    (dangling link, link loop: ``DirEntry.is_dir`` raises ELOOP for the latter), "other" for a FIFO,
    socket or device, which reading would block on or misread."""
    try:
        if entry.is_dir():
            return "folder"
        if entry.is_file():
            return "file"
        return "unreadable" if entry.is_symlink() and not os.path.exists(entry.path) else "other"
    except OSError:
        return "unreadable"


def class_folders(directory: str | Path, warn: bool = True) -> list[str]:
    """The sorted sub-folder names of ``directory`` (torchvision's ``find_classes`` listing), with
    entries that cannot be stat'ed (dangling link, link loop) skipped, and named in a warning if
    ``warn``, instead of stopping the listing.

    Raises:
        FileNotFoundError: no sub-folder, naming ``directory``.
    """
    names, unreadable = [], []
    with os.scandir(directory) as entries:
        for entry in entries:
            kind = _entry_kind(entry)
            if kind == "folder":
                names.append(entry.name)
            elif kind == "unreadable":
                unreadable.append(entry.path)
    if unreadable and warn:
        log.warning("%s: %d entry(ies) cannot be read (a dangling or looping link?), skipped: %s", directory,
                    len(unreadable), ", ".join(sorted(unreadable)))  # fmt: skip
    if not names:
        raise FileNotFoundError(
            f"no class folder in {directory}: expected {directory}/<class>/<image> (one sub-folder per class)"
        )
    return sorted(names)


class ImageFolderSubset(ImageFolder):
    """``ImageFolder`` restricted to chosen classes and at most ``max_per_class`` images each.

    Args:
        root: folder of ``<class>/<image>`` files.
        classes: class folder names to use (all when None); labels follow this sorted list.
        max_per_class: keep the first images (in sorted file order) of each class.
        transform: applied to each opened, not yet decoded PIL image (of any mode: the transform
            converts to RGB, as every transform of ``mae.data.transforms`` does), or to the file's
            path if the transform has ``reads_files = True`` (``PretrainCrop``).
        on_bad_image: "skip" an unreadable (corrupt, truncated, not an image, over ``max_pixels``)
            file, warning once per file and worker with its name, and use the next readable one; or
            "raise" at once.
        max_pixels: images with more pixels are refused as decompression bombs (None: no limit).
        extensions: the file endings listed (lower case).
    """

    def __init__(
        self,
        root: str | Path,
        classes: Sequence[str] | None = None,
        max_per_class: int | None = None,
        transform: Callable | None = None,
        on_bad_image: Literal["skip", "raise"] = "skip",
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        extensions: tuple[str, ...] = IMG_EXTENSIONS,
    ) -> None:
        if on_bad_image not in ("skip", "raise"):
            raise ValueError(f"data.on_bad_image must be 'skip' or 'raise', got {on_bad_image!r}")
        self._selected = sorted(classes) if classes is not None else None
        self.on_bad_image = on_bad_image
        self.max_pixels = max_pixels
        self.bad_files: set[str] = set()  # seen by this process (each loader worker has its own)
        self.extensions = extensions
        super().__init__(str(root), transform=transform, is_valid_file=self._has_image_extension)
        if max_per_class is not None:
            counts: dict[int, int] = {}
            kept = []
            for path, label in self.samples:
                if counts.get(label, 0) < max_per_class:
                    counts[label] = counts.get(label, 0) + 1
                    kept.append((path, label))
            self.samples = self.imgs = kept
            self.targets = [label for _, label in kept]

    def __getitem__(self, index: int) -> tuple[Any, int]:
        for offset in range(len(self.samples)):
            path, target = self.samples[(index + offset) % len(self.samples)]
            try:
                # Decoding happens in the transform (or here without one), so truncation and corruption
                # surface inside this block; a transform that reads files itself gets the path.
                if getattr(self.transform, "reads_files", False):
                    sample = self.transform(path)
                else:
                    sample = open_image(path, self.max_pixels)
                    sample = self.transform(sample) if self.transform is not None else to_rgb(sample)
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:  # undecodable or too large
                if self.on_bad_image == "raise":
                    raise ValueError(
                        f"cannot read image {path}: {err}; remove the file or set data.on_bad_image=skip"
                    ) from err
                if path not in self.bad_files:
                    self.bad_files.add(path)
                    log.warning("skipping unreadable image %s (%s); %d skipped so far", path, err, len(self.bad_files))
                continue
            return sample, target
        raise ValueError(f"no readable image among the {len(self.samples)} files of {self.root}")

    def make_dataset(
        self,
        directory: str,
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """torchvision's listing (sorted folders, then sorted files), entering each folder once."""
        valid = is_valid_file or (lambda path: has_file_allowed_extension(path, extensions))
        extensions = extensions or self.extensions
        samples, empty, skipped = [], [], []
        # The root and every class folder count as listed: a link back to them adds nothing.
        seen = {os.path.realpath(directory)} | {os.path.realpath(os.path.join(directory, c)) for c in class_to_idx}
        for name in sorted(class_to_idx):
            folders, links = walk_once(os.path.join(directory, name), seen)
            skipped += links
            found = [
                (os.path.join(root, f), class_to_idx[name]) for root, files in sorted(folders) for f in sorted(files)
            ]
            found = [item for item in found if valid(item[0])]
            if not found:
                empty.append(name)
            samples += found
        if skipped:
            shown = ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else "")
            log.warning("%s: %d symlinked folder(s) lead to folders already listed, skipped: %s", directory,
                        len(skipped), shown)  # fmt: skip
        if empty and not allow_empty:
            raise FileNotFoundError(
                f"Found no valid file for the classes {', '.join(empty)} in {directory}. "
                f"Supported extensions are: {', '.join(extensions or ())}"
            )
        return samples

    def _has_image_extension(self, path: str) -> bool:
        return has_file_allowed_extension(path, self.extensions)

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        classes = class_folders(directory)
        if self._selected is not None:
            missing = [c for c in self._selected if c not in set(classes)]
            if missing:
                shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
                raise FileNotFoundError(
                    f"{len(missing)} selected class(es) have no folder in {directory}: {shown} "
                    f"(found {len(classes)} class folders, e.g. {', '.join(classes[:3])})"
                )
            classes = self._selected
        return classes, {c: i for i, c in enumerate(classes)}


def sample_files(
    folder: str | Path, classes: Sequence[str], extensions: tuple[str, ...], count: int = 32
) -> list[Path]:
    """Up to ``count`` image files of ``folder/<class>``, the first (in sorted order) of up to
    ``count`` classes spread over ``classes``, without listing every file."""
    chosen = [classes[round(i)] for i in np.linspace(0, len(classes) - 1, min(count, len(classes)))]
    found = []
    for name in dict.fromkeys(chosen):
        folders, _ = walk_once(os.path.join(folder, name), set())
        paths = sorted(os.path.join(root, f) for root, files in folders for f in files)
        found += [Path(p) for p in paths if has_file_allowed_extension(p, extensions)][:1]
    return found


def sample_pixels(folder: str | Path, classes: Sequence[str]) -> tuple[bool, dict[tuple[int, str], Path]]:
    """What a sample of ``folder/<class>`` files holds, from their headers (``sample_files``).

    Returns:
        (whether they need the array path whatever ``in_chans`` is: TIFF, ``.npy`` or not 8-bit;
        {(channels, dtype name): the first sampled file of that kind}). Unreadable files are left
        out: they are skipped (or raised) by name when they are loaded.
    """
    from mae.data.readers import ARRAY_EXTENSIONS, probe

    files = sample_files(folder, classes, IMG_EXTENSIONS + ARRAY_EXTENSIONS)
    kinds: dict[tuple[int, str], Path] = {}
    for path in files:
        try:
            kinds.setdefault(probe(path), path)
        except (OSError, ValueError, SyntaxError):
            continue
    needs_arrays = any(p.suffix.lower() in ARRAY_EXTENSIONS for p in files) or any(d != "uint8" for _, d in kinds)
    return needs_arrays, kinds


def one_kind(kinds: dict[tuple[int, str], Path], folder: str | Path) -> tuple[tuple[int, str], Path]:
    """The one (channels, dtype) of ``sample_pixels``'s kinds, and a file that has it.

    Raises:
        ValueError: files of two kinds, naming one of each.
    """
    if len(kinds) > 1:
        (kind_a, a), (kind_b, b) = list(kinds.items())[:2]
        raise ValueError(
            f"images in {folder} disagree: {a} has {kind_a[0]} channel(s) of {kind_a[1]}, {b} has {kind_b[0]} of "
            f"{kind_b[1]}; store every image with the same channels and bit depth"
        )
    ((kind, example),) = kinds.items()
    return kind, example


def select_classes(
    available: Sequence[str],
    class_list: str | Path | None = None,
    num_classes: int | None = None,
    selection: str = "first",
    seed: int = 0,
) -> list[str] | None:
    """Class subset: names from a class-list file, or the first / a random ``num_classes``.

    A class-list file has one class folder name (e.g. an ImageNet wnid) per line; blank lines and
    ``#`` comments are ignored. Returns None for "all classes".
    """
    if class_list is not None:
        path = Path(class_list)
        if not path.is_file():
            raise FileNotFoundError(f"class_list file {path} does not exist")
        names = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
        names = [n for n in names if n]
        if not names:
            raise ValueError(f"class_list file {path} names no classes (one class folder name per line)")
        return names
    if num_classes is None:
        return None
    if not 1 <= num_classes <= len(available):
        raise ValueError(f"num_classes={num_classes} but {len(available)} classes are available")
    if selection == "first":
        return list(available[:num_classes])
    if selection == "random":
        return sorted(random.Random(seed).sample(list(available), num_classes))
    raise ValueError(f"class_selection must be 'first' or 'random', got {selection!r}")


def labelled_fraction(dataset: Dataset, fraction: float, seed: int = 0) -> Subset:
    """A seeded, class-balanced subset: ``round(fraction * n_c)`` (at least 1) images of each class c.

    The dataset must expose ``targets`` (ImageFolder, CIFAR and digits do); ``classes`` is kept.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"train fraction must be in (0, 1], got {fraction}")
    targets = torch.as_tensor(dataset.targets)
    generator = torch.Generator().manual_seed(seed)
    keep = []
    for label in targets.unique().tolist():
        members = torch.nonzero(targets == label).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        keep += members[: max(1, round(fraction * len(members)))].tolist()
    subset = Subset(dataset, sorted(keep))
    subset.classes = getattr(dataset, "classes", None)
    return subset


def fixed_subset(dataset: Dataset, count: int, seed: int = 0) -> Dataset:
    """At most ``count`` samples of ``dataset``, the same ones every call, drawn without touching the
    global RNG: a seeded random subset, or the first ``count`` of a dataset stored in random order
    (``stored_in_random_order``, e.g. shards), which reads the fewest shards."""
    if len(dataset) <= count:
        return dataset
    if getattr(dataset, "stored_in_random_order", False):
        return Subset(dataset, range(count))
    keep = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:count]
    return Subset(dataset, keep.tolist())


def _files_only(cls: type) -> type:
    """A torchvision CIFAR class that checks the standard files exist instead of their md5 sums,
    so locally re-packed copies in the standard python-pickle format load too."""
    return type(
        f"Local{cls.__name__}",
        (cls,),
        {
            "train_list": [[name, None] for name, _ in cls.train_list],
            "test_list": [[name, None] for name, _ in cls.test_list],
            "meta": {**cls.meta, "md5": None},
        },
    )


LocalCIFAR10 = _files_only(CIFAR10)
LocalCIFAR100 = _files_only(CIFAR100)
CIFAR_CLASSES = {"cifar10": LocalCIFAR10, "cifar100": LocalCIFAR100}


def cifar_files(name: str) -> tuple[str, list[str]]:
    """(folder name, file names) of the standard python-pickle release of ``name``."""
    cls = CIFAR_CLASSES[name]
    files = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    return cls.base_folder, files


class DigitsDataset(Dataset):
    """scikit-learn's handwritten digits (1,797 real 8x8 grayscale scans, 10 classes), offline.

    Every fifth image (index % 5 == 0) forms the validation split (360 images); the rest (1,437)
    the training split. Images are returned as 8x8 RGB PIL images; the transform resizes them.
    """

    def __init__(self, split: str = "train", transform: Callable | None = None) -> None:
        from sklearn.datasets import load_digits

        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        digits = load_digits()
        index = np.arange(len(digits.images))
        keep = index % 5 == 0 if split == "val" else index % 5 != 0
        self.images = np.round(digits.images[keep] * (255 / 16)).astype(np.uint8)
        self.targets = digits.target[keep].tolist()
        self.classes = [str(d) for d in range(10)]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        img = Image.fromarray(self.images[index]).convert("RGB")
        if self.transform is not None:
            img = self.transform(img)
        return img, self.targets[index]
