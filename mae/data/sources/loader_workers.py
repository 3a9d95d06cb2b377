"""Data loaders: the loader settings every data module shares and one rule for a split's loader
(``SplitLoaders``, ``split_loader``), and workers that leave a scheduler's SIGTERM and a user's Ctrl-C to the
main process.

A cluster scheduler (SLURM on preemption, ``scancel``, a time limit) sends SIGTERM to every process
of the job, loader workers included. PyTorch's workers die on a SIGTERM that does not come from
their parent, and the main process then fails its running step with "DataLoader worker ... is
killed by signal: Terminated" instead of writing its preemption checkpoint. A terminal's Ctrl-C (SIGINT)
reaches every process of its group too. Every loader of this project is a ``SigtermSafeLoader`` whose
workers start with ``worker_init`` (``main_process_worker_init()``), so the main process alone decides when
they stop.
"""

import functools
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.utilities.seed import pl_worker_init_function
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset

from mae.compat.torch import IteratorStartHook
from mae.errors import ConfigError, check_at_least

# The signals a worker leaves to its main process: a scheduler's SIGTERM, a terminal's Ctrl-C (SIGINT).
_MAIN_DECIDES = {signal.SIGTERM, signal.SIGINT}


def _exit_on_the_main_processs_sigterm(main_process: int) -> None:
    """A worker's thread that takes every SIGTERM (blocked in the worker's other threads) and reads who sent
    it: from the main process (the loader stopping a worker, or the main process's exit) the worker exits at
    once, as PyTorch's own worker handler does; from anyone else (a scheduler's job-wide signal) nothing
    happens: the main process saves, then stops its workers itself."""
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == main_process:
            os._exit(0)


def _leave_sigterm_to_the_main_process(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM whose sender is not known: the main process decides."""


def worker_init(worker_id: int, main_process: int | None = None) -> None:
    """``worker_init_fn`` of every loader (``main_process_worker_init()`` binds ``main_process``):
    Lightning's worker seeding when the run seeds workers (``seed_everything(workers=True)``, which
    LightningCLI does; Lightning adds its seeding only to loaders without a ``worker_init_fn``), then the
    signals left to the main process: a Ctrl-C (SIGINT) is ignored (the main process stops its workers, at
    once or after the checkpoint of a training run's first Ctrl-C), a SIGTERM ends the worker only when the
    main process sends it.

    Without ``signal.sigwaitinfo`` (macOS) PyTorch's SIGTERM handling is kept: a job-wide SIGTERM ends the
    workers there. With the forkserver and spawn start methods, a thread that the worker started before this
    function may take the main process's SIGTERM too, which is then left to the main process as a job-wide
    one (the loader's own shutdown still ends the worker).

    Args:
        worker_id: the worker's index in its loader.
        main_process: the id of the process whose loader started the worker; None: the worker's parent (with
            the fork and spawn start methods it is; with forkserver the parent is the server).
    """
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _MAIN_DECIDES)
        return
    # Where a thread that does not block SIGTERM takes one (with the forkserver and spawn start methods, the
    # threads a worker started before this function), it is left to the main process too.
    signal.signal(signal.SIGTERM, _leave_sigterm_to_the_main_process)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the thread below takes it
    main_process = os.getppid() if main_process is None else main_process
    waiter = threading.Thread(target=_exit_on_the_main_processs_sigterm, args=(main_process,), daemon=True)
    waiter.start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by SigtermSafeLoader


def main_process_worker_init() -> Callable[[int], None]:
    """The ``worker_init_fn`` of a loader made in this process: ``worker_init`` with this process as its
    workers' main process."""
    return functools.partial(worker_init, main_process=os.getpid())


class SigtermSafeLoader(IteratorStartHook):
    """A ``DataLoader`` mixin: workers are forked with SIGTERM and SIGINT blocked, so a job-wide SIGTERM
    (or a terminal's Ctrl-C) that arrives while they start waits until ``worker_init`` has taken it over
    (PyTorch's own worker handler would end them, a Ctrl-C would raise KeyboardInterrupt in them). The main
    process's signal waits those milliseconds too."""

    def start_iterator(self, start: Callable):
        if self.num_workers == 0:
            return start()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _MAIN_DECIDES)
        try:
            return start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Loader(SigtermSafeLoader, DataLoader):
    """``torch.utils.data.DataLoader`` with workers that leave SIGTERM to the main process."""

    def __init__(self, *args, worker_init_fn: Callable[[int], None] | None = None, **kwargs) -> None:
        super().__init__(*args, worker_init_fn=worker_init_fn or main_process_worker_init(), **kwargs)


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
    """The loader settings of every data module (images, detection, segmentation), with their defaults and
    checks, and the loaders of a data module with a ``train_set`` and a ``val_set`` (None: no validation):
    ``split_loader`` with its ``collate_fn()``, and the check that the training split holds one batch at
    least.

    A data module takes these settings as keywords (``**loader``) and hands them on to this ``__init__``,
    so they are the same config keys (``data.batch_size``, ...) everywhere; it may override ``collate_fn``,
    ``training_set`` (built lazily) and ``training_set_name``. A family whose images are larger lowers the
    ``batch_size`` default in its own signature; the built-in data takes ``MainProcessLoading``'s defaults.

    Args:
        batch_size: images per device per step.
        num_workers: loader worker processes per device; 0: batches are made in the main process.
        pin_memory: page-locked host memory for faster host-to-GPU copies (only when CUDA is available).
        persistent_workers: keep the workers alive between epochs (only when ``num_workers > 0``).
    """

    train_set: Dataset | None
    val_set: Dataset | None

    def __init__(
        self,
        batch_size: int = 64,
        num_workers: int = 8,
        pin_memory: bool = True,
        persistent_workers: bool = True,
    ) -> None:
        super().__init__()
        check_at_least("data.batch_size", batch_size, 1)
        check_at_least("data.num_workers", num_workers, 0)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers

    def collate_fn(self) -> Callable:
        """How a batch is put together from its items."""
        return torch.utils.data.default_collate

    def training_set(self) -> Dataset:
        return self.train_set

    def training_set_name(self) -> str:
        """What the error names when the training split is too small."""
        return type(self).__name__

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        return split_loader(
            dataset,
            train,
            self.batch_size,
            self.collate_fn(),
            self.num_workers,
            self.pin_memory,
            self.persistent_workers,
        )

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


class MainProcessLoading:
    """The loader defaults of the built-in data (the digits and the digit scenes: a few MB, decoded in
    microseconds): batches made in the main process, where worker processes would cost more time to start
    than they save, and no page-locked copies (a CPU run on a machine with a GPU would start CUDA for them).
    Put it before the data module's base class; the settings stay ``SplitLoaders``' keys.

    Args:
        num_workers: loader worker processes per device; 0: batches are made in the main process.
        pin_memory: page-locked host memory for faster host-to-GPU copies (only when CUDA is available).
        persistent_workers: keep worker processes between epochs (when ``num_workers > 0``).
    """

    def __init__(
        self, num_workers: int = 0, pin_memory: bool = False, persistent_workers: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(
            num_workers=num_workers, pin_memory=pin_memory, persistent_workers=persistent_workers, **kwargs
        )
