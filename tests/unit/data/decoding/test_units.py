"""Decoded pixels in the data's units (``mae.data.decoding.units``): integers scaled by their type's
range, floats kept but refused when they hold NaN, inf or no-data fills; channels adapted to the model's;
the (C, H, W) tensor."""

import numpy as np
import pytest
import torch

from mae.data.decoding.units import adapt_channels, check_channels, chw_tensor, to_unit_range


def test_to_unit_range__float16_fills_are_its_extremes_and_large_values_pass():
    half = np.full((4, 4, 1), 1.5, np.float16)
    half[0, 0] = np.finfo(np.float16).min
    with pytest.raises(ValueError, match=r"h.npy holds 1 value\(s\) of magnitude 65504 or more"):
        to_unit_range(half, "h.npy")
    # large, not a fill
    assert to_unit_range(np.full((2, 2, 1), 1e20, np.float32), "x").max() == np.float32(1e20)


def test_to_unit_range__integers_by_their_type_s_range_and_floats_as_they_are():
    assert to_unit_range(np.array([[[0, 255]]], np.uint8), "x").tolist() == [[[0.0, 1.0]]]
    assert to_unit_range(np.array([[[65535]]], np.uint16), "x").tolist() == [[[1.0]]]
    as_int32 = to_unit_range(np.array([[[0, 65535]]], np.int32), "x")  # PIL's mode I of a 16-bit file
    assert as_int32.dtype == np.float32 and as_int32.tolist() == [[[0.0, 1.0]]]
    assert to_unit_range(np.full((1, 1, 1), -7.25), "x").tolist() == [[[-7.25]]]  # physical units
    with pytest.raises(ValueError, match=r"i.npy: int32 values -1..3 are outside 8- or 16-bit range"):
        to_unit_range(np.array([[[-1, 3]]], np.int32), "i.npy")
    with pytest.raises(ValueError, match=r"n.npy holds non-finite values"):
        to_unit_range(np.array([[[np.nan]]], np.float32), "n.npy")
    with pytest.raises(ValueError, match=r"b.npy: pixels of dtype bool are not an image's"):
        to_unit_range(np.zeros((1, 1, 1), bool), "b.npy")


def test_channels__grayscale_repeats_to_three_and_other_counts_must_match():
    gray = np.arange(6, dtype=np.float32).reshape(2, 3, 1)
    rgb = adapt_channels(gray, 3, "g.png")
    assert rgb.shape == (2, 3, 3) and (rgb == gray).all()
    assert adapt_channels(gray, 1, "g.png") is gray
    check_channels(4, 4, "x.tif")
    with pytest.raises(
        ValueError, match=r"x.tif has 4 channel\(s\) but data.in_chans is 3; set data.in_chans: 4"
    ):
        adapt_channels(np.zeros((2, 2, 4)), 3, "x.tif")


def test_chw_tensor__a_contiguous_channels_first_view_of_the_pixels():
    pixels = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    tensor = chw_tensor(pixels)
    assert tensor.shape == (4, 2, 3) and tensor.is_contiguous()
    assert torch.equal(tensor[1], torch.from_numpy(pixels[:, :, 1]))
