"""MAE's reconstruction loss (``mae.models.loss``): the mean squared error of the masked patches only,
against raw or per-patch normalised targets, for the batch and for each image."""

import torch

from mae.models import MaskedAutoencoderViT
from mae.models.loss import masked_patch_mse, masked_patch_mse_per_image, normalize_patches
from tests.helpers import TINY


def test_loss__counts_masked_patches_only(tiny_model):
    imgs = torch.randn(2, 3, 32, 32)
    noise = torch.rand(2, 64)
    loss, pred, mask = tiny_model(imgs, 0.75, noise)
    target = tiny_model.patchify(imgs)
    # perfect prediction on masked patches, garbage on visible ones -> zero loss
    perfect = torch.where(mask.bool().unsqueeze(-1), target, target + 1000)
    assert tiny_model.forward_loss(imgs, perfect, mask).item() == 0.0
    expected = ((pred - target) ** 2).mean(-1)[mask.bool()].mean()
    torch.testing.assert_close(loss, expected)


def test_loss__norm_pix_normalises_each_target_patch():
    model = MaskedAutoencoderViT(**TINY, norm_pix_loss=True)
    imgs = torch.randn(1, 3, 32, 32) * 5 + 3
    target = model.patchify(imgs)
    normed = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
    mask = torch.ones(1, 64)
    assert model.forward_loss(imgs, normed, mask).item() < 1e-10
    assert model.forward_loss(imgs, target, mask).item() > 1


def test_masked_patch_mse__per_image_losses_average_to_the_batch_loss_when_counts_are_equal():
    torch.manual_seed(0)
    pred, target = torch.randn(3, 8, 12), torch.randn(3, 8, 12)
    mask = torch.zeros(3, 8)
    mask[:, :4] = 1
    per_image = masked_patch_mse_per_image(pred, target, mask)
    expected = ((pred - target) ** 2).mean(-1)[:, :4].mean(1)
    torch.testing.assert_close(per_image, expected)
    torch.testing.assert_close(masked_patch_mse(pred, target, mask), per_image.mean())
    normed = masked_patch_mse_per_image(pred, target, mask, norm_pix_loss=True)
    torch.testing.assert_close(normed, ((pred - normalize_patches(target)) ** 2).mean(-1)[:, :4].mean(1))


def test_masked_patch_mse__no_masked_patch_is_a_zero_loss_not_a_division_by_zero():
    pred, target, mask = torch.ones(2, 4, 3), torch.zeros(2, 4, 3), torch.zeros(2, 4)
    assert masked_patch_mse(pred, target, mask).item() == 0.0
    mask[1, 0] = 1
    assert masked_patch_mse_per_image(pred, target, mask).tolist() == [0.0, 1.0]


def test_normalize_patches__zero_mean_and_unit_unbiased_variance_per_patch():
    patches = torch.randn(2, 5, 48) * 7 + 3
    normed = normalize_patches(patches)
    torch.testing.assert_close(normed.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(normed.var(-1), torch.ones(2, 5), atol=1e-4, rtol=0)
