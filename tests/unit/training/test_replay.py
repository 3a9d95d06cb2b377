"""The replay engine (``mae.training.replay``) on a two-layer module, without a trainer: the first module
whose output is non-finite is named, a finite forward with non-finite gradients names the parameters, a
capture folder written by hand is read back and replayed, and a folder that is not one is refused by name."""

import json

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins import Precision
from torch import nn

from mae.compat.lightning import rng_states
from mae.errors import InputError, MissingFileError
from mae.training.replay import FILES, Finding, read_capture, replay_capture, replay_step


class TwoLayers(pl.LightningModule):
    """``net`` = Linear(4, 4) -> Linear(4, 1); the loss is the mean output, or its square root of zero
    (``root``: finite, with a NaN gradient)."""

    replaying = False

    def __init__(self, root: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        out = self.net(batch).mean()
        return (out * 0).sqrt() if self.hparams.root else out


def _plant_nan(module: TwoLayers) -> None:
    with torch.no_grad():
        module.net[1].bias[0] = float("nan")


def test_replay_step__names_the_first_module_whose_output_is_non_finite():
    module = TwoLayers()
    _plant_nan(module)
    finding = replay_step(module, torch.ones(2, 4), 0, rng_states(include_cuda=False), Precision(), False)
    assert finding == Finding(module="net.1", kind="Linear", loss=True) and not module.replaying
    assert finding.describe() == "the first module whose output is non-finite is net.1 (Linear)"


def test_replay_step__a_finite_forward_with_non_finite_gradients_names_the_parameters():
    module = TwoLayers(root=True)
    batch = torch.ones(2, 4)
    forward = replay_step(module, batch, 0, rng_states(include_cuda=False), Precision(), False)
    assert forward == Finding()  # without the backward: nothing found
    assert forward.describe().startswith("the replayed step is finite")
    finding = replay_step(module, batch, 0, rng_states(include_cuda=False), Precision(), True)
    assert finding.module is None and "net.1.bias" in finding.parameters
    assert finding.describe().startswith("every module's output is finite; ")


@pytest.mark.parametrize(
    "finding, words",
    [
        (Finding(loss=True), "the loss computed from them in training_step is not"),
        (Finding(located=False, loss=True), "not located where it happened: under FSDP2"),
        (Finding(parameters=("a", "b", "c", "d")), "4 parameter gradient(s) are not (a, b, c, ...)"),
    ],
)
def test_finding__describes_what_was_found(finding, words):
    assert words in finding.describe()
    assert json.loads(json.dumps(finding.as_dict()))["located"] == finding.located


def _capture_folder(folder, module: TwoLayers, reason: str = "loss") -> None:
    """A capture folder as the capture callback writes one, of ``module``'s step on a batch of ones."""
    folder.mkdir()
    torch.save(torch.ones(2, 4), folder / "batch.pt")
    torch.save(rng_states(include_cuda=False), folder / "rng.pt")
    state = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    torch.save({**state, "pytorch-lightning_version": pl.__version__}, folder / "state.ckpt")
    record = {
        "module_class": f"{__name__}.TwoLayers",
        "step": 3,
        "batch_idx": 0,
        "reason": reason,
        "precision": "32-true",
        "device": "cpu",
    }
    (folder / "step.json").write_text(json.dumps(record))


def test_replay_capture__loads_the_folder_and_names_the_module(tmp_path):
    module = TwoLayers()
    _plant_nan(module)
    _capture_folder(tmp_path / "step_3", module)
    finding, record = replay_capture(tmp_path / "step_3")
    assert finding.module == "net.1" and record["step"] == 3
    # a non-finite gradient: replayed with its backward
    _capture_folder(tmp_path / "step_4", TwoLayers(root=True), reason="gradient")
    assert "net.0.weight" in replay_capture(tmp_path / "step_4")[0].parameters


def test_read_capture__a_folder_that_is_not_a_capture_is_refused_by_name(tmp_path):
    with pytest.raises(MissingFileError, match=r"step_9 is not a folder: give a capture folder"):
        read_capture(tmp_path / "step_9")
    folder = tmp_path / "step_1"
    folder.mkdir()
    (folder / "step.json").write_text("{not json")
    with pytest.raises(MissingFileError, match=r"batch.pt, rng.pt, state.ckpt missing"):
        read_capture(folder)
    for name in FILES[:-1]:
        (folder / name).write_bytes(b"")
    with pytest.raises(InputError, match=r"step.json is not a capture's record"):
        read_capture(folder)
    (folder / "step.json").write_text('{"step": 1}')
    with pytest.raises(InputError, match=r"it needs the keys batch_idx, module_class, precision"):
        read_capture(folder)
