"""Loader workers leave a scheduler's SIGTERM and a terminal's Ctrl-C to their main process
(``mae.data.sources.loader_workers``): signals from anyone else are ignored, and the main process's own
SIGTERM (the loader stopping a worker, or the interpreter's exit) ends a worker at once, the first one
included."""

import multiprocessing
import os
import signal
import subprocess
import time

import pytest

from mae.data.sources.loader_workers import Loader

pytestmark = pytest.mark.skipif(not hasattr(signal, "sigwaitinfo"), reason="needs signal.sigwaitinfo")


class WorkerIds:
    """Items that are the id of the process that loads them."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> int:
        return os.getpid()


def _worker(pid: int) -> multiprocessing.Process:
    return next(child for child in multiprocessing.active_children() if child.pid == pid)


def _signal_from_another_process(pid: int, signum: signal.Signals) -> None:
    subprocess.run(["kill", f"-{signum.name.removeprefix('SIG')}", str(pid)], check=True)


@pytest.fixture
def python_ctrl_c():
    """The main process's Ctrl-C handler is Python's default, as it is while Lightning sets up a run (whose
    training loader starts its persistent workers before Lightning installs its own handler)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# forkserver (Python 3.14's default on Linux): the workers are the server's children, and start threads of
# their own before worker_init
@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_worker_signals__only_the_main_processs_sigterm_ends_a_worker(python_ctrl_c, start_method):
    loader = Loader(WorkerIds(), num_workers=1, persistent_workers=True, multiprocessing_context=start_method)
    batches = iter(loader)
    pid = int(next(batches))
    assert pid != os.getpid()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM, signal.SIGINT):  # a job-wide signal, twice
        _signal_from_another_process(pid, signum)
    time.sleep(0.2)
    assert [int(next(batches)) for _ in range(3)] == [pid] * 3  # the worker loads on
    if start_method != "fork":
        return  # threads the worker started before worker_init may take the main process's SIGTERM too
    worker = _worker(pid)
    os.kill(pid, signal.SIGTERM)  # the main process's first SIGTERM
    worker.join(timeout=10)
    assert worker.exitcode == 0
