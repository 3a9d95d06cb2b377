"""Anomaly scores from an MAE's reconstruction error: each patch's error when it is hidden, averaged over
complementary masks (``masks``); standardised per patch position by the errors of normal images; an image
score from the highest patch errors; a heat map at the image's size.

Where the error is measured: in the space the model's loss is computed in. A pixel-target model predicts
the patches of the normalised image, and the error is the squared difference to them; a ``norm_pix_loss``
model (the default run's, the paper's released ones) predicts only each patch's normalised pattern (zero
mean, unit variance), and the error is the squared difference to the true patch's normalised pattern,
exactly the per-patch term of its training loss. Un-normalising the prediction with the true patch's mean
and variance instead would hand the model what it never predicted (as ``mae.inference.reconstruction`` warns
for figures) and weight each error by its patch's variance; comparing the raw prediction with raw pixels
would score the brightness the model was never asked for. The consequence, stated rather than hidden: a
``norm_pix_loss`` model cannot see a defect that only changes a patch's brightness uniformly (a flat
blob's interior); it sees the blob's edges, and any change of pattern. A model of another target
(``mae.models.targets``: HOG) is scored in its target's space alike.
"""

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from mae.apps.anomaly.masks import ComplementaryMasks
from mae.errors import ConfigError
from mae.models.mae import MaskedAutoencoderViT


@torch.no_grad()
def reconstruction_errors(
    model: MaskedAutoencoderViT, imgs: torch.Tensor, masks: ComplementaryMasks
) -> torch.Tensor:
    """Each patch's reconstruction error, averaged over the masks that hide it.

    Args:
        model: the MAE, in evaluation mode.
        imgs: (N, C, H, W) normalised model input.
        masks: M complementary masks (``complementary_masks``), the same for every image.

    Returns:
        (N, L) float, the mean over the masks hiding each patch of its squared error per value (see the
        module's docstring for the space), in patch order (row-major over the (H/p, W/p) grid).
    """
    N, (M, L) = imgs.shape[0], masks.noise.shape
    x = imgs[:, None].expand(N, M, *imgs.shape[1:]).reshape(N * M, *imgs.shape[1:])
    noise = masks.noise.to(imgs.device).repeat(N, 1)  # row n * M + m: image n under mask m
    _, pred, mask = model(x, masks.mask_ratio, noise)  # evaluation mode: every masked patch reconstructed
    pred = pred.float()
    target = model.target(x.float())  # the loss's space: pixels, normalised per patch for norm_pix, HOG
    error = ((pred - target) ** 2).mean(dim=-1).view(N, M, L)
    hidden = mask.view(N, M, L)
    return (error * hidden).sum(dim=1) / hidden.sum(dim=1)


@dataclass
class NormalStatistics:
    """Per-position error statistics of normal images: ``mean`` (L,) and ``scale`` (L,), the standard
    deviation floored at ``FLOOR`` times its mean over positions (a position where every normal image
    reconstructs perfectly, such as an always-empty corner, would otherwise divide by zero); ``floored``:
    how many positions the floor raised, so a command can say so.

    Why: how well a patch can be rebuilt from its context depends on where it is (the middle of an object
    is harder than an empty corner), so a raw error says as much about the position as about a defect.
    A standard score says how unusual the error is for that position among normal images.
    """

    mean: torch.Tensor
    scale: torch.Tensor
    floored: int = 0

    FLOOR = 0.1

    @classmethod
    def of(cls, errors: torch.Tensor) -> "NormalStatistics":
        """From (N, L) errors of N >= 2 normal images.

        Raises:
            ValueError: fewer than 2 images; an error that is not a finite number; a standard deviation of 0
                at every position (identical images: no floor to take, every score would be infinite).
        """
        if errors.shape[0] < 2:
            raise ConfigError(f"per-patch statistics need at least 2 normal images, got {errors.shape[0]}")
        if not torch.isfinite(errors).all():
            raise ConfigError(
                "the normal images' reconstruction errors are not all finite numbers (NaN or inf)"
            )
        std = errors.std(dim=0)
        floor = cls.FLOOR * std.mean().item()
        if floor == 0:
            raise ConfigError(
                f"the {errors.shape[0]} normal images' errors have standard deviation 0 at every patch "
                "position (identical images?), so every standard score would be infinite"
            )
        return cls(errors.mean(dim=0), std.clamp(min=floor), int((std < floor).sum()))

    def standardise(self, errors: torch.Tensor) -> torch.Tensor:
        """(N, L) errors -> (N, L) standard scores: how unusual each patch's error is for its position."""
        return (errors - self.mean.to(errors.device)) / self.scale.to(errors.device)


def image_scores(patch_scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """(N, L) -> (N,): the mean of each image's ``top_k`` highest patch scores (at most L)."""
    if top_k < 1:
        raise ConfigError(f"top_k must be at least 1, got {top_k}")
    return patch_scores.topk(min(top_k, patch_scores.shape[1]), dim=1).values.mean(dim=1)


def heat_maps(patch_scores: torch.Tensor, grid_size: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """(N, L) patch scores -> (N, H, W) maps: the (H/p, W/p) grid upsampled bilinearly to ``size``."""
    grid = patch_scores.float().reshape(-1, 1, *grid_size)
    return F.interpolate(grid, size=size, mode="bilinear", align_corners=False)[:, 0]
