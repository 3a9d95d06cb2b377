import dataclasses

import pytest
import torch

from mae.models import MaskedAutoencoderViT
from mae.models.masking import (
    MASK_STRATEGIES,
    STRATEGIES,
    block_noise,
    check_mask_ratio,
    check_strategy_grid,
    grid_noise,
    num_kept,
    random_masking,
    sample_noise,
)
from tests.helpers import TINY


@pytest.mark.parametrize("ratio", [0.0, 0.4, 0.75, 0.9, 0.999])
def test_random_masking__keeps_int_L_times_one_minus_ratio(ratio):
    x = torch.randn(3, 49, 8)
    kept, mask, ids_restore = random_masking(x, ratio)
    assert kept.shape == (3, int(49 * (1 - ratio)), 8)
    assert torch.all(mask.sum(1) == 49 - int(49 * (1 - ratio)))


def test_random_masking__keeps_smallest_noise_in_ascending_order():
    x = torch.arange(6.0).reshape(1, 6, 1)
    noise = torch.tensor([[0.5, 0.1, 0.9, 0.3, 0.7, 0.2]])
    kept, mask, _ = random_masking(x, 0.5, noise)
    assert kept.flatten().tolist() == [1.0, 5.0, 3.0]
    assert mask.tolist() == [[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]]


def test_random_masking__ids_restore_undoes_the_shuffle():
    torch.manual_seed(0)
    x = torch.randn(4, 16, 3)
    noise = torch.rand(4, 16)
    ids_shuffle = torch.argsort(noise, dim=1)
    shuffled = torch.gather(x, 1, ids_shuffle.unsqueeze(-1).expand(-1, -1, 3))
    _, _, ids_restore = random_masking(x, 0.75, noise)
    restored = torch.gather(shuffled, 1, ids_restore.unsqueeze(-1).expand(-1, -1, 3))
    torch.testing.assert_close(restored, x)


def test_random_masking__rejects_noise_of_wrong_shape():
    with pytest.raises(ValueError, match="noise must have shape"):
        random_masking(torch.randn(2, 16, 4), 0.75, torch.rand(2, 15))


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5])
def test_check_mask_ratio__outside_unit_interval_is_an_error(ratio):
    with pytest.raises(ValueError, match=r"mask_ratio must be in \[0, 1\)"):
        check_mask_ratio(ratio)


def test_check_mask_ratio__grid_needs_075_and_unknown_strategy_fails():
    check_mask_ratio(0.75, "grid")
    with pytest.raises(ValueError, match="grid masking"):
        check_mask_ratio(0.5, "grid")
    with pytest.raises(ValueError, match="unknown"):
        check_mask_ratio(0.75, "checkerboard")


@pytest.mark.parametrize("ratio", [0.4, 0.5, 0.75, 0.9])
@pytest.mark.parametrize("grid", [(8, 8), (14, 14), (4, 6)])
def test_block_noise__exact_count_and_contiguous_blocks(ratio, grid):
    gen = torch.Generator().manual_seed(0)
    L = grid[0] * grid[1]
    noise = block_noise(8, grid, ratio, gen)
    x = torch.randn(8, L, 2)
    kept, mask, _ = random_masking(x, ratio, noise)
    assert kept.shape[1] == num_kept(L, ratio)
    assert torch.all(mask.sum(1) == L - num_kept(L, ratio))
    # masked patches are kept together: most masked patches have a masked 4-neighbour
    m = mask.reshape(8, *grid).bool()
    neighbour = torch.zeros_like(m)
    neighbour[:, 1:] |= m[:, :-1]
    neighbour[:, :-1] |= m[:, 1:]
    neighbour[:, :, 1:] |= m[:, :, :-1]
    neighbour[:, :, :-1] |= m[:, :, 1:]
    assert (m & neighbour).sum() / m.sum() > 0.9


def test_block_noise__is_reproducible_with_a_seeded_generator():
    a = block_noise(4, (8, 8), 0.75, torch.Generator().manual_seed(3))
    b = block_noise(4, (8, 8), 0.75, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b)


def test_grid_noise__keeps_top_left_of_every_2x2_cell():
    _, mask, _ = random_masking(torch.randn(2, 16, 1), 0.75, grid_noise(2, (4, 4)))
    expected = torch.ones(4, 4)
    expected[::2, ::2] = 0
    assert torch.equal(mask[0].reshape(4, 4), expected)
    assert torch.equal(mask[1], mask[0])


def test_grid_noise__odd_grid_is_an_error():
    with pytest.raises(ValueError, match="even patch grid"):
        grid_noise(1, (7, 7))


def test_sample_noise__random_is_uniform_noise_of_shape_N_L():
    noise = sample_noise("random", 5, (4, 4), 0.75, generator=torch.Generator().manual_seed(0))
    assert noise.shape == (5, 16)
    assert noise.min() >= 0 and noise.max() < 1


def test_strategies__every_listed_name_has_scores_and_every_scorer_a_name():
    assert tuple(STRATEGIES) == MASK_STRATEGIES
    for strategy in MASK_STRATEGIES:
        noise = sample_noise(strategy, 3, (4, 4), 0.75, generator=torch.Generator().manual_seed(0))
        assert noise.shape == (3, 16) and num_kept(16, 0.75) == 4


def test_strategies__a_strategy_s_rules_are_its_table_entry_s_and_apply_everywhere(monkeypatch):
    """The checks of the ratio and of the patch grid read the strategy's entry, so changing the entry
    changes every place that checks (the model's build, ``set_img_size``, ``check_mask_ratio``)."""
    check_strategy_grid("grid", (4, 6))
    with pytest.raises(ValueError, match="grid masking needs an even patch grid, got 7x7"):
        check_strategy_grid("grid", (7, 7))
    with pytest.raises(ValueError, match="mask strategy 'rows' is unknown"):
        check_strategy_grid("rows", (4, 4))
    for strategy in ("random", "block"):
        check_strategy_grid(strategy, (7, 7))
        check_mask_ratio(0.3, strategy)

    model = MaskedAutoencoderViT(**TINY, mask_strategy="grid")
    with pytest.raises(ValueError, match="even patch grid, got 9x9"):
        model.set_img_size(36)
    with pytest.raises(ValueError, match="even patch grid, got 9x9"):
        MaskedAutoencoderViT(**{**TINY, "img_size": 36}, mask_strategy="grid")

    def refuse(_):
        raise ValueError("refused by the entry")

    monkeypatch.setitem(STRATEGIES, "random", dataclasses.replace(STRATEGIES["random"], check_ratio=refuse))
    with pytest.raises(ValueError, match="refused by the entry"):
        MaskedAutoencoderViT(**TINY)(torch.randn(1, 3, 32, 32), 0.75)


def test_random_masking__compiles_with_dynamic_shapes():
    """A compiled model recompiled for a new batch or grid size (progressive resolution) traces sizes
    symbolically; torch.rand with ``generator=None`` then failed to trace (torch 2.14)."""
    from tests.helpers import pretrain_module

    model = pretrain_module().model.eval()
    compiled = torch.compile(model, dynamic=True, backend="eager")
    imgs, noise = torch.randn(3, 3, 16, 16), torch.rand(3, model.num_patches)
    torch.testing.assert_close(compiled(imgs, 0.75, noise)[0], model(imgs, 0.75, noise)[0])
    loss, pred, mask = compiled(imgs, 0.75)  # the noise drawn inside the traced graph
    assert torch.isfinite(loss) and mask.shape == (3, model.num_patches) and int(mask.sum()) == 3 * 12
