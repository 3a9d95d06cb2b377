"""Data-loader workers that leave a scheduler's SIGTERM to the main process.

A cluster scheduler (SLURM on preemption, ``scancel``, a time limit) sends SIGTERM to every process
of the job, loader workers included. PyTorch's workers die on a SIGTERM that does not come from
their parent, and the main process then fails its running step with "DataLoader worker ... is
killed by signal: Terminated" instead of writing its preemption checkpoint. Every loader of this
project is a ``SigtermSafeLoader`` whose workers start with ``worker_init``, so the main process
alone decides when they stop.
"""

import os
import signal
from types import FrameType

from lightning.fabric.utilities.seed import pl_worker_init_function
from torch.utils.data import DataLoader
from torch.utils.data._utils.signal_handling import _set_worker_signal_handlers


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
