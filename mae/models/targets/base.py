"""The interface of a reconstruction target: what the decoder regresses for each patch.

A target maps (N, C, H, W) images to the (N, L, D_target) values the decoder predicts for each of the L
patches; ``MaskedAutoencoderViT`` sizes ``decoder_pred`` by its width and takes the MSE on the masked
patches against it (``mae.models.loss``). A target holds no learnable parameter and nothing in a state
dict (``features`` holds its teacher outside the module tree), so the choice never changes which weights a
checkpoint holds; it computes on the images' device. The members are in ``mae.models.targets.TARGETS``,
one file each.
"""

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import nn


class PatchTarget(nn.Module, ABC):
    """What the decoder regresses for each patch of ``patch_size`` px of ``in_chans``-channel images.

    Args:
        patch_size: patch side p in pixels.
        in_chans: image channels C.

    Attributes:
        name: the member's name in ``TARGETS`` (``model.target``).
        described: what it is, for model cards and messages ("the per-patch normalised pixels").
        pixels: whether the target is the patch's pixels (plain or normalised), so that a prediction can be
            drawn as an image.
        option_names: the options it takes beyond the patch size and channels (``MaskedAutoencoderViT``'s
            ``target_options``, recorded in its ``config``): none but for ``features``.
        dim: D_target, the width of one patch's target.
    """

    name: ClassVar[str]
    described: ClassVar[str]
    pixels: ClassVar[bool] = False
    option_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, patch_size: int, in_chans: int) -> None:
        super().__init__()
        self.check(patch_size, in_chans)
        self.patch_size = patch_size
        self.in_chans = in_chans
        self.dim = self.width(patch_size, in_chans)

    @classmethod
    def check(cls, patch_size: int, in_chans: int) -> None:
        """Raise ``ConfigError`` for a patch size or channel count this target cannot take (none here)."""

    def check_grid(self, grid_size: tuple[int, int]) -> None:
        """Raise ``ConfigError`` when this target cannot be computed for images of an (h, w) patch grid (a
        teacher that cannot map onto it; none here)."""

    @classmethod
    @abstractmethod
    def width(cls, patch_size: int, in_chans: int) -> int:
        """D_target for patches of ``patch_size`` px with ``in_chans`` channels (a target whose width is an
        option, as ``features``, overrides it on the instance)."""

    @abstractmethod
    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images -> (N, L, D_target) targets, patches row-major as ``patchify`` orders them."""

    def extra_repr(self) -> str:
        return f"patch_size={self.patch_size}, in_chans={self.in_chans}, dim={self.dim}"
