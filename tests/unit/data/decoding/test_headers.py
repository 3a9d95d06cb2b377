"""An image file's header, read and checked before any pixel (``mae.data.decoding.headers``): ``.npy``
headers that describe no image, TIFFs that are not one image, archives named ``.npy``, and the PIL modes'
channels and dtypes."""

import numpy as np
import pytest
import tifffile
from PIL import Image

from mae.data.decoding.formats import EncodedImage
from mae.data.decoding.headers import ImageHeader, InvalidHeaderError, checked_header, open_image_file
from mae.data.decoding.image import pixel_format, read_header
from tests.helpers import write_npy_header


@pytest.mark.parametrize(
    "write, message",
    [
        (lambda p: np.save(p, np.array(3.0)), r"shape \(\); expected \(H, W\) or \(H, W, C\)"),
        (lambda p: np.save(p, np.zeros((4, 0))), r"shape \(4, 0\): every dimension must be at least 1"),
        (lambda p: write_npy_header(p, (-5, 32)), r"shape \(-5, 32\): every dimension must be at least 1"),
        (
            lambda p: write_npy_header(p, (8, 8), "<f4", b"\0" * 10),
            r"promises \(8, 8\) of float32 \(256 bytes\).*10: trunc",
        ),
        (lambda p: np.save(p, np.ones((4, 4), np.complex64)), r"holds complex64 values, not pixels"),
        (lambda p: p.write_bytes(b"\x93NUMPY\x09\x00"), r"as an .npy array: format version \(9, 0\)"),
    ],
)
def test_read_header__refuses_npy_headers_that_describe_no_image_by_name(tmp_path, write, message):
    path = tmp_path / "x.npy"
    write(path)
    with pytest.raises(ValueError, match=rf"x.npy.*{message}|{message}.*x.npy"):
        read_header(path)


def test_read_header__refuses_a_4d_tiff_before_reading_it(tmp_path):
    tifffile.imwrite(tmp_path / "stack.tif", np.zeros((2, 3, 8, 8), np.uint8), photometric="minisblack")
    with pytest.raises(ValueError, match=r"stack.tif as one image: its axes are 'QQYX'"):
        read_header(tmp_path / "stack.tif")


def test_readers__an_npz_archive_named_npy_is_unreadable_by_name(tmp_path):
    from mae.data.decoding.formats import EncodedImage

    path = tmp_path / "x.npy"
    with open(path, "wb") as f:
        np.savez(f, a=np.zeros((4, 4)))
    for source in (path, EncodedImage(path.read_bytes(), "s3://b/train:a/x.npy")):
        with pytest.raises(ValueError, match=rf"cannot read {source} as an .npy array: it holds a NpzFile"):
            pixel_format(source)


@pytest.mark.parametrize(
    "mode, shape, dtype",
    [
        ("L", (5, 7, 1), "uint8"),
        ("RGBA", (5, 7, 4), "uint8"),
        ("P", (5, 7, 3), "uint8"),
        ("F", (5, 7, 1), "float32"),
    ],
)
def test_pil_header__channels_and_dtype_of_each_mode(tmp_path, mode, shape, dtype):
    path = tmp_path / ("x.tiff" if mode == "F" else "x.png")
    Image.new(mode, (7, 5)).save(path)
    with open_image_file(path, "pil") as file:
        assert file.header == ImageHeader(*shape, np.dtype(dtype)) and file.reader == "pil"


def test_npy_header__read_from_bytes_in_memory_names_the_sample(tmp_path):
    array = np.zeros((3, 4, 2), np.float32)
    np.save(tmp_path / "x.npy", array)
    sample = EncodedImage((tmp_path / "x.npy").read_bytes(), "s3://b/train:a/x.npy")
    assert read_header(sample) == ImageHeader(3, 4, 2, np.dtype("float32"))
    with pytest.raises(InvalidHeaderError, match=r"s3://b/train:a/x.npy holds an array of shape \(3,\)"):
        checked_header(sample, (3,), np.dtype("float32"))
