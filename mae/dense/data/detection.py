"""Detection data modules: COCO-format data from a folder, and the built-in digit scenes through the same
path. Batches are ``(images, targets)``, two lists of N (torchvision's detectors take lists of images of
any size): images (3, H, W) float32 in [0, 1], not normalised (the detector's transform normalises and
resizes them); targets as ``mae.dense.data.coco.CocoDetection`` makes them.

The training split gets ``augmentation``: "flip" (horizontal, p = 0.5), "lsj" (ViTDet's large-scale
jitter: flip, rescale to ``img_size`` x a factor drawn from [0.1, 2.0], then a random ``img_size`` square
crop, padded at the right and bottom where the image is smaller; objects cut to nothing are dropped), or
"none". The validation split is served as it is: the detector's own resize maps its predictions back to
the original pixels, where the mAP is measured.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from mae.data.sources.digit_scenes import ANNOTATIONS, CATEGORIES, IMAGES, DigitScenesOnDisk
from mae.data.sources.loader_workers import SplitLoaders
from mae.dense.data.coco import MAX_ANNOTATIONS_PER_IMAGE, CocoDetection
from mae.errors import ConfigError

DetectionAugmentation = Literal["flip", "lsj", "none"]
LSJ_SCALE = (0.1, 2.0)  # ViTDet's large-scale-jitter range


class FixedSizeCrop(v2.Transform):
    """A random crop of at most ``size`` (height, width), then zero padding at the right and bottom to
    exactly ``size``: ViTDet's LSJ crop. (``v2.RandomCrop(pad_if_needed=True)`` pads both sides and then
    crops at random, which cuts off part of an image smaller than the crop half of the time.)"""

    def __init__(self, size: int | tuple[int, int]) -> None:
        super().__init__()
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = F.get_size(next(x for x in flat_inputs if isinstance(x, tv_tensors.Image)))
        crop_h, crop_w = min(height, self.size[0]), min(width, self.size[1])
        top = int(torch.randint(height - crop_h + 1, ()))
        left = int(torch.randint(width - crop_w + 1, ()))
        return dict(
            top=top,
            left=left,
            height=crop_h,
            width=crop_w,
            padding=[0, 0, self.size[1] - crop_w, self.size[0] - crop_h],
        )

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        cropped = F.crop(inpt, params["top"], params["left"], params["height"], params["width"])
        return F.pad(cropped, params["padding"], fill=0)

    # torchvision < 0.21 calls these names
    _get_params = make_params
    _transform = transform


def labels_and_crowds(sample: tuple[Any, dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``SanitizeBoundingBoxes`` drops along with the boxes (masks it finds itself)."""
    return sample[1]["labels"], sample[1]["iscrowd"]


# What each ``data.augmentation`` does, in words (printed when a run starts).
AUGMENTATIONS = {
    "none": "the images as they are",
    "flip": "horizontal flips",
    "lsj": "large-scale jitter: flip, rescale by 0.1-2.0, random crop",
}


def detection_transform(augmentation: DetectionAugmentation, img_size: int) -> v2.Transform | None:
    """The training transform of ``augmentation`` (module docstring) at ``img_size`` pixels."""
    if augmentation == "none":
        return None
    if augmentation == "flip":
        return v2.RandomHorizontalFlip()
    if augmentation == "lsj":
        return v2.Compose(
            [
                v2.RandomHorizontalFlip(),
                v2.ScaleJitter((img_size, img_size), scale_range=LSJ_SCALE),
                FixedSizeCrop(img_size),
                v2.SanitizeBoundingBoxes(labels_getter=labels_and_crowds),
            ]
        )
    raise ConfigError(f"data.augmentation must be one of 'flip', 'lsj', 'none', got {augmentation!r}")


def collate_detection(batch: list[tuple[torch.Tensor, dict]]) -> tuple[list[torch.Tensor], list[dict]]:
    """(images, targets) as two lists: the detectors' input, images of different sizes left unstacked."""
    return [image for image, _ in batch], [target for _, target in batch]


class DetectionDataModule(SplitLoaders, pl.LightningDataModule):
    """COCO-format detection data: an instances JSON and an image folder per split, under ``root``.

    Args:
        root: the dataset folder; the other paths are relative to it (or absolute).
        train_annotations, val_annotations: the splits' COCO instances JSON; ``val_annotations`` None: no
            validation split.
        train_images, val_images: the folders the JSONs' ``file_name`` entries are relative to.
        masks: read instance masks (Mask R-CNN).
        img_size: the LSJ crop side in pixels (only "lsj" uses it; the detector's own resize sets the
            size it sees).
        augmentation: the training split's augmentation: "flip", "lsj" or "none" (module docstring).
        max_annotations_per_image: the most (kept) annotations an image may have, or the split is refused at
            start-up naming the images: torchvision's box matching needs memory in proportion (2.2 GB per
            image for 250 annotations at 1024 px), so an image of 100,000 boxes would run out of it mid-run.
        batch_size: images per device per step (fewer than ``SplitLoaders``' default: the images are large).
        **loader: the other loader settings of ``SplitLoaders`` (num_workers, pin_memory, persistent_workers).

    The data is read and checked when first needed (``num_classes``, ``category_names`` or ``setup``), so a
    problem in it stops the run at start-up, naming the file and the entries.
    """

    in_chans = 3  # images are read as RGB (torchvision's detectors take RGB)

    def __init__(
        self,
        root: str,
        train_annotations: str = "annotations/instances_train.json",
        val_annotations: str | None = "annotations/instances_val.json",
        train_images: str = "images/train",
        val_images: str = "images/val",
        masks: bool = False,
        img_size: int = 1024,
        augmentation: DetectionAugmentation = "lsj",
        max_annotations_per_image: int = MAX_ANNOTATIONS_PER_IMAGE,
        batch_size: int = 2,
        **loader: Any,
    ) -> None:
        super().__init__(batch_size=batch_size, **loader)
        self.train_transform = detection_transform(augmentation, img_size)  # a bad name fails here
        self.root = Path(root)
        self.train_annotations, self.val_annotations = train_annotations, val_annotations
        self.train_images, self.val_images = train_images, val_images
        self.masks = masks
        self.img_size = img_size
        self.augmentation = augmentation
        self.max_annotations_per_image = max_annotations_per_image
        self.train_set: CocoDetection | None = None
        self.val_set: CocoDetection | None = None

    @property
    def num_classes(self) -> int:
        """The detectors' ``num_classes``: the categories and the background."""
        return len(self.category_names) + 1

    @property
    def category_names(self) -> tuple[str, ...]:
        """The categories' names in label order (label 1 first)."""
        return self._train_set().category_names

    def _train_set(self) -> CocoDetection:
        if self.train_set is None:
            self.train_set = CocoDetection(
                self.root / self.train_annotations,
                self.root / self.train_images,
                self.masks,
                self.train_transform,
                train=True,
                max_annotations_per_image=self.max_annotations_per_image,
            )
        return self.train_set

    def setup(self, stage: str | None = None) -> None:
        train = self._train_set()
        if stage in (None, "fit"):  # said where the run starts: the default differs between modules
            rank_zero_info(
                f"training augmentation: data.augmentation {self.augmentation} "
                f"({AUGMENTATIONS[self.augmentation]})"
            )
        if self.val_set is None and self.val_annotations is not None:
            self.val_set = CocoDetection(
                self.root / self.val_annotations,
                self.root / self.val_images,
                self.masks,
                max_annotations_per_image=self.max_annotations_per_image,
            )
            if (
                self.val_set.category_ids != train.category_ids
                or self.val_set.category_names != train.category_names
            ):
                raise ConfigError(
                    f"{self.val_set.annotation_file} and {train.annotation_file} list different categories "
                    f"(validation {_listing(self.val_set)}, training {_listing(train)}): the labels would "
                    "mean different things; both splits need the same 'categories'"
                )

    def collate_fn(self) -> Callable:
        return collate_detection

    def training_set(self) -> CocoDetection:
        return self._train_set()

    def training_set_name(self) -> str:
        return str(self._train_set().annotation_file)


def _listing(dataset: CocoDetection) -> str:
    return ", ".join(
        f"{cid}: {name!r}"
        for cid, name in zip(dataset.category_ids.values(), dataset.category_names, strict=True)
    )


class DigitScenesDataModule(DigitScenesOnDisk, DetectionDataModule):
    """The built-in offline detection task (``mae.data.sources.digit_scenes``): digit scenes written to
    ``root`` on first use (reused after), then read through the COCO path like any other data.

    Args:
        augmentation: "none" by default: a flip turns digits into mirror images that are no digits, and
            LSJ's smallest scales shrink them below a patch.
        batch_size: images per device per step.
        **kwargs: the scenes (``root``, ``num_train``, ``num_val``, ``canvas``, ``seed``, ``img_size``:
            ``DigitScenesOnDisk``), ``masks`` and the loader settings.
    """

    def __init__(
        self, *, augmentation: DetectionAugmentation = "none", batch_size: int = 16, **kwargs: Any
    ) -> None:
        # The scenes' layout and annotation count are fixed, passed here so they are
        # no settings of this module.
        super().__init__(
            train_annotations=ANNOTATIONS.format(split="train"),
            val_annotations=ANNOTATIONS.format(split="val"),
            train_images=IMAGES.format(split="train"),
            val_images=IMAGES.format(split="val"),
            max_annotations_per_image=MAX_ANNOTATIONS_PER_IMAGE,
            augmentation=augmentation,
            batch_size=batch_size,
            **kwargs,
        )

    @property
    def category_names(self) -> tuple[str, ...]:
        # known without writing the scenes: a config can link num_classes before anything is on disk
        return tuple(c["name"] for c in CATEGORIES)
