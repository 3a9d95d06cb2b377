"""The paper's default path stays bit-identical: loss, prediction, every gradient and the random numbers
drawn, against a frozen copy of the forward pass as it was before the decoder switches were added."""

import pytest
import torch

from mae.models import MaskedAutoencoderViT
from mae.models.masking import random_masking, sample_noise
from tests.helpers import TINY


def reference_forward(model: MaskedAutoencoderViT, imgs: torch.Tensor, mask_ratio: float, noise=None):
    """The forward pass of ``MaskedAutoencoderViT`` before the decoder switches, copied here so that it never
    changes: the encoder on the visible patches, the decoder on visible tokens plus every mask token, the loss
    on every masked patch. Uses the model's own modules, so the same weights run the same operations."""
    x = model.patch_embed(imgs)
    x = x + model.pos_embed[:, 1:, :]
    if noise is None:
        noise = sample_noise(model.mask_strategy, x.shape[0], model.grid_size, mask_ratio, x.device)
    x, mask, ids_restore = random_masking(x, mask_ratio, noise)
    cls_token = model.cls_token + model.pos_embed[:, :1, :]
    x = torch.cat([cls_token.expand(x.shape[0], -1, -1), x], dim=1)
    latent = model.norm(model.blocks(x))

    x = model.decoder_embed(latent)
    N, L = ids_restore.shape
    mask_tokens = model.mask_token.expand(N, L + 1 - x.shape[1], -1)
    x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
    x_ = torch.gather(x_, 1, ids_restore.unsqueeze(-1).expand(-1, -1, x.shape[2]))
    x = torch.cat([x[:, :1, :], x_], dim=1)
    x = x + model.decoder_pos_embed
    x = model.decoder_pred(model.decoder_norm(model.decoder_blocks(x)))
    pred = x[:, 1:, :]

    target = model.patchify(imgs)
    if model.norm_pix_loss:
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1e-6) ** 0.5
    per_patch = ((pred.float() - target.float()) ** 2).mean(dim=-1)
    loss = (per_patch * mask.float()).sum() / mask.float().sum().clamp(min=1.0)
    return loss, pred, mask


def _loss_pred_grads(model, forward, imgs, mask_ratio, noise, seed):
    model.zero_grad()
    torch.manual_seed(seed)
    loss, pred, mask = forward(model, imgs, mask_ratio, noise)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), pred.detach(), mask, grads, torch.get_rng_state()


@pytest.mark.parametrize(
    "strategy, norm_pix_loss, given_noise",
    [("random", False, False), ("random", True, True), ("block", True, False), ("block", False, True)],
)
def test_default_path__loss_pred_gradients_and_rng_bit_identical_to_the_frozen_forward(
    strategy, norm_pix_loss, given_noise
):
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**TINY, norm_pix_loss=norm_pix_loss, mask_strategy=strategy).train()
    imgs = torch.randn(3, 3, 32, 32)
    noise = torch.rand(3, 64) if given_noise else None
    ours = _loss_pred_grads(model, lambda m, *a: m(*a), imgs, 0.75, noise, seed=7)
    frozen = _loss_pred_grads(model, reference_forward, imgs, 0.75, noise, seed=7)
    assert (
        torch.equal(ours[0], frozen[0])
        and torch.equal(ours[1], frozen[1])
        and torch.equal(ours[2], frozen[2])
    )
    assert ours[3].keys() == frozen[3].keys()
    for name, grad in frozen[3].items():
        assert torch.equal(ours[3][name], grad), name
    assert torch.equal(ours[4], frozen[4])  # the same random numbers drawn, no more
    assert ours[0] > 0


def test_default_path__eval_mode_bit_identical_too():
    torch.manual_seed(0)
    model = MaskedAutoencoderViT(**TINY, norm_pix_loss=True).eval()
    imgs, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 64)
    with torch.no_grad():
        ours, frozen = model(imgs, 0.5, noise), reference_forward(model, imgs, 0.5, noise)
    for a, b in zip(ours, frozen, strict=True):
        assert torch.equal(a, b)
