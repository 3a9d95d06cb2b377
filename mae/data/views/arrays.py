"""The recipes' views of images of any channel count and bit depth (``mae.data.decoding.arrays``): float
(C, H, W) tensors normalised by the data's mean and std.

The crops draw the same random numbers as the 8-bit RGB transforms (torchvision's
``RandomResizedCrop`` parameters, then the flip), and resize with PyTorch's antialiased bicubic
kernel on float values. RandAugment works on 8-bit RGB images only: on other data the fine-tuning
recipe is the crop (0.08-1) + flip + random erasing.
"""

import os
from typing import Literal

import torch
from timm.data.random_erasing import RandomErasing
from torchvision import transforms as T
from torchvision.transforms import functional as TF

from mae.data.decoding.image import read_pixels
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.decoding.units import chw_tensor
from mae.data.views.crop import CROP_SCALE, random_crop
from mae.errors import ConfigError

View = Literal["pretrain", "finetune", "linprobe", "eval"]


class ArrayView:
    """Read an image file as an array and return one recipe's view of it, (``in_chans``, H, W) float.

    Args:
        view: "pretrain" (RandomResizedCrop 0.2-1 + flip), "finetune" (0.08-1 + flip + random erasing),
            "linprobe" (0.08-1 + flip) or "eval" (resize to ``img_size / crop_ratio``, center crop).
        img_size: output side, or (H, W).
        in_chans: channels of the output (``mae.data.decoding.arrays.adapt_channels``).
        mean, std: per-channel normalisation, in the units of ``mae.data.decoding.arrays.to_unit_range``.
        crop_ratio: the evaluation view's crop ratio.
        re_prob: random-erasing probability of the finetune view.
        expected: (channels, dtype name) every file must have (set by the data module from a sample
            of the folder); a file that differs raises ``ValueError`` naming it.
        max_pixels: the pixel limit (``data.max_image_pixels``; None: none): a larger file, one whose
            bands take more memory than the limit allows, or one whose evaluation view would be larger
            raises ``PIL.Image.DecompressionBombError`` naming it, before it is decoded or resized.
    """

    reads_files = True  # datasets pass the file's path

    def __init__(
        self,
        view: View,
        img_size: int | tuple[int, int],
        in_chans: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        crop_ratio: float = 1.0,
        re_prob: float = 0.0,
        expected: tuple[int, str] | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        if view not in ("pretrain", "finetune", "linprobe", "eval"):
            raise ConfigError(f"unknown view {view!r}")
        self.kind = view
        self.size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.in_chans = in_chans
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.crop_ratio = crop_ratio
        self.expected = expected
        self.max_pixels = max_pixels
        self.erase = (
            RandomErasing(re_prob, mode="pixel", device="cpu") if view == "finetune" and re_prob else None
        )

    @property
    def eval_short_side(self) -> int | None:
        """The short side the evaluation view resizes an image to (then centre-crops); None for the
        training views (their crops are at most the output size)."""
        return int(max(self.size) / self.crop_ratio) if self.kind == "eval" else None

    def read(self, path: str | os.PathLike) -> torch.Tensor:
        """(in_chans, H, W) float pixels of ``path``, unnormalised (``read_pixels``); the file, and its
        evaluation view, checked against ``max_pixels`` before it is decoded."""
        return chw_tensor(
            read_pixels(path, self.in_chans, self.expected, self.max_pixels, self.eval_short_side)
        )

    def __call__(self, path: str | os.PathLike) -> torch.Tensor:
        return self.view(self.read(path))

    def view(self, pixels: torch.Tensor) -> torch.Tensor:
        """This recipe's view of (in_chans, H, W) unnormalised pixels, normalised. Pixels read otherwise
        than by ``read`` have had their evaluation view checked against the limit too (``read_image``'s
        ``view_short_side``)."""
        bicubic = T.InterpolationMode.BICUBIC
        if self.kind == "eval":
            short = self.eval_short_side
            pixels = TF.center_crop(
                TF.resize(pixels, short, interpolation=bicubic, antialias=True), list(self.size)
            )
        else:
            (top, left, h, w), flip = random_crop(pixels, CROP_SCALE[self.kind])
            pixels = TF.resized_crop(
                pixels, top, left, h, w, list(self.size), interpolation=bicubic, antialias=True
            )
            if flip:
                pixels = pixels.flip(-1)
        pixels = (pixels - self.mean) / self.std
        return self.erase(pixels) if self.erase is not None else pixels

    def __repr__(self) -> str:
        return f"ArrayView({self.kind}, size={self.size}, in_chans={self.in_chans})"
