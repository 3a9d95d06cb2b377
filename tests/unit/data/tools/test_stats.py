"""Per-channel statistics of an image folder (``mae.data.tools.stats``): exact over every pixel, images
the data path skips listed, the evenly spread sample of ``max_images``, and the lines to paste into a
config. The command over it: tests/integration/data/test_own_data.py."""

import numpy as np
import pytest
from PIL import Image

from mae.data.tools.stats import ChannelStats, channel_stats, image_files


def _two_band_folder(root):
    (root / "train" / "a").mkdir(parents=True)
    np.save(
        root / "train" / "a" / "x.npy",
        np.stack([np.zeros((2, 3)), np.full((2, 3), 4.0)], -1).astype(np.float32),
    )
    np.save(
        root / "train" / "a" / "y.npy",
        np.stack([np.full((2, 3), 2.0), np.full((2, 3), 8.0)], -1).astype(np.float32),
    )
    (root / "train" / "a" / "notes.txt").write_text("not an image")
    return root


def test_channel_stats__exact_mean_and_std_over_every_pixel(tmp_path):
    root = _two_band_folder(tmp_path)
    stats = channel_stats(root, progress=False)
    assert stats.mean == [1.0, 6.0] and stats.std == [1.0, 2.0]
    assert (stats.images, stats.pixels, stats.skipped) == (2, 12, [])
    assert image_files(root) == [str(root / "train" / "a" / "x.npy"), str(root / "train" / "a" / "y.npy")]
    first = channel_stats(root, max_images=1, progress=False)
    assert first.images == 1 and first.mean == [0.0, 4.0]


def test_channel_stats__unreadable_and_oversized_images_are_skipped_and_listed(tmp_path):
    root = _two_band_folder(tmp_path)
    (root / "train" / "a" / "w.npy").write_bytes(b"\x93NUMPY broken")
    Image.fromarray(np.zeros((3, 3), np.uint8)).save(root / "train" / "a" / "big.png")  # 9 pixels
    stats = channel_stats(root, in_chans=2, progress=False, max_pixels=6)
    assert stats.mean == [1.0, 6.0] and stats.images == 2
    assert [line.split(" (")[0] for line in stats.skipped] == [
        str(root / "train" / "a" / "big.png"),
        str(root / "train" / "a" / "w.npy"),
    ]
    assert "max_image_pixels=6" in stats.skipped[0]
    with pytest.raises(ValueError, match=r"no readable image in .* \(4 skipped\)"):
        channel_stats(root, progress=False, max_pixels=1)
    with pytest.raises(FileNotFoundError, match="is not a folder of images"):
        image_files(tmp_path / "missing")


def test_channel_stats__the_lines_to_paste_into_a_config():
    stats = ChannelStats(mean=[0.5, 1234.5678], std=[0.25, 1e-7], images=2, pixels=8, skipped=[])
    assert stats.yaml() == (
        "data:\n  init_args:\n    in_chans: 2\n    mean: [0.5, 1234.57]\n    std: [0.25, 1e-07]\n"
    )
