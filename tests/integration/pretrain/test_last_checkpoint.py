"""``last.ckpt`` holds the run's latest state (``mae.training.callbacks.last_checkpoint``): Lightning 2.6
rewrites it only where a top-k checkpoint is saved, so a monitored metric that stopped improving, or an
``every_n_epochs`` the run's length is not a multiple of, left an earlier epoch there."""

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
