"""Run health in the metrics: the gradient norm before clipping, the size of each update against the
weights, the fp16 loss scale, and a warning when the gradient norm jumps."""

import statistics
from collections import deque

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from mae.compat.lightning import is_logging_step
from mae.compat.torch import unscales_in_step
from mae.errors import ConfigError
from mae.training.sharding import total_norm

# Logged values the median needs before a jump is judged against it.
MIN_HISTORY = 10


class RunHealth(pl.Callback):
    """On every logging step (``trainer.log_every_n_steps``) log, through ``self.log`` (the CSV metrics
    and the tracker):

    - ``train/grad_norm``: the total 2-norm of the gradients before clipping (``trainer.gradient_clip_val``
      clips after this hook), over every process's shards under FSDP2; under fp16 unscaled (a fused
      optimizer unscales inside its step, so its gradients are divided by the scale here); inf or NaN for a
      step the loss scaler skips;
    - ``train/update_ratio``: ||w_after - w_before|| / ||w_before|| over the trainable parameters, the
      relative size of the optimizer's update (0 for a skipped step); it keeps a copy of the weights on
      those steps only, from before the step to after it;
    - ``train/loss_scale``: the ``GradScaler``'s scale the step's gradients were scaled by (fp16 only).

    A gradient norm over ``jump_factor`` times the median of the last ``window`` logged ones (once at
    least ``MIN_HISTORY`` are) warns once, naming the step.

    Args:
        enabled: False: none of it.
        jump_factor: the jump that warns; 0: never warn.
        window: how many logged gradient norms the median is over.
    """

    def __init__(self, enabled: bool = True, jump_factor: float = 100.0, window: int = 100) -> None:
        if jump_factor < 0 or window < 1:
            raise ConfigError(
                f"health.jump_factor must be >= 0 and health.window >= 1, got {jump_factor} and {window}"
            )
        self.enabled = enabled
        self.jump_factor = jump_factor
        self.recent: deque[float] = deque(maxlen=window)
        self.warned_at: int | None = None  # the step of the jump warning, once given
        self._before: list[torch.Tensor] | None = None  # the weights before this logging step's update
        self._weight_norm: torch.Tensor | None = None

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        # The logger connector's own test of a logging step (what on_step metrics are written on).
        if not self.enabled or not is_logging_step(trainer):
            return
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        metrics = {}
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        total = total_norm(grads) if grads else None
        if scaler is not None:
            scale = scaler.get_scale()
            metrics["train/loss_scale"] = float(scale)
            if total is not None and unscales_in_step(optimizer):
                total = total / scale  # still scaled: the fused optimizer unscales inside its step
        if total is not None:
            metrics["train/grad_norm"] = float(total)
            if torch.isfinite(total):
                self._watch(float(total), trainer.global_step)
        if metrics:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False)
        params = [p.detach() for p in pl_module.parameters() if p.requires_grad]
        self._before = [p.clone() for p in params]
        self._weight_norm = total_norm(params)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if self._before is None:
            return
        params = [p.detach() for p in pl_module.parameters() if p.requires_grad]
        for before, after in zip(self._before, params, strict=True):
            before.sub_(after)  # in place: the update, without another copy of the weights
        update = total_norm(self._before)
        ratio = update / self._weight_norm if self._weight_norm > 0 else torch.zeros_like(update)
        self._before = self._weight_norm = None
        pl_module.log("train/update_ratio", float(ratio), on_step=True, on_epoch=False)

    def _watch(self, norm: float, step: int) -> None:
        """Warn once when ``norm`` (the gradient norm of step ``step``) jumps against the recent median."""
        if self.jump_factor and self.warned_at is None and len(self.recent) >= MIN_HISTORY:
            median = statistics.median(self.recent)
            if median > 0 and norm > self.jump_factor * median:
                self.warned_at = step
                rank_zero_warn(
                    f"train/grad_norm jumped to {norm:.4g} at step {step}: {norm / median:.0f}x its median "
                    f"{median:.4g} over the last {len(self.recent)} logged steps. A loss spike or a NaN may "
                    "follow; if it does, resume from a checkpoint before this step with a lower lr or "
                    "trainer.gradient_clip_val (warned once per run)"
                )
        self.recent.append(norm)
