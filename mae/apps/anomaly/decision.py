"""Where ``mae anomaly``'s decision comes from (the thresholds themselves: ``threshold``): the normal images
held out of the fit (``split_normal``), a labelled validation folder (``validation_set``), the
thresholds chosen on either (``choose_decision``), and the checks of the flags that choose them
(``check_decision_options``)."""

import math
from pathlib import Path

import torch

from mae.apps.anomaly.layout import GOOD, TestImage, TestSet, normal_images, read_test_set
from mae.apps.anomaly.report import print_no_spread
from mae.apps.anomaly.scorers.base import Option, Reading, Scorer
from mae.apps.anomaly.threshold import (
    DEFAULT_QUANTILE,
    NORMAL_QUANTILE,
    VALIDATION_F1,
    Decision,
    f1_max_threshold,
    quantile_threshold,
)
from mae.errors import ConfigError, InputError, UsageError

DEFAULT_HOLDOUT = 0.2
MIN_HOLDOUT = 2  # normal images held out for a quantile threshold, at least
MIN_FIT = 2  # normal images left to fit on, at least (the MAE's statistics need 2)
OPTIONS = [  # the command's flags that choose where the thresholds come from
    Option(
        "holdout",
        float,
        f"fraction of the --normal images held out from fitting (at least {MIN_HOLDOUT}, chosen by --seed) "
        "and scored like test images: their --threshold-quantile is the threshold; 0: none held out (no "
        "decision without --validation)",
        default=DEFAULT_HOLDOUT,
    ),
    Option(
        "threshold_quantile",
        float,
        "the quantile of the held-out normal images' scores (and of their heat maps' pixels) taken as the "
        "image (pixel) threshold: 1 = their maximum",
        default=DEFAULT_QUANTILE,
    ),
    Option(
        "validation",
        Path,
        "a labelled validation folder in the --test layout (good/ and a folder per defect; masks from "
        "<validation>/../ground_truth if there): the thresholds that maximise F1 on it; nothing is held out",
    ),
]


def check_decision_options(holdout: float, quantile: float) -> None:
    """Refuse a ``holdout`` fraction (--holdout) outside [0, 1) or a threshold ``quantile``
    (--threshold-quantile) outside [0, 1], before any work.

    Raises:
        UsageError: naming the flag, its range and the value.
    """
    if not 0 <= holdout < 1:  # NaN fails this too
        raise UsageError(
            f"--holdout must be in [0, 1), the fraction of the --normal images held out for the threshold "
            f"(0: none); got {holdout}"
        )
    if not 0 <= quantile <= 1:
        raise UsageError(
            f"--threshold-quantile must be in [0, 1], the quantile of the held-out normal images' scores "
            f"taken as the threshold (1: their maximum); got {quantile}"
        )


def split_normal(normal: Path | None, holdout: float, seed: int) -> tuple[list[Path], list[Path]]:
    """The images of the folder ``normal`` a method fits on and those held out for the threshold: a
    ``holdout`` fraction of them (rounded up), at least ``MIN_HOLDOUT``, drawn by ``seed``; both lists
    sorted. None held out at ``holdout`` 0; two empty lists without ``normal``.

    Raises:
        ConfigError: fewer than ``MIN_FIT`` images left to fit on, naming --normal, the counts and the fix.
    """
    if normal is None:
        return [], []
    images = normal_images(normal)
    if holdout == 0:
        return images, []
    count = max(math.ceil(holdout * len(images)), MIN_HOLDOUT)
    if len(images) - count < MIN_FIT:
        raise ConfigError(
            f"--normal {normal} holds {len(images)} images: --holdout {holdout} holds out {count} (at least "
            f"{MIN_HOLDOUT}) for the threshold and leaves {len(images) - count} to fit on, fewer than "
            f"{MIN_FIT}; add normal images, or pass --holdout 0 (no threshold) or --validation DIR"
        )
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed)).tolist()
    held = sorted(images[i] for i in order[:count])
    return sorted(images[i] for i in order[count:]), held


def validation_set(root: Path) -> TestSet:
    """The labelled validation images of ``root`` (``read_test_set``).

    Raises:
        InputError: a folder without class folders, or without defective images (no F1 to maximise).
    """
    validation = read_test_set(root)
    if not validation.labelled or len(validation.kinds) < 2:
        found = validation.kinds or "images without class folders"
        raise InputError(
            f"--validation {root} needs good and defective images to choose a threshold on: class folders "
            f"{GOOD}/ and one per kind of defect (the --test layout); it has {found}"
        )
    return validation


def choose_decision(
    scorer: Scorer,
    reading: Reading,
    quantile: float,
    held_out: list[Path],
    normal: Path | None,
    validation: TestSet | None,
) -> Decision | None:
    """The thresholds: F1-maximising on ``validation`` when given (without defect pixels there, the
    ``quantile`` of its good images' map values for the pixels), else the ``quantile`` of the ``held_out``
    images' (of the folder ``normal``) scores and map values, each set scored by ``scorer`` as test images
    are; None when there is neither."""
    if validation is not None:
        scored = scorer.score(validation, reading)
        labels = torch.tensor([i.label for i in validation.images])
        if scored.truth is not None and scored.truth.any():
            pixel, pixel_quantile = f1_max_threshold(scored.maps, scored.truth), None
        else:  # no defect pixel to maximise pixel F1 on: the quantile of the good images' pixels
            pixel, pixel_quantile = quantile_threshold(scored.maps[labels == 0], quantile), quantile
        image = f1_max_threshold(scored.scores, labels)
        return Decision(
            image, pixel, VALIDATION_F1, pixel_quantile, len(validation.images), str(validation.root)
        )
    if held_out:
        held = TestSet(normal, [TestImage(path) for path in held_out], has_masks=False)
        scored = scorer.score(held, reading)
        print_no_spread(scored.scores, normal)
        image, pixel = quantile_threshold(scored.scores, quantile), quantile_threshold(scored.maps, quantile)
        return Decision(image, pixel, NORMAL_QUANTILE, quantile, len(held_out), str(normal))
    return None
