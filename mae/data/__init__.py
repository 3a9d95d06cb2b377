"""Data: datasets, transforms and Lightning data modules."""

from mae.data.datamodules import CIFARDataModule, DigitsDataModule, ImageDataModule, ImageFolderDataModule
from mae.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    eval_transform,
    finetune_transform,
    linprobe_transform,
    pretrain_transform,
    train_transform,
)

__all__ = [
    "CIFARDataModule",
    "DigitsDataModule",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageDataModule",
    "ImageFolderDataModule",
    "StreamingDataModule",
    "eval_transform",
    "finetune_transform",
    "linprobe_transform",
    "train_transform",
    "pretrain_transform",
]


def __getattr__(name: str):
    # litdata is imported only by runs that stream shards
    if name == "StreamingDataModule":
        from mae.data.streaming import StreamingDataModule

        return StreamingDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
