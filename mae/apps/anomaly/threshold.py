"""The decision: a threshold on the image score (is this image defective?) and one on the heat map's pixel
values (which pixels are the defect), chosen on data, and precision / recall / F1 at them.

The rule, one for both levels: an image (a pixel) is anomalous when its score (its map value) is
**above** the threshold (``>``); a score equal to the threshold is normal. So an exact copy of a normal
image the threshold was chosen on is never flagged for scoring what that image scored: normal images
with no spread (copies of one image, or held-out images each with a copy among those fitted) all score
the same, the threshold is that score, and only an image scoring above it is anomalous; and at the
quantile q at most a 1 - q fraction of the held-out normal images is above it (q = 1: none). A threshold
is chosen by one of:

- ``normal-quantile``: a quantile (``--threshold-quantile``, default 0.99) of the image scores of normal
  images held out from what the method fits on (``--holdout``), and the same quantile of their heat maps'
  pixel values; numpy's linear interpolation between the two nearest values.
- ``validation-f1``: on a labelled validation set, the image threshold that maximises F1 over every
  way of flagging the images scored above a cut (no grid): the highest score left normal, or just below
  the lowest score when flagging every image is best; with ground truth, the pixel threshold likewise;
  without, the pixel threshold is the quantile of its good images' pixel values.

Saved scorers of format 1 (mae 0.3 and 0.4) flagged a score **at least** the threshold (``>=``), their
F1 thresholds the lowest score flagged: ``Decision.from_json(..., flagged_at_threshold=True)`` reads such an
F1 threshold as the float32 just below it, which flags the same float32 scores under ``>``; their quantile
thresholds are read as they are (a score equal to one is now normal: the rule above).

What ``metrics.json`` reports (``decision_metrics``), beside the AUROCs:
``image_precision``, ``image_recall``, ``image_f1``, ``image_confusion`` (``true_positive``,
``false_positive``, ``false_negative``, ``true_negative``: image counts) and, with ground truth, the same
four with ``pixel_`` in front (pixel counts at the metric size); ``decision``: ``Decision.to_json()``:
``image_threshold``, ``pixel_threshold`` (None: no predicted masks), ``chosen_by`` (one of the two above),
``quantile`` (None unless a quantile was taken), ``images`` (how many images chose it), ``source`` (the
folder they came from). Zero division, defined, never NaN: precision is 0 when nothing is predicted
anomalous, recall 0 when nothing is anomalous, F1 0 when precision + recall is 0 (scikit-learn's
``zero_division=0``).
"""

from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from mae.errors import ConfigError

NORMAL_QUANTILE, VALIDATION_F1 = "normal-quantile", "validation-f1"
DEFAULT_QUANTILE = 0.99


@dataclass(frozen=True)
class Decision:
    """The thresholds of a decision (``score > image_threshold``: anomalous; ``map > pixel_threshold``: a
    defect pixel) and how they were chosen (see the module's docstring for the fields)."""

    image_threshold: float
    pixel_threshold: float | None
    chosen_by: str
    quantile: float | None = None
    images: int | None = None
    source: str | None = None

    def to_json(self) -> dict:
        """The fields as a JSON object (plain floats, ints, strings and None)."""
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict, flagged_at_threshold: bool = False) -> "Decision":
        """The decision ``to_json`` wrote; ``flagged_at_threshold``: one written under the former rule
        (``>=``, saved-scorer format 1), whose F1-chosen thresholds become the float32 just below them.

        Raises:
            ConfigError: a field missing, unknown, or an image threshold that is not a finite number.
        """
        fields = set(cls.__dataclass_fields__)
        if not {"image_threshold", "pixel_threshold", "chosen_by"} <= set(record) <= fields:
            raise ConfigError(
                f"a saved decision has the fields {sorted(record)}; expected {sorted(fields)} (written by "
                "another version of mae?)"
            )
        decision = cls(**record)
        thresholds = [decision.image_threshold] + [decision.pixel_threshold] * (
            decision.pixel_threshold is not None
        )
        if not all(isinstance(t, int | float) and np.isfinite(t) for t in thresholds):
            raise ConfigError(f"a saved decision's thresholds are not finite numbers: {thresholds}")
        if flagged_at_threshold and decision.chosen_by == VALIDATION_F1:
            pixel_by_f1 = decision.pixel_threshold is not None and decision.quantile is None
            decision = replace(
                decision,
                image_threshold=_just_below(decision.image_threshold),
                pixel_threshold=_just_below(decision.pixel_threshold)
                if pixel_by_f1
                else decision.pixel_threshold,
            )
        return decision

    def anomalous(self, scores: torch.Tensor) -> torch.Tensor:
        """(N,) image scores -> (N,) bool: above the image threshold."""
        return scores > self.image_threshold

    def masks(self, maps: torch.Tensor) -> torch.Tensor | None:
        """(N, H, W) heat maps -> (N, H, W) bool predicted defect masks (None without a pixel threshold)."""
        return None if self.pixel_threshold is None else maps > self.pixel_threshold


def quantile_threshold(values: torch.Tensor, quantile: float) -> float:
    """The ``quantile`` (in [0, 1]) of every value of ``values`` (any shape), linear interpolation between
    the two nearest (numpy's default): 1 is the largest value, 0 the smallest."""
    if not 0 <= quantile <= 1:  # NaN fails this too
        raise ConfigError(f"a threshold quantile must be in [0, 1], got {quantile}")
    return float(np.quantile(values.detach().double().cpu().numpy().ravel(), quantile))


def f1_max_threshold(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The threshold t whose decision ``scores > t`` has the highest F1 against ``labels`` (1 / True =
    anomalous), over every cut between distinct ``scores``: t is the highest score left normal, or the
    float just below the lowest score (in the scores' dtype) when flagging every one is best; of equal
    F1s, the fewest images flagged (the highest t). Exact: one sort, counts accumulated over the scores in
    descending order.

    Args:
        scores: (...) float scores, any shape (image scores or every pixel's map value).
        labels: the same shape, bool or 0 / 1.

    Raises:
        ConfigError: no anomalous label (every threshold has F1 0).
    """
    values = scores.detach().double().cpu().numpy().ravel()
    truth = labels.detach().cpu().numpy().ravel().astype(bool)
    positives = int(truth.sum())
    if positives == 0:
        raise ConfigError("an F1-maximising threshold needs anomalous examples; every label is normal")
    order = np.argsort(-values, kind="stable")
    last_of_each_score = np.r_[np.flatnonzero(np.diff(values[order])), values.size - 1]
    true_positives = np.cumsum(truth[order])[last_of_each_score]
    flagged = last_of_each_score + 1
    f1 = 2 * true_positives / (flagged + positives)  # 2 TP / (2 TP + FP + FN), FP + TP = flagged
    cut = last_of_each_score[int(np.argmax(f1))]  # argmax: the first, the fewest flagged
    if cut + 1 < values.size:
        return float(values[order][cut + 1])  # the highest score left normal
    return _just_below(float(values[order][cut]), scores.dtype)


def _just_below(threshold: float, dtype: torch.dtype = torch.float32) -> float:
    """The largest ``dtype`` number below ``threshold`` (rounded to ``dtype`` first): ``x > it`` is
    ``x >= threshold`` for every ``x`` of that dtype."""
    value = torch.tensor(threshold, dtype=dtype)
    return float(torch.nextafter(value, torch.tensor(-float("inf"), dtype=dtype)))


def decision_scores(predicted: torch.Tensor, truth: torch.Tensor) -> dict:
    """Precision, recall, F1 and the confusion counts of (...) bool ``predicted`` against (...) bool
    ``truth``, zero divisions 0 (the module's docstring)."""
    predicted, truth = predicted.flatten().bool(), truth.flatten().bool()
    tp = int((predicted & truth).sum())
    fp = int((predicted & ~truth).sum())
    fn = int((~predicted & truth).sum())
    tn = predicted.numel() - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    confusion = {"true_positive": tp, "false_positive": fp, "false_negative": fn, "true_negative": tn}
    return {"precision": precision, "recall": recall, "f1": f1, "confusion": confusion}


def decision_metrics(
    decision: Decision,
    scores: torch.Tensor,
    labels: torch.Tensor,
    maps: torch.Tensor,
    truth: torch.Tensor | None,
) -> dict:
    """``image_precision``, ``image_recall``, ``image_f1``, ``image_confusion`` of (N,) ``scores`` against
    (N,) ``labels`` at ``decision``; the ``pixel_`` four of (N, H, W) ``maps`` against bool ``truth`` when
    both ``truth`` and a pixel threshold are there; ``decision``: its ``to_json()``."""
    metrics = {}
    for name, value in decision_scores(decision.anomalous(scores), labels.bool()).items():
        metrics[f"image_{name}"] = value
    predicted = decision.masks(maps)
    if truth is not None and predicted is not None:
        for name, value in decision_scores(predicted, truth).items():
            metrics[f"pixel_{name}"] = value
    return {**metrics, "decision": decision.to_json()}
