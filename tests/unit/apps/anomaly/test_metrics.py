"""The anomaly metrics (``mae.apps.anomaly.metrics``): image and pixel AUROC against scikit-learn, AUPRO
against its definition computed by brute force, and its bounds."""

import numpy as np
import pytest
import torch
from scipy import ndimage
from sklearn.metrics import roc_auc_score

from mae.apps.anomaly import (
    aupro,
    image_auroc,
    pixel_auroc,
)


def test_image_and_pixel_auroc__equal_scikit_learn_on_the_same_scores():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    # ties included; large standard scores too (a sigmoid would round them all to 1)
    for scores in (np.round(rng.normal(size=200), 1), 40 + np.round(rng.normal(size=200), 2) + 10 * labels):
        expected = roc_auc_score(labels, scores)
        assert image_auroc(torch.tensor(scores, dtype=torch.float32), torch.tensor(labels)) == pytest.approx(
            expected
        )
    truth = torch.tensor(rng.random((4, 8, 8)) < 0.2)
    for maps in (
        np.round(rng.normal(size=(4, 8, 8)), 1),
        30 * rng.normal(size=(4, 8, 8)) + 50 * truth.numpy(),
    ):
        expected = roc_auc_score(truth.numpy().ravel(), maps.ravel())
        assert pixel_auroc(torch.tensor(maps), truth) == pytest.approx(expected)


def brute_force_aupro(maps: np.ndarray, truth: np.ndarray, max_fpr: float = 0.3) -> float:
    """AUPRO by its definition: every distinct score as a threshold, the overlap of every region counted."""
    regions = []
    for i, image in enumerate(truth):
        labelled, count = ndimage.label(image, structure=np.ones((3, 3)))
        regions += [(i, labelled == r) for r in range(1, count + 1)]
    points = [(0.0, 0.0)]
    for t in sorted(set(maps.ravel().tolist()), reverse=True):
        predicted = maps >= t
        fpr = (predicted & ~truth).sum() / (~truth).sum()
        pro = np.mean([(predicted[i] & region).sum() / region.sum() for i, region in regions])
        points.append((fpr, pro))
    area = 0.0
    for (x0, y0), (x1, y1) in zip(points[:-1], points[1:], strict=True):
        if x0 >= max_fpr:
            break
        if x1 > max_fpr:  # cut the last segment at the limit
            y1, x1 = y0 + (y1 - y0) * (max_fpr - x0) / (x1 - x0), max_fpr
        area += (x1 - x0) * (y0 + y1) / 2
    return area / max_fpr


def test_aupro__matches_its_definition_and_its_bounds():
    rng = np.random.default_rng(0)
    truth = np.zeros((3, 12, 12), bool)
    truth[0, 1:3, 1:3] = truth[0, 6:11, 5:10] = truth[1, 0:1, 7:12] = True  # 3 regions of 4, 25 and 5 pixels
    maps = np.round(rng.random((3, 12, 12)) + truth * rng.uniform(0, 0.8, truth.shape), 2)
    assert aupro(torch.tensor(maps), torch.tensor(truth)) == pytest.approx(brute_force_aupro(maps, truth))
    assert aupro(torch.tensor(truth * 1.0), torch.tensor(truth)) == pytest.approx(1.0)  # perfect map
    assert aupro(torch.tensor(~truth * 1.0), torch.tensor(truth)) == pytest.approx(0.0)  # inverted map
    with pytest.raises(ValueError, match="both defect pixels and defect-free pixels"):
        aupro(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4, dtype=torch.bool))
