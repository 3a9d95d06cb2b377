"""The semantic segmenter: UperNet (Xiao et al. 2018) over the feature pyramid on the encoder."""

import torch
from torch import nn

from mae.dense.models.pyramid import SimpleFeaturePyramid
from mae.dense.models.upernet import upsample_logits


class Segmenter(nn.Module):
    """(N, C, H, W) images in [0, 1] -> (N, num_classes, H, W) class logits: normalised, through the
    pyramid and the UperNet head, the head's logits (at the finest map, stride p / 4) upsampled to the
    input (``upsample_logits``)."""

    def __init__(self, backbone: SimpleFeaturePyramid, head: nn.Module, mean: tuple, std: tuple) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.backbone((images - self.mean) / self.std))
        return upsample_logits(logits, images.shape[-2:], self.backbone.strides[0])
