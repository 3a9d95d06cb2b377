"""FLOP count of an MAE training step (matmuls and convolutions; 1 multiply-add = 2 FLOPs).

The ViT's is analytic. The decoder's count follows its switches as a training step runs them: partial
reconstruction decodes ``decoder_keep_ratio`` of the masked patches, the cross decoder runs its queries
(the reconstructed patches) against the cls and visible tokens. A CNN's is counted by torch's
``FlopCounterMode`` on one image: its masked convolutions run densely over the whole map, so the count
does not depend on the mask ratio (SparK's and FCMAE's masking save no FLOPs).
"""

import torch
from torch.utils.flop_counter import FlopCounterMode

from mae.models.cnn import MaskedAutoencoderCNN
from mae.models.mae import MaskedAutoencoderViT
from mae.models.masking import num_decoded, num_kept


def _block_flops(tokens: int, width: int, mlp_hidden: int) -> int:
    linear = 2 * tokens * width * (3 * width + width + 2 * mlp_hidden)  # qkv, proj, fc1, fc2
    attention = 2 * 2 * tokens * tokens * width  # q @ k^T and attn @ v
    return linear + attention


def _cross_block_flops(queries: int, context: int, width: int, mlp_hidden: int) -> int:
    linear = 2 * queries * width * (width + width + 2 * mlp_hidden)  # q, proj, fc1, fc2
    linear += 2 * context * width * 2 * width  # k and v of the context
    attention = 2 * 2 * queries * context * width
    return linear + attention


def mae_forward_flops(model: MaskedAutoencoderViT, mask_ratio: float = 0.75) -> int:
    """FLOPs of one training forward pass for one image: patch embedding on all L patches, the encoder
    on 1 + len_keep tokens, then the decoder: the paper's on 1 + L tokens; with partial reconstruction
    on 1 + len_keep + the decoded masked patches; the cross decoder's queries (the decoded masked
    patches) against 1 + len_keep context tokens per block."""
    L = model.num_patches
    kept = num_kept(L, mask_ratio)
    decoded = num_decoded(L - kept, model.decoder_keep_ratio)
    patch_dim = model.decoder_pred.out_features  # D_target
    width = model.cls_token.shape[-1]
    dec_width = model.mask_token.shape[-1]
    flops = 2 * L * model.patch_size**2 * model.config["in_chans"] * width
    flops += sum(_block_flops(1 + kept, width, b.mlp.fc1.out_features) for b in model.blocks)
    layers_read = 1 if model.decoder_encoder_layers is None else len(model.decoder_encoder_layers)
    flops += 2 * layers_read * (1 + kept) * width * dec_width  # decoder_embed of each layer read
    if model.decoder_type == "cross":
        flops += sum(
            _cross_block_flops(decoded, 1 + kept, dec_width, b.mlp.fc1.out_features)
            for b in model.decoder_blocks
        )
        return flops + 2 * decoded * dec_width * patch_dim
    tokens = 1 + kept + decoded  # 1 + L for the paper's decoder
    flops += sum(_block_flops(tokens, dec_width, b.mlp.fc1.out_features) for b in model.decoder_blocks)
    flops += 2 * tokens * dec_width * patch_dim
    return flops


def target_flops(model: MaskedAutoencoderViT) -> int:
    """FLOPs of computing one image's target: for ``features``, the frozen teacher's forward on the full
    image (its patch embedding and its blocks up to the one read, on L + its prefix tokens); 0 for the
    pixel and HOG targets (no matmuls)."""
    teacher = getattr(model.target, "teacher", None)
    if teacher is None:
        return 0
    L = model.num_patches
    p = teacher.patch_embed.patch_size
    width = teacher.embed_dim
    flops = 2 * L * p[0] * p[1] * model.config["in_chans"] * width
    tokens = L + teacher.num_prefix_tokens
    read = teacher.blocks[: model.target.block % len(teacher.blocks) + 1]
    return flops + sum(_block_flops(tokens, width, b.mlp.fc1.out_features) for b in read)


def cnn_forward_flops(model: MaskedAutoencoderCNN, mask_ratio: float = 0.6) -> int:
    """FLOPs of one training forward pass of a CNN model for one image, counted on a run of its
    ``img_size`` in evaluation mode (no running statistic moves) without autograd."""
    training = model.training
    model.eval()
    try:
        image = torch.zeros(
            1, model.config["in_chans"], *model.img_size, device=next(model.parameters()).device
        )
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(image, mask_ratio)
    finally:
        model.train(training)
    return counter.get_total_flops()


def mae_train_flops(
    model: MaskedAutoencoderViT | MaskedAutoencoderCNN, batch_size: int, mask_ratio: float = 0.75
) -> int:
    """Forward + backward (about 2x the forward) for a batch, and the target's forward (a teacher's: no
    backward)."""
    if isinstance(model, MaskedAutoencoderCNN):
        return batch_size * (3 * cnn_forward_flops(model, mask_ratio) + target_flops(model))
    return batch_size * (3 * mae_forward_flops(model, mask_ratio) + target_flops(model))
