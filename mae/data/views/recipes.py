"""The MAE recipes' views of 8-bit RGB images: pretraining (``PretrainCrop``), fine-tuning (timm's
RandAugment + random erasing), linear probing (crop + flip) and evaluation (resize + center crop)."""

from typing import Literal

from PIL import Image
from timm.data import create_transform
from torchvision import transforms as T

from mae.data.decoding.limits import DEFAULT_MAX_PIXELS, check_view_size
from mae.data.decoding.rgb import image_name, to_rgb
from mae.data.views.crop import CROP_RATIO, CROP_SCALE, PretrainCrop
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD
from mae.errors import ConfigError

Augmentation = Literal["pretrain", "finetune", "linprobe", "none"]


class ViewSizeLimit:
    """Refuse (``PIL.Image.DecompressionBombError``, naming the file) a PIL image whose view resized
    to ``short_side`` would be over ``max_pixels`` (``mae.data.decoding.limits.check_view_size``), from its
    header, before it is decoded; the image passes unchanged."""

    def __init__(self, short_side: int, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
        self.short_side = short_side
        self.max_pixels = max_pixels

    def __call__(self, img: Image.Image) -> Image.Image:
        width, height = img.size
        check_view_size(
            image_name(img), height, width, 3, self.short_side, self.max_pixels
        )  # the view is RGB
        return img

    def __repr__(self) -> str:
        return f"ViewSizeLimit(short_side={self.short_side}, max_pixels={self.max_pixels})"


class ToRGB:
    """Convert any PIL image to 8-bit RGB (``to_rgb``: 16-bit and float images scaled, not clipped)."""

    def __call__(self, img):
        return to_rgb(img)

    def __repr__(self) -> str:
        return "ToRGB()"


def pretrain_transform(
    img_size: int | tuple[int, int], max_pixels: int | None = DEFAULT_MAX_PIXELS
) -> PretrainCrop:
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
        img_size,
        is_training=True,
        scale=CROP_SCALE["finetune"],
        ratio=CROP_RATIO,
        color_jitter=None,
        auto_augment=auto_augment,
        interpolation="bicubic",
        re_prob=re_prob,
        re_mode="pixel",
        re_count=1,
        mean=tuple(mean),
        std=tuple(std),
    )
    return T.Compose([ToRGB(), *timm_transform.transforms])


def linprobe_transform(
    img_size: int | tuple[int, int],
    mean: tuple[float, ...] = IMAGENET_MEAN,
    std: tuple[float, ...] = IMAGENET_STD,
) -> T.Compose:
    """MAE linear probing: RandomResizedCrop (0.08-1, bicubic) + flip only."""
    return T.Compose(
        [
            ToRGB(),
            T.RandomResizedCrop(img_size, CROP_SCALE["linprobe"], CROP_RATIO, T.InterpolationMode.BICUBIC),
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
    """The training transform of 8-bit RGB images in a recipe: "pretrain", "finetune", "linprobe", or "none"
    (the evaluation view: no randomness, e.g. for the no-augmentation small-data MAE runs). ``max_pixels``:
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
    raise ConfigError(
        f"data.augmentation must be 'pretrain', 'finetune', 'linprobe' or 'none', got {augmentation!r}"
    )


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
