"""What the periodic monitors (reconstruction figures, kNN, linear probe, the dense tasks' figures) share:
when they run, which processes evaluate, where they write, the data they may evaluate on, and evaluating
without touching the training run."""

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_type_hints

import lightning.pytorch as pl
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from mae.data import ImageDataModule
from mae.errors import ALLOWED, ConfigError
from mae.training.base import MAETrainingModule
from mae.training.sharding import is_sharded


def is_last_epoch(trainer: pl.Trainer) -> bool:
    """Whether the epoch ending now is the run's last: ``max_epochs`` reached, ``max_steps`` reached
    (Lightning ends that epoch early, and still calls ``on_train_epoch_end``), or the run told to stop
    (``trainer.should_stop``: early stopping, ``max_time``)."""
    by_epochs = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1
    by_steps = trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step
    return by_epochs or by_steps or trainer.should_stop


def evaluates_here(trainer: pl.Trainer) -> bool:
    """Whether this process evaluates a monitor: global rank 0 alone, or every process under FSDP2, where no
    process holds the whole model and each takes part in every forward (which gathers the shards)."""
    return trainer.is_global_zero or is_sharded(trainer)


class PeriodicMonitor(pl.Callback, ABC):
    """Runs ``monitor`` at the end of every ``every_n_epochs``-th epoch and of the run's last epoch
    (however the run ends: ``max_epochs`` or ``max_steps`` mid-epoch), once per epoch, so never twice
    for the same weights; ``every_n_epochs`` 0 disables it.

    Which processes run ``monitor`` is decided here, for every monitor (``evaluates_here``): global rank 0,
    or every process under FSDP2. ``monitor`` logs with ``rank_zero_only`` and writes files on global rank 0
    only (``trainer.is_global_zero``). A monitor that writes files names their ``folder`` under the run's
    log folder; ``self.out_dir`` is that folder, found on every process when the monitor is due (a
    collective).

    A new monitor subclasses this, checks its settings in ``__init__`` and implements ``monitor``.
    """

    folder: str | None = None  # where a monitor that writes files writes them, under the run's log folder

    def __init__(self, every_n_epochs: int) -> None:
        self.every_n_epochs = every_n_epochs
        self.out_dir: Path | None = None

    def is_due(self, trainer: pl.Trainer) -> bool:
        epoch = trainer.current_epoch + 1
        return bool(self.every_n_epochs) and (epoch % self.every_n_epochs == 0 or is_last_epoch(trainer))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.is_due(trainer):
            return
        if self.folder is not None:  # on every process: finding the log folder is a collective
            self.out_dir = Path(trainer.log_dir or trainer.default_root_dir) / self.folder
        if evaluates_here(trainer):
            self.monitor(trainer, pl_module, trainer.current_epoch + 1)

    @abstractmethod
    def monitor(self, trainer: pl.Trainer, pl_module: MAETrainingModule, epoch: int) -> None:
        """Evaluate ``pl_module`` after ``epoch`` (1-based) and log or write the result."""


class FeatureMonitor(PeriodicMonitor):
    """A monitor of the encoder's frozen features (the kNN and linear-probe monitors): measured on a fixed
    subset of at most ``max_train`` training and ``max_val`` validation images of the data module, skipped
    when it has no validation split. Each run first prints what it extracts (``announce``) and shows its
    progress on stderr unless the trainer's progress bar is off (``trainer.enable_progress_bar: false``).

    A subclass names its config ``section`` and implements ``measure`` and ``announce``; its ``__init__``
    passes its own settings on as ``bounded``, to be checked with these against its annotations
    (``check_bounds``).
    """

    section: str  # the monitor's settings in a config: knn, probe

    def __init__(self, every_n_epochs: int, max_train: int, max_val: int, **bounded: Any) -> None:
        values = dict(every_n_epochs=every_n_epochs, max_train=max_train, max_val=max_val, **bounded)
        check_bounds(self.section, type(self).__init__, **values)
        super().__init__(every_n_epochs)
        self.max_train, self.max_val = max_train, max_val

    def monitor(self, trainer: pl.Trainer, pl_module: MAETrainingModule, epoch: int) -> None:
        data = evaluation_data(trainer)
        if data is None:
            return
        with evaluating(pl_module, pl_module.encoder) as encoder:
            metrics = self.measure(encoder, data, trainer, pl_module.device)
        pl_module.log_dict(metrics, rank_zero_only=True)

    @abstractmethod
    def measure(
        self, encoder: nn.Module, data: ImageDataModule, trainer: pl.Trainer, device: torch.device
    ) -> dict[str, float]:
        """The logged metrics of ``encoder`` (in evaluation mode) on ``data``'s splits, on ``device``."""

    @abstractmethod
    def announce(self, train_images: int, val_images: int) -> None:
        """Say, once per run of the monitor, what it extracts and which settings limit it or turn it off."""

    def extraction(self, trainer: pl.Trainer) -> dict[str, Any]:
        """What every evaluation of ``mae.eval`` takes of the monitor: the subset sizes, whether this process
        shows the progress (global rank 0, with the progress bar on) and ``announce``."""
        progress = trainer.is_global_zero and trainer.progress_bar_callback is not None
        return dict(max_train=self.max_train, max_val=self.max_val, progress=progress, announce=self.announce)


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
