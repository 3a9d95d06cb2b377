"""The feature memory (``mae.apps.anomaly.features``): the greedy coreset and the blockwise
nearest-neighbour search against brute-force numpy, the features against the encoder's blocks run by hand,
the blocks' indices, and the smoothing against a Gaussian kernel."""

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from mae.apps.anomaly import layout
from mae.apps.anomaly.evaluation import score_test_set
from mae.apps.anomaly.features import (
    PROJECTION_DIM,
    coreset,
    feature_blocks,
    greedy_k_center,
    nearest_distances,
    patch_features,
    smooth_maps,
)


def numpy_greedy(points: np.ndarray, k: int, start: int) -> list[int]:
    """Greedy k-center by its definition: the full distance matrix, each pick the point whose distance to
    its nearest pick so far is largest."""
    distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    picks = [start]
    while len(picks) < k:
        picks.append(int(distances[:, picks].min(axis=1).argmax()))
    return picks


def test_greedy_k_center__same_picks_in_the_same_order_as_brute_force():
    points = np.random.default_rng(0).normal(size=(50, 5))
    for start in (0, 17, 49):
        picks = greedy_k_center(torch.tensor(points, dtype=torch.float32), 12, start)
        assert picks.tolist() == numpy_greedy(points, 12, start)


def test_coreset__greedy_on_a_seeded_random_projection():
    features = torch.randn(50, PROJECTION_DIM + 22, generator=torch.Generator().manual_seed(1))
    picked = coreset(features, 0.2, seed=3)
    # independently: the projection and the start drawn from the seed, then greedy by its definition
    generator = torch.Generator().manual_seed(3)
    projected = (features @ torch.randn(PROJECTION_DIM + 22, PROJECTION_DIM, generator=generator)).numpy()
    start = int(torch.randint(50, (1,), generator=generator))
    assert picked.tolist() == sorted(numpy_greedy(projected.astype(np.float64), 10, start))
    assert picked.tolist() != coreset(features, 0.2, seed=4).tolist()  # the seed matters
    assert coreset(features, 1.0).tolist() == list(range(50))
    assert len(coreset(features, 0.001)) == 1  # at least one vector
    with pytest.raises(ValueError, match=r"--coreset-fraction must be in \(0, 1\], got 0"):
        coreset(features, 0)


@pytest.mark.parametrize(("query_block", "bank_block"), [(5, 7), (37, 53), (1, 100), (64, 4)])
def test_nearest_distances__equal_brute_force_for_any_blocks(query_block, bank_block):
    rng = np.random.default_rng(0)
    bank, queries = rng.normal(size=(53, 6)), rng.normal(size=(37, 6))
    queries[4] = bank[30]  # an exact match scores 0
    expected = np.sqrt(((queries[:, None] - bank[None]) ** 2).sum(-1)).min(axis=1)
    found = nearest_distances(
        torch.tensor(queries, dtype=torch.float32),
        torch.tensor(bank, dtype=torch.float32),
        query_block,
        bank_block,
    )
    np.testing.assert_allclose(found.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert found[4] == 0


def test_patch_features__blocks_concatenated_and_averaged_over_the_neighbourhood():
    torch.manual_seed(0)
    encoder = VisionTransformer(img_size=16, patch_size=4, embed_dim=8, depth=3, num_heads=2).eval()
    imgs = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # the blocks by hand
        x = encoder._pos_embed(encoder.patch_embed(imgs))
        outputs = []
        for block in encoder.blocks:
            x = block(x)
            outputs.append(x[:, 1:])  # the patch tokens, no cls
    expected = torch.cat([outputs[0], outputs[2]], dim=2)  # (2, 16, 16): a 4 x 4 grid, 2 x 8 features
    torch.testing.assert_close(patch_features(encoder, imgs, [0, 2], neighbourhood=1), expected)
    averaged = patch_features(encoder, imgs, [2], neighbourhood=3).numpy()
    grid = outputs[2].reshape(2, 4, 4, 8).numpy()
    for row, col in ((0, 0), (1, 2), (3, 3)):  # a corner (4 neighbours inside), the middle (9), a corner
        window = grid[:, max(row - 1, 0) : row + 2, max(col - 1, 0) : col + 2]
        np.testing.assert_allclose(averaged[:, 4 * row + col], window.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)


def test_feature_blocks__default_the_last_indices_from_either_end_refused_outside_the_depth():
    assert feature_blocks(None, 12) == [11]
    assert feature_blocks([-1, -3], 12) == [9, 11] and feature_blocks([0, 5], 12) == [0, 5]
    with pytest.raises(ValueError, match="--feature-blocks 12 is not a block of this encoder of depth 12"):
        feature_blocks([-1, 12], 12)
    with pytest.raises(ValueError, match="--feature-blocks -13 is not a block of this encoder of depth 12"):
        feature_blocks([-13], 12)
    with pytest.raises(ValueError, match="names a block twice"):
        feature_blocks([11, -1], 12)
    with pytest.raises(ValueError, match="takes 1 to 3 blocks, got 4"):
        feature_blocks([0, 1, 2, 3], 12)


def test_maps_smoothed_by_a_gaussian_and_the_image_score_the_highest_patch(tmp_path):
    delta = torch.zeros(1, 41, 41)
    delta[0, 20, 20] = 1.0
    offsets = np.arange(-16, 17)  # scipy's truncation: 4 sigma
    kernel = np.exp(-(offsets**2) / (2 * 4.0**2))
    kernel /= kernel.sum()
    np.testing.assert_allclose(
        smooth_maps(delta, 4.0)[0, 4:37, 4:37].numpy(), np.outer(kernel, kernel), atol=1e-7
    )
    # through the scoring of a test set: top-k 1 is the highest patch; the map the smoothed upsampling
    two = [layout.TestImage(tmp_path / "a.png"), layout.TestImage(tmp_path / "b.png")]
    images = layout.TestSet(tmp_path, two, has_masks=False)
    errors = torch.tensor([[0.0, 1.0, 0.0, 5.0], [2.0, 0.0, 0.0, 0.0]])
    plain = score_test_set(errors, images, (2, 2), (8, 8), top_k=1)
    smoothed = score_test_set(errors, images, (2, 2), (8, 8), top_k=1, sigma=4.0)
    assert smoothed.scores.tolist() == [5.0, 2.0] == plain.scores.tolist()
    torch.testing.assert_close(smoothed.maps, smooth_maps(plain.maps, 4.0))
    assert smoothed.maps.max() < plain.maps.max()


@pytest.mark.parametrize(
    ("name", "depth", "default"), [("resnet10t", 5, [2, 3]), ("convnextv2_atto", 4, [1, 2])]
)
def test_cnn_features__middle_stages_resized_to_the_finest_and_concatenated(name, depth, default):
    """A CNN's blocks are its stages: by default the stride-8 and stride-16 ones (a ResNet's layer2 and
    layer3, PatchCore's); the coarser map resized bilinearly to the finer one's grid, then concatenated,
    each position averaged over its 3 x 3 neighbours; the grid is the finer map's."""
    import timm
    from torch.nn import functional as F

    from mae.apps.anomaly.features import FeatureMemory, default_feature_blocks, feature_depth

    encoder = timm.create_model(name, num_classes=0).eval()
    assert feature_depth(encoder) == depth
    blocks = feature_blocks(default_feature_blocks(encoder), depth)
    assert blocks == default and [encoder.feature_info[b]["reduction"] for b in blocks] == [8, 16]
    imgs = torch.randn(2, 3, 64, 64)
    with torch.no_grad():  # by hand: every stage's map, the two chosen, the coarser upsampled
        maps = encoder.forward_intermediates(imgs, intermediates_only=True)
    fine, coarse = maps[blocks[0]], maps[blocks[1]]
    up = F.interpolate(coarse, size=fine.shape[-2:], mode="bilinear", align_corners=False)
    grid = F.avg_pool2d(torch.cat([fine, up], 1), 3, stride=1, padding=1, count_include_pad=False)
    features = patch_features(encoder, imgs, blocks, neighbourhood=3)
    assert features.shape == (2, 64, fine.shape[1] + coarse.shape[1])  # 8 x 8 positions at stride 8
    torch.testing.assert_close(features, grid.flatten(2).transpose(1, 2))
    assert FeatureMemory(encoder, blocks, 3).grid_size((64, 64), 3) == (8, 8)
    assert FeatureMemory(encoder, [depth - 1], 3).grid_size((64, 48), 3) == (
        2,
        2 if name == "resnet10t" else 1,
    )
