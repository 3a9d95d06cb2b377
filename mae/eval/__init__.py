"""Measurement of a trained encoder: frozen features from the one extractor (``features``), and one
``evaluate`` per method on them: kNN (``knn``) and the linear probe (``probe``). The commands, the
training monitors and the benchmarks all measure through these. Applications of a trained model (the
page, embeddings, anomaly maps, ONNX) live in ``mae.apps``; what they share with the monitors (image
loading, normalisation, reconstructions) in ``mae.inference``."""

from mae.eval.knn import knn_accuracy, knn_classify, knn_evaluate

__all__ = ["knn_accuracy", "knn_classify", "knn_evaluate"]
