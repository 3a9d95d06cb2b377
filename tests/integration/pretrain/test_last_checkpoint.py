"""``last.ckpt`` holds the run's latest state (``mae.training.callbacks.last_checkpoint``): Lightning 2.6
rewrites it only where a top-k checkpoint is saved, so a monitored metric that stopped improving, or an
``every_n_epochs`` the run's length is not a multiple of, left an earlier epoch there. Where it cannot be
written (a folder of the user's in its place, a checkpoint folder below a file) the run stops before any
work, not after an epoch. A ``last.ckpt`` that a process killed while replacing it left moved aside is put
back and resumed from, never deleted as a leftover."""

import subprocess

import pytest
import torch

from tests.helpers import TINY_MODEL, csv_logger, run_mae


def _config(tmp, checkpoint: dict) -> dict:
    """3 epochs of 2 steps on the built-in digits, with ``checkpoint`` settings."""
    return {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}},
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}},
        "trainer": {
            "max_epochs": 3,
            "limit_train_batches": 2,
            "limit_val_batches": 1,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": csv_logger(tmp, "last"),
        },
        "checkpoint": checkpoint,
        "reconstruction": {"every_n_epochs": 0},
    }


@pytest.mark.parametrize(
    "checkpoint",
    [
        # the loss falls, so with mode max only the first epoch is ever the best
        pytest.param(
            {"monitor": "val/loss", "mode": "max", "save_top_k": 1, "every_n_epochs": 1}, id="no-gain"
        ),
        pytest.param({"every_n_epochs": 2}, id="period-not-dividing-the-run"),
    ],
)
def test_last_ckpt__is_the_state_after_the_runs_last_step(tmp_path, checkpoint):
    result = run_mae("pretrain", config=_config(tmp_path, checkpoint), tmp=tmp_path)
    last = tmp_path / "runs" / "last" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert (saved["epoch"], saved["global_step"]) == (2, 6), result.stdout[-2000:]
    assert f"last checkpoint:  {last}" in result.stdout


def _refused(tmp, checkpoint: dict) -> str:
    """The error line of ``mae pretrain`` with ``checkpoint`` settings, after checking that it stopped as a
    user's mistake does, before any work: no run folder."""
    result = run_mae("pretrain", config=_config(tmp, checkpoint), tmp=tmp, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not (tmp / "runs").exists()
    return result.stderr.strip().splitlines()[-1]


def test_last_ckpt__a_folder_of_the_users_there_is_refused_before_any_work(tmp_path):
    last = tmp_path / "ckpts" / "last.ckpt"
    last.mkdir(parents=True)
    (last / "notes.txt").write_text("mine")
    line = _refused(tmp_path, {"dirpath": str(tmp_path / "ckpts")})
    said = f"error: cannot write the checkpoint {last}: a folder that is not a checkpoint is there"
    assert line.startswith(said), line
    assert [p.name for p in last.iterdir()] == ["notes.txt"]


def test_last_ckpt__a_checkpoint_folder_that_cannot_be_made_is_refused_before_any_work(tmp_path):
    (tmp_path / "taken").write_text("a file")
    dirpath = tmp_path / "taken" / "ckpts"
    line = _refused(tmp_path, {"dirpath": str(dirpath)})
    assert line == (
        f"error: checkpoint.dirpath {dirpath}: {tmp_path / 'taken'} is not a folder, so nothing can be "
        "written below it"
    ), line


def test_last_ckpt__moved_aside_by_a_killed_save_is_put_back_and_resumed(tmp_path):
    """A kill between ``replace_folder``'s two renames (a sharded last.ckpt replaced by a one-process save)
    leaves no last.ckpt and the previous one beside it as ``.last.ckpt.old.tmp-<pid>``: ``--ckpt_path
    last`` puts it back and resumes from it, where it used to start over and delete it as a leftover."""
    config = _config(tmp_path, {"dirpath": str(tmp_path / "ckpts")})
    config["trainer"]["max_epochs"] = 1
    run_mae("pretrain", config=config, tmp=tmp_path)
    last = tmp_path / "ckpts" / "last.ckpt"
    dead = subprocess.Popen(["true"])  # its pid: a process no longer running
    dead.wait()
    aside = last.with_name(f".last.ckpt.old.tmp-{dead.pid}")
    last.rename(aside)
    config["trainer"]["max_epochs"] = 2
    result = run_mae("pretrain", "--ckpt_path", "last", config=config, tmp=tmp_path)
    assert f"restored {last} from {aside}" in result.stdout + result.stderr
    assert f"--ckpt_path last: resuming from {last}" in result.stdout + result.stderr
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 4 and not aside.exists()
