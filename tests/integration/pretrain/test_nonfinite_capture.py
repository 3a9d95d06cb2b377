"""A planted NaN through ``mae pretrain``: the error names the block it was planted in and the capture folder,
which holds the batch, the random states, the state before the step and the config; ``mae replay`` of that
folder names the same block."""

import json

import lightning.pytorch as pl
import torch

from tests.helpers import run_mae
from tests.integration.pretrain.test_run_health import health_config

PLANTED = "model.blocks.1.mlp.fc2"


class PlantNaN(pl.Callback):
    """Before step ``step``, one NaN in the bias of the module named ``module`` (as a bad update would)."""

    def __init__(self, step: int, module: str) -> None:
        self.step, self.module = step, module

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.get_submodule(self.module).bias[0] = float("nan")


def test_nonfinite__a_planted_nan_names_its_block_keeps_the_step_and_replays(tmp_path):
    plant = {"class_path": f"{__name__}.PlantNaN", "init_args": {"step": 2, "module": PLANTED}}
    config = health_config(tmp_path, 4, [plant])
    result = run_mae("pretrain", config=config, tmp=tmp_path, check=False)
    run = tmp_path / "runs" / "health" / "version_0"
    folder = run / "nonfinite" / "step_2"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(
        "error: non-finite training loss (nan) at step 2 (epoch 0): the first module whose output is "
        f"non-finite is {PLANTED} (Linear); stopped before the update"
    ), errors[0]
    assert f"The step is kept in {folder}; replay it with: mae replay {folder}." in errors[0]

    assert sorted(p.name for p in folder.iterdir()) == [
        "batch.pt",
        "config.yaml",
        "rng.pt",
        "state.ckpt",
        "step.json",
    ]
    assert (folder / "config.yaml").read_text() == (run / "config.yaml").read_text()
    images, _ = torch.load(folder / "batch.pt", weights_only=True)
    assert images.shape == (8, 3, 16, 16) and torch.isfinite(images).all()
    state = torch.load(folder / "state.ckpt", weights_only=False)
    assert state["global_step"] == 2 and len(state["optimizer_states"]) == 1
    assert state["optimizer_states"][0]["state"]  # two steps of AdamW moments: the state before step 2
    assert state["state_dict"][f"{PLANTED}.bias"][0].isnan()
    record = json.loads((folder / "step.json").read_text())
    assert record["found"]["module"] == PLANTED and record["reason"] == "loss"

    replay = run_mae("replay", str(folder))
    assert f"the first module whose output is non-finite is {PLANTED} (Linear)" in replay.stdout

    # The replay runs the kept weights: with the planted value put right it finds nothing non-finite.
    state["state_dict"][f"{PLANTED}.bias"][0] = 0.0
    torch.save(state, folder / "state.ckpt")
    assert "the replayed step is finite" in run_mae("replay", str(folder)).stdout


def test_replay__a_folder_that_is_not_a_capture_is_named(tmp_path):
    (tmp_path / "step_3").mkdir()
    (tmp_path / "step_3" / "step.json").write_text("{}")
    result = run_mae("replay", str(tmp_path / "step_3"), check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {tmp_path / 'step_3'} is not a complete capture folder: batch.pt, rng.pt, state.ckpt "
        "missing (a capture holds batch.pt, rng.pt, state.ckpt, step.json)"
    )
