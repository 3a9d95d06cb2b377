"""The cross-attention decoder block: mask-token queries read the encoder's visible tokens, never each other.

Each query attends only to the context (the visible tokens), so the prediction for one masked patch
does not depend on which other patches are reconstructed: the decoder can reconstruct any subset of
them, and its cost grows with the number of queries, not with their square.

References: Fu et al., "Rethinking Patch Dependence for Masked Autoencoders" (CrossMAE, 2024), Sec. 3;
written from the paper (its code's licence forbids copying), from timm's ``Mlp`` and torch's
``scaled_dot_product_attention``.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import nn

from mae.errors import ConfigError


class CrossAttention(nn.Module):
    """Multi-head attention of queries (N, M, D) over a context (N, T, D).

    ``fused_attn`` (timm's switch, set by ``mae.training.runtime.set_attention_kernel``) picks torch's
    ``scaled_dot_product_attention`` or the explicit softmax(q k^T / sqrt(d)) v.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f"cross-attention width {dim} is not divisible by its {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused_attn = True
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """(N, M, D) queries, (N, T, D) context -> (N, M, D)."""
        N, M, D = x.shape
        q = self.q(x).reshape(N, M, self.num_heads, self.head_dim).transpose(1, 2)  # (N, H, M, d)
        k, v = (
            self.kv(context).reshape(N, -1, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        )
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            x = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(N, M, D))


class CrossAttentionBlock(nn.Module):
    """Pre-norm transformer block whose attention is cross-attention: x + attn(norm1(x), norm_context(c)),
    then x + mlp(norm2(x)). No self-attention among the queries (CrossMAE's decoder block)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        norm_layer: Callable[[int], nn.Module] = nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.norm_context = norm_layer(dim)
        self.attn = CrossAttention(dim, num_heads)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """(N, M, D) queries, (N, T, D) context -> (N, M, D)."""
        x = x + self.attn(self.norm1(x), self.norm_context(context))
        return x + self.mlp(self.norm2(x))
