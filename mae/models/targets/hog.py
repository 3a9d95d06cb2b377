"""MaskFeat's target: histograms of oriented gradients (HOG) of each patch's cells.

Per channel: image gradients by the fixed central-difference kernel [-1, 0, 1] along rows and columns (zero on
the image's border rows and columns, where the kernel does not fit, as Dalal and Triggs and scikit-image
take them); each pixel's magnitude, weighted by a Gaussian window over its patch, goes to one of ``nbins``
unsigned orientation bins over [0, 180) degrees; the magnitudes are summed per cell of ``patch_size // 2``
px (8 px for 16-px patches, 2 px for 4-px ones), and each cell's histogram is L2-normalised on its own (the
paper's local contrast normalisation). A patch's target is its 2x2 cells' histograms of every channel:
2 x 2 x C x 9 values, 108 for an RGB 16-px patch. Computed in torch on the images' device.

References: Wei et al., "Masked Feature Prediction for Self-Supervised Visual Pre-Training" (MaskFeat,
CVPR 2022); Dalal and Triggs, "Histograms of Oriented Gradients for Human Detection" (CVPR 2005).
mmpretrain's ``HOGGenerator(nbins=9, pool=8, gaussian_window=16)`` takes the same settings.
"""

import math

import torch

from mae.errors import ConfigError
from mae.models.targets.base import PatchTarget

NBINS = 9  # MaskFeat's orientation bins over [0, 180) degrees
CELLS = 2  # cells per patch side: the cell is half the patch
EPS = 1e-5  # in the L2 normalisation: a cell with no gradient (a flat or black one) stays 0


def gradients(imgs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C, H, W) images -> (d/drow, d/dcol), each (N, C, H, W): ``[-1, 0, 1]`` central differences per
    channel, 0 on the border rows (d/drow) and columns (d/dcol)."""
    g_row = torch.zeros_like(imgs)
    g_col = torch.zeros_like(imgs)
    g_row[..., 1:-1, :] = imgs[..., 2:, :] - imgs[..., :-2, :]
    g_col[..., :, 1:-1] = imgs[..., :, 2:] - imgs[..., :, :-2]
    return g_row, g_col


def gaussian_window(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(size, size) Gaussian weights centred on the window, sigma ``size / 2``, peak 1."""
    n = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2
    g = torch.exp(-(n**2) / (2 * (size / 2) ** 2))
    return torch.outer(g, g)


def hog_cells(
    imgs: torch.Tensor, cell_size: int, nbins: int = NBINS, window: int | None = None, eps: float = EPS
) -> torch.Tensor:
    """Per-channel histograms of oriented gradients of every cell, each L2-normalised.

    Args:
        imgs: (N, C, H, W), H and W multiples of ``cell_size`` (and of ``window``).
        cell_size: cell side in px.
        nbins: unsigned orientation bins over [0, 180) degrees; a pixel's magnitude goes to the one bin its
            orientation falls in.
        window: weight the magnitudes by a Gaussian over each ``window`` x ``window`` tile (sigma
            ``window / 2``; MaskFeat's tile is the patch); None: unweighted.
        eps: each histogram h becomes ``h / sqrt(|h|^2 + eps^2)``, so a cell without gradient stays 0.

    Returns:
        (N, C, nbins, H / cell_size, W / cell_size), computed in float32 at least.
    """
    if imgs.dtype in (torch.float16, torch.bfloat16):
        imgs = imgs.float()
    N, C, H, W = imgs.shape
    g_row, g_col = gradients(imgs)
    magnitude = torch.hypot(g_row, g_col)
    if window is not None:
        weights = gaussian_window(window, imgs.dtype, imgs.device)
        magnitude = magnitude * weights.repeat(H // window, W // window)
    orientation = torch.remainder(torch.atan2(g_row, g_col), math.pi)  # unsigned: [0, pi)
    bins = (orientation * (nbins / math.pi)).floor().clamp_(0, nbins - 1)
    h, w = H // cell_size, W // cell_size
    hist = torch.stack(
        [
            (magnitude * (bins == b)).reshape(N, C, h, cell_size, w, cell_size).sum(dim=(3, 5))
            for b in range(nbins)
        ],
        dim=2,
    )
    return hist / (hist.pow(2).sum(dim=2, keepdim=True) + eps**2).sqrt()


class HOGTarget(PatchTarget):
    """MaskFeat's HOG of each patch (``hog_cells`` with cells of p / 2 px and a Gaussian window of p px):
    D_target = 2 x 2 cells x C x 9 bins, ordered (cell row, cell column, channel, bin); 108 for RGB.
    Patches of an even number of pixels."""

    name = "hog"
    described = "the HOG features (MaskFeat's histograms of oriented gradients)"

    @classmethod
    def check(cls, patch_size: int, in_chans: int) -> None:
        if patch_size % CELLS:
            raise ConfigError(
                f"model.target hog cuts each patch into {CELLS}x{CELLS} cells, so it needs an even "
                f"patch_size; got {patch_size}: choose a model with even patches (e.g. ..._patch16) or "
                "another target"
            )

    @classmethod
    def width(cls, patch_size: int, in_chans: int) -> int:
        return CELLS * CELLS * in_chans * NBINS

    @torch.no_grad()
    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        N, C, H, W = imgs.shape
        p = self.patch_size
        cells = hog_cells(imgs, p // CELLS, NBINS, window=p)  # (N, C, bins, H / cell, W / cell)
        h, w = H // p, W // p
        x = cells.reshape(N, C, NBINS, h, CELLS, w, CELLS)
        x = torch.einsum("ncbhiwj->nhwijcb", x)
        return x.reshape(N, h * w, self.dim)
