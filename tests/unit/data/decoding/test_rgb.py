"""The 8-bit RGB path (``mae.data.decoding.rgb``): 16-bit, float and int images scaled by their range
to 8-bit levels or refused by name, and a JPEG's size read from its header as PIL reads it."""

import numpy as np
import pytest
import torch
from PIL import Image

from mae.data.decoding.rgb import jpeg_size, to_rgb
from mae.data.views.crop import PretrainCrop
from mae.data.views.recipes import eval_transform


def _gray16(path, value: int, size=(24, 20)):
    Image.fromarray(np.full(size[::-1], value, np.uint16)).save(path)
    return path


def test_16bit_png__scaled_by_its_range_not_saturated(tmp_path):
    path = _gray16(tmp_path / "a.png", 128 * 257)  # mid-gray in 16 bits
    assert Image.open(path).mode == "I;16"
    assert np.asarray(to_rgb(Image.open(path))).tolist() == np.full((20, 24, 3), 128).tolist()  # was 255
    crop = PretrainCrop(8)(str(path))  # the pretraining path (reads the file itself)
    assert crop.dtype == torch.uint8 and crop.min() == crop.max() == 128
    evaluated = eval_transform(8, 1.0)(Image.open(path))  # the evaluation / fine-tuning path
    expected = (128 / 255 - 0.485) / 0.229
    torch.testing.assert_close(evaluated[0], torch.full((8, 8), expected), atol=1e-5, rtol=0)


def test_16bit_levels__black_white_and_every_257th_level_map_to_exact_8_bit_levels():
    """65535 / 257 = 255: 16-bit level 257 * v is 8-bit v, white stays white (no wrap past 255)."""
    levels = np.array([[0, 257, 128 * 257, 200 * 257 + 128, 65534, 65535]], np.uint16)
    assert np.asarray(to_rgb(Image.fromarray(levels)))[0, :, 0].tolist() == [0, 1, 128, 200, 255, 255]


def test_float_tiff_and_int_images__scaled_or_refused_by_name(tmp_path):
    Image.fromarray(np.full((6, 6), 0.5, np.float32)).save(tmp_path / "f.tiff")
    assert np.asarray(to_rgb(Image.open(tmp_path / "f.tiff")))[0, 0].tolist() == [128, 128, 128]
    Image.fromarray(np.full((6, 6), 1000, np.int32)).save(tmp_path / "i.tiff")
    assert np.asarray(to_rgb(Image.open(tmp_path / "i.tiff")))[0, 0, 0] == round(1000 / 257)
    Image.fromarray(np.full((6, 6), 7.5, np.float32)).save(tmp_path / "big.tiff")
    with pytest.raises(ValueError, match=r"big.tiff of mode F: values 7.5..7.5 are outside the 0..1 range"):
        to_rgb(Image.open(tmp_path / "big.tiff"))
    Image.fromarray(np.full((6, 6), -3, np.int32)).save(tmp_path / "neg.tiff")
    with pytest.raises(ValueError, match=r"neg.tiff of mode I"):
        to_rgb(Image.open(tmp_path / "neg.tiff"))


def test_jpeg_size__read_from_the_header_as_pil_does(tmp_path):
    for i, (size, progressive) in enumerate([((37, 50), False), ((640, 17), True), ((1, 1), False)]):
        path = tmp_path / f"{i}.jpg"
        Image.new("RGB", size, (10, 20, 30)).save(path, progressive=progressive, quality=80)
        assert jpeg_size(path.read_bytes()) == size
