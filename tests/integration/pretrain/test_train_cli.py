"""train.py end to end, as a subprocess, on data the tests write."""

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import (
    TINY_MODEL,
    cli_trainer,
    read_metrics,
    run_mae,
    tensorboard_tracker,
    write_cifar,
    write_config,
    write_image_folder,
)


def _config(tmp_path: Path, data: dict, max_epochs: int) -> Path:
    config = {
        "seed_everything": 0,
        "model": TINY_MODEL,
        "data": data,
        "trainer": cli_trainer(tmp_path, "test", max_epochs=max_epochs),
        "checkpoint": {"every_n_epochs": 1},
        "reconstruction": {"every_n_epochs": 1, "num_images": 2},
        "throughput": {"window_size": 2},
    }
    return write_config(tmp_path, config, "config")


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_mae("pretrain", *args, timeout=timeout, check=False)


def _train(*args: str) -> subprocess.CompletedProcess:
    return run_mae("pretrain", *args)


def test_train__image_folder_then_resume_continues_at_the_right_step(tmp_path):
    classes = ["cat", "dog", "owl"]
    write_image_folder(tmp_path / "data" / "train", classes, per_class=4, size=(50, 37))
    write_image_folder(tmp_path / "data" / "val", classes, per_class=2, size=(37, 50), seed=1)
    data = {
        "class_path": "mae.data.ImageFolderDataModule",
        "init_args": {"root": str(tmp_path / "data"), "img_size": 16, "batch_size": 4, "num_workers": 0},
    }
    config = _config(tmp_path, data, max_epochs=2)
    first = _train("--config", str(config))

    run = tmp_path / "runs" / "test" / "version_0"
    assert "12 training images in 3 classes, 6 validation images" in first.stdout + first.stderr
    assert "Run folder:" in first.stdout and "last.ckpt" in first.stdout
    assert (run / "config.yaml").exists()
    assert (run / "reconstructions" / "epoch_0002.png").exists()
    last = run / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 6 and ckpt["epoch"] == 1
    assert "model.cls_token" in ckpt["state_dict"]
    rows = read_metrics(run)
    assert any(r.get("val/loss") for r in rows)
    assert any(r.get("train/device/samples_per_sec") for r in rows)
    lrs = {int(r["step"]): float(r["train/lr/decay"]) for r in rows if r.get("train/lr/decay")}

    _train("--config", str(config), "--trainer.max_epochs", "3", "--ckpt_path", str(last))
    assert not (run.parent / "version_1").exists()  # resumed in the checkpoint's run folder
    resumed = torch.load(last, map_location="cpu", weights_only=False)
    assert resumed["global_step"] == 9 and resumed["epoch"] == 2
    steps = [int(r["step"]) for r in read_metrics(run) if r.get("train/lr/decay")]
    assert steps == sorted(set(steps)) and min(steps) == 0 and max(steps) >= 6  # both runs' rows, none twice
    assert lrs  # the first run logged its lr per step


def test_train__cifar_files(tmp_path):
    write_cifar(tmp_path / "cifar", "cifar10", train_per_batch=4, test=4)
    data = {
        "class_path": "mae.data.CIFARDataModule",
        "init_args": {"root": str(tmp_path / "cifar"), "img_size": 32, "batch_size": 5, "num_workers": 0},
    }
    config = _config(tmp_path, data, max_epochs=1)
    result = _train("--config", str(config), "--trainer.max_steps", "3", "--model.optim.warmup_epochs", "0")
    run = tmp_path / "runs" / "test" / "version_0"
    assert (run / "checkpoints" / "last.ckpt").exists()
    assert list((run / "reconstructions").glob("*.png"))
    assert "20 training images in 10 classes" in result.stdout + result.stderr


def test_train__unknown_key_fails_loudly():
    result = _run("--config", "configs/pretrain/default.yaml", "--model.mask_ration", "0.5", timeout=120)
    assert result.returncode != 0 and "mask_ration" in result.stderr


def test_train__missing_resume_checkpoint_is_named(tmp_path):
    missing = str(tmp_path / "nope.ckpt")
    result = _run(
        "--config", "configs/pretrain/default.yaml", "--ckpt_path", missing, "--trainer.logger", "false"
    )
    assert result.returncode != 0 and "nope.ckpt does not exist" in result.stderr


def test_train__print_config_shows_the_resolved_recipe():
    result = _run("--config", "configs/pretrain/imagenet_vit_base.yaml", "--print_config", timeout=120)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["model"]["optim"]["base_lr"] == 1.5e-4 and printed["trainer"]["max_epochs"] == 800
    assert printed["data"]["init_args"]["img_size"] == 224
    with pytest.raises(KeyError):
        printed["model"]["img_size"]  # linked from data.img_size, not settable twice


def test_train__on_the_digit_scenes_images_without_their_labels(tmp_path):
    data = {
        "class_path": "mae.data.DigitSceneImagesDataModule",
        "init_args": {
            "root": str(tmp_path / "scenes"),
            "num_train": 8,
            "num_val": 4,
            "img_size": 16,
            "batch_size": 4,
        },
    }
    result = _train("--config", str(_config(tmp_path, data, max_epochs=2)))

    assert (
        "DigitSceneImagesDataModule: 8 training images, 4 validation images" in result.stdout + result.stderr
    )
    assert (tmp_path / "scenes" / "scenes.json").exists()  # written on first use, reused after
    rows = read_metrics(tmp_path / "runs" / "test" / "version_0")
    assert any(r.get("val/loss") for r in rows) and any(r.get("train/loss_epoch") for r in rows)


def test_train__prints_no_advertisement_warning_or_uncounted_flops_and_a_step_bounded_epoch(tmp_path):
    """What users did not ask for: Lightning's litlogger / litmodels tips, the LeafSpec deprecation warning,
    "Total FLOPs: 0" and "Epoch 0/-2" for a run bounded by steps. The summary and the bar themselves stay."""
    data = {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}}
    config = _config(tmp_path, data, max_epochs=-1)
    result = _train(
        "--config",
        str(config),
        "--trainer.max_steps",
        "2",
        "--trainer.enable_progress_bar",
        "true",
        "--model.optim.warmup_epochs",
        "0",
        "--trainer.limit_val_batches",
        "0",
    )
    said = result.stdout + result.stderr
    for noise in ("💡", "litlogger", "litmodels", "LeafSpec", "Total Flops", "Total FLOPs", "/-2"):
        assert noise not in said, noise
    assert "Trainable params" in said and "Epoch 0" in said


def test_train__a_run_refused_before_its_first_step_leaves_no_run_folder(tmp_path):
    data = {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}}
    config = _config(tmp_path, data, max_epochs=0)
    result = _run("--config", str(config))
    assert result.returncode == 2 and "this run has 0 optimizer steps" in result.stderr
    assert not (tmp_path / "runs" / "test" / "version_0").exists()  # the next run is version_0, not version_1
    assert not (tmp_path / "runs").exists()  # nor the empty folders above it, which this run made


def test_train__a_refused_run_with_trackers_leaves_no_database_or_event_folder(tmp_path, monkeypatch):
    """The trackers are started after the checks that refuse a run: MLflow's default database beside the
    run folders (runs/mlflow.db) and TensorBoard's folder are not made for a run that never starts."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}}
    config = _config(tmp_path, data, max_epochs=1)
    for tracker in (
        {"class_path": "lightning.pytorch.loggers.MLFlowLogger"},
        tensorboard_tracker(tmp_path / "runs" / "tensorboard"),
    ):
        result = _run(
            "--config", str(config), "--model.optim.warmup_epochs", "5", "--tracker", json.dumps(tracker)
        )
        assert result.returncode == 2 and "is not shorter than the run" in result.stderr, result.stderr[
            -2000:
        ]
        assert not (tmp_path / "runs").exists(), sorted(p.name for p in (tmp_path / "runs").rglob("*"))


def test_train__a_refused_run_leaves_folders_it_did_not_make(tmp_path):
    data = {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}}
    config = _config(tmp_path, data, max_epochs=0)
    (tmp_path / "runs" / "test").mkdir(parents=True)
    assert _run("--config", str(config)).returncode == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["test"]
    assert not any((tmp_path / "runs" / "test").iterdir())
