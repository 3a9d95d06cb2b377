"""MAE pretraining on the digit scenes' images, without their labels: the encoder sees the kind of image the
detector and the segmenter are trained on (several digits anywhere on a larger canvas), as an MAE pretrained
on ImageNet sees scenes that COCO and ADE20K resemble. The default run's single, centred 32 px digits do not:
see docs/dense.md, "Does pretraining help here?"."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from mae.data.sources.base import ImageDataModule
from mae.data.sources.digit_scenes import DigitScenesOnDisk
from mae.errors import InputError, MissingFileError


class SceneImages(Dataset):
    """The images of one split of a written digit-scene task, as ``(transform(image), 0)``: no label (the
    pretraining module does not read it; 0 keeps the batch layout of the labelled data modules)."""

    def __init__(self, root: Path, split: str, transform: Callable) -> None:
        self.paths = sorted((root / "images" / split).glob("*.png"))
        if not self.paths:
            raise MissingFileError(f"no scene images in {root / 'images' / split}: write them with write_digit_scenes")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        return self.transform(Image.open(self.paths[index])), 0


class DigitSceneImagesDataModule(DigitScenesOnDisk, ImageDataModule):
    """Pretraining data: the training images of the built-in digit scenes (``mae.data.sources.digit_scenes``), written
    to ``root`` on first use (reused after, the same files the detection and segmentation data modules
    read with the same parameters); the validation scenes give ``val/loss`` only.

    Args:
        root, num_train, num_val, canvas, seed: the scenes' folder and parameters (``write_digit_scenes``).
        img_size: the pretraining input side; the canvas side keeps the digits at the size the dense
            tasks see them (the pretraining crop enlarges them up to 2.2x, as it does any image).
        **kwargs: the loader and augmentation settings of ``ImageDataModule``.
    """

    default_eval_crop_ratio = 1.0  # a scene has no border to crop away

    def __init__(
        self,
        root: str = "data/digit_scenes",
        num_train: int = 1000,
        num_val: int = 200,
        canvas: int = 64,
        seed: int = 0,
        img_size: int = 64,
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            img_size=img_size, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
            persistent_workers=persistent_workers, **kwargs,
        )  # fmt: skip
        self.keep_scenes(root, num_train, num_val, canvas, seed)

    @property
    def num_labels(self) -> int:
        return 1  # unlabelled images

    def configure_pixels(self) -> None:
        if self.in_chans != 3:
            raise InputError(f"the digit scenes are RGB images: data.in_chans must be 3, got {self.in_chans}")

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset]:
        return SceneImages(self.root, "train", train_tf), SceneImages(self.root, "val", eval_tf)
