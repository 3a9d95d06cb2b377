"""Weights & Biases: the run id kept in the run folder's tracker.json (``resume="allow"``), its files in
``<run folder>/wandb``, so that a resumed run continues the same W&B run."""

import secrets
import string
from pathlib import Path
from typing import Any

import torch

from mae.compat.lightning import wandb_run_started
from mae.errors import ConfigError
from mae.training.trackers.base import Tracker, register_tracker


@register_tracker
class WandbTracker(Tracker):
    """W&B (``WandbLogger``): scalars, figures, the settings as the run's config and the config file."""

    name = "wandb"
    logger_class = "lightning.pytorch.loggers.WandbLogger"
    run_folder_settings = ("save_dir", "dir", "id", "version", "resume")
    client = ("wandb", ("wandb",))

    @classmethod
    def check(cls, init_args: dict[str, Any]) -> None:
        if init_args.get("offline") and init_args.get("log_model"):
            raise ConfigError(
                "tracker: W&B in offline mode cannot upload checkpoints: set tracker.init_args.log_model "
                "false, or run online"
            )

    @classmethod
    def tie_to_run_folder(
        cls, init_args: dict[str, Any], run_folder: Path, resume_step: int | None, saved: dict | None
    ) -> dict[str, Any]:
        run_id = saved["id"] if saved is not None else _new_run_id()
        return {**init_args, "save_dir": str(run_folder), "id": run_id}

    def record(self) -> dict[str, Any]:
        return {"id": self.settings["id"], "project": self.settings.get("project")}

    def log_config(self, config_file: Path) -> None:
        self.logger.experiment.save(str(config_file), base_path=str(config_file.parent), policy="now")

    def log_figure(self, key: str, image: torch.Tensor, step: int) -> None:
        self.logger.log_image(key=key, images=[image.float().clamp(0, 1).cpu()], step=step)

    def where(self) -> str | None:
        if not wandb_run_started(self.logger):
            return None
        run = self.logger.experiment
        if getattr(run.settings, "mode", "") not in ("offline", "dryrun"):
            return str(run.url)
        folders = sorted(Path(self.logger.save_dir, "wandb").glob(f"offline-run-*-{run.id}"))
        upload = f"wandb sync --id {run.id} {' '.join(map(str, folders))}"
        return f"offline run {run.id}; upload: {upload}"

    def checkpoint_state(self) -> dict[str, Any]:
        # W&B's own step (``_step``) of the next row: an offline run resumed from this checkpoint cannot ask
        # the server for it, and starting again at 0 would have `wandb sync` drop its rows as out of order.
        if wandb_run_started(self.logger):
            return {"wandb_step": int(self.logger.experiment.step)}
        return {}

    def continue_from(self, state: dict[str, Any]) -> None:
        step = state.get("wandb_step")
        if step:
            run = self.logger.experiment
            if run.step < step:  # offline (online, the server has told it)
                run.log({}, step=step, commit=False)


def _new_run_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))
