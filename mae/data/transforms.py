"""Image transforms: the pretraining augmentation of the MAE recipe and a plain evaluation view."""

from torchvision import transforms as T

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def pretrain_transform(img_size: int | tuple[int, int]) -> T.Compose:
    """RandomResizedCrop(scale 0.2-1, bicubic) + horizontal flip + ImageNet normalisation (MAE recipe).

    Images of any mode (grayscale, palette, RGBA, CMYK) are converted to RGB first.
    """
    return T.Compose(
        [
            T.Lambda(_to_rgb),
            T.RandomResizedCrop(img_size, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def eval_transform(img_size: int | tuple[int, int], crop_ratio: float = 224 / 256) -> T.Compose:
    """Resize the short side to ``img_size / crop_ratio`` (bicubic), center-crop ``img_size``, normalise."""
    size = img_size if isinstance(img_size, int) else max(img_size)
    return T.Compose(
        [
            T.Lambda(_to_rgb),
            T.Resize(int(size / crop_ratio), interpolation=T.InterpolationMode.BICUBIC),
            T.CenterCrop(img_size),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _to_rgb(img):
    return img if img.mode == "RGB" else img.convert("RGB")
