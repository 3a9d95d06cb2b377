"""TensorBoard: event files in ``<save_dir>/<run name>/<version>``, the run folder's name and version, so
that ``tensorboard --logdir <save_dir>`` shows every run. A resumed run purges the events at and after the
step it resumes from (what a killed run logged after its last checkpoint): the curves have no repeats."""

from pathlib import Path
from typing import Any

import torch

from mae.compat.lightning import flatten_params, tensorboard_param_values
from mae.compat.tensorboard import event_file_writer
from mae.io.outputs import Output, check_outputs
from mae.training.trackers.base import Tracker, register_tracker


@register_tracker
class TensorBoardTracker(Tracker):
    """TensorBoard (``TensorBoardLogger``): scalars, figures, the settings in its HPARAMS tab and the
    config as text."""

    name = "tensorboard"
    logger_class = "lightning.pytorch.loggers.TensorBoardLogger"
    run_folder_settings = ("name", "version", "sub_dir", "purge_step")
    client = ("tensorboard", ("tensorboard", "tensorboardX"))

    @classmethod
    def check_start(
        cls, init_args: dict[str, Any], run_folder: Path, resume_step: int | None, saved: dict | None
    ) -> None:
        tied = cls.tie_to_run_folder(dict(init_args), run_folder, resume_step, saved)
        save_dir = str(tied.get("save_dir") or "")
        if save_dir and "://" not in save_dir:  # a remote one (gs://, s3://) is Lightning's to check
            events = Path(save_dir, tied["name"], tied["version"])
            check_outputs("tensorboard", [Output(events, "tracker.init_args.save_dir", "folder", _continued)])

    @classmethod
    def tie_to_run_folder(
        cls, init_args: dict[str, Any], run_folder: Path, resume_step: int | None, saved: dict | None
    ) -> dict[str, Any]:
        name, version = run_folder.parent.name, run_folder.name
        init_args = {**init_args, "name": name, "version": version}
        if resume_step is not None and Path(init_args["save_dir"], name, version).is_dir():
            init_args["purge_step"] = resume_step  # passed on to SummaryWriter
        return init_args

    def record(self) -> dict[str, Any]:
        return {"log_dir": self.logger.log_dir}

    def log_hyperparams(self, settings: dict[str, Any]) -> None:
        super().log_hyperparams(settings)
        self._write_hparams_tab(settings)

    def _write_hparams_tab(self, settings: dict[str, Any]) -> None:
        """``settings`` in TensorBoard's HPARAMS tab (Lightning writes it only with an ``hp_metric``)."""
        from torch.utils.tensorboard.summary import hparams

        flat = tensorboard_param_values(flatten_params(settings))
        flat = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in flat.items()}
        writer = event_file_writer(self.logger.experiment)
        for summary in hparams(flat, {}):
            writer.add_summary(summary)

    def log_config(self, config_file: Path) -> None:
        self.logger.experiment.add_text("config", "```yaml\n" + config_file.read_text() + "\n```", 0)

    def log_figure(self, key: str, image: torch.Tensor, step: int) -> None:
        self.logger.experiment.add_image(key, image.float().clamp(0, 1), step)

    def where(self) -> str:
        return f"tensorboard --logdir {self.logger.log_dir}"


def _continued(event_folder: Path) -> bool:
    """Whatever an event folder holds is kept and added to (a resumed run's curves continue there)."""
    return True
