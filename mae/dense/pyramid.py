"""The pretrained encoder as a dense-prediction backbone: ViTDet's simple feature pyramid over a plain
ViT (Li et al., "Exploring Plain Vision Transformer Backbones for Object Detection", 2022, Fig. 2c).

From one stride-``p`` map (the last block's, or a chosen block's) the pyramid builds maps at 4x, 2x,
1x and 1/2x that resolution: two 2x2 stride-2 deconvolutions (LayerNorm and GELU between them), one,
none, and a 2x2 max-pool. Each is projected to ``out_channels`` by a 1x1 and a 3x3 convolution, each
followed by a LayerNorm over channels, as ViTDet does; a last map max-pooled from the coarsest one
(detectron2's and torchvision's ``LastLevelMaxPool``) makes five. The output is the ``OrderedDict``
``{"0", "1", "2", "3", "pool"}`` with ``out_channels``, the interface of torchvision's FPN backbones,
so ``FasterRCNN``, ``MaskRCNN`` and ``RetinaNet`` take it as ``backbone=`` as they are.
"""

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from timm.layers import LayerNorm2d
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.nn import functional as F

from mae.convert.backbone import load_backbone

# The pyramid's scales relative to the ViT's stride-p map (ViTDet: strides 4, 8, 16, 32 for p = 16).
SCALES = (4.0, 2.0, 1.0, 0.5)
FEATURE_NAMES = ("0", "1", "2", "3", "pool")  # torchvision's FPN backbone keys


def _rescale(dim: int, scale: float) -> tuple[nn.Module, int]:
    """(module, channels out) that turns a (N, dim, h, w) map into one at ``scale`` x its resolution."""
    if scale == 4.0:
        layers = nn.Sequential(
            nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), LayerNorm2d(dim // 2), nn.GELU(),
            nn.ConvTranspose2d(dim // 2, dim // 4, 2, stride=2),
        )  # fmt: skip
        return layers, dim // 4
    if scale == 2.0:
        return nn.ConvTranspose2d(dim, dim // 2, 2, stride=2), dim // 2
    if scale == 1.0:
        return nn.Identity(), dim
    if scale == 0.5:
        return nn.MaxPool2d(2, stride=2), dim
    raise ValueError(f"pyramid scale {scale} is not one of {SCALES}")


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid over a timm ``VisionTransformer``.

    Args:
        vit: the encoder (``mae.load_backbone``'s, or any timm ViT) built with ``dynamic_img_size=True``:
            it is run on all patches, its position embeddings resampled to each input's patch grid.
        out_channels: channels of every output map (ViTDet: 256).
        block: the block whose output feeds the pyramid (default: the last; ViTDet uses the last).
        activation_checkpointing: recompute each block's activations in the backward pass instead of
            keeping them (timm's gradient checkpointing): far less memory at detection sizes (1024 px),
            about a third more compute.

    Input: (N, C, H, W) images of any size; the right and bottom are zero-padded to a multiple of the
    patch size (the maps cover the padded image). Output: ``OrderedDict`` of (N, out_channels, h_k, w_k)
    maps with strides ``p / 4``, ``p / 2``, ``p``, ``2p`` and ``4p`` (``strides``).
    """

    def __init__(
        self,
        vit: VisionTransformer,
        out_channels: int = 256,
        block: int | None = None,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        depth = len(vit.blocks)
        self.block = depth - 1 if block is None else block
        if not 0 <= self.block < depth:
            raise ValueError(f"pyramid block {block} is not one of the encoder's {depth} blocks (0 .. {depth - 1})")
        dim = vit.embed_dim
        if dim % 4:
            raise ValueError(f"the encoder's width {dim} must be divisible by 4 for the 4x deconvolutions")
        if not getattr(vit, "dynamic_img_size", False):
            raise ValueError(
                "the feature pyramid takes inputs of any size: build its encoder with dynamic_img_size=True "
                "(mae.load_backbone(..., dynamic_img_size=True), as mae.dense.pyramid.feature_pyramid does)"
            )
        vit.set_grad_checkpointing(activation_checkpointing)
        self.vit = vit
        self.patch_size = vit.patch_embed.patch_size  # (ph, pw)
        self.out_channels = out_channels
        self.rescale = nn.ModuleList()
        self.project = nn.ModuleList()
        for scale in SCALES:
            rescale, channels = _rescale(dim, scale)
            self.rescale.append(rescale)
            self.project.append(
                nn.Sequential(
                    nn.Conv2d(channels, out_channels, 1, bias=False),
                    LayerNorm2d(out_channels),
                    nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                    LayerNorm2d(out_channels),
                )  # fmt: skip
            )

    @property
    def strides(self) -> tuple[float, ...]:
        """Each output map's stride in input pixels, in ``FEATURE_NAMES`` order."""
        p = self.patch_size[0]
        return (*(p / scale for scale in SCALES), p * 4.0)

    def pad(self, images: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) zero-padded at the right and bottom to a multiple of the patch size."""
        ph, pw = self.patch_size
        height, width = images.shape[-2:]
        return F.pad(images, (0, -width % pw, 0, -height % ph))

    def forward(self, images: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        ph, pw = self.patch_size
        if images.shape[-2] <= ph or images.shape[-1] <= pw:  # the 1/2x map needs 2 patches a side
            raise ValueError(
                f"images of {images.shape[-2]}x{images.shape[-1]} px are too small for the feature pyramid: it "
                f"needs more than one {ph}x{pw} patch along each side (at least {ph + 1}x{pw + 1} px)"
            )
        (features,) = self.vit.forward_intermediates(
            self.pad(images), indices=[self.block], stop_early=True, intermediates_only=True
        )  # (N, D, H / p, W / p)
        maps = [project(rescale(features)) for rescale, project in zip(self.rescale, self.project, strict=True)]
        maps.append(F.max_pool2d(maps[-1], kernel_size=1, stride=2))  # torchvision's LastLevelMaxPool
        return OrderedDict(zip(FEATURE_NAMES, maps, strict=True))


def feature_pyramid(
    source: "str | Path",
    out_channels: int = 256,
    block: int | None = None,
    activation_checkpointing: bool = False,
    **backbone_kwargs: Any,
) -> SimpleFeaturePyramid:
    """A ``SimpleFeaturePyramid`` over the pretrained encoder of ``source`` (any checkpoint format
    ``mae.load_backbone`` reads; ``backbone_kwargs`` go to it: ``in_chans``, ``drop_path_rate``, ...)."""
    vit = load_backbone(source, dynamic_img_size=True, **backbone_kwargs)
    return SimpleFeaturePyramid(vit, out_channels, block, activation_checkpointing)
