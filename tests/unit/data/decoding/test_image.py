"""A file's trip through the decoding layer goes forward: from its name (``formats``) to its header
(``headers``), its reading path (``route``), the pixel limits (``limits``), its pixels (``rgb`` or
``arrays``) and their units (``units``), entering each module once, and opening the file once.

The trip is what ``load_images`` (the anomaly command's reader, the same ``load_image`` every command
that reads one file uses) calls, traced function by function: a function entered counts, a suspended
generator resumed (a ``with`` block's exit) is the same entry."""

import sys

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

from mae.apps.anomaly.evaluation import load_images
from mae.data.decoding.image import pixel_format, read_pixels
from mae.data.decoding.route import PixelFormat
from mae.inference.normalization import Normalization

DECODING = "mae.data.decoding."
# "image" composes the trip; "pixels": rgb or arrays
STAGES = ["image", "formats", "headers", "route", "limits", "pixels", "units"]

_opened: list[str] | None = None  # the paths opened while a trip is traced


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], str):
        _opened.append(args[0])


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one records only inside _trip


def _trip(path, norm: Normalization) -> tuple[list[str], int]:
    """The decoding modules entered, in order (a module entered again after another is listed again), and
    how often ``path`` was opened, while ``load_images`` reads it."""
    global _opened
    entered, seen = [], set()

    def tracer(frame, event, arg):
        if event == "call" and frame not in seen:
            seen.add(frame)  # a generator's frame comes back when it resumes: the same entry
            module = frame.f_globals.get("__name__", "")
            if module.startswith(DECODING):
                stage = module[len(DECODING) :]
                stage = "pixels" if stage in ("rgb", "arrays") else stage
                if not entered or entered[-1] != stage:
                    entered.append(stage)
        return None

    _opened = []
    sys.settrace(tracer)
    try:
        images = load_images([path], (16, 16), norm)
    finally:
        sys.settrace(None)
        opens, _opened = _opened.count(str(path)), None
    assert images.shape == (1, norm.in_chans, 16, 16) and torch.isfinite(images).all()
    return entered, opens


def _png8(path):
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(path)


def _png16(path):
    Image.fromarray(np.random.default_rng(0).integers(0, 65536, (24, 20), dtype=np.uint16)).save(path)


def _tiff(path):
    tifffile.imwrite(
        path, np.random.default_rng(0).random((4, 24, 20), dtype=np.float32), photometric="minisblack"
    )


def _npy(path):
    np.save(path, np.random.default_rng(0).random((24, 20, 3), dtype=np.float32))


@pytest.mark.parametrize(
    "name, write, in_chans",
    [("rgb.png", _png8, 3), ("gray16.png", _png16, 1), ("bands.tif", _tiff, 4), ("float.npy", _npy, 3)],
)
def test_decoding__a_file_goes_forward_through_each_stage_once_and_is_opened_once(
    tmp_path, name, write, in_chans
):
    path = tmp_path / name
    write(path)
    norm = Normalization(in_chans, (0.5,) * in_chans, (0.25,) * in_chans)
    entered, opens = _trip(path, norm)
    assert entered == STAGES, f"{name}: the trip entered {entered}; each stage once, in the order {STAGES}"
    assert opens == 1, f"{name} was opened {opens} times"


def test_read_pixels__the_array_entry_point_checks_scales_and_adapts(tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(np.full((4, 6), 65535, np.uint16)).save(path)
    assert pixel_format(path) == PixelFormat(1, "uint16", False)
    gray = read_pixels(path)
    assert gray.shape == (4, 6, 1) and gray.dtype == np.float32 and np.all(gray == 1.0)
    assert read_pixels(path, in_chans=3).shape == (4, 6, 3)
    with pytest.raises(
        ValueError, match="x.png has 1 channel\\(s\\) of uint16, unlike the rest of the folder"
    ):
        read_pixels(path, expected=(1, "uint8"))
