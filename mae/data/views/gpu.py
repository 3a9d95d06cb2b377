"""The pretraining crop of whole batches on the training device: loader workers only read encoded
bytes, nvJPEG decodes the batch on the GPU (``torchvision.io.decode_jpeg(device="cuda")``), and the
random-resized crop and flip run there.

The crop parameters are drawn exactly as ``PretrainCrop`` draws them (torchvision's
``RandomResizedCrop.get_params``, then the flip), and ``resized_crop`` is the one both paths use, so
for the same random numbers the two give the same crop: bit-equal on the CPU. On CUDA the resize runs
in float32 (within one intensity level of the CPU kernel on the same pixels), and nvJPEG's decoded
pixels may differ slightly from libjpeg-turbo's (both are JPEG-conformant decoders).
"""

from dataclasses import dataclass
from typing import Literal

import torch
from torchvision.io import ImageReadMode, decode_jpeg

from mae.data.decoding.formats import EncodedImage
from mae.data.decoding.limits import DEFAULT_MAX_PIXELS
from mae.data.decoding.rgb import check_jpeg_size, decode_jpeg_checked, is_jpeg, read_rgb
from mae.data.views.crop import CROP_SCALE, random_crop, resized_crop
from mae.errors import ConfigError

DecodeOn = Literal["auto", "cpu", "gpu"]


def resolve_decode_on(decode_on: DecodeOn, device: torch.device, augmentation: str) -> bool:
    """Whether to decode pretraining batches on ``device`` (True) or in the loader workers (False).

    "auto" decodes on the GPU when training on CUDA with the pretraining augmentation of 8-bit RGB
    data (``augmentation`` is "array" for data read as arrays) and falls back to the workers
    otherwise; "gpu" insists.

    Raises:
        ValueError: "gpu" without a CUDA training device, or with another augmentation.
    """
    if decode_on == "cpu":
        return False
    if augmentation != "pretrain":
        if decode_on == "gpu":
            what = (
                "the data is read as arrays (not 8-bit RGB)"
                if augmentation == "array"
                else (f"data.augmentation is {augmentation!r}")
            )
            raise ConfigError(
                f"data.decode_on=gpu decodes 8-bit RGB JPEGs for the pretraining crop, but {what}; "
                "set data.decode_on: auto or cpu"
            )
        return False
    if device.type != "cuda":
        if decode_on == "gpu":
            raise ConfigError(
                f"data.decode_on=gpu needs training on a CUDA GPU, but the trainer runs on {device}; "
                "set data.decode_on: auto (decodes in the loader workers here) or cpu"
            )
        return False
    return True


@dataclass
class EncodedBatch:
    """A batch of still-encoded images: ``images`` 1-D uint8 tensors of file bytes, ``names`` to report
    them by, ``labels`` (N,)."""

    images: list[torch.Tensor]
    names: list[str]
    labels: torch.Tensor


def collate_encoded(batch: list[tuple[EncodedImage, int]]) -> EncodedBatch:
    """Collate (``EncodedImage``, label) samples without decoding them."""
    return EncodedBatch(
        [image.tensor() for image, _ in batch],
        [image.name for image, _ in batch],
        torch.tensor([label for _, label in batch]),
    )


def _decode_one(data: torch.Tensor, name: str, max_pixels: int | None, device: torch.device) -> torch.Tensor:
    """One JPEG on ``device``, or, if that decoder rejects it, on the CPU (which the shard tool checked)."""
    try:
        return decode_jpeg_checked(data, name, max_pixels, device)
    except OSError:
        if device.type == "cpu":
            raise
        return decode_jpeg_checked(data, name, max_pixels).to(device)


def decode_pretrain_batch(
    images: list[torch.Tensor],
    names: list[str],
    size: tuple[int, int],
    device: torch.device | str,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    scale: tuple[float, float] = CROP_SCALE["pretrain"],
) -> torch.Tensor:
    """MAE's pretraining view of a batch of encoded images, made on ``device``.

    Args:
        images: N 1-D uint8 tensors of encoded files (on the CPU), JPEG or any format PIL reads;
            JPEGs are decoded together on ``device``, others by PIL and moved there.
        names: the images' names, for errors.
        size: output (H, W).
        device: where to decode and crop ("cuda" for nvJPEG; "cpu" decodes with libjpeg-turbo).
        max_pixels: larger images are refused (before decoding) as decompression bombs.
        scale: range of the crop's area, as ``PretrainCrop``.

    Returns:
        uint8 (N, 3, H, W) on ``device``, channels last in memory, for ``normalize_batch``.
    """
    device = torch.device(device)
    jpeg = [i for i, data in enumerate(images) if is_jpeg(data)]
    decoded: list[torch.Tensor | None] = [None] * len(images)
    for i in jpeg:  # the whole batch is decoded at once: every header is checked first
        check_jpeg_size(images[i], names[i], max_pixels)
    if jpeg:
        try:
            batch = decode_jpeg([images[i] for i in jpeg], mode=ImageReadMode.RGB, device=device)
        except RuntimeError:  # one file nvJPEG rejects fails the batch: those go through the CPU decoder
            batch = [_decode_one(images[i], names[i], max_pixels, device) for i in jpeg]
        for i, pixels in zip(jpeg, batch, strict=True):
            decoded[i] = pixels
    for i, pixels in enumerate(decoded):
        if pixels is None:
            decoded[i] = read_rgb(EncodedImage(images[i].numpy().tobytes(), names[i]), max_pixels).to(device)
    crops = []
    for pixels in decoded:  # the random numbers in PretrainCrop's order: crop box, then flip
        box, flip = random_crop(pixels, scale)
        crops.append(resized_crop(pixels, box, flip, size).permute(1, 2, 0))
    return torch.stack(crops).permute(0, 3, 1, 2)
