"""Image transforms of the MAE recipes: pretraining, fine-tuning, linear probing, evaluation."""

import functools
import os
from typing import Literal

import numpy as np
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN as IMAGENET_MEAN
from timm.data import IMAGENET_DEFAULT_STD as IMAGENET_STD
from timm.data import create_transform
from torch.nn import functional as F
from torchvision import transforms as T
from torchvision.io import ImageReadMode, decode_jpeg

from mae.data.readers import DEFAULT_MAX_PIXELS, EncodedImage, check_pixel_count, check_view_size, open_pil

Augmentation = Literal["pretrain", "finetune", "linprobe", "none"]
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def _name(img: Image.Image) -> str:
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
            raise ValueError(
                f"cannot convert image {_name(img)} of mode {img.mode}: values {low:g}..{high:g} are outside "
                f"the 0..{top:g} range its type is scaled from"
            )
        gray = np.rint(pixels.astype(np.float32) * scale).astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")
    try:
        return img.convert("RGB")
    except (ValueError, OSError) as err:
        raise ValueError(f"cannot convert image {_name(img)} of mode {img.mode} to RGB: {err}") from err


def open_image(path: "str | os.PathLike | EncodedImage", max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Image.Image:
    """``Image.open`` (header only, not decoded) of a file or an image's bytes, with ``max_pixels`` as
    the decompression-bomb limit; the image's ``filename`` names the file or sample, for errors.

    Raises:
        PIL.Image.DecompressionBombError: naming the file, its size and the limit.
        OSError: not an image PIL can identify, naming the file.
    """
    previous = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # the limit checked below replaces PIL's own
    try:
        img = open_pil(path)
    finally:
        Image.MAX_IMAGE_PIXELS = previous
    check_pixel_count(path, *img.size, max_pixels)
    if isinstance(path, EncodedImage):
        img.filename = path.name
    return img


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


class ViewSizeLimit:
    """Refuse (``PIL.Image.DecompressionBombError``, naming the file) a PIL image whose view resized
    to ``short_side`` would be over ``max_pixels`` (``mae.data.readers.check_view_size``), from its
    header, before it is decoded; the image passes unchanged."""

    def __init__(self, short_side: int, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
        self.short_side = short_side
        self.max_pixels = max_pixels

    def __call__(self, img: Image.Image) -> Image.Image:
        width, height = img.size
        check_view_size(_name(img), height, width, 3, self.short_side, self.max_pixels)  # the view is RGB
        return img

    def __repr__(self) -> str:
        return f"ViewSizeLimit(short_side={self.short_side}, max_pixels={self.max_pixels})"


class ToRGB:
    """Convert any PIL image to 8-bit RGB (``to_rgb``: 16-bit and float images scaled, not clipped)."""

    def __call__(self, img):
        return to_rgb(img)

    def __repr__(self) -> str:
        return "ToRGB()"


class PretrainCrop:
    """MAE pretraining augmentation: RandomResizedCrop (scale 0.2-1, bicubic) + horizontal flip, as a
    uint8 (C, H, W) tensor; ``normalize_batch`` turns a batch of them into model input.

    Draws the same random numbers as torchvision's ``RandomResizedCrop`` + ``RandomHorizontalFlip`` on
    a PIL image and gives the same pixels to within two intensity levels of 255 (0.01 on average).
    It is over 2x faster per worker at 224 px (``benchmarks/dataloader.py``): JPEG files are decoded by
    torchvision's libjpeg-turbo decoder straight into a tensor (given a path, without PIL parsing the
    header first), the bicubic resize is PyTorch's vectorised uint8 kernel (antialiased, PIL's
    filter), and no float image is made per sample, so workers also ship a quarter of the bytes.
    Other images (PNG, in-memory CIFAR, ...) are converted from PIL. The output's memory is
    H x W x C (channels last), as the resize kernel writes it; ``collate_images`` keeps it so.

    Args:
        img_size: output side, or (H, W).
        scale: range of the crop's area as a fraction of the image.
        max_pixels: larger images are refused as decompression bombs (None: no limit).
    """

    ratio = (3 / 4, 4 / 3)
    reads_files = True  # datasets may pass a file path instead of an opened PIL image

    def __init__(
        self,
        img_size: int | tuple[int, int],
        scale: tuple[float, float] = (0.2, 1.0),
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ):
        self.size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)  # (H, W)
        self.scale = scale
        self.max_pixels = max_pixels

    def __call__(self, img: "Image.Image | str | os.PathLike | EncodedImage") -> torch.Tensor:
        """``img``: a PIL image (opened, decoded or not), an image file's path, or its encoded bytes."""
        pixels = _decode_rgb(img, self.max_pixels)
        top, left, h, w = T.RandomResizedCrop.get_params(pixels, list(self.scale), list(self.ratio))
        flip = torch.rand(1).item() < 0.5
        return resized_crop(pixels, (top, left, h, w), flip, self.size)

    def __repr__(self) -> str:
        return f"PretrainCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, bicubic, flip=0.5)"


def resized_crop(
    pixels: torch.Tensor,
    box: tuple[int, int, int, int],
    flip: bool,
    size: tuple[int, int],
    float_math: bool | None = None,
) -> torch.Tensor:
    """The (top, left, height, width) ``box`` of uint8 (C, H, W) ``pixels`` resized to ``size`` (H, W)
    with the antialiased bicubic filter, mirrored if ``flip``: uint8 (C, *size), H x W x C in memory.

    On the CPU this is PyTorch's vectorised uint8 kernel; elsewhere (CUDA has no uint8 bicubic) the
    crop is resized in float32 and rounded, within one intensity level of the CPU result.
    ``float_math`` forces one or the other (default: by device).
    """
    top, left, h, w = box
    crop = pixels[None, :, top : top + h, left : left + w]
    if float_math is None:
        float_math = pixels.device.type != "cpu"
    if not float_math:
        out = F.interpolate(crop.contiguous(memory_format=torch.channels_last), size, mode="bicubic", antialias=True)
    else:
        out = F.interpolate(crop.float(), size, mode="bicubic", antialias=True)
        out = out.round_().clamp_(0, 255).to(torch.uint8).contiguous(memory_format=torch.channels_last)
    return out[0].flip(-1) if flip else out[0]


def _decode_rgb(
    source: "Image.Image | str | os.PathLike | EncodedImage", max_pixels: int | None = DEFAULT_MAX_PIXELS
) -> torch.Tensor:
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
    if data[:2].tolist() != [0xFF, 0xD8]:  # not a JPEG (no start-of-image marker): let PIL decode it
        with open_image(source if isinstance(source, EncodedImage) else name, max_pixels) as img:
            return _pil_rgb(img)
    return decode_jpeg_checked(data, name, max_pixels)


def _read_bytes(path: str | os.PathLike) -> torch.Tensor:
    with open(path, "rb") as f:  # Python's OSError names the file (missing, a folder, no permission)
        data = torch.empty(os.fstat(f.fileno()).st_size, dtype=torch.uint8)
        f.readinto(data.numpy())
    return data


def decode_jpeg_checked(
    data: torch.Tensor, name: str, max_pixels: int | None = DEFAULT_MAX_PIXELS, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """libjpeg-turbo (or, with a CUDA ``device``, nvJPEG) decoding of JPEG bytes (1-D uint8, on the
    CPU) to (3, H, W) uint8 RGB, after checking the header's pixel count against ``max_pixels``.

    Raises:
        OSError: corrupt or truncated data, naming ``name`` (PIL's error type, so loaders skip it).
        PIL.Image.DecompressionBombError: over ``max_pixels``, before decoding.
    """
    size = jpeg_size(data[:65536].numpy().tobytes())
    if size is not None:
        check_pixel_count(name, *size, max_pixels)
    try:
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as err:  # corrupt or truncated
        raise OSError(f"cannot decode JPEG {name}: {err}") from err


def _pil_rgb(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(to_rgb(img))).permute(2, 0, 1)


def normalize_batch(
    imgs: torch.Tensor, mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD
) -> torch.Tensor:
    """uint8 (N, C, H, W) in [0, 255] -> float normalised by ``mean`` / ``std`` (per channel, in [0, 1]
    units; ImageNet's by default), in the input's memory format; float batches pass unchanged."""
    if imgs.dtype != torch.uint8:
        return imgs
    N, C, H, W = imgs.shape
    pixels = imgs.permute(0, 2, 3, 1)
    if pixels.is_contiguous() and not imgs.is_contiguous():  # channels last (``collate_images``)
        # Per-channel constants broadcast along rows of W * C values, so the loop vectorises (a
        # size-C innermost broadcast runs about 5x slower).
        mean, inv_std = _normalization_constants(imgs.device, tuple(mean), tuple(std), W)
        rows = pixels.reshape(N * H, W * C).float().sub_(mean).mul_(inv_std)
        return rows.view(N, H, W, C).permute(0, 3, 1, 2)
    mean, inv_std = _normalization_constants(imgs.device, tuple(mean), tuple(std))
    return imgs.float().sub_(mean).mul_(inv_std)  # one new tensor, two in-place passes


@functools.cache
def _normalization_constants(
    device: torch.device, mean: tuple[float, ...], std: tuple[float, ...], row_width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and 1/std in 0-255 units, made once per device (no copy to it every step): (1, C, 1, 1),
    or repeated along a channels-last row of ``row_width`` pixels, (row_width * C,)."""
    mean = torch.tensor(mean, device=device) * 255
    inv_std = 1 / (torch.tensor(std, device=device) * 255)
    if row_width is None:
        return mean.view(1, -1, 1, 1), inv_std.view(1, -1, 1, 1)
    return mean.repeat(row_width), inv_std.repeat(row_width)


def pretrain_transform(img_size: int | tuple[int, int], max_pixels: int | None = DEFAULT_MAX_PIXELS) -> PretrainCrop:
    """MAE pretraining: RandomResizedCrop (0.2-1, bicubic) + flip, uint8 out (see ``PretrainCrop``)."""
    return PretrainCrop(img_size, max_pixels=max_pixels)


def finetune_transform(
    img_size: int | tuple[int, int],
    auto_augment: str | None = "rand-m9-mstd0.5-inc1",
    re_prob: float = 0.25,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
) -> T.Compose:
    """MAE fine-tuning: timm's RandomResizedCrop (0.08-1, bicubic) + flip + RandAugment + random erasing."""
    timm_transform = create_transform(
        img_size, is_training=True, color_jitter=None, auto_augment=auto_augment, interpolation="bicubic",
        re_prob=re_prob, re_mode="pixel", re_count=1, mean=tuple(mean), std=tuple(std),
    )  # fmt: skip
    return T.Compose([ToRGB(), *timm_transform.transforms])


def linprobe_transform(
    img_size: int | tuple[int, int], mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD
) -> T.Compose:
    """MAE linear probing: RandomResizedCrop (0.08-1, bicubic) + flip only."""
    return T.Compose(
        [
            ToRGB(),
            T.RandomResizedCrop(img_size, interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(mean, std),
        ]
    )


def train_transform(
    augmentation: Augmentation,
    img_size: int | tuple[int, int],
    auto_augment: str | None = "rand-m9-mstd0.5-inc1",
    re_prob: float = 0.25,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
) -> T.Compose:
    """The training transform of 8-bit RGB images in a recipe: "pretrain", "finetune", "linprobe", or "none" (the
    evaluation view: no randomness, e.g. for the no-augmentation small-data MAE runs). ``max_pixels``:
    the decompression-bomb limit of the pretraining crop, which reads files itself, and of the
    evaluation view's resized image."""
    if augmentation == "pretrain":
        return pretrain_transform(img_size, max_pixels)
    if augmentation == "finetune":
        return finetune_transform(img_size, auto_augment, re_prob, mean, std)
    if augmentation == "linprobe":
        return linprobe_transform(img_size, mean, std)
    if augmentation == "none":
        return eval_transform(img_size, 1.0, mean, std, max_pixels)
    raise ValueError(f"data.augmentation must be 'pretrain', 'finetune', 'linprobe' or 'none', got {augmentation!r}")


def eval_transform(
    img_size: int | tuple[int, int],
    crop_ratio: float = 224 / 256,
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> T.Compose:
    """Resize the short side to ``img_size / crop_ratio`` (bicubic), center-crop ``img_size``, normalise.
    An image whose resized view would be over ``max_pixels`` (e.g. 1 x 1,000,000 pixels) is refused
    before it is decoded (``ViewSizeLimit``)."""
    size = img_size if isinstance(img_size, int) else max(img_size)
    short_side = int(size / crop_ratio)
    return T.Compose(
        [
            ViewSizeLimit(short_side, max_pixels),
            ToRGB(),
            T.Resize(short_side, interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(img_size),
            T.ToTensor(),
            T.Normalize(mean, std),
        ]
    )
