"""torchvision's Mask R-CNN, Faster R-CNN or RetinaNet over ViTDet's simple feature pyramid, with the
R-CNN heads as ViTDet has them (Li et al. 2022)."""

from typing import Literal

import torch
from timm.layers import LayerNorm2d
from torch import nn
from torchvision.models.detection import FasterRCNN, MaskRCNN, RetinaNet
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.rpn import RPNHead

from mae.errors import ConfigError

Detector = Literal["mask_rcnn", "faster_rcnn", "retinanet"]
Target = dict[str, torch.Tensor]


def anchor_generator(
    strides: tuple[float, ...], sizes: list[float] | None, three_scales: bool
) -> AnchorGenerator:
    """One anchor size per pyramid map (default 8x its stride: torchvision's 32 .. 512 px for p = 16),
    aspect ratios 0.5, 1, 2; RetinaNet's three scales per octave (x, x 2^(1/3), x 2^(2/3)) when asked."""
    sizes = sizes or [8 * stride for stride in strides]
    if len(sizes) != len(strides):
        raise ConfigError(f"model.anchor_sizes needs one size per pyramid map ({len(strides)}), got {sizes}")
    octave = (1.0, 2 ** (1 / 3), 2 ** (2 / 3)) if three_scales else (1.0,)
    return AnchorGenerator(
        tuple(tuple(s * o for o in octave) for s in sizes), ((0.5, 1.0, 2.0),) * len(sizes)
    )


def build_detector(
    kind: Detector,
    backbone: nn.Module,
    num_classes: int,
    img_size: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    anchor_sizes: list[float] | None,
    detections_per_image: int,
    head_channels: int = 256,
    rois_per_image: int = 512,
    proposals_per_image: int = 1000,
) -> nn.Module:
    """torchvision's detector ``kind`` on ``backbone`` (a ``SimpleFeaturePyramid``), resizing every
    image to ``img_size`` on its longer side; the R-CNN heads as ViTDet has them (two convolutions in
    the RPN head, a 4-conv + 1-fc box head and a 4-conv mask head, with LayerNorms; torchvision's v2
    heads), their convolutions ``head_channels`` wide (ViTDet: 256; the fc 4x that), trained on
    ``rois_per_image`` sampled proposals per image (ViTDet: 512) of the RPN's ``proposals_per_image``
    best after non-maximum suppression (ViTDet and detectron2: 1000, in training and inference)."""
    common = dict(min_size=img_size, max_size=img_size, image_mean=list(mean), image_std=list(std))
    anchors = anchor_generator(backbone.strides, anchor_sizes, three_scales=kind == "retinanet")
    if kind == "retinanet":
        return RetinaNet(
            backbone, num_classes, anchor_generator=anchors, detections_per_img=detections_per_image, **common
        )
    channels = backbone.out_channels
    heads = dict(
        rpn_anchor_generator=anchors,
        rpn_head=RPNHead(channels, anchors.num_anchors_per_location()[0], conv_depth=2),
        rpn_pre_nms_top_n_train=2 * proposals_per_image,
        rpn_pre_nms_top_n_test=proposals_per_image,
        rpn_post_nms_top_n_train=proposals_per_image,
        rpn_post_nms_top_n_test=proposals_per_image,
        box_head=FastRCNNConvFCHead(
            (channels, 7, 7), [head_channels] * 4, [4 * head_channels], norm_layer=LayerNorm2d
        ),
        box_predictor=FastRCNNPredictor(4 * head_channels, num_classes),
        box_batch_size_per_image=rois_per_image,
        box_detections_per_img=detections_per_image,
    )
    if kind == "faster_rcnn":
        return FasterRCNN(backbone, None, **heads, **common)
    if kind == "mask_rcnn":
        mask_head = MaskRCNNHeads(channels, [head_channels] * 4, 1, norm_layer=LayerNorm2d)
        mask_predictor = MaskRCNNPredictor(head_channels, head_channels, num_classes)
        return MaskRCNN(backbone, None, mask_head=mask_head, mask_predictor=mask_predictor, **heads, **common)
    raise ConfigError(f"model.detector must be one of mask_rcnn, faster_rcnn, retinanet; got {kind!r}")
