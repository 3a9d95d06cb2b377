"""A tracker whose service stops answering during a run (an MLflow server that goes down) is left for the
rest of the run, with one warning, instead of holding or ending it: a tracker only watches the run, whose
own metrics (``metrics.csv``) keep every step, and a run resumed from a checkpoint logs to the same tracked
run again. Each call to the tracker waits a bounded time first (``Tracker.wait_bounds``: the client's own
defaults can retry for minutes), unless the user's environment sets those bounds."""

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn

from mae.training.trackers.base import Tracker

# The methods of a logger that Lightning calls during a run: metrics, hyperparameters, checkpoints, the end.
LIGHTNING_CALLS = ("log_metrics", "log_hyperparams", "log_graph", "save", "after_save_checkpoint", "finalize")


@contextmanager
def bounded_waits(tracker: Tracker) -> Iterator[None]:
    """Inside, each of ``tracker.wait_bounds``' variables that the environment has no value of is set to
    the bound; after, unset again (the user's own values are never touched)."""
    added = {name: value for name, value in tracker.wait_bounds.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def tracker_call(tracker: Tracker, trainer: pl.Trainer, call: Callable[..., Any], *args, **kwargs) -> Any:
    """``call(*args, **kwargs)``, a call to ``tracker``, with bounded waits; once the tracker's service has
    stopped answering (``Tracker.unreachable``), nothing (None): the tracker is left, with one warning."""
    if tracker.left_at is not None:
        return None
    with bounded_waits(tracker):
        try:
            return call(*args, **kwargs)
        except Exception as err:
            why = tracker.unreachable(err)
            if why is None:
                raise
    if tracker.left_at is None:  # not already left by a call inside this one
        tracker.left_at = trainer.global_step
        rank_zero_warn(
            f"tracker {tracker.name}: {why}; the run goes on without {tracker.name} from step "
            f"{tracker.left_at}: metrics.csv in the run folder keeps every step, and a run resumed from a "
            f"checkpoint (--ckpt_path) logs to the same {tracker.name} run again"
        )
    return None


def guard_lightning_calls(tracker: Tracker, trainer: pl.Trainer) -> None:
    """Route the calls Lightning makes to ``tracker``'s logger (``LIGHTNING_CALLS``) through
    ``tracker_call``: Lightning calls the logger itself, so its methods are wrapped on this one instance."""
    for name in LIGHTNING_CALLS:
        method = getattr(tracker.logger, name, None)
        if callable(method):
            setattr(tracker.logger, name, _routed(tracker, trainer, method))


def _routed(tracker: Tracker, trainer: pl.Trainer, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args, **kwargs):
        return tracker_call(tracker, trainer, method, *args, **kwargs)

    return call
