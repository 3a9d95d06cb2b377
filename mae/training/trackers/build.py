"""A config's ``tracker`` key: checked before any work (``tracker_spec``), built into a tracker tied to the
run folder (``build_tracker``), its tracked run recorded there (``remember_run``)."""

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any

from mae.errors import ConfigError
from mae.training.trackers.base import Tracker, logger_type, tracker_type
from mae.training.trackers.record import load_record, save_record


def tracker_spec(value: Any) -> dict[str, Any] | None:
    """The ``tracker`` key as ``{"class_path": str, "init_args": dict}`` (None: no tracker), checked
    before any work.

    Raises:
        ConfigError: a setting the run folder decides is set, naming it and why; the tracker's client is
            not installed, naming the extra; a setting the tracker cannot run with (``Tracker.check``).
    """
    if value is None:
        return None
    spec = value.as_dict() if hasattr(value, "as_dict") else dict(value)
    class_path, init_args = spec["class_path"], dict(spec.get("init_args") or {})
    tracker = tracker_type(class_path)
    defaults = {key: _default(class_path, key) for key in tracker.run_folder_settings}
    taken = [key for key, default in defaults.items() if key in init_args and init_args[key] != default]
    if taken:
        raise ConfigError(
            f"tracker.init_args.{taken[0]}: set by the run folder, so that a resumed run continues the same "
            f"tracked run; remove it (the run folder is trainer.logger's save_dir / name / version)"
        )
    package, modules = tracker.client or (None, ())
    if package is not None and not any(importlib.util.find_spec(module) for module in modules):
        raise ConfigError(
            f"tracker: {class_path.rsplit('.', 1)[1]} needs {package}, which is not installed: "
            f'pip install "mae-lightning[tracking]" (or pip install {package})'
        )
    tracker.check(init_args)
    return {"class_path": class_path, "init_args": init_args}


def _default(class_path: str, key: str) -> Any:
    """The default of ``key`` in ``class_path``'s signature (None where it has none)."""
    parameter = inspect.signature(logger_type(class_path)).parameters.get(key)
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def check_tracker(spec: dict[str, Any], run_folder: Path, resume_step: int | None) -> None:
    """Refuse, before any work and without creating anything, a tracker ``spec`` (``tracker_spec``) that
    cannot start in ``run_folder`` (``resume_step``: as for ``build_tracker``): a ``tracker.json`` there that
    this tool did not write, and what ``Tracker.check_start`` refuses (a folder it cannot write, a store it
    cannot use or reach, a resumed tracked run that is gone, missing credentials).

    Raises:
        InputError: the run folder's ``tracker.json`` is not a record this tool wrote.
        ConfigError: naming the setting (or the file) and what would be right.
    """
    tracker = tracker_type(spec["class_path"])
    saved = _saved(tracker, run_folder, resume_step)
    tracker.check_start(dict(spec["init_args"]), run_folder, resume_step, saved)


def build_tracker(spec: dict[str, Any], run_folder: Path, resume_step: int | None) -> Tracker:
    """The tracker ``spec`` names, its logger tied to ``run_folder`` (see ``mae.training.trackers``).
    ``resume_step``: the global step of the checkpoint this run resumes from in ``run_folder`` (None: a
    fresh run). Reads ``run_folder/tracker.json``; the caller saves it (``remember_run``)."""
    tracker = tracker_type(spec["class_path"])
    saved = _saved(tracker, run_folder, resume_step)
    init_args = tracker.tie_to_run_folder(dict(spec["init_args"]), run_folder, resume_step, saved)
    return tracker(logger_type(spec["class_path"])(**init_args), init_args)


def _saved(tracker: type[Tracker], run_folder: Path, resume_step: int | None) -> dict | None:
    """``tracker``'s entry in the record of ``run_folder`` when the run resumes (else None); the record is
    read, so checked, either way (a fresh run adds its entry to it)."""
    record = load_record(run_folder)
    return record.get(tracker.name) if resume_step is not None else None


def remember_run(tracker: Tracker, run_folder: Path) -> None:
    """Save what a resume needs to find ``tracker``'s run again in ``run_folder/tracker.json`` (call on
    global rank 0; creates the tracked run)."""
    entry = tracker.record()
    if entry is not None:
        save_record(run_folder, tracker.name, entry)
