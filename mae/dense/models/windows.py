"""ViTDet's window attention (Li et al. 2022, section 3): most blocks attend within non-overlapping
``window x window`` patch windows, a few keep global attention to propagate across windows.

A timm ``Block`` is run on windows as it is: its norms and MLP act per token, so running the whole
block on the window-partitioned tokens is the same as partitioning only its attention. Where the patch
grid is not a multiple of the window, it is zero-padded at the right and bottom; unlike ViTDet, the
padding tokens are masked out of the attention, so a window that covers
the whole grid gives exactly the block's global attention.

Relative positions inside a window are optional (``window_position_bias``): a learned bias per head and
relative offset added to the attention logits (the table of Swin and BEiT, timm's ``RelPosBias``), not
ViTDet's decomposed, query-dependent relative positions; zero at initialisation, as ViTDet's are.
"""

import torch
from timm.layers.pos_embed_rel import RelPosBias
from torch import nn
from torch.nn import functional as F


def default_global_blocks(depth: int) -> tuple[int, ...]:
    """ViTDet's global blocks: the last of each quarter of the encoder (2, 5, 8, 11 for ViT-B's 12)."""
    return tuple(sorted({(quarter + 1) * depth // 4 - 1 for quarter in range(4)} - {-1}))


def partition(tokens: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split (N, h, w, D) tokens into (N * nh * nw, window * window, D) windows, row-major, zero-padding
    the grid to (nh * window, nw * window).

    Returns the windows and, when there is padding, the boolean attention mask (N * nh * nw, 1, 1,
    window * window), True for the keys to attend to (the real tokens; boolean so that it suits any
    autocast dtype); else None.
    """
    n, h, w, d = tokens.shape
    pad_h, pad_w = -h % window, -w % window
    tokens = F.pad(tokens, (0, 0, 0, pad_w, 0, pad_h))
    nh, nw = (h + pad_h) // window, (w + pad_w) // window
    windows = (
        tokens.view(n, nh, window, nw, window, d).transpose(2, 3).reshape(n * nh * nw, window * window, d)
    )
    if not (pad_h or pad_w):
        return windows, None
    real = torch.zeros(h + pad_h, w + pad_w, dtype=torch.bool, device=tokens.device)
    real[:h, :w] = True
    real = real.view(nh, window, nw, window).transpose(1, 2).reshape(nh * nw, 1, 1, window * window)
    return windows, real.repeat(n, 1, 1, 1)


def unpartition(windows: torch.Tensor, n: int, h: int, w: int) -> torch.Tensor:
    """The inverse of ``partition``: (N * nh * nw, window * window, D) windows -> (N, h, w, D) tokens,
    padding dropped."""
    window = int(round(windows.shape[1] ** 0.5))
    d = windows.shape[-1]
    nh, nw = -(-h // window), -(-w // window)
    tokens = (
        windows.view(n, nh, nw, window, window, d).transpose(2, 3).reshape(n, nh * window, nw * window, d)
    )
    return tokens[:, :h, :w]


def window_position_bias(window: int, num_heads: int) -> RelPosBias:
    """A learned (num_heads,) bias for each of the (2 * window - 1)^2 relative offsets between two tokens
    of a ``window x window`` window; all zero, so that a pretrained encoder starts out unchanged."""
    bias = RelPosBias((window, window), num_heads)
    nn.init.zeros_(bias.relative_position_bias_table)
    return bias


def block_in_windows(
    block: nn.Module, tokens: torch.Tensor, window: int, position_bias: RelPosBias | None = None
) -> torch.Tensor:
    """(N, h, w, D) tokens through a timm ``Block`` whose attention stays within each window, with
    ``position_bias`` (``window_position_bias``) added to its attention logits when given."""
    n, h, w, _ = tokens.shape
    windows, real = partition(tokens, window)
    mask = real
    if position_bias is not None:
        bias = position_bias.get_bias().to(windows.dtype)  # (1, heads, window^2, window^2)
        mask = bias if real is None else bias.masked_fill(~real, float("-inf"))
    return unpartition(block(windows, attn_mask=mask), n, h, w)
