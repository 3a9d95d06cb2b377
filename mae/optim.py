"""Optimisation as in the MAE recipe: lr scaling, weight-decay groups, per-step warmup + cosine."""

import math

from timm.optim import param_groups_weight_decay
from timm.scheduler import CosineLRScheduler
from torch import nn
from torch.optim import Optimizer


def effective_batch_size(batch_size: int, devices: int = 1, nodes: int = 1, accumulate: int = 1) -> int:
    """Images per optimizer step: per-device batch x devices x nodes x gradient accumulation."""
    return batch_size * devices * nodes * accumulate


def scaled_lr(base_lr: float, effective_batch: int) -> float:
    """The linear scaling rule of the MAE recipe: ``lr = base_lr * effective_batch / 256``."""
    return base_lr * effective_batch / 256


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay on weights only: biases and 1-D parameters (norms) get none, as in the official code.

    Frozen tensors (the sin-cos position embeddings) are not in any group.
    """
    return param_groups_weight_decay(model, weight_decay)


def warmup_cosine_scheduler(
    optimizer: Optimizer, total_steps: int, warmup_steps: int, min_lr: float = 0.0
) -> CosineLRScheduler:
    """Linear warmup from 0 over ``warmup_steps``, then a half-cycle cosine to ``min_lr`` at ``total_steps``.

    Call ``step_update(num_updates)`` after every optimizer step: the lr at step t equals the
    official schedule at fractional epoch t / steps_per_epoch.
    """
    if warmup_steps >= total_steps:
        raise ValueError(f"warmup ({warmup_steps} steps) must be shorter than the run ({total_steps} steps)")
    return CosineLRScheduler(
        optimizer,
        t_initial=total_steps - warmup_steps,
        lr_min=min_lr,
        warmup_t=warmup_steps,
        warmup_lr_init=0.0,
        warmup_prefix=True,
        t_in_epochs=False,
    )


def official_lr(epoch: float, lr: float, min_lr: float, warmup_epochs: float, epochs: float) -> float:
    """The official MAE schedule at a fractional epoch (reference for tests and for reading)."""
    if epoch < warmup_epochs:
        return lr * epoch / warmup_epochs
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * (epoch - warmup_epochs) / (epochs - warmup_epochs)))
