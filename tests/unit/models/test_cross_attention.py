"""The cross-attention block (``mae.models.cross_attention``): queries read the context and never each
other; both attention kernels compute the same thing; a width its heads do not divide is refused."""

import pytest
import torch

from mae.errors import ConfigError
from mae.models.cross_attention import CrossAttention, CrossAttentionBlock
from mae.training.runtime import set_attention_kernel
from tests.helpers import tiny_mae


@pytest.mark.parametrize(
    "kwargs", [dict(decoder_type="cross"), dict(decoder_type="cross", decoder_keep_ratio=0.5)]
)
def test_cross__both_attention_kernels_agree(kwargs):
    model = tiny_mae(**kwargs).train()
    imgs, noise, decoder_noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64), torch.rand(2, 64)
    fused = model(imgs, 0.75, noise, decoder_noise)[1]
    explicit = set_attention_kernel(model, "explicit")(imgs, 0.75, noise, decoder_noise)[1]
    assert not model.decoder_blocks[0].attn.fused_attn
    torch.testing.assert_close(explicit, fused, rtol=1e-5, atol=1e-5)


def test_cross_attention__is_softmax_of_query_key_products_over_the_context_in_both_kernels():
    torch.manual_seed(0)
    attn = CrossAttention(16, num_heads=4).eval()
    x, context = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    q = attn.q(x).view(2, 5, 4, 4).transpose(1, 2)  # (N, H, M, d)
    k, v = attn.kv(context).view(2, 7, 2, 4, 4).permute(2, 0, 3, 1, 4)  # (N, H, T, d) each
    weights = (q @ k.transpose(-2, -1) / 2.0).softmax(-1)  # sqrt(d) = 2
    expected = attn.proj((weights @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(attn(x, context), expected, rtol=1e-5, atol=1e-6)
    attn.fused_attn = False
    torch.testing.assert_close(attn(x, context), expected, rtol=1e-5, atol=1e-6)


def test_cross_attention_block__a_query_s_output_depends_on_the_context_not_on_the_other_queries():
    torch.manual_seed(0)
    block = CrossAttentionBlock(16, num_heads=2).eval()
    queries, context = torch.randn(1, 6, 16), torch.randn(1, 9, 16)
    together = block(queries, context)
    for i in range(6):
        torch.testing.assert_close(block(queries[:, i : i + 1], context)[:, 0], together[:, i])
    assert not torch.allclose(block(queries, context.flip(1) + torch.randn_like(context)), together)
    assert together.shape == (1, 6, 16)


def test_cross_attention__a_width_its_heads_do_not_divide_is_refused_naming_both():
    with pytest.raises(ConfigError, match="cross-attention width 18 is not divisible by its 4 heads"):
        CrossAttention(18, num_heads=4)
