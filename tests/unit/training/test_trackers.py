"""Experiment trackers (``mae.training.trackers``) against the real thing, offline: TensorBoard's event
files read back with its ``EventAccumulator``, a real MLflow server on 127.0.0.1 (SQLite store, local
artifacts) read back with ``MlflowClient``, and W&B in offline mode read back from its run folder. Each
run is SIGTERM-ed after its first epoch and resumed with the same command line: the tracked run must
continue, with every step logged once."""

import json
import os
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from lightning.pytorch.loggers import Logger

from mae.errors import ConfigError
from mae.training import trackers
from mae.training.callbacks import PREEMPTED_EXIT_CODE
from mae.training.trackers import (
    TRACKER_FILE,
    TRACKERS,
    Tracker,
    build_tracker,
    check_tracker,
    log_figure,
    register_tracker,
    remember_run,
    tracker_spec,
    where_to_look,
)
from tests.helpers import (
    TINY_MODEL,
    MlflowServer,
    csv_logger,
    run_mae,
    start_mae,
    write_config,
    write_image_folder,
)

RECIPES = Path(__file__).resolve().parents[3] / "mae" / "configs" / "loggers"
EPOCHS, STEPS_PER_EPOCH = 3, 8  # 32 images, batch 4


def _config(tmp: Path, recipe: str, **tracker_args) -> Path:
    """A tiny pretraining run (figures every epoch, a checkpoint every epoch) with the shipped tracker
    recipe ``recipe`` and ``tracker_args`` over its settings."""
    write_image_folder(tmp / "data" / "train", ["a", "b"], per_class=16, size=(24, 24))
    tracker = yaml.safe_load((RECIPES / f"{recipe}.yaml").read_text())["tracker"]
    tracker["init_args"] |= tracker_args
    config = {
        "seed_everything": 0,
        "model": TINY_MODEL,
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {"root": str(tmp / "data"), "img_size": 16, "batch_size": 4, "num_workers": 0},
        },
        "trainer": {
            "max_epochs": EPOCHS,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            "logger": csv_logger(tmp, "tracked"),
        },
        "checkpoint": {"every_n_epochs": 1},
        "reconstruction": {"every_n_epochs": 1, "num_images": 2},
        "tracker": tracker,
    }
    return write_config(tmp, config, recipe)


def _env(tmp: Path) -> dict[str, str]:
    """No network, and W&B's settings, cache and staging under ``tmp`` (not the user's home)."""
    return {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp / "wb"),
        "WANDB_CACHE_DIR": str(tmp / "wb"),
        "WANDB_DATA_DIR": str(tmp / "wb"),
    }


def _sigterm_then_resume(tmp: Path, config: Path) -> tuple[Path, str]:
    """Start the run, SIGTERM it once its first epoch's checkpoint is written, then repeat the command
    line (``--ckpt_path last``) to the end. Returns the run folder and the resumed run's output."""
    run = tmp / "runs" / "tracked" / "version_0"
    args = ("--config", str(config), "--ckpt_path", "last")
    start = start_mae("pretrain", *args, env=_env(tmp))
    with start as proc:
        deadline = time.time() + 180
        while not (run / "checkpoints" / "epoch_0000.ckpt").exists() and time.time() < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out = "".join(part or "" for part in proc.communicate(timeout=120))
    assert proc.returncode == PREEMPTED_EXIT_CODE, out[-3000:]
    result = run_mae("pretrain", *args, env=_env(tmp), check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]  # one run folder
    return run, out


def _assert_every_step_once(steps: list[int]) -> None:
    assert sorted(steps) == list(range(EPOCHS * STEPS_PER_EPOCH)), steps  # no step twice, none missing


# ------------------------------------------------------------------------------------------- TensorBoard


@pytest.mark.slow  # starts a process of its own
def test_tensorboard__scalars_figure_settings_and_one_curve_across_a_sigterm_and_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run, out = _sigterm_then_resume(tmp_path, _config(tmp_path, "tensorboard", save_dir=str(tmp_path / "tb")))
    log_dir = tmp_path / "tb" / "tracked" / "version_0"  # <save_dir>/<run name>/<version>
    # the interrupted run's file and the resumed one's
    assert len(list(log_dir.glob("events.out.tfevents.*"))) >= 2
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    _assert_every_step_once([e.step for e in events.Scalars("train/loss_step")])
    assert [e.step for e in events.Scalars("train/loss_epoch")] == [7, 15, 23]
    assert {"train/lr/decay", "train/device/samples_per_sec"} <= set(events.Tags()["scalars"])
    figures = events.Images("reconstructions")
    assert [figure.step for figure in figures] == [7, 15, 23]  # each epoch's, at its last step
    hparams = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    )
    values = hparams.session_start_info.hparams
    assert values["run/effective_batch"].number_value == 4
    assert values["architecture/class"].string_value == "MaskedAutoencoderViT"
    assert values["architecture/args/embed_dim"].number_value == 32
    assert values["versions/torch"].string_value.startswith("2.")
    assert f"tensorboard --logdir {log_dir}" in out
    assert json.loads((run / TRACKER_FILE).read_text())["tensorboard"]["log_dir"] == str(log_dir)


# ------------------------------------------------------------------------------------------------ MLflow


@pytest.fixture
def mlflow_server(tmp_path):
    """A real MLflow tracking server on 127.0.0.1 (``tests.helpers.MlflowServer``). Yields its URI."""
    pytest.importorskip("mlflow.server", reason="the MLflow server comes with the dev extra (mlflow)")
    with MlflowServer(tmp_path / "mlflow") as server:
        yield server.uri


@pytest.mark.slow  # starts a process of its own
def test_mlflow__scalars_figure_settings_and_one_run_across_a_sigterm_and_resume(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    config = _config(
        tmp_path, "mlflow", tracking_uri=mlflow_server, experiment_name="trackers-test", log_model=True
    )
    run, out = _sigterm_then_resume(tmp_path, config)
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("trackers-test")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # the resumed run continued the first one
    tracked = runs[0]
    assert json.loads((run / TRACKER_FILE).read_text())["mlflow"]["run_id"] == tracked.info.run_id
    assert tracked.info.status == "FINISHED"
    _assert_every_step_once(
        [m.step for m in client.get_metric_history(tracked.info.run_id, "train/loss_step")]
    )
    assert [m.step for m in client.get_metric_history(tracked.info.run_id, "train/loss_epoch")] == [7, 15, 23]
    params = tracked.data.params
    assert params["run/effective_batch"] == "4" and params["architecture/args/embed_dim"] == "32"
    assert params["versions/torch"].startswith("2.")
    artifacts = {a.path for a in client.list_artifacts(tracked.info.run_id)}
    assert "config.yaml" in artifacts and "images" in artifacts
    # log_model: each checkpoint as it is written, the last one with the final weights
    assert {"epoch_0000", "epoch_0002", "last"} <= artifacts
    stored = client.download_artifacts(tracked.info.run_id, "last/last.ckpt", str(tmp_path / "download"))
    assert Path(stored).read_bytes() == (run / "checkpoints" / "last.ckpt").read_bytes()
    figures = [a.path for a in client.list_artifacts(tracked.info.run_id, "images")]
    steps = sorted(
        int(m.group(1))
        for name in figures
        if (m := re.search(r"/reconstructions\+step\+(\d+)\+.*\.png$", name))
    )
    assert steps == [7, 15, 23], figures  # MLflow's image log: each epoch's figure at its step
    assert f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs/{tracked.info.run_id}" in out


# --------------------------------------------------------------------------------------------------- W&B


def _wandb_records(run_folder: Path):
    """The records (protobuf ``Record``s) of a W&B offline run folder's ``run-<id>.wandb`` file: a 7-byte
    W&B header (":W&B", an id, a version), then LevelDB's log format: 32 KiB blocks of chunks, each a
    7-byte header (CRC32C, length as 2 bytes little-endian, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = next(run_folder.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    position, block, chunks = 7, 32768, []
    while position + 7 <= len(data):
        left = block - position % block
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        if left < 7 or (length == 0 and kind == 0):  # the rest of the block is padding
            position += left
            continue
        chunks.append(data[position + 7 : position + 7 + length])
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


@pytest.mark.slow  # starts a process of its own
def test_wandb__offline_scalars_figure_settings_and_one_run_across_a_sigterm_and_resume(tmp_path):
    pytest.importorskip("wandb", reason="W&B comes with the tracking extra")
    run, out = _sigterm_then_resume(tmp_path, _config(tmp_path, "wandb", project="trackers-test"))
    run_id = json.loads((run / TRACKER_FILE).read_text())["wandb"]["id"]
    segments = sorted((run / "wandb").glob("offline-run-*"))
    assert len(segments) == 2 and all(s.name.endswith(f"-{run_id}") for s in segments)  # one run id, twice
    steps, figures, config, wandb_steps = [], [], {}, []
    for segment in segments:
        for record in _wandb_records(segment):
            if record.HasField("history"):
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                wandb_steps.append(row["_step"])
                if "train/loss_step" in row:
                    steps.append(row["trainer/global_step"])
                if "reconstructions/_type" in row:  # an image: its fields flattened
                    figures.append(row["trainer/global_step"])
            elif record.HasField("config"):
                config |= {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.config.update
                }
    _assert_every_step_once(steps)
    # W&B's own step goes on rising: `wandb sync --id` keeps every row
    assert wandb_steps == sorted(set(wandb_steps))
    assert figures == [7, 15, 23]
    assert config["run"]["effective_batch"] == 4 and config["architecture"]["args"]["embed_dim"] == 32
    assert config["versions"]["torch"].startswith("2.")
    assert f"offline run {run_id}; upload: wandb sync --id {run_id} {segments[0]} {segments[1]}" in out


# --------------------------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("class_path", "key"),
    [
        ("lightning.pytorch.loggers.TensorBoardLogger", "name"),
        ("lightning.pytorch.loggers.MLFlowLogger", "run_id"),
        ("lightning.pytorch.loggers.WandbLogger", "id"),
    ],
)
def test_spec__a_setting_the_run_folder_decides_is_refused_by_name(class_path, key):
    with pytest.raises(ValueError, match=rf"tracker.init_args.{key}: set by the run folder"):
        tracker_spec({"class_path": class_path, "init_args": {key: "x"}})


def test_spec__a_tracker_whose_client_is_missing_names_the_extra_before_any_work(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a)
    )
    with pytest.raises(
        ValueError,
        match=r"WandbLogger needs wandb, which is not installed: pip install \"mae-lightning\[tracking\]\"",
    ):
        tracker_spec({"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {}})
    assert tracker_spec({"class_path": "lightning.pytorch.loggers.MLFlowLogger", "init_args": {}}) is not None


def test_mlflow__without_a_tracking_uri_a_sqlite_store_beside_the_run_folders(tmp_path, monkeypatch):
    """MLflow 3 refuses its old folder store (./mlruns), Lightning's default: the run gets a database."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = tracker_spec(
        {"class_path": "lightning.pytorch.loggers.MLFlowLogger", "init_args": {"tracking_uri": None}}
    )
    tracker = build_tracker(spec, tmp_path / "runs" / "pretrain_default" / "version_0", None)
    assert tracker.settings["tracking_uri"] == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert tracker.settings["artifact_location"] == str(tmp_path / "runs" / "mlartifacts")
    assert tracker.where() is None  # its run not asked for yet: none made to name
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")  # the environment's store wins
    tracker = build_tracker(spec, tmp_path / "runs" / "x" / "version_0", None)
    assert tracker.settings["tracking_uri"] == "http://127.0.0.1:1"


def test_recipes__each_parses_on_top_of_the_default_recipe():
    """The three shipped recipes stack on a training recipe (``--print_config``, nothing run)."""
    from mae.cli.train import build_parser

    parser = build_parser()
    for recipe in ("tensorboard", "mlflow", "wandb"):
        config = parser.parse_args(
            [
                "--config",
                str(RECIPES.parent / "pretrain" / "default.yaml"),
                "--config",
                str(RECIPES / f"{recipe}.yaml"),
            ]
        )
        assert tracker_spec(config.tracker)["class_path"].endswith(
            ("TensorBoardLogger", "MLFlowLogger", "WandbLogger")
        )


# ----------------------------------------------------------------------------------------- the interface


class RecordingLogger(Logger):
    """A logger of a made-up tracker: it keeps what it is sent."""

    def __init__(self, folder: str | None = None, project: str = "p") -> None:
        super().__init__()
        self.folder, self.project, self.figures = folder, project, []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics, step=None) -> None:
        pass

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


class RecordingTracker(Tracker):
    """A fourth tracker, written as a new one would be: the class, its logger, what the run folder decides."""

    name = "recording"
    logger_class = f"{__name__}.RecordingLogger"
    run_folder_settings = ("folder",)

    @classmethod
    def tie_to_run_folder(cls, init_args, run_folder, resume_step, saved):
        folder = saved["folder"] if saved is not None else str(run_folder / "recording")
        return {**init_args, "folder": folder}

    def record(self):
        return {"folder": self.logger.folder}

    def log_figure(self, key, image, step):
        self.logger.figures.append((key, tuple(image.shape), step))

    def where(self):
        return f"the recording in {self.logger.folder}"


def test_interface__a_fourth_tracker_is_one_class_registered(tmp_path, monkeypatch):
    """A new tracker is one ``Tracker`` subclass, registered: the config's checks, the logger tied to the
    run folder, its record in tracker.json (read back on resume), the figures and the summary line."""
    import torch
    from lightning.pytorch.loggers import CSVLogger

    monkeypatch.setattr(trackers.base, "TRACKERS", dict(TRACKERS))
    register_tracker(RecordingTracker)
    class_path = RecordingTracker.logger_class
    with pytest.raises(ConfigError, match=r"tracker.init_args.folder: set by the run folder"):
        tracker_spec({"class_path": class_path, "init_args": {"folder": "elsewhere"}})
    spec = tracker_spec({"class_path": class_path, "init_args": {"project": "q"}})
    run_folder = tmp_path / "runs" / "pretrain" / "version_0"
    run_folder.mkdir(parents=True)
    tracker = build_tracker(spec, run_folder, None)
    assert isinstance(tracker, RecordingTracker) and isinstance(tracker.logger, RecordingLogger)
    assert (tracker.logger.folder, tracker.logger.project) == (str(run_folder / "recording"), "q")
    remember_run(tracker, run_folder)
    assert json.loads((run_folder / TRACKER_FILE).read_text()) == {
        "recording": {"folder": tracker.logger.folder}
    }
    resumed = build_tracker({"class_path": class_path, "init_args": {}}, run_folder, resume_step=8)
    assert resumed.logger.folder == tracker.logger.folder  # the run folder's record, read back
    trainer = SimpleNamespace(loggers=[CSVLogger(tmp_path), tracker.logger], global_step=8, callbacks=[])
    log_figure(trainer, "reconstructions", torch.rand(3, 4, 5))
    assert tracker.logger.figures == [("reconstructions", (3, 4, 5), 7)]  # the CSV logger is no tracker
    assert where_to_look(trainer) == [("recording:", f"the recording in {tracker.logger.folder}")]


def test_interface__a_logger_without_a_tracker_class_is_built_as_configured_and_records_nothing(tmp_path):
    spec = tracker_spec({"class_path": f"{__name__}.RecordingLogger", "init_args": {"folder": "mine"}})
    tracker = build_tracker(spec, tmp_path, None)
    assert type(tracker) is Tracker and tracker.logger.folder == "mine"  # no setting refused, none filled in
    remember_run(tracker, tmp_path)
    assert not (tmp_path / TRACKER_FILE).exists()
    trainer = SimpleNamespace(loggers=[tracker.logger], global_step=1, callbacks=[])
    assert where_to_look(trainer) == []


def test_interface__each_shipped_recipe_names_a_registered_tracker_of_its_own():
    names = {
        recipe.stem: yaml.safe_load(recipe.read_text())["tracker"]["class_path"]
        for recipe in RECIPES.glob("*.yaml")
    }
    assert {stem: TRACKERS[class_path].name for stem, class_path in names.items()} == {
        "tensorboard": "tensorboard",
        "mlflow": "mlflow",
        "wandb": "wandb",
    }


# ------------------------------------------------------------------------------- the checks at start-up


@pytest.mark.parametrize(
    "foreign",
    ['["runs", 2]', '{"mlflow": "x"}', '{"wandb": {"project": "p"}}', "not json"],
    ids=["a list", "an entry of another shape", "an entry without its id", "not JSON"],
)
def test_record__a_tracker_json_this_tool_did_not_write_is_refused_by_name_and_never_replaced(
    tmp_path, foreign
):
    from mae.errors import InputError

    (tmp_path / TRACKER_FILE).write_text(foreign)
    spec = tracker_spec(
        {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "tb"}}
    )
    for resume_step in (None, 8):  # a fresh run would add its entry to it, a resumed one read it
        with pytest.raises(InputError, match=rf"{tmp_path / TRACKER_FILE}: not a tracker record this tool"):
            check_tracker(spec, tmp_path, resume_step)
    assert (tmp_path / TRACKER_FILE).read_text() == foreign


def test_mlflow__the_check_of_the_default_store_makes_no_database(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = tracker_spec({"class_path": "lightning.pytorch.loggers.MLFlowLogger", "init_args": {}})
    check_tracker(spec, tmp_path / "runs" / "pretrain_default" / "version_0", None)
    assert not any(tmp_path.iterdir())  # runs/mlflow.db is made once the run starts


def test_wandb__credentials_are_needed_online_only(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B comes with the tracking extra")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    run_folder = tmp_path / "runs" / "x" / "version_0"
    spec = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"mode": "offline"}}
    check_tracker(tracker_spec(spec), run_folder, None)  # offline: nothing to log in to
    spec["init_args"]["mode"] = "online"
    with pytest.raises(ConfigError, match=r"tracker: W&B in online mode needs credentials.*wandb login"):
        check_tracker(tracker_spec(spec), run_folder, None)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    # with credentials, the server is asked (tests/integration/pretrain/test_tracker_failures.py): not here
    monkeypatch.setattr("mae.training.trackers.wandb._check_server", lambda: None)
    check_tracker(tracker_spec(spec), run_folder, None)
