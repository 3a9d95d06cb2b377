"""The detection and segmentation Lightning modules (``mae detect``, ``mae segment``) and their figures."""

from mae.dense.tasks.detection import MAEDetectionModule
from mae.dense.tasks.figures import PredictionFigures
from mae.dense.tasks.segmentation import MAESegmentationModule

__all__ = ["MAEDetectionModule", "MAESegmentationModule", "PredictionFigures"]
