"""Experiment trackers beside the run's CSV metrics: TensorBoard, MLflow and Weights & Biases.

A training command's ``tracker`` key names one of Lightning's loggers (``class_path``) with the
tracker's own settings (``init_args``: MLflow's ``tracking_uri`` and ``experiment_name``, W&B's
``project``, ``entity`` and ``mode``, ...). It is built once the run has passed its start-up checks
(``AttachTracker``), and what ties it to the run folder is filled in, so that a resumed run (a
SIGTERM checkpoint, then the same command line with ``--ckpt_path last``) continues the same tracked
run:

- TensorBoard: event files in ``<save_dir>/<run name>/<version>``, the run folder's name and version (so
  ``tensorboard --logdir <save_dir>`` shows every run); a resumed run purges the events at and after the
  step it resumes from (what a killed run logged after its last checkpoint), so the curve has no repeats;
- MLflow: the run id, kept in ``<run folder>/tracker.json``;
- W&B: the run id, kept there too (``resume="allow"``); its files in ``<run folder>/wandb``.

The tracker gets every scalar the run logs (Lightning sends them to all loggers), the figures
(``log_figure``), the run's settings (``run_settings``: the resolved config, effective batch and lr, the
architecture record, package versions) and, where its ``log_model`` asks for them, the checkpoints.
Only global rank 0 talks to a tracker (Lightning's loggers and the calls here); no call waits on the
other processes.
"""

import importlib
import importlib.util
import inspect
import json
import os
import secrets
import string
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_warn

from mae.errors import ConfigError
from mae.io.atomic import atomic_write

TRACKER_FILE = "tracker.json"  # in the run folder: the tracked run a resume continues
TENSORBOARD = "lightning.pytorch.loggers.TensorBoardLogger"
MLFLOW = "lightning.pytorch.loggers.MLFlowLogger"
WANDB = "lightning.pytorch.loggers.WandbLogger"
# Settings the run folder decides (so that a resume finds the same tracked run), per tracker.
FOLDER_SETTINGS = {
    TENSORBOARD: ("name", "version", "sub_dir", "purge_step"),
    MLFLOW: ("run_id",),
    WANDB: ("save_dir", "dir", "id", "version", "resume"),
}
# The client each tracker needs (the tracking extra): its package, and the modules any of which will do.
CLIENTS = {
    TENSORBOARD: ("tensorboard", ("tensorboard", "tensorboardX")),
    MLFLOW: ("mlflow-skinny", ("mlflow",)),
    WANDB: ("wandb", ("wandb",)),
}
VERSIONED_PACKAGES = ("torch", "torchvision", "timm", "lightning", "mae-lightning")
NOT_INSTALLED = "not installed"


def tracker_spec(value: Any) -> dict[str, Any] | None:
    """The ``tracker`` key as ``{"class_path": str, "init_args": dict}`` (None: no tracker), checked
    before any work.

    Raises:
        ValueError: a setting the run folder decides is set, naming it and why; the tracker's client is
            not installed, naming the extra.
    """
    if value is None:
        return None
    spec = value.as_dict() if hasattr(value, "as_dict") else dict(value)
    class_path, init_args = spec["class_path"], dict(spec.get("init_args") or {})
    taken = [
        key
        for key in FOLDER_SETTINGS.get(class_path, ())
        if key in init_args and init_args[key] != _default(class_path, key)
    ]
    if taken:
        raise ConfigError(
            f"tracker.init_args.{taken[0]}: set by the run folder, so that a resumed run continues the same "
            f"tracked run; remove it (the run folder is trainer.logger's save_dir / name / version)"
        )
    client = CLIENTS.get(class_path)
    if client is not None and not any(importlib.util.find_spec(module) for module in client[1]):
        raise ConfigError(
            f"tracker: {class_path.rsplit('.', 1)[1]} needs {client[0]}, which is not installed: "
            f'pip install "mae-lightning[tracking]" (or pip install {client[0]})'
        )
    if class_path == WANDB and init_args.get("offline") and init_args.get("log_model"):
        raise ConfigError(
            "tracker: W&B in offline mode cannot upload checkpoints: set tracker.init_args.log_model false, "
            "or run online"
        )
    return {"class_path": class_path, "init_args": init_args}


def _import(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _default(class_path: str, key: str) -> Any:
    """The default of ``key`` in ``class_path``'s signature (None where it has none)."""
    parameter = inspect.signature(_import(class_path)).parameters.get(key)
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _load_record(run_folder: Path) -> dict[str, dict]:
    path = run_folder / TRACKER_FILE
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not the tracker record this tool writes ({err}); move it away to start a new "
                         "tracked run") from None  # fmt: skip
    return record if isinstance(record, dict) else {}


def _save_record(run_folder: Path, kind: str, entry: dict) -> None:
    record = _load_record(run_folder) | {kind: entry}
    atomic_write(run_folder / TRACKER_FILE, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n"))


def _new_wandb_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def build_tracker(spec: dict[str, Any], run_folder: Path, resume_step: int | None) -> Logger:
    """The Lightning logger ``spec`` names, tied to ``run_folder`` (see the module's docstring).
    ``resume_step``: the global step of the checkpoint this run resumes from in ``run_folder``
    (None: a fresh run). Reads ``run_folder/tracker.json``; the caller saves it (``remember_run``)."""
    class_path, init_args = spec["class_path"], dict(spec["init_args"])
    record = _load_record(run_folder)
    if class_path == TENSORBOARD:
        init_args |= {"name": run_folder.parent.name, "version": run_folder.name}
        if resume_step is not None and Path(init_args["save_dir"], run_folder.parent.name, run_folder.name).is_dir():
            init_args["purge_step"] = resume_step  # passed on to SummaryWriter
    elif class_path == MLFLOW:
        init_args.setdefault("experiment_name", "mae")
        # Lightning reads $MLFLOW_TRACKING_URI once, at import; read here so the environment of the run wins.
        init_args["tracking_uri"] = init_args.get("tracking_uri") or os.getenv("MLFLOW_TRACKING_URI")
        if not init_args["tracking_uri"]:
            # MLflow 3 refuses its old folder store: a SQLite database beside the run folders instead.
            runs = run_folder.parent.parent.resolve()
            init_args["tracking_uri"] = f"sqlite:///{runs / 'mlflow.db'}"
            init_args.setdefault("artifact_location", str(runs / "mlartifacts"))
        saved = record.get("mlflow")
        if saved is not None and resume_step is not None:
            tracking_uri = init_args["tracking_uri"]
            if saved.get("tracking_uri") != tracking_uri:
                raise ConfigError(
                    f"{run_folder / TRACKER_FILE}: this run folder's MLflow run {saved['run_id']} is on "
                    f"{saved.get('tracking_uri')}, but tracker.init_args.tracking_uri is {tracking_uri}: resume with "
                    f"the same tracking_uri, or start a new run folder"
                )
            init_args["run_id"] = saved["run_id"]
    elif class_path == WANDB:
        saved = record.get("wandb")
        run_id = saved["id"] if saved is not None and resume_step is not None else _new_wandb_id()
        init_args |= {"save_dir": str(run_folder), "id": run_id}
    return _import(class_path)(**init_args)


def remember_run(tracker: Logger, run_folder: Path) -> None:
    """Save what a resume needs to find ``tracker``'s run again in ``run_folder/tracker.json`` (call on
    global rank 0; creates the tracked run)."""
    kind = tracker_kind(tracker)
    if kind == "mlflow":
        entry = {"tracking_uri": tracker._tracking_uri, "experiment_id": tracker.experiment_id,
                 "run_id": tracker.run_id}  # fmt: skip
    elif kind == "wandb":
        entry = {"id": tracker._id, "project": tracker._project}
    elif kind == "tensorboard":
        entry = {"log_dir": tracker.log_dir}
    else:
        return
    _save_record(run_folder, kind, entry)


def tracker_kind(logger: Logger) -> str | None:
    """ "tensorboard", "mlflow", "wandb", or None for another logger (CSV)."""
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

    kinds = ((TensorBoardLogger, "tensorboard"), (MLFlowLogger, "mlflow"), (WandbLogger, "wandb"))
    return next((kind for cls, kind in kinds if isinstance(logger, cls)), None)


def package_versions(packages: tuple[str, ...] = VERSIONED_PACKAGES) -> dict[str, str]:
    """Versions of ``packages`` (default: those a run's numbers depend on), ``not installed`` where missing."""
    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = NOT_INSTALLED
    return versions


def run_settings(config: dict[str, Any], pl_module: pl.LightningModule, trainer: pl.Trainer) -> dict[str, Any]:
    """What a tracker shows as the run's hyperparameters: ``config`` (the resolved command-line config,
    without ``ckpt_path``, which changes between a run and its resume), the effective batch and lr
    (known once the optimizer is built), the architecture record and the package versions."""
    settings: dict[str, Any] = {"config": {k: v for k, v in config.items() if k not in ("ckpt_path", "config")}}
    effective_batch = getattr(pl_module, "effective_batch", None)
    if effective_batch is not None:
        settings["run"] = {"effective_batch": effective_batch, "lr": pl_module.resolved_lr,
                           "devices": trainer.num_devices, "nodes": trainer.num_nodes,
                           "precision": str(trainer.precision)}  # fmt: skip
    record = getattr(pl_module, "architecture_record", None)
    if callable(record):
        settings["architecture"] = record()
    settings["versions"] = package_versions()
    return settings


def _mlflow_params_kept(tracker: Logger, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` less those the MLflow run already holds (a resume): MLflow keeps a parameter's first
    value and refuses another one; a changed value is named in a warning instead."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict

    flat = _flatten_dict(_convert_params(params))
    existing = tracker.experiment.get_run(tracker.run_id).data.params
    changed = sorted(k for k, v in flat.items() if k in existing and existing[k] != str(v)[:250])
    if changed:
        rank_zero_warn(f"MLflow run {tracker.run_id} keeps its first value of {', '.join(changed[:5])}"
                       f"{' ...' if len(changed) > 5 else ''}: MLflow parameters cannot change on resume")  # fmt: skip
    return {k: v for k, v in flat.items() if k not in existing}


def _tensorboard_hparams(tracker: Logger, settings: dict[str, Any]) -> None:
    """``settings`` in TensorBoard's HPARAMS tab (Lightning writes it only with an ``hp_metric``)."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
    from torch.utils.tensorboard.summary import hparams

    flat = tracker._sanitize_params(_flatten_dict(_convert_params(settings)))
    flat = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in flat.items()}
    writer = tracker.experiment._get_file_writer()
    for summary in hparams(flat, {}):
        writer.add_summary(summary)


def log_settings(tracker: Logger, settings: dict[str, Any], config_file: Path | None) -> None:
    """Send ``settings`` (``run_settings``) to ``tracker`` as hyperparameters, and the run's
    ``config.yaml`` as a file where the tracker keeps files (call on global rank 0)."""
    kind = tracker_kind(tracker)
    if kind == "mlflow":
        settings = _mlflow_params_kept(tracker, settings)
    if settings:
        tracker.log_hyperparams(settings)
    if kind == "tensorboard":
        _tensorboard_hparams(tracker, settings)
    if config_file is None or not config_file.is_file():
        return
    if kind == "mlflow":
        tracker.experiment.log_artifact(tracker.run_id, str(config_file))
    elif kind == "tensorboard":
        tracker.experiment.add_text("config", "```yaml\n" + config_file.read_text() + "\n```", 0)
    elif kind == "wandb":
        tracker.experiment.save(str(config_file), base_path=str(config_file.parent), policy="now")


def log_figure(trainer: pl.Trainer, key: str, image: torch.Tensor) -> None:
    """Send a figure, ``image`` of shape (3, H, W) with values in [0, 1], to every tracker of
    ``trainer`` (the CSV logger keeps none: figures are PNG files in the run folder). Call on global rank 0.

    Its step is that of the last optimizer step done, where Lightning logs the epoch's metrics
    (``global_step - 1``): a run resumed from this epoch's checkpoint starts after it, so a tracker
    that drops a killed run's later events (TensorBoard) keeps the figure."""
    step = max(trainer.global_step - 1, 0)
    for logger in trainer.loggers:
        kind = tracker_kind(logger)
        if kind == "tensorboard":
            logger.experiment.add_image(key, image.float().clamp(0, 1), step)
        elif kind == "mlflow":
            pixels = (image.float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
            logger.experiment.log_image(logger.run_id, np.ascontiguousarray(pixels), key=key, step=step)
        elif kind == "wandb":
            logger.log_image(key=key, images=[image.float().clamp(0, 1).cpu()], step=step)


def where_to_look(trainer: pl.Trainer) -> list[tuple[str, str]]:
    """(label, text) lines of the run summary that say where each tracker shows the run."""
    lines = []
    for logger in trainer.loggers:
        kind = tracker_kind(logger)
        if kind == "tensorboard":
            lines.append(("tensorboard:", f"tensorboard --logdir {logger.log_dir}"))
        elif kind == "mlflow" and logger._initialized:
            uri = logger._tracking_uri
            if uri.startswith(("http://", "https://")):
                where = f"{uri.rstrip('/')}/#/experiments/{logger.experiment_id}/runs/{logger.run_id}"
            else:
                where = f"run {logger.run_id} of experiment {logger.experiment_id}: mlflow ui --backend-store-uri {uri}"
            lines.append(("mlflow:", where))
        elif kind == "wandb" and logger._experiment is not None:
            run = logger.experiment
            if getattr(run.settings, "mode", "") == "offline" or getattr(run.settings, "_offline", False):
                folders = sorted(Path(logger.save_dir, "wandb").glob(f"offline-run-*-{run.id}"))
                upload = f"wandb sync --id {run.id} {' '.join(map(str, folders))}"
                lines.append(("wandb:", f"offline run {run.id}; upload: {upload}"))
            else:
                lines.append(("wandb:", str(run.url)))
    return lines


class AttachTracker(pl.Callback):
    """Builds the ``tracker`` once the run folder is known and the run has passed its start-up checks
    (``on_fit_start``, on every process; ``setup`` for an evaluation), adds it to the trainer's loggers,
    records its run in the folder and sends it the run's settings (once the effective batch and lr are
    known)."""

    def __init__(self, spec: dict[str, Any], config: dict[str, Any], resume_step: int | None) -> None:
        self.spec = spec
        self.config = config
        self.resume_step = resume_step
        self.tracker: Logger | None = None
        self.run_folder: Path | None = None
        self.resumed_wandb_step: int | None = None
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
        trainer.loggers = [*trainer.loggers, self.tracker]
        if trainer.is_global_zero:
            remember_run(self.tracker, self.run_folder)

    def _log_settings(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._logged or not trainer.is_global_zero:
            return
        self._logged = True
        config_file = self.run_folder / "config.yaml"
        log_settings(self.tracker, run_settings(self.config, pl_module, trainer), config_file)

    def state_dict(self) -> dict[str, Any]:
        # W&B's own step (``_step``) of the next row: an offline run resumed from this checkpoint cannot ask
        # the server for it, and starting again at 0 would have `wandb sync` drop its rows as out of order.
        if self.tracker is not None and tracker_kind(self.tracker) == "wandb" and self.tracker._experiment is not None:
            return {"wandb_step": int(self.tracker.experiment.step)}
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resumed_wandb_step = state_dict.get("wandb_step")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._attach(trainer)
        if trainer.is_global_zero and tracker_kind(self.tracker) == "wandb" and self.resumed_wandb_step:
            run = self.tracker.experiment
            if run.step < self.resumed_wandb_step:  # offline (online, the server has told it)
                run.log({}, step=self.resumed_wandb_step, commit=False)
        self._log_settings(trainer, pl_module)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_settings(trainer, pl_module)  # a --validate_only run
