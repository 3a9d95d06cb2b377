"""The thresholds (``mae.apps.anomaly.threshold``): the F1-maximising threshold against brute force, the
quantile threshold, precision / recall / F1 against scikit-learn, and the decision's JSON."""

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import precision_recall_fscore_support

from mae.apps.anomaly.threshold import (
    Decision,
    decision_scores,
    f1_max_threshold,
    quantile_threshold,
)
from mae.errors import ConfigError
from tests.unit.apps.anomaly.trees import brute_force_f1_max


def f1_at(scores: np.ndarray, labels: np.ndarray, t: float) -> float:
    predicted = scores >= t
    return 2 * np.sum(predicted & labels) / (predicted.sum() + labels.sum())


@pytest.mark.parametrize("seed", range(6))
def test_f1_max_threshold__equals_brute_force_over_every_distinct_score(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    scores = rng.integers(0, 6, n).astype(float) if seed % 2 else rng.normal(size=n)  # odd seeds: many ties
    labels = rng.random(n) < 0.4
    labels[0] = True  # at least one anomalous
    threshold = f1_max_threshold(torch.from_numpy(scores), torch.from_numpy(labels))
    expected, best = brute_force_f1_max(scores, labels)
    assert threshold == expected and f1_at(scores, labels, threshold) == pytest.approx(best)


def test_f1_max_threshold__all_defective_one_defect_ties_and_all_normal():
    scores = torch.tensor([0.3, 0.1, 0.7, 0.5], dtype=torch.float64)
    # every image defective: flag them all, the lowest score
    assert f1_max_threshold(scores, torch.ones(4, dtype=torch.bool)) == 0.1
    # one defect with the highest score: exactly it
    assert f1_max_threshold(scores, torch.tensor([0, 0, 1, 0])) == 0.7
    # a good and a defective image tied at the top: flagging both (F1 2/3) beats flagging none
    tied = torch.tensor([0.9, 0.9, 0.2, 0.1], dtype=torch.float64)
    assert f1_max_threshold(tied, torch.tensor([1, 0, 0, 0])) == 0.9
    # pixels: any shape
    maps, truth = torch.rand(2, 4, 4), torch.zeros(2, 4, 4, dtype=torch.bool)
    truth[1, :2] = True
    maps[truth] += 1
    assert f1_max_threshold(maps, truth) == maps[truth].min().item()
    with pytest.raises(ConfigError, match="needs anomalous examples"):
        f1_max_threshold(scores, torch.zeros(4))


def test_quantile_threshold__numpy_linear_quantile_and_its_bounds():
    values = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        assert quantile_threshold(values, q) == pytest.approx(float(np.quantile(values.numpy().ravel(), q)))
    assert quantile_threshold(values, 1.0) == values.max().item()
    assert quantile_threshold(values, 0.0) == values.min().item()
    for q in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="must be in \\[0, 1\\]"):
            quantile_threshold(values, q)


@pytest.mark.parametrize(
    ("predicted", "truth"),
    [
        ([1, 0, 1, 1, 0], [1, 0, 0, 1, 1]),
        ([0, 0, 0, 0], [1, 0, 1, 0]),  # nothing predicted anomalous: precision 0
        ([1, 1, 0, 0], [0, 0, 0, 0]),  # nothing anomalous: recall 0
        ([0, 0], [0, 0]),  # neither: all 0
    ],
)
def test_decision_scores__equal_scikit_learn_with_zero_division_0(predicted, truth):
    got = decision_scores(torch.tensor(predicted), torch.tensor(truth))
    precision, recall, f1, _ = precision_recall_fscore_support(
        truth, predicted, average="binary", zero_division=0
    )
    assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((precision, recall, f1))
    assert sum(got["confusion"].values()) == len(truth)
    assert got["confusion"]["true_positive"] == sum(p and t for p, t in zip(predicted, truth, strict=True))


def test_decision__json_round_trip_and_a_bad_record_refused():
    decision = Decision(0.5, 1.25, "normal-quantile", 0.99, 12, "train/good")
    assert Decision.from_json(json.loads(json.dumps(decision.to_json()))) == decision
    assert decision.anomalous(torch.tensor([0.4, 0.5, 0.6])).tolist() == [False, True, True]
    assert decision.masks(torch.tensor([[1.0, 1.25]])).tolist() == [[False, True]]
    with pytest.raises(ConfigError, match="expected"):
        Decision.from_json({"image_threshold": 0.5})
    with pytest.raises(ConfigError, match="not finite"):
        Decision.from_json({**decision.to_json(), "image_threshold": float("nan")})
