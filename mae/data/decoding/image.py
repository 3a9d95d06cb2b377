"""One image file read from its name to its pixels in the data's units, each stage in its own module and
in this order, with no return to a module left behind: the library its name calls for (``formats``), the
file opened once and its header checked (``headers``), the reading path its pixels take (``route``), the
pixel limits (``limits``), the pixels (``rgb`` for the 8-bit RGB path, ``arrays`` for the array path) and
their units (``units``).

``read_image``: one file as a model of ``in_chans`` channels reads it (reconstructions of your own images,
the page, embeddings, anomaly maps); ``read_pixels``: the array path, for the data modules and tools that
have chosen it; ``read_array``: the stored pixels; ``read_header`` / ``pixel_format``: what a file holds,
from its header only.
"""

import numpy as np

from mae.data.decoding.arrays import stored_pixels
from mae.data.decoding.formats import Source, reader_of
from mae.data.decoding.headers import ImageFileError, ImageHeader, open_image_file
from mae.data.decoding.limits import (
    DEFAULT_MAX_PIXELS,
    check_decoded_size,
    check_pixel_count,
    check_view_size,
)
from mae.data.decoding.rgb import to_rgb
from mae.data.decoding.route import PixelFormat, reads_as_rgb
from mae.data.decoding.units import adapt_channels, to_unit_range


def read_header(path: Source) -> ImageHeader:
    """The (H, W, C) and dtype the array path returns for an image file, from its header only.

    Raises:
        OSError, ValueError: naming the file: unreadable, truncated (``.npy``), not one 2-D image
            (a 0-d, empty or 4-D array, negative dimensions), or pixels that are not numbers.
    """
    with open_image_file(path, reader_of(path)) as file:
        return file.header


def pixel_format(path: Source) -> PixelFormat:
    """What the array path returns for an image file (channels, dtype) and whether only the array path
    reads it, from its header only."""
    reader = reader_of(path)
    with open_image_file(path, reader) as file:
        header = file.header
    return PixelFormat.of(header, reader != "pil")


def read_array(path: Source, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """The pixels of an image file as (H, W, C), in their stored dtype; its header is checked and its size
    against ``max_pixels`` (``check_decoded_size``) before any pixel is read.

    Raises:
        OSError, ValueError: naming the file, for anything that makes it unreadable.
        PIL.Image.DecompressionBombError: over the limit, before any pixel is read.
    """
    with open_image_file(path, reader_of(path)) as file:
        check_decoded_size(path, file.header, max_pixels)
        return stored_pixels(file)


def read_pixels(
    path: Source,
    in_chans: int | None = None,
    expected: tuple[int, str] | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    view_short_side: int | None = None,
) -> np.ndarray:
    """The array path's reading of one image file: float32 (H, W, C) in the data's units
    (``to_unit_range``), with ``in_chans`` channels (``adapt_channels``; None: as stored).

    Args:
        expected: (channels, dtype name) the file must have (``PixelFormat.kind``), as the rest of
            its folder or shards do; None: any.
        max_pixels: the pixel limit, checked from the header before decoding (None: none).
        view_short_side: the short side of the evaluation view the pixels will be resized to: the view is
            checked against the limit from the header too (``check_view_size``); None: no such view.

    Raises:
        OSError, ValueError, PIL.Image.DecompressionBombError: naming the file.
    """
    with open_image_file(path, reader_of(path)) as file:
        header = file.header
        if expected is not None and (header.channels, header.dtype.name) != tuple(expected):
            raise ImageFileError(
                f"{path} has {header.channels} channel(s) of {header.dtype.name}, unlike the rest of the "
                f"folder ({expected[0]} of {expected[1]})"
            )
        check_decoded_size(path, header, max_pixels)
        if view_short_side is not None:
            check_view_size(
                path, header.height, header.width, in_chans or header.channels, view_short_side, max_pixels
            )
        array = stored_pixels(file)
    array = to_unit_range(array, path)
    return array if in_chans is None else adapt_channels(array, in_chans, path)


def read_image(
    path: Source,
    in_chans: int,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    view_short_side: int | None = None,
) -> np.ndarray:
    """float32 (H, W, ``in_chans``) pixels of one image file in the data's units: an 8-bit file PIL
    reads, for a 3-channel model, through the RGB path (as PIL converts it, / 255); any other through
    the array path (as ``read_pixels`` reads it). ``reads_as_rgb`` decides, as it does for a folder. The
    file is opened once; ``view_short_side`` as ``read_pixels``.

    Raises:
        OSError, ValueError, PIL.Image.DecompressionBombError: naming the file.
    """
    reader = reader_of(path)
    with open_image_file(path, reader) as file:
        header = file.header
        rgb = reads_as_rgb(in_chans, PixelFormat.of(header, reader != "pil").rgb_readable)
        if rgb:  # the RGB path's limit: the pixels, which it converts to three 8-bit channels
            check_pixel_count(path, header.width, header.height, max_pixels)
        else:
            check_decoded_size(path, header, max_pixels)
        if view_short_side is not None:
            check_view_size(path, header.height, header.width, in_chans, view_short_side, max_pixels)
        array = np.asarray(to_rgb(file.handle)) if rgb else stored_pixels(file)
    return adapt_channels(to_unit_range(array, path), in_chans, path)
