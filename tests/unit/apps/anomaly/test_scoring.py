"""Reconstruction errors, their standardisation and heat maps (``mae.apps.anomaly.scoring``): the
per-patch error against one forward per mask in the loss's space, the statistics' floor, and a planted
defect lit up by a trained tiny MAE."""

import numpy as np
import pytest
import torch

from mae.apps.anomaly import (
    NormalStatistics,
    complementary_masks,
    image_scores,
    reconstruction_errors,
)
from mae.models import create_model
from tests.helpers import TINY_KWARGS
from tests.unit.apps.anomaly.trees import SIZE, normalised, plant_defect, smooth_images


def test_reconstruction_errors__match_one_forward_per_mask_and_the_loss_space():
    torch.manual_seed(0)
    for norm_pix_loss in (True, False):
        model = create_model(
            "mae_vit_tiny_patch4", img_size=SIZE, norm_pix_loss=norm_pix_loss, **TINY_KWARGS
        ).eval()
        imgs = torch.randn(3, 3, SIZE, SIZE)
        design = complementary_masks(model.grid_size, 0.75, generator=torch.Generator().manual_seed(1))
        errors = reconstruction_errors(model, imgs, design)
        # independently: every image under every mask through the model's forward, the loss's target
        total, count = torch.zeros(3, 16), torch.zeros(3, 16)
        for noise in design.noise:
            _, pred, mask = model(imgs, 0.75, noise.expand(3, -1))
            target = model.patchify(imgs)
            if norm_pix_loss:
                target = (target - target.mean(-1, keepdim=True)) / (
                    target.var(-1, keepdim=True) + 1e-6
                ) ** 0.5
            total += ((pred - target) ** 2).mean(-1) * mask
            count += mask
        torch.testing.assert_close(errors, total / count, rtol=1e-4, atol=1e-5)


def test_reconstruction_errors__of_a_hog_model_in_its_targets_space():
    from mae.models.targets.hog import HOGTarget

    torch.manual_seed(0)
    model = create_model("mae_vit_tiny_patch4", img_size=SIZE, target="hog", **TINY_KWARGS).eval()
    imgs = torch.randn(2, 3, SIZE, SIZE)
    design = complementary_masks(model.grid_size, 0.75, generator=torch.Generator().manual_seed(1))
    errors = reconstruction_errors(model, imgs, design)
    total, count = torch.zeros(2, 16), torch.zeros(2, 16)
    for noise in design.noise:
        _, pred, mask = model(imgs, 0.75, noise.expand(2, -1))
        total += ((pred - HOGTarget(4, 3)(imgs)) ** 2).mean(-1) * mask  # (N, L, 2 x 2 x 3 x 9)
        count += mask
    torch.testing.assert_close(errors, total / count, rtol=1e-4, atol=1e-5)


def test_normal_statistics__standardise_per_position_with_a_floor():
    errors = torch.tensor([[1.0, 0.0, 5.0], [3.0, 0.0, 7.0]])  # position 1: every normal image perfect
    stats = NormalStatistics.of(errors)
    std = errors.std(dim=0)
    floor = NormalStatistics.FLOOR * std.mean()
    torch.testing.assert_close(
        stats.standardise(torch.tensor([[2.0, 1.0, 6.0]])), torch.tensor([[0.0, 1.0 / floor, 0.0]])
    )
    with pytest.raises(ValueError, match="at least 2 normal images"):
        NormalStatistics.of(errors[:1])
    assert stats.floored == 1  # position 1, floored (and counted, so the command can say so)
    with pytest.raises(ValueError, match="standard deviation 0 at every patch position"):
        NormalStatistics.of(torch.ones(3, 4))  # identical normal images: no scale to divide by
    with pytest.raises(ValueError, match="not all finite"):
        NormalStatistics.of(torch.tensor([[1.0, float("nan")], [2.0, 3.0]]))
    assert image_scores(torch.tensor([[1.0, 4.0, 2.0, 3.0]]), top_k=2).item() == 3.5


def test_anomaly_map__lights_up_a_planted_defect(smooth_checkpoint):
    from mae import load_mae

    model, _ = load_mae(smooth_checkpoint)
    model.eval()
    clean = smooth_images(6, seed=7)
    imgs = normalised(np.stack([*clean[:3], *(plant_defect(i) for i in clean[3:])]))
    design = complementary_masks(model.grid_size, 0.75, generator=torch.Generator().manual_seed(0))
    errors = reconstruction_errors(model, imgs, design)
    defect_patches = {4 * r + c for r in (0, 1) for c in (2, 3)}  # the patches the defect overlaps
    for image_errors in errors[3:]:
        assert int(image_errors.argmax()) in defect_patches
    scores = image_scores(errors, top_k=2)
    assert scores[3:].min() > scores[:3].max()
