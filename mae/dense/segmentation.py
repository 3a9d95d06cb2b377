"""The semantic-segmentation ``LightningModule``: UperNet (Xiao et al. 2018) over the feature pyramid
on the pretrained encoder, the MAE paper's ADE20K transfer (section 5: ViT-B 48.1 mIoU, ViT-L 53.6)."""

from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics import MeanMetric

from mae.dense.figures import segmentation_panel
from mae.dense.module import DenseTrainingModule
from mae.dense.pyramid import SimpleFeaturePyramid
from mae.dense.segmentation_metrics import SegmentationMetrics
from mae.dense.upernet import UperNetHead, upsample_logits


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


class MAESegmentationModule(DenseTrainingModule):
    """Semantic segmentation from a pretrained MAE encoder.

    Batches are ``(images, masks)``: (N, C, H, W) images in [0, 1] and (N, H, W) int64 class masks with
    ``ignore_index`` where unlabelled (``mae.dense.segmentation_data``). Loss: pixel-wise cross-entropy
    without the ignored pixels; validation logs ``val/loss``, ``val/miou`` and ``val/acc``
    (``mae.dense.segmentation_metrics``).

    Args:
        checkpoint, checkpoint_format, model, model_kwargs: the encoder, as ``MAEDetectionModule``.
        img_size: the training crop (ADE20K: 512); linked from ``data.img_size``.
        in_chans, num_classes, ignore_index: linked from the data module.
        out_channels, block, window_size, global_blocks, relative_position, activation_checkpointing, scales:
            the pyramid's. The MAE paper (after BEiT) takes the four maps from four blocks: ``block: [3, 5, 7,
            11]`` for ViT-B.
        head_channels: UperNet's width (512 for ViT-B in BEiT's and MAE's setting).
        drop_path_rate, layer_decay, base_lr, lr, min_lr, warmup_epochs, weight_decay: AdamW with
            layer-wise lr decay, warmup + cosine (MAE's ADE20K: layer decay 0.65, 100 epochs, batch 16).
        mean, std, attention, compile, fused_adamw: as ``MAEDetectionModule``.
    """

    network_attribute = "segmenter"

    def __init__(
        self,
        checkpoint: str | None = None,
        checkpoint_format: str = "auto",
        model: str = "mae_vit_base_patch16",
        model_kwargs: dict[str, Any] | None = None,
        img_size: int = 512,
        in_chans: int = 3,
        num_classes: int = 150,
        ignore_index: int = 255,
        out_channels: int = 256,
        block: int | list[int] | None = None,
        window_size: int | None = None,
        global_blocks: list[int] | None = None,
        relative_position: bool = False,
        activation_checkpointing: bool = False,
        scales: list[float] | None = None,
        head_channels: int = 512,
        drop_path_rate: float = 0.1,
        layer_decay: float = 0.65,
        base_lr: float = 1.6e-3,
        lr: float | None = None,
        min_lr: float = 0.0,
        weight_decay: float = 0.05,
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
        self.build_encoder()
        head = UperNetHead(out_channels, num_classes, channels=head_channels)
        self.segmenter = Segmenter(self.pyramid, head, self.mean, self.std)
        self.plan_param_groups()
        self.val_metrics = SegmentationMetrics(num_classes, ignore_index)
        self.val_loss = MeanMetric()  # weighted by images, reduced exactly across processes (uneven shards)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images in [0, 1] -> (N, num_classes, H, W) logits."""
        return self.segmenter(images)

    def loss(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, masks, ignore_index=self.hparams.ignore_index)

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

    def figure_rows(self, images: list[torch.Tensor], masks: list[torch.Tensor], score_threshold: float) -> list[list]:
        """For ``PredictionFigures``: per image, the ground-truth classes and the predicted ones, drawn."""
        hp = self.hparams
        names = getattr(self.trainer.datamodule, "class_names", None) or []
        clear = tuple(i for i, name in enumerate(names) if name == "background")  # painted, it would hide the image
        rows = []
        for image, mask in zip(images, masks, strict=True):
            predicted = self(image[None])[0].argmax(0)
            rows.append([segmentation_panel(image, mask, hp.num_classes, hp.ignore_index, clear),
                         segmentation_panel(image, predicted, hp.num_classes, hp.ignore_index, clear)])  # fmt: skip
        return rows
