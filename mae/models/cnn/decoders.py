"""The decoders of CNN masked pretraining: one interface (``CNNDecoder``) and one table (``CNN_DECODERS``).

A decoder takes the encoder's sparse feature maps (masked positions zero) and the visible cells, fills
the masked positions with learned mask tokens ("densifies") and predicts the (N, L, D_target) target of
every cell of the mask grid, as the ViT decoder predicts every patch.

- ``spark``: SparK's light hierarchical decoder (Tian et al., ICLR 2023, Sec. 3.3 and its ``LightDecoder``):
  each of the encoder's last four scales densified (a sparse norm, mask tokens, a projection), then, from
  the coarsest, upsampling blocks (a 4x4 stride-2 transposed convolution, two 3x3 conv-BN-ReLU6) that add
  each finer scale on the way, halving the width each time, up to the input's resolution, and a 1x1
  convolution to pixels. It draws pixels, so it takes the pixel targets only.
- ``fcmae``: ConvNeXt-V2's FCMAE decoder (Woo et al., CVPR 2023, Sec. 3.1): the last scale projected
  (1x1) to the decoder width, mask tokens at the masked cells, ConvNeXt-V2 blocks (one in the paper) and a
  1x1 convolution to each cell's target; any target of ``mae.models.targets``.
"""

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from timm.layers import LayerNorm2d, trunc_normal_
from timm.models.convnext import ConvNeXtBlock
from torch import nn

from mae.errors import ConfigError
from mae.models.cnn.sparse import MaskContext, SparseBatchNorm2d
from mae.models.targets.pixel import patchify


@dataclass(frozen=True)
class DecoderShape:
    """What a decoder is built for.

    Attributes:
        channels: C_i of each encoder map, finest first.
        reductions: the input's stride of each map (px per position), finest first.
        mask_unit: px of one mask cell (the patch of the loss).
        in_chans: image channels C.
        target_dim: D_target, one cell's target width.
        width: the decoder's width (``spark``: at the coarsest scale, halved per upsampling).
        depth: the decoder's blocks (``fcmae``; ``spark`` has one per doubling of resolution).
        batch_norm: whether the encoder normalises with BatchNorm (else LayerNorm): the densifying norm
            follows it, as in SparK.
    """

    channels: tuple[int, ...]
    reductions: tuple[int, ...]
    mask_unit: int
    in_chans: int
    target_dim: int
    width: int
    depth: int
    batch_norm: bool


class CNNDecoder(nn.Module, ABC):
    """Sparse multi-scale maps -> (N, L, D_target) predictions on the mask grid, built for a
    ``DecoderShape``; ``context`` is the encoder's ``MaskContext`` (the visible cells of the batch)."""

    name: ClassVar[str]
    pixels_only: ClassVar[bool] = False

    def __init__(self, shape: DecoderShape, context: MaskContext) -> None:
        super().__init__()
        self.shape = shape
        self.context = [context]  # a list: the context is not a submodule

    @abstractmethod
    def forward(self, maps: list[torch.Tensor], visible: torch.Tensor) -> torch.Tensor:
        """``maps``: the encoder's (N, C_i, H_i, W_i), finest first, zero at masked positions; ``visible``:
        (N, 1, h, w) bool on the mask grid. Returns (N, L = h*w, D_target), cells row-major."""


class SparKDecoder(CNNDecoder):
    """SparK's light hierarchical decoder."""

    name = "spark"
    pixels_only = True
    scales = 4  # SparK decodes from the encoder's last four scales

    def __init__(self, shape: DecoderShape, context: MaskContext) -> None:
        super().__init__(shape, context)
        width, channels, reductions = (
            shape.width,
            shape.channels[-self.scales :],
            shape.reductions[-self.scales :],
        )
        ups = round(math.log2(reductions[-1]))
        if 2**ups != reductions[-1] or width % 2**ups:
            raise ConfigError(
                f"the spark decoder doubles the resolution {ups} times from stride {reductions[-1]}, halving "
                f"its width each time: model.model_kwargs.decoder_width {width} must be divisible by {2**ups}"
            )
        widths = [width // 2**i for i in range(ups + 1)]  # coarsest first
        self.reductions = reductions[::-1]  # coarsest first, as the decoder goes
        halving = [reductions[-1] // 2**i for i in range(len(reductions))]
        if list(self.reductions) != halving:
            raise ConfigError(
                f"the spark decoder adds the encoder's last {len(reductions)} maps at strides "
                f"{', '.join(map(str, halving))}; this encoder's are at "
                f"{', '.join(map(str, self.reductions))}: "
                "take model.model_kwargs.decoder fcmae, which reads the last map only"
            )
        self.densify_norms = nn.ModuleList()
        self.densify_projs = nn.ModuleList()
        self.mask_tokens = nn.ParameterList()
        for i, (chans, reduction) in enumerate(zip(channels[::-1], self.reductions, strict=True)):
            out = widths[round(math.log2(reductions[-1] // reduction))]
            norm = SparseBatchNorm2d(chans) if shape.batch_norm else LayerNorm2d(chans)
            if shape.batch_norm:
                norm.mask_context = context
            self.densify_norms.append(norm)
            self.mask_tokens.append(nn.Parameter(torch.zeros(1, chans, 1, 1)))
            if i == 0 and chans == out:
                self.densify_projs.append(nn.Identity())
            else:
                kernel = 1 if i == 0 else 3
                self.densify_projs.append(nn.Conv2d(chans, out, kernel, padding=kernel // 2))
        self.blocks = nn.ModuleList(
            _UpBlock(cin, cout) for cin, cout in zip(widths[:-1], widths[1:], strict=True)
        )
        self.proj = nn.Conv2d(widths[-1], shape.target_dim // shape.mask_unit**2, kernel_size=1)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """SparK's: truncated-normal(0.02) convolutions, zero biases, Kaiming-normal transposed convolutions,
        unit norms, truncated-normal(0.02) mask tokens."""
        for m in self.modules():
            if isinstance(m, nn.ConvTranspose2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in")
            elif isinstance(m, nn.Conv2d):
                trunc_normal_(m.weight, std=0.02)
            elif isinstance(m, nn.BatchNorm2d | nn.LayerNorm):
                nn.init.ones_(m.weight)
            if isinstance(m, nn.Conv2d | nn.ConvTranspose2d | nn.BatchNorm2d | nn.LayerNorm):
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for token in self.mask_tokens:
            trunc_normal_(token, std=0.02)

    def forward(self, maps: list[torch.Tensor], visible: torch.Tensor) -> torch.Tensor:
        maps = maps[-self.scales :][::-1]  # coarsest first
        x = 0
        for i, block in enumerate(self.blocks):
            if i < len(maps):
                x = x + self.densify(i, maps[i])
            x = block(x)
        image = self.proj(x)  # (N, C, H, W)
        return patchify(image, self.shape.mask_unit)

    def densify(self, i: int, features: torch.Tensor) -> torch.Tensor:
        """Scale ``i`` (coarsest 0) of the encoder, normalised over its visible positions, mask tokens at
        the masked ones, projected to the decoder's width there."""
        features = self.densify_norms[i](features)
        visible = self.context[0].at(features.shape[-2:])  # set by the model's forward
        features = torch.where(visible, features, self.mask_tokens[i].to(features.dtype))
        return self.densify_projs[i](features)


class _UpBlock(nn.Module):
    """SparK's UNet block: x2 upsampling (4x4 stride-2 transposed convolution), then two 3x3 convolutions
    with BatchNorm, the first followed by ReLU6: (N, C_in, H, W) -> (N, C_out, 2H, 2W)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up_sample = nn.ConvTranspose2d(cin, cin, kernel_size=4, stride=2, padding=1)
        self.conv = nn.Sequential(
            nn.Conv2d(cin, cin, 3, padding=1, bias=False),
            nn.BatchNorm2d(cin),
            nn.ReLU6(inplace=True),
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.up_sample(x))


class FCMAEDecoder(CNNDecoder):
    """ConvNeXt-V2's FCMAE decoder; the last scale is taken at the mask grid
    (repeated where the grid is finer than the encoder's last stride)."""

    name = "fcmae"

    def __init__(self, shape: DecoderShape, context: MaskContext) -> None:
        super().__init__(shape, context)
        width = shape.width
        self.proj = nn.Conv2d(shape.channels[-1], width, kernel_size=1)
        self.mask_token = nn.Parameter(torch.zeros(1, width, 1, 1))
        self.blocks = nn.Sequential(
            *[ConvNeXtBlock(width, use_grn=True, ls_init_value=None) for _ in range(shape.depth)]
        )
        self.pred = nn.Conv2d(width, shape.target_dim, kernel_size=1)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """ConvNeXt-V2's: truncated-normal(0.02) convolutions and linears, zero biases, normal(0.02) mask
        token."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, maps: list[torch.Tensor], visible: torch.Tensor) -> torch.Tensor:
        x = maps[-1]
        if x.shape[-2:] != visible.shape[-2:]:  # a mask grid finer than the last stride
            x = nn.functional.interpolate(x, size=visible.shape[-2:], mode="nearest")
        x = self.proj(x)
        x = torch.where(visible, x, self.mask_token.to(x.dtype))
        x = self.pred(self.blocks(x))  # (N, D_target, h, w)
        return x.flatten(2).transpose(1, 2)


CNN_DECODERS: dict[str, type[CNNDecoder]] = {cls.name: cls for cls in (SparKDecoder, FCMAEDecoder)}
