"""The base of every image data module: the loader settings (``SplitLoaders``), the recipes' transforms,
the reading path (8-bit RGB or arrays, decided by the source's ``configure_pixels``), and normalisation of
every batch on the device, in one place. Batches are ``(images (N, in_chans, H, W), labels (N,))``.

The training split gets the augmentation of the chosen recipe (``augmentation``: pretrain,
finetune or linprobe); the validation split a resize + center-crop view. ``img_size`` is the
single source of the input size: the CLIs link it (and ``num_labels``) to the model, so data and
model cannot disagree.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import Dataset

from mae.compat.torch import collate_with, stack_tensors
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.sources.loader_workers import SplitLoaders
from mae.data.sources.subsets import labelled_fraction
from mae.data.views.arrays import ArrayView
from mae.data.views.normalize import normalization, normalize_batch
from mae.data.views.recipes import Augmentation, eval_transform, train_transform
from mae.errors import ConfigError


def collate_images(batch: list) -> Any:
    """``default_collate``, except that (C, H, W) images stored H x W x C (``PretrainCrop``'s uint8
    crops) are stacked into a channels-last (N, C, H, W) batch instead of a contiguous one: the
    transposition would cost a loader worker about 0.1 ms per 224 px image, while normalising the
    batch and the patch-embedding convolution take channels-last input as it is."""
    return collate_with(batch, {torch.Tensor: _collate_tensors})


def _collate_tensors(batch: list[torch.Tensor], **kwargs: Any) -> torch.Tensor:
    if batch[0].dim() == 3 and all(
        x.permute(1, 2, 0).is_contiguous() and not x.is_contiguous() for x in batch
    ):
        return stack_tensors([x.permute(1, 2, 0) for x in batch], **kwargs).permute(0, 3, 1, 2)
    return stack_tensors(batch, **kwargs)


class ImageDataModule(SplitLoaders, pl.LightningDataModule, ABC):
    """Shared image settings; subclasses build ``self.train_set`` / ``self.val_set`` in ``setup``.

    Args:
        img_size: input side (or (H, W)) in pixels, shared with the model.
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
            with ``mae stats ROOT``).
        **loader: the loader settings of ``SplitLoaders`` (batch_size, num_workers, pin_memory,
            persistent_workers).
    """

    default_eval_crop_ratio = 224 / 256
    array_mode = False  # True: images of any channel count / bit depth through ``ArrayView``
    expected_pixels: tuple[int, str] | None = None  # (channels, dtype) every file must have, in array mode

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
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
        **loader: Any,
    ) -> None:
        super().__init__(**loader)
        self.in_chans, self.mean, self.std = in_chans, *normalization(in_chans, mean, std)
        if max_image_pixels is not None and max_image_pixels < 1:
            raise ConfigError(f"data.max_image_pixels must be positive or null, got {max_image_pixels}")
        self.max_image_pixels = max_image_pixels
        if not 0 < train_fraction <= 1:
            raise ConfigError(f"data.train_fraction must be in (0, 1], got {train_fraction}")
        self.train_fraction = train_fraction
        self.subset_seed = subset_seed
        train_transform(augmentation, 32, auto_augment, re_prob)  # fail now on a bad setting, not at setup
        if eval_crop_ratio is not None and not 0 < eval_crop_ratio <= 1:
            raise ConfigError(f"data.eval_crop_ratio must be in (0, 1], got {eval_crop_ratio}")
        self.augmentation = augmentation
        self.auto_augment = auto_augment
        self.re_prob = re_prob
        self.eval_crop_ratio = eval_crop_ratio or self.default_eval_crop_ratio
        self.img_size = img_size
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
            return ArrayView(
                view,
                self.img_size,
                self.in_chans,
                self.mean,
                self.std,
                1.0,
                self.re_prob,
                self.expected_pixels,
                self.max_image_pixels,
            )
        return train_transform(
            self.augmentation,
            self.img_size,
            self.auto_augment,
            self.re_prob,
            self.max_image_pixels,
            self.mean,
            self.std,
        )

    def eval_transform(self) -> Callable:
        if self.array_mode:
            return ArrayView(
                "eval",
                self.img_size,
                self.in_chans,
                self.mean,
                self.std,
                self.eval_crop_ratio,
                expected=self.expected_pixels,
                max_pixels=self.max_image_pixels,
            )
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
            val = (
                f", {len(self.val_set)} validation images"
                if self.val_set is not None
                else ", no validation split"
            )
            classes = getattr(self.train_set, "classes", None)
            rank_zero_info(
                f"{type(self).__name__}: {self.train_image_count()} training images"
                + (f" in {len(classes)} classes" if classes is not None else "")
                + val
            )

    def train_image_count(self) -> int:
        """Training images in all processes together (for the start-up summary)."""
        return len(self.train_set)

    def collate_fn(self) -> Callable:
        return collate_images


class SplitDataModule(ImageDataModule, ABC):
    """A data module over named splits of one root (an image folder, or shards): ``root/<train_split>``
    and, when the data has it, ``root/<val_split>``.

    Args:
        root: the dataset's folder or URL.
        train_split: the training split's name under ``root``.
        val_split: the validation split's name; skipped when the data has none.
        **kwargs: the loader and augmentation settings of ``ImageDataModule``.
    """

    def __init__(
        self, root: Any, train_split: str = "train", val_split: str | None = "val", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.root = root
        self.train_split = train_split
        self.val_split = val_split
