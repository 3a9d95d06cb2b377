"""Lightning data modules. Each yields ``(images (N, 3, H, W), labels (N,))`` batches.

The training split gets the augmentation of the chosen recipe (``augmentation``: pretrain,
finetune or linprobe); the validation split a resize + center-crop view. ``img_size`` is the
single source of the input size: the CLIs link it (and ``num_labels``) to the model, so data and
model cannot disagree.
"""

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map
from torchvision.datasets.folder import IMG_EXTENSIONS

from mae.data.array_transforms import ArrayView
from mae.data.datasets import (
    CIFAR_CLASSES,
    DigitsDataset,
    ImageFolderSubset,
    cifar_files,
    class_folders,
    labelled_fraction,
    one_kind,
    sample_pixels,
    select_classes,
)
from mae.data.loader_workers import Loader
from mae.data.readers import adapt_channels
from mae.data.transforms import (
    DEFAULT_MAX_PIXELS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Augmentation,
    eval_transform,
    normalize_batch,
    train_transform,
)


def collate_images(batch: list) -> Any:
    """``default_collate``, except that (C, H, W) images stored H x W x C (``PretrainCrop``'s uint8
    crops) are stacked into a channels-last (N, C, H, W) batch instead of a contiguous one: the
    transposition would cost a loader worker about 0.1 ms per 224 px image, while normalising the
    batch and the patch-embedding convolution take channels-last input as it is."""
    return collate(batch, collate_fn_map={**default_collate_fn_map, torch.Tensor: _collate_tensors})


def _collate_tensors(batch: list[torch.Tensor], **kwargs: Any) -> torch.Tensor:
    if batch[0].dim() == 3 and all(x.permute(1, 2, 0).is_contiguous() and not x.is_contiguous() for x in batch):
        return collate_tensor_fn([x.permute(1, 2, 0) for x in batch], **kwargs).permute(0, 3, 1, 2)
    return collate_tensor_fn(batch, **kwargs)


def normalization(
    in_chans: int, mean: list[float] | None, std: list[float] | None
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel: as given, or ImageNet's for 3 channels.

    Raises:
        ValueError: a channel count below 1, missing statistics for other channel counts, lengths
            that differ from ``in_chans``, or a non-positive std, naming the keys.
    """
    if in_chans < 1:
        raise ValueError(f"data.in_chans must be >= 1, got {in_chans}")
    if mean is None and std is None and in_chans == 3:
        return tuple(IMAGENET_MEAN), tuple(IMAGENET_STD)
    if mean is None or std is None:
        raise ValueError(
            f"data.mean and data.std are needed for {in_chans}-channel data (ImageNet's are for RGB): compute "
            f"them with `python -m mae.data.stats ROOT --in-chans {in_chans}` and paste the lines it prints"
        )
    if len(mean) != in_chans or len(std) != in_chans:
        raise ValueError(
            f"data.mean and data.std need {in_chans} values (data.in_chans), got {len(mean)} and {len(std)}"
        )
    check_statistics(mean, std)
    return tuple(float(m) for m in mean), tuple(float(v) for v in std)


def check_statistics(mean: Sequence[float], std: Sequence[float], names: str = "data.mean / data.std") -> None:
    """Raises ValueError, naming ``names``, for a mean that is not finite or a std that is not finite
    and positive: images divided by them would be NaN or infinite, and so would the loss."""
    if not all(math.isfinite(v) for v in mean) or not all(math.isfinite(v) and v > 0 for v in std):
        raise ValueError(
            f"{names} need finite means and positive, finite standard deviations; got mean {list(mean)}, "
            f"std {list(std)}"
        )


class ImageDataModule(pl.LightningDataModule, ABC):
    """Shared loader settings; subclasses build ``self.train_set`` / ``self.val_set`` in ``setup``.

    Args:
        img_size: input side (or (H, W)) in pixels, shared with the model.
        batch_size: images per device per step.
        num_workers: loader worker processes per device.
        pin_memory: page-locked host memory for faster host-to-GPU copies.
        persistent_workers: keep workers alive between epochs (when ``num_workers > 0``).
        augmentation: training augmentation recipe: "pretrain" (MAE pretraining), "finetune"
            (RandAugment + random erasing), "linprobe" (crop + flip) or "none" (resize only).
        auto_augment: timm RandAugment policy of the finetune recipe.
        re_prob: random-erasing probability of the finetune recipe.
        eval_crop_ratio: evaluation view = resize to ``img_size / eval_crop_ratio`` + center crop.
        max_image_pixels: larger images are skipped (or, with ``on_bad_image: raise``, stop the run)
            by name as decompression bombs; None: no limit. The default is PIL's.
        train_fraction: keep this fraction of the training images of each class (label-efficiency
            runs; a seeded, class-balanced subset).
        subset_seed: seed of that subset (and of a random class selection, where there is one).
        in_chans: image channels, shared with the model (linked by the CLIs like ``img_size``).
        mean, std: per-channel normalisation in [0, 1] units (16-bit data: value / 65535; float data:
            its own units); ImageNet's for 3 channels when not set, required otherwise (compute them
            with ``python -m mae.data.stats ROOT``).
    """

    default_eval_crop_ratio = 224 / 256
    array_mode = False  # True: images of any channel count / bit depth through ``ArrayView``
    expected_pixels: tuple[int, str] | None = None  # (channels, dtype) every file must have, in array mode

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        batch_size: int = 64,
        num_workers: int = 4,
        pin_memory: bool = True,
        persistent_workers: bool = True,
        augmentation: Augmentation = "pretrain",
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: float = 0.25,
        eval_crop_ratio: float | None = None,
        max_image_pixels: int | None = DEFAULT_MAX_PIXELS,
        train_fraction: float = 1.0,
        subset_seed: int = 0,
        in_chans: int = 3,
        mean: list[float] | None = None,
        std: list[float] | None = None,
    ) -> None:
        super().__init__()
        self.in_chans, self.mean, self.std = in_chans, *normalization(in_chans, mean, std)
        if max_image_pixels is not None and max_image_pixels < 1:
            raise ValueError(f"data.max_image_pixels must be positive or null, got {max_image_pixels}")
        self.max_image_pixels = max_image_pixels
        if not 0 < train_fraction <= 1:
            raise ValueError(f"data.train_fraction must be in (0, 1], got {train_fraction}")
        self.train_fraction = train_fraction
        self.subset_seed = subset_seed
        train_transform(augmentation, 32, auto_augment, re_prob)  # fail now on a bad setting, not at setup
        if eval_crop_ratio is not None and not 0 < eval_crop_ratio <= 1:
            raise ValueError(f"data.eval_crop_ratio must be in (0, 1], got {eval_crop_ratio}")
        self.augmentation = augmentation
        self.auto_augment = auto_augment
        self.re_prob = re_prob
        self.eval_crop_ratio = eval_crop_ratio or self.default_eval_crop_ratio
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"data.num_workers must be >= 0, got {num_workers}")
        self.img_size = img_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None

    @abstractmethod
    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        """(train, val or None) with the given transforms."""

    @property
    @abstractmethod
    def num_labels(self) -> int:
        """Number of classes of the (selected) data."""

    def configure_pixels(self) -> None:
        """Decide how images are read (``array_mode``, ``expected_pixels``); called before the
        datasets are built. The base reads 8-bit RGB."""

    def train_transform(self) -> Callable:
        if self.array_mode:
            view = "eval" if self.augmentation == "none" else self.augmentation
            return ArrayView(view, self.img_size, self.in_chans, self.mean, self.std, 1.0, self.re_prob,
                             self.expected_pixels, self.max_image_pixels)  # fmt: skip
        return train_transform(self.augmentation, self.img_size, self.auto_augment, self.re_prob,
                               self.max_image_pixels, self.mean, self.std)  # fmt: skip

    def eval_transform(self) -> Callable:
        if self.array_mode:
            return ArrayView("eval", self.img_size, self.in_chans, self.mean, self.std, self.eval_crop_ratio,
                             expected=self.expected_pixels, max_pixels=self.max_image_pixels)  # fmt: skip
        return eval_transform(self.img_size, self.eval_crop_ratio, self.mean, self.std, self.max_image_pixels)

    def normalize(self, imgs: torch.Tensor) -> torch.Tensor:
        """A batch as the model takes it: uint8 batches (the 8-bit pretraining crop) normalised by this
        data's mean and std; float batches are normalised already."""
        return normalize_batch(imgs, self.mean, self.std)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Normalised on the device: the pretraining crop ships uint8, a quarter of the bytes.
        imgs, *rest = batch
        return [self.normalize(imgs), *rest]

    def feature_datasets(self) -> tuple[Dataset, Dataset | None]:
        """(train, val) both with the evaluation transform, for frozen-feature evaluation (kNN)."""
        self.configure_pixels()
        return self.build_datasets(self.eval_transform(), self.eval_transform())

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.configure_pixels()
            self.train_set, self.val_set = self.build_datasets(self.train_transform(), self.eval_transform())
            if self.train_fraction < 1.0:
                self.train_set = labelled_fraction(self.train_set, self.train_fraction, self.subset_seed)
            val = f", {len(self.val_set)} validation images" if self.val_set is not None else ", no validation split"
            classes = getattr(self.train_set, "classes", None)
            rank_zero_info(
                f"{type(self).__name__}: {self.train_image_count()} training images"
                + (f" in {len(classes)} classes" if classes is not None else "")
                + val
            )

    def train_image_count(self) -> int:
        """Training images in all processes together (for the start-up summary)."""
        return len(self.train_set)

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        sampler = None
        if not train and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Every validation image exactly once across processes (the default sampler pads shards
            # with repeats), so reduced metrics equal the single-process ones.
            sampler = UnrepeatedDistributedSampler(dataset, shuffle=False)
        return Loader(
            dataset,
            batch_size=self.batch_size,
            shuffle=train,
            sampler=sampler,
            drop_last=train,
            collate_fn=collate_images,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            persistent_workers=self.persistent_workers and self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        if len(self.train_set) < self.batch_size:
            raise ValueError(
                f"{type(self).__name__}: {len(self.train_set)} training images is fewer than "
                f"data.batch_size={self.batch_size}; lower the batch size"
            )
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader(self.val_set, train=False) if self.val_set is not None else []


class DigitsDataModule(ImageDataModule):
    """Built-in offline data: scikit-learn's 1,797 handwritten digits (10 classes), upsampled to ``img_size``.

    The 8x8 source has no border to crop away, so evaluation just resizes (crop ratio 1).
    """

    default_eval_crop_ratio = 1.0

    def __init__(
        self,
        img_size: int | tuple[int, int] = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        **kwargs: Any,
    ) -> None:
        """Other arguments: those of ``ImageDataModule`` (batch_size, augmentation, ...)."""
        super().__init__(
            img_size=img_size, num_workers=num_workers, pin_memory=pin_memory,
            persistent_workers=persistent_workers, **kwargs,
        )  # fmt: skip

    @property
    def num_labels(self) -> int:
        return 10

    def configure_pixels(self) -> None:
        if self.in_chans != 3:
            raise ValueError(f"the digits are served as RGB images: data.in_chans must be 3, got {self.in_chans}")

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        return DigitsDataset("train", train_tf), DigitsDataset("val", eval_tf)


class ImageFolderDataModule(ImageDataModule):
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
        num_workers: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_workers=num_workers, subset_seed=subset_seed, **kwargs)
        if class_list is not None and num_classes is not None:
            raise ValueError("set data.class_list or data.num_classes, not both")
        if max_images_per_class is not None and max_images_per_class < 1:
            raise ValueError(f"data.max_images_per_class must be >= 1, got {max_images_per_class}")
        self.root = Path(root)
        self.train_split = train_split
        self.val_split = val_split
        self.class_list = class_list
        self.num_classes = num_classes
        self.class_selection = class_selection
        self.max_images_per_class = max_images_per_class
        self.on_bad_image = on_bad_image

    def selected_classes(self) -> list[str]:
        """The class folders in use (after the class list / first-K / random-K selection)."""
        train_dir = self.root / self.train_split
        if not train_dir.is_dir():
            raise FileNotFoundError(
                f"training folder {train_dir} does not exist; expected the ImageNet layout "
                f"{self.root}/{self.train_split}/<class>/<image> (set data.root / data.train_split)"
            )
        available = class_folders(train_dir, warn=False)  # the dataset's own listing names unreadable entries
        selected = select_classes(available, self.class_list, self.num_classes, self.class_selection, self.subset_seed)
        return sorted(selected) if selected is not None else available

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
        folder = self.root / self.train_split
        needs_arrays, kinds = sample_pixels(folder, self.selected_classes())
        self.array_mode = self.in_chans != 3 or needs_arrays
        if not self.array_mode or not kinds:
            return
        kind, example = one_kind(kinds, folder)
        adapt_channels(np.zeros((1, 1, kind[0])), self.in_chans, example)  # fits data.in_chans, or says so
        self.expected_pixels = kind

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        classes = self.selected_classes()
        extensions = IMG_EXTENSIONS + ((".npy",) if self.array_mode else ())
        train = ImageFolderSubset(
            self.root / self.train_split, classes, self.max_images_per_class, train_tf, self.on_bad_image,
            self.max_image_pixels, extensions,
        )  # fmt: skip
        val = None
        if self.val_split is not None and (self.root / self.val_split).is_dir():
            val = ImageFolderSubset(
                self.root / self.val_split, classes, None, eval_tf, self.on_bad_image, self.max_image_pixels,
                extensions,
            )  # fmt: skip
        return train, val


class CIFARDataModule(ImageDataModule):
    """CIFAR-10/100 from the standard python-pickle files in ``root`` (e.g. ``root/cifar-10-batches-py``).

    CIFAR images are 32x32 already: evaluation resizes them without cropping (crop ratio 1).

    Args:
        root: folder holding ``cifar-10-batches-py`` or ``cifar-100-python``.
        dataset: "cifar10" or "cifar100".
        download: fetch the files when missing (needs network access).
        **kwargs: the loader and augmentation settings of ``ImageDataModule``.
    """

    default_eval_crop_ratio = 1.0

    def __init__(
        self,
        root: str = "data",
        dataset: Literal["cifar10", "cifar100"] = "cifar10",
        download: bool = False,
        img_size: int | tuple[int, int] = 32,
        batch_size: int = 128,
        **kwargs: Any,
    ) -> None:
        super().__init__(img_size=img_size, batch_size=batch_size, **kwargs)
        if dataset not in CIFAR_CLASSES:
            raise ValueError(f"data.dataset must be one of {sorted(CIFAR_CLASSES)}, got {dataset!r}")
        self.root = Path(root)
        self.dataset = dataset
        self.download = download

    def prepare_data(self) -> None:
        if self.download:
            CIFAR_CLASSES[self.dataset](str(self.root), train=True, download=True)

    @property
    def num_labels(self) -> int:
        return 10 if self.dataset == "cifar10" else 100

    def configure_pixels(self) -> None:
        if self.in_chans != 3:
            raise ValueError(f"CIFAR images are RGB: data.in_chans must be 3, got {self.in_chans}")

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        folder, files = cifar_files(self.dataset)
        missing = [f for f in files if not (self.root / folder / f).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{self.dataset} files {missing} not found in {self.root / folder}; point data.root at the "
                f"folder that holds {folder}/ or set data.download=true where the network allows"
            )
        cls = CIFAR_CLASSES[self.dataset]
        return cls(str(self.root), train=True, transform=train_tf), cls(str(self.root), train=False, transform=eval_tf)
