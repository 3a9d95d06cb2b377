"""The pretraining ``LightningModule``: a thin wrapper that trains ``MaskedAutoencoderViT``."""

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torchmetrics import MeanMetric

from mae.data.transforms import normalize_batch
from mae.guards import check_finite_loss
from mae.models import create_model
from mae.models.flops import mae_train_flops
from mae.models.masking import check_mask_ratio
from mae.optim import per_device_batch_size, resolve_schedule, stepwise_schedule, weight_decay_groups
from mae.runtime import TrainingSettings, set_attention_kernel, settings_for_trainer

# Set through the module's own arguments (or data.img_size), never through model_kwargs.
_OWN_ARGS = ("img_size", "norm_pix_loss", "mask_strategy")


class MAEPretrainModule(pl.LightningModule):
    """MAE pretraining with the paper's optimiser and schedule.

    Args:
        model: factory name, e.g. "mae_vit_base_patch16" (see ``mae.models.MODEL_REGISTRY``).
        img_size: input size; linked from ``data.img_size`` by the CLI.
        model_kwargs: overrides of ``MaskedAutoencoderViT`` arguments (e.g. depth, decoder_depth).
        mask_ratio: fraction of patches removed, in [0, 1).
        mask_strategy: "random" (paper default), "block" or "grid".
        norm_pix_loss: regress per-patch normalised pixels (the paper's released models do).
        base_lr: lr per 256 images; the lr is ``base_lr * effective_batch / 256``.
        lr: absolute lr, overriding the scaling rule when set.
        min_lr: lr at the end of the cosine.
        weight_decay: AdamW decay on weights (not on biases and norms).
        betas: AdamW betas.
        warmup_epochs: linear warmup length in (fractional) epochs.
        attention: attention kernel, "sdpa" or "explicit"; "auto" picks the faster one measured for
            the training device and precision (``mae.runtime.training_settings``).
        compile: ``torch.compile`` the model ("auto": for runs of at least ``mae.runtime.COMPILE_MIN_STEPS``
            optimizer steps, which repay the compilation time).
        fused_adamw: the single-kernel AdamW ("auto": as ``mae.runtime.training_settings`` says).
    """

    def __init__(
        self,
        model: str = "mae_vit_base_patch16",
        img_size: int | tuple[int, int] = 224,
        model_kwargs: dict[str, Any] | None = None,
        mask_ratio: float = 0.75,
        mask_strategy: Literal["random", "block", "grid"] = "random",
        norm_pix_loss: bool = True,
        base_lr: float = 1.5e-4,
        lr: float | None = None,
        min_lr: float = 0.0,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_epochs: float = 40.0,
        attention: Literal["auto", "sdpa", "explicit"] = "auto",
        compile: bool | Literal["auto"] = "auto",
        fused_adamw: bool | Literal["auto"] = "auto",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_mask_ratio(mask_ratio, mask_strategy)
        if attention not in ("auto", "sdpa", "explicit"):
            raise ValueError(f"model.attention must be 'auto', 'sdpa' or 'explicit', got {attention!r}")
        for name, value in (("compile", compile), ("fused_adamw", fused_adamw)):
            if value not in (True, False, "auto"):
                raise ValueError(f"model.{name} must be true, false or auto, got {value!r}")
        self.settings: TrainingSettings | None = None  # resolved for the training device in setup()
        model_kwargs = dict(model_kwargs or {})
        clash = [k for k in _OWN_ARGS if k in model_kwargs]
        if clash:
            raise ValueError(f"model.model_kwargs sets {clash}; set model.{clash[0]} (img_size: data.img_size) instead")
        if warmup_epochs < 0 or min_lr < 0 or base_lr <= 0 or (lr is not None and lr <= 0):
            raise ValueError(
                f"need warmup_epochs >= 0, min_lr >= 0 and a positive lr; got warmup_epochs={warmup_epochs}, "
                f"min_lr={min_lr}, base_lr={base_lr}, lr={lr}"
            )
        self.model = create_model(
            model, img_size=img_size, norm_pix_loss=norm_pix_loss, mask_strategy=mask_strategy, **model_kwargs
        )
        self.mask_ratio = mask_ratio
        self.flops_per_batch: int | None = None  # read by Lightning's ThroughputMonitor
        self.effective_batch: int | None = None
        self.resolved_lr: float | None = None
        self.epoch_losses: list[float] = []  # mean training loss of each epoch, for the run summary
        self.val_loss = MeanMetric()

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.flops_per_batch = mae_train_flops(self.model, per_device_batch_size(self.trainer), self.mask_ratio)
        self.settings = self.resolve_settings(self.trainer.estimated_stepping_batches if stage == "fit" else 0)
        set_attention_kernel(self.model, self.settings.attention)

    def on_fit_start(self) -> None:
        if self.settings.compile:
            self.model.compile()  # in place: checkpoints keep the plain parameter names

    def resolve_settings(self, steps: float | None = None) -> TrainingSettings:
        """The run's kernel choices: the measured defaults for the device, precision and run length
        (``steps`` optimizer steps), with this module's overrides."""
        hp = self.hparams
        auto = settings_for_trainer(self.trainer, steps)
        return TrainingSettings(
            precision=auto.precision,
            attention=auto.attention if hp.attention == "auto" else hp.attention,
            compile=auto.compile if hp.compile == "auto" else hp.compile,
            fused_adamw=auto.fused_adamw if hp.fused_adamw == "auto" else hp.fused_adamw,
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        imgs = normalize_batch(batch[0])  # the pretraining crop ships uint8 images: normalise on the device
        loss, _, _ = self.model(imgs, self.mask_ratio)
        check_finite_loss(loss, self)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=imgs.shape[0])
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_train_epoch_end(self) -> None:
        loss = self.trainer.callback_metrics.get("train/loss_epoch")
        if loss is not None:
            self.epoch_losses.append(float(loss))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        imgs = normalize_batch(batch[0])
        # The same masks every epoch, so validation losses are comparable across epochs.
        generator = torch.Generator().manual_seed(batch_idx)
        noise = self.model.sample_noise(imgs.shape[0], self.mask_ratio, "cpu", generator).to(imgs.device)
        loss, _, _ = self.model(imgs, self.mask_ratio, noise)
        self.val_loss.update(loss, weight=imgs.shape[0])  # reduced exactly across processes
        self.log("val/loss", self.val_loss, prog_bar=True)

    def configure_optimizers(self) -> dict:
        hp = self.hparams
        schedule = resolve_schedule(self.trainer, hp.base_lr, hp.lr, hp.warmup_epochs)
        self.effective_batch, self.resolved_lr = schedule.effective_batch, schedule.lr
        optimizer = torch.optim.AdamW(
            weight_decay_groups(self.model, hp.weight_decay),
            lr=schedule.lr,
            betas=tuple(hp.betas),
            fused=(self.settings or self.resolve_settings()).fused_adamw,
        )
        return stepwise_schedule(optimizer, schedule, self.trainer, hp.base_lr, hp.lr, hp.min_lr)

    def lr_scheduler_step(self, scheduler, metric: Any) -> None:
        # timm schedulers take the number of optimizer updates done so far.
        scheduler.step_update(num_updates=self.global_step)
