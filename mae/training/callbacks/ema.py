"""Weight EMA of a fine-tuning run (``mae finetune --ema.decay 0.9999``): timm's ``ModelEmaV3`` of the
classifier, updated after every optimizer step, evaluated beside the live weights, kept in checkpoints."""

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_warn
from timm.utils import ModelEmaV3
from torchmetrics.classification import MulticlassAccuracy

from mae.convert.sources import EMA_WEIGHTS_KEY  # where exports read them: mae.convert.sources.ema_checkpoint
from mae.errors import ConfigError


class EMA(pl.Callback):
    """An exponential moving average of the weights of ``pl_module.network`` (timm's ``ModelEmaV3``: every
    float parameter and buffer), off unless ``decay`` is set.

    The average is updated after each optimizer step (once per ``trainer.accumulate_grad_batches``
    batches) with timm's step-aware decay: the first update copies the weights, every later one keeps
    ``decay`` of the average. At each validation the EMA classifier sees the same batches as the live
    one and its top-1 / top-5 accuracy is logged as ``val/acc1_ema`` / ``val/acc5_ema`` (reduced
    across processes as ``val/acc1`` is; under DDP every process holds the EMA copy). The average and the
    step it was last updated at are saved in every checkpoint and restored on resume (and on
    ``--validate_only`` of a checkpoint that holds them); ``mae export --ema`` exports them.

    Args:
        decay: the weight of the average at each update, e.g. 0.9999 (timm's default); None: off.
        warmup: timm's decay warmup (``use_warmup``: decay ``1 - (1 + step) ** -2/3``, capped at ``decay``),
            for short runs whose average should follow the weights more closely early on.
    """

    def __init__(self, decay: float | None = None, warmup: bool = False) -> None:
        if decay is not None and not 0 < decay < 1:
            raise ConfigError(f"ema.decay must be in (0, 1), e.g. 0.9999, or null (off); got {decay}")
        self.decay, self.warmup = decay, warmup
        self.ema: ModelEmaV3 | None = None
        self.updated_at = 0  # the global step of the last update
        self._loaded: dict[str, Any] | None = None  # restored before the EMA copy exists
        self._metrics: dict[str, MulticlassAccuracy] = {}

    @property
    def enabled(self) -> bool:
        return self.decay is not None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self.enabled:
            return
        if isinstance(trainer.strategy, FSDPStrategy | ModelParallelStrategy):
            raise ConfigError(
                "ema.decay: the EMA keeps whole weights on every process and FSDP shards them; use "
                "trainer.strategy: ddp, or leave ema.decay unset"
            )
        classes = pl_module.num_classes
        self._metrics = {
            f"val/acc{k}_ema": MulticlassAccuracy(classes, top_k=min(k, classes), average="micro")
            for k in (1, 5)
        }

    def _build(self, pl_module: pl.LightningModule) -> None:
        """The EMA copy of the (unwrapped, uncompiled) network, on its device, with any restored state."""
        self.ema = ModelEmaV3(pl_module.network, decay=self.decay, use_warmup=self.warmup)
        if self._loaded is not None:
            self._restore()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Called before the module's own on_fit_start compiles the network: the copy stays eager.
        if self.enabled:
            self._build(pl_module)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.ema is not None and trainer.global_step > self.updated_at:  # an optimizer step was taken
            self.ema.update(pl_module.network, step=trainer.global_step)
            self.updated_at = trainer.global_step

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.ema is None and self._loaded is not None:  # --validate_only of a checkpoint with an EMA
            self._build(pl_module)
        elif self.ema is None and self.enabled:
            rank_zero_warn("ema.decay is set but the checkpoint holds no EMA weights: nothing to evaluate")
        for metric in self._metrics.values():
            metric.to(pl_module.device)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: tuple[torch.Tensor, torch.Tensor],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.ema is None:
            return
        imgs, targets = batch
        precision = trainer.precision_plugin
        with torch.no_grad(), precision.val_step_context():
            logits = self.ema.module(precision.convert_input(imgs))
        for name, metric in self._metrics.items():
            metric.update(logits, targets)
            pl_module.log(name, metric, metric_attribute=name)

    def state_dict(self) -> dict[str, Any]:
        if self.ema is None:
            return dict(self._loaded or {})
        return {"decay": self.decay, "step": self.updated_at, EMA_WEIGHTS_KEY: self.ema.module.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self.enabled:
            rank_zero_warn(
                "the checkpoint holds EMA weights but ema.decay is not set: they are not carried on (set "
                f"--ema.decay {state_dict.get('decay')} to continue them)"
            )
            return
        self._loaded = state_dict
        if self.ema is not None:  # restored after on_fit_start (strategies that restore after setup)
            self._restore()

    def _restore(self) -> None:
        """The EMA copy and its step from the checkpoint state given to ``load_state_dict``."""
        self.ema.module.load_state_dict(self._loaded[EMA_WEIGHTS_KEY])
        self.updated_at = self._loaded["step"]
        self._loaded = None
