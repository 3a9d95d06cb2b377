"""Images named on a command line (``mae.inference.images``): the files a list of files and folders
names, one image read as a normalised model input, and the range its figures are drawn in."""

import numpy as np
import pytest
import torch
from PIL import Image

from mae.inference.images import display_range, image_paths, load_image
from mae.inference.normalization import Normalization


def test_float_images__drawn_from_their_minimum_to_their_maximum(tmp_path):

    np.save(tmp_path / "reflectance.npy", np.full((4, 4, 2), 1500.0, np.float32))
    Image.fromarray(np.zeros((4, 4), np.uint16)).save(tmp_path / "scan.png")
    assert display_range([tmp_path / "scan.png"]) == (0.0, 1.0)
    assert display_range([tmp_path / "scan.png", tmp_path / "reflectance.npy"]) is None


def test_image_paths__files_as_given_and_the_images_inside_folders_sorted(tmp_path):
    (tmp_path / "photos" / "more").mkdir(parents=True)
    for name in ("b.JPG", "a.png", "more/c.npy", "notes.txt"):
        (tmp_path / "photos" / name).write_bytes(b"")
    given = tmp_path / "given.tif"
    assert image_paths([given, tmp_path / "photos"]) == [
        given,
        tmp_path / "photos" / "a.png",
        tmp_path / "photos" / "b.JPG",
        tmp_path / "photos" / "more" / "c.npy",
    ]


def test_load_image__resized_centre_cropped_and_normalised_as_training_did(tmp_path):
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, 10:30] = 255  # a white middle: the centre crop of the resized image is all white
    Image.fromarray(pixels).save(tmp_path / "x.png")
    norm = Normalization(3, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    image = load_image(tmp_path / "x.png", (8, 8), norm)
    assert image.shape == (3, 8, 8)
    torch.testing.assert_close(image[:, :, 2:6], torch.ones(3, 8, 4), atol=0.02, rtol=0)
    with pytest.raises(ValueError, match="x.png has 3 channel\\(s\\) but data.in_chans is 1"):
        load_image(tmp_path / "x.png", (8, 8), Normalization(1, (0.0,), (1.0,)))
    with pytest.raises(FileNotFoundError, match="missing.png does not exist"):
        load_image(tmp_path / "missing.png", (8, 8), norm)
    with pytest.raises(Image.DecompressionBombError, match="x.png is 40x20"):
        load_image(tmp_path / "x.png", (8, 8), norm, max_pixels=100)


def test_load_image__whatever_a_reader_raises_is_a_value_error_naming_the_file(tmp_path, monkeypatch):
    import mae.inference.images as images

    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")

    def broken(*args, **kwargs):
        raise IndexError("a codec's bug")

    monkeypatch.setattr(images, "read_image", broken)
    with pytest.raises(ValueError, match=r"cannot read .*x.png: IndexError: a codec's bug"):
        load_image(tmp_path / "x.png", (8, 8), Normalization(3, (0.5,) * 3, (0.5,) * 3))
