"""Evaluation of a trained model: frozen features (``features``), kNN and the linear probe on them
(``knn``, ``probe``), reconstruction figures (``visualize``; of your own images: ``own_images``) and the
local reconstruction page (``demo_page``)."""

from mae.eval.knn import knn_accuracy, knn_classify, knn_evaluate
from mae.eval.visualize import reconstruct, reconstruction_grid

__all__ = ["knn_accuracy", "knn_classify", "knn_evaluate", "reconstruct", "reconstruction_grid"]
