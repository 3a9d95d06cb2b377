"""Built-in and standard data: scikit-learn's handwritten digits (offline, the default job's) and
CIFAR-10/100 from their standard python-pickle files."""

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import CIFAR10, CIFAR100

from mae.data.sources.base import ImageDataModule
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
        if dataset not in CIFAR_CLASSES:
            raise InputError(f"data.dataset must be one of {sorted(CIFAR_CLASSES)}, got {dataset!r}")
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
            raise InputError(f"CIFAR images are RGB: data.in_chans must be 3, got {self.in_chans}")

    def build_datasets(self, train_tf: Callable, eval_tf: Callable) -> tuple[Dataset, Dataset | None]:
        folder, files = cifar_files(self.dataset)
        missing = [f for f in files if not (self.root / folder / f).is_file()]
        if missing:
            raise MissingFileError(
                f"{self.dataset} files {missing} not found in {self.root / folder}; point data.root at the "
                f"folder that holds {folder}/ or set data.download=true where the network allows"
            )
        cls = CIFAR_CLASSES[self.dataset]
        try:
            sets = (
                cls(str(self.root), train=True, transform=train_tf),
                cls(str(self.root), train=False, transform=eval_tf),
            )
            if any(len(s.data) != len(s.targets) for s in sets):  # torchvision does not check it
                raise ValueError("as many labels as images")
        except UNREADABLE as err:
            why = _unreadable_cifar(self.root / folder, cls)
            if why is None:
                raise
            raise InputError(why) from err
        return sets


# what unpickling a damaged file, and reading what it holds, raise
UNREADABLE = (pickle.UnpicklingError, EOFError, KeyError, IndexError, ValueError, TypeError, AttributeError)


def _unreadable_cifar(folder: Path, cls: type) -> str | None:
    """Why the first of ``cls``'s files in ``folder`` is not what torchvision reads (a python pickle of a
    dict with ``data``: uint8 rows of 3072 values, one per label; ``batches.meta`` / ``meta``: the class
    names), as the message to raise; None when every file reads."""
    label_key = "labels" if cls.base_folder == "cifar-10-batches-py" else "fine_labels"
    for name, _ in cls.train_list + cls.test_list + [[cls.meta["filename"], None]]:
        try:
            with open(folder / name, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            if name == cls.meta["filename"]:
                if cls.meta["key"] not in entry:
                    raise KeyError(cls.meta["key"])
                continue
            rows = np.asarray(entry["data"])
            if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != 3072:
                raise ValueError(f"data is {rows.dtype} of shape {rows.shape}, not uint8 rows of 3072 values")
            labels = entry["labels" if "labels" in entry else label_key]  # torchvision's choice
            if len(labels) != len(rows):
                raise ValueError(f"{len(labels)} labels for {len(rows)} images")
        except (*UNREADABLE, OSError) as err:
            why = f"no {err} entry" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
            return (
                f"{folder / name} is not a readable CIFAR python-pickle file ({why}); replace it with the "
                f"file of that name from the official {cls.filename}, or point data.root at a complete copy"
            )
    return None
