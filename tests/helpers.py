"""Test data writers: small JPEG ImageFolders and CIFAR-format pickle files."""

import pickle
from pathlib import Path

import numpy as np
from PIL import Image


def write_image_folder(root: Path, classes: list[str], per_class: int, size=(40, 30), seed: int = 0) -> Path:
    """root/<class>/<i>.jpg with random JPEGs (different sizes allowed by ``size``)."""
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / f"img_{i:03d}.jpg", quality=90)
    return root


def write_cifar(root: Path, name: str = "cifar10", train_per_batch: int = 10, test: int = 10, seed: int = 0) -> Path:
    """The standard python-pickle layout of CIFAR-10 / CIFAR-100, with random pixels."""
    rng = np.random.default_rng(seed)
    num_classes = 10 if name == "cifar10" else 100

    def dump(path: Path, n: int, label_key: str) -> None:
        entry = {
            "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            label_key: rng.integers(0, num_classes, n).tolist(),
        }
        with open(path, "wb") as f:
            pickle.dump(entry, f)

    if name == "cifar10":
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(1, 6):
            dump(folder / f"data_batch_{i}", train_per_batch, "labels")
        dump(folder / "test_batch", test, "labels")
        meta = {"label_names": [f"class{i}" for i in range(10)]}
        meta_file = folder / "batches.meta"
    else:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True, exist_ok=True)
        dump(folder / "train", 5 * train_per_batch, "fine_labels")
        dump(folder / "test", test, "fine_labels")
        meta = {"fine_label_names": [f"class{i}" for i in range(100)]}
        meta_file = folder / "meta"
    with open(meta_file, "wb") as f:
        pickle.dump(meta, f)
    return root
