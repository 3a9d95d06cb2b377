"""``mae pretrain`` of a CNN (issue 68, items 1, 5 and 6) through the real command and its shipped recipes
``default_spark`` and ``default_fcmae``, each cut to a few steps on the built-in digits: it trains (the
validation loss falls), its checkpoint names ``MaskedAutoencoderCNN``, the kNN monitor and a TensorBoard
tracker log, the reconstruction figure is drawn; a group SIGTERM saves and the same command resumes; a
planted NaN is captured and replayed; two DDP processes (gloo) train a ConvNeXt-V2 without waiting for
unused parameters."""

import os
import re
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    csv_logger,
    read_metrics,
    run_mae,
    run_slurm_tasks,
    start_mae,
    tensorboard_events,
    tensorboard_tracker,
    write_config,
)

pytestmark = pytest.mark.timeout(600)


def _override(tmp: Path, name: str, **sections) -> Path:
    """A config stacked after a CNN recipe: 2 epochs of 3 steps, 2 validation batches, every output under
    ``tmp`` (``tmp/runs/<name>``), no progress bar; ``sections`` over it."""
    trainer = {
        "max_epochs": 2,
        "limit_train_batches": 3,
        "limit_val_batches": 2,
        "log_every_n_steps": 1,
        "enable_progress_bar": False,
        "logger": csv_logger(tmp, name),
        **sections.pop("trainer", {}),
    }
    config = {"trainer": trainer, "knn": {"every_n_epochs": 0}, "reconstruction": {"every_n_epochs": 0}}
    return write_config(tmp, {**config, **sections}, name)


@pytest.fixture(scope="module")
def spark_run(tmp_path_factory) -> tuple[Path, str]:
    """(the run folder, the output) of ``mae pretrain --config default_spark`` for 6 steps, with the kNN
    monitor after each epoch, the reconstruction figure after the last and a TensorBoard tracker."""
    tmp = tmp_path_factory.mktemp("spark")
    override = _override(
        tmp,
        "spark",
        knn={"every_n_epochs": 1, "max_train": 64, "max_val": 32},
        reconstruction={"every_n_epochs": 2, "num_images": 4},
        tracker=tensorboard_tracker(tmp / "tb"),
    )
    result = run_mae("pretrain", "--config", "default_spark", "--config", str(override), timeout=400)
    return tmp / "runs" / "spark" / "version_0", result.stdout + result.stderr


def test_default_spark__trains_logs_knn_and_its_checkpoint_names_the_cnn(spark_run):
    run, output = spark_run
    rows = read_metrics(run)
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert len(val) == 2 and val[1] < val[0] < 1.05, val  # norm-pix loss starts near 1
    knn = [float(r["val/knn_acc1"]) for r in rows if r.get("val/knn_acc1")]
    assert len(knn) == 2 and all(10.0 <= acc <= 100.0 for acc in knn), knn  # 10 classes: chance is 10 %
    assert "kNN monitor: extracting features of 32 validation and 64 training images" in output
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    record = ckpt["mae_architecture"]
    assert record["class"] == "MaskedAutoencoderCNN" and record["args"]["encoder"] == "resnet10t"
    assert record["args"]["mask_unit"] == 8 and ckpt["global_step"] == 6
    assert any(k.startswith("model.encoder.layer4.") for k in ckpt["state_dict"])  # the timm model's keys
    assert sorted(p.name for p in (run / "reconstructions").iterdir()) == ["epoch_0002.png"]
    events = tensorboard_events(next((run.parents[2] / "tb").rglob("events.out.tfevents.*")).parent)
    assert "val/knn_acc1" in events.Tags()["scalars"] and "train/loss_step" in events.Tags()["scalars"]


def test_default_spark__group_sigterm_saves_and_the_same_command_resumes(tmp_path):
    pause = {"class_path": "tests.helpers.PauseAt", "init_args": {"moment": "step", "step": 2}}
    override = _override(tmp_path, "term", trainer={"callbacks": [pause]})
    command = ("--config", "default_spark", "--config", str(override), "--ckpt_path", "last")
    with start_mae("pretrain", *command, new_session=True) as proc:
        proc.wait_for_output("PAUSE step", timeout=300)
        os.killpg(proc.pid, signal.SIGTERM)
        out = "".join(proc.communicate(timeout=300))
    assert proc.returncode == 143 and "SIGTERM: saved" in out, out[-3000:]
    last = tmp_path / "runs" / "term" / "version_0" / "checkpoints" / "last.ckpt"
    assert (
        2 <= torch.load(last, map_location="cpu", weights_only=False)["global_step"] <= 3
    )  # that step's end
    resumed = run_mae("pretrain", *command, timeout=400)
    assert f"--ckpt_path last: resuming from {last}" in resumed.stdout + resumed.stderr
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 6


PLANTED = "model.encoder.conv1.1"  # resnet10t's first BatchNorm (a sparse one)


def test_default_spark__a_planted_nan_is_captured_and_replayed(tmp_path):
    plant = {
        "class_path": "tests.integration.pretrain.test_nonfinite_capture.PlantNaN",
        "init_args": {"step": 1, "module": PLANTED},
    }
    override = _override(tmp_path, "nan", trainer={"callbacks": [plant]})
    result = run_mae("pretrain", "--config", "default_spark", "--config", str(override), check=False)
    folder = tmp_path / "runs" / "nan" / "version_0" / "nonfinite" / "step_1"
    assert result.returncode == 2, result.stderr[-3000:]
    found = re.search(r"the first module whose output is non-finite is (\S+) \((\w+)\)", result.stderr)
    assert found and found.groups() == (PLANTED, "SparseBatchNorm2d"), result.stderr[-3000:]
    replay = run_mae("replay", str(folder), timeout=300)
    assert f"the first module whose output is non-finite is {PLANTED} (SparseBatchNorm2d)" in replay.stdout


@pytest.mark.ddp
def test_default_fcmae__two_ddp_processes_train_without_waiting_for_unused_parameters(tmp_path):
    """ConvNeXt-V2's head norm is never used by the maps: frozen, so DDP's reducer waits for nothing."""
    override = _override(
        tmp_path,
        "ddp",
        trainer={"max_epochs": 1, "limit_train_batches": 2, "precision": "32-true", "devices": 2},
        data={"init_args": {"batch_size": 8}},
        model={"optim": {"warmup_epochs": 0}},
        checkpoint={"dirpath": str(tmp_path / "ckpts"), "monitor": None, "save_top_k": -1},
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ("--config", "default_fcmae", "--config", str(override), "--trainer.strategy", "ddp")
    _, output = run_slurm_tasks("pretrain", *args, tasks=2, env=env, timeout=400)
    ckpt = torch.load(tmp_path / "ckpts" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 2 and ckpt["mae_architecture"]["args"]["encoder"] == "convnextv2_atto"
    assert "effective batch 16 = 8 per device x 2 device(s)" in output


REFUSED = {
    "sync_batchnorm": (
        ["--trainer.strategy", "ddp", "--trainer.sync_batchnorm", "true"],
        "error: trainer.sync_batchnorm: true would replace the CNN resnet10t's sparse BatchNorms",
    ),
    "fsdp2": (
        ["--config", "strategy/fsdp"],
        "error: trainer.strategy FSDP2Strategy (FSDP2) shards a ViT's blocks; a CNN model (resnet10t) trains "
        "under trainer.strategy: ddp",
    ),
    "compile": (
        ["--model.kernels.compile", "true"],
        "error: model.kernels.compile: true cannot compile the CNN model (resnet10t)",
    ),
    "probe_cls": (
        ["--probe.every_n_epochs", "1"],
        "error: probe.pool cls: a CNN's features are maps, with no cls token; set probe.pool: avg",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=REFUSED)
def test_default_spark__what_a_cnn_cannot_train_under_is_refused_before_the_first_step(case, tmp_path):
    flags, said = REFUSED[case]
    probe = {"probe": {"pool": "cls"}} if case == "probe_cls" else {}  # the default pool a ViT run takes
    override = _override(tmp_path, case, **probe)
    args = ("--config", "default_spark", "--config", str(override), *flags)
    result = run_mae("pretrain", *args, check=False, timeout=300)
    assert result.returncode == 2 and said in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "runs" / case / "version_0" / "checkpoints").exists()
