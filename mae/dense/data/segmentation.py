"""Semantic segmentation data: folders of images and PNG class masks matched by file stem (ADE20K's
``ADEChallengeData2016/{images,annotations}/{training,validation}`` layout, or any like it), and a
data module with mmsegmentation's training views (random rescale, crop with padding, flip).

Masks are index images: one channel whose value at a pixel is its class (modes ``L``, ``P``,
``I;16``, ``1``; 8-bit, palette, 16-bit, bilevel). A mask value equal to ``ignore_index`` marks an
unlabelled pixel. Batches are (N, 3, H, W) float32 images in [0, 1] (not normalised: the model does
that) and (N, H, W) int64 masks with ``ignore_index`` where a pixel is unlabelled or padding.
"""

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from torch.nn import functional as F
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from mae.data.decoding.formats import dataset_extensions
from mae.data.decoding.rgb import open_image, read_rgb
from mae.data.sources.digit_scenes import CATEGORIES, IMAGES, MASKS, DigitScenesOnDisk
from mae.data.sources.loader_workers import SplitLoaders
from mae.errors import ConfigError, InputError, MissingFileError

# Modes of PNGs whose pixel values are indices: 8-bit, palette (the index, not its colour), 16-bit, 32-bit
# integer (how older Pillow opens 16-bit PNGs), bilevel.
INDEX_MODES = ("L", "P", "I;16", "I;16L", "I;16B", "I", "1")
MASK_EXTENSION = ".png"  # lossless: a JPEG "mask" would hold values between the classes at every edge
IGNORE_INDEX = 255  # the usual label of unlabelled pixels and padding (ADE20K's, mmsegmentation's)
_INVALID = np.iinfo(np.int64).min  # lookup-table entry of a mask value that is no class
_NAMED = 5  # files named in a message before "and N more"


def _few(paths: Sequence[Path]) -> str:
    names = ", ".join(str(p) for p in paths[:_NAMED])
    return names + (f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else "")


class SegmentationFolder(Dataset):
    """Images and their class masks, matched by file stem: ``images/NAME.jpg`` (any image type
    ``mae.data.decoding`` lists) with ``masks/NAME.png``.

    Checked at construction, for every pair, from the files' headers (measured: 0.2 s per 1000 pairs, so
    4 s for ADE20K's 20k training pairs): that every image has a mask and every mask an image, and that
    each mask is a single-channel index image (``INDEX_MODES``) of its image's size. Label values need the
    masks decoded (measured: 0.25 s per 1000 masks of 64 x 64 px, 3 s per 1000 of ADE20K's 512 x 683 px,
    a minute for its training split on one core, in every process), so at construction only
    ``check_labels`` masks, evenly spaced by name, have their values checked (``None``: all, worth it once
    for new data). Every mask's values are checked again whenever it is loaded, by the table lookup that
    maps raw values to labels (under 1 ms for 512 x 683 px): a bad mask first seen during training stops
    it with the file's name; it is never trained on with wrong labels. A mask or image that cannot be decoded
    (truncated, corrupt) stops the run the same way, naming the file, when it is first decoded.

    Args:
        images: folder of the images.
        masks: folder of the PNG masks.
        num_classes: classes; labels are 0 .. num_classes - 1.
        ignore_index: the label of unlabelled pixels (a mask value equal to it means unlabelled, and the
            label of padding); not a class.
        reduce_zero_label: ADE20K's convention: mask value 0 ("other") is unlabelled, 1 .. num_classes are
            classes 0 .. num_classes - 1.
        transforms: called as ``transforms(image, mask)`` on a ``tv_tensors.Image`` (3, H, W) uint8 and a
            ``tv_tensors.Mask`` (H, W) int64 (torchvision ``transforms.v2``, which moves the mask with the
            image); returns both.
        check_labels: masks whose values are checked at construction; None: all of them.

    Items: (image (3, H, W) float32 in [0, 1], mask (H, W) int64).

    Raises:
        FileNotFoundError: a missing folder, or an image without a mask (naming both paths).
        ValueError: naming the file(s): a folder without images or masks, masks without images, an image
            stem used twice, a mask of another size than its image or with several channels, mask values
            that are no class, a mask or image that cannot be decoded.
    """

    def __init__(
        self,
        images: str | Path,
        masks: str | Path,
        num_classes: int,
        ignore_index: int = IGNORE_INDEX,
        reduce_zero_label: bool = False,
        transforms: Callable | None = None,
        check_labels: int | None = 100,
    ) -> None:
        if num_classes < 1:
            raise InputError(f"num_classes must be at least 1, got {num_classes}")
        if check_labels is not None and check_labels < 0:
            raise InputError(f"check_labels must be >= 0 or None (all masks), got {check_labels}")
        if 0 <= ignore_index < num_classes:
            raise InputError(
                f"ignore_index={ignore_index} is one of the {num_classes} classes (0 .. {num_classes - 1}): "
                "it must be another value (255 is the usual one)"
            )
        self.image_dir, self.mask_dir = Path(images), Path(masks)
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.reduce_zero_label = reduce_zero_label
        self.transforms = transforms
        self.images, self.masks = self._pairs()
        self._tables: dict[int, np.ndarray] = {}
        for image, mask in zip(self.images, self.masks, strict=True):
            self._check_header(image, mask)
        count = len(self.masks) if check_labels is None else min(check_labels, len(self.masks))
        if count > 0:
            for i in np.unique(np.linspace(0, len(self.masks) - 1, count).round().astype(int)):
                self.read_mask(self.masks[i])

    def _pairs(self) -> tuple[list[Path], list[Path]]:
        """(images, masks), sorted by stem, after checking that every file has its partner."""
        extensions = dataset_extensions(arrays=False)
        images = self._files(self.image_dir, "image", extensions)
        mask_files = self._files(self.mask_dir, "mask", (MASK_EXTENSION,))
        by_stem: dict[str, Path] = {}
        for image in images:
            if image.stem in by_stem:
                raise InputError(
                    f"images {by_stem[image.stem]} and {image} share the name {image.stem!r}: a mask "
                    f"{self.mask_dir / (image.stem + MASK_EXTENSION)} would belong to both; keep one of them"
                )
            by_stem[image.stem] = image
        masks = {mask.stem: mask for mask in mask_files}
        unmasked = [image for stem, image in by_stem.items() if stem not in masks]
        if unmasked:
            image = unmasked[0]
            expected = self.mask_dir / (image.stem + MASK_EXTENSION)
            others = sorted(p.name for p in self.mask_dir.iterdir() if p.stem == image.stem and p != expected)
            hint = f" (found {', '.join(others)}: masks are PNG index images)" if others else ""
            more = f"; {len(unmasked) - 1} more images have no mask either" if len(unmasked) > 1 else ""
            raise MissingFileError(f"image {image} has no mask: expected {expected}{hint}{more}")
        orphans = sorted(mask for stem, mask in masks.items() if stem not in by_stem)
        if orphans:
            raise InputError(
                f"{len(orphans)} mask(s) in {self.mask_dir} have no image in {self.image_dir} (an image of "
                f"the same name with one of {', '.join(extensions)}): {_few(orphans)}"
            )
        stems = sorted(by_stem)
        return [by_stem[s] for s in stems], [masks[s] for s in stems]

    @staticmethod
    def _files(folder: Path, kind: str, extensions: tuple[str, ...]) -> list[Path]:
        if not folder.is_dir():
            raise MissingFileError(f"{kind} folder {folder} does not exist or is not a folder")
        files = sorted(
            p for p in folder.iterdir() if p.suffix.lower() in extensions and not p.name.startswith(".")
        )
        if not files:
            raise InputError(
                f"{kind} folder {folder} holds no {kind} files (files ending in {', '.join(extensions)})"
            )
        return files

    def _check_header(self, image: Path, mask: Path) -> None:
        with open_image(mask) as m:
            mode, mask_size = m.mode, m.size
        if mode not in INDEX_MODES:
            raise InputError(
                f"mask {mask} has mode {mode} ({Image.getmodebands(mode)} channels): class masks are "
                "single-channel index PNGs whose value at each pixel is its class (modes "
                f"{', '.join(INDEX_MODES)}); convert colour-coded masks to class indices first"
            )
        with open_image(image) as i:
            image_size = i.size
        if mask_size != image_size:
            raise InputError(
                f"mask {mask} is {mask_size[0]}x{mask_size[1]} px but its image {image} is "
                f"{image_size[0]}x{image_size[1]} px: a mask must have its image's size"
            )

    def _table(self, size: int) -> np.ndarray:
        """(size,) int64: the label of each raw mask value, ``_INVALID`` for values that are no class."""
        if size not in self._tables:
            values = np.arange(size)
            labels = values - 1 if self.reduce_zero_label else values
            table = np.where((labels >= 0) & (labels < self.num_classes), labels, _INVALID)
            if self.reduce_zero_label:
                table[0] = self.ignore_index
            if 0 <= self.ignore_index < size:
                table[self.ignore_index] = self.ignore_index
            self._tables[size] = table
        return self._tables[size]

    def read_mask(self, path: Path) -> torch.Tensor:
        """(H, W) int64 labels of a mask file, ``ignore_index`` where unlabelled.

        Raises:
            ValueError: naming the file, for values that are no class or a file that cannot be decoded.
        """
        with _named_errors("mask", path):
            with open_image(path) as img:
                raw = np.array(img)
        if raw.dtype == bool:
            raw = raw.astype(np.uint8)
        elif raw.dtype not in (
            np.uint8,
            np.uint16,
        ):  # mode I (or big-endian 16-bit): 0 .. 65535 fit a 16-bit PNG
            out_of_range = (raw < 0) | (raw > 65535)
            if out_of_range.any():
                self._refuse(path, np.unique(raw[out_of_range]))
            raw = raw.astype(np.uint16)
        labels = self._table(256 if raw.dtype == np.uint8 else 65536)[raw]  # numpy's lookup: ~10x torch's
        invalid = labels == _INVALID
        if invalid.any():
            self._refuse(path, np.unique(raw[invalid]))
        return torch.from_numpy(labels)

    def _refuse(self, path: Path, values: np.ndarray) -> None:
        shown = ", ".join(str(v) for v in values[:10]) + (", ..." if len(values) > 10 else "")
        n = self.num_classes
        if self.reduce_zero_label:
            rule = (
                f"with reduce_zero_label=True, mask values 1 .. {n} are classes 0 .. {n - 1} "
                "and 0 is unlabelled"
            )
            hint = ""
        else:
            rule = f"mask values 0 .. {n - 1} are the classes"
            # Only value n is out of range: the classes are likely numbered from 1.
            hint = f"; if the classes are 1 .. {n} and 0 is unlabelled (ADE20K), set reduce_zero_label=True"
            hint = hint if values.max() == n else ""
        raise InputError(
            f"mask {path} has values {shown} that are no class of num_classes={n}: {rule}, and "
            f"ignore_index={self.ignore_index} marks unlabelled pixels{hint}"
        )

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        with _named_errors("image", self.images[index]):
            image = tv_tensors.Image(read_rgb(self.images[index]))
        mask = tv_tensors.Mask(self.read_mask(self.masks[index]))
        if image.shape[-2:] != mask.shape:  # the file changed since the header check
            raise InputError(f"mask {self.masks[index]} is not the size of its image {self.images[index]}")
        if self.transforms is not None:
            image, mask = self.transforms(image, mask)
        image = TF.to_dtype(image.as_subclass(torch.Tensor), torch.float32, scale=True)
        return image, mask.as_subclass(torch.Tensor)


@contextlib.contextmanager
def _named_errors(kind: str, path: Path) -> Iterator[None]:
    """Decoding errors of ``path`` as a ValueError naming it (PIL's "image file is
    truncated" names no file)."""
    try:
        yield
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise InputError(f"cannot read {kind} {path}: {err}; replace the file with a readable copy") from err


def collate_padded(batch: list[tuple[torch.Tensor, torch.Tensor]], ignore_index: int = IGNORE_INDEX) -> tuple:
    """(images (N, 3, H, W), masks (N, H, W)) of items of different sizes, each padded at the right and
    bottom to the largest height and width in the batch: images with 0, masks with ``ignore_index``."""
    height = max(image.shape[-2] for image, _ in batch)
    width = max(image.shape[-1] for image, _ in batch)
    images = torch.stack([F.pad(i, (0, width - i.shape[-1], 0, height - i.shape[-2])) for i, _ in batch])
    masks = torch.stack(
        [F.pad(m, (0, width - m.shape[-1], 0, height - m.shape[-2]), value=ignore_index) for _, m in batch]
    )
    return images, masks


class SegmentationDataModule(SplitLoaders, pl.LightningDataModule):
    """Semantic segmentation splits of one root: ``root/<images>`` and ``root/<masks>`` with ``{split}``
    replaced by ``train_split`` or ``val_split`` (defaults: ADE20K's ``ADEChallengeData2016`` layout).

    Training views follow mmsegmentation's ADE20K pipeline without its photometric distortion and its
    crop's cap on one class's share: the short side rescaled to ``img_size`` times a ratio drawn from
    ``scale_range`` (mmseg's ``RandomResize`` relative to its scale; the long side is not capped), a random
    ``img_size`` crop (padded with 0 in the image and ``ignore_index`` in the mask where the rescaled image
    is smaller), a horizontal flip (``flip``). Validation images are resized to short side ``img_size`` (masks
    by nearest neighbour) and padded per batch to a common size, masks with ``ignore_index``: the mIoU is
    computed at that resolution, where mmseg computes it at each image's original one.

    Batches: (N, 3, H, W) float32 images in [0, 1] (not normalised) and (N, H, W) int64 masks.

    Args:
        root: the dataset folder.
        num_classes: classes; labels are 0 .. num_classes - 1 (ADE20K: 150).
        images, masks: folders of images and PNG masks relative to ``root``, ``{split}`` is the split.
        train_split, val_split: the splits' names; no validation when ``val_split`` is None.
        ignore_index: the label of unlabelled pixels and padding.
        reduce_zero_label: mask value 0 is unlabelled and 1 .. num_classes are the classes (ADE20K: True).
        class_names: the classes' names, for per-class metrics.
        img_size: training crop side and validation short side, in pixels (ADE20K: 512).
        scale_range: (low, high) ratio of the training rescale's short side to ``img_size``.
        flip: the training views' random horizontal flip (mmseg's, on by default); off where a mirrored
            object is another class or none (digits, text, left / right classes).
        check_labels: masks per split whose values are checked at start-up (``SegmentationFolder``);
            None: all.
        batch_size: images per device per step (fewer than ``SplitLoaders``' default: the images
            are large).
        **loader: the other loader settings of ``SplitLoaders`` (num_workers, pin_memory, persistent_workers).
    """

    def __init__(
        self,
        root: str | Path,
        num_classes: int,
        images: str = "images/{split}",
        masks: str = "annotations/{split}",
        train_split: str = "training",
        val_split: str | None = "validation",
        ignore_index: int = IGNORE_INDEX,
        reduce_zero_label: bool = False,
        class_names: list[str] | None = None,
        img_size: int = 512,
        scale_range: tuple[float, float] = (0.5, 2.0),
        flip: bool = True,
        check_labels: int | None = 100,
        batch_size: int = 16,
        **loader: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, **loader)
        if class_names is not None and len(class_names) != num_classes:
            raise InputError(f"data.class_names has {len(class_names)} names for num_classes={num_classes}")
        low, high = scale_range
        if not 0 < low <= high:
            raise InputError(
                f"data.scale_range must be (low, high) with 0 < low <= high, got {tuple(scale_range)}"
            )
        if img_size < 1:
            raise ConfigError(f"data.img_size must be >= 1, got {img_size}")
        self.root = Path(root)
        self.image_template, self.mask_template = images, masks
        self.train_split, self.val_split = train_split, val_split
        self._num_classes, self._ignore_index = num_classes, ignore_index
        self.reduce_zero_label = reduce_zero_label
        self._class_names = class_names
        self.img_size, self.scale_range, self.flip = img_size, (low, high), flip
        self.check_labels = check_labels
        self.train_set: SegmentationFolder | None = None
        self.val_set: SegmentationFolder | None = None

    in_chans = 3  # images are read as RGB

    @property
    def num_classes(self) -> int:
        return self._num_classes

    @property
    def ignore_index(self) -> int:
        return self._ignore_index

    @property
    def class_names(self) -> list[str] | None:
        return self._class_names

    def train_transform(self) -> v2.Transform:
        low, high = self.scale_range
        fill = {tv_tensors.Image: 0, tv_tensors.Mask: self.ignore_index}
        views = [
            # short side, max exclusive
            v2.RandomResize(round(low * self.img_size), round(high * self.img_size) + 1),
            v2.RandomCrop(self.img_size, pad_if_needed=True, fill=fill),
        ]
        return v2.Compose((views + [v2.RandomHorizontalFlip()]) if self.flip else views)

    def val_transform(self) -> v2.Transform:
        return v2.Resize(self.img_size)

    def split(self, split: str, transforms: Callable) -> SegmentationFolder:
        """The ``SegmentationFolder`` of a split, with ``transforms``."""
        folders = []
        for option, template in (("images", self.image_template), ("masks", self.mask_template)):
            try:
                folders.append(self.root / template.format(split=split))
            except (KeyError, IndexError, ValueError) as err:
                raise InputError(
                    f"data.{option}={template!r}: {{split}} is its only placeholder ({err!r})"
                ) from err
        return SegmentationFolder(
            *folders,
            self.num_classes,
            self.ignore_index,
            self.reduce_zero_label,
            transforms,
            self.check_labels,
        )

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None and stage in (None, "fit"):
            self.train_set = self.split(self.train_split, self.train_transform())
        if self.val_set is None and self.val_split is not None:
            self.val_set = self.split(self.val_split, self.val_transform())
        sets = (("training", self.train_set), ("validation", self.val_set))
        rank_zero_info(
            f"{type(self).__name__}: " + ", ".join(f"{len(s)} {n} images" for n, s in sets if s is not None)
        )

    def collate_fn(self) -> Callable:
        return functools.partial(collate_padded, ignore_index=self.ignore_index)


class DigitScenesSegmentation(DigitScenesOnDisk, SegmentationDataModule):
    """The built-in offline segmentation task: the digit scenes of ``mae.data.sources.digit_scenes`` (written
    to ``root`` on first use, reused after; the same scenes as ``DigitScenesDataModule``), their class masks
    (0 background, d + 1 for digit d: 11 classes) read through the folder path like any other data.

    Args:
        scale_range: the training rescale (default (1, 1): the scenes as they are; the digits were
            pretrained at one scale).
        flip: off by default, as in ``DigitScenesDataModule``: a mirrored digit is no digit (and trained
            with its digit's label, it teaches the segmenter a second, false shape of each class).
        batch_size: images per device per step.
        **kwargs: the scenes (``root``, ``num_train``, ``num_val``, ``canvas``, ``seed``, ``img_size``, the
            training crop; 64 keeps whole scenes: ``DigitScenesOnDisk``) and the loader settings.
    """

    def __init__(
        self,
        *,
        scale_range: tuple[float, float] = (1.0, 1.0),
        flip: bool = False,
        batch_size: int = 16,
        **kwargs: Any,
    ) -> None:
        # The scenes' classes, layout and checks are fixed, passed here so they are
        # no settings of this module.
        super().__init__(
            num_classes=len(CATEGORIES) + 1,
            images=IMAGES,
            masks=MASKS,
            train_split="train",
            val_split="val",
            class_names=["background", *(c["name"] for c in CATEGORIES)],
            ignore_index=IGNORE_INDEX,
            reduce_zero_label=False,
            check_labels=None,
            scale_range=scale_range,
            flip=flip,
            batch_size=batch_size,
            **kwargs,
        )
