"""MLflow: the run id kept in the run folder's tracker.json, so that a resumed run logs to the same MLflow
run; without a tracking URI (nor ``$MLFLOW_TRACKING_URI``), a SQLite database beside the run folders."""

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from mae.compat.lightning import flatten_params, mlflow_run_started
from mae.errors import ConfigError, InputError
from mae.io.outputs import Output, check_outputs
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
    record_keys = ("tracking_uri", "run_id")
    # MLflow's defaults (7 retries, backing off from 2 s; requests of up to 120 s) held every call to a
    # server that went down for minutes: a refused connection now ends a call in seconds, a server that
    # stopped answering in about 95 s.
    wait_bounds = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    }

    @classmethod
    def check_start(
        cls, init_args: dict[str, Any], run_folder: Path, resume_step: int | None, saved: dict | None
    ) -> None:
        """Refuse a tracking URI MLflow has no store for, a database it cannot write, a server it cannot
        reach within ``CHECK_TIMEOUT`` seconds, and a resume whose MLflow run is gone; a database not made
        yet is not made here (a run refused later leaves none)."""
        # Lightning's default of tracking_uri is $MLFLOW_TRACKING_URI as it was when Lightning was imported.
        given, environment = init_args.get("tracking_uri"), os.getenv("MLFLOW_TRACKING_URI")
        uri = cls.tie_to_run_folder(dict(init_args), run_folder, resume_step, saved)["tracking_uri"]
        if given and given != environment:
            label = f"tracker.init_args.tracking_uri {uri}"
        elif environment:
            label = f"$MLFLOW_TRACKING_URI {uri}"
        else:
            label = f"the default MLflow store {uri} (tracker.init_args.tracking_uri unset)"
        record = run_folder / TRACKER_FILE
        database = _sqlite_file(uri)
        if database is not None:
            check_outputs("mlflow", [Output(database, f"{label}: the database", "file", _kept)])
            if database.is_file() and not os.access(database, os.W_OK):
                raise ConfigError(f"{label}: the database {database} is read-only; choose one you can write")
            if not database.exists():
                if saved is not None:
                    raise _gone(record, saved, f"its database {database} does not exist")
                return
        with _bounded_requests():
            client = _client(uri, label)
            try:
                client.search_experiments(max_results=1)
                if saved is not None:
                    _check_run(client, saved, record)
            except _store_errors() as err:
                raise _unusable(label, err) from None

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

    def unreachable(self, error: Exception) -> str | None:
        from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT

        timeout = MLFLOW_HTTP_REQUEST_TIMEOUT.get()
        why = _request_failure(error, f"no answer within {timeout} s")
        if why is None:
            return None
        return (
            f"the MLflow server {self.tracking_uri} stopped answering ({why}; each call tried "
            f"{MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() + 1} times, waiting up to {timeout} s: set "
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_TIMEOUT to wait longer)"
        )

    def where(self) -> str | None:
        if not mlflow_run_started(self.logger):
            return None
        uri, experiment, run = self.tracking_uri, self.logger.experiment_id, self.logger.run_id
        if uri.startswith(("http://", "https://")):
            return f"{uri.rstrip('/')}/#/experiments/{experiment}/runs/{run}"
        return f"run {run} of experiment {experiment}: mlflow ui --backend-store-uri {uri}"


CHECK_TIMEOUT = 5  # seconds the start-up check waits for a tracking server's answer, tried once


@contextmanager
def _bounded_requests() -> Iterator[None]:
    """MLflow's HTTP requests inside: one try of at most ``CHECK_TIMEOUT`` seconds, where its defaults
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` 7, with backoff) keep a refused connection retrying for minutes."""
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT

    bounded = {
        MLFLOW_HTTP_REQUEST_MAX_RETRIES.name: "0",
        MLFLOW_HTTP_REQUEST_TIMEOUT.name: str(CHECK_TIMEOUT),
    }
    before = {name: os.environ.get(name) for name in bounded}
    os.environ.update(bounded)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:`` tracking URI (None: another store, or one in memory)."""
    if not uri.startswith("sqlite:"):
        return None
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError
    except ImportError:  # no SQLite store without it: the client says so
        return None
    try:
        database = make_url(uri).database
    except ArgumentError:
        return None
    return Path(database) if database and database != ":memory:" else None


def _kept(database: Path) -> bool:
    """An existing database is MLflow's to add to."""
    return True


def _store_errors() -> tuple[type[Exception], ...]:
    """What MLflow's client raises for a store it cannot use (an error of its, the store's client or the
    database)."""
    from mlflow.exceptions import MlflowException

    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:
        return MlflowException, ImportError, OSError
    return MlflowException, ImportError, OSError, SQLAlchemyError


def _client(uri: str, label: str):
    """MLflow's client of ``uri`` (a database store connects, and is made if missing)."""
    from mlflow.tracking import MlflowClient
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException

    try:
        return MlflowClient(uri)
    except UnsupportedModelRegistryStoreURIException as err:
        schemes = ", ".join(repr(scheme) for scheme in err.supported_uri_schemes if scheme)
        raise ConfigError(
            f"{label}: MLflow has no store of the scheme {urlparse(uri).scheme!r}; use one of {schemes} "
            "(a server: http://host:port, a database: sqlite:///path/to/mlflow.db)"
        ) from None
    except _store_errors() as err:
        raise _unusable(label, err) from None


def _unusable(label: str, err: Exception) -> ConfigError:
    """The error of a store that ``err`` says MLflow cannot use; a server it cannot reach is named so."""
    why = _request_failure(err, f"no answer within {CHECK_TIMEOUT} s")
    if why is not None:
        return ConfigError(f"{label}: cannot reach the MLflow server ({why}); start it, or correct the URI")
    message = getattr(err, "message", None) or str(err)
    return ConfigError(f"{label}: MLflow cannot use this store ({message.strip().splitlines()[0]})")


def _request_failure(err: Exception, timed_out: str) -> str | None:
    """Why MLflow's HTTP client failed to reach its server, when that is what ``err`` (an error of MLflow's
    client, or of its HTTP client) says: the system's ``[Errno N] ...``, else the error's type; ``timed_out``
    for a request that got no answer in time (None: another error)."""
    from requests.exceptions import RequestException, Timeout  # MLflow's HTTP client

    cause = err.__cause__ or err.__context__
    failure = err if isinstance(err, RequestException) else cause
    if not isinstance(failure, RequestException):
        return None
    if isinstance(failure, Timeout):
        return timed_out
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", str(failure))
    return found.group(0) if found else type(failure).__name__


def _check_run(client, saved: dict[str, Any], record: Path) -> None:
    """Refuse a resume whose MLflow run (``saved``: its entry in ``record``) is not in the store."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(saved["run_id"])
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise _gone(record, saved, "no run of that id there") from None
    if run.info.lifecycle_stage == "deleted":
        raise _gone(record, saved, f"deleted; mlflow runs restore --run-id {saved['run_id']} brings it back")


def _gone(record: Path, saved: dict[str, Any], why: str) -> InputError:
    return InputError(
        f"{record}: this run folder's MLflow run {saved['run_id']} is gone from {saved['tracking_uri']} "
        f"({why}): restore it there, or move {record.name} away to log the rest of this run to a new MLflow "
        "run"
    )
