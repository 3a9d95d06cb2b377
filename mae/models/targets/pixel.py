"""The paper's plain target: each patch's pixels."""

import torch

from mae.models.targets.base import PatchTarget


def patchify(imgs: torch.Tensor, p: int) -> torch.Tensor:
    """(N, C, H, W) images -> ``(N, L, p*p*C)`` patches, row-major, pixels ordered (p, p, C) as the official
    MAE's ``patchify``."""
    N, C, H, W = imgs.shape
    h, w = H // p, W // p
    x = imgs.reshape(N, C, h, p, w, p)
    x = torch.einsum("nchpwq->nhwpqc", x)
    return x.reshape(N, h * w, p * p * C)


def unpatchify(x: torch.Tensor, p: int, grid_size: tuple[int, int]) -> torch.Tensor:
    """``(N, L, p*p*C)`` patches of an (h, w) ``grid_size`` -> (N, C, h*p, w*p) images; inverse of
    ``patchify``."""
    N = x.shape[0]
    h, w = grid_size
    C = x.shape[-1] // (p * p)
    x = x.reshape(N, h, w, p, p, C)
    x = torch.einsum("nhwpqc->nchpwq", x)
    return x.reshape(N, C, h * p, w * p)


class PixelTarget(PatchTarget):
    """Each patch's pixels, (p, p, C) ordered: D_target = p*p*C (768 for 16-px RGB patches)."""

    name = "pixel"
    described = "the raw pixels"
    pixels = True

    @classmethod
    def width(cls, patch_size: int, in_chans: int) -> int:
        return patch_size**2 * in_chans

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        return patchify(imgs, self.patch_size)
