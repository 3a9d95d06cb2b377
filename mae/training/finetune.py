"""The fine-tuning / linear-probing ``LightningModule``: a timm classifier from a pretrained encoder, a ViT
or a CNN of the SparK / FCMAE family (the timm CNN itself, its classifier timm's own: ``fc`` of a ResNet,
``head.fc`` of a ConvNeXt).

The joint objective (``mode: joint``, ``mae.training.joint``) trains the classifier and MAE reconstruction
together on one encoder; its checkpoint is an MAE record whose state holds the classifier too.

Fine-tuning follows the paper's end-to-end protocol (layer-wise lr decay, drop path, mixup/cutmix,
label smoothing, AdamW); linear probing its frozen-encoder protocol (cls token, BatchNorm without
affine before the linear head, LARS, no weight decay). A CNN pools its last map ("avg", timm's own
pooling; "token" is refused), its layer decay counts timm's blocks (``group_matcher``: a ResNet's
``layerN.M``, a ConvNeXt's ``stages.N.blocks.M`` and downsamplings, the stem the lowest), and its linear
probe puts the BatchNorm before the linear layer at timm's classifier path.

The checkpoint records the classifier's architecture (``architecture_record``) so that
``mae.load_backbone`` and the exports rebuild it without the pretraining file:

- ViT: ``{"class": "VisionTransformer", "args": <timm VisionTransformer arguments> + "head",
  "layer_norm_eps", "state_dict_prefix": "vit."}`` (``mae.convert.architecture.vit_record``).
- CNN: ``{"class": CNN_CLASSIFIER_CLASS ("TimmCNN"), "args": {"encoder": <timm name>, "num_classes": K,
  "in_chans": C, "global_pool": "avg", "img_size": [H, W], "drop_path_rate": x, "encoder_kwargs": {...},
  "head": "linear" | "batchnorm_linear"}, "state_dict_prefix": "vit."}``: the model is
  ``timm.create_model(encoder, num_classes=K, in_chans=C, global_pool="avg", **encoder_kwargs)``, its
  state dict under ``vit.`` is timm's (a linear probe's head: ``<classifier>.0.*`` the BatchNorm's running
  statistics, ``<classifier>.1.*`` the linear layer, where ``<classifier>`` is timm's
  ``pretrained_cfg["classifier"]``: ``fc`` or ``head.fc``).
"""

from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from timm.data import Mixup
from timm.layers import to_2tuple, trunc_normal_
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import Lars, param_groups_layer_decay
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from mae.convert.architecture import CNN_CLASSIFIER_CLASS, vit_record
from mae.convert.backbone import vit_args
from mae.convert.classifier import PROBE_NORM_EPS
from mae.convert.families import family_of
from mae.errors import ConfigError
from mae.training.joint import (
    JOINT,
    JointMAE,
    JointSettings,
    build_joint_network,
    check_joint_mode,
    joint_record,
    validation_noise,
)
from mae.training.optim import ParamGroupPlan
from mae.training.settings import as_group, plain
from mae.training.transfer import TransferModule, encoder_record


def classifier_path(model: nn.Module) -> str:
    """The dotted name of a timm model's classifier layer: ``pretrained_cfg["classifier"]`` ("fc" of a
    ResNet, "head.fc" of a ConvNeXt), "head" for a ViT built without a pretrained config."""
    return getattr(model, "pretrained_cfg", None) and model.pretrained_cfg.get("classifier") or "head"


class MAEFinetuneModule(TransferModule):
    """A ViT (or CNN) classifier initialised from a pretrained MAE encoder.

    Args:
        mode: "finetune" (all weights), "linprobe" (frozen encoder, BatchNorm + linear head) or "joint"
            (classification and MAE reconstruction in one run, ``mae.training.joint``: the whole MAE,
            decoder included, with the classifier; its checkpoint is both).
        global_pool: "avg" (mean of patch tokens + fc_norm, the paper's fine-tuning; a CNN's: the mean
            of its last map) or "token" (cls; a ViT's only).
        mixup: mixup alpha (paper 0.8); 0 disables.
        cutmix: cutmix alpha (paper 1.0); 0 disables.
        label_smoothing: (paper 0.1).
        head_init_std: std of the new head's trunc-normal init (paper: 2e-5; linear probe 0.01).
        joint: the joint objective's settings (``mae.training.joint.JointSettings``: reconstruction_weight,
            classify, mask_ratio), mode "joint" only.
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
        mode: Literal["finetune", "linprobe", "joint"] = "finetune",
        global_pool: Literal["avg", "token"] = "avg",
        mixup: float = 0.8,
        cutmix: float = 1.0,
        label_smoothing: float = 0.1,
        head_init_std: float = 2e-5,
        joint: JointSettings = JOINT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if mode not in ("finetune", "linprobe", "joint"):
            raise ConfigError(f"model.mode must be 'finetune', 'linprobe' or 'joint', got {mode!r}")
        if mode == "linprobe" and (mixup > 0 or cutmix > 0 or self.drop_path_rate > 0):
            raise ConfigError(
                "linear probing trains on frozen features: set mixup, cutmix and drop_path_rate to 0"
            )
        joint = as_group(joint, JOINT)
        check_joint_mode(mode, joint, global_pool, mixup, cutmix)
        self.save_hyperparameters({**self.hparams, "joint": plain(joint)})
        self.mode = mode
        self.joint = joint if mode == "joint" else None  # the joint objective's settings, in its mode only
        if self.joint is not None:
            self.vit = self._joint_network(head_init_std)
            self.val_mae_loss = MeanMetric()
        else:
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
        BatchNorm before the head. Records the classifier's timm arguments for its checkpoints."""
        vit_kwargs = dict(
            global_pool=global_pool, num_classes=self.num_classes, drop_path_rate=self.drop_path_rate
        )
        vit, config, ckpt = self.pretrained_vit(**vit_kwargs)
        self.family = family_of(config)
        # The classifier's timm arguments, recorded in checkpoints so mae.load_backbone rebuilds it exactly.
        if self.family == "cnn":
            self.vit_args = {
                "encoder": config["encoder"],
                "num_classes": self.num_classes,
                "in_chans": self.in_chans,
                "global_pool": "avg",
                "img_size": list(to_2tuple(self.img_size)),
                "drop_path_rate": self.drop_path_rate,
                "encoder_kwargs": {
                    k: v for k, v in config.get("encoder_kwargs", {}).items() if k != "drop_path_rate"
                },
            }
            self.layer_norm_eps = None
        else:
            self.vit_args = {
                **vit_args({**config, "img_size": tuple(vit.patch_embed.img_size)}),
                **vit_kwargs,
            }
            self.layer_norm_eps = config["layer_norm_eps"]
        path = classifier_path(vit)
        head = vit.get_submodule(path)
        if ckpt is None or f"{path}.weight" in vit.load_report.missing:  # a new head
            trunc_normal_(head.weight, std=head_init_std)
            nn.init.zeros_(head.bias)
        if self.mode == "linprobe":
            for p in vit.parameters():
                p.requires_grad = False
            norm = nn.BatchNorm1d(head.in_features, affine=False, eps=PROBE_NORM_EPS)
            vit.set_submodule(path, nn.Sequential(norm, head))
            for p in vit.get_submodule(path).parameters():
                p.requires_grad = True
        return vit

    def _joint_network(self, head_init_std: float) -> JointMAE:
        """The joint objective's network (``mae.training.joint.build_joint_network``): the MAE of the
        pretrained checkpoint (decoder included when it has one) with the classifier; records its
        architecture in the hyperparameters (``encoder_config``: the whole MAE's)."""
        network, _ = build_joint_network(
            self.encoder_source,
            self.encoder_config,
            self.img_size,
            self.in_chans,
            self.num_classes,
            self.drop_path_rate,
            head_init_std,
        )
        network.check_mask_ratio(self.joint.mask_ratio)
        network.set_grad_checkpointing(self.grad_checkpointing)
        self.encoder_config = self.hparams.encoder_config = encoder_record(network.config, self.in_chans)
        self.family = "vit"
        return network

    def architecture_record(self) -> dict[str, Any]:
        if self.joint is not None:  # an MAE whose state holds the classifier too: both views of one file
            return joint_record(self.vit, prefix="vit.")
        head = "batchnorm_linear" if self.mode == "linprobe" else "linear"
        if self.family == "cnn":
            args = {**self.vit_args, "head": head}
            return {"class": CNN_CLASSIFIER_CLASS, "args": args, "state_dict_prefix": "vit."}
        record = vit_record(self.vit_args, self.layer_norm_eps, prefix="vit.")
        record["args"]["head"] = head
        return record

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, num_classes) logits."""
        return self.vit(imgs)

    @property
    def augmentation(self) -> str:
        """The ``data.augmentation`` recipe this mode trains with (another is noted when the run starts):
        the joint objective's is fine-tuning's."""
        return "finetune" if self.mode == "joint" else self.mode

    def on_fit_start(self) -> None:
        super().on_fit_start()
        datamodule = self.trainer.datamodule
        batch_size = getattr(datamodule, "batch_size", 0)
        if self.mixup is not None and batch_size % 2:
            raise ConfigError(f"mixup/cutmix pair up images: data.batch_size must be even, got {batch_size}")
        augmentation = getattr(datamodule, "augmentation", None)
        if augmentation not in (None, self.augmentation):
            rank_zero_info(f"note: model.mode is {self.mode!r} but data.augmentation is {augmentation!r}")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        imgs, targets = batch
        if self.joint is not None:
            return self._joint_step(imgs, targets)
        if self.mixup is not None:
            imgs, targets = self.mixup(imgs, targets)  # training only: validation sees clean images
        loss = self.train_criterion(self(imgs), targets)
        self.log_training_loss(loss, imgs.shape[0])
        return loss

    def _joint_step(self, imgs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The joint objective's training step (``mae.training.joint``): its loss, logged with its two
        parts (``train/cls_loss``, ``train/mae_loss``)."""
        logits, mae_loss = self.vit.forward_joint(imgs, self.joint.mask_ratio, self.joint.classify)
        cls_loss = self.train_criterion(logits, targets)
        loss = self.joint.combine(cls_loss, mae_loss)
        self.log_training_loss(loss, imgs.shape[0])
        if not self.replaying:
            parts = {"train/cls_loss": cls_loss, "train/mae_loss": mae_loss}
            self.log_dict(parts, on_step=True, on_epoch=True, batch_size=imgs.shape[0])
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
        if self.joint is not None:  # the reconstruction on the same masks every epoch
            ratio = self.joint.mask_ratio
            noise = validation_noise(self.vit, imgs.shape[0], ratio, batch_idx, imgs.device)
            self.val_mae_loss.update(self.vit.reconstruction_loss(imgs, ratio, noise), weight=imgs.shape[0])
            self.log("val/mae_loss", self.val_mae_loss)

    def _param_groups(self) -> list[dict]:
        """The recipe's groups on the unwrapped classifier: LARS on the probe's head (trust ratio on its
        weight only), or layer-wise lr decay with weight decay on weights only."""
        if self.mode == "linprobe":
            head = [
                p for p in self.vit.get_submodule(classifier_path(self.vit)).parameters() if p.requires_grad
            ]
            return [
                {"params": [p for p in head if p.ndim > 1], "always_adapt": True, "name": "weights"},
                {"params": [p for p in head if p.ndim <= 1], "always_adapt": False, "name": "biases"},
            ]
        return param_groups_layer_decay(
            self.vit,
            self.optim.weight_decay,
            no_weight_decay_list=getattr(self.vit, "no_weight_decay", set)(),  # a CNN has none
            layer_decay=self.layer_decay,
        )

    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        groups = self.param_groups.groups(self.vit)
        if self.mode == "linprobe":
            return Lars(groups, lr=lr, momentum=0.9, weight_decay=self.optim.weight_decay, trust_coeff=0.001)
        return torch.optim.AdamW(groups, lr=lr, fused=(self.settings or self.resolve_settings()).fused_adamw)
