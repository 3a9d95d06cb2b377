"""The pretrained encoder beyond classification, one folder a layer:

- ``models``: ViTDet's simple feature pyramid (``pyramid``) and its window attention (``windows``), the
  UperNet head (``upernet``), torchvision's detectors on the pyramid (``detectors``), the segmenter
  (``segmenter``);
- ``data``: COCO-format detection data (``coco``, ``detection``), class-mask folders (``segmentation``),
  each with a data module on the built-in digit scenes (``mae.data.sources.digit_scenes``);
- ``metrics``: COCO mAP (``detection``), mIoU (``segmentation``);
- ``tasks``: the detection and segmentation Lightning modules on one base (``base``), and their
  prediction figures (``figures``), run by ``mae detect`` and ``mae segment``.

Configs name the classes from here (``class_path: mae.dense.DigitScenesDataModule``), so files can move
without breaking users' YAML; the old module paths still load (``mae.moved``).
"""

from mae.dense.data import (
    DetectionDataModule,
    DigitScenesDataModule,
    DigitScenesSegmentation,
    SegmentationDataModule,
)
from mae.dense.metrics import DetectionMetrics, SegmentationMetrics
from mae.dense.models import CNNFeaturePyramid, SimpleFeaturePyramid, UperNetHead, feature_pyramid
from mae.dense.tasks import MAEDetectionModule, MAESegmentationModule, PredictionFigures

__all__ = [
    "CNNFeaturePyramid",
    "DetectionDataModule",
    "DetectionMetrics",
    "DigitScenesDataModule",
    "DigitScenesSegmentation",
    "MAEDetectionModule",
    "MAESegmentationModule",
    "PredictionFigures",
    "SegmentationDataModule",
    "SegmentationMetrics",
    "SimpleFeaturePyramid",
    "UperNetHead",
    "feature_pyramid",
]
