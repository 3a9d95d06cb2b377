"""What ``mae anomaly`` prints about a run: ground-truth masks no test image uses, the decision's thresholds
and the metrics (``metrics.json`` holds them all; these lines say them)."""

from pathlib import Path

import torch

from mae.apps.anomaly.layout import GOOD
from mae.apps.anomaly.threshold import Decision


def print_unused_masks(unused: list[Path]) -> None:
    """A note naming the ground-truth masks that match no test image, when there are any."""
    if not unused:
        return
    count = len(unused)
    print(
        f"note: {count} ground-truth {'mask matches' if count == 1 else 'masks match'} no test image and "
        f"{'is' if count == 1 else 'are'} not used: {', '.join(map(str, unused))} (the mask of "
        "<test>/<defect>/<name>.png is <ground truth>/<defect>/<name>_mask.png)"
    )


def print_decision(decision: Decision | None) -> None:
    """The thresholds and where they come from, or how to get some."""
    if decision is None:
        print(
            "note: no decision (is_anomalous left empty): give --normal with --holdout above 0, or "
            "--validation, to choose a threshold"
        )
        return
    print(
        f"threshold ({decision.chosen_by}, {decision.images} images of {decision.source}): image score "
        f"> {decision.image_threshold:.6g} is anomalous, heat-map value > {decision.pixel_threshold:.6g} "
        "a defect pixel"
    )


def print_no_spread(scores: torch.Tensor, source: Path) -> None:
    """A note when the (N,) image scores of the held-out normal images of ``source`` are all one value:
    that value is the threshold, and only an image scoring above it is flagged."""
    if len(scores) and scores.min() == scores.max():
        print(
            f"note: the {len(scores)} held-out normal images of {source} all score "
            f"{float(scores[0]):.6g} (no spread: copies of one image?): that is the threshold; an image is "
            "anomalous only when it scores above it"
        )


def print_metrics(metrics: dict) -> None:
    """The counts, AUROCs, AUPRO, the decision's F1 / precision / recall and why any is not computed."""
    counts = ", ".join(f"{kind} {n}" for kind, n in metrics["images"].items())
    print(f"test images: {counts}")
    for name in ("image_auroc", "pixel_auroc", "aupro"):
        if name in metrics:
            print(f"{name}: {metrics[name]:.4f}")
    for kind, value in metrics.get("image_auroc_per_kind", {}).items():
        print(f"image_auroc {GOOD} vs {kind}: {value:.4f}")
    for level in ("image", "pixel"):
        if f"{level}_f1" in metrics:
            scores = ", ".join(
                f"{name} {metrics[f'{level}_{name}']:.4f}" for name in ("f1", "precision", "recall")
            )
            print(f"{level} level at the threshold: {scores}")
    reasons: dict[str, list[str]] = {}  # the metrics that share a reason, on one line
    for name, reason in metrics.get("not_computed", {}).items():
        reasons.setdefault(reason, []).append(name)
    for reason, names in reasons.items():
        print(f"note: {', '.join(names)} not computed: {reason}")
