"""MLflow: the run id kept in the run folder's tracker.json, so that a resumed run logs to the same MLflow
run; without a tracking URI (nor ``$MLFLOW_TRACKING_URI``), a SQLite database beside the run folders."""

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from mae.compat.lightning import flatten_params, mlflow_run_started
from mae.errors import ConfigError
from mae.training.trackers.base import Tracker, register_tracker
from mae.training.trackers.record import TRACKER_FILE


@register_tracker
class MLflowTracker(Tracker):
    """MLflow (``MLFlowLogger``): scalars, figures (its image log, with steps), the settings as parameters
    and the config as an artifact."""

    name = "mlflow"
    logger_class = "lightning.pytorch.loggers.MLFlowLogger"
    run_folder_settings = ("run_id",)
    client = ("mlflow-skinny", ("mlflow",))

    @classmethod
    def tie_to_run_folder(
        cls, init_args: dict[str, Any], run_folder: Path, resume_step: int | None, saved: dict | None
    ) -> dict[str, Any]:
        init_args = {"experiment_name": "mae", **init_args}
        # Lightning reads $MLFLOW_TRACKING_URI once, at import; read here so the environment of the run wins.
        init_args["tracking_uri"] = init_args.get("tracking_uri") or os.getenv("MLFLOW_TRACKING_URI")
        if not init_args["tracking_uri"]:
            # MLflow 3 refuses its old folder store: a SQLite database beside the run folders instead.
            runs = run_folder.parent.parent.resolve()
            init_args["tracking_uri"] = f"sqlite:///{runs / 'mlflow.db'}"
            init_args.setdefault("artifact_location", str(runs / "mlartifacts"))
        if saved is not None:
            tracking_uri = init_args["tracking_uri"]
            if saved.get("tracking_uri") != tracking_uri:
                raise ConfigError(
                    f"{run_folder / TRACKER_FILE}: this run folder's MLflow run {saved['run_id']} is on "
                    f"{saved.get('tracking_uri')}, but tracker.init_args.tracking_uri is {tracking_uri}: "
                    "resume with the same tracking_uri, or start a new run folder"
                )
            init_args["run_id"] = saved["run_id"]
        return init_args

    @property
    def tracking_uri(self) -> str:
        """The store the run is in: the one this package passed (a logger it did not build: its client's)."""
        return self.settings.get("tracking_uri") or self.logger.experiment.tracking_uri

    def record(self) -> dict[str, Any]:
        return {
            "tracking_uri": self.tracking_uri,
            "experiment_id": self.logger.experiment_id,
            "run_id": self.logger.run_id,
        }

    def log_hyperparams(self, settings: dict[str, Any]) -> None:
        super().log_hyperparams(self._new_params(settings))

    def _new_params(self, settings: dict[str, Any]) -> dict[str, Any]:
        """``settings`` (flattened) less those the MLflow run already holds (a resume): MLflow keeps a
        parameter's first value and refuses another one; a changed value is named in a warning instead."""
        flat = flatten_params(settings)
        existing = self.logger.experiment.get_run(self.logger.run_id).data.params
        changed = sorted(k for k, v in flat.items() if k in existing and existing[k] != str(v)[:250])
        if changed:
            shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
            rank_zero_warn(
                f"MLflow run {self.logger.run_id} keeps its first value of {shown}: "
                "MLflow parameters cannot change on resume"
            )
        return {k: v for k, v in flat.items() if k not in existing}

    def log_config(self, config_file: Path) -> None:
        self.logger.experiment.log_artifact(self.logger.run_id, str(config_file))

    def log_figure(self, key: str, image: torch.Tensor, step: int) -> None:
        pixels = (image.float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
        self.logger.experiment.log_image(self.logger.run_id, np.ascontiguousarray(pixels), key=key, step=step)

    def where(self) -> str | None:
        if not mlflow_run_started(self.logger):
            return None
        uri, experiment, run = self.tracking_uri, self.logger.experiment_id, self.logger.run_id
        if uri.startswith(("http://", "https://")):
            return f"{uri.rstrip('/')}/#/experiments/{experiment}/runs/{run}"
        return f"run {run} of experiment {experiment}: mlflow ui --backend-store-uri {uri}"
