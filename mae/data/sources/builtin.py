"""Built-in and standard data: scikit-learn's handwritten digits (offline, the default job's) and
CIFAR-10/100 from their standard python-pickle files (read without running code: ``cifar_files``)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets.utils import download_and_extract_archive

from mae.data.sources.base import ImageDataModule
from mae.data.sources.cifar_files import CIFAR_LAYOUTS, CIFARFiles
from mae.data.sources.loader_workers import MainProcessLoading
from mae.errors import InputError, MissingFileError


class DigitsDataset(Dataset):
    """scikit-learn's handwritten digits (1,797 real 8x8 grayscale scans, 10 classes), offline.

    Every fifth image (index % 5 == 0) forms the validation split (360 images); the rest (1,437)
    the training split. Images are returned as 8x8 RGB PIL images; the transform resizes them.
    """

    def __init__(self, split: str = "train", transform: Callable | None = None) -> None:
        from sklearn.datasets import load_digits

        if split not in ("train", "val"):
            raise InputError(f"split must be 'train' or 'val', got {split!r}")
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


def cifar_files(name: str) -> tuple[str, list[str]]:
    """(folder name, file names) of the standard python-pickle release of ``name``."""
    layout = CIFAR_LAYOUTS[name]
    return layout.folder, list(layout.files)


class DigitsDataModule(MainProcessLoading, ImageDataModule):
    """Built-in offline data: scikit-learn's 1,797 handwritten digits (10 classes), upsampled to ``img_size``.

    The 8x8 source has no border to crop away, so evaluation just resizes (crop ratio 1).

    Args:
        img_size: input side (or (H, W)) in pixels, shared with the model.
        **kwargs: the settings of ``ImageDataModule`` (augmentation, ...) and the loader settings, with the
            built-in data's defaults (``MainProcessLoading``).
    """

    default_eval_crop_ratio = 1.0

    def __init__(self, img_size: int | tuple[int, int] = 32, **kwargs: Any) -> None:
        super().__init__(img_size=img_size, **kwargs)

    @property
    def num_labels(self) -> int:
        return 10

    def configure_pixels(self) -> None:
        if self.in_chans != 3:
            raise InputError(
                f"the digits are served as RGB images: data.in_chans must be 3, got {self.in_chans}"
            )

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        return DigitsDataset("train", train_tf), DigitsDataset("val", eval_tf)


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
        if dataset not in CIFAR_LAYOUTS:
            raise InputError(f"data.dataset must be one of {sorted(CIFAR_LAYOUTS)}, got {dataset!r}")
        self.root = Path(root)
        self.dataset = dataset
        self.download = download

    def prepare_data(self) -> None:
        layout = CIFAR_LAYOUTS[self.dataset]
        folder = self.root / layout.folder
        if self.download and not all((folder / name).is_file() for name in layout.files):
            download_and_extract_archive(layout.url, str(self.root), filename=layout.archive, md5=layout.md5)

    @property
    def num_labels(self) -> int:
        return CIFAR_LAYOUTS[self.dataset].num_classes

    def configure_pixels(self) -> None:
        if self.in_chans != 3:
            raise InputError(f"CIFAR images are RGB: data.in_chans must be 3, got {self.in_chans}")

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        folder, files = cifar_files(self.dataset)
        missing = [f for f in files if not (self.root / folder / f).is_file()]
        if missing:
            raise MissingFileError(
                f"{self.dataset} files {missing} not found in {self.root / folder}; point data.root at the "
                f"folder that holds {folder}/ or set data.download=true where the network allows"
            )
        return (
            CIFARFiles(self.root / folder, self.dataset, train=True, transform=train_tf),
            CIFARFiles(self.root / folder, self.dataset, train=False, transform=eval_tf),
        )
