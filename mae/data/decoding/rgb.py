"""The 8-bit RGB path: any image PIL reads (or a JPEG, decoded straight into a tensor by
libjpeg-turbo) as 8-bit RGB, 16-bit and float images scaled, never clipped. ``read_rgb`` is the
entry point of the pretraining crop, the shard tool's check and the GPU decoder's fallback."""

import os

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from mae.data.decoding.formats import EncodedImage, Source
from mae.data.decoding.headers import ImageFileError, open_pil, unlimited_pil
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS, check_pixel_count

_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
JPEG_START = [0xFF, 0xD8]  # a JPEG's first two bytes (the start-of-image marker)


def image_name(img: Image.Image) -> str:
    """The file or sample a PIL image was opened from, for messages."""
    return getattr(img, "filename", "") or "an in-memory image"


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB of any PIL image. 16-bit images (``I;16*``, and ``I`` with values in 0-65535) are
    scaled by their type's range (/257) and 32-bit float ones (``F``, values in [0, 1]) by 255, never
    clipped; palette, RGBA, CMYK and grayscale convert as PIL does.

    Raises:
        ValueError: naming the file and its mode, for values outside the type's range or a mode
            PIL cannot convert.
    """
    if img.mode == "RGB":
        return img
    if img.mode in _SIXTEEN_BIT_MODES or img.mode in ("I", "F"):
        pixels = np.asarray(img)
        low, high = (float(pixels.min()), float(pixels.max())) if pixels.size else (0.0, 0.0)
        scale, top = (255.0, 1.0) if img.mode == "F" else (1 / 257, 65535.0)
        if not (np.isfinite(low) and np.isfinite(high) and 0 <= low and high <= top):
            raise ImageFileError(
                f"cannot convert image {image_name(img)} of mode {img.mode}: values {low:g}..{high:g} are "
                f"outside the 0..{top:g} range its type is scaled from"
            )
        gray = np.rint(pixels.astype(np.float32) * scale).astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")
    try:
        return img.convert("RGB")
    except (ValueError, OSError) as err:
        raise ImageFileError(
            f"cannot convert image {image_name(img)} of mode {img.mode} to RGB: {err}"
        ) from err


def open_image(path: Source, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Image.Image:
    """``Image.open`` (header only, not decoded) of a file or an image's bytes, with ``max_pixels`` as
    the decompression-bomb limit; the image's ``filename`` names the file or sample, for errors.

    Raises:
        PIL.Image.DecompressionBombError: naming the file, its size and the limit.
        OSError: not an image PIL can identify, naming the file.
    """
    with unlimited_pil():  # the limit checked below replaces PIL's own
        img = open_pil(path)
    check_pixel_count(path, *img.size, max_pixels)
    if isinstance(path, EncodedImage):
        img.filename = path.name
    return img


def is_jpeg(data: torch.Tensor) -> bool:
    """Whether 1-D uint8 ``data`` starts with a JPEG's start-of-image marker."""
    return data[:2].tolist() == JPEG_START


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame header, None when none is found in ``data``."""
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOF0-15 but DHT, JPG, DAC
            return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(data[i + 5 : i + 7], "big")
        i += 2 + length
    return None


def read_rgb(source: "Image.Image | Source", max_pixels: int | None = DEFAULT_MAX_PIXELS) -> torch.Tensor:
    """(3, H, W) uint8 pixels, H x W x 3 in memory, of an image file, its encoded bytes, or a (possibly
    not yet decoded) PIL image. Unreadable files raise ``OSError`` naming the file, as PIL does;
    images over ``max_pixels`` raise ``DecompressionBombError`` before they are decoded."""
    if isinstance(source, EncodedImage):
        data, name = source.tensor(), source.name
    elif isinstance(source, Image.Image):
        path = getattr(source, "filename", "") if source.format == "JPEG" else ""
        if not path:
            return _pil_rgb(source)
        source.close()  # PIL read only the header; decode the file's bytes with libjpeg-turbo directly
        data, name = _read_bytes(path), path
    else:
        name = os.fspath(source)
        data = _read_bytes(name)
    if not is_jpeg(data):  # let PIL decode it
        with open_image(source if isinstance(source, EncodedImage) else name, max_pixels) as img:
            return _pil_rgb(img)
    return decode_jpeg_checked(data, name, max_pixels)


def _read_bytes(path: str | os.PathLike) -> torch.Tensor:
    with open(path, "rb") as f:  # Python's OSError names the file (missing, a folder, no permission)
        data = torch.empty(os.fstat(f.fileno()).st_size, dtype=torch.uint8)
        f.readinto(data.numpy())
    return data


def check_jpeg_size(data: torch.Tensor, name: str, max_pixels: int | None) -> None:
    """Refuse JPEG bytes (1-D uint8) whose header's pixel count is over ``max_pixels``, before decoding.

    Raises:
        PIL.Image.DecompressionBombError: naming ``name``, its size and the limit.
    """
    size = jpeg_size(data[:65536].numpy().tobytes())
    if size is not None:
        check_pixel_count(name, *size, max_pixels)


def decode_jpeg_checked(
    data: torch.Tensor,
    name: str,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """libjpeg-turbo (or, with a CUDA ``device``, nvJPEG) decoding of JPEG bytes (1-D uint8, on the
    CPU) to (3, H, W) uint8 RGB, after checking the header's pixel count against ``max_pixels``.

    Raises:
        OSError: corrupt or truncated data, naming ``name`` (PIL's error type, so loaders skip it).
        PIL.Image.DecompressionBombError: over ``max_pixels``, before decoding.
    """
    check_jpeg_size(data, name, max_pixels)
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as err:  # corrupt or truncated
        raise OSError(f"cannot decode JPEG {name}: {err}") from err


def _pil_rgb(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(to_rgb(img))).permute(2, 0, 1)
