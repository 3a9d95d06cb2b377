"""Dense-prediction data: COCO-format detection and class-mask segmentation folders, and the built-in
digit scenes read through each."""

from mae.dense.data.detection import DetectionDataModule, DigitScenesDataModule
from mae.dense.data.segmentation import DigitScenesSegmentation, SegmentationDataModule

__all__ = [
    "DetectionDataModule",
    "DigitScenesDataModule",
    "DigitScenesSegmentation",
    "SegmentationDataModule",
]
