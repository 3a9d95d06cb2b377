"""A tracker whose service stops answering mid-run (``mae.training.trackers.outage``): each call waits a
bounded time (never over the user's own settings), then the tracker is left with one warning and the run
goes on; any other error still ends the run. Through the real command with a killed MLflow server:
``tests/integration/pretrain/test_tracker_failures.py``."""

import os
import warnings
from types import SimpleNamespace

import pytest
from lightning.pytorch.loggers import Logger

from mae.training.trackers import MLflowTracker, Tracker
from mae.training.trackers.outage import bounded_waits, guard_lightning_calls, tracker_call


class Refused(ConnectionError):
    pass


class Flaky(Tracker):
    """A tracker whose service is gone when its logger raises ``Refused``; it waits up to ``FLAKY_WAIT``."""

    name = "flaky"
    wait_bounds = {"FLAKY_WAIT": "3", "FLAKY_RETRIES": "1"}

    def unreachable(self, error: Exception) -> str | None:
        return "the flaky server stopped answering" if isinstance(error, Refused) else None


class Calls(Logger):
    """A logger that records its calls (with the environment each saw) and raises ``fail`` when set."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.fail = [], None

    @property
    def name(self) -> str:
        return "calls"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((step, os.environ.get("FLAKY_WAIT"), os.environ.get("FLAKY_RETRIES")))
        if self.fail is not None:
            raise self.fail

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def test_a_service_that_stops_answering__leaves_the_tracker_once_with_one_warning(monkeypatch):
    monkeypatch.delenv("FLAKY_WAIT", raising=False)
    monkeypatch.setenv("FLAKY_RETRIES", "9")  # the user's own: kept
    logger = Calls()
    tracker, trainer = Flaky(logger), SimpleNamespace(global_step=3)
    guard_lightning_calls(tracker, trainer)
    logger.log_metrics({"a": 1.0}, step=2)
    logger.fail = Refused("[Errno 111] Connection refused")
    with pytest.warns(
        UserWarning, match=r"^tracker flaky: the flaky server stopped answering; the run goes on"
    ):
        assert logger.log_metrics({"a": 1.0}, step=3) is None
    assert tracker.left_at == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, and no call once left
        logger.log_metrics({"a": 1.0}, step=4)
        tracker_call(tracker, trainer, logger.log_metrics, {"a": 1.0}, step=5)
    assert logger.calls == [(2, "3", "9"), (3, "3", "9")]  # bounded: its bound where the user set none
    assert "FLAKY_WAIT" not in os.environ and os.environ["FLAKY_RETRIES"] == "9"  # unset after each call


def test_another_error__still_ends_the_run_and_the_tracker_stays():
    logger = Calls()
    tracker = Flaky(logger)
    guard_lightning_calls(tracker, SimpleNamespace(global_step=0))
    logger.fail = ValueError("a bug")
    with pytest.raises(ValueError, match="a bug"):
        logger.log_metrics({"a": 1.0}, step=0)
    assert tracker.left_at is None


def test_bounded_waits__only_where_the_environment_has_no_value(monkeypatch):
    monkeypatch.setenv("FLAKY_WAIT", "600")
    monkeypatch.delenv("FLAKY_RETRIES", raising=False)
    with bounded_waits(Flaky(Calls())):
        assert os.environ["FLAKY_WAIT"] == "600" and os.environ["FLAKY_RETRIES"] == "1"
    assert os.environ["FLAKY_WAIT"] == "600" and "FLAKY_RETRIES" not in os.environ


def test_mlflow__its_bounds_are_mlflow_variables_and_a_refused_request_is_unreachable(monkeypatch):
    pytest.importorskip("mlflow", reason="MLflow comes with the tracking extra")
    import requests
    from mlflow import environment_variables
    from mlflow.exceptions import MlflowException

    for name in MLflowTracker.wait_bounds:
        assert getattr(environment_variables, name).name == name
    tracker = MLflowTracker(Calls(), {"tracking_uri": "http://127.0.0.1:5000"})
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "4")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    try:
        try:
            raise requests.exceptions.ConnectionError("Max retries exceeded ([Errno 111] Connection refused)")
        except requests.exceptions.ConnectionError as cause:
            raise MlflowException(f"API request failed with exception {cause}") from None
    except MlflowException as err:
        refused = err
    why = tracker.unreachable(refused)
    assert why.startswith("the MLflow server http://127.0.0.1:5000 stopped answering ([Errno 111] Connection")
    assert "each call tried 5 times, waiting up to 20 s" in why and "MLFLOW_HTTP_REQUEST_TIMEOUT" in why
    assert tracker.unreachable(MlflowException("INVALID_PARAMETER_VALUE: a metric")) is None


def test_wandb__only_a_failed_start_of_its_run_is_unreachable():
    """W&B queues a run's data while its server is away; its init alone waits for an answer, then raises."""
    pytest.importorskip("wandb", reason="W&B comes with the tracking extra")
    from wandb.errors import CommError, UsageError

    from mae.training.trackers import WandbTracker

    tracker = WandbTracker(Calls(), {"id": "abc"})
    timed_out = CommError('Timed out while retrying: Post "http://127.0.0.1:9/graphql"\nConsider ...')
    assert tracker.unreachable(timed_out) == (
        """W&B's server did not start the run (Timed out while retrying: Post "http://127.0.0.1:9/graphql")"""
    )
    assert tracker.unreachable(UsageError("a bad project name")) is None
