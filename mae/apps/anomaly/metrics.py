"""How well anomaly scores find defects: image AUROC (good vs defective images), pixel AUROC (defect
pixels vs the rest, over every test image) and AUPRO (the area under the per-region-overlap curve up to a
false-positive rate of 0.3, MVTec AD's metric that weighs a small defect as much as a large one).

References: Bergmann et al., "The MVTec Anomaly Detection Dataset" (IJCV 2021), Sec. 3.2 for the
per-region overlap; AUROC from torchmetrics.
"""

import numpy as np
import torch
from scipy import ndimage
from torchmetrics.functional.classification import binary_auroc

from mae.errors import ConfigError

AUPRO_MAX_FPR = 0.3  # MVTec AD's integration limit


def image_auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """AUROC of (N,) image scores against (N,) labels (1 = defective); exact (no threshold binning)."""
    return float(binary_auroc(_ranks(scores), labels.long(), thresholds=None))


def pixel_auroc(maps: torch.Tensor, masks: torch.Tensor) -> float:
    """AUROC of every pixel's score in (N, H, W) ``maps`` against (N, H, W) bool ground truth, all images
    pooled (good images' pixels are all negatives); exact."""
    return float(binary_auroc(_ranks(maps.flatten()), masks.flatten().long(), thresholds=None))


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """Scores as their dense ranks scaled to [0, 1] (same order, same ties). torchmetrics takes scores
    outside [0, 1] for logits and applies a sigmoid, which rounds large standard scores (above about 17 in
    float32, 37 in float64) to exactly 1: false ties that change the AUROC."""
    values, ranks = torch.unique(scores.detach().double().flatten(), return_inverse=True)
    return ranks.double() / max(len(values) - 1, 1)


def aupro(maps: torch.Tensor, masks: torch.Tensor, max_fpr: float = AUPRO_MAX_FPR) -> float:
    """Normalised area under the per-region-overlap (PRO) curve for false-positive rates up to ``max_fpr``.

    A region is a connected component (8-neighbourhood) of one image's ground truth. At a threshold t,
    PRO is the mean over all regions of the fraction of the region's pixels scoring >= t, and the
    false-positive rate is the fraction of all defect-free pixels (of every image) scoring >= t. The curve
    through every distinct score (exact, no threshold grid), from (0, 0), is integrated with the trapezoid
    rule up to ``max_fpr`` (interpolated there) and divided by ``max_fpr``: 1 is perfect.

    Args:
        maps: (N, H, W) scores, higher = more anomalous.
        masks: (N, H, W) bool ground truth.

    Raises:
        ValueError: no defect pixel or no defect-free pixel (the curve is undefined).
    """
    scores = maps.detach().double().cpu().numpy().ravel()
    truth = masks.cpu().numpy().astype(bool)
    regions = np.zeros(truth.shape, np.int64)  # 0 = defect-free, 1.. = region number over all images
    count = 0
    for i, image in enumerate(truth):
        labelled, found = ndimage.label(image, structure=np.ones((3, 3)))
        regions[i] = np.where(labelled > 0, labelled + count, 0)
        count += found
    regions = regions.ravel()
    negatives = int((regions == 0).sum())
    if count == 0 or negatives == 0:
        raise ConfigError("AUPRO needs both defect pixels and defect-free pixels in the ground truth")
    sizes = np.bincount(regions, minlength=count + 1)
    pro_weight = np.where(regions > 0, 1.0 / (count * sizes[regions]), 0.0)  # each region weighs 1 / count
    fpr_weight = (regions == 0) / negatives
    order = np.argsort(-scores, kind="stable")
    last_of_each_score = np.r_[np.flatnonzero(np.diff(scores[order])), scores.size - 1]
    fpr = np.r_[0.0, np.cumsum(fpr_weight[order])[last_of_each_score]]
    pro = np.r_[0.0, np.cumsum(pro_weight[order])[last_of_each_score]]
    return _area_up_to(fpr, pro, max_fpr) / max_fpr


def _area_up_to(x: np.ndarray, y: np.ndarray, limit: float) -> float:
    """Trapezoid area under the non-decreasing-x curve (x, y) from x[0] to ``limit``, y interpolated there."""
    inside = x <= limit
    xs, ys = x[inside], y[inside]
    if xs[-1] < limit and inside.sum() < len(x):
        after = int(inside.sum())  # the first point past the limit (x is sorted)
        y_limit = np.interp(limit, [x[after - 1], x[after]], [y[after - 1], y[after]])
        xs, ys = np.r_[xs, limit], np.r_[ys, y_limit]
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2))
