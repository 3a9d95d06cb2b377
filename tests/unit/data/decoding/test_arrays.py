"""The array path's pixel read (``mae.data.decoding.arrays``, through ``read_array``): (H, W, C) in the
stored dtype from planar and interleaved TIFFs, ``.npy`` arrays in C or Fortran order, and PIL images
whose modes it converts; pixels unlike their header are refused."""

import numpy as np
import pytest
import tifffile
from PIL import Image

from mae.data.decoding.arrays import stored_pixels
from mae.data.decoding.headers import ImageFileError, ImageHeader, open_image_file
from mae.data.decoding.image import pixel_format, read_array


def test_reader__layouts_and_units(tmp_path):
    tifffile.imwrite(
        tmp_path / "planar.tif",
        np.arange(3 * 4 * 5, dtype=np.uint16).reshape(3, 4, 5),
        photometric="minisblack",
        planarconfig="separate",
    )
    tifffile.imwrite(tmp_path / "rgb.tif", np.zeros((4, 5, 3), np.uint8), photometric="rgb")
    tifffile.imwrite(tmp_path / "gray.tif", np.zeros((4, 5), np.float32))
    np.save(tmp_path / "hw.npy", np.zeros((4, 5), np.float64))
    expected = {
        "planar.tif": (3, "uint16"),
        "rgb.tif": (3, "uint8"),
        "gray.tif": (1, "float32"),
        "hw.npy": (1, "float64"),
    }
    for name, kind in expected.items():
        assert pixel_format(tmp_path / name).kind == kind
        assert read_array(tmp_path / name).shape == (4, 5, kind[0])
    assert read_array(tmp_path / "planar.tif")[1, 2].tolist() == [7, 27, 47]  # (C, H, W) -> (H, W, C)


def test_stored_pixels__fortran_order_npy_and_palette_png_in_their_stored_layout(tmp_path):
    pixels = np.arange(4 * 5 * 2, dtype=np.float32).reshape(4, 5, 2)
    np.save(tmp_path / "f.npy", np.asfortranarray(pixels))
    assert (read_array(tmp_path / "f.npy") == pixels).all()
    palette = Image.new("P", (3, 2))
    palette.putpalette([10, 20, 30] + [0] * 765)
    palette.save(tmp_path / "p.png")
    assert read_array(tmp_path / "p.png").tolist() == [[[10, 20, 30]] * 3] * 2  # converted to RGB


def test_stored_pixels__pixels_unlike_their_header_are_refused_naming_both(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((4, 5), np.uint8))
    with open_image_file(tmp_path / "x.npy", "npy") as file:
        file.header = ImageHeader(4, 5, 3, np.dtype("uint8"))  # as a header that lied would say
        with pytest.raises(
            ImageFileError,
            match=r"x.npy: its pixels are \(4, 5, 1\) of uint8, but its header says \(4, 5, 3\)",
        ):
            stored_pixels(file)
