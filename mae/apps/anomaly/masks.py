"""Complementary masks: a set of masks that together hide every patch the same number of times, so that
every patch is scored from its context only, and every patch as often as every other.

At mask ratio 0.75 on L patches (L divisible by 4) this is the obvious design: a random permutation of
the patches cut into 4 groups of L/4, each mask keeping one group visible and hiding the other three;
every patch is visible once and hidden 3 times. For any ratio the masks are the cyclic shifts of one
permutation by the visible count v = int(L * (1 - mask_ratio)) (the model's own rounding): with
g = gcd(L, v), L / g shifts give every patch v / g visible and (L - v) / g hidden turns.
"""

import math
from dataclasses import dataclass

import torch

from mae.errors import InputError
from mae.models.masking import check_visible_patches, num_kept


def complementary_mask_count(num_patches: int, mask_ratio: float) -> int:
    """Masks per permutation: L / gcd(L, v) with v = ``num_kept(L, mask_ratio)`` (4 at ratio 0.75 when 4
    divides L; up to L when v and L share no factor)."""
    return num_patches // math.gcd(num_patches, num_kept(num_patches, mask_ratio))


@dataclass
class ComplementaryMasks:
    """``noise`` (M, L): masking scores for ``mae.models.masking.random_masking`` (which keeps the v smallest
    of each row) at ``mask_ratio``; over the M rows every patch is hidden ``hidden_count`` times."""

    noise: torch.Tensor
    mask_ratio: float
    hidden_count: int


def complementary_masks(
    grid_size: tuple[int, int], mask_ratio: float, repeats: int = 1, generator: torch.Generator | None = None
) -> ComplementaryMasks:
    """``repeats`` sets of complementary masks, one random permutation each.

    Args:
        grid_size: (H/p, W/p) patch grid, L = H/p * W/p.
        mask_ratio: fraction of patches each mask hides, in (0, 1).
        repeats: independent permutations; more average over more contexts.
        generator: CPU generator of the permutations (seeded by the caller).

    Returns:
        M = ``repeats * complementary_mask_count(L, mask_ratio)`` masks, (M, L) scores; every patch is
        hidden exactly ``repeats * (L - v) / gcd(L, v)`` times.

    Raises:
        ValueError: a ratio outside (0, 1), one that keeps no patch, or ``repeats`` below 1.
    """
    L = grid_size[0] * grid_size[1]
    if not 0 < mask_ratio < 1:
        raise InputError(
            f"the mask ratio must be in (0, 1) to hide some patches and keep others, got {mask_ratio}"
        )
    check_visible_patches(grid_size, mask_ratio)
    if repeats < 1:
        raise InputError(f"repeats must be at least 1, got {repeats}")
    v = num_kept(L, mask_ratio)
    rank = torch.arange(L, dtype=torch.float32)
    rows = []
    for _ in range(repeats):
        perm = torch.randperm(L, generator=generator)
        for k in range(complementary_mask_count(L, mask_ratio)):
            order = perm.roll(-k * v)  # this mask keeps order[:v]
            rows.append(torch.empty(L).index_put_((order,), rank))
    hidden = repeats * (L - v) // math.gcd(L, v)
    return ComplementaryMasks(torch.stack(rows), mask_ratio, hidden)
