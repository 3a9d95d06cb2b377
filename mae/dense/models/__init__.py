"""Dense-prediction networks on the encoder: the feature pyramid, window attention, heads, detectors."""

from mae.dense.models.cnn_pyramid import CNNFeaturePyramid
from mae.dense.models.pyramid import SimpleFeaturePyramid, feature_pyramid
from mae.dense.models.upernet import UperNetHead

__all__ = ["CNNFeaturePyramid", "SimpleFeaturePyramid", "UperNetHead", "feature_pyramid"]
