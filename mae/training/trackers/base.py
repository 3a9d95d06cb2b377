"""One experiment tracker behind one interface (``Tracker``), and the table of the trackers this package
knows (``TRACKERS``): a new tracker is one ``Tracker`` subclass, registered with ``register_tracker``,
and one recipe in ``mae/configs/loggers/`` naming its Lightning logger."""

import importlib
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.pytorch.loggers import Logger


class Tracker:
    """An experiment tracker beside the run's CSV metrics: a Lightning logger (``logger``) tied to the run
    folder, so that a resumed run continues the same tracked run.

    A subclass is one tracker: its class attributes say which logger its recipe names and what that logger
    needs; its methods are all that differs between trackers. This base class stands for a logger the
    package has no class for: built as configured, nothing kept in the run folder, no figures, no line in
    the run summary.
    """

    name: ClassVar[str] = ""  # its entry in the run folder's tracker.json and its label in the run summary
    logger_class: ClassVar[str] = ""  # the ``class_path`` its recipe names
    # Settings the run folder decides (a resumed run finds its tracked run by them): refused in a config.
    run_folder_settings: ClassVar[tuple[str, ...]] = ()
    # The client it needs: the package an error names, and the modules any one of which will do.
    client: ClassVar[tuple[str, tuple[str, ...]] | None] = None
    # The keys of its entry in tracker.json (``record``) that a resume reads, each a string.
    record_keys: ClassVar[tuple[str, ...]] = ()
    # Environment variables of its client that bound how long a call waits for its service, and their values
    # during the run's calls, each where the environment has no value of its own (``outage.bounded_waits``).
    wait_bounds: ClassVar[dict[str, str]] = {}

    def __init__(self, logger: Logger, settings: dict[str, Any] | None = None) -> None:
        self.logger = logger
        # The arguments this package built ``logger`` with ({}: a logger it did not build).
        self.settings = settings or {}
        # The global step at which its service stopped answering, and the tracker was left (None: in use).
        self.left_at: int | None = None

    @classmethod
    def check(cls, init_args: dict[str, Any]) -> None:
        """Refuse (``ConfigError``), before any work, settings this tracker cannot run with; the run folder's
        settings and the client are checked for every tracker (``tracker_spec``)."""

    @classmethod
    def check_start(
        cls, init_args: dict[str, Any], run_folder: Path, resume_step: int | None, saved: dict | None
    ) -> None:
        """Refuse (``ConfigError``), before any work and without creating anything, a start this tracker
        cannot make with ``init_args`` in ``run_folder`` (arguments as for ``tie_to_run_folder``): a folder it
        cannot write, a store it cannot use or reach, a resumed tracked run that is gone. This base: the
        run folder's settings only (``tie_to_run_folder``)."""
        cls.tie_to_run_folder(dict(init_args), run_folder, resume_step, saved)

    @classmethod
    def tie_to_run_folder(
        cls, init_args: dict[str, Any], run_folder: Path, resume_step: int | None, saved: dict | None
    ) -> dict[str, Any]:
        """The logger's arguments: ``init_args`` and what ties the logger to ``run_folder``.

        ``resume_step``: the global step of the checkpoint the run resumes from (None: a fresh run);
        ``saved``: this tracker's entry in the run folder's tracker.json when it resumes (else None)."""
        return dict(init_args)

    def record(self) -> dict[str, Any] | None:
        """What a resume needs to find this tracked run again, kept in tracker.json under ``name`` (None:
        nothing). Called once on global rank 0, on a tracker this package built; creates the tracked run."""
        return None

    def log_settings(self, settings: dict[str, Any], config_file: Path | None) -> None:
        """Send the run's settings (``run_settings``) as hyperparameters, and its ``config.yaml`` where the
        tracker keeps files (call on global rank 0)."""
        self.log_hyperparams(settings)
        if config_file is not None and config_file.is_file():
            self.log_config(config_file)

    def log_hyperparams(self, settings: dict[str, Any]) -> None:
        """Send ``settings`` (nested dicts) as the run's hyperparameters."""
        if settings:
            self.logger.log_hyperparams(settings)

    def log_config(self, config_file: Path) -> None:
        """Keep the run's ``config.yaml`` where the tracker keeps files (this base: nowhere)."""

    def log_figure(self, key: str, image: torch.Tensor, step: int) -> None:
        """Show ``image``, of shape (3, H, W) with values in [0, 1], as ``key`` at ``step`` (this base:
        nowhere)."""

    def where(self) -> str | None:
        """The run summary's line saying where the tracker shows the run (None: no line)."""
        return None

    def unreachable(self, error: Exception) -> str | None:
        """Why ``error``, raised by a call to this tracker during the run, says that its service stopped
        answering, naming the service and the wait (None: another error, which ends the run as any error
        does). A tracker it names is left for the rest of the run (``outage``). This base: none does."""
        return None

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps for the tracked run to continue from it (beyond tracker.json)."""
        return {}

    def continue_from(self, state: dict[str, Any]) -> None:
        """At the start of a fit resumed from a checkpoint that holds ``state`` (``checkpoint_state``), on
        global rank 0."""


TRACKERS: dict[str, type[Tracker]] = {}  # by the class_path of their logger


def register_tracker(tracker: type[Tracker]) -> type[Tracker]:
    """Make ``tracker`` the class of the loggers its ``logger_class`` names (a class decorator)."""
    TRACKERS[tracker.logger_class] = tracker
    return tracker


def tracker_type(class_path: str) -> type[Tracker]:
    """The tracker class of the logger ``class_path`` names (``Tracker`` itself for one with none)."""
    return TRACKERS.get(class_path, Tracker)


def tracker_named(name: str) -> type[Tracker] | None:
    """The tracker whose entry in tracker.json is ``name`` (None: no registered one)."""
    return next((tracker for tracker in TRACKERS.values() if tracker.name == name), None)


def tracker_of(logger: Logger) -> Tracker | None:
    """A tracker around ``logger`` when it is the logger of one (or a subclass of it), else None (the CSV
    logger)."""
    for tracker in TRACKERS.values():
        if isinstance(logger, logger_type(tracker.logger_class)):
            return tracker(logger)
    return None


@cache
def logger_type(class_path: str) -> type:
    """The class ``class_path`` (``package.module.Name``) names."""
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)
