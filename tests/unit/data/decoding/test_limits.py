"""The pixel limit every reader checks before decoding (``mae.data.decoding.limits``): the pixel count, the
decoded bytes of many-band or 64-bit images, and the evaluation view of an elongated image."""

import numpy as np
import pytest
from PIL import Image

from mae.data.decoding.headers import ImageHeader
from mae.data.decoding.limits import (
    BYTES_PER_LIMIT_PIXEL,
    check_decoded_size,
    check_pixel_count,
    check_view_size,
    resized_size,
)


def test_pixel_count__over_the_limit_is_a_decompression_bomb_naming_file_size_and_option():
    check_pixel_count("a.png", 100, 10, max_pixels=1000)  # exactly the limit passes
    check_pixel_count("a.png", 10**6, 10**6, max_pixels=None)  # no limit
    with pytest.raises(
        Image.DecompressionBombError,
        match=r"image a.png is 101x10 = 1,010 pixels, over "
        r"data.max_image_pixels=1,000 \(--max-image-pixels",
    ):
        check_pixel_count("a.png", 101, 10, max_pixels=1000)


def test_decoded_size__many_bands_or_64_bit_pixels_are_bounded_by_their_bytes():
    limit = 1000  # 12,000 bytes: three float32 values per pixel of the limit
    check_decoded_size("rgb.tif", ImageHeader(10, 100, 3, np.dtype("uint8")), limit)  # 1,000 x 3 x 4 bytes
    with pytest.raises(Image.DecompressionBombError, match=r"bands.tif is 10x10 with 31 band\(s\) of uint16"):
        check_decoded_size("bands.tif", ImageHeader(10, 10, 31, np.dtype("uint16")), limit)  # 12,400 bytes
    check_decoded_size("wide.npy", ImageHeader(10, 10, 15, np.dtype("float64")), limit)  # 12,000 bytes
    with pytest.raises(Image.DecompressionBombError, match=f"{BYTES_PER_LIMIT_PIXEL} bytes per pixel"):
        check_decoded_size("wide.npy", ImageHeader(10, 10, 16, np.dtype("float64")), limit)
    check_decoded_size("any.npy", ImageHeader(10**5, 10**5, 64, np.dtype("float64")), None)


def test_resized_size__the_short_side_to_the_size_and_the_long_side_in_proportion_rounded_down():
    assert resized_size(30, 45, 20) == (20, 30)
    assert resized_size(45, 31, 20) == (29, 20)  # 20 * 45 / 31 = 29.03
    assert resized_size(7, 7, 3) == (3, 3)


def test_view_size__an_elongated_image_is_refused_by_its_resized_view():
    check_view_size("wide.png", 10, 100, 3, short_side=10, max_pixels=1000)  # a 10x100 view: the limit
    with pytest.raises(
        Image.DecompressionBombError,
        match=r"narrow.png is 1000x1: resized to short side 10 "
        r"for the evaluation view it would be 10000x10 = 100,000 pixels",
    ):
        check_view_size("narrow.png", 1, 1000, 3, short_side=10, max_pixels=1000)
    check_view_size("narrow.png", 1, 10**6, 3, short_side=10, max_pixels=None)
