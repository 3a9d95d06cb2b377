"""Weights & Biases: the run id kept in the run folder's tracker.json (``resume="allow"``), its files in
``<run folder>/wandb``, so that a resumed run continues the same W&B run."""

import re
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
    record_keys = ("id",)

    @classmethod
    def check(cls, init_args: dict[str, Any]) -> None:
        if init_args.get("offline") and init_args.get("log_model"):
            raise ConfigError(
                "tracker: W&B in offline mode cannot upload checkpoints: set tracker.init_args.log_model "
                "false, or run online"
            )

    @classmethod
    def check_start(
        cls, init_args: dict[str, Any], run_folder: Path, resume_step: int | None, saved: dict | None
    ) -> None:
        """Refuse online mode without credentials (W&B would fail in its own init, after the model is built,
        or wait at a prompt for a key) or with a server that does not answer within ``CHECK_TIMEOUT``
        seconds (its init would wait ``init_timeout``, 90 s, first). Offline and disabled runs need
        neither."""
        super().check_start(init_args, run_folder, resume_step, saved)
        if _mode(init_args) in ("offline", "dryrun", "disabled"):
            return
        if not _has_credentials():
            raise ConfigError(
                "tracker: W&B in online mode needs credentials, and none are configured (no "
                "$WANDB_API_KEY, no `wandb login`): run `wandb login` or set WANDB_API_KEY, or set "
                "tracker.init_args.mode offline (upload later with wandb sync)"
            )
        _check_server()

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

    def unreachable(self, error: Exception) -> str | None:
        # W&B queues a run's data while its server is away; only starting the run waits for an answer.
        from wandb.errors import CommError

        if not isinstance(error, CommError):
            return None
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"W&B's server did not start the run ({first_line})"

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


CHECK_TIMEOUT = 5  # seconds the start-up check waits for W&B's server to answer, tried once


def _check_server() -> None:
    """Refuse a W&B server (``$WANDB_BASE_URL``, default W&B's cloud) that does not answer one request
    within ``CHECK_TIMEOUT`` seconds (through W&B's proxies, if set), naming it: without network, W&B's
    init would wait its ``init_timeout`` (90 s by default) after the model is built, then end the run in a
    traceback."""
    import requests  # W&B's own HTTP client
    from wandb.sdk import wandb_setup

    settings = wandb_setup.singleton().settings
    proxies = {
        scheme: url for scheme, url in (("http", settings.http_proxy), ("https", settings.https_proxy)) if url
    }
    try:
        requests.head(
            settings.base_url, timeout=CHECK_TIMEOUT, allow_redirects=False, proxies=proxies or None
        )
    except requests.exceptions.RequestException as err:
        if isinstance(err, requests.exceptions.Timeout):
            why = f"no answer within {CHECK_TIMEOUT} s"
        else:
            found = re.search(r"\[Errno -?\d+\] [^'\")]+", str(err))
            why = found.group(0) if found else type(err).__name__
        raise ConfigError(
            f"tracker: W&B's server {settings.base_url} cannot be reached ({why}), and W&B online would wait "
            f"{settings.init_timeout:g} s for it before failing: check the network (and $WANDB_BASE_URL), or "
            "set tracker.init_args.mode offline (upload later with wandb sync)"
        ) from None


def _new_run_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _mode(init_args: dict[str, Any]) -> str:
    """The mode W&B will run in: the logger's (``offline``, ``mode``), else W&B's own settings
    (``$WANDB_MODE``, ``wandb offline``), else online."""
    if init_args.get("offline"):
        return "offline"
    if init_args.get("mode"):
        return str(init_args["mode"])
    from wandb.sdk import wandb_setup

    return str(wandb_setup.singleton().settings.mode)


def _has_credentials() -> bool:
    """Whether W&B finds credentials for its server (the environment, its settings or .netrc), asked
    without a prompt, a network call or a change to its session."""
    try:
        from wandb.errors import AuthenticationError
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:  # another W&B version: its init decides
        return True
    settings = wandb_setup.singleton().settings
    host = wbauth.HostUrl(settings.base_url, app_url=settings.app_url)
    try:
        found = wbauth.authenticate_session(host=host, source="mae", prompt=False, update_session=False)
    except AuthenticationError as err:
        raise ConfigError(f"tracker: W&B's credentials cannot be used: {err}") from None
    return found is not None
