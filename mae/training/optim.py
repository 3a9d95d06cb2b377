"""Optimisation as in the MAE recipe: lr scaling, weight-decay groups, per-step warmup + cosine."""

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from timm.optim import Lamb, param_groups_weight_decay
from timm.scheduler import CosineLRScheduler
from torch import nn
from torch.optim import Optimizer

from mae.compat.torch import WRAPPER_MODULE_NAMES
from mae.errors import ConfigError


def effective_batch_size(batch_size: int, devices: int = 1, nodes: int = 1, accumulate: int = 1) -> int:
    """Images per optimizer step: per-device batch x devices x nodes x gradient accumulation."""
    return batch_size * devices * nodes * accumulate


def scaled_lr(base_lr: float, effective_batch: int) -> float:
    """The linear scaling rule of the MAE recipe: ``lr = base_lr * effective_batch / 256``."""
    return base_lr * effective_batch / 256


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay on weights only: biases and 1-D parameters (norms) get none, as in the official code.

    Frozen tensors (the sin-cos position embeddings) are not in any group. The groups are named
    "no_decay" and "decay" (the lr monitor logs ``train/lr/<name>``); a group without parameters is
    left out, so ``weight_decay=0`` gives one "no_decay" group of every parameter.
    """
    groups = param_groups_weight_decay(model, weight_decay)  # one group when nothing is decayed
    return [{**group, "name": "decay" if group["weight_decay"] else "no_decay"} for group in groups]


def encoder_decoder_groups(model: nn.Module, groups: list[dict]) -> list[dict]:
    """Each group of ``groups`` split into its encoder part and its decoder part (``decoder_*``
    parameters and the mask token), named ``encoder_<name>`` / ``decoder_<name>``; encoder groups are
    marked ``"encoder": True`` and every group has an ``lr_scale`` of 1 (to freeze the encoder)."""
    decoder = {id(p) for n, p in model.named_parameters() if n.startswith("decoder") or n == "mask_token"}
    out = []
    for group in groups:
        for part in ("encoder", "decoder"):
            params = [p for p in group["params"] if (id(p) in decoder) == (part == "decoder")]
            if params:
                name = f"{part}_{group.get('name', len(out))}"
                out.append(
                    {**group, "params": params, "name": name, "lr_scale": 1.0, "encoder": part == "encoder"}
                )
    return out


def adamw(groups: list[dict], lr: float, betas: tuple[float, float], fused: bool) -> Optimizer:
    """torch's AdamW (the MAE paper's optimiser); ``fused``: its single-kernel form."""
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def lamb(groups: list[dict], lr: float, betas: tuple[float, float], fused: bool) -> Optimizer:
    """timm's LAMB (You et al. 2020; SparK's optimiser): Adam's moments, each tensor's update scaled by
    its trust ratio ||w|| / ||update||. No clipping inside it (timm clips at 1.0 by default): the trainer's
    ``gradient_clip_val`` clips, as for AdamW (SparK clips at 5). ``fused`` has no LAMB form: ignored."""
    return Lamb(groups, lr=lr, betas=betas, max_grad_norm=None)


# ``model.optim.optimizer`` of pretraining: name -> (parameter groups, lr, betas, fused) -> optimizer.
PRETRAIN_OPTIMIZERS: dict[str, Callable[[list[dict], float, tuple[float, float], bool], Optimizer]] = {
    "adamw": adamw,
    "lamb": lamb,
}


# Name segments that wrappers insert (FSDP, activation checkpointing, torch.compile).
_WRAPPER_SEGMENTS = re.compile(rf"({'|'.join(WRAPPER_MODULE_NAMES)})\.")


@dataclass
class ParamGroupPlan:
    """Parameter groups fixed by parameter *name* when the model is built, applied to the parameters
    the optimizer gets later.

    Lightning builds the optimizer after a strategy has wrapped the model; FSDP turns every parameter
    into a 1-D view of its shard (and prefixes its name), so grouping at that point by ``ndim`` would
    put every weight in the no-decay group. A plan made from the unwrapped model keeps the groups.
    """

    settings: list[dict]  # each group's options (lr_scale, weight_decay, name, ...), without "params"
    group_of: dict[str, int]  # parameter name -> index of its group

    @classmethod
    def from_groups(cls, model: nn.Module, groups: list[dict]) -> "ParamGroupPlan":
        """The plan of ``groups`` (built on ``model``, unwrapped) by the names of their parameters."""
        names = {id(p): name for name, p in model.named_parameters()}
        group_of = {names[id(p)]: i for i, group in enumerate(groups) for p in group["params"]}
        return cls([{k: v for k, v in group.items() if k != "params"} for group in groups], group_of)

    def groups(self, model: nn.Module) -> list[dict]:
        """Optimizer groups holding ``model``'s parameters (wrapped or not) as planned.

        Raises:
            RuntimeError: a planned parameter is not in ``model`` (naming it).
        """
        out = [{**settings, "params": []} for settings in self.settings]
        found = set()
        for name, param in model.named_parameters():
            name = _WRAPPER_SEGMENTS.sub("", name)
            if name in self.group_of:
                out[self.group_of[name]]["params"].append(param)
                found.add(name)
        missing = sorted(set(self.group_of) - found)
        if missing:
            raise RuntimeError(f"parameters planned for the optimizer are not in the model: {missing[:5]}")
        return out


def check_warmup(warmup_steps: int, total_steps: int, setting: str = "the warmup", run: str = "") -> None:
    """Raises ValueError, naming ``setting`` (and ``run``, how the run's steps come about), unless the
    warmup is shorter than the run: the cosine needs at least one step after it."""
    if warmup_steps >= total_steps:
        raise ConfigError(
            f"{setting} ({warmup_steps} steps) is not shorter than the run ({total_steps} steps{run}); lower "
            "it or train longer"
        )


def check_schedule_settings(base_lr: float, lr: float | None, min_lr: float, warmup_epochs: float) -> None:
    """Raises ValueError, naming them, for a negative warmup or final lr, or a learning rate that is not
    positive: the settings of the schedule both modules share, checked when the module is built."""
    if warmup_epochs < 0 or min_lr < 0 or base_lr <= 0 or (lr is not None and lr <= 0):
        raise ConfigError(
            f"need warmup_epochs >= 0, min_lr >= 0 and a positive lr; got warmup_epochs={warmup_epochs}, "
            f"min_lr={min_lr}, base_lr={base_lr}, lr={lr}"
        )


class RunLengthCosine(CosineLRScheduler):
    """timm's warmup + cosine whose shape belongs to the run that builds it, never to a checkpoint.

    The position in the schedule is the optimizer step count (``step_update(num_updates)``), so a
    scheduler needs nothing from a checkpoint. timm's ``load_state_dict`` would restore the whole
    schedule (length, warmup, base lr) of the interrupted run: resumed with a larger
    ``trainer.max_epochs`` the cosine would still end at the old length and the new epochs would train
    at ``min_lr``. Here the resumed run follows its own command line, as the official code does (it
    computes the lr from ``args.epochs`` each step), and a schedule that differs is named in a warning.
    """

    SHAPE = {
        "warmup_t": "warmup steps",
        "t_initial": "cosine steps",
        "lr_min": "final lr",
        "base_values": "lr",
    }

    def load_state_dict(self, state_dict: dict) -> None:
        changed = [
            f"{label} {state_dict[key]} -> {getattr(self, key)}"
            for key, label in self.SHAPE.items()
            if key in state_dict and state_dict[key] != getattr(self, key)
        ]
        if changed:
            rank_zero_warn(
                "resuming with another schedule than the checkpoint's run ("
                + "; ".join(changed)
                + "): the lr "
                "follows this run's warmup + cosine from the resumed step on (to keep the checkpoint's, "
                "resume with its trainer.max_epochs / max_steps, batch size, devices and model lr settings)"
            )


def warmup_cosine_scheduler(
    optimizer: Optimizer, total_steps: int, warmup_steps: int, min_lr: float = 0.0
) -> RunLengthCosine:
    """Linear warmup from 0 over ``warmup_steps``, then a half-cycle cosine to ``min_lr`` at ``total_steps``.

    Call ``step_update(num_updates)`` after every optimizer step: the lr at step t equals the
    official schedule at fractional epoch t / steps_per_epoch.
    """
    check_warmup(warmup_steps, total_steps)
    return RunLengthCosine(
        optimizer,
        t_initial=total_steps - warmup_steps,
        lr_min=min_lr,
        warmup_t=warmup_steps,
        warmup_lr_init=0.0,
        warmup_prefix=True,
        t_in_epochs=False,
    )


@dataclass
class ResolvedSchedule:
    """The run's optimisation numbers, computed once the trainer knows devices and data length."""

    batch_size: int
    effective_batch: int
    lr: float
    steps_per_epoch: int
    warmup_steps: int
    total_steps: int

    def describe(self, trainer: pl.Trainer, rule: str) -> str:
        return (
            f"effective batch {self.effective_batch} = {self.batch_size} per device x {trainer.num_devices} "
            f"device(s) x {trainer.num_nodes} node(s) x {trainer.accumulate_grad_batches} accumulation; lr "
            f"{self.lr:.4g} ({rule}); {self.steps_per_epoch} steps/epoch, {self.warmup_steps} warmup steps, "
            f"{self.total_steps} steps"
        )


def resolve_schedule(
    trainer: pl.Trainer, base_lr: float, lr: float | None, warmup_epochs: float
) -> ResolvedSchedule:
    """Effective batch, scaled lr and step counts of a Lightning run (call from ``configure_optimizers``).

    Raises:
        ValueError: a run of 0 steps, an unbounded run, data without a length, or a warmup not shorter
            than the run.
    """
    if trainer.max_epochs == 0 or trainer.max_steps == 0:  # Lightning would estimate one epoch's steps
        raise ConfigError(
            f"this run has 0 optimizer steps (trainer.max_epochs={trainer.max_epochs}, "
            f"trainer.max_steps={trainer.max_steps}): nothing to train; set a positive number of epochs or "
            "steps"
        )
    total_steps = trainer.estimated_stepping_batches
    if not math.isfinite(total_steps):
        raise ConfigError(
            "set trainer.max_epochs or trainer.max_steps: the cosine schedule needs the run length"
        )
    accumulate = trainer.accumulate_grad_batches
    batch_size = per_device_batch_size(trainer)
    effective = effective_batch_size(batch_size, trainer.num_devices, trainer.num_nodes, accumulate)
    if trainer.train_dataloader is None:  # not loaded when only max_steps bounds the run
        trainer.fit_loop.setup_data()
    if not math.isfinite(trainer.num_training_batches):
        raise ConfigError(
            "the training data has no length, so model.optim.warmup_epochs cannot be turned into steps"
        )
    # Lightning steps the optimizer on an epoch's last batch even mid-accumulation.
    steps_per_epoch = math.ceil(trainer.num_training_batches / accumulate)
    warmup_steps = round(warmup_epochs * steps_per_epoch)
    check_warmup(
        warmup_steps,
        int(total_steps),
        f"model.optim.warmup_epochs={warmup_epochs}",
        f" of {steps_per_epoch} per epoch",
    )
    resolved_lr = lr if lr is not None else scaled_lr(base_lr, effective)
    return ResolvedSchedule(
        batch_size, effective, resolved_lr, steps_per_epoch, warmup_steps, int(total_steps)
    )


def per_device_batch_size(trainer: pl.Trainer) -> int:
    """The data module's ``batch_size`` (or the training loader's)."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and hasattr(datamodule, "batch_size"):
        return datamodule.batch_size
    return trainer.train_dataloader.batch_size


def stepwise_schedule(
    optimizer: Optimizer,
    schedule: ResolvedSchedule,
    trainer: pl.Trainer,
    base_lr: float,
    lr: float | None,
    min_lr: float,
) -> dict:
    """Lightning's optimizer config with the warmup + cosine updated every step; prints the numbers.

    Pair with ``lr_scheduler_step`` calling ``scheduler.step_update(num_updates=global_step)``.
    """
    scheduler = warmup_cosine_scheduler(optimizer, schedule.total_steps, schedule.warmup_steps, min_lr)
    rule = "set directly" if lr is not None else f"= {base_lr:g} x {schedule.effective_batch} / 256"
    rank_zero_info(schedule.describe(trainer, rule))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
