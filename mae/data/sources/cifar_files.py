"""CIFAR-10/100's python files read without running code from them.

The files of CIFAR's python release are pickles (a dict with ``data``: uint8 rows of 3072 values, and a
label per row; the meta file: the class names), and unpickling runs whatever a pickle names. They are read
here with a restricted unpickler that builds only the types CIFAR's files hold (dict, list, str, bytes,
int, and NumPy uint8 arrays through NumPy's own rebuild functions), each named by its exact (module,
name) pair; anything else is refused naming the file, before any of it runs. torchvision's CIFAR reader
(plain ``pickle.load``) is not used.
"""

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from mae.errors import InputError

IMAGE_SIDE = 32
ROW_VALUES = 3 * IMAGE_SIDE * IMAGE_SIDE  # a CIFAR row: the red, green and blue planes of one image


@dataclass(frozen=True)
class CIFARLayout:
    """The python release of one CIFAR dataset: its folder, files, label key and archive."""

    title: str  # "CIFAR-10"
    folder: str  # the folder the archive holds
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str  # the file of the class names
    names_key: str  # the meta file's key of the class names
    label_key: str  # the key of a batch's labels (CIFAR-100: the fine labels)
    num_classes: int
    archive: str
    url: str
    md5: str  # the archive's

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train, *self.test, self.meta)


CIFAR_LAYOUTS = {
    "cifar10": CIFARLayout(
        title="CIFAR-10",
        folder="cifar-10-batches-py",
        train=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test=("test_batch",),
        meta="batches.meta",
        names_key="label_names",
        label_key="labels",
        num_classes=10,
        archive="cifar-10-python.tar.gz",
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
    ),
    "cifar100": CIFARLayout(
        title="CIFAR-100",
        folder="cifar-100-python",
        train=("train",),
        test=("test",),
        meta="meta",
        names_key="fine_label_names",
        label_key="fine_labels",
        num_classes=100,
        archive="cifar-100-python.tar.gz",
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
    ),
}


def _latin1_encode(text: str, encoding: str) -> bytes:
    """``_codecs.encode`` as a protocol-2 pickle of ``bytes`` calls it (with "latin1"), and only so."""
    if encoding != "latin1":
        raise pickle.UnpicklingError(f"GLOBAL _codecs.encode with the encoding {encoding!r}")
    return text.encode("latin-1")


# NumPy's rebuild functions, as its arrays pickle themselves (protocols 2-4, and 5).
_RECONSTRUCT = np.empty(0, np.uint8).__reduce__()[0]
_FROMBUFFER = np.empty(0, np.uint8).__reduce_ex__(5)[0]
# Every object a CIFAR file may name, by its exact (module, name) pair: NumPy 1 wrote numpy.core, NumPy 2
# writes numpy._core; nothing is imported and no dotted path is followed.
CIFAR_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,  # bytes in a protocol-2 pickle
}


class _CIFARUnpickler(pickle.Unpickler):
    """Unpickles only the builtin containers and the objects of ``CIFAR_GLOBALS``."""

    def find_class(self, module: str, name: str) -> Any:
        found = CIFAR_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")
        return found


# What unpickling a damaged file, and reading what it holds, raise.
_DAMAGED = (EOFError, KeyError, IndexError, ValueError, TypeError, AttributeError, OSError)


def _unreadable(path: Path, layout: CIFARLayout, why: str) -> InputError:
    return InputError(
        f"{path} is not a readable CIFAR python-pickle file ({why}); replace it with the file of that name "
        f"from the official {layout.archive}, or point data.root at a complete copy"
    )


def read_cifar_pickle(path: Path, layout: CIFARLayout) -> Any:
    """What the CIFAR python file ``path`` holds, unpickled with only CIFAR's own types (strings of a
    Python 2 pickle as latin-1, as torchvision reads them).

    Raises:
        InputError: naming the file, when it names any other object (it would run code: refused before
            anything of it runs) or is damaged (truncated, not a pickle).
    """
    try:
        with open(path, "rb") as f:
            return _CIFARUnpickler(f, encoding="latin1").load()
    except pickle.UnpicklingError as err:
        if str(err).startswith("GLOBAL "):
            raise InputError(
                f"{path} would run code when loaded ({err}): CIFAR's python files are pickles, read here "
                f"with only the types CIFAR's files hold; take the files from the official {layout.archive}"
            ) from None
        raise _unreadable(path, layout, f"UnpicklingError: {err}") from None
    except _DAMAGED as err:
        raise _unreadable(path, layout, f"{type(err).__name__}: {err}") from None


def read_cifar_batch(path: Path, layout: CIFARLayout, dataset: str) -> tuple[np.ndarray, list[int]]:
    """The images (N, 32, 32, 3) uint8 RGB and labels of the CIFAR batch file ``path``.

    Raises:
        InputError: naming the file: it would run code, is damaged, is not a dict of ``data`` (uint8 rows
            of 3072 values) with one label per row, or holds a label outside ``layout``'s classes
            (``dataset``: the ``data.dataset`` value, for the message).
    """
    entry = read_cifar_pickle(path, layout)
    try:
        rows = np.asarray(entry["data"])
        if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != ROW_VALUES:
            raise ValueError(
                f"data is {rows.dtype} of shape {rows.shape}, not uint8 rows of {ROW_VALUES} values"
            )
        labels = entry["labels" if "labels" in entry else layout.label_key]  # torchvision's choice
        labels = [int(label) for label in labels]
        if len(labels) != len(rows):
            raise ValueError(f"{len(labels)} labels for {len(rows)} images")
    except _DAMAGED as err:
        why = f"no {err} entry" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
        raise _unreadable(path, layout, why) from None
    outside = [label for label in labels if not 0 <= label < layout.num_classes]
    if outside:
        raise InputError(
            f"{path} holds the label {outside[0]}, outside {layout.title}'s {layout.num_classes} classes "
            f"(0-{layout.num_classes - 1}); set data.dataset to the dataset these files hold (now "
            f"{dataset}), or replace the file with the one of that name from the official {layout.archive}"
        )
    return rows.reshape(-1, 3, IMAGE_SIDE, IMAGE_SIDE).transpose(0, 2, 3, 1), labels


def read_cifar_classes(path: Path, layout: CIFARLayout) -> list[str]:
    """The class names of the CIFAR meta file ``path``.

    Raises:
        InputError: naming the file: it would run code, is damaged, or holds no list of names.
    """
    entry = read_cifar_pickle(path, layout)
    try:
        names = entry[layout.names_key]
        if not isinstance(names, list):
            raise TypeError(f"{layout.names_key} is a {type(names).__name__}, not a list of names")
    except _DAMAGED as err:
        why = f"no {err} entry" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
        raise _unreadable(path, layout, why) from None
    return [name.decode("latin-1") if isinstance(name, bytes) else str(name) for name in names]


class CIFARFiles(Dataset):
    """One split of CIFAR-10/100 from its python files in ``folder`` (``read_cifar_batch``): ``data``
    (N, 32, 32, 3) uint8 RGB, ``targets`` (N labels), ``classes`` (the names); an item is (an RGB PIL image
    through ``transform``, its label), as torchvision's CIFAR datasets serve it.

    Args:
        folder: the folder of the files (e.g. ``data/cifar-10-batches-py``).
        dataset: "cifar10" or "cifar100".
        train: the training files, else the test file.
        transform: applied to each PIL image.
    """

    def __init__(self, folder: Path, dataset: str, train: bool, transform: Callable | None = None) -> None:
        layout = CIFAR_LAYOUTS[dataset]
        batches = [
            read_cifar_batch(Path(folder) / name, layout, dataset)
            for name in (layout.train if train else layout.test)
        ]
        self.data = np.concatenate([images for images, _ in batches])
        self.targets = [label for _, labels in batches for label in labels]
        self.classes = read_cifar_classes(Path(folder) / layout.meta, layout)
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image = Image.fromarray(self.data[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, self.targets[index]
