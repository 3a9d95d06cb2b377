"""MAE's reconstruction loss: mean squared error on the masked patches only."""

import torch


def normalize_patches(patches: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Normalise every patch by its own mean and variance (the paper's ``norm_pix_loss`` target).

    Args:
        patches: (N, L, p*p*C) pixel patches.

    Returns:
        (N, L, p*p*C), each patch with zero mean and unit (unbiased) variance.
    """
    mean = patches.mean(dim=-1, keepdim=True)
    var = patches.var(dim=-1, keepdim=True)
    return (patches - mean) / (var + eps) ** 0.5


def masked_patch_mse(
    pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, norm_pix_loss: bool = False
) -> torch.Tensor:
    """Per-patch MSE averaged over the masked patches.

    Args:
        pred: (N, L, p*p*C) predicted pixels of every patch.
        target: (N, L, p*p*C) true pixels (``patchify(imgs)``).
        mask: (N, L), 1 = masked (counted in the loss), 0 = visible (ignored).
        norm_pix_loss: compare against per-patch normalised targets.

    Returns:
        Scalar loss. With no masked patch at all (mask_ratio 0) the loss is 0.
    """
    if norm_pix_loss:
        target = normalize_patches(target)
    per_patch = ((pred.float() - target.float()) ** 2).mean(dim=-1)
    mask = mask.float()
    return (per_patch * mask).sum() / mask.sum().clamp(min=1.0)


def masked_patch_mse_per_image(
    pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, norm_pix_loss: bool = False
) -> torch.Tensor:
    """(N,) the loss of ``masked_patch_mse`` for each image alone (0 for an image with no masked patch)."""
    if norm_pix_loss:
        target = normalize_patches(target)
    per_patch = ((pred.float() - target.float()) ** 2).mean(dim=-1)
    mask = mask.float()
    return (per_patch * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
