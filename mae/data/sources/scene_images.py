"""MAE pretraining on the digit scenes' images, without their labels: the encoder sees the kind of image the
detector and the segmenter are trained on (several digits anywhere on a larger canvas), as an MAE pretrained
on ImageNet sees scenes that COCO and ADE20K resemble. The default run's single, centred 32 px digits do not:
see docs/dense.md, "Does pretraining help here?"."""

from abc import ABC
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
            raise MissingFileError(
                f"no scene images in {root / 'images' / split}: write them with write_digit_scenes"
            )
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        return self.transform(Image.open(self.paths[index])), 0


class ImagesUnderRoot(ImageDataModule, ABC):
    """An ``ImageDataModule`` read from the folder ``root``: a base ``DigitScenesOnDisk`` can hand its
    ``root`` on to, as it does to the detection and segmentation data modules."""

    def __init__(self, root: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root = Path(root)


class DigitSceneImagesDataModule(DigitScenesOnDisk, ImagesUnderRoot):
    """Pretraining data: the training images of the built-in digit scenes (``mae.data.sources.digit_scenes``),
    written to ``root`` on first use (reused after, the same files the detection and segmentation data modules
    read with the same parameters); the validation scenes give ``val/loss`` only.

    Args:
        root, num_train, num_val, canvas, seed, img_size: the scenes' folder and parameters and the input side
            (``DigitScenesOnDisk``); the canvas side keeps the digits at the size the dense tasks see them
            (the pretraining crop enlarges them up to 2.2x, as it does any image).
        **kwargs: the loader and augmentation settings of ``ImageDataModule``.
    """

    default_eval_crop_ratio = 1.0  # a scene has no border to crop away

    @property
    def num_labels(self) -> int:
        return 1  # unlabelled images

    def configure_pixels(self) -> None:
        if self.in_chans != 3:
            raise InputError(f"the digit scenes are RGB images: data.in_chans must be 3, got {self.in_chans}")

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset]:
        return SceneImages(self.root, "train", train_tf), SceneImages(self.root, "val", eval_tf)
