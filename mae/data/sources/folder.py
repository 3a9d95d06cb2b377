"""Image folders in the ImageNet layout (``mae.data.sources.layout``): the dataset of one split, and
the data module over a training and a validation split."""

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder

from mae.data.decoding.formats import dataset_extensions
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.decoding.rgb import open_image, to_rgb
from mae.data.sources.base import SplitDataModule
from mae.data.sources.layout import (
    class_folders,
    has_extension,
    sample_pixels,
    selected_classes,
    train_folder,
    walk_once,
)
from mae.errors import InputError, MissingFileError, check_at_least

log = logging.getLogger(__name__)


class ImageFolderSubset(ImageFolder):
    """``ImageFolder`` restricted to chosen classes and at most ``max_per_class`` images each.

    Args:
        root: folder of ``<class>/<image>`` files.
        classes: class folder names to use (all when None); labels follow this sorted list.
        max_per_class: keep the first images (in sorted file order) of each class.
        transform: applied to each opened, not yet decoded PIL image (of any mode: the transform
            converts to RGB, as every transform of ``mae.data.views.recipes`` does), or to the file's
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
        extensions: tuple[str, ...] = dataset_extensions(arrays=False),
    ) -> None:
        if on_bad_image not in ("skip", "raise"):
            raise InputError(f"data.on_bad_image must be 'skip' or 'raise', got {on_bad_image!r}")
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
            except (
                OSError,
                ValueError,
                SyntaxError,
                Image.DecompressionBombError,
            ) as err:  # undecodable or too large
                if self.on_bad_image == "raise":
                    raise InputError(
                        f"cannot read image {path}: {err}; remove the file or set data.on_bad_image=skip"
                    ) from err
                if path not in self.bad_files:
                    self.bad_files.add(path)
                    log.warning(
                        "skipping unreadable image %s (%s); %d skipped so far", path, err, len(self.bad_files)
                    )
                continue
            return sample, target
        raise InputError(f"no readable image among the {len(self.samples)} files of {self.root}")

    def make_dataset(
        self,
        directory: str,
        class_to_idx: dict[str, int],
        extensions: tuple[str, ...] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """torchvision's listing (sorted folders, then sorted files), entering each folder once."""
        valid = is_valid_file or (lambda path: has_extension(path, extensions))
        extensions = extensions or self.extensions
        samples, empty, skipped = [], [], []
        # The root and every class folder count as listed: a link back to them adds nothing.
        seen = {os.path.realpath(directory)} | {
            os.path.realpath(os.path.join(directory, c)) for c in class_to_idx
        }
        for name in sorted(class_to_idx):
            folders, links = walk_once(os.path.join(directory, name), seen)
            skipped += links
            found = [
                (os.path.join(root, f), class_to_idx[name])
                for root, files in sorted(folders)
                for f in sorted(files)
            ]
            found = [item for item in found if valid(item[0])]
            if not found:
                empty.append(name)
            samples += found
        if skipped:
            shown = ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else "")
            log.warning(
                "%s: %d symlinked folder(s) lead to folders already listed, skipped: %s",
                directory,
                len(skipped),
                shown,
            )
        if empty and not allow_empty:
            raise MissingFileError(
                f"Found no valid file for the classes {', '.join(empty)} in {directory}. "
                f"Supported extensions are: {', '.join(extensions or ())}"
            )
        return samples

    def _has_image_extension(self, path: str) -> bool:
        return has_extension(path, self.extensions)

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        classes = class_folders(directory)
        if self._selected is not None:
            missing = [c for c in self._selected if c not in set(classes)]
            if missing:
                shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
                raise MissingFileError(
                    f"{len(missing)} selected class(es) have no folder in {directory}: {shown} "
                    f"(found {len(classes)} class folders, e.g. {', '.join(classes[:3])})"
                )
            classes = self._selected
        return classes, {c: i for i, c in enumerate(classes)}


class ImageFolderDataModule(SplitDataModule):
    """ImageNet layout: ``root/<train_split>/<class>/<image>`` and optionally ``root/<val_split>/...``.

    Args:
        root: dataset folder.
        train_split: subfolder with the training classes.
        val_split: subfolder with the validation classes; skipped when it does not exist.
        class_list: file with one class folder name per line (e.g. the ImageNet-100 wnids).
        num_classes: use only this many classes (``class_selection`` picks which).
        class_selection: "first" (sorted names) or "random" (seeded by ``subset_seed``).
        max_images_per_class: cap on training images per class (first in sorted order).
        subset_seed: seed of the random class selection.
        on_bad_image: "skip" unreadable files (warning with their names) or "raise" at the first.
        **kwargs: the loader and augmentation settings of ``ImageDataModule``.
    """

    def __init__(
        self,
        root: str,
        train_split: str = "train",
        val_split: str | None = "val",
        class_list: str | None = None,
        num_classes: int | None = None,
        class_selection: Literal["first", "random"] = "first",
        max_images_per_class: int | None = None,
        subset_seed: int = 0,
        on_bad_image: Literal["skip", "raise"] = "skip",
        **kwargs: Any,
    ) -> None:
        super().__init__(Path(root), train_split, val_split, subset_seed=subset_seed, **kwargs)
        if class_list is not None and num_classes is not None:
            raise InputError("set data.class_list or data.num_classes, not both")
        if max_images_per_class is not None:
            check_at_least("data.max_images_per_class", max_images_per_class, 1, error=InputError)
        self.class_list = class_list
        self.num_classes = num_classes
        self.class_selection = class_selection
        self.max_images_per_class = max_images_per_class
        self.on_bad_image = on_bad_image

    def train_folder(self) -> Path:
        return train_folder(self.root, self.train_split, "data.root / data.train_split")

    def selected_classes(self) -> list[str]:
        """The class folders in use (after the class list / first-K / random-K selection)."""
        return selected_classes(
            self.train_folder(), self.class_list, self.num_classes, self.class_selection, self.subset_seed
        )

    @property
    def num_labels(self) -> int:
        return len(self.selected_classes())

    def configure_pixels(self) -> None:
        """Read a sample of the training files' headers: 8-bit images with 3 channels (RGB, grayscale,
        palette, RGBA, CMYK: converted to RGB) take the fast uint8 path; other channel counts
        (``in_chans``), 16-bit, float, TIFF and ``.npy`` files the array path, where every file must
        have the sample's channel count and bit depth.

        Raises:
            ValueError: sampled files that disagree (naming two of them), or channels that do not fit
                ``in_chans``.
        """
        sample = sample_pixels(self.train_folder(), self.selected_classes())
        self.array_mode = sample.array_path(self.in_chans)
        self.expected_pixels = sample.expected(self.in_chans)

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        classes = self.selected_classes()
        extensions = dataset_extensions(self.array_mode)
        train = ImageFolderSubset(
            self.train_folder(),
            classes,
            self.max_images_per_class,
            train_tf,
            self.on_bad_image,
            self.max_image_pixels,
            extensions,
        )
        val = None
        if self.val_split is not None and (self.root / self.val_split).is_dir():
            val = ImageFolderSubset(
                self.root / self.val_split,
                classes,
                None,
                eval_tf,
                self.on_bad_image,
                self.max_image_pixels,
                extensions,
            )
        return train, val
