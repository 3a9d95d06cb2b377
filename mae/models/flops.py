"""Analytic FLOP count of an MAE training step (matmuls only; 1 multiply-add = 2 FLOPs)."""

from mae.models.mae import MaskedAutoencoderViT
from mae.models.masking import num_kept


def _block_flops(tokens: int, width: int, mlp_hidden: int) -> int:
    linear = 2 * tokens * width * (3 * width + width + 2 * mlp_hidden)  # qkv, proj, fc1, fc2
    attention = 2 * 2 * tokens * tokens * width  # q @ k^T and attn @ v
    return linear + attention


def mae_forward_flops(model: MaskedAutoencoderViT, mask_ratio: float = 0.75) -> int:
    """FLOPs of one forward pass for one image: patch embedding on all L patches, the encoder on
    1 + len_keep tokens, the decoder on 1 + L tokens."""
    L = model.num_patches
    kept = num_kept(L, mask_ratio)
    patch_dim = model.decoder_pred.out_features
    width = model.cls_token.shape[-1]
    dec_width = model.mask_token.shape[-1]
    flops = 2 * L * patch_dim * width
    flops += sum(_block_flops(1 + kept, width, b.mlp.fc1.out_features) for b in model.blocks)
    flops += 2 * (1 + kept) * width * dec_width
    flops += sum(_block_flops(1 + L, dec_width, b.mlp.fc1.out_features) for b in model.decoder_blocks)
    flops += 2 * (1 + L) * dec_width * patch_dim
    return flops


def mae_train_flops(model: MaskedAutoencoderViT, batch_size: int, mask_ratio: float = 0.75) -> int:
    """Forward + backward (about 2x the forward) for a batch."""
    return 3 * batch_size * mae_forward_flops(model, mask_ratio)
