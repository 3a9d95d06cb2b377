"""Image transforms of the MAE recipes: pretraining, fine-tuning, linear probing, evaluation."""

from typing import Literal

from timm.data import create_transform
from torchvision import transforms as T

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
Augmentation = Literal["pretrain", "finetune", "linprobe", "none"]


class ToRGB:
    """Convert any PIL mode (grayscale, palette, RGBA, CMYK) to RGB."""

    def __call__(self, img):
        return img if img.mode == "RGB" else img.convert("RGB")

    def __repr__(self) -> str:
        return "ToRGB()"


def pretrain_transform(img_size: int | tuple[int, int]) -> T.Compose:
    """RandomResizedCrop(scale 0.2-1, bicubic) + horizontal flip + ImageNet normalisation (MAE pretraining)."""
    return T.Compose(
        [
            ToRGB(),
            T.RandomResizedCrop(img_size, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


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
