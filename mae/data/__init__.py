"""Data: how image files are read, the recipes' views of them, the sources that serve them, and
the tools that prepare them. Each sub-package is one part, and each rule is written in one place:

- ``decoding``: what a file is (``formats``: the extension table, ``PixelFormat`` and the rule
  that picks the 8-bit RGB or the array path), the pixel limit (``limits``), the array reader
  (``arrays.read_pixels``) and the RGB reader (``rgb.read_rgb``).
- ``views``: the recipes' views of decoded pixels: the one random crop (``crop``), the RGB recipes
  (``recipes``), the array views (``arrays``), GPU decoding of pretraining batches (``gpu``), and
  normalisation (``normalize``).
- ``sources``: the Lightning data modules on one base (``base``): built-in digits and CIFAR
  (``builtin``), image folders (``folder``, with the layout rules in ``layout``), streamed shards
  (``streaming``, ``shard_format``), the built-in digit scenes (``digit_scenes``: written once, read
  by the dense tasks and, as pretraining images, by ``scene_images``), and the loaders' workers.
- ``tools``: the shard converter and the statistics command (``mae shard`` /
  ``mae stats``).
"""

from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.sources.base import ImageDataModule
from mae.data.sources.builtin import CIFARDataModule, DigitsDataModule
from mae.data.sources.folder import ImageFolderDataModule
from mae.data.sources.loader_workers import Loader
from mae.data.sources.scene_images import DigitSceneImagesDataModule
from mae.data.sources.subsets import fixed_subset
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD, normalize_batch
from mae.data.views.recipes import (
    eval_transform,
    finetune_transform,
    linprobe_transform,
    pretrain_transform,
    train_transform,
)

__all__ = [
    "CIFARDataModule",
    "DEFAULT_MAX_PIXELS",
    "DigitSceneImagesDataModule",
    "DigitsDataModule",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageDataModule",
    "ImageFolderDataModule",
    "Loader",
    "StreamingDataModule",
    "eval_transform",
    "finetune_transform",
    "fixed_subset",
    "linprobe_transform",
    "normalize_batch",
    "pretrain_transform",
    "train_transform",
]


def __getattr__(name: str):
    # litdata is imported only by runs that stream shards
    if name == "StreamingDataModule":
        from mae.data.sources.streaming import StreamingDataModule

        return StreamingDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
