"""The semantic-segmentation ``LightningModule``: UperNet (Xiao et al. 2018) over the feature pyramid
on the pretrained encoder, the MAE paper's ADE20K transfer (section 5: ViT-B 48.1 mIoU, ViT-L 53.6)."""

from typing import Any

import torch
from torch.nn import functional as F
from torchmetrics import MeanMetric

from mae.dense.metrics.segmentation import SegmentationMetrics
from mae.dense.models.segmenter import Segmenter
from mae.dense.models.upernet import UperNetHead
from mae.dense.tasks.base import DenseTrainingModule
from mae.dense.tasks.figures import segmentation_panel
from mae.training.settings import OptimSettings, as_group

# MAE's ADE20K lr (with layer decay 0.65, 100 epochs, batch 16); the dense recipes' cosine to 0 after a
# 1-epoch warmup.
SEGMENTATION_OPTIM = OptimSettings(base_lr=1.6e-3, min_lr=0.0, warmup_epochs=1.0, weight_decay=0.05)


class MAESegmentationModule(DenseTrainingModule):
    """Semantic segmentation from a pretrained MAE encoder.

    Batches are ``(images, masks)``: (N, C, H, W) images in [0, 1] and (N, H, W) int64 class masks with
    ``ignore_index`` where unlabelled (``mae.dense.data.segmentation``). Loss: pixel-wise cross-entropy
    without the ignored pixels; validation logs ``val/loss``, ``val/miou`` and ``val/acc``
    (``mae.dense.metrics.segmentation``).

    Args:
        img_size: the training crop (ADE20K: 512); linked from ``data.img_size``.
        num_classes, ignore_index: linked from the data module.
        head_channels: UperNet's width (512 for ViT-B in BEiT's and MAE's setting).
        optim: the optimiser and its schedule (``mae.training.settings.OptimSettings``): MAE's ADE20K
            base_lr 1.6e-3 (with layer decay 0.65, 100 epochs, batch 16), weight_decay 0.05, min_lr 0,
            warmup_epochs 1.
        **kwargs: passed on whole: the pyramid's settings and input normalisation (``DenseTrainingModule``:
            out_channels, block (the MAE paper, after BEiT, takes the four maps from four blocks:
            ``block: [3, 5, 7, 11]`` for ViT-B), window_size, global_blocks, relative_position,
            scales, mean, std), the encoder and kernel settings
            (``mae.training.transfer.TransferModule``: encoder, encoder_config, in_chans, drop_path_rate,
            layer_decay, kernels, grad_checkpointing).
    """

    network_attribute = "segmenter"

    def __init__(
        self,
        img_size: int = 512,
        num_classes: int = 150,
        ignore_index: int = 255,
        head_channels: int = 512,
        optim: OptimSettings = SEGMENTATION_OPTIM,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            img_size=img_size, num_classes=num_classes, optim=as_group(optim, SEGMENTATION_OPTIM), **kwargs
        )
        self.ignore_index = ignore_index
        self.build_encoder()
        head = UperNetHead(self.pyramid_args["out_channels"], num_classes, channels=head_channels)
        self.segmenter = Segmenter(self.pyramid, head, self.mean, self.std)
        self.plan_param_groups()
        self.val_metrics = SegmentationMetrics(num_classes, ignore_index)
        self.val_loss = MeanMetric()  # weighted by images, reduced exactly across processes (uneven shards)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images in [0, 1] -> (N, num_classes, H, W) logits."""
        return self.segmenter(images)

    def loss(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, masks, ignore_index=self.ignore_index)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, masks = batch
        loss = self.loss(self(images), masks)
        self.log_training_loss(loss, images.shape[0])
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, masks = batch
        logits = self(images)
        self.val_loss.update(self.loss(logits, masks), weight=images.shape[0])
        self.log("val/loss", self.val_loss)
        self.val_metrics.update(logits.argmax(1), masks)

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics.compute())
        self.val_metrics.reset()

    def figure_rows(
        self, images: list[torch.Tensor], masks: list[torch.Tensor], score_threshold: float
    ) -> list[list]:
        """For ``PredictionFigures``: per image, the ground-truth classes and the predicted ones, drawn."""
        names = getattr(self.trainer.datamodule, "class_names", None) or []
        # painted, it would hide the image
        clear = tuple(i for i, name in enumerate(names) if name == "background")
        rows = []
        for image, mask in zip(images, masks, strict=True):
            predicted = self(image[None])[0].argmax(0)
            truth_panel = segmentation_panel(image, mask, self.num_classes, self.ignore_index, clear)
            rows.append(
                [
                    truth_panel,
                    segmentation_panel(image, predicted, self.num_classes, self.ignore_index, clear),
                ]
            )
        return rows
