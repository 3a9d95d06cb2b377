import torch

from mae.models.targets.norm_pix import NormPixTarget, normalize_patches
from mae.models.targets.pixel import patchify


def test_norm_pix_target__the_official_normalisation_with_unbiased_variance():
    torch.manual_seed(0)
    imgs = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    patches = patchify(imgs, 4)  # (2, 4, 48)
    n = patches.shape[-1]
    mean = patches.sum(-1, keepdim=True) / n
    unbiased = ((patches - mean) ** 2).sum(-1, keepdim=True) / (n - 1)  # as torch.var, the official code's
    expected = (patches - mean) / (unbiased + 1e-6) ** 0.5
    torch.testing.assert_close(NormPixTarget(4, 3)(imgs), expected, rtol=0, atol=1e-12)
    assert NormPixTarget(4, 3).dim == 48 and NormPixTarget(16, 3).dim == 768


def test_norm_pix_target__finite_on_flat_and_black_patches():
    for value in (0.0, 0.3):
        target = NormPixTarget(4, 3)(torch.full((1, 3, 8, 8), value))
        assert torch.isfinite(target).all() and not target.any()
    assert torch.equal(normalize_patches(torch.zeros(1, 2, 5)), torch.zeros(1, 2, 5))
