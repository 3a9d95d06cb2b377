"""The feature memory (``mae.apps.anomaly.features``): the greedy coreset (its rounds against the plain
greedy's one pass per pick) and the blockwise nearest-neighbour search against brute-force numpy, the
features against the encoder's blocks run by hand, the blocks' indices, and the smoothing against a
Gaussian kernel."""

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from mae.apps.anomaly import layout
from mae.apps.anomaly.evaluation import score_test_set
from mae.apps.anomaly.features import (
    CANDIDATES,
    PROJECTION_DIM,
    coreset,
    feature_blocks,
    greedy_k_center,
    nearest_distances,
    patch_features,
    smooth_maps,
)
from mae.errors import ConfigError


def numpy_greedy(points: np.ndarray, k: int, start: int) -> list[int]:
    """Greedy k-center by its definition: the full distance matrix, each pick the point whose distance to
    its nearest pick so far is largest."""
    distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    picks = [start]
    while len(picks) < k:
        picks.append(int(distances[:, picks].min(axis=1).argmax()))
    return picks


def plain_greedy(points: np.ndarray, k: int, start: int) -> tuple[list[int], float]:
    """Greedy k-center as one pass over all the points per pick (float64), and its coverage radius: the
    largest distance of a point to its nearest pick."""
    nearest = np.full(len(points), np.inf)
    picks = [start]
    while True:
        nearest = np.minimum(nearest, np.linalg.norm(points - points[picks[-1]], axis=1))
        if len(picks) == k:
            return picks, float(nearest.max())
        picks.append(int(nearest.argmax()))


def radius(points: np.ndarray, picks: torch.Tensor) -> float:
    """The largest distance of a row of ``points`` to its nearest row among ``picks`` (float64)."""
    points = torch.tensor(points, dtype=torch.float64)
    return float(torch.cdist(points, points[picks]).min(dim=1).values.max())


def point_sets() -> dict[str, np.ndarray]:
    """(600, 16) seeded points: Gaussian; 20 tight clusters far from their mean (the squared distances'
    expansion cancels most there: the greedy goes on in float64); 120 distinct points 5 times each,
    shuffled."""
    rng = np.random.default_rng(0)
    centres = 100 + 10 * rng.normal(size=(20, 16))
    clustered = np.repeat(centres, 30, axis=0) + 0.01 * rng.normal(size=(600, 16))
    duplicated = np.repeat(rng.normal(size=(120, 16)), 5, axis=0)[rng.permutation(600)]
    return {"gaussian": rng.normal(size=(600, 16)), "clustered": clustered, "duplicated": duplicated}


@pytest.mark.parametrize("candidates", [1, 2, 7, CANDIDATES])
def test_greedy_k_center__same_picks_in_the_same_order_as_brute_force(candidates):
    points = np.random.default_rng(0).normal(size=(50, 5))
    for start in (0, 17, 49):
        picks = greedy_k_center(torch.tensor(points, dtype=torch.float32), 12, start, candidates)
        assert picks.tolist() == numpy_greedy(points, 12, start)


@pytest.mark.parametrize("name", ["gaussian", "clustered", "duplicated"])
@pytest.mark.parametrize("candidates", [8, 64, CANDIDATES])
def test_greedy_k_center__rounds_cover_as_the_plain_greedy(name, candidates):
    """Rounds of picks among the farthest candidates, each round's distances updated in one matrix
    product: the coverage radius of the plain greedy, and every pick a new point."""
    points = point_sets()[name]
    for k, start in ((20, 5), (120, 0), (250, 599)):  # 250: more than the duplicated set's distinct points
        picks = greedy_k_center(torch.tensor(points, dtype=torch.float32), k, start, candidates)
        _, expected = plain_greedy(points, k, start)
        assert picks[0] == start and len(set(picks.tolist())) == k
        assert radius(points, picks) == pytest.approx(expected, rel=1e-5, abs=1e-4)
    assert expected == 0 if name == "duplicated" else expected > 0


def test_greedy_k_center__one_pick_every_pick_and_refused_counts():
    points = torch.tensor(point_sets()["duplicated"][:40], dtype=torch.float32)
    assert greedy_k_center(points, 1, 7).tolist() == [7]
    for candidates in (4, CANDIDATES):
        every = greedy_k_center(points, 40, 7, candidates)
        assert every[0] == 7 and sorted(every.tolist()) == list(range(40))
    for k, start in ((0, 0), (41, 0), (5, 40), (5, -1)):
        with pytest.raises(ConfigError, match=f"takes 1 to 40 picks .* got k={k}, start={start}"):
            greedy_k_center(points, k, start)


def test_coreset__greedy_on_a_seeded_random_projection():
    features = torch.randn(50, PROJECTION_DIM + 22, generator=torch.Generator().manual_seed(1))
    picked = coreset(features, 0.2, seed=3)
    # independently: the projection and the start drawn from the seed, then greedy by its definition
    generator = torch.Generator().manual_seed(3)
    projected = (features @ torch.randn(PROJECTION_DIM + 22, PROJECTION_DIM, generator=generator)).numpy()
    start = int(torch.randint(50, (1,), generator=generator))
    assert picked.tolist() == sorted(numpy_greedy(projected.astype(np.float64), 10, start))
    assert picked.tolist() == coreset(features, 0.2, seed=3).tolist()  # the seed decides
    assert picked.tolist() != coreset(features, 0.2, seed=4).tolist()
    assert coreset(features, 1.0).tolist() == list(range(50))
    assert len(coreset(features, 0.001)) == 1  # at least one vector
    with pytest.raises(ValueError, match=r"--coreset-fraction must be in \(0, 1\], got 0"):
        coreset(features, 0)


def test_coreset__several_rounds_cover_as_the_plain_greedy_on_the_projection():
    """1,200 picks of 3,000 projected vectors: rounds of ``CANDIDATES``, the plain greedy's radius."""
    features = torch.randn(3000, PROJECTION_DIM + 64, generator=torch.Generator().manual_seed(2))
    picked = coreset(features, 0.4, seed=5)
    generator = torch.Generator().manual_seed(5)
    projected = features @ torch.randn(PROJECTION_DIM + 64, PROJECTION_DIM, generator=generator)
    start = int(torch.randint(3000, (1,), generator=generator))
    picks, expected = plain_greedy(projected.double().numpy(), 1200, start)
    assert len(picked) == 1200 > CANDIDATES and start in picked
    assert picked.tolist() == sorted(set(picked.tolist()))
    assert radius(projected.double().numpy(), picked) == pytest.approx(expected, rel=1e-5)
    assert len(set(picked.tolist()) & set(picks)) > 0.99 * 1200  # the same picks, but for ties and rounding


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
