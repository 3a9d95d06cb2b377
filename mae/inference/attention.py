"""Where the encoder looks: the last block's attention from the cls token to every patch, per head
and averaged over the heads (as DINO shows it), with every patch encoded (no masking).

The weights come from timm's own ``Attention`` module of the last block, through hooks, not from a
second implementation of attention. With ``fused_attn`` off, timm forms the softmax weights itself
and they are read where they pass its ``attn_drop`` (the identity in evaluation mode). With
``fused_attn`` on (timm's default on torch 2: ``F.scaled_dot_product_attention`` never forms them),
they are recomputed from the module's input with its own ``qkv``, ``q_norm``, ``k_norm`` and
``scale``, for the images asked about only.

References: Caron et al., "Emerging Properties in Self-Supervised Vision Transformers" (DINO, 2021):
the last layer's cls-token attention maps, per head.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from mae.errors import ConfigError


def attention_weights(attn: nn.Module, x: torch.Tensor, queries: slice = slice(None)) -> torch.Tensor:
    """(N, T, D) input of a timm ``Attention`` -> (N, heads, Q, T) float softmax weights of the ``queries``
    rows (default all: Q = T), each row summing to 1 over the T tokens: the steps of its unfused path up
    to the softmax, with its own ``qkv``, ``q_norm``, ``k_norm`` and ``scale``. Asking for the rows needed
    keeps memory at Q x T per head (the cls row of 16,385 tokens: 64 KiB, where all rows take 1 GiB)."""
    N, T, _ = x.shape
    qkv = attn.qkv(x).reshape(N, T, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, _ = qkv.unbind(0)
    q, k = attn.q_norm(q[:, :, queries]), attn.k_norm(k)
    return ((q * attn.scale) @ k.transpose(-2, -1)).float().softmax(dim=-1)


def _last_attention(model: nn.Module) -> nn.Module:
    """The ``Attention`` module of the encoder's last block (a timm ViT or an MAE).

    Raises:
        ConfigError: a CNN (no attention blocks), naming it, or a block without timm's ``Attention``.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None or not len(blocks) or getattr(model, "family", "vit") == "cnn":
        config = getattr(model, "config", None)
        name = config.get("encoder") if isinstance(config, dict) else None
        raise ConfigError(
            f"attention maps need a ViT, and the encoder is the CNN {name or type(model).__name__}, which "
            "has no attention: leave --attention out (reconstructions of a CNN need no attention maps)"
        )
    attn = getattr(blocks[-1], "attn", None)
    if attn is None or not all(hasattr(attn, name) for name in ("qkv", "num_heads", "head_dim", "scale")):
        raise ConfigError(
            f"the last block's attention is a {type(attn).__name__}, not timm's Attention (qkv, num_heads, "
            f"head_dim, scale): attention maps need a timm ViT or an MAE encoder"
        )
    return attn


@torch.no_grad()
def last_block_attention(model: nn.Module, imgs: torch.Tensor, queries: slice = slice(None)) -> torch.Tensor:
    """(N, C, H, W) normalised images -> (N, heads, Q, 1 + L) attention weights of the encoder's last
    block (rows: the ``queries`` tokens, default all; columns: keys; each row summing to 1), with every
    patch encoded (``forward_features``: no masking). ``model``: an MAE or a timm ViT."""
    attn = _last_attention(model)
    captured: list[torch.Tensor] = []

    def recompute(module, args, kwargs, output) -> None:
        if kwargs.get("attn_mask") is not None or kwargs.get("is_causal"):
            raise ConfigError("attention maps of a masked attention are not supported")
        captured.append(attention_weights(module, args[0] if args else kwargs["x"], queries))

    if attn.fused_attn:
        handle = attn.register_forward_hook(recompute, with_kwargs=True)
    else:  # timm's own weights, as they pass attn_drop
        handle = attn.attn_drop.register_forward_hook(
            lambda module, args, output: captured.append(output[:, :, queries].float())
        )
    try:
        model.forward_features(imgs)
    finally:
        handle.remove()
    return captured[-1]


@torch.no_grad()
def cls_attention_maps(model: nn.Module, imgs: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) normalised images -> (N, heads, H', W'): the last block's attention from the cls
    token to each patch, on the (H', W') patch grid, for every head.

    The weights are not renormalised: they are the cls row of the softmax over all 1 + L tokens, so
    each head's map sums to 1 minus the cls token's attention to itself.
    """
    weights = last_block_attention(model, imgs, queries=slice(0, 1))  # the cls row only
    prefix = getattr(model, "num_prefix_tokens", 1)
    height, width = model.patch_embed.grid_size
    return weights[:, :, 0, prefix:].reshape(*weights.shape[:2], height, width)


def heat(maps: torch.Tensor) -> torch.Tensor:
    """(..., h, w) non-negative maps -> (..., 3, h, w) colours in [0, 1] for a picture: each map
    scaled to its own maximum, then black -> red -> yellow -> white."""
    peak = maps.flatten(-2).amax(-1).clamp(min=1e-12)[..., None, None]
    value = (maps / peak).unsqueeze(-3)
    return torch.cat(
        [(3 * value).clamp(0, 1), (3 * value - 1).clamp(0, 1), (3 * value - 2).clamp(0, 1)], dim=-3
    )


def attention_panels(maps: torch.Tensor, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pictures of ``cls_attention_maps`` (N, heads, H', W') at the image's ``size`` (H, W):
    ((N, 3, H, W) the mean over heads, (N, 3, H, W) every head in a grid of small maps, left to right
    and top to bottom, on white), each map scaled to its own maximum (``heat``)."""
    N, heads = maps.shape[:2]
    height, width = size
    mean = heat(F.interpolate(maps.mean(1, keepdim=True), size=size, mode="nearest"))[:, 0]
    cols = math.ceil(math.sqrt(heads))
    rows = math.ceil(heads / cols)
    cell_h, cell_w = height // rows, width // cols
    grid_h, grid_w = maps.shape[-2:]
    factor = min((cell_h - 1) // grid_h, (cell_w - 1) // grid_w)  # whole pixels per patch, a 1-pixel gap
    small_size = (
        (factor * grid_h, factor * grid_w) if factor >= 1 else (max(cell_h - 1, 1), max(cell_w - 1, 1))
    )
    small = heat(F.interpolate(maps, size=small_size, mode="nearest"))
    tiles = torch.ones(N, 3, height, width)
    for head in range(heads):
        top = (head // cols) * cell_h + (cell_h - small_size[0]) // 2
        left = (head % cols) * cell_w + (cell_w - small_size[1]) // 2
        tiles[:, :, top : top + small_size[0], left : left + small_size[1]] = small[:, head]
    return mean, tiles


def attention_caption(heads: int) -> str:
    """What the attention panels show, honestly."""
    return (
        "Attention: the last encoder block's attention from the cls token to each patch, with every patch "
        f"visible (no masking): the mean of its {heads} heads, then each head (left to right, top to "
        "bottom); each map is scaled to its own maximum, and the weights are not renormalised over the "
        "patches (the cls token's attention to itself is left out)."
    )


__all__ = [
    "attention_caption",
    "attention_panels",
    "attention_weights",
    "cls_attention_maps",
    "heat",
    "last_block_attention",
]
