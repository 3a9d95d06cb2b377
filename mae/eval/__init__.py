"""Evaluation of a trained model: kNN on frozen features, reconstruction figures."""

from mae.eval.knn import knn_accuracy, knn_classify, knn_evaluate
from mae.eval.visualize import reconstruct, reconstruction_grid

__all__ = ["knn_accuracy", "knn_classify", "knn_evaluate", "reconstruct", "reconstruction_grid"]
