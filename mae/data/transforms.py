"""Image transforms of the MAE recipes: pretraining, fine-tuning, linear probing, evaluation."""

import functools
from typing import Literal

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform
from torch.nn import functional as F
from torchvision import transforms as T
from torchvision.io import ImageReadMode, decode_jpeg, read_file

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
Augmentation = Literal["pretrain", "finetune", "linprobe", "none"]


class ToRGB:
    """Convert any PIL mode (grayscale, palette, RGBA, CMYK) to RGB."""

    def __call__(self, img):
        return img if img.mode == "RGB" else img.convert("RGB")

    def __repr__(self) -> str:
        return "ToRGB()"


class PretrainCrop:
    """MAE pretraining augmentation: RandomResizedCrop (scale 0.2-1, bicubic) + horizontal flip, as a
    uint8 (C, H, W) tensor; ``normalize_batch`` turns a batch of them into model input.

    Draws the same random numbers as torchvision's ``RandomResizedCrop`` + ``RandomHorizontalFlip`` on
    a PIL image and gives the same pixels to within two intensity levels of 255 (0.01 on average).
    It is about 2x faster per worker at 224 px (``benchmarks/dataloader.py``): JPEG files are decoded by
    torchvision's libjpeg-turbo decoder straight into a tensor, the bicubic resize is PyTorch's
    vectorised uint8 kernel (antialiased, PIL's filter), and no float image is made per sample, so
    workers also ship a quarter of the bytes. Other images (PNG, in-memory CIFAR, ...) are converted from PIL.

    Args:
        img_size: output side, or (H, W).
        scale: range of the crop's area as a fraction of the image.
    """

    ratio = (3 / 4, 4 / 3)

    def __init__(self, img_size: int | tuple[int, int], scale: tuple[float, float] = (0.2, 1.0)):
        self.size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)  # (H, W)
        self.scale = scale

    def __call__(self, img: Image.Image) -> torch.Tensor:
        top, left, h, w = T.RandomResizedCrop.get_params(img, list(self.scale), list(self.ratio))
        flip = torch.rand(1).item() < 0.5
        pixels = _decode_rgb(img)[:, top : top + h, left : left + w]
        pixels = F.interpolate(
            pixels[None].contiguous(memory_format=torch.channels_last), self.size, mode="bicubic", antialias=True
        )[0]
        return pixels.flip(-1) if flip else pixels

    def __repr__(self) -> str:
        return f"PretrainCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, bicubic, flip=0.5)"


def _decode_rgb(img: Image.Image) -> torch.Tensor:
    """(3, H, W) uint8 pixels of a (possibly not yet decoded) PIL image."""
    path = getattr(img, "filename", "")
    if img.format == "JPEG" and path:
        img.close()  # PIL read only the header; decode the file's bytes with libjpeg-turbo directly
        try:
            return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)
        except RuntimeError as err:  # corrupt or truncated: PIL's error type, so loaders can skip the file
            raise OSError(f"cannot decode JPEG {path}: {err}") from err
    if img.mode != "RGB":
        img = img.convert("RGB")
    return torch.from_numpy(np.array(img)).permute(2, 0, 1)


def normalize_batch(imgs: torch.Tensor) -> torch.Tensor:
    """uint8 (N, C, H, W) in [0, 255] -> float ImageNet-normalised; float batches pass unchanged."""
    if imgs.dtype != torch.uint8:
        return imgs
    mean, inv_std = _normalization_constants(imgs.device)
    return imgs.float().sub_(mean).mul_(inv_std)  # one new tensor, two in-place passes


@functools.cache
def _normalization_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, 3, 1, 1) mean and 1/std in 0-255 units, made once per device (no copy to it every step)."""
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, -1, 1, 1) * 255
    return mean, 1 / (torch.tensor(IMAGENET_STD, device=device).view(1, -1, 1, 1) * 255)


def pretrain_transform(img_size: int | tuple[int, int]) -> PretrainCrop:
    """MAE pretraining: RandomResizedCrop (0.2-1, bicubic) + flip, uint8 out (see ``PretrainCrop``)."""
    return PretrainCrop(img_size)


def finetune_transform(
    img_size: int | tuple[int, int], auto_augment: str | None = "rand-m9-mstd0.5-inc1", re_prob: float = 0.25
) -> T.Compose:
    """MAE fine-tuning: timm's RandomResizedCrop (0.08-1, bicubic) + flip + RandAugment + random erasing."""
    timm_transform = create_transform(
        img_size, is_training=True, color_jitter=None, auto_augment=auto_augment, interpolation="bicubic",
        re_prob=re_prob, re_mode="pixel", re_count=1, mean=IMAGENET_MEAN, std=IMAGENET_STD,
    )  # fmt: skip
    return T.Compose([ToRGB(), *timm_transform.transforms])


def linprobe_transform(img_size: int | tuple[int, int]) -> T.Compose:
    """MAE linear probing: RandomResizedCrop (0.08-1, bicubic) + flip only."""
    return T.Compose(
        [
            ToRGB(),
            T.RandomResizedCrop(img_size, interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def train_transform(
    augmentation: Augmentation,
    img_size: int | tuple[int, int],
    auto_augment: str | None = "rand-m9-mstd0.5-inc1",
    re_prob: float = 0.25,
) -> T.Compose:
    """The training transform of a recipe: "pretrain", "finetune", "linprobe", or "none" (the
    evaluation view: no randomness, e.g. for the no-augmentation small-data MAE runs)."""
    if augmentation == "pretrain":
        return pretrain_transform(img_size)
    if augmentation == "finetune":
        return finetune_transform(img_size, auto_augment, re_prob)
    if augmentation == "linprobe":
        return linprobe_transform(img_size)
    if augmentation == "none":
        return eval_transform(img_size, crop_ratio=1.0)
    raise ValueError(f"data.augmentation must be 'pretrain', 'finetune', 'linprobe' or 'none', got {augmentation!r}")


def eval_transform(img_size: int | tuple[int, int], crop_ratio: float = 224 / 256) -> T.Compose:
    """Resize the short side to ``img_size / crop_ratio`` (bicubic), center-crop ``img_size``, normalise."""
    size = img_size if isinstance(img_size, int) else max(img_size)
    return T.Compose(
        [
            ToRGB(),
            T.Resize(int(size / crop_ratio), interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(img_size),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
