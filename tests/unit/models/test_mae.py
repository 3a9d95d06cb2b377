import pytest
import torch

from mae.models import MaskedAutoencoderViT, create_model
from tests.helpers import TINY

OFFICIAL_TOP_LEVEL_KEYS = {
    "cls_token",
    "pos_embed",
    "mask_token",
    "decoder_pos_embed",
    "patch_embed.proj.weight",
    "patch_embed.proj.bias",
    "norm.weight",
    "norm.bias",
    "decoder_embed.weight",
    "decoder_embed.bias",
    "decoder_norm.weight",
    "decoder_norm.bias",
    "decoder_pred.weight",
    "decoder_pred.bias",
}
OFFICIAL_BLOCK_KEYS = {
    f"{m}.{p}"
    for m in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")
    for p in ("weight", "bias")
}


def _official_keys(depth: int, decoder_depth: int) -> set[str]:
    keys = set(OFFICIAL_TOP_LEVEL_KEYS)
    keys |= {f"blocks.{i}.{k}" for i in range(depth) for k in OFFICIAL_BLOCK_KEYS}
    keys |= {f"decoder_blocks.{i}.{k}" for i in range(decoder_depth) for k in OFFICIAL_BLOCK_KEYS}
    return keys


def test_state_dict__has_exactly_the_official_keys_and_shapes():
    model = create_model("mae_vit_base_patch16", depth=2, decoder_depth=1)
    sd = model.state_dict()
    assert set(sd) == _official_keys(2, 1)
    assert sd["pos_embed"].shape == (1, 197, 768)
    assert sd["decoder_pos_embed"].shape == (1, 197, 512)
    assert sd["patch_embed.proj.weight"].shape == (768, 3, 16, 16)
    assert sd["blocks.0.attn.qkv.weight"].shape == (3 * 768, 768)
    assert sd["decoder_pred.weight"].shape == (16 * 16 * 3, 512)


def test_constructor__size_not_divisible_by_patch_is_a_clear_error():
    with pytest.raises(ValueError, match="not divisible by patch_size 16"):
        MaskedAutoencoderViT(img_size=100, patch_size=16, embed_dim=64, depth=1, num_heads=4)


def test_forward__shapes_and_kept_token_count(tiny_model):
    imgs = torch.randn(2, 3, 32, 32)
    loss, pred, mask = tiny_model(imgs)
    assert pred.shape == (2, 64, 4 * 4 * 3) and mask.shape == (2, 64) and loss.ndim == 0
    for ratio in (0.0, 0.5, 0.75, 0.9):
        latent, mask, ids_restore = tiny_model.forward_encoder(imgs, ratio)
        assert latent.shape == (2, 1 + int(64 * (1 - ratio)), 64)
        assert ids_restore.shape == (2, 64)


def test_encoder__sequence_length_is_visible_tokens_plus_cls(tiny_model):
    seen = []
    hook = tiny_model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[1]))
    tiny_model(torch.randn(2, 3, 32, 32), mask_ratio=0.75)
    hook.remove()
    assert seen == [1 + 16]


def test_encoder__latent_ignores_pixels_of_masked_patches(tiny_model):
    torch.manual_seed(1)
    imgs = torch.randn(2, 3, 32, 32)
    noise = torch.rand(2, 64)
    latent, mask, _ = tiny_model.forward_encoder(imgs, 0.75, noise)
    pixel_mask = tiny_model.unpatchify(mask.unsqueeze(-1).expand(-1, -1, 48)).bool()
    changed = torch.where(pixel_mask, torch.randn_like(imgs) * 100, imgs)
    latent2, mask2, _ = tiny_model.forward_encoder(changed, 0.75, noise)
    assert torch.equal(mask, mask2)
    torch.testing.assert_close(latent, latent2, rtol=0, atol=0)
    visible_changed = torch.where(pixel_mask, imgs, imgs + 1)
    assert not torch.allclose(tiny_model.forward_encoder(visible_changed, 0.75, noise)[0], latent)


def test_patchify__unpatchify_roundtrip_and_patch_layout(tiny_model):
    imgs = torch.randn(2, 3, 32, 32)
    patches = tiny_model.patchify(imgs)
    assert patches.shape == (2, 64, 48)
    torch.testing.assert_close(tiny_model.unpatchify(patches), imgs, rtol=0, atol=0)
    # patch 9 = row 1, column 1; its pixels are ordered (py, px, c)
    expected = imgs[1, :, 4:8, 4:8].permute(1, 2, 0).reshape(-1)
    torch.testing.assert_close(patches[1, 9], expected)


def test_non_square_input():
    model = MaskedAutoencoderViT(**{**TINY, "img_size": (32, 48)})
    assert model.grid_size == (8, 12) and model.pos_embed.shape == (1, 97, 64)
    imgs = torch.randn(2, 3, 32, 48)
    loss, pred, mask = model(imgs)
    assert pred.shape == (2, 96, 48)
    torch.testing.assert_close(model.unpatchify(model.patchify(imgs)), imgs)


def test_pos_embeds__frozen_and_not_trainable(tiny_model):
    trainable = {n for n, p in tiny_model.named_parameters() if p.requires_grad}
    assert "pos_embed" not in trainable and "decoder_pos_embed" not in trainable
    assert {"cls_token", "mask_token"} <= trainable
    before = tiny_model.pos_embed.clone()
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=1.0)
    tiny_model(torch.randn(2, 3, 32, 32))[0].backward()
    opt.step()
    assert torch.equal(tiny_model.pos_embed, before)
    assert torch.all(tiny_model.pos_embed[0, 0] == 0) and torch.all(tiny_model.decoder_pos_embed[0, 0] == 0)


def test_init__xavier_linears_and_token_std():
    torch.manual_seed(0)
    model = create_model("mae_vit_base_patch16", depth=2, decoder_depth=2)
    w = model.blocks[0].mlp.fc1.weight  # (3072, 768): xavier bound sqrt(6 / (768 + 3072))
    bound = (6 / (768 + 3072)) ** 0.5
    assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound
    assert torch.all(model.blocks[0].mlp.fc1.bias == 0)
    proj = model.patch_embed.proj.weight  # as a (768, 768) linear
    assert proj.abs().max() <= (6 / (768 + 768)) ** 0.5
    assert abs(model.cls_token.std().item() - 0.02) < 0.003
    assert abs(model.mask_token.std().item() - 0.02) < 0.003


@pytest.mark.parametrize("strategy", ["random", "block", "grid"])
def test_mask_strategies__through_the_model(strategy):
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**TINY, mask_strategy=strategy)
    loss, pred, mask = model(torch.randn(2, 3, 32, 32), mask_ratio=0.75)
    assert torch.all(mask.sum(1) == 48) and torch.isfinite(loss)


def test_mask_strategy__invalid_values_fail_clearly():
    with pytest.raises(ValueError, match="mask_strategy 'rows' is unknown"):
        MaskedAutoencoderViT(**TINY, mask_strategy="rows")
    model = MaskedAutoencoderViT(**TINY, mask_strategy="grid")
    with pytest.raises(ValueError, match="must be 0.75"):
        model(torch.randn(1, 3, 32, 32), mask_ratio=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        MaskedAutoencoderViT(**TINY)(torch.randn(1, 3, 32, 32), mask_ratio=1.0)


def test_forward_features__all_patches_unmasked_in_order(tiny_model):
    imgs = torch.randn(2, 3, 32, 32)
    feats = tiny_model.forward_features(imgs)
    assert feats.shape == (2, 65, 64)
    # with ratio 0 and noise that keeps patch order, the masked path computes the same thing
    latent, mask, _ = tiny_model.forward_encoder(imgs, 0.0, torch.arange(64.0).expand(2, -1))
    assert mask.sum() == 0
    torch.testing.assert_close(feats, latent)


def test_training__loss_decreases_on_a_fixed_batch():
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**TINY, norm_pix_loss=True)
    imgs = torch.randn(8, 3, 32, 32)
    noise = torch.rand(8, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    losses = []
    for _ in range(20):
        loss, _, _ = model(imgs, 0.75, noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
