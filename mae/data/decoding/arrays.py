"""The array path's pixel read: an opened image file's pixels (``headers.ImageFile``) as (H, W, C) in
their stored dtype, whatever the format: 8- and 16-bit PNG (and any format PIL reads), TIFF (grayscale,
RGB, multi-band; 8/16-bit, float) through ``tifffile``, and ``.npy`` arrays stored (H, W) or (H, W, C).
Reading them as one file of any kind, header and limits first: ``mae.data.decoding.image``.
"""

import numpy as np

from mae.data.decoding.headers import PIL_MODES, ImageFile, ImageFileError


def stored_pixels(file: ImageFile) -> np.ndarray:
    """The pixels of an opened image file as (H, W, C), in their stored dtype, from the handle its header
    was read from, inside ``open_image_file``'s block (which names the file in whatever a reader library
    raises).

    Raises:
        ImageFileError: pixels that are not what the header said.
    """
    if file.reader == "npy":
        array = _npy_pixels(file)
    elif file.reader == "tiff":
        array = _tiff_pixels(file)
    else:
        array = _pil_pixels(file)
    header = file.header
    shape = (header.height, header.width, header.channels)
    if array.shape != shape or array.dtype != header.dtype:
        raise ImageFileError(
            f"cannot read {file.path}: its pixels are {array.shape} of {array.dtype}, but its "
            f"header says {shape} of {header.dtype}"
        )
    return array


def _npy_pixels(file: ImageFile) -> np.ndarray:
    shape, dtype, fortran_order, size = file.npy
    data = bytearray(size)  # writable memory for the array
    file.handle.readinto(data)
    array = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran_order else "C")
    return array[:, :, None] if array.ndim == 2 else array


def _tiff_pixels(file: ImageFile) -> np.ndarray:
    array = file.handle.asarray()  # the first series, as the header described it
    if array.ndim == 2:
        return array[:, :, None]
    return np.moveaxis(array, 0, -1) if file.tiff_axes[-2:] == "YX" else array


def _pil_pixels(file: ImageFile) -> np.ndarray:
    img = file.handle
    if img.mode not in PIL_MODES or img.mode in ("P", "CMYK", "YCbCr", "1"):
        img = img.convert("RGB" if img.mode != "1" else "L")
    array = np.asarray(img)
    return array[:, :, None] if array.ndim == 2 else array
