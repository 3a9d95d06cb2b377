"""``--model.grad_checkpointing true`` through ``mae pretrain`` and ``mae finetune``: the run trains, records
the setting, and every transformer block runs twice per training step (its forward, then its recomputation
in the backward pass), as ``BlockRuns`` counts in the command's own process."""

import json
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import yaml

from tests.helpers import TINY_KWARGS, TINY_MODEL, csv_logger, folder_data, run_mae, write_image_folder

BLOCK_NAME = re.compile(r"(^|\.)(decoder_)?blocks\.\d+$")


class BlockRuns(pl.Callback):
    """Prints ``BLOCK RUNS [...]`` after each training step: how many times each transformer block (a module
    ``blocks.<i>`` or ``decoder_blocks.<i>``) was called in it, counted by forward pre-hooks, which also
    fire when a checkpointed block is recomputed in the backward pass."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name, module in pl_module.named_modules():
            if BLOCK_NAME.search(name):
                self.runs[name] = 0
                module.register_forward_pre_hook(lambda *_, name=name: self._count(name))

    def _count(self, name: str) -> None:
        self.runs[name] += 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.runs = dict.fromkeys(self.runs, 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        print(f"BLOCK RUNS {json.dumps(sorted(self.runs.items()))}", flush=True)


def _config(tmp: Path, model: dict, name: str) -> dict:
    return {
        "seed_everything": 0,
        "model": {**model, "optim": {"warmup_epochs": 0}},
        "data": folder_data(tmp / "data"),
        "trainer": {
            "max_steps": 2,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "limit_val_batches": 1,
            "num_sanity_val_steps": 0,
            "logger": csv_logger(tmp, name),
            "callbacks": [{"class_path": f"{__name__}.BlockRuns"}],
        },
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("grad_checkpointing")
    write_image_folder(tmp / "data" / "train", ["a", "b"], per_class=4, size=(20, 20))
    write_image_folder(tmp / "data" / "val", ["a", "b"], per_class=2, size=(20, 20), seed=1)
    return tmp


def _steps_block_runs(output: str) -> list[dict[str, int]]:
    return [dict(json.loads(line)) for line in re.findall(r"^BLOCK RUNS (.+)$", output, re.MULTILINE)]


@pytest.mark.parametrize(
    "command, model, blocks",
    [
        ("pretrain", {**TINY_MODEL, "decoder_type": "cross"}, {"model.blocks.0", "model.decoder_blocks.0"}),
        (
            "finetune",
            {"encoder": {"model": "mae_vit_tiny_patch4", "model_kwargs": TINY_KWARGS}},
            {"vit.blocks.0"},
        ),
    ],
)
def test_grad_checkpointing__trains_with_every_block_recomputed_and_is_recorded(data, command, model, blocks):
    tmp = data / command
    tmp.mkdir()
    config = _config(data, model, command)
    result = run_mae(command, "--model.grad_checkpointing", "true", config=config, tmp=tmp, timeout=300)
    steps = _steps_block_runs(result.stdout)
    assert len(steps) == 2, result.stdout[-2000:] + result.stderr[-2000:]
    for runs in steps:
        assert runs == dict.fromkeys(blocks, 2)  # the forward, and its recomputation in the backward pass
    hparams = data / "runs" / command / "version_0" / "hparams.yaml"
    assert yaml.safe_load(hparams.read_text())["grad_checkpointing"] is True
