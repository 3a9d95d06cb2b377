"""A tracker that cannot start is refused at start-up, before any training step and before the run folder
is made, as one ``error:`` line (exit status 2) naming the setting, URI or file: a store MLflow cannot
use or reach, a TensorBoard folder that cannot be made, W&B online without credentials, and a run
folder's ``tracker.json`` that this tool did not write or whose tracked run is gone."""

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import (
    TINY_MODEL,
    MlflowServer,
    csv_logger,
    read_metrics,
    run_mae,
    start_mae,
    tensorboard_tracker,
    write_config,
)

MLFLOW = "lightning.pytorch.loggers.MLFlowLogger"


def _config(tmp: Path, tracker: dict, name: str = "config") -> Path:
    """A tiny pretraining run of 1 step (a checkpoint at its end) in ``tmp/runs/t``, with ``tracker``."""
    config = {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}},
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}},
        "trainer": {
            "max_steps": 1,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "limit_val_batches": 0,
            "logger": csv_logger(tmp, "t"),
        },
        "checkpoint": {"every_n_epochs": 1},
        "tracker": tracker,
    }
    return write_config(tmp, config, name)


def _env(tmp: Path, **changes: str | None) -> dict[str, str]:
    """No MLflow store from the environment, W&B's files under ``tmp`` and no W&B credentials (none from
    the user's home either), then ``changes`` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    wandb = {"WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"}
    env |= {key: str(tmp / "wb") for key in wandb} | {"NETRC": str(tmp / "no-netrc"), "WANDB_SILENT": "true"}
    env |= changes
    return {k: v for k, v in env.items() if v is not None}


def _refused(tmp: Path, config: Path, *args: str, env: dict | None = None) -> str:
    """Run ``config`` (``args`` after it); it must end in one ``error:`` line (exit status 2) without a
    traceback. Returns that line."""
    result = run_mae(
        "pretrain", "--config", str(config), *args, env=env or _env(tmp), timeout=120, check=False
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def _no_run_folder(tmp: Path) -> None:
    assert not (tmp / "runs").exists(), sorted(str(p) for p in (tmp / "runs").rglob("*"))


# ------------------------------------------------------------------------------------------------ MLflow


def test_mlflow__a_database_below_a_file_is_refused_by_its_uri(tmp_path):
    (tmp_path / "afile").write_text("mine")
    uri = f"sqlite:///{tmp_path / 'afile' / 'mlflow.db'}"
    line = _refused(tmp_path, _config(tmp_path, {"class_path": MLFLOW, "init_args": {"tracking_uri": uri}}))
    assert f"tracker.init_args.tracking_uri {uri}" in line and f"{tmp_path / 'afile'} is not a folder" in line
    assert (tmp_path / "afile").read_text() == "mine"
    _no_run_folder(tmp_path)


def test_mlflow__a_database_in_a_read_only_folder_is_refused_by_its_uri(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user (root) can write a read-only folder")
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        config = _config(tmp_path, {"class_path": MLFLOW, "init_args": {"tracking_uri": uri}})
        line = _refused(tmp_path, config)
    finally:
        folder.chmod(0o755)
    assert f"tracker.init_args.tracking_uri {uri}" in line and f"{folder} is not writable" in line, line
    _no_run_folder(tmp_path)


def test_mlflow__a_tracking_uri_of_an_unknown_scheme_in_the_environment_is_named(tmp_path):
    config = _config(tmp_path, {"class_path": MLFLOW})
    line = _refused(tmp_path, config, env=_env(tmp_path, MLFLOW_TRACKING_URI="htp://127.0.0.1:5000"))
    assert "$MLFLOW_TRACKING_URI htp://127.0.0.1:5000" in line and "'http'" in line, line
    _no_run_folder(tmp_path)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again once the socket is: nothing listens there


def test_mlflow__a_server_that_cannot_be_reached_is_refused_in_seconds(tmp_path):
    """MLflow's client retries a refused connection for minutes (7 retries, backoff 2): the run used to hang
    with a run folder made and nothing said."""
    uri = f"http://127.0.0.1:{_closed_port()}"
    config = _config(tmp_path, {"class_path": MLFLOW, "init_args": {"tracking_uri": uri}})
    start = time.monotonic()
    line = _refused(tmp_path, config)
    assert time.monotonic() - start < 60  # the start-up itself, on 2 busy cores; the check is instant
    assert f"tracker.init_args.tracking_uri {uri}: cannot reach the MLflow server" in line, line
    _no_run_folder(tmp_path)


def test_mlflow__a_server_that_goes_down_mid_run_is_left_in_seconds_and_the_run_finishes(tmp_path):
    """MLflow's client retried every call to a server that went down for minutes (7 retries, backing off
    from 2 s), then the run ended in its traceback. Now each call is bounded and the tracker is left: the
    run finishes, its metrics.csv complete."""
    pytest.importorskip("mlflow.server", reason="the MLflow server comes with the dev extra (mlflow)")
    with MlflowServer(tmp_path / "mlflow") as server:
        config = _config(tmp_path, {"class_path": MLFLOW, "init_args": {"tracking_uri": server.uri}})
        run = yaml.safe_load(config.read_text())
        pause = {"class_path": "tests.helpers.PauseAt", "init_args": {"moment": "step", "step": 2}}
        run["trainer"] |= {"max_steps": 6, "log_every_n_steps": 1, "callbacks": [pause]}
        config = write_config(tmp_path, run, "down")
        with start_mae("pretrain", "--config", str(config), env=_env(tmp_path)) as proc:
            proc.wait_for_output("PAUSE step step 2", timeout=180)
            server.kill()
            killed = time.monotonic()
            out = "".join(proc.communicate(timeout=150))
            took = time.monotonic() - killed
    assert proc.returncode == 0, out[-3000:]
    assert took < 60, took  # 4 training steps and one bounded call (MLflow's defaults: over 4 minutes a call)
    said = f"tracker mlflow: the MLflow server {server.uri} stopped answering ([Errno 111] Connection refused"
    assert said in out, out[-3000:]
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_TIMEOUT" in out
    assert "the run goes on without mlflow from step 2" in out and "Traceback" not in out, out[-3000:]
    assert "(up to step 2, when its service stopped answering)" in out  # the run summary's mlflow line
    folder = tmp_path / "runs" / "t" / "version_0"
    steps = [int(row["step"]) for row in read_metrics(folder) if row.get("train/loss_step")]
    assert steps == list(range(6))  # every step in metrics.csv
    saved = torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 6


# ------------------------------------------------------------------------------------------- TensorBoard


def test_tensorboard__a_save_dir_that_is_a_file_is_refused_by_name(tmp_path):
    (tmp_path / "tb").write_text("mine")
    line = _refused(tmp_path, _config(tmp_path, tensorboard_tracker(tmp_path / "tb")))
    assert "tracker.init_args.save_dir" in line and f"{tmp_path / 'tb'} is not a folder" in line, line
    assert (tmp_path / "tb").read_text() == "mine"
    _no_run_folder(tmp_path)


# --------------------------------------------------------------------------------------------------- W&B


def test_wandb__online_without_credentials_is_refused_before_any_work(tmp_path):
    """W&B used to say so in a traceback from its own init, after the model was built (about 23 s)."""
    pytest.importorskip("wandb", reason="W&B comes with the tracking extra")
    tracker = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"mode": "online"}}
    line = _refused(tmp_path, _config(tmp_path, tracker))
    assert "tracker: W&B in online mode needs credentials" in line and "wandb login" in line, line
    _no_run_folder(tmp_path)


def test_wandb__online_with_a_key_but_no_server_is_refused_in_seconds_before_any_work(tmp_path):
    """W&B's init used to wait its init_timeout (90 s) after the model was built, then end the run in a
    traceback (exit status 1), leaving a run folder."""
    pytest.importorskip("wandb", reason="W&B comes with the tracking extra")
    url = f"http://127.0.0.1:{_closed_port()}"
    tracker = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {}}
    env = _env(
        tmp_path, WANDB_MODE="online", WANDB_BASE_URL=url, WANDB_API_KEY="0123456789abcdef" * 2 + "0" * 8
    )
    start = time.monotonic()
    line = _refused(tmp_path, _config(tmp_path, tracker), env=env)
    assert time.monotonic() - start < 60  # the start-up itself, on 2 busy cores; the check is instant
    assert f"tracker: W&B's server {url} cannot be reached ([Errno 111] Connection refused)" in line, line
    assert "would wait 90 s for it" in line and "tracker.init_args.mode offline" in line, line
    _no_run_folder(tmp_path)


# ------------------------------------------------------------------------- the run folder's tracker.json


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> Path:
    """A finished 1-step run with MLflow (a SQLite store in ``<folder>/store``): its folder, holding
    ``config.yaml`` and ``runs/t/version_0`` (a last.ckpt and tracker.json)."""
    folder = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{folder / 'store' / 'mlflow.db'}"
    # artifacts in the store's folder too: MLflow's default for a given SQLite store is ./mlruns (the clone)
    artifacts = str(folder / "store" / "artifacts")
    config = _config(
        folder, {"class_path": MLFLOW, "init_args": {"tracking_uri": uri, "artifact_location": artifacts}}
    )
    run_mae("pretrain", "--config", str(config), env=_env(folder), timeout=300)
    run = folder / "runs" / "t" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "tracker.json").is_file()
    return folder


def _copy(tracked_run: Path, tmp: Path) -> tuple[Path, Path]:
    """``tracked_run``'s runs, store and config in ``tmp`` (the config's paths too): (config, run folder)."""
    shutil.copytree(tracked_run / "runs", tmp / "runs")
    shutil.copytree(tracked_run / "store", tmp / "store")
    record = tmp / "runs" / "t" / "version_0" / "tracker.json"  # the store it names: the copy
    record.write_text(record.read_text().replace(str(tracked_run), str(tmp)))
    text = (tracked_run / "config.yaml").read_text().replace(str(tracked_run), str(tmp))
    config = write_config(tmp, yaml.safe_load(text), "config")
    return config, tmp / "runs" / "t" / "version_0"


@pytest.mark.parametrize(
    "foreign",
    [
        pytest.param([{"step": 3}], id="a list"),
        pytest.param({"mlflow": "x"}, id="an entry of another shape"),
        pytest.param({"mlflow": {"run": "x"}}, id="an entry without a run id"),
    ],
)
def test_record__a_tracker_json_this_tool_did_not_write_is_refused_and_kept(tracked_run, tmp_path, foreign):
    config, run = _copy(tracked_run, tmp_path)
    record = run / "tracker.json"
    record.write_text(json.dumps(foreign))
    line = _refused(tmp_path, config, "--ckpt_path", "last")
    assert f"{record}: not a tracker record this tool wrote" in line and "move it away" in line, line
    assert json.loads(record.read_text()) == foreign  # left as it was


@pytest.mark.parametrize("how", ["database deleted", "run not in it"])
def test_record__a_resume_whose_mlflow_run_is_gone_says_so_and_what_to_do(tracked_run, tmp_path, how):
    config, run = _copy(tracked_run, tmp_path)
    record = json.loads((run / "tracker.json").read_text())
    if how == "database deleted":
        (tmp_path / "store" / "mlflow.db").unlink()
    else:
        record["mlflow"]["run_id"] = "0" * 32
        (run / "tracker.json").write_text(json.dumps(record))
    line = _refused(tmp_path, config, "--ckpt_path", "last")
    run_id, uri = record["mlflow"]["run_id"], record["mlflow"]["tracking_uri"]
    assert f"this run folder's MLflow run {run_id} is gone from {uri}" in line, line
    assert "move tracker.json away" in line
    assert not (tmp_path / "store" / "mlflow.db").exists() or how != "database deleted"  # not made anew
