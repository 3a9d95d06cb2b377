"""MAE's reconstruction loss: mean squared error on the masked patches only, against the per-patch target
(``mae.models.targets``)."""

import torch

from mae.models.targets.norm_pix import normalize_patches


def masked_patch_mse(
    pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, norm_pix_loss: bool = False
) -> torch.Tensor:
    """Per-patch MSE averaged over the masked patches.

    Args:
        pred: (N, L, D) predicted target of every patch.
        target: (N, L, D) true target (``MaskedAutoencoderViT.target(imgs)``; pixels: ``patchify(imgs)``).
        mask: (N, L), 1 = masked (counted in the loss), 0 = visible (ignored).
        norm_pix_loss: normalise ``target``, pixel patches, per patch first (``normalize_patches``).

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
