"""A pretrained CNN as a dense-prediction backbone: its own stride-4, 8, 16 and 32 maps under a feature
pyramid network (Lin et al., "Feature Pyramid Networks for Object Detection", 2017), as detection and
segmentation take a ResNet or a ConvNeXt (SparK and ConvNeXt-V2 transfer to COCO with Mask R-CNN on it).

The CNN needs no pyramid built from one map, as the ViT's ``SimpleFeaturePyramid`` does: its last four
stages give the four maps (``forward_intermediates``, timm's own, so a pretrained state dict keeps its
keys; ``features_only=True`` would rename ConvNeXt's). torchvision's ``FeaturePyramidNetwork`` projects
each to ``out_channels`` (1x1 lateral and 3x3 output convolutions, the top-down pathway between them) and
its ``LastLevelMaxPool`` adds a fifth map, so the output is the same ``OrderedDict`` ``{"0", "1", "2", "3",
"pool"}`` with ``out_channels`` and ``strides``: ``FasterRCNN``, ``MaskRCNN``, ``RetinaNet`` and the
UperNet segmenter take either pyramid alike.
"""

from collections import OrderedDict

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.ops import FeaturePyramidNetwork
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from mae.errors import ConfigError

LEVELS = 4  # the CNN's last four stages: strides 4, 8, 16, 32 for a ResNet or a ConvNeXt


def cnn_name(encoder: nn.Module) -> str:
    """The timm name of ``encoder`` (its ``pretrained_cfg``'s architecture), else its class name."""
    return (getattr(encoder, "pretrained_cfg", None) or {}).get("architecture") or type(encoder).__name__


class CNNFeaturePyramid(nn.Module):
    """A timm CNN's last four stage maps under torchvision's FPN.

    Args:
        encoder: a timm CNN with ``forward_intermediates`` and ``feature_info`` (``mae.load_backbone``'s for a
            CNN checkpoint: a ResNet, a ConvNeXt). The pyramid owns it and prunes it
            (``prune_intermediate_layers``): its classifier head and final norm are removed, so every
            parameter left gets a gradient (as DDP requires).
        out_channels: channels of every output map (256 in the FPN paper and torchvision).
        grad_checkpointing: timm's activation checkpointing of the encoder's stages.
        pretraining_size: (H, W) the encoder was pretrained at, for ``detector_sizes``; None: 224.

    Input: (N, C, H, W) images of any size; the right and bottom are zero-padded to a multiple of the
    largest stride (the maps cover the padded image). Output: ``OrderedDict`` of (N, out_channels, h_k, w_k)
    maps ``"0", "1", "2", "3", "pool"`` (``mae.dense.models.pyramid.FEATURE_NAMES``) with strides
    ``strides`` (4, 8, 16, 32 and 64 for a ResNet or ConvNeXt). No input-size guard (the ViT pyramid's
    ``max_tokens``): a CNN's cost grows with the pixels only, and 800 px is its usual detection size.
    """

    def __init__(
        self,
        encoder: nn.Module,
        out_channels: int = 256,
        grad_checkpointing: bool = False,
        pretraining_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        info = getattr(encoder, "feature_info", None)
        if info is None or not hasattr(encoder, "forward_intermediates") or len(info) < LEVELS:
            raise ConfigError(
                f"{cnn_name(encoder)} gives no {LEVELS} multi-scale maps (timm's forward_intermediates and "
                "feature_info): the CNN pyramid needs a ResNet, a ConvNeXt or another timm CNN that has them"
            )
        self.indices = list(range(len(info) - LEVELS, len(info)))
        encoder.prune_intermediate_layers(self.indices, prune_norm=True, prune_head=True)
        encoder.set_grad_checkpointing(grad_checkpointing)
        self.encoder = encoder
        self.grad_checkpointing = grad_checkpointing
        self.reductions = tuple(int(info[i]["reduction"]) for i in self.indices)
        channels = [int(info[i]["num_chs"]) for i in self.indices]
        self.pretraining_size = tuple(pretraining_size or (224, 224))
        self.out_channels = out_channels
        self.fpn = FeaturePyramidNetwork(channels, out_channels, extra_blocks=LastLevelMaxPool())

    @property
    def vit(self) -> nn.Module:
        """The encoder, by the name ``SimpleFeaturePyramid`` gives its own."""
        return self.encoder

    @property
    def strides(self) -> tuple[float, ...]:
        """Each output map's stride in input pixels, in ``FEATURE_NAMES`` order."""
        return (*(float(r) for r in self.reductions), 2.0 * self.reductions[-1])

    def detector_sizes(self) -> dict[str, int]:
        """``min_size`` / ``max_size`` for a torchvision detector on this pyramid: every image resized to the
        encoder's pretraining size on its longer side (``MaskRCNN(pyramid, num_classes, **sizes)``)."""
        side = max(self.pretraining_size)
        return {"min_size": side, "max_size": side}

    def pad(self, images: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) zero-padded at the right and bottom to a multiple of the largest stride."""
        step = self.reductions[-1]
        height, width = images.shape[-2:]
        return F.pad(images, (0, -width % step, 0, -height % step))

    def forward(self, images: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        maps = self.encoder.forward_intermediates(
            self.pad(images), indices=self.indices, intermediates_only=True
        )
        # torchvision names the maps as given and its LastLevelMaxPool's "pool": "0", "1", "2", "3", "pool"
        return self.fpn(OrderedDict((str(level), features) for level, features in enumerate(maps)))
