"""MaskFeat's HOG target against two independent references: a plain-Python reference written here from
the paper's definition, and scikit-image's ``hog`` on single-channel images where the two definitions meet."""

import math

import numpy as np
import pytest
import torch

from mae.errors import ConfigError
from mae.models.targets.hog import HOGTarget, hog_cells


def reference_hog(imgs: np.ndarray, patch: int, eps: float = 1e-5) -> np.ndarray:
    """(N, C, H, W) float64 -> (N, L, 2*2*C*9), pixel by pixel: central differences [-1, 0, 1] (0 on the
    border rows / columns), unsigned orientation in nine 20-degree bins, magnitude times a Gaussian of sigma
    patch / 2 centred on the pixel's patch, summed per cell of patch / 2 px, each (channel, cell) histogram
    divided by sqrt(|h|^2 + eps^2); a patch's values ordered (cell row, cell column, channel, bin)."""
    N, C, H, W = imgs.shape
    cell, centre, sigma = patch // 2, (patch - 1) / 2, patch / 2
    out = np.zeros((N, (H // patch) * (W // patch), 4 * C * 9))
    for n in range(N):
        hist = np.zeros((C, H // cell, W // cell, 9))
        for c in range(C):
            x = imgs[n, c]
            for i in range(H):
                for j in range(W):
                    d_row = x[i + 1, j] - x[i - 1, j] if 0 < i < H - 1 else 0.0
                    d_col = x[i, j + 1] - x[i, j - 1] if 0 < j < W - 1 else 0.0
                    degrees = math.degrees(math.atan2(d_row, d_col)) % 180.0
                    b = min(int(degrees // 20.0), 8)
                    u, v = i % patch - centre, j % patch - centre
                    weight = math.exp(-(u * u + v * v) / (2 * sigma * sigma))
                    hist[c, i // cell, j // cell, b] += math.hypot(d_row, d_col) * weight
        hist /= np.sqrt((hist**2).sum(axis=-1, keepdims=True) + eps**2)
        for row in range(H // patch):
            for col in range(W // patch):
                values = [
                    hist[c, 2 * row + a, 2 * col + b] for a in range(2) for b in range(2) for c in range(C)
                ]
                out[n, row * (W // patch) + col] = np.concatenate(values)
    return out


@pytest.mark.parametrize("patch, channels", [(8, 3), (4, 3), (4, 1), (6, 2)])
def test_hog_target__matches_the_reference_written_from_the_paper(patch, channels):
    rng = np.random.default_rng(patch + channels)
    imgs = rng.normal(size=(2, channels, 2 * patch, 3 * patch))
    ours = HOGTarget(patch, channels)(torch.from_numpy(imgs))
    assert ours.dtype == torch.float64 and ours.shape == (2, 6, 4 * channels * 9)
    np.testing.assert_allclose(ours.numpy(), reference_hog(imgs, patch), rtol=0, atol=1e-10)
    # the float32 images of training give the same target, to float32 precision
    single = HOGTarget(patch, channels)(torch.from_numpy(imgs).float())
    np.testing.assert_allclose(single.numpy(), reference_hog(imgs, patch), rtol=0, atol=1e-5)


@pytest.mark.parametrize("cell", [2, 4, 8])
def test_hog_cells__unweighted_match_scikit_image_on_one_channel(cell):
    """scikit-image's HOG of one channel with 1x1-cell blocks and 'L2' block normalisation is our per-cell
    normalised histogram without the Gaussian window: the same [-1, 0, 1] gradients (0 on the border), nine
    hard bins over [0, 180), one cell a block. It averages each cell (sum / cell area) and divides by
    sqrt(|h|^2 + 1e-5^2); ours sums, so ours matches with eps 1e-5 x cell area. Compared: every cell's nine
    normalised values (each in [0, 1]), to 1e-6: scikit-image's histograms carry float32 rounding (about
    4e-8 relative), where one pixel put in another bin would be off by about 0.1."""
    feature = pytest.importorskip("skimage.feature")  # the dev extra's
    rng = np.random.default_rng(cell)
    image = rng.random((4 * cell, 3 * cell))
    expected = feature.hog(
        image,
        orientations=9,
        pixels_per_cell=(cell, cell),
        cells_per_block=(1, 1),
        block_norm="L2",
        feature_vector=False,
    )[:, :, 0, 0, :]  # (rows, columns, bins)
    ours = hog_cells(torch.from_numpy(image)[None, None], cell, window=None, eps=1e-5 * cell * cell)
    np.testing.assert_allclose(ours[0, 0].permute(1, 2, 0).numpy(), expected, rtol=0, atol=1e-6)


def test_hog_target__a_channel_does_not_see_the_others():
    torch.manual_seed(0)
    imgs = torch.randn(2, 5, 16, 16)
    together = HOGTarget(8, 5)(imgs).reshape(2, 4, 2, 2, 5, 9)
    for c in range(5):
        alone = HOGTarget(8, 1)(imgs[:, c : c + 1]).reshape(2, 4, 2, 2, 9)
        torch.testing.assert_close(together[:, :, :, :, c], alone, rtol=0, atol=0)


def test_hog_target__widths_of_maskfeat():
    assert HOGTarget(16, 3).dim == 108  # 2x2 cells x 9 bins x 3 channels
    assert HOGTarget(4, 3).dim == 108 and HOGTarget(4, 1).dim == 36 and HOGTarget(14, 4).dim == 144


def test_hog_target__finite_and_zero_on_flat_and_black_images():
    for imgs in (torch.zeros(2, 3, 16, 16), torch.full((2, 3, 16, 16), 0.7), torch.full((1, 1, 8, 8), -2.0)):
        target = HOGTarget(8, imgs.shape[1])(imgs)
        assert torch.isfinite(target).all() and not target.any()


def test_hog_target__a_cell_with_gradients_has_unit_norm_and_half_precision_is_computed_in_float32():
    torch.manual_seed(1)
    imgs = torch.randn(1, 3, 16, 16)
    cells = HOGTarget(16, 3)(imgs).reshape(1, 2, 2, 3, 9)
    torch.testing.assert_close(cells.norm(dim=-1), torch.ones(1, 2, 2, 3))
    low = HOGTarget(16, 3)(imgs.bfloat16())
    assert low.dtype == torch.float32 and torch.isfinite(low).all()


def test_hog_target__an_odd_patch_cannot_be_cut_into_cells():
    with pytest.raises(ConfigError, match="model.target hog .* needs an even patch_size; got 5"):
        HOGTarget(5, 3)
