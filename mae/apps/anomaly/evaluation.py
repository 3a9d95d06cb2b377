"""Anomaly detection on image files, end to end: the images read as the model's training read its data,
each patch's reconstruction error under complementary masks, standardised by the normal images' errors,
image scores, heat maps and, with labels, the metrics. The command (``mae.cli.anomaly``) and the benchmark
(``benchmarks/anomaly.py``) both run it.
"""

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from mae.apps.anomaly.features import smooth_maps
from mae.apps.anomaly.layout import TestSet, mask_view, read_mask
from mae.apps.anomaly.metrics import aupro, image_auroc, pixel_auroc
from mae.apps.anomaly.scoring import NormalStatistics, heat_maps, image_scores
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError
from mae.inference.images import load_image
from mae.inference.normalization import Normalization


def load_images(
    paths: Sequence[Path],
    size: tuple[int, int],
    norm: Normalization,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> torch.Tensor:
    """(N, C, H, W) model input of image files (``load_image``: resized, centre-cropped, normalised).

    Raises:
        ValueError: a file that cannot be read, naming it and the fix (every image is scored, none skipped:
            a skipped test image would change the metrics unseen).
    """
    images = []
    for path in paths:
        try:
            images.append(load_image(path, size, norm, max_pixels))
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise ConfigError(
                f"cannot read {path}: {err}; remove the file from its folder or replace it"
            ) from err
    return torch.stack(images)


def file_errors(
    errors: Callable[[torch.Tensor], torch.Tensor],
    paths: Sequence[Path],
    size: tuple[int, int],
    norm: Normalization,
    batch_size: int = 32,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> torch.Tensor:
    """(N, L) ``errors`` of image files, read ``batch_size`` at a time (only the errors are kept)."""
    return torch.cat(
        [
            errors(load_images(paths[start : start + batch_size], size, norm, max_pixels)).cpu()
            for start in range(0, len(paths), batch_size)
        ]
    )


def ground_truth(test_set: TestSet, size: tuple[int, int]) -> torch.Tensor:
    """(N, H, W) bool masks at the model's input size, all False for good images (``read_mask``: each checked
    against its image's size)."""
    blank = torch.zeros(size, dtype=torch.bool)
    return torch.stack(
        [mask_view(read_mask(i.mask, i.path), size) if i.mask else blank for i in test_set.images]
    )


@dataclass
class AnomalyResult:
    """Scores of the test images, in ``TestSet.images`` order: ``patch_scores`` (N, L), ``scores`` (N,),
    ``maps`` (N, H, W) at the model's input size; ``truth`` (N, H, W) bool ground truth at that size when
    the test set has it; ``metrics`` when it is labelled."""

    patch_scores: torch.Tensor
    scores: torch.Tensor
    maps: torch.Tensor
    truth: torch.Tensor | None
    metrics: dict | None


def score_test_set(
    test_errors: torch.Tensor,
    test_set: TestSet,
    grid_size: tuple[int, int],
    size: tuple[int, int],
    top_k: int,
    normal: NormalStatistics | None = None,
    sigma: float = 0.0,
) -> AnomalyResult:
    """Image scores, heat maps and metrics from (N, L) ``test_errors``: standardised per patch position by
    the ``normal`` images' statistics when given, the image score the mean of the ``top_k`` highest patch
    scores, the maps the patch scores upsampled to ``size`` and, when ``sigma`` > 0, smoothed by a Gaussian
    of ``sigma`` pixels (``features.smooth_maps``, as PatchCore's maps).

    Raises:
        ValueError: a patch score that is not a finite number, naming its images (an AUROC would rank a NaN
            or an infinity somewhere without a word).
    """
    patch_scores = test_errors if normal is None else normal.standardise(test_errors)
    bad = [
        i.path
        for i, finite in zip(test_set.images, torch.isfinite(patch_scores).all(dim=1), strict=True)
        if not finite
    ]
    if bad:
        raise ConfigError(
            f"{len(bad)} of {len(test_set.images)} test images have errors that are not finite numbers (NaN "
            f"or inf): {', '.join(map(str, bad[:5]))}{' ...' if len(bad) > 5 else ''}; an image holding NaN "
            "or inf pixels, or a checkpoint with NaN weights, gives them"
        )
    scores = image_scores(patch_scores, top_k)
    maps = heat_maps(patch_scores, grid_size, size)
    if sigma > 0:
        maps = smooth_maps(maps, sigma)
    truth = ground_truth(test_set, size) if test_set.has_masks else None
    metrics = anomaly_metrics(scores, maps, test_set, truth) if test_set.labelled else None
    return AnomalyResult(patch_scores, scores, maps, truth, metrics)


def anomaly_metrics(
    scores: torch.Tensor, maps: torch.Tensor, test_set: TestSet, truth: torch.Tensor | None
) -> dict:
    """Image AUROC (overall and good vs each defect kind) when there are good and defective images; pixel
    AUROC and AUPRO against (N, H, W) ``truth`` when given and it holds defect and defect-free pixels; counts
    of images per kind. A metric that cannot be computed is under ``not_computed`` with the reason (the
    others are still computed); ``unused_masks`` lists the ground truth's masks of no test image."""
    labels = torch.tensor([i.label for i in test_set.images])
    kinds = [i.kind for i in test_set.images]
    metrics: dict = {"images": {k: kinds.count(k) for k in test_set.kinds}}
    not_computed = {}
    if labels.min() == labels.max():
        which = "good" if labels.max() == 0 else "defective"
        not_computed["image_auroc"] = (
            f"every test image is {which}: image AUROC needs good and defective images"
        )
    else:
        metrics["image_auroc"] = image_auroc(scores, labels)
        metrics["image_auroc_per_kind"] = {}
        for kind in test_set.kinds[1:]:
            pick = torch.tensor([k in ("good", kind) for k in kinds])
            metrics["image_auroc_per_kind"][kind] = image_auroc(scores[pick], labels[pick])
    if truth is not None:
        size = "x".join(map(str, truth.shape[:0:-1]))  # width x height
        missing = "no defect pixel" if not truth.any() else "no defect-free pixel" if truth.all() else None
        if missing is None:
            metrics["pixel_auroc"] = pixel_auroc(maps, truth)
            metrics["aupro"] = aupro(maps, truth)
        else:
            not_computed["pixel_auroc"] = not_computed["aupro"] = (
                f"{missing} in the ground truth ({test_set.ground_truth}) at the metric size {size}: pixel "
                "AUROC and AUPRO need both; check the masks (non-zero = defect; a defect too small may "
                "vanish when resized)"
            )
    if not_computed:
        metrics["not_computed"] = not_computed
    if test_set.unused_masks:
        metrics["unused_masks"] = [str(p) for p in test_set.unused_masks]
    return metrics


def relative_name(path: Path, root: str | os.PathLike) -> str:
    """``path`` relative to ``root`` (as given), POSIX-style."""
    return Path(path).relative_to(root).as_posix()
