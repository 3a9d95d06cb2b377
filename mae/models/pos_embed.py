"""Fixed 2-D sine-cosine position embeddings, in the official MAE channel order.

References: He et al., "Masked Autoencoders Are Scalable Vision Learners" (2021), and the
sin-cos scheme of the original Transformer (Vaswani et al., 2017) applied per axis.
"""

import torch

from mae.errors import ConfigError


def sincos_1d(embed_dim: int, positions: torch.Tensor) -> torch.Tensor:
    """1-D sin-cos embedding.

    Args:
        embed_dim: output width D (even).
        positions: (M,) positions, any float values.

    Returns:
        (M, D) float64: ``[sin(pos * w_0..w_{D/2-1}) | cos(...)]`` with ``w_i = 10000^(-2i/D)``.
    """
    if embed_dim % 2:
        raise ConfigError(f"sin-cos embedding width must be even, got {embed_dim}")
    omega = torch.arange(embed_dim // 2, dtype=torch.float64) / (embed_dim / 2.0)
    omega = 1.0 / 10000**omega
    angles = positions.to(torch.float64).reshape(-1, 1) * omega.reshape(1, -1)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def sincos_2d(embed_dim: int, grid_size: tuple[int, int], cls_token: bool = True) -> torch.Tensor:
    """2-D sin-cos embedding of a patch grid, row-major like ``PatchEmbed``'s token order.

    The first half of the channels encodes the column (x) index and the second half the row (y)
    index. This is the layout of the official MAE code (and so of every released MAE checkpoint),
    even though its variable names suggest the opposite.

    Args:
        embed_dim: output width D (divisible by 4).
        grid_size: (H/p, W/p) patches per column and per row.
        cls_token: prepend an all-zero row for the class token.

    Returns:
        (1 + H/p * W/p, D) float32 if ``cls_token`` else (H/p * W/p, D).
    """
    if embed_dim % 4:
        raise ConfigError(f"2-D sin-cos embedding width must be divisible by 4, got {embed_dim}")
    grid_h, grid_w = grid_size
    rows, cols = torch.meshgrid(
        torch.arange(grid_h, dtype=torch.float64),
        torch.arange(grid_w, dtype=torch.float64),
        indexing="ij",
    )
    emb = torch.cat([sincos_1d(embed_dim // 2, cols), sincos_1d(embed_dim // 2, rows)], dim=1)
    if cls_token:
        emb = torch.cat([torch.zeros(1, embed_dim, dtype=emb.dtype), emb], dim=0)
    return emb.float()
