"""The thresholds (``mae.apps.anomaly.threshold``): the F1-maximising threshold against brute force, the
quantile threshold, precision / recall / F1 against scikit-learn, and the decision's JSON."""

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import precision_recall_fscore_support

from mae.apps.anomaly.threshold import (
    NORMAL_QUANTILE,
    VALIDATION_F1,
    Decision,
    decision_scores,
    f1_max_threshold,
    quantile_threshold,
)
from mae.errors import ConfigError
from tests.unit.apps.anomaly.trees import brute_force_f1_max


def f1_at(scores: np.ndarray, labels: np.ndarray, t: float) -> float:
    predicted = scores > t
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
    # every image defective: flag them all, the float just below the lowest score
    assert f1_max_threshold(scores, torch.ones(4, dtype=torch.bool)) == np.nextafter(0.1, -1)
    as_float32 = f1_max_threshold(scores.float(), torch.ones(4, dtype=torch.bool))
    assert as_float32 == np.nextafter(np.float32(0.1), np.float32(-1)) and as_float32 < np.float32(0.1)
    # one defect with the highest score: exactly it, the next score the highest left normal
    assert f1_max_threshold(scores, torch.tensor([0, 0, 1, 0])) == 0.5
    # a good and a defective image tied at the top: flagging both (F1 2/3) beats flagging none
    tied = torch.tensor([0.9, 0.9, 0.2, 0.1], dtype=torch.float64)
    assert f1_max_threshold(tied, torch.tensor([1, 0, 0, 0])) == 0.2
    # pixels: any shape
    maps, truth = torch.rand(2, 4, 4), torch.zeros(2, 4, 4, dtype=torch.bool)
    truth[1, :2] = True
    maps[truth] += 1
    assert f1_max_threshold(maps, truth) == maps[~truth].max().item()
    with pytest.raises(ConfigError, match="needs anomalous examples"):
        f1_max_threshold(scores, torch.zeros(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_f1_max_threshold__flags_exactly_the_images_it_chose(dtype):
    scores = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3], dtype=dtype)
    for labels, flagged in (
        ([1, 1, 1, 1, 1], [1, 1, 1, 1, 1]),
        ([0, 0, 0, 1, 1], [0, 0, 0, 1, 1]),
        ([0, 0, 1, 1, 1], [0, 0, 1, 1, 1]),
    ):
        threshold = f1_max_threshold(scores, torch.tensor(labels))
        decision = Decision(threshold, None, "validation-f1")
        assert decision.anomalous(scores).int().tolist() == flagged


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
    assert decision.anomalous(torch.tensor([0.4, 0.5, 0.6])).tolist() == [False, False, True]
    assert decision.masks(torch.tensor([[1.0, 1.25, 1.5]])).tolist() == [[False, False, True]]
    with pytest.raises(ConfigError, match="expected"):
        Decision.from_json({"image_threshold": 0.5})
    with pytest.raises(ConfigError, match="not finite"):
        Decision.from_json({**decision.to_json(), "image_threshold": float("nan")})


def test_decision__a_score_equal_to_every_normal_images_is_normal():
    """Normal images with no spread: every held-out score the same; its copies are not flagged, and at
    quantile q no more than 1 - q of the held-out images are (q = 1: none)."""
    held_out = torch.zeros(5)
    threshold = quantile_threshold(held_out, 0.99)
    decision = Decision(threshold, quantile_threshold(torch.zeros(5, 4, 4), 0.99), "normal-quantile", 0.99)
    assert not decision.anomalous(held_out).any() and not decision.masks(torch.zeros(5, 4, 4)).any()
    assert decision.anomalous(torch.tensor([1e-6])).all()
    varied = torch.tensor([0.1, 0.2, 0.2, 0.3])
    assert not Decision(quantile_threshold(varied, 1.0), None, NORMAL_QUANTILE).anomalous(varied).any()


def test_decision__a_former_rule_f1_threshold_flags_what_it_flagged():
    """A saved scorer of format 1 flagged ``score >= t`` and its F1 threshold was the lowest score flagged;
    read back, it flags the same float32 scores under ``>``; its quantile thresholds are kept."""
    scores = torch.tensor([0.1, 0.2, 0.30000001, 0.4])
    lowest_flagged = float(scores[2])
    old = Decision(lowest_flagged, float(scores[1]), VALIDATION_F1, None, 8, "val")
    read = Decision.from_json(old.to_json(), flagged_at_threshold=True)
    assert (
        read.anomalous(scores).tolist() == (scores >= lowest_flagged).tolist() == [False, False, True, True]
    )
    assert read.masks(scores).tolist() == [False, True, True, True]  # the pixel threshold chosen by F1 too
    quantile_pixels = Decision(lowest_flagged, 0.25, VALIDATION_F1, 0.99, 8, "val")
    assert Decision.from_json(quantile_pixels.to_json(), True).pixel_threshold == 0.25
    by_quantile = Decision(0.25, 0.5, NORMAL_QUANTILE, 0.99, 2, "good")
    assert Decision.from_json(by_quantile.to_json(), flagged_at_threshold=True) == by_quantile
