"""The pretraining ``LightningModule``: a thin wrapper that trains ``MaskedAutoencoderViT``."""

import math
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from mae.models import create_model
from mae.models.flops import mae_train_flops
from mae.models.masking import check_mask_ratio
from mae.optim import effective_batch_size, scaled_lr, warmup_cosine_scheduler, weight_decay_groups

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
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_mask_ratio(mask_ratio, mask_strategy)
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

    def setup(self, stage: str) -> None:
        batch_size = self._per_device_batch_size()
        if batch_size is not None:
            self.flops_per_batch = mae_train_flops(self.model, batch_size, self.mask_ratio)

    def _per_device_batch_size(self) -> int | None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and hasattr(datamodule, "batch_size"):
            return datamodule.batch_size
        loader = self.trainer.train_dataloader
        return getattr(loader, "batch_size", None)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        imgs = batch[0]
        loss, _, _ = self.model(imgs, self.mask_ratio)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=imgs.shape[0])
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def on_train_epoch_end(self) -> None:
        loss = self.trainer.callback_metrics.get("train/loss_epoch")
        if loss is not None:
            self.epoch_losses.append(float(loss))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        imgs = batch[0]
        # The same masks every epoch, so validation losses are comparable across epochs.
        generator = torch.Generator().manual_seed(batch_idx)
        noise = self.model.sample_noise(imgs.shape[0], self.mask_ratio, "cpu", generator).to(imgs.device)
        loss, _, _ = self.model(imgs, self.mask_ratio, noise)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=imgs.shape[0])

    def configure_optimizers(self) -> dict:
        trainer = self.trainer
        total_steps = trainer.estimated_stepping_batches
        if not math.isfinite(total_steps):
            raise ValueError("set trainer.max_epochs or trainer.max_steps: the cosine schedule needs the run length")
        batch_size = self._per_device_batch_size()
        accumulate = trainer.accumulate_grad_batches
        self.effective_batch = effective_batch_size(batch_size, trainer.num_devices, trainer.num_nodes, accumulate)
        hp = self.hparams
        self.resolved_lr = hp.lr if hp.lr is not None else scaled_lr(hp.base_lr, self.effective_batch)
        if trainer.train_dataloader is None:  # not loaded when only max_steps bounds the run
            trainer.fit_loop.setup_data()
        if not math.isfinite(trainer.num_training_batches):
            raise ValueError("the training data has no length, so model.warmup_epochs cannot be turned into steps")
        # Lightning steps the optimizer on an epoch's last batch even mid-accumulation.
        steps_per_epoch = math.ceil(trainer.num_training_batches / accumulate)
        warmup_steps = round(hp.warmup_epochs * steps_per_epoch)
        if warmup_steps >= total_steps:
            raise ValueError(
                f"model.warmup_epochs={hp.warmup_epochs} ({warmup_steps} steps) is not shorter than the run "
                f"({total_steps} steps of {steps_per_epoch} per epoch); lower it or train longer"
            )
        optimizer = torch.optim.AdamW(
            weight_decay_groups(self.model, hp.weight_decay),
            lr=self.resolved_lr,
            betas=tuple(hp.betas),
            fused=self.device.type == "cuda",
        )
        scheduler = warmup_cosine_scheduler(optimizer, int(total_steps), warmup_steps, hp.min_lr)
        rule = "set directly" if hp.lr is not None else f"= {hp.base_lr:g} x {self.effective_batch} / 256"
        rank_zero_info(
            f"effective batch {self.effective_batch} = {batch_size} per device x {trainer.num_devices} device(s) "
            f"x {trainer.num_nodes} node(s) x {accumulate} accumulation; lr {self.resolved_lr:.4g} ({rule}); "
            f"{steps_per_epoch} steps/epoch, {warmup_steps} warmup steps, {int(total_steps)} steps"
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def lr_scheduler_step(self, scheduler, metric: Any) -> None:
        # timm schedulers take the number of optimizer updates done so far.
        scheduler.step_update(num_updates=self.global_step)
