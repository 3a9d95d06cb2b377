"""One image file of any kind, read as a data module of its kind reads it: the entry point of the
tools that take files one by one (reconstructions of your own images, the page)."""

import numpy as np

from mae.data.decoding.arrays import adapt_channels, pixel_format, read_pixels, to_unit_range
from mae.data.decoding.formats import Source, reads_as_rgb
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.decoding.rgb import open_image, to_rgb


def read_image(path: Source, in_chans: int, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """float32 (H, W, ``in_chans``) pixels of one image file in the data's units: an 8-bit file PIL
    reads, for a 3-channel model, through the RGB path (as PIL converts it, / 255); any other through
    the array path (``read_pixels``). ``reads_as_rgb`` decides, as it does for a folder.

    Raises:
        OSError, ValueError, PIL.Image.DecompressionBombError: naming the file.
    """
    if reads_as_rgb(in_chans, pixel_format(path).rgb_readable):
        with open_image(path, max_pixels) as img:
            return adapt_channels(to_unit_range(np.asarray(to_rgb(img)), path), in_chans, path)
    return read_pixels(path, in_chans, max_pixels=max_pixels)
