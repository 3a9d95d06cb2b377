"""Patch masking: which patches the encoder sees, and which masked patches the decoder reconstructs.

Every strategy is expressed as a per-patch score ("noise", shape (N, L)); ``random_masking``
keeps the ``int(L * (1 - mask_ratio))`` patches with the *smallest* score. For the paper's
default strategy the score is uniform noise, exactly as in the official code; the other
strategies of the paper's ablation (Table 1f) only choose their scores differently, so every
strategy keeps the same number of patches and batches stay rectangular.

Partial reconstruction (``decoder_masking``) then gives the decoder only a random fraction of the
masked patches' mask tokens, and the loss covers just those.

References: He et al., MAE (2021), Sec. 3 and Table 1f; Bao et al., BEiT (2021), Alg. 1 for
block-wise masking; Wang et al., VideoMAE V2 (2023), Sec. 3.2 (decoder masking) and Fu et al.,
CrossMAE (2024), Sec. 3 (partial reconstruction) for the decoder's subset.
"""

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from mae.errors import ConfigError

# The strategies, listed once: a new one is added here and given its entry in ``STRATEGIES``.
MaskStrategy = Literal["random", "block", "grid"]
MASK_STRATEGIES: tuple[str, ...] = get_args(MaskStrategy)


def num_kept(num_patches: int, mask_ratio: float) -> int:
    """Number of visible patches: ``int(L * (1 - mask_ratio))``, as the official code rounds."""
    return int(num_patches * (1 - mask_ratio))


def num_decoded(num_masked: int, keep_ratio: float) -> int:
    """Masked patches the decoder reconstructs: ``int(num_masked * keep_ratio)``, rounded down as
    ``num_kept`` rounds (a hair of slack so that, say, 100 * 0.29 = 28.999... counts 29)."""
    return int(num_masked * keep_ratio + 1e-9)


def check_decoder_keep_ratio(keep_ratio: float, name: str = "decoder_keep_ratio") -> None:
    """Raise ``ValueError`` naming the setting unless ``keep_ratio`` is a number in (0, 1]."""
    if isinstance(keep_ratio, bool) or not isinstance(keep_ratio, int | float) or not 0.0 < keep_ratio <= 1.0:
        raise ConfigError(
            f"{name} must be a number in (0, 1] (the fraction of masked patches the decoder reconstructs; "
            f"1.0 = every one, the paper), got {keep_ratio!r}"
        )


def check_decoded_patches(
    grid_size: tuple[int, int], mask_ratio: float, keep_ratio: float, name: str = "decoder_keep_ratio"
) -> None:
    """Raise ``ValueError`` when ``keep_ratio`` of the patches ``mask_ratio`` masks on a ``grid_size``
    grid rounds to no patch at all (nothing left to reconstruct), naming the smallest ratio that keeps one."""
    L = grid_size[0] * grid_size[1]
    masked = L - num_kept(L, mask_ratio)
    if num_decoded(masked, keep_ratio) >= 1:
        return
    if masked == 0:
        raise ConfigError(
            f"mask_ratio {mask_ratio} masks no patch of the {grid_size[0]}x{grid_size[1]} patch grid, so the "
            f"decoder has nothing to reconstruct ({name} {keep_ratio}); train with a mask_ratio above 0"
        )
    smallest = math.ceil(10_000 / masked) / 10_000
    raise ConfigError(
        f"{name} {keep_ratio} reconstructs int({masked} * {keep_ratio}) = 0 of the {masked} patches that "
        f"mask_ratio {mask_ratio} masks on the {grid_size[0]}x{grid_size[1]} patch grid; use at least "
        f"{smallest} (1 patch), at most 1.0 (every one)"
    )


def check_mask_strategy(strategy: str, name: str = "mask strategy") -> None:
    """Raise ``ValueError`` naming the setting (``name``) when ``strategy`` is not in ``MASK_STRATEGIES``."""
    if strategy not in MASK_STRATEGIES:
        raise ConfigError(f"{name} {strategy!r} is unknown; expected one of {MASK_STRATEGIES}")


def check_mask_ratio(mask_ratio: float, strategy: str = "random") -> None:
    """Raise ``ValueError`` for an unknown strategy, a ratio outside [0, 1) or a ratio the strategy
    cannot produce (its ``check_ratio`` in ``STRATEGIES``)."""
    check_mask_strategy(strategy)
    if not 0.0 <= mask_ratio < 1.0:
        raise ConfigError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
    STRATEGIES[strategy].check_ratio(mask_ratio)


def check_strategy_grid(strategy: str, grid_size: tuple[int, int]) -> None:
    """Raise ``ValueError`` for an unknown strategy or a (H/p, W/p) patch grid it cannot mask (its
    ``check_grid`` in ``STRATEGIES``)."""
    check_mask_strategy(strategy)
    STRATEGIES[strategy].check_grid(grid_size)


def check_visible_patches(grid_size: tuple[int, int], mask_ratio: float) -> None:
    """Raise ``ValueError`` when ``mask_ratio`` leaves no visible patch on a ``grid_size`` patch grid
    (the encoder would see only the cls token), naming the largest ratio that keeps one."""
    L = grid_size[0] * grid_size[1]
    if num_kept(L, mask_ratio) >= 1:
        return
    largest = math.floor((1 - 1 / L) * 10_000) / 10_000  # 4 decimals, rounded down so it keeps one
    while L > 1 and num_kept(L, largest) < 1:  # float rounding: 5 * (1 - 0.8) is just under 1
        largest = round(largest - 1e-4, 4)
    raise ConfigError(
        f"mask_ratio {mask_ratio} leaves no visible patch on the {grid_size[0]}x{grid_size[1]} patch grid "
        f"(int({L} * (1 - {mask_ratio})) = 0); use at most {largest}, which keeps 1 of {L}"
    )


def random_masking(
    x: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep the patches with the smallest noise, per sample.

    Args:
        x: (N, L, D) patch tokens.
        mask_ratio: fraction of patches to remove, in [0, 1).
        noise: (N, L) scores; small noise is kept. Uniform random when None.

    Returns:
        x_kept: (N, len_keep, D) visible tokens, in ascending-noise order.
        mask: (N, L) float, 0 = keep, 1 = remove, in the original patch order.
        ids_restore: (N, L) indices that undo the shuffle: ``gather(shuffled, ids_restore)``.
    """
    N, L, D = x.shape
    len_keep = num_kept(L, mask_ratio)
    if noise is None:
        noise = torch.rand(N, L, device=x.device)
    elif noise.shape != (N, L):
        raise ConfigError(f"noise must have shape (N, L) = {(N, L)}, got {tuple(noise.shape)}")

    ids_shuffle = torch.argsort(noise.to(x.device), dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    ids_keep = ids_shuffle[:, :len_keep]
    x_kept = torch.gather(x, 1, ids_keep.unsqueeze(-1).expand(-1, -1, D))

    mask = torch.ones(N, L, device=x.device, dtype=x.dtype)
    mask.scatter_(1, ids_keep, 0.0)
    return x_kept, mask, ids_restore


def decoder_masking(ids_masked: torch.Tensor, keep: int, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Choose the masked patches the decoder reconstructs (partial reconstruction), per sample.

    Args:
        ids_masked: (N, L_masked) patch indices of the masked patches.
        keep: how many of them to reconstruct (``num_decoded``).
        noise: (N, L) per-patch scores; the masked patches with the smallest are reconstructed.
            Uniform random over the masked patches when None.

    Returns:
        (N, keep) patch indices, in ascending-noise order.
    """
    if noise is None:
        scores = torch.rand(ids_masked.shape, device=ids_masked.device)
    else:
        scores = torch.gather(noise.to(ids_masked.device), 1, ids_masked)
    chosen = torch.argsort(scores, dim=1)[:, :keep]
    return torch.gather(ids_masked, 1, chosen)


def block_mask(
    grid_size: tuple[int, int],
    num_masked: int,
    rng: random.Random,
    min_block_patches: int = 16,
    min_aspect: float = 0.3,
) -> torch.Tensor:
    """One BEiT-style block-wise mask with exactly ``num_masked`` patches removed.

    Rectangles of random area and aspect ratio are added until the target count is reached;
    if no rectangle fits any more (small grids), the remainder is filled with random single
    patches so the count is always exact.

    Returns:
        (H/p, W/p) bool, True = masked.
    """
    grid_h, grid_w = grid_size
    mask = torch.zeros(grid_h, grid_w, dtype=torch.bool)
    log_aspect = (math.log(min_aspect), math.log(1 / min_aspect))
    min_area = min(min_block_patches, num_masked)
    count = 0
    while count < num_masked:
        budget = num_masked - count
        added = 0
        for _ in range(10):  # BEiT's attempts per block
            area = rng.uniform(min(min_area, budget), budget)
            aspect = math.exp(rng.uniform(*log_aspect))
            h = int(round(math.sqrt(area * aspect)))
            w = int(round(math.sqrt(area / aspect)))
            if not (0 < h <= grid_h and 0 < w <= grid_w):
                continue
            top, left = rng.randint(0, grid_h - h), rng.randint(0, grid_w - w)
            block = mask[top : top + h, left : left + w]
            new = h * w - int(block.sum())
            if 0 < new <= budget:
                block.fill_(True)
                added = new
                break
        if added == 0:
            break
        count += added
    if count < num_masked:
        free = torch.nonzero(~mask.flatten()).flatten().tolist()
        fill = rng.sample(free, num_masked - count)
        mask.view(-1)[fill] = True
    return mask


def uniform_noise(
    batch_size: int, length: int, device: torch.device | str = "cpu", generator: torch.Generator | None = None
) -> torch.Tensor:
    """(N, L) scores uniform in [0, 1): the paper's random masking keeps the L - len_keep lowest."""
    if generator is None:  # torch 2.14 cannot compile torch.rand(..., generator=None) with dynamic shapes
        return torch.rand(batch_size, length, device=device)
    return torch.rand(batch_size, length, device=device, generator=generator)


def block_noise(
    batch_size: int,
    grid_size: tuple[int, int],
    mask_ratio: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(N, L) scores for block-wise masking: masked patches score in [1, 2), kept in [0, 1)."""
    L = grid_size[0] * grid_size[1]
    num_masked = L - num_kept(L, mask_ratio)
    # One draw from torch's generator seeds the Python RNG, so global seeding reproduces masks.
    rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))
    masks = torch.stack([block_mask(grid_size, num_masked, rng).flatten() for _ in range(batch_size)])
    return masks.float() + uniform_noise(batch_size, L, generator=generator)


def _check_grid_cells(grid_size: tuple[int, int]) -> None:
    """Grid masking's patch grid: whole 2x2 cells, so both sides even."""
    if grid_size[0] % 2 or grid_size[1] % 2:
        raise ConfigError(f"grid masking needs an even patch grid, got {grid_size[0]}x{grid_size[1]}")


def _check_grid_ratio(mask_ratio: float) -> None:
    """Grid masking's ratio: one patch of every 2x2 cell stays, so 0.75."""
    if not math.isclose(mask_ratio, 0.75):
        raise ConfigError(
            f"grid masking keeps one patch of every 2x2 cell, so mask_ratio must be 0.75, got {mask_ratio}"
        )


def grid_noise(batch_size: int, grid_size: tuple[int, int]) -> torch.Tensor:
    """(N, L) scores for grid masking: keep the top-left patch of every 2x2 cell."""
    _check_grid_cells(grid_size)
    grid_h, grid_w = grid_size
    rows = torch.arange(grid_h).reshape(-1, 1)
    cols = torch.arange(grid_w).reshape(1, -1)
    masked = ((rows % 2 == 1) | (cols % 2 == 1)).flatten().float()
    order = torch.arange(grid_h * grid_w) / (grid_h * grid_w)  # keeps visible tokens in raster order
    return (masked + order).expand(batch_size, -1).clone()


def sample_noise(
    strategy: str,
    batch_size: int,
    grid_size: tuple[int, int],
    mask_ratio: float,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(N, L) masking scores for ``strategy``; pass them to ``random_masking`` as ``noise``. The
    strategy and ratio are checked where they enter (``check_mask_ratio``: the model's public entry,
    the module at build, a command's option), not again here.

    ``generator`` must live on the CPU for ``block`` and on ``device`` for ``random``.
    """
    return STRATEGIES[strategy].scores(batch_size, grid_size, mask_ratio, device, generator)


def _no_rule(_: object) -> None:
    """A strategy that can mask any ratio in [0, 1) and any patch grid."""


@dataclass(frozen=True)
class Strategy:
    """One masking strategy, all of it in one place.

    ``scores(batch_size, grid_size, mask_ratio, device, generator)`` -> (N, L) masking scores (small =
    visible); ``check_ratio(mask_ratio)`` and ``check_grid(grid_size)`` raise ``ValueError`` for a ratio
    in [0, 1) or a (H/p, W/p) patch grid the strategy cannot mask.
    """

    scores: Callable[[int, tuple[int, int], float, torch.device | str, torch.Generator | None], torch.Tensor]
    check_ratio: Callable[[float], None] = _no_rule
    check_grid: Callable[[tuple[int, int]], None] = _no_rule


# The strategies' scores and rules, one entry each. A new strategy adds its name to ``MaskStrategy``
# and its entry here (a test checks the two agree).
STRATEGIES: dict[str, Strategy] = {
    "random": Strategy(
        scores=lambda n, grid, ratio, device, generator: uniform_noise(
            n, grid[0] * grid[1], device, generator
        ),
    ),
    "block": Strategy(
        scores=lambda n, grid, ratio, device, generator: block_noise(n, grid, ratio, generator).to(device),
    ),
    "grid": Strategy(
        scores=lambda n, grid, ratio, device, generator: grid_noise(n, grid).to(device),
        check_ratio=_check_grid_ratio,
        check_grid=_check_grid_cells,
    ),
}
