"""What the pretraining and fine-tuning modules share: kernel settings, the optimiser's step-wise
schedule (both groups of ``mae.training.settings``), the training-loss guard and logging, the lr monitor
and the checkpoint's architecture record."""

import inspect
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from torch import nn
from torch.distributed.fsdp import FSDPModule

from mae.convert.architecture import ARCHITECTURE_KEY, DATA_KEY, data_record
from mae.errors import ConfigError
from mae.training.optim import resolve_schedule, stepwise_schedule
from mae.training.runtime import TrainingSettings, set_attention_kernel, settings_for_trainer
from mae.training.settings import KernelChoices, OptimSettings, plain


class LossCapture(ABC):
    """A callback that keeps a step whose training loss went non-finite, before the run stops:
    ``check_finite_loss`` hands the step to the first enabled one among the trainer's callbacks
    (``mae.training.callbacks.nonfinite.NonFiniteCapture``). The guard knows this interface, not the
    callback: the callbacks import this module."""

    enabled: bool

    @abstractmethod
    def capture(
        self, trainer: pl.Trainer, module: pl.LightningModule, loss: torch.Tensor | None = None
    ) -> Exception:
        """Keep the step (of a non-finite ``loss``; None: of a non-finite gradient) and return the error
        to stop the run with."""


def check_finite_loss(loss: torch.Tensor, module: pl.LightningModule) -> None:
    """Stop the run before a non-finite loss reaches the weights (or any checkpoint); with a
    ``LossCapture`` callback (``NonFiniteCapture``, on in the ``mae`` commands), keep the step in the run
    folder first.

    Under several processes the decision is taken together (a collective): every process stops at a step
    where any process's loss is non-finite.

    Raises:
        NonFiniteError: (``mae.training.callbacks.nonfinite``, with the capture) naming the step, the first
            module whose output is non-finite, the capture folder and the command that replays it.
        FloatingPointError: (without it) naming the step, the epoch and the last checkpoint left intact.
    """
    finite = bool(torch.isfinite(loss).item())
    trainer = module.trainer
    if trainer.world_size > 1:
        # Every process stops at the same step: one stopping alone would leave the others waiting in the
        # next collective.
        nonfinite = torch.tensor(0.0 if finite else 1.0, device=loss.device)
        if trainer.strategy.reduce(nonfinite, reduce_op="sum").item() == 0:
            return
    elif finite:
        return
    capture = next((c for c in trainer.callbacks if isinstance(c, LossCapture) and c.enabled), None)
    if capture is not None:
        raise capture.capture(trainer, module, loss)
    if finite:
        raise FloatingPointError(
            f"the training loss of another process is non-finite at step {trainer.global_step}: stopped with "
            "it before the update (its error names the process)"
        )
    callback = trainer.checkpoint_callback
    last = getattr(callback, "last_model_path", "") or "none written yet"
    raise FloatingPointError(
        f"non-finite training loss ({loss.item()}) at step {trainer.global_step} (epoch "
        f"{trainer.current_epoch}); stopped before the update, so no checkpoint holds it (last good: "
        f"{last}). Resume from it with a lower lr, bf16-mixed instead of 16-mixed, or check the input data."
    )


class MAETrainingModule(pl.LightningModule, ABC):
    """Base of ``MAEPretrainModule`` and the transfers (``mae.training.transfer.TransferModule``).

    A subclass passes its ``optim`` and ``kernels`` groups (``mae.training.settings``), records its
    hyperparameters with ``save_settings``, sets ``self.network`` (the ``nn.Module`` trained
    and checkpointed, under the attribute named by ``network_attribute``), implements
    ``build_optimizer(lr)`` and ``architecture_record()``, and calls ``log_training_loss`` in its
    ``training_step``.
    """

    network_attribute: str
    # True while ``mae.training.replay.replay_step`` re-runs a captured training step: its loss
    # is then neither checked nor logged.
    replaying: bool = False

    def __init__(self, optim: OptimSettings, kernels: KernelChoices) -> None:
        super().__init__()
        self.optim = optim
        self.kernels = kernels
        self.settings: TrainingSettings | None = None  # resolved for the training device in setup()
        self.effective_batch: int | None = None
        self.resolved_lr: float | None = None
        self.flops_per_batch: int | None = None  # read by Lightning's ThroughputMonitor

    def save_settings(self, **groups: Any) -> None:
        """``save_hyperparameters()`` of the calling ``__init__`` (and its subclasses'), with each settings
        group (``optim``, ``kernels`` and the caller's ``groups``) recorded as the dict of its resolved
        fields, so that checkpoints and ``hparams.yaml`` hold plain values, whatever form the caller gave."""
        self.save_hyperparameters(frame=inspect.currentframe().f_back)
        resolved = {"optim": self.optim, "kernels": self.kernels, **groups}
        self.save_hyperparameters(
            {**self.hparams, **{name: plain(group) for name, group in resolved.items()}}
        )

    @property
    def network(self) -> nn.Module:
        return getattr(self, self.network_attribute)

    @property
    def encoder(self) -> nn.Module:
        """What the monitors evaluate: a network whose ``forward_features`` maps (N, C, H, W) images to
        (N, 1 + L, D) normed tokens, cls first, on all patches (the MAE, or the fine-tuned ViT)."""
        return self.network

    @abstractmethod
    def build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The optimizer over ``self.network``'s parameter groups, at learning rate ``lr``."""

    @abstractmethod
    def architecture_record(self) -> dict[str, Any]:
        """The checkpoint's ``mae_architecture`` entry (``mae.convert.architecture``)."""

    def resolve_settings(self, steps: float | None = None) -> TrainingSettings:
        """The run's kernel choices: the measured defaults for the device, precision and run length
        (``steps`` optimizer steps), with this module's overrides. Under fp16 with gradient clipping the
        AdamW is not fused: a fused AdamW unscales the gradients inside its step, after Lightning would
        clip them (Lightning refuses the pair).

        Raises:
            ConfigError: ``kernels.fused_adamw: true`` with ``trainer.gradient_clip_val`` under fp16.
        """
        settings = self.kernels.resolve(settings_for_trainer(self.trainer, steps))
        scaled = getattr(self.trainer.precision_plugin, "scaler", None) is not None
        if settings.fused_adamw and scaled and self.trainer.gradient_clip_val:
            if self.kernels.fused_adamw is True:
                clip, precision = self.trainer.gradient_clip_val, self.trainer.precision
                raise ConfigError(
                    "model.kernels.fused_adamw: true cannot clip gradients (trainer.gradient_clip_val: "
                    f"{clip}) under trainer.precision {precision}: the fused AdamW unscales the gradients "
                    "inside its step; set model.kernels.fused_adamw: auto (the plain AdamW then) or drop "
                    "the clipping"
                )
            settings = replace(settings, fused_adamw=False)
        return settings

    def setup(self, stage: str) -> None:
        self.settings = self.resolve_settings(
            self.trainer.estimated_stepping_batches if stage == "fit" else 0
        )
        set_attention_kernel(self.network, self.settings.attention)

    def configure_model(self) -> None:
        # Under FSDP2 (mae.training.sharding): each transformer block sharded, then the whole network.
        from mae.training.sharding import FSDP2Strategy, transformer_blocks

        try:
            strategy = self.trainer.strategy
        except (
            RuntimeError
        ):  # not attached to a trainer: Lightning's load_from_checkpoint calls this hook too
            return
        if isinstance(strategy, FSDP2Strategy) and not isinstance(self.network, FSDPModule):  # once
            strategy.shard(self.network, transformer_blocks(self.network), self.trainer.precision)

    def on_fit_start(self) -> None:
        if self.settings.compile:
            self.network.compile()  # in place: checkpoints keep the plain parameter names

    def configure_callbacks(self) -> list[pl.Callback]:
        # The lr of every parameter group, each logged step, as ``train/lr/<group>``.
        return [LearningRateMonitor(logging_interval="step")] if self.trainer.loggers else []

    def configure_optimizers(self) -> dict:
        base_lr, lr = self.optim.base_lr, self.optim.lr
        resolved = resolve_schedule(self.trainer, base_lr, lr, self.optim.warmup_epochs)
        self.effective_batch, self.resolved_lr = resolved.effective_batch, resolved.lr
        optimizer = self.build_optimizer(resolved.lr)
        config = stepwise_schedule(optimizer, resolved, self.trainer, base_lr, lr, self.optim.min_lr)
        config["lr_scheduler"]["name"] = "train/lr"
        return config

    def on_train_start(self) -> None:
        # A resumed run's optimizer holds the checkpoint's last lr: its first step takes this run's.
        self.lr_schedulers().step_update(num_updates=self.global_step)

    def lr_scheduler_step(self, scheduler, metric: Any) -> None:
        # timm schedulers take the number of optimizer updates done so far (and apply lr_scale).
        scheduler.step_update(num_updates=self.global_step)

    def log_training_loss(self, loss: torch.Tensor, batch_size: int) -> None:
        """Stop on a non-finite loss (before the update), else log ``train/loss`` per step and epoch."""
        if self.replaying:
            return
        check_finite_loss(loss, self)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=batch_size)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[ARCHITECTURE_KEY] = self.architecture_record()
        data = data_record(getattr(self.trainer, "datamodule", None))
        if data is not None:
            checkpoint[DATA_KEY] = data
