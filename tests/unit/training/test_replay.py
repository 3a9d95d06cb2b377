"""The replay engine (``mae.training.replay``) on a two-layer module, without a trainer: the first module
whose output is non-finite is named, a finite forward with non-finite gradients names the parameters, a
capture folder written by hand is read back and replayed, and a folder that is not one is refused by name."""

import json
import shutil
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.plugins import Precision
from torch import nn

from mae.compat.lightning import rng_states
from mae.errors import InputError, MissingFileError
from mae.training.pretrain import MAEPretrainModule
from mae.training.replay import (
    FILES,
    Finding,
    check_hyperparameters,
    read_capture,
    rebuild_module,
    replay_capture,
    replay_step,
)
from tests.helpers import TINY_KWARGS, CreatesFolder


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


TWO_LAYERS = {f"{__name__}.TwoLayers": TwoLayers}  # the table of modules a capture of it may name


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
    finding, record = replay_capture(tmp_path / "step_3", TWO_LAYERS)
    assert finding.module == "net.1" and record["step"] == 3
    # a non-finite gradient: replayed with its backward
    _capture_folder(tmp_path / "step_4", TwoLayers(root=True), reason="gradient")
    assert "net.0.weight" in replay_capture(tmp_path / "step_4", TWO_LAYERS)[0].parameters


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


def _pretrain_capture(folder: Path) -> Path:
    """A capture folder of a tiny ``MAEPretrainModule`` step with a NaN planted in the last block's
    ``mlp.fc2`` bias, as the capture callback writes one (``mae.training.pretrain.MAEPretrainModule``: a
    module ``mae replay`` replays)."""
    module = MAEPretrainModule(
        model="mae_vit_tiny_patch4", img_size=16, model_kwargs=TINY_KWARGS, optim=dict(warmup_epochs=0)
    )
    with torch.no_grad():
        module.model.blocks[-1].mlp.fc2.bias[0] = float("nan")
    folder.mkdir(parents=True)
    torch.save((torch.rand(2, 3, 16, 16), torch.zeros(2, dtype=torch.long)), folder / "batch.pt")
    torch.save(rng_states(include_cuda=False), folder / "rng.pt")
    state = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    torch.save({**state, "pytorch-lightning_version": pl.__version__}, folder / "state.ckpt")
    record = {
        "module_class": "mae.training.pretrain.MAEPretrainModule",
        "step": 3,
        "epoch": 0,
        "batch_idx": 0,
        "reason": "loss",
        "precision": "32-true",
        "device": "cpu",
    }
    (folder / "step.json").write_text(json.dumps(record))
    return folder


def _replay(folder: Path):
    from tests.helpers import run_mae

    return run_mae("replay", str(folder), check=False)


def _error(result) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def pretrain_capture(tmp_path_factory) -> Path:
    return _pretrain_capture(tmp_path_factory.mktemp("capture") / "step_3")


def _copy(capture: Path, folder: Path) -> Path:
    shutil.copytree(capture, folder)
    return folder


def test_mae_replay__a_capture_of_a_training_module_replays(pretrain_capture):
    result = _replay(pretrain_capture)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the first module whose output is non-finite is model.blocks.0.mlp.fc2" in result.stdout


@pytest.mark.parametrize("norm_pix_loss, target", [(True, "norm_pix"), (False, "pixel")])
def test_rebuild_module__a_capture_written_before_the_target_rename_keeps_its_target(
    pretrain_capture, tmp_path, norm_pix_loss, target
):
    """A capture of 0.4.0 records ``norm_pix_loss`` where the module now takes ``target``: rebuilt under the
    new name (Lightning alone drops the old key, and false would come back as the default, norm_pix)."""
    folder = _copy(pretrain_capture, tmp_path / "step_3")
    state = torch.load(folder / "state.ckpt", weights_only=True)
    assert state["hyper_parameters"].pop("target") == "norm_pix"
    state["hyper_parameters"]["norm_pix_loss"] = norm_pix_loss
    torch.save(state, folder / "state.ckpt")
    module = rebuild_module(MAEPretrainModule, folder / "state.ckpt", state, "cpu")
    assert module.model.target.name == target
    result = _replay(folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the first module whose output is non-finite is model.blocks.0.mlp.fc2" in result.stdout


@pytest.mark.parametrize("name", ["batch.pt", "rng.pt", "state.ckpt"])
def test_mae_replay__a_file_that_would_run_code_is_refused_by_name_and_nothing_runs(
    pretrain_capture, tmp_path, name
):
    folder = _copy(pretrain_capture, tmp_path / "step_3")
    target = tmp_path / "created_by_the_capture"
    if name == "state.ckpt":  # the payload beside real weights, where Lightning would unpickle it
        state = torch.load(folder / name, weights_only=True)
        torch.save({**state, "payload": CreatesFolder(target)}, folder / name)
    else:
        torch.save(CreatesFolder(target), folder / name)
    assert _error(_replay(folder)) == (
        f"error: {folder / name} would run code when loaded: it names posix.mkdir. Only tensors, plain "
        "containers and argparse.Namespace are read from checkpoints; a capture holds only those: replay a "
        "capture folder a run wrote."
    )
    assert not target.exists()


def test_mae_replay__a_module_class_outside_the_table_is_refused_and_not_imported(pretrain_capture, tmp_path):
    folder = _copy(pretrain_capture, tmp_path / "step_3")
    record = json.loads((folder / "step.json").read_text())
    record["module_class"] = "this.s"  # importing the module `this` prints the Zen of Python
    (folder / "step.json").write_text(json.dumps(record))
    result = _replay(folder)
    assert _error(result) == (
        f"error: {folder / 'step.json'}: module_class 'this.s' is not one of the training modules a run "
        "captures (mae.dense.tasks.detection.MAEDetectionModule, "
        "mae.dense.tasks.segmentation.MAESegmentationModule, mae.training.distill.MAEDistillModule, "
        "mae.training.finetune.MAEFinetuneModule, mae.training.pretrain.MAEPretrainModule); a capture folder "
        "names the module of the run that wrote it"
    )
    assert "Beautiful is better than ugly" not in result.stdout + result.stderr


def test_mae_replay__hyperparameters_that_would_build_an_object_are_refused_and_nothing_is_built(
    pretrain_capture, tmp_path
):
    folder = _copy(pretrain_capture, tmp_path / "step_3")
    target = tmp_path / "created_by_the_hyperparameters.log"
    state = torch.load(folder / "state.ckpt", weights_only=True)
    # model_kwargs takes any value: Lightning's instantiator would build the class a class_path names there
    planted = {"class_path": "logging.FileHandler", "init_args": {"filename": str(target)}}
    state["hyper_parameters"]["model_kwargs"]["handler"] = planted
    state["hyper_parameters"]["_instantiator"] = "lightning.pytorch.cli.instantiate_module"
    torch.save(state, folder / "state.ckpt")
    assert _error(_replay(folder)) == (
        f"error: {folder / 'state.ckpt'} would run code when the module is rebuilt: "
        "hyper_parameters.model_kwargs.handler.class_path names 'logging.FileHandler'; a capture's "
        "hyperparameters hold only the module's own settings"
    )
    assert not target.exists()


@pytest.mark.parametrize("name", ["state.ckpt", "batch.pt"])
def test_mae_replay__a_file_cut_short_is_named_as_damaged(pretrain_capture, tmp_path, name):
    folder = _copy(pretrain_capture, tmp_path / "step_3")
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])
    error = _error(_replay(folder))
    assert error.startswith(f"error: could not read checkpoint {folder / name}: truncated or corrupt ("), (
        error
    )


def test_replay_capture__an_untrusted_instantiator_is_refused(tmp_path):
    folder = tmp_path / "step_3"
    module = TwoLayers()
    _capture_folder(folder, module)
    state = torch.load(folder / "state.ckpt", weights_only=True)
    state["hyper_parameters"]["_instantiator"] = "os.system"
    torch.save(state, folder / "state.ckpt")
    with pytest.raises(InputError, match=r"hyper_parameters\._instantiator names 'os\.system'"):
        replay_capture(folder, TWO_LAYERS)


def test_replay_capture__a_class_path_in_a_list_of_the_hyperparameters_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"hyper_parameters\.schedule\.1\._class_path names 'x\.Y'"):
        check_hyperparameters(tmp_path / "state.ckpt", {"schedule": [{"a": 1}, {"_class_path": "x.Y"}]})
    check_hyperparameters(tmp_path / "state.ckpt", {"optim": {"betas": [0.9, 0.95]}, "model": "m"})
