"""The pixel limit every reader checks before decoding (``data.max_image_pixels`` and the commands'
``--max-image-pixels``): a decompression bomb, a huge scan, or an elongated image whose resized
view would be huge is refused by name, before it takes the memory."""

from typing import TYPE_CHECKING

from PIL import Image

from mae.data.decoding.formats import Source

if TYPE_CHECKING:
    from mae.data.decoding.headers import ImageHeader

# PIL's own default limit (about 89.5 megapixels), above which an image is treated as a decompression bomb.
DEFAULT_MAX_PIXELS = 89_478_485
# Memory an image may take per pixel of the limit: three float32 values (an RGB image at the limit, as
# ``to_unit_range`` makes it). Multi-band and 64-bit images are bounded by their bytes, not only pixels.
BYTES_PER_LIMIT_PIXEL = 3 * 4


def check_pixel_count(path: Source, width: int, height: int, max_pixels: int | None) -> None:
    """Raises ``PIL.Image.DecompressionBombError`` when ``width x height`` exceeds ``max_pixels``."""
    if max_pixels is not None and width * height > max_pixels:
        raise Image.DecompressionBombError(
            f"image {path} is {width}x{height} = {width * height:,} pixels, over "
            f"data.max_image_pixels={max_pixels:,} (--max-image-pixels of the commands; a decompression "
            "bomb, or a huge scan: raise the limit if it is genuine)"
        )


def check_decoded_size(path: Source, header: "ImageHeader", max_pixels: int | None) -> None:
    """Refuse, before decoding, an image over ``max_pixels`` pixels, or one whose float32 pixels (or
    stored ones, when wider) take more than ``BYTES_PER_LIMIT_PIXEL`` bytes per pixel of the limit
    (many bands, 64-bit values).

    Raises:
        PIL.Image.DecompressionBombError: naming the file, its size and the limit's option.
    """
    check_pixel_count(path, header.width, header.height, max_pixels)
    if max_pixels is None:
        return
    needed = header.height * header.width * header.channels * max(header.dtype.itemsize, 4)
    allowed = max_pixels * BYTES_PER_LIMIT_PIXEL
    if needed > allowed:
        raise Image.DecompressionBombError(
            f"image {path} is {header.width}x{header.height} with {header.channels} band(s) of "
            f"{header.dtype}: {needed / 2**30:.2f} GiB decoded, over the {allowed / 2**30:.2f} GiB that "
            f"data.max_image_pixels={max_pixels:,} allows (--max-image-pixels of the commands; "
            f"{BYTES_PER_LIMIT_PIXEL} bytes per pixel of the limit): raise the limit if it is genuine"
        )


def resized_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """(H, W) of an image whose short side is resized to ``short_side`` and long side in proportion
    (rounded down), as ``torchvision.transforms.Resize(short_side)`` sizes it."""
    if height <= width:
        return short_side, int(short_side * width / height)
    return int(short_side * height / width), short_side


def check_view_size(
    path: Source, height: int, width: int, channels: int, short_side: int, max_pixels: int | None
) -> None:
    """Refuse an image whose view resized to ``short_side`` (the evaluation view) would be over the
    limit (``check_decoded_size``): a 1 x 1,000,000 image at short side 32 is 32 x 32,000,000.

    Raises:
        PIL.Image.DecompressionBombError: naming the file, the view's size and the limit's option.
    """
    if max_pixels is None:
        return
    view_h, view_w = resized_size(height, width, short_side)
    needed = view_h * view_w * channels * 4
    if view_h * view_w > max_pixels or needed > max_pixels * BYTES_PER_LIMIT_PIXEL:
        raise Image.DecompressionBombError(
            f"image {path} is {width}x{height}: resized to short side {short_side} for the evaluation view "
            f"it would be {view_w}x{view_h} = {view_w * view_h:,} pixels ({needed / 2**30:.2f} GiB), over "
            f"what data.max_image_pixels={max_pixels:,} allows (--max-image-pixels of the commands); crop "
            "such an elongated image, or raise the limit"
        )
