"""The one check of an input size against the patch grid, for every model this package builds (the MAE,
the timm encoder of ``load_backbone``) and so for every command that takes an image size."""

from timm.layers import to_2tuple

from mae.errors import ConfigError

# The most patches one input may have: 4096 x 4096 pixels at patch 16 (ViTDet's 1024-pixel inputs have
# 4,096). Past it, the position embeddings and activations alone outgrow a machine's memory (an
# img_size of 100,000 at patch 16 asks for about 320 GB before the first block).
MAX_PATCHES = 65536


def check_img_size(img_size: int | tuple[int, int], patch_size: int) -> tuple[int, int]:
    """``img_size`` as (H, W), checked: positive, divisible by ``patch_size`` (a partial patch would be
    dropped without a word), and at most ``MAX_PATCHES`` patches.

    Raises:
        ValueError: naming ``img_size``, the patch size and a size that works.
    """
    height, width = to_2tuple(img_size)
    if height < 1 or width < 1:
        raise ConfigError(f"img_size {height}x{width} must be a positive number of pixels")
    if height % patch_size or width % patch_size:
        sides = [max(side // patch_size, 1) * patch_size for side in (height, width)]
        nearest = str(sides[0]) if sides[0] == sides[1] else f"{sides[0]}x{sides[1]}"
        raise ConfigError(
            f"img_size {height}x{width} is not divisible by patch_size {patch_size}; use a multiple of "
            f"{patch_size} (e.g. {nearest})"
        )
    patches = (height // patch_size) * (width // patch_size)
    if patches > MAX_PATCHES:
        side = int(MAX_PATCHES**0.5) * patch_size
        raise ConfigError(
            f"img_size {height}x{width} makes {patches:,} patches of {patch_size} pixels, over the "
            f"{MAX_PATCHES:,} one input may have ({side}x{side} at most): its activations would not fit in "
            "memory"
        )
    return height, width
