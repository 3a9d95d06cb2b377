"""The one random crop of the recipes: RandomResizedCrop's parameters (area ``CROP_SCALE`` of the
recipe, aspect ``CROP_RATIO``) and a horizontal flip, drawn in that order by every path (8-bit RGB in
loader workers, whole batches on the GPU, arrays of any bit depth), so for the same random numbers
the paths crop the same box. timm's and torchvision's fine-tuning / probing transforms are given
the same values."""

import torch
from PIL import Image
from torch.nn import functional as F
from torchvision import transforms as T

from mae.data.decoding.formats import Source
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.decoding.rgb import read_rgb

# Range of the crop's area as a fraction of the image, per recipe (He et al. 2021, appendix A.1-A.2).
CROP_SCALE = {"pretrain": (0.2, 1.0), "finetune": (0.08, 1.0), "linprobe": (0.08, 1.0)}
CROP_RATIO = (3 / 4, 4 / 3)  # range of the crop's aspect ratio (width / height)

Box = tuple[int, int, int, int]  # (top, left, height, width)


def random_crop(pixels: torch.Tensor, scale: tuple[float, float]) -> tuple[Box, bool]:
    """(crop box, whether to mirror) for (C, H, W) ``pixels``: ``RandomResizedCrop.get_params`` with
    area ``scale`` and aspect ``CROP_RATIO``, then a fair coin, from the global RNG."""
    box = T.RandomResizedCrop.get_params(pixels, list(scale), list(CROP_RATIO))
    return box, torch.rand(1).item() < 0.5


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

    ratio = CROP_RATIO
    reads_files = True  # datasets may pass a file path instead of an opened PIL image

    def __init__(
        self,
        img_size: int | tuple[int, int],
        scale: tuple[float, float] = CROP_SCALE["pretrain"],
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ):
        self.size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)  # (H, W)
        self.scale = scale
        self.max_pixels = max_pixels

    def __call__(self, img: "Image.Image | Source") -> torch.Tensor:
        """``img``: a PIL image (opened, decoded or not), an image file's path, or its encoded bytes."""
        pixels = read_rgb(img, self.max_pixels)
        box, flip = random_crop(pixels, self.scale)
        return resized_crop(pixels, box, flip, self.size)

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
        out = F.interpolate(
            crop.contiguous(memory_format=torch.channels_last), size, mode="bicubic", antialias=True
        )
    else:
        out = F.interpolate(crop.float(), size, mode="bicubic", antialias=True)
        out = out.round_().clamp_(0, 255).to(torch.uint8).contiguous(memory_format=torch.channels_last)
    return out[0].flip(-1) if flip else out[0]
