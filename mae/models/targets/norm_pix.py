"""The paper's normalised-pixel target (``norm_pix_loss``): each patch's pixels, normalised by the patch's own
mean and variance, as the official MAE's released models were trained."""

import torch

from mae.models.targets.pixel import PixelTarget


def normalize_patches(patches: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Normalise every patch by its own mean and variance, as the official ``forward_loss`` does.

    Args:
        patches: (N, L, p*p*C) pixel patches.

    Returns:
        (N, L, p*p*C), each patch ``(x - mean) / (var + eps) ** .5``, var unbiased (torch's default, the
        official code's): zero mean and unit variance, a flat patch all zeros.
    """
    mean = patches.mean(dim=-1, keepdim=True)
    var = patches.var(dim=-1, keepdim=True)
    return (patches - mean) / (var + eps) ** 0.5


class NormPixTarget(PixelTarget):
    """Each patch's pixels normalised per patch (``normalize_patches``): D_target = p*p*C."""

    name = "norm_pix"
    described = "the per-patch normalised pixels"

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        return normalize_patches(super().forward(imgs))
