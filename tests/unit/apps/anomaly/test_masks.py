"""Complementary masks (``mae.apps.anomaly.masks``): every patch hidden the same number of times, and
ratios that would hide nothing or everything refused."""

import pytest
import torch

from mae.apps.anomaly import (
    complementary_masks,
)
from mae.models.masking import random_masking


@pytest.mark.parametrize(
    ("grid", "ratio", "masks", "hidden"), [((8, 8), 0.75, 4, 3), ((4, 4), 0.5, 2, 1), ((7, 7), 0.75, 49, 37)]
)
def test_complementary_masks__every_patch_hidden_the_same_number_of_times(grid, ratio, masks, hidden):
    L = grid[0] * grid[1]
    design = complementary_masks(grid, ratio, repeats=2, generator=torch.Generator().manual_seed(0))
    assert design.noise.shape == (2 * masks, L) and design.hidden_count == 2 * hidden
    # the masks as the model's own masking draws them from the scores
    _, mask, _ = random_masking(torch.zeros(2 * masks, L, 1), ratio, design.noise)
    assert (mask.sum(dim=1) == L - int(L * (1 - ratio))).all()  # each mask hides the model's count
    assert (mask.sum(dim=0) == 2 * hidden).all()  # every patch hidden equally often
    if ratio == 0.75 and L % 4 == 0:  # one permutation cut into 4 groups: each visible group is disjoint
        visible = 1 - mask[:masks]
        assert (visible.sum(dim=0) == 1).all()


def test_complementary_masks__refuse_ratios_that_hide_nothing_or_everything():
    for ratio in (0.0, 1.0, 0.99):
        with pytest.raises(ValueError, match="mask"):
            complementary_masks((4, 4), ratio)
