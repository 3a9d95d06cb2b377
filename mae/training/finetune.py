"""The fine-tuning / linear-probing ``LightningModule``: a timm ViT classifier from a pretrained encoder.

Fine-tuning follows the paper's end-to-end protocol (layer-wise lr decay, drop path, mixup/cutmix,
label smoothing, AdamW); linear probing its frozen-encoder protocol (cls token, BatchNorm without
affine before the linear head, LARS, no weight decay).
"""

from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from timm.data import Mixup
from timm.layers import trunc_normal_
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import Lars, param_groups_layer_decay
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from mae.convert.architecture import vit_record
from mae.convert.backbone import vit_args
from mae.convert.classifier import PROBE_NORM_EPS
from mae.errors import ConfigError
from mae.training.optim import ParamGroupPlan
from mae.training.transfer import TransferModule


class MAEFinetuneModule(TransferModule):
    """A ViT classifier initialised from a pretrained MAE encoder.

    Args:
        mode: "finetune" (all weights) or "linprobe" (frozen encoder, BatchNorm + linear head).
        global_pool: "avg" (mean of patch tokens + fc_norm, the paper's fine-tuning) or "token" (cls).
        mixup: mixup alpha (paper 0.8); 0 disables.
        cutmix: cutmix alpha (paper 1.0); 0 disables.
        label_smoothing: (paper 0.1).
        head_init_std: std of the new head's trunc-normal init (paper: 2e-5; linear probe 0.01).
        **kwargs: passed on whole to ``mae.training.transfer.TransferModule``, which takes and keeps them:
            the encoder (``encoder``: checkpoint, checkpoint_format, model, model_kwargs; encoder_config), the
            input and classes (img_size, in_chans, num_classes), drop_path_rate, layer_decay, the optimiser
            with the paper's fine-tuning defaults (``optim``: base_lr (paper: 5e-4 B, 1e-3 L/H; linear probe
            0.1), lr, min_lr (1e-6; linear probe 0), warmup_epochs (5; linear probe 10), weight_decay (0.05;
            linear probe 0)), the kernel choices (``kernels``: attention, compile, fused_adamw) and
            ``grad_checkpointing`` (activation checkpointing of the encoder blocks).
    """

    network_attribute = "vit"

    def __init__(
        self,
        mode: Literal["finetune", "linprobe"] = "finetune",
        global_pool: Literal["avg", "token"] = "avg",
        mixup: float = 0.8,
        cutmix: float = 1.0,
        label_smoothing: float = 0.1,
        head_init_std: float = 2e-5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if mode not in ("finetune", "linprobe"):
            raise ConfigError(f"model.mode must be 'finetune' or 'linprobe', got {mode!r}")
        if mode == "linprobe" and (mixup > 0 or cutmix > 0 or self.drop_path_rate > 0):
            raise ConfigError(
                "linear probing trains on frozen features: set mixup, cutmix and drop_path_rate to 0"
            )
        self.mode = mode
        self.vit = self._classifier(global_pool, head_init_std)
        # Fixed by name now: a strategy (FSDP) may flatten the parameters before the optimizer is built.
        self.param_groups = ParamGroupPlan.from_groups(self.vit, self._param_groups())
        self.mixup = None
        if mode == "finetune" and (mixup > 0 or cutmix > 0):
            self.mixup = Mixup(
                mixup_alpha=mixup,
                cutmix_alpha=cutmix,
                label_smoothing=label_smoothing,
                num_classes=self.num_classes,
            )
            self.train_criterion: nn.Module = SoftTargetCrossEntropy()
        elif label_smoothing > 0:
            self.train_criterion = LabelSmoothingCrossEntropy(smoothing=label_smoothing)
        else:
            self.train_criterion = nn.CrossEntropyLoss()
        self.val_loss = MeanMetric()  # reduced exactly across processes, like the accuracies
        self.val_acc1 = MulticlassAccuracy(self.num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(self.num_classes, top_k=min(5, self.num_classes), average="micro")

    def _classifier(self, global_pool: str, head_init_std: float) -> nn.Module:
        """The pretrained encoder as a timm classifier with ``global_pool``; a head the checkpoint does
        not hold drawn with std ``head_init_std``; for the linear probe, the encoder frozen and a
        BatchNorm before the head. Records ``vit_args`` and ``layer_norm_eps`` for its checkpoints."""
        vit_kwargs = dict(
            global_pool=global_pool, num_classes=self.num_classes, drop_path_rate=self.drop_path_rate
        )
        vit, config, ckpt = self.pretrained_vit(**vit_kwargs)
        # The classifier's timm arguments, recorded in checkpoints so mae.load_backbone rebuilds it exactly.
        self.vit_args = {**vit_args({**config, "img_size": tuple(vit.patch_embed.img_size)}), **vit_kwargs}
        self.layer_norm_eps = config["layer_norm_eps"]
        if ckpt is None or "head.weight" in vit.load_report.missing:  # a new head
            trunc_normal_(vit.head.weight, std=head_init_std)
            nn.init.zeros_(vit.head.bias)
        if self.mode == "linprobe":
            for p in vit.parameters():
                p.requires_grad = False
            norm = nn.BatchNorm1d(vit.head.in_features, affine=False, eps=PROBE_NORM_EPS)
            vit.head = nn.Sequential(norm, vit.head)
            for p in vit.head.parameters():
                p.requires_grad = True
        return vit

    def architecture_record(self) -> dict[str, Any]:
        record = vit_record(self.vit_args, self.layer_norm_eps, prefix="vit.")
        record["args"]["head"] = "batchnorm_linear" if self.mode == "linprobe" else "linear"
        return record

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, num_classes) logits."""
        return self.vit(imgs)

    def on_fit_start(self) -> None:
        super().on_fit_start()
        datamodule = self.trainer.datamodule
        batch_size = getattr(datamodule, "batch_size", 0)
        if self.mixup is not None and batch_size % 2:
            raise ConfigError(f"mixup/cutmix pair up images: data.batch_size must be even, got {batch_size}")
        augmentation = getattr(datamodule, "augmentation", None)
        if augmentation not in (None, self.mode):
            rank_zero_info(f"note: model.mode is {self.mode!r} but data.augmentation is {augmentation!r}")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        imgs, targets = batch
        if self.mixup is not None:
            imgs, targets = self.mixup(imgs, targets)  # training only: validation sees clean images
        loss = self.train_criterion(self(imgs), targets)
        self.log_training_loss(loss, imgs.shape[0])
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        imgs, targets = batch
        logits = self(imgs)
        self.val_acc1.update(logits, targets)
        self.val_acc5.update(logits, targets)
        self.val_loss.update(nn.functional.cross_entropy(logits, targets), weight=imgs.shape[0])
        self.log("val/loss", self.val_loss)
        self.log("val/acc1", self.val_acc1, prog_bar=True)
        self.log("val/acc5", self.val_acc5)

    def _param_groups(self) -> list[dict]:
        """The recipe's groups on the unwrapped classifier: LARS on the probe's head (trust ratio on its
        weight only), or layer-wise lr decay with weight decay on weights only."""
        if self.mode == "linprobe":
            head = [p for p in self.vit.head.parameters() if p.requires_grad]
            return [
                {"params": [p for p in head if p.ndim > 1], "always_adapt": True, "name": "weights"},
                {"params": [p for p in head if p.ndim <= 1], "always_adapt": False, "name": "biases"},
            ]
        return param_groups_layer_decay(
            self.vit,
            self.optim.weight_decay,
            no_weight_decay_list=self.vit.no_weight_decay(),
            layer_decay=self.layer_decay,
        )

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        groups = self.param_groups.groups(self.vit)
        if self.mode == "linprobe":
            return Lars(groups, lr=lr, momentum=0.9, weight_decay=self.optim.weight_decay, trust_coeff=0.001)
        return torch.optim.AdamW(groups, lr=lr, fused=(self.settings or self.resolve_settings()).fused_adamw)
