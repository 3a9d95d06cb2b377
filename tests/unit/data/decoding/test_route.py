"""Which reading path a file takes (``mae.data.decoding.route``): what its pixels are (``PixelFormat``),
and the one rule that sends data down the 8-bit RGB path or the array path (``reads_as_rgb``)."""

import numpy as np
import pytest

from mae.data.decoding.headers import ImageHeader
from mae.data.decoding.route import PixelFormat, reads_as_rgb


@pytest.mark.parametrize(
    ("pixels", "in_chans", "rgb"),
    [
        (PixelFormat(3, "uint8"), 3, True),  # 8-bit RGB JPEG / PNG
        (PixelFormat(1, "uint8"), 3, True),  # grayscale, converted to RGB
        (PixelFormat(4, "uint8"), 3, True),  # RGBA, converted as PIL does
        (PixelFormat(1, "uint8"), 1, False),  # a 1-channel model keeps one band
        (PixelFormat(1, "uint16"), 3, False),  # 16-bit keeps its depth
        (PixelFormat(3, "uint8", array_file=True), 3, False),  # TIFF and .npy: the array reader
        (PixelFormat(1, "float32"), 3, False),
    ],
)
def test_reading_path__one_rule(pixels, in_chans, rgb):
    assert reads_as_rgb(in_chans, pixels.rgb_readable) is rgb


def test_pixel_format__of_a_header_its_kind_and_whether_the_rgb_path_reads_it():
    header = ImageHeader(4, 6, 1, np.dtype("uint16"))
    pixels = PixelFormat.of(header, array_file=False)
    assert pixels == PixelFormat(1, "uint16") and pixels.kind == (1, "uint16") and not pixels.rgb_readable
    gray8 = PixelFormat.of(ImageHeader(4, 6, 1, np.dtype("uint8")), array_file=False)
    rgb_tiff = ImageHeader(4, 6, 3, np.dtype("uint8"))
    assert gray8.rgb_readable and not PixelFormat.of(rgb_tiff, array_file=True).rgb_readable
    assert rgb_tiff.shape == (4, 6, 3)
