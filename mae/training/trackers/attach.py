"""The tracker in a run: checked, and its callback added, before any work (``attach_tracker``); attached
once the run has passed its start-up checks (``AttachTracker``), sent the figures (``log_figure``), named
in the run summary (``where_to_look``)."""

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from mae.training.resume import planned_run_folder
from mae.training.trackers.base import Tracker, tracker_of
from mae.training.trackers.build import build_tracker, check_tracker, remember_run
from mae.training.trackers.outage import bounded_waits, guard_lightning_calls, tracker_call
from mae.training.trackers.settings import run_settings


def attach_tracker(
    trainer: pl.Trainer, spec: dict[str, Any], config: dict[str, Any], resume_step: int | None
) -> None:
    """Check the tracker ``spec`` (``tracker_spec``'s) before the run folder is made: its folders, store,
    credentials and the run folder's ``tracker.json`` (``check_tracker``), on the process that talks to it,
    so that a refusal there comes before the others are started; then add the ``AttachTracker`` that
    builds it. ``config``: the run's resolved config; ``resume_step``: the step a fit resumes from (None: a
    fresh fit or an evaluation)."""
    if trainer.is_global_zero:
        check_tracker(spec, planned_run_folder(trainer), resume_step)
    trainer.callbacks.append(AttachTracker(spec, config, resume_step))


class AttachTracker(pl.Callback):
    """Builds the ``tracker`` once the run folder is known and the run has passed its start-up checks
    (``on_fit_start``, on every process; ``setup`` for an evaluation), adds it to the trainer's loggers,
    records its run in the folder and sends it the run's settings (once the effective batch and lr are
    known). Every call to it waits a bounded time, and a service that stops answering leaves it for the
    rest of the run (``outage``)."""

    def __init__(self, spec: dict[str, Any], config: dict[str, Any], resume_step: int | None) -> None:
        self.spec = spec
        self.config = config
        self.resume_step = resume_step
        self.tracker: Tracker | None = None
        self.run_folder: Path | None = None
        self.resumed_state: dict[str, Any] = {}  # the tracker's state in the checkpoint resumed from
        self._logged = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":  # an evaluation: no start-up checks to wait for
            self._attach(trainer)

    def _attach(self, trainer: pl.Trainer) -> None:
        """Build the tracker and create its run. A fit does it at its start (``on_fit_start``), after the
        checks that may still refuse the run (0 steps, a warmup longer than the run, in
        ``configure_optimizers``), so a refused run leaves no tracked run, database or event folder."""
        if self.tracker is not None:
            return
        self.run_folder = Path(trainer.log_dir or trainer.default_root_dir)
        self.tracker = build_tracker(self.spec, self.run_folder, self.resume_step)
        guard_lightning_calls(self.tracker, trainer)
        trainer.loggers = [*trainer.loggers, self.tracker.logger]
        if trainer.is_global_zero:
            with bounded_waits(self.tracker):
                remember_run(self.tracker, self.run_folder)

    def _log_settings(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._logged or not trainer.is_global_zero:
            return
        self._logged = True
        config_file = self.run_folder / "config.yaml"
        settings = run_settings(self.config, pl_module, trainer)
        tracker_call(self.tracker, trainer, self.tracker.log_settings, settings, config_file)

    def state_dict(self) -> dict[str, Any]:
        return self.tracker.checkpoint_state() if self.tracker is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resumed_state = dict(state_dict)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._attach(trainer)
        if trainer.is_global_zero and self.resumed_state:
            self.tracker.continue_from(self.resumed_state)
        self._log_settings(trainer, pl_module)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_settings(trainer, pl_module)  # a --validate_only run


def trackers_of(trainer: pl.Trainer) -> list[Tracker]:
    """The trackers among ``trainer``'s loggers, in their order: the one ``AttachTracker`` built for a
    logger, else one around it (a logger of a tracker given as ``trainer.logger``, say)."""
    attached = [cb.tracker for cb in getattr(trainer, "callbacks", []) if isinstance(cb, AttachTracker)]
    built = {id(tracker.logger): tracker for tracker in attached if tracker is not None}
    found = (built.get(id(logger)) or tracker_of(logger) for logger in trainer.loggers)
    return [tracker for tracker in found if tracker is not None]


def log_figure(trainer: pl.Trainer, key: str, image: torch.Tensor) -> None:
    """Send a figure, ``image`` of shape (3, H, W) with values in [0, 1], to every tracker of
    ``trainer`` (the CSV logger keeps none: figures are PNG files in the run folder). Call on global rank 0.

    Its step is that of the last optimizer step done, where Lightning logs the epoch's metrics
    (``global_step - 1``): a run resumed from this epoch's checkpoint starts after it, so a tracker
    that drops a killed run's later events (TensorBoard) keeps the figure."""
    step = max(trainer.global_step - 1, 0)
    for tracker in trackers_of(trainer):
        tracker_call(tracker, trainer, tracker.log_figure, key, image, step)


def where_to_look(trainer: pl.Trainer) -> list[tuple[str, str]]:
    """(label, text) lines of the run summary that say where each tracker shows the run."""
    lines = []
    for tracker in trackers_of(trainer):
        where = tracker.where()
        if where is not None and tracker.left_at is not None:
            where += f" (up to step {tracker.left_at}, when its service stopped answering)"
        if where is not None:
            lines.append((f"{tracker.name}:", where))
    return lines
