"""Progressive resolution (``model.resolution_schedule``) through ``mae pretrain``: a schedule that cannot
train as written is refused at start-up, naming the key, the phase and what would be right; a run that
ends before its last phase says which sizes it trained at."""

import subprocess
from pathlib import Path

import pytest

from tests.helpers import TINY_MODEL, csv_logger, run_mae, write_config


def _pretrain(tmp_path: Path, recipe: str, *args: str) -> subprocess.CompletedProcess:
    """``mae pretrain --config <recipe>`` with its outputs under ``tmp_path`` and ``args``; a run that is
    not refused trains 2 steps per epoch (the default job's model on the digits)."""
    outputs = {
        "trainer": {
            "logger": csv_logger(tmp_path, "test"),
            "default_root_dir": str(tmp_path),
            "enable_progress_bar": False,
            "limit_train_batches": 2,
            "limit_val_batches": 1,
        },
        "knn": {"every_n_epochs": 0},
        "reconstruction": {"every_n_epochs": 0},
    }
    override = write_config(tmp_path, outputs, "outputs")
    return run_mae("pretrain", "--config", recipe, "--config", str(override), *args, check=False)


def _refused(result: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a run refused at start-up (exit status 2, no training step)."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "effective batch" not in result.stdout + result.stderr  # refused before the first step
    return errors[0]


@pytest.mark.parametrize(
    "schedule, strategy, phase, smallest",
    [
        # 4 px is a 1x1 grid of the default's 4-px patches: mask_ratio 0.75 keeps int(0.25) = 0 patches
        ("[[0, 4], [0.5, 32]]", "random", r"model.resolution_schedule[0] [0, 4]", "8"),
        # grid masking keeps one patch of every 2x2 cell: a 3x3 grid cannot be masked
        ("[[0, 12], [0.5, 32]]", "grid", r"model.resolution_schedule[0] [0, 12]", "8"),
        ("[[0, 16], [0.4, 20], [0.8, 32]]", "grid", r"model.resolution_schedule[1] [0.4, 20]", "8"),
    ],
)
def test_refused__a_phase_the_model_cannot_mask_names_the_phase_and_the_smallest_size(
    tmp_path, schedule, strategy, phase, smallest
):
    error = _refused(
        _pretrain(
            tmp_path,
            "default",
            "--model.resolution_schedule",
            schedule,
            "--model.mask_strategy",
            strategy,
            "--trainer.max_epochs",
            "2",
            "--model.optim.warmup_epochs",
            "0",
        )
    )
    assert phase in error
    assert f"the smallest phase size that trains at these settings is {smallest}" in error
    assert "multiple of patch_size 4" in error and "at most data.img_size 32" in error


def test_refused__a_phase_above_the_final_size(tmp_path):
    """Before, its epochs trained on the 32-px crops upsampled to 64 px (4x the tokens), without a word."""
    error = _refused(
        _pretrain(
            tmp_path,
            "default",
            "--model.resolution_schedule",
            "[[0, 64], [0.5, 32]]",
            "--trainer.max_epochs",
            "2",
            "--model.optim.warmup_epochs",
            "0",
        )
    )
    assert "model.resolution_schedule[0] [0, 64]" in error
    assert "above data.img_size 32x32" in error and "at most 32" in error


def test_refused__max_steps_that_end_the_run_before_a_phase_starts(tmp_path):
    """default_progressive (30 epochs, 32 px from epoch 24 on) at 2 steps per epoch: its 32-px phase
    starts at step 48, so a run of 4 steps would train only at 16 px yet checkpoint a 32-px model."""
    error = _refused(
        _pretrain(
            tmp_path, "default_progressive", "--trainer.max_steps", "4", "--model.optim.warmup_epochs", "0"
        )
    )
    assert "model.resolution_schedule[1] [0.8, 32]" in error
    assert "trainer.max_steps=4" in error and "step 48" in error
    assert "raise trainer.max_steps above 48" in error


@pytest.mark.parametrize(
    "recipe, schedule, epochs, phase, shared, smallest",
    [
        # the shipped recipe in a 1-epoch run: floor(0.8 x 1) = 0, so 16 px would never be trained
        ("default_progressive", None, "1", "[0] [0, 16]", "[0.8, 32] both start at epoch 1", "2"),
        # a middle phase: floor(0.5 x 2) = floor(0.6 x 2) = 1
        (
            "default",
            "[[0, 8], [0.5, 16], [0.6, 32]]",
            "2",
            "[1] [0.5, 16]",
            "[0.6, 32] both start at epoch 2",
            "5",
        ),
    ],
)
def test_refused__a_phase_that_rounds_to_zero_epochs_names_it_max_epochs_and_the_fix(
    tmp_path, recipe, schedule, epochs, phase, shared, smallest
):
    """Before, the phase was skipped without a word: the run trained only at the other sizes."""
    schedule_args = ("--model.resolution_schedule", schedule) if schedule else ()
    error = _refused(
        _pretrain(
            tmp_path,
            recipe,
            *schedule_args,
            "--trainer.max_epochs",
            epochs,
            "--model.optim.warmup_epochs",
            "0",
        )
    )
    assert (
        f"model.resolution_schedule{phase}: this phase gets 0 epochs of trainer.max_epochs={epochs}" in error
    )
    assert f"the next phase {shared}" in error, error
    assert f"Set trainer.max_epochs to at least {smallest}" in error and "or remove this phase" in error
    assert not (tmp_path / "runs").exists()


def test_stopped_before_the_last_phase__warns_and_the_summary_names_the_phases_run_then_resumes(tmp_path):
    """``trainer.max_time`` (1 ms: the run stops after its first step; a time limit is unknowable at
    start-up) ends a 4-epoch 8 -> 16 px run in its first phase; resuming it (from the end of epoch 1,
    Lightning's checkpoint of a stopped epoch) trains the rest, each epoch in its phase."""
    config = {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "resolution_schedule": [[0, 8], [0.5, 16]], "optim": {"warmup_epochs": 0}},
        "data": {
            "class_path": "mae.data.DigitsDataModule",
            "init_args": {"img_size": 16, "batch_size": 16, "num_workers": 0},
        },
        "trainer": {"max_epochs": 4, "accelerator": "cpu", "devices": 1, "log_every_n_steps": 1},
        "checkpoint": {"every_n_epochs": 1, "dirpath": str(tmp_path / "ckpts")},
    }
    recipe = str(write_config(tmp_path, config, "progressive"))
    stopped = _pretrain(tmp_path, recipe, "--trainer.max_time", '{"milliseconds": 1}')
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == 0, output[-3000:]
    assert "resolution phases run: 8x8 px (step 0)" in stopped.stdout
    assert "model.resolution_schedule: the run stopped at step 1 before its phase [0.5, 16]" in output
    assert "trained only at 8x8 px" in output

    resumed = _pretrain(tmp_path, recipe, "--ckpt_path", str(tmp_path / "ckpts" / "last.ckpt"))
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    assert "resolution phases run: 8x8 px (steps 1-2), 16x16 px (steps 3-6)" in resumed.stdout
    assert "the run stopped" not in output
