"""The dataset-folder layout, one set of rules for the folder data module, the shard tool and the
statistics command: ``ROOT/<train split>/<class>/<image>`` (and a validation split beside it),
listed as torchvision's ImageFolder lists it but entering each folder once (symlink loops) and
skipping entries that cannot be stat'ed; class selection (a list file, the first or a random K);
and what a sample of the files' headers says about how to read them (``sample_pixels``).
"""

import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from mae.data.decoding.formats import dataset_extensions, is_array_file
from mae.data.decoding.image import pixel_format
from mae.data.decoding.route import reads_as_rgb
from mae.data.decoding.units import check_channels
from mae.errors import InputError, MissingFileError

log = logging.getLogger(__name__)
SHIPPED_LISTS = (
    Path(__file__).resolve().parents[2] / "configs"
)  # mae/configs: the recipes and their class lists


def missing_train_split(
    root: str | Path, split: str, available: Sequence[str], setting: str, layout: str
) -> MissingFileError:
    """The one error for a dataset without its training split (a folder's sub-folder, a shard split):
    names it, ``setting`` (the option or key that sets it), the ``layout`` expected and the splits
    (``available``) there are."""
    there = f"it has {', '.join(sorted(available))}" if available else "it has none"
    return MissingFileError(
        f"{root} has no split {split!r}: training folder {root}/{split} does not exist; expected {layout} "
        f"(set {setting}); {there}"
    )


def train_folder(root: str | Path, split: str, setting: str) -> Path:
    """``root/split``, the training classes' folder.

    Raises:
        FileNotFoundError: it is not a folder (``missing_train_split``).
    """
    root = Path(root)
    if not (root / split).is_dir():
        layout = f"the ImageNet layout {root}/{split}/<class>/<image>"
        raise missing_train_split(root, split, _sub_folders(root), setting, layout)
    return root / split


def _sub_folders(folder: Path) -> list[str]:
    """The names of ``folder``'s sub-folders; none when it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return [entry.name for entry in entries if _entry_kind(entry) == "folder"]
    except OSError:
        return []


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
        log.warning(
            "%s: %d entry(ies) cannot be read (a dangling or looping link?), skipped: %s",
            directory,
            len(unreadable),
            ", ".join(sorted(unreadable)),
        )
    if not names:
        raise MissingFileError(
            f"no class folder in {directory}: expected {directory}/<class>/<image> (one sub-folder per class)"
        )
    return sorted(names)


def selected_classes(
    train_dir: str | Path,
    class_list: str | Path | None = None,
    num_classes: int | None = None,
    selection: str = "first",
    seed: int = 0,
) -> list[str]:
    """The sorted class folders of ``train_dir`` in use: all, or those ``select_classes`` picks."""
    available = class_folders(train_dir, warn=False)  # the dataset's own listing names unreadable entries
    selected = select_classes(available, class_list, num_classes, selection, seed)
    return sorted(selected) if selected is not None else available


def shipped_class_list(path: Path) -> Path:
    """``path``, or, when no such file exists from the current folder and ``path`` is a bare name or
    ``configs/<name>`` (as the recipes write it), the list of that name the package ships
    (``mae/configs/<name>``): so an installed package's recipes find it from any folder."""
    if path.is_file() or path.is_absolute() or path.parent not in (Path("."), Path("configs")):
        return path
    shipped = SHIPPED_LISTS / path.name
    return shipped if shipped.is_file() else path


def select_classes(
    available: Sequence[str],
    class_list: str | Path | None = None,
    num_classes: int | None = None,
    selection: str = "first",
    seed: int = 0,
) -> list[str] | None:
    """Class subset: names from a class-list file, or the first / a random ``num_classes``.

    A class-list file has one class folder name (e.g. an ImageNet wnid) per line; blank lines and
    ``#`` comments are ignored; a list the package ships is found by its name (``shipped_class_list``).
    Returns None for "all classes".
    """
    if class_list is not None:
        path = shipped_class_list(Path(class_list))
        if not path.is_file():
            raise MissingFileError(
                f"class_list file {path} does not exist (the package ships "
                f"{', '.join(p.name for p in sorted(SHIPPED_LISTS.glob('*.txt')))})"
            )
        names = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
        names = [n for n in names if n]
        if not names:
            raise InputError(f"class_list file {path} names no classes (one class folder name per line)")
        return names
    if num_classes is None:
        return None
    if not 1 <= num_classes <= len(available):
        raise InputError(f"num_classes={num_classes} but {len(available)} classes are available")
    if selection == "first":
        return list(available[:num_classes])
    if selection == "random":
        return sorted(random.Random(seed).sample(list(available), num_classes))
    raise InputError(f"class_selection must be 'first' or 'random', got {selection!r}")


def has_extension(path: str | os.PathLike, extensions: tuple[str, ...]) -> bool:
    """Whether the file's name ends (in any case) with one of ``extensions``."""
    return os.fspath(path).lower().endswith(extensions)


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
        found += [Path(p) for p in paths if has_extension(p, extensions)][:1]
    return found


@dataclass
class SampledPixels:
    """What a sample of a folder's files holds, from their headers (``sample_pixels``).

    Attributes:
        folder: the folder sampled, for messages.
        rgb_readable: every sampled file is 8-bit in a format PIL reads (``PixelFormat.rgb_readable``).
        kinds: {(channels, dtype name): the first sampled file of that kind}; unreadable files are
            left out (they are skipped, or raised, by name when they are loaded).
    """

    folder: Path
    rgb_readable: bool
    kinds: dict[tuple[int, str], Path]

    def array_path(self, in_chans: int) -> bool:
        """Whether an ``in_chans`` model reads these files through the array path (``reads_as_rgb``)."""
        return not reads_as_rgb(in_chans, self.rgb_readable)

    def one_kind(self) -> tuple[tuple[int, str], Path]:
        """The one (channels, dtype) of the sample, and a file that has it.

        Raises:
            ValueError: files of two kinds, naming one of each.
        """
        if len(self.kinds) > 1:
            (kind_a, a), (kind_b, b) = list(self.kinds.items())[:2]
            raise InputError(
                f"images in {self.folder} disagree: {a} has {kind_a[0]} channel(s) of {kind_a[1]}, {b} has "
                f"{kind_b[0]} of {kind_b[1]}; store every image with the same channels and bit depth"
            )
        ((kind, example),) = self.kinds.items()
        return kind, example

    def expected(self, in_chans: int) -> tuple[int, str] | None:
        """The (channels, dtype) every file must have when read for an ``in_chans`` model through the
        array path; None on the RGB path (which converts any 8-bit mode) or when no file was readable.

        Raises:
            ValueError: sampled files that disagree (naming two), or channels that do not fit ``in_chans``.
        """
        if not self.array_path(in_chans) or not self.kinds:
            return None
        kind, example = self.one_kind()
        check_channels(kind[0], in_chans, example)
        return kind


def sample_pixels(folder: str | Path, classes: Sequence[str]) -> SampledPixels:
    """The headers of a sample of ``folder/<class>`` files (``sample_files``)."""
    files = sample_files(folder, classes, dataset_extensions(arrays=True))
    kinds: dict[tuple[int, str], Path] = {}
    readable = not any(is_array_file(p) for p in files)
    for path in files:
        try:
            found = pixel_format(path)
        except (OSError, ValueError, SyntaxError):
            continue
        kinds.setdefault(found.kind, path)
        readable = readable and found.rgb_readable
    return SampledPixels(Path(folder), readable, kinds)
