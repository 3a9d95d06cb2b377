"""The detection / instance-segmentation ``LightningModule``: torchvision's Mask R-CNN, Faster R-CNN or
RetinaNet over ViTDet's simple feature pyramid on the pretrained encoder (Li et al. 2022, the MAE
paper's section 5 COCO transfer)."""

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from mae.dense.metrics.detection import DetectionMetrics
from mae.dense.models.detectors import Detector, Target, build_detector
from mae.dense.tasks.base import DenseTrainingModule
from mae.dense.tasks.figures import detection_panel
from mae.errors import ConfigError
from mae.training.settings import OptimSettings, as_group

# ViTDet ViT-B's lr and weight decay; the dense recipes' cosine to 0 after a 1-epoch warmup.
DETECTION_OPTIM = OptimSettings(base_lr=4e-4, min_lr=0.0, warmup_epochs=1.0, weight_decay=0.1)


class MAEDetectionModule(DenseTrainingModule):
    """Object detection (and instance segmentation with Mask R-CNN) from a pretrained MAE encoder.

    Batches are ``(images, targets)``: lists of (3, H, W) images in [0, 1] and torchvision target dicts
    (``boxes`` (K, 4) xyxy px, ``labels`` (K,) in 1 .. num_classes - 1, ``masks`` (K, H, W)); see
    ``mae.dense.data.detection``. Logs every loss of the detector as ``train/<loss>`` and their sum as
    ``train/loss``; validation logs COCO mAP (``mae.dense.metrics.detection``).

    Args:
        img_size: every image is resized to this size on its longer side (ViTDet: 1024); linked from
            ``data.img_size``.
        num_classes: with the background (categories + 1); linked from the data module.
        detector: "mask_rcnn" (ViTDet's), "faster_rcnn" or "retinanet".
        anchor_sizes: one anchor size in px per pyramid map (default 8x each map's stride).
        detections_per_image: kept after non-maximum suppression (COCO: 100).
        head_channels: width of the R-CNN heads' convolutions (ViTDet: 256).
        rois_per_image: proposals sampled per image to train the box and mask heads (ViTDet: 512).
        proposals_per_image: the RPN's proposals kept after non-maximum suppression, per image (1000);
            the box head runs on all of them at inference.
        layer_decay: ViTDet ViT-B's (0.7); see ``TransferModule``.
        optim: the optimiser and its schedule (``mae.training.settings.OptimSettings``): ViTDet ViT-B's
            base_lr 4e-4 and weight_decay 0.1, min_lr 0, warmup_epochs 1.
        **kwargs: passed on whole: the pyramid's settings and input normalisation (``DenseTrainingModule``:
            out_channels, block, window_size, global_blocks, relative_position, scales, mean, std), the
            encoder and kernel settings (``mae.training.transfer.TransferModule``: encoder, encoder_config,
            in_chans, drop_path_rate (ViTDet ViT-B: 0.1), kernels, grad_checkpointing).
    """

    network_attribute = "detector"

    def __init__(
        self,
        img_size: int = 1024,
        num_classes: int = 81,
        detector: Detector = "mask_rcnn",
        anchor_sizes: list[float] | None = None,
        detections_per_image: int = 100,
        head_channels: int = 256,
        rois_per_image: int = 512,
        proposals_per_image: int = 1000,
        layer_decay: float = 0.7,
        optim: OptimSettings = DETECTION_OPTIM,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            img_size=img_size,
            num_classes=num_classes,
            layer_decay=layer_decay,
            optim=as_group(optim, DETECTION_OPTIM),
            **kwargs,
        )
        if detector not in ("mask_rcnn", "faster_rcnn", "retinanet"):
            raise ConfigError(
                f"model.detector must be one of mask_rcnn, faster_rcnn, retinanet; got {detector!r}"
            )
        if self.in_chans != 3:
            raise ConfigError(
                f"torchvision's detectors take RGB images: data.in_chans must be 3, got {self.in_chans}"
            )
        self.build_encoder()
        self.detector = build_detector(
            detector,
            self.pyramid,
            num_classes,
            img_size,
            self.mean,
            self.std,
            anchor_sizes,
            detections_per_image,
            head_channels,
            rois_per_image,
            proposals_per_image,
        )
        self.plan_param_groups()
        self.masks = detector == "mask_rcnn"
        self.val_metrics = DetectionMetrics(masks=self.masks)
        self.val_detections = 0  # this validation's detections, to explain an mAP of 0
        self.said_no_detections = False

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.masks and getattr(self.trainer.datamodule, "masks", True) is False:
            raise ConfigError(
                "model.detector is mask_rcnn, which learns and is scored on instance masks, but data.masks "
                "is false: set data.masks: true (the annotations' segmentation), or model.detector: "
                "faster_rcnn"
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
        found = self.detector(images)
        self.val_detections += sum(len(f["boxes"]) for f in found)
        self.val_metrics.update(found, targets)

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics.compute(), prog_bar=False)
        self.val_metrics.reset()
        found = self.trainer.strategy.reduce(
            torch.tensor(float(self.val_detections), device=self.device), reduce_op="sum"
        )
        self.val_detections = 0
        if found == 0 and not self.said_no_detections and not self.trainer.sanity_checking:
            self.said_no_detections = True
            rank_zero_info(
                "note: this validation found no object at all (no detection scored above the detector's "
                "threshold), so its mAP is 0 for want of predictions, not for wrong ones; usual in the first "
                "epochs. Said once."
            )

    def figure_rows(
        self, images: list[torch.Tensor], targets: list[Target], score_threshold: float
    ) -> list[list]:
        """For ``PredictionFigures``: per image, the ground truth and the detections, drawn."""
        count = self.num_classes - 1
        names = list(getattr(self.trainer.datamodule, "category_names", None) or range(1, count + 1))
        rows = []
        for image, target, found in zip(images, targets, self(images), strict=True):
            truth = {**target, "scores": torch.ones(len(target["labels"]))}
            if "masks" in target:
                truth["masks"] = target["masks"][:, None].float()
            rows.append(
                [
                    detection_panel(image, truth, [str(n) for n in names], 0.0),
                    detection_panel(image, found, [str(n) for n in names], score_threshold),
                ]
            )
        return rows
