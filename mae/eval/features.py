"""Frozen features of an encoder, the one extractor of every evaluation (kNN, linear probe): an MAE
model's or a timm ViT's tokens on all patches, pooled, computed once per image (or view)."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from mae.convert.backbone import load_backbone
from mae.convert.pooling import POOLS, Pool, pooled  # noqa: F401 (defined with the encoder: ONNX files pool so)
from mae.data import ImageDataModule, Loader, fixed_subset
from mae.io.progress import Progress


def l2_normalised(encode: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``encode`` with each feature row scaled to unit L2 norm (on the encoder's device)."""
    return lambda imgs: torch.nn.functional.normalize(encode(imgs), dim=1)


def load_encoder(
    checkpoint: str | Path,
    data: ImageDataModule,
    checkpoint_format: str = "auto",
    device: torch.device | str = "cpu",
) -> torch.nn.Module:
    """The encoder of any checkpoint ``mae.load_backbone`` reads, for ``data``'s image size and
    channels, on ``device`` in evaluation mode."""
    backbone = load_backbone(
        checkpoint, img_size=data.img_size, format=checkpoint_format, in_chans=data.in_chans
    )
    return backbone.to(device).eval()


def evaluation_subsets(
    train_set: Dataset,
    val_set: Dataset,
    max_train: int | None,
    max_val: int | None,
    announce: Callable[[int, int], None] | None = None,
) -> tuple[Dataset, Dataset]:
    """``train_set`` and ``val_set`` as an evaluation reads them: each a fixed random subset
    (``mae.data.fixed_subset``) of ``max_train`` / ``max_val`` images when larger (None: whole);
    ``announce``, when given, is called with their sizes before any feature is extracted."""
    if max_train is not None:
        train_set = fixed_subset(train_set, max_train)
    if max_val is not None:
        val_set = fixed_subset(val_set, max_val)
    if announce is not None:
        announce(len(train_set), len(val_set))
    return train_set, val_set


class FeatureStore:
    """Features (N, D) float32 and labels (N,) int64: in memory, or in ``.npy`` files read in chunks
    (for datasets whose features do not fit in memory)."""

    def __init__(self, feats: np.ndarray, labels: np.ndarray, views: int = 1) -> None:
        self.feats, self.labels = feats, labels
        self.views = views  # rows are view-major: row r is image r % (rows / views)

    @classmethod
    @torch.no_grad()
    def extract(
        cls,
        encode: Callable[[torch.Tensor], torch.Tensor],
        dataset: Dataset,
        batch_size: int = 256,
        num_workers: int = 0,
        device: torch.device | str = "cpu",
        views: int = 1,
        cache: str | Path | None = None,
        progress: str | None = None,
    ) -> "FeatureStore":
        """Run ``encode`` ((N, C, H, W) -> (N, D) float) over ``dataset`` ``views`` times (augmented
        views when its transform is random), writing to ``cache`` (a file prefix; memory-mapped
        ``.npy``) when given. ``progress``: what the work is ("kNN: features of the training split"),
        to show its progress on stderr (``mae.io.progress.Progress``); None: nothing shown."""
        total = len(dataset) * views
        feats = labels = None
        offset = 0
        with Progress(total, progress or "", enabled=progress is not None) as shown:
            for _ in range(views):
                for imgs, targets in Loader(dataset, batch_size=batch_size, num_workers=num_workers):
                    out = encode(imgs.to(device)).cpu().numpy()
                    if feats is None:
                        feats = _array(cache, "feats", (total, out.shape[1]), np.float32)
                        labels = _array(cache, "labels", (total,), np.int64)
                    feats[offset : offset + len(out)] = out
                    labels[offset : offset + len(out)] = targets.numpy()
                    offset += len(out)
                    shown.update(len(out))
        if isinstance(feats, np.memmap):
            feats.flush()
            labels.flush()
        return cls(feats, labels, views)

    def __len__(self) -> int:
        return len(self.labels)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(features (N, D), labels (N,)) as tensors sharing the store's memory."""
        return torch.from_numpy(np.asarray(self.feats)), torch.from_numpy(np.asarray(self.labels))

    def chunks(self, indices: np.ndarray, size: int):
        """(features, labels) of ``indices``, in their order, ``size`` rows at a time (each chunk read
        from disk in file order)."""
        for start in range(0, len(indices), size):
            rows = indices[start : start + size]
            order = np.argsort(rows, kind="stable")
            back = np.empty_like(order)
            back[order] = np.arange(len(order))
            feats, labels = (
                np.asarray(self.feats[rows[order]])[back],
                np.asarray(self.labels[rows[order]])[back],
            )
            yield torch.from_numpy(feats), torch.from_numpy(labels)


# The files of a feature cache (``cache`` prefix + split): their suffix, dtype and number of dimensions.
CACHE_FILES = {"feats": (np.float32, 2), "labels": (np.int64, 1)}


def cache_files(prefix: str | Path) -> list[Path]:
    """The files ``FeatureStore.extract`` writes for the cache ``prefix`` (e.g. ``cache.train``)."""
    return [Path(f"{prefix}.{name}.npy") for name in CACHE_FILES]


def is_cache_file(path: Path) -> bool:
    """Whether ``path`` is a feature-cache array this module wrote: an .npy of its name's dtype and rank."""
    name = Path(path).name.removesuffix(".npy").rsplit(".", 1)[-1]
    if name not in CACHE_FILES:
        return False
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError):
        return False
    dtype, ndim = CACHE_FILES[name]
    return array.dtype == dtype and array.ndim == ndim


def _array(cache: str | Path | None, name: str, shape: tuple, dtype) -> np.ndarray:
    if cache is None:
        return np.empty(shape, dtype)
    path = Path(f"{cache}.{name}.npy")
    path.parent.mkdir(parents=True, exist_ok=True)
    return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
