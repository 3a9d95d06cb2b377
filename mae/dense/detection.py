"""The detection / instance-segmentation ``LightningModule``: torchvision's Mask R-CNN, Faster R-CNN or
RetinaNet over ViTDet's simple feature pyramid on the pretrained encoder (Li et al. 2022, the MAE
paper's section 5 COCO transfer)."""

from typing import Any, Literal

import torch
from timm.layers import LayerNorm2d
from torch import nn
from torchvision.models.detection import FasterRCNN, MaskRCNN, RetinaNet
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.rpn import RPNHead

from mae.dense.detection_metrics import DetectionMetrics
from mae.dense.figures import detection_panel
from mae.dense.module import DenseTrainingModule

Detector = Literal["mask_rcnn", "faster_rcnn", "retinanet"]
Target = dict[str, torch.Tensor]


def anchor_generator(strides: tuple[float, ...], sizes: list[float] | None, three_scales: bool) -> AnchorGenerator:
    """One anchor size per pyramid map (default 8x its stride: torchvision's 32 .. 512 px for p = 16),
    aspect ratios 0.5, 1, 2; RetinaNet's three scales per octave (x, x 2^(1/3), x 2^(2/3)) when asked."""
    sizes = sizes or [8 * stride for stride in strides]
    if len(sizes) != len(strides):
        raise ValueError(f"model.anchor_sizes needs one size per pyramid map ({len(strides)}), got {sizes}")
    octave = (1.0, 2 ** (1 / 3), 2 ** (2 / 3)) if three_scales else (1.0,)
    return AnchorGenerator(tuple(tuple(s * o for o in octave) for s in sizes), ((0.5, 1.0, 2.0),) * len(sizes))


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
        return RetinaNet(backbone, num_classes, anchor_generator=anchors, detections_per_img=detections_per_image,
                         **common)  # fmt: skip
    channels = backbone.out_channels
    heads = dict(
        rpn_anchor_generator=anchors,
        rpn_head=RPNHead(channels, anchors.num_anchors_per_location()[0], conv_depth=2),
        rpn_pre_nms_top_n_train=2 * proposals_per_image,
        rpn_pre_nms_top_n_test=proposals_per_image,
        rpn_post_nms_top_n_train=proposals_per_image,
        rpn_post_nms_top_n_test=proposals_per_image,
        box_head=FastRCNNConvFCHead((channels, 7, 7), [head_channels] * 4, [4 * head_channels], norm_layer=LayerNorm2d),
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
    raise ValueError(f"model.detector must be one of mask_rcnn, faster_rcnn, retinanet; got {kind!r}")


class MAEDetectionModule(DenseTrainingModule):
    """Object detection (and instance segmentation with Mask R-CNN) from a pretrained MAE encoder.

    Batches are ``(images, targets)``: lists of (3, H, W) images in [0, 1] and torchvision target dicts
    (``boxes`` (K, 4) xyxy px, ``labels`` (K,) in 1 .. num_classes - 1, ``masks`` (K, H, W)); see
    ``mae.dense.detection_data``. Logs every loss of the detector as ``train/<loss>`` and their sum as
    ``train/loss``; validation logs COCO mAP (``mae.dense.detection_metrics``).

    Args:
        checkpoint: pretrained weights (any format ``mae.load_backbone`` reads); None: a random encoder
            of size ``model`` (with ``model_kwargs``).
        checkpoint_format, model, model_kwargs: as in ``MAEFinetuneModule``.
        img_size: every image is resized to this size on its longer side (ViTDet: 1024); linked from
            ``data.img_size``.
        in_chans: linked from the data module.
        num_classes: with the background (categories + 1); linked from the data module.
        detector: "mask_rcnn" (ViTDet's), "faster_rcnn" or "retinanet".
        out_channels, block, window_size, global_blocks, relative_position, activation_checkpointing, scales:
            the pyramid's (``mae.dense.pyramid.SimpleFeaturePyramid``; ViTDet ViT-B: 256, last block, window
            14, global blocks 2, 5, 8, 11, relative positions on).
        anchor_sizes: one anchor size in px per pyramid map (default 8x each map's stride).
        detections_per_image: kept after non-maximum suppression (COCO: 100).
        head_channels: width of the R-CNN heads' convolutions (ViTDet: 256).
        rois_per_image: proposals sampled per image to train the box and mask heads (ViTDet: 512).
        proposals_per_image: the RPN's proposals kept after non-maximum suppression, per image (1000);
            the box head runs on all of them at inference.
        drop_path_rate: stochastic depth in the encoder (ViTDet ViT-B: 0.1).
        layer_decay: layer-wise lr decay on the encoder (ViTDet ViT-B: 0.7).
        base_lr, lr, min_lr, warmup_epochs, weight_decay: AdamW with warmup + cosine, as
            ``MAEFinetuneModule`` (``lr = base_lr x batch / 256`` unless ``lr`` is given).
        mean, std: input normalisation; None: the pretraining run's (from the checkpoint), else ImageNet's.
        attention, compile, fused_adamw: kernel choices, as the other modules.
    """

    network_attribute = "detector"

    def __init__(
        self,
        checkpoint: str | None = None,
        checkpoint_format: str = "auto",
        model: str = "mae_vit_base_patch16",
        model_kwargs: dict[str, Any] | None = None,
        img_size: int = 1024,
        in_chans: int = 3,
        num_classes: int = 81,
        detector: Detector = "mask_rcnn",
        out_channels: int = 256,
        block: int | list[int] | None = None,
        window_size: int | None = None,
        global_blocks: list[int] | None = None,
        relative_position: bool = False,
        activation_checkpointing: bool = False,
        scales: list[float] | None = None,
        anchor_sizes: list[float] | None = None,
        detections_per_image: int = 100,
        head_channels: int = 256,
        rois_per_image: int = 512,
        proposals_per_image: int = 1000,
        drop_path_rate: float = 0.1,
        layer_decay: float = 0.7,
        base_lr: float = 4e-4,
        lr: float | None = None,
        min_lr: float = 0.0,
        weight_decay: float = 0.1,
        warmup_epochs: float = 1.0,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        attention: Literal["auto", "sdpa", "explicit"] = "auto",
        compile: bool | Literal["auto"] = False,
        fused_adamw: bool | Literal["auto"] = "auto",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.check_settings()
        if detector not in ("mask_rcnn", "faster_rcnn", "retinanet"):
            raise ValueError(f"model.detector must be one of mask_rcnn, faster_rcnn, retinanet; got {detector!r}")
        if in_chans != 3:
            raise ValueError(f"torchvision's detectors take RGB images: data.in_chans must be 3, got {in_chans}")
        self.build_encoder()
        self.detector = build_detector(detector, self.pyramid, num_classes, img_size, self.mean, self.std,
                                       anchor_sizes, detections_per_image, head_channels, rois_per_image,
                                       proposals_per_image)  # fmt: skip
        self.plan_param_groups()
        self.masks = detector == "mask_rcnn"
        self.val_metrics = DetectionMetrics(masks=self.masks)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.masks and getattr(self.trainer.datamodule, "masks", True) is False:
            raise ValueError(
                "model.detector is mask_rcnn, which learns and is scored on instance masks, but data.masks is "
                "false: set data.masks: true (the annotations' segmentation), or model.detector: faster_rcnn"
            )

    def forward(self, images: list[torch.Tensor]) -> list[Target]:
        """Predictions for a list of (3, H, W) images in [0, 1]: ``boxes`` (K, 4) xyxy px, ``scores``,
        ``labels`` and, with Mask R-CNN, ``masks`` (K, 1, H, W) probabilities (evaluation mode)."""
        return self.detector(images)

    def training_step(self, batch: tuple[list[torch.Tensor], list[Target]], batch_idx: int) -> torch.Tensor:
        images, targets = batch
        losses = self.detector(images, targets)
        for name, value in losses.items():
            self.log(f"train/{name}", value, on_step=True, on_epoch=True, batch_size=len(images))
        loss = sum(losses.values())
        self.log_training_loss(loss, len(images))
        return loss

    def validation_step(self, batch: tuple[list[torch.Tensor], list[Target]], batch_idx: int) -> None:
        images, targets = batch
        self.val_metrics.update(self.detector(images), targets)

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics.compute(), prog_bar=False)
        self.val_metrics.reset()

    def figure_rows(self, images: list[torch.Tensor], targets: list[Target], score_threshold: float) -> list[list]:
        """For ``PredictionFigures``: per image, the ground truth and the detections, drawn."""
        count = self.hparams.num_classes - 1
        names = list(getattr(self.trainer.datamodule, "category_names", None) or range(1, count + 1))
        rows = []
        for image, target, found in zip(images, targets, self(images), strict=True):
            truth = {**target, "scores": torch.ones(len(target["labels"]))}
            if "masks" in target:
                truth["masks"] = target["masks"][:, None].float()
            rows.append([detection_panel(image, truth, [str(n) for n in names], 0.0),
                         detection_panel(image, found, [str(n) for n in names], score_threshold)])  # fmt: skip
        return rows
