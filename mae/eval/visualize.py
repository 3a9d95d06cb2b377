"""Reconstruction figures: original | masked input | reconstruction | reconstruction + visible patches."""

import torch
from torchvision.utils import make_grid

from mae.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from mae.models.mae import MaskedAutoencoderViT


@torch.no_grad()
def reconstruct(
    model: MaskedAutoencoderViT, imgs: torch.Tensor, mask_ratio: float = 0.75, noise: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Run the model and return the four views, each (N, C, H, W) in the input's normalised space.

    With ``norm_pix_loss`` the prediction is in per-patch normalised units; it is mapped back
    with the mean and variance of the true patches (as the official demo does), otherwise it
    looks blocky.
    """
    _, pred, mask = model(imgs, mask_ratio, noise)
    pred = pred.float()
    if model.norm_pix_loss:
        target = model.patchify(imgs.float())
        pred = pred * (target.var(dim=-1, keepdim=True) + 1e-6) ** 0.5 + target.mean(dim=-1, keepdim=True)
    recon = model.unpatchify(pred)
    pixel_mask = model.unpatchify(mask.float().unsqueeze(-1).expand(-1, -1, pred.shape[-1]))  # 1 = masked
    imgs = imgs.float()
    return {
        "original": imgs,
        "masked": imgs * (1 - pixel_mask),
        "reconstruction": recon,
        "reconstruction_visible": imgs * (1 - pixel_mask) + recon * pixel_mask,
    }


def denormalize(x: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """(N, 3, H, W) normalised -> pixel values in [0, 1]."""
    mean = torch.tensor(mean, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(std, device=x.device).view(1, -1, 1, 1)
    return (x * std + mean).clamp(0, 1)


def reconstruction_grid(views: dict[str, torch.Tensor]) -> torch.Tensor:
    """(3, H', W') image in [0, 1]: one row per sample, the four views left to right."""
    columns = [denormalize(views[k]) for k in ("original", "masked", "reconstruction", "reconstruction_visible")]
    rows = torch.stack(columns, dim=1).flatten(0, 1)  # (N*4, C, H, W), sample-major
    return make_grid(rows.cpu(), nrow=4, padding=2, pad_value=1.0)


__all__ = ["denormalize", "reconstruct", "reconstruction_grid"]
