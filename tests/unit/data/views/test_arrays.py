"""The array path's views (``mae.data.views.arrays``): the evaluation view's resize and centre crop, the
training views' random crops in the data's own units, the file checked against its folder and the limit,
and unknown views refused."""

import numpy as np
import pytest
import torch
from PIL import Image

from mae.data.views.arrays import ArrayView


def _ramp(path, height=24, width=40, bands=2):
    """A float32 ``.npy`` whose every pixel in band b is b + column / width: each view's values say where
    it came from."""
    columns = np.arange(width, dtype=np.float32) / width
    np.save(path, np.stack([np.tile(columns + b, (height, 1)) for b in range(bands)], -1))
    return path


def test_eval_view__resizes_the_short_side_centre_crops_and_normalises(tmp_path):
    path = _ramp(tmp_path / "x.npy")
    view = ArrayView("eval", 16, 2, mean=(0.5, 1.5), std=(0.25, 0.25), crop_ratio=0.5)
    assert view.eval_short_side == 32 and ArrayView("pretrain", 16, 2, (0, 0), (1, 1)).eval_short_side is None
    out = view(path)
    assert out.shape == (2, 16, 16) and out.dtype == torch.float32
    pixels = out * 0.25 + torch.tensor([0.5, 1.5]).view(2, 1, 1)
    # resized to 32 x 53, the centre 16 columns are the middle of the ramp: columns 0.35 .. 0.65 of it
    assert 0.3 < pixels[0].min() < pixels[0].max() < 0.7
    torch.testing.assert_close(pixels[1] - pixels[0], torch.ones(16, 16), atol=1e-4, rtol=0)
    assert repr(view) == "ArrayView(eval, size=(16, 16), in_chans=2)"


def test_training_views__random_crops_of_the_raw_units_seeded_by_torch(tmp_path):
    path = _ramp(tmp_path / "x.npy", bands=1)
    view = ArrayView("pretrain", (8, 12), 1, mean=(0.0,), std=(1.0,))
    torch.manual_seed(0)
    first = view(path)
    torch.manual_seed(0)
    assert torch.equal(view(path), first) and first.shape == (1, 8, 12)
    assert 0 <= first.min() and first.max() < 1  # the ramp's own units, not rescaled
    crops = {tuple(view(path).flatten()[:3].tolist()) for _ in range(5)}
    assert len(crops) > 1  # another box each time
    gray = ArrayView("linprobe", 8, 3, mean=(0.0,) * 3, std=(1.0,) * 3)(path)
    assert gray.shape == (3, 8, 8) and torch.equal(gray[0], gray[2])  # one band repeated to three


def test_array_view__a_file_unlike_its_folder_or_over_the_limit_is_refused_by_name(tmp_path):
    Image.fromarray(np.zeros((10, 10), np.uint16)).save(tmp_path / "x.png")
    with pytest.raises(
        ValueError, match="x.png has 1 channel\\(s\\) of uint16, unlike the rest of the folder"
    ):
        ArrayView("eval", 8, 1, (0.0,), (1.0,), expected=(1, "uint8"))(tmp_path / "x.png")
    with pytest.raises(Image.DecompressionBombError, match="x.png is 10x10 = 100 pixels"):
        ArrayView("pretrain", 8, 1, (0.0,), (1.0,), max_pixels=99)(tmp_path / "x.png")
    with pytest.raises(ValueError, match="unknown view 'train'"):
        ArrayView("train", 8, 1, (0.0,), (1.0,))
