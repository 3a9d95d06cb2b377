"""Data loaders: one rule for a split's loader (``split_loader``), and workers that leave a scheduler's
SIGTERM to the main process.

A cluster scheduler (SLURM on preemption, ``scancel``, a time limit) sends SIGTERM to every process
of the job, loader workers included. PyTorch's workers die on a SIGTERM that does not come from
their parent, and the main process then fails its running step with "DataLoader worker ... is
killed by signal: Terminated" instead of writing its preemption checkpoint. Every loader of this
project is a ``SigtermSafeLoader`` whose workers start with ``worker_init``, so the main process
alone decides when they stop.
"""

import os
import signal
from collections.abc import Callable
from types import FrameType

import torch
import torch.distributed as dist
from lightning.fabric.utilities.seed import pl_worker_init_function
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.signal_handling import _set_worker_signal_handlers

from mae.errors import ConfigError


def _leave_first_sigterm_to_main(signum: int, frame: FrameType | None) -> None:
    """The first SIGTERM is the job-wide signal: the main process saves and then shuts this worker
    down itself. Any later SIGTERM (the loader's own ``terminate()`` of a worker that did not stop)
    gets PyTorch's worker handler again: from the parent it exits, from anyone else it kills."""
    _set_worker_signal_handlers()


def worker_init(worker_id: int) -> None:
    """``worker_init_fn`` of every loader: Lightning's worker seeding when the run seeds workers
    (``seed_everything(workers=True)``, which LightningCLI does; Lightning adds its seeding only to
    loaders without a ``worker_init_fn``), then the SIGTERM handling above."""
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id)
    signal.signal(signal.SIGTERM, _leave_first_sigterm_to_main)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked by SigtermSafeLoader at the fork


class SigtermSafeLoader:
    """A ``DataLoader`` mixin: workers are forked with SIGTERM blocked, so a job-wide SIGTERM that
    arrives while they start waits until ``worker_init`` has taken it over (PyTorch's own worker
    handler would end them). The main process's SIGTERM waits those milliseconds too."""

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            return super()._get_iterator()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Loader(SigtermSafeLoader, DataLoader):
    """``torch.utils.data.DataLoader`` with workers that leave SIGTERM to the main process."""

    def __init__(self, *args, worker_init_fn=worker_init, **kwargs) -> None:
        super().__init__(*args, worker_init_fn=worker_init_fn, **kwargs)


def split_loader(
    dataset: Dataset,
    train: bool,
    batch_size: int,
    collate_fn: Callable,
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
) -> Loader:
    """The loader of a split, for every data module: training shuffled, its last incomplete batch dropped;
    validation in order and, under DDP, every image exactly once across processes (Lightning's default
    sampler pads the shards with repeats), so metrics reduced over processes equal the single-process ones."""
    sampler = None
    if not train and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        sampler = UnrepeatedDistributedSampler(dataset, shuffle=False)
    return Loader(
        dataset,
        batch_size=batch_size,
        shuffle=train,
        sampler=sampler,
        drop_last=train,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        persistent_workers=persistent_workers and num_workers > 0,
    )


class SplitLoaders:
    """The loaders of a data module with a ``train_set`` and a ``val_set`` (None: no validation), for
    every data module (images, detection, segmentation): ``split_loader`` with its ``collate_fn()``, and
    the check that the training split holds one batch at least.

    A data module sets ``batch_size``, ``num_workers``, ``pin_memory`` and ``persistent_workers``;
    it may override ``collate_fn``, ``training_set`` (built lazily) and ``training_set_name``.
    """

    batch_size: int
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    train_set: Dataset | None
    val_set: Dataset | None

    def collate_fn(self) -> Callable:
        """How a batch is put together from its items."""
        return torch.utils.data.default_collate

    def training_set(self) -> Dataset:
        return self.train_set

    def training_set_name(self) -> str:
        """What the error names when the training split is too small."""
        return type(self).__name__

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        return split_loader(dataset, train, self.batch_size, self.collate_fn(), self.num_workers, self.pin_memory,
                            self.persistent_workers)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        """Raises ValueError naming the split and ``data.batch_size`` when the split holds fewer images."""
        train = self.training_set()
        if len(train) < self.batch_size:
            raise ConfigError(
                f"{self.training_set_name()}: {len(train)} training images is fewer than "
                f"data.batch_size={self.batch_size}; lower the batch size"
            )
        return self._loader(train, train=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader(self.val_set, train=False) if self.val_set is not None else []
