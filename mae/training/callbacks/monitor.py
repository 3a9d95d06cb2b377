"""What the periodic monitors (reconstruction figures, kNN, linear probe) share: when they run, the
data they may evaluate on, and evaluating without touching the training run."""

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, get_type_hints

import lightning.pytorch as pl
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from mae.errors import ALLOWED
from mae.data import ImageDataModule
from mae.errors import ConfigError
from mae.training.base import MAETrainingModule


def is_last_epoch(trainer: pl.Trainer) -> bool:
    """Whether the epoch ending now is the run's last: ``max_epochs`` reached, ``max_steps`` reached
    (Lightning ends that epoch early, and still calls ``on_train_epoch_end``), or the run told to stop
    (``trainer.should_stop``: early stopping, ``max_time``)."""
    by_epochs = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1
    by_steps = trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step
    return by_epochs or by_steps or trainer.should_stop


class PeriodicMonitor(pl.Callback, ABC):
    """Runs ``monitor`` at the end of every ``every_n_epochs``-th epoch and of the run's last epoch
    (however the run ends: ``max_epochs`` or ``max_steps`` mid-epoch), once per epoch, so never twice
    for the same weights; ``every_n_epochs`` 0 disables it. ``monitor`` is called on every process
    (a subclass that evaluates on one process checks ``trainer.is_global_zero``).

    A new monitor subclasses this, checks its settings in ``__init__`` and implements ``monitor``.
    """

    def __init__(self, every_n_epochs: int) -> None:
        self.every_n_epochs = every_n_epochs

    def is_due(self, trainer: pl.Trainer) -> bool:
        epoch = trainer.current_epoch + 1
        return bool(self.every_n_epochs) and (epoch % self.every_n_epochs == 0 or is_last_epoch(trainer))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.is_due(trainer):
            self.monitor(trainer, pl_module, trainer.current_epoch + 1)

    @abstractmethod
    def monitor(self, trainer: pl.Trainer, pl_module: MAETrainingModule, epoch: int) -> None:
        """Evaluate ``pl_module`` after ``epoch`` (1-based) and log or write the result."""


def check_bounds(section: str, init: Callable, **values: Any) -> None:
    """Check a monitor's settings against the jsonargparse restricted number types ``init`` annotates them
    with (``PositiveInt``, ...): the ``mae pretrain`` parser checks them from the same annotations, this
    check covers a monitor built in Python.

    Raises:
        ConfigError: a value outside its range, naming ``<section>.<name>`` and the range.
    """
    hints = get_type_hints(init)
    for name, value in values.items():
        bound = hints.get(name)
        if bound not in ALLOWED:
            continue
        try:
            bound(value)
        except ValueError:
            raise ConfigError(f"{section}.{name} must be {ALLOWED[bound]}, got {value}") from None


def evaluation_data(trainer: pl.Trainer) -> ImageDataModule | None:
    """The run's data module when it is an ``ImageDataModule`` with a validation split (set up by
    the end of an epoch), else None: nothing to score on."""
    datamodule = trainer.datamodule
    return datamodule if isinstance(datamodule, ImageDataModule) and datamodule.val_set is not None else None


@contextmanager
def evaluating(pl_module: pl.LightningModule, network: nn.Module) -> Iterator[nn.Module]:
    """``network`` in evaluation mode (its mode restored after), with the RNG of the CPU and of the
    module's CUDA device forked: loaders and transforms draw from it, and monitoring must never change
    the training run; a module with phases of input size evaluates at its final size. A network sharded
    by FSDP2 has its own parameters (embeddings, norms, head) gathered for the block, so that any of its
    methods runs (each block gathers its own in its forward); every process must evaluate then."""
    was_training = network.training
    network.eval()
    sharded = isinstance(network, FSDPModule)
    if sharded:
        network.unshard()
    devices = [pl_module.device] if pl_module.device.type == "cuda" else []
    # a progressive-resolution run (model.resolution_schedule) is monitored at its final size
    final_size = getattr(pl_module, "at_img_size", contextlib.nullcontext)
    try:
        with torch.random.fork_rng(devices=devices), final_size():
            yield network
    finally:
        if sharded:
            network.reshard()
        network.train(was_training)
