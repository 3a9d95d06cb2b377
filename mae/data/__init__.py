"""Data: datasets, transforms and Lightning data modules."""

from mae.data.datamodules import CIFARDataModule, DigitsDataModule, ImageDataModule, ImageFolderDataModule
from mae.data.transforms import IMAGENET_MEAN, IMAGENET_STD, eval_transform, pretrain_transform

__all__ = [
    "CIFARDataModule",
    "DigitsDataModule",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageDataModule",
    "ImageFolderDataModule",
    "eval_transform",
    "pretrain_transform",
]
