"""Anomaly detection from an MAE's reconstruction error: complementary masks (``masks``), per-patch errors,
standardisation, image scores and heat maps (``scoring``), the pixel-kNN baseline (``baseline``), the
feature-memory scorer (``features``), the metrics (``metrics``), the MVTec AD layout (``layout``), the run
on image files (``evaluation``), the scorers ``mae anomaly`` fits or applies, one class each, and their
table (``scorers``), fitted scorers on disk (``saved_scorer``), the thresholds (``threshold``) and the data
they are chosen on (``decision``), a run end to end (``detection``) and what it prints (``report``), the
output files (``outputs``), figures (``figures``) and the built-in digit task (``digits``)."""

from mae.apps.anomaly.masks import ComplementaryMasks, complementary_masks
from mae.apps.anomaly.metrics import aupro, image_auroc, pixel_auroc
from mae.apps.anomaly.scoring import NormalStatistics, heat_maps, image_scores, reconstruction_errors

__all__ = [
    "ComplementaryMasks",
    "NormalStatistics",
    "aupro",
    "complementary_masks",
    "heat_maps",
    "image_auroc",
    "image_scores",
    "pixel_auroc",
    "reconstruction_errors",
]
