"""UperNet's decode head over the feature pyramid, as the MAE paper uses it for ADE20K semantic
segmentation: a pyramid pooling module on the coarsest map, an FPN over the four maps, and all
levels fused at the finest one's resolution.

References: Xiao et al., "Unified Perceptual Parsing for Scene Understanding", 2018 (UperNet);
Zhao et al., "Pyramid Scene Parsing Network", 2017 (the pyramid pooling module); Lin et al.,
"Feature Pyramid Networks for Object Detection", 2017.
"""

from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.ops import Conv2dNormActivation

from mae.errors import ConfigError

LEVELS = ("0", "1", "2", "3")  # the pyramid's maps the head reads, finest first ("pool" is not used)


def _conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int) -> Conv2dNormActivation:
    return Conv2dNormActivation(in_channels, out_channels, kernel_size)  # BatchNorm, ReLU, no conv bias


def _resize(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


class PyramidPooling(nn.Module):
    """PSPNet's pyramid pooling module: the map average-pooled to ``s x s`` for each pool scale ``s``,
    projected to ``channels``, upsampled back and concatenated with the map, then fused by a 3x3 conv.

    Input (N, in_channels, h, w); output (N, channels, h, w).
    """

    def __init__(self, in_channels: int, channels: int, pool_scales: Sequence[int]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(scale), _conv_bn_relu(in_channels, channels, 1))
            for scale in pool_scales
        )
        self.bottleneck = _conv_bn_relu(in_channels + len(pool_scales) * channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = [_resize(stage(x), x.shape[-2:]) for stage in self.stages]
        return self.bottleneck(torch.cat([x, *pooled], dim=1))


class UperNetHead(nn.Module):
    """UperNet's decode head: FPN lateral 1x1 convs on the three finer maps and the pyramid pooling
    module on the coarsest, top-down addition, a 3x3 conv on each finer level, every level upsampled to
    the finest and concatenated, a 3x3 fuse conv, dropout and a 1x1 classifier. Every conv but the
    classifier is Conv-BatchNorm-ReLU; BatchNorm needs more than one image per device in training (the
    1x1 pooled map), and mmsegmentation synchronises it across devices (Lightning: ``sync_batchnorm``).

    Args:
        in_channels: channels of the four input maps (one int when they share it, as the pyramid's do).
        num_classes: output classes.
        channels: width of every internal map (mmsegmentation's UperNet for ViT-B: 512).
        pool_scales: output sides of the pyramid pooling module's average pools.
        dropout: channel dropout before the classifier.

    Input: the feature pyramid's ``OrderedDict``: (N, in_channels, h_k, w_k) maps ``"0" .. "3"``, finest
    first, each half the previous one's size (strides p/4, p/2, p, 2p); ``"pool"`` is ignored. Output:
    (N, num_classes, h_0, w_0) logits at the finest map's size (stride p/4 of the padded input: 1/4 of
    its size for p = 16); ``upsample_logits`` brings them to the image's size.
    """

    def __init__(
        self,
        in_channels: int | Sequence[int],
        num_classes: int,
        channels: int = 512,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        in_channels = [in_channels] * len(LEVELS) if isinstance(in_channels, int) else list(in_channels)
        if len(in_channels) != len(LEVELS):
            raise ConfigError(f"UperNetHead takes {len(LEVELS)} maps, got in_channels={in_channels}")
        self.num_classes = num_classes
        self.psp = PyramidPooling(in_channels[-1], channels, pool_scales)
        self.lateral_convs = nn.ModuleList(_conv_bn_relu(c, channels, 1) for c in in_channels[:-1])
        self.fpn_convs = nn.ModuleList(_conv_bn_relu(channels, channels, 3) for _ in in_channels[:-1])
        self.fpn_bottleneck = _conv_bn_relu(len(LEVELS) * channels, channels, 3)
        self.dropout = nn.Dropout2d(dropout)
        self.conv_seg = nn.Conv2d(channels, num_classes, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        nn.init.normal_(self.conv_seg.weight, std=0.01)  # small logits at the start
        nn.init.zeros_(self.conv_seg.bias)

    def forward(self, features: Mapping[str, torch.Tensor]) -> torch.Tensor:
        maps = [features[name] for name in LEVELS]
        laterals = [conv(x) for conv, x in zip(self.lateral_convs, maps, strict=False)]
        laterals.append(self.psp(maps[-1]))
        for i in range(len(laterals) - 1, 0, -1):  # top-down: each level gets the coarser one added
            laterals[i - 1] = laterals[i - 1] + _resize(laterals[i], laterals[i - 1].shape[-2:])
        outs = [conv(x) for conv, x in zip(self.fpn_convs, laterals, strict=False)]
        outs.append(laterals[-1])
        size = outs[0].shape[-2:]
        fused = self.fpn_bottleneck(torch.cat([outs[0], *(_resize(x, size) for x in outs[1:])], dim=1))
        return self.conv_seg(self.dropout(fused))


def upsample_logits(logits: torch.Tensor, size: Sequence[int], stride: float | None = None) -> torch.Tensor:
    """(N, K, H, W) logits bilinearly upsampled to an image's (H, W) ``size``.

    Args:
        logits: (N, K, h, w) logits, e.g. ``UperNetHead``'s.
        size: (H, W) of the images the logits are for.
        stride: input pixels per logit. The pyramid pads images at the right and bottom to a multiple of
            the patch size, so its maps cover more than the image: given the stride (the pyramid's
            ``strides[0]``), the logits are upsampled to the padded size and cropped to ``size``; without
            it, stretched to ``size`` (right only for unpadded inputs).
    """
    height, width = size
    if stride is None:
        return _resize(logits, (height, width))
    padded = (round(logits.shape[-2] * stride), round(logits.shape[-1] * stride))
    if padded[0] < height or padded[1] < width:
        raise ConfigError(
            f"logits of {tuple(logits.shape[-2:])} at stride {stride} do not cover {height}x{width} px"
        )
    return _resize(logits, padded)[..., :height, :width]
