"""What the dense tasks are scored with: COCO mAP and mIoU."""

from mae.dense.metrics.detection import DetectionMetrics
from mae.dense.metrics.segmentation import SegmentationMetrics

__all__ = ["DetectionMetrics", "SegmentationMetrics"]
