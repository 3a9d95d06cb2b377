"""The training commands' config keys (``mae.cli.lightning``): the settings groups read as nested keys
from YAML and the command line, and each key renamed in 0.3.0 refused before any work, naming its new key."""

import re

import pytest
import yaml

from mae.cli.lightning import class_path_sources
from mae.cli.main import invoke, main
from mae.errors import ConfigError
from mae.training.settings import RENAMED_IN, renamed_for

COMMANDS = ("pretrain", "finetune", "detect", "segment")


def _module(command: str) -> type:
    from mae.dense.tasks.detection import MAEDetectionModule
    from mae.dense.tasks.segmentation import MAESegmentationModule
    from mae.training.finetune import MAEFinetuneModule
    from mae.training.pretrain import MAEPretrainModule

    modules = (MAEPretrainModule, MAEFinetuneModule, MAEDetectionModule, MAESegmentationModule)
    return dict(zip(COMMANDS, modules, strict=True))[command]


def _printed(capsys, command: str, *args: str) -> dict:
    with pytest.raises(SystemExit) as stop:
        invoke(command, ["--config", "default", *args, "--print_config"])
    assert stop.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)["model"]


@pytest.mark.parametrize("command", COMMANDS)
def test_nested_keys__from_the_command_line_and_a_stacked_yaml_over_the_recipe(
    command, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("sys.argv", ["mae"])
    recipe = _printed(capsys, command)
    assert set(recipe["optim"]) >= {"base_lr", "lr", "min_lr", "warmup_epochs", "weight_decay"}
    assert set(recipe["kernels"]) == {"attention", "compile", "fused_adamw"}
    if command != "pretrain":
        assert set(recipe["encoder"]) == {"checkpoint", "checkpoint_format", "model", "model_kwargs"}
    flags = _printed(capsys, command, "--model.optim.base_lr", "0.123", "--model.kernels.attention=explicit")
    assert flags["optim"] == {**recipe["optim"], "base_lr": 0.123}
    assert flags["kernels"] == {**recipe["kernels"], "attention": "explicit"}
    (tmp_path / "top.yaml").write_text(
        "model:\n  optim:\n    warmup_epochs: 7\n  kernels:\n    compile: true\n"
    )
    stacked = _printed(capsys, command, "--config", str(tmp_path / "top.yaml"))
    assert stacked["optim"] == {**recipe["optim"], "warmup_epochs": 7}  # the other fields: the recipe's
    assert stacked["kernels"] == {**recipe["kernels"], "compile": True}


CASES = [(command, old) for command in COMMANDS for old in renamed_for(_module(command))]
# The renamed keys whose values changed too, as the refusal spells them out (``RENAMED_VALUES``).
VALUES_SAID = {
    "model.norm_pix_loss": " (norm_pix_loss true is target norm_pix, norm_pix_loss false is target pixel)"
}


@pytest.mark.parametrize("command, old", CASES, ids=[f"{c}-{o}" for c, o in CASES])
def test_renamed_key__on_the_command_line_is_refused_naming_the_new_one(command, old, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["mae"])
    new, release = renamed_for(_module(command))[old], RENAMED_IN[old]
    said = re.escape(VALUES_SAID.get(old, ""))
    with pytest.raises(
        ConfigError, match=f"^{old} was moved to {new} in {release}: set {new} instead{said}$"
    ):
        invoke(command, ["--config", "default", f"--{old}", "1"])
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_renamed_key__in_a_config_file_is_refused_naming_the_new_one(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["mae"])
    for old, new in renamed_for(_module(command)).items():
        (tmp_path / "old.yaml").write_text(f"model:\n  {old.removeprefix('model.')}: 1\n")
        with pytest.raises(ConfigError, match=f"^{old} was moved to {new} in {RENAMED_IN[old]}"):
            invoke(command, ["--config", "default", "--config", "old.yaml"])


def test_renamed_key__the_mae_command_prints_one_error_line_and_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["mae"])
    with pytest.raises(SystemExit) as stop:
        main(["finetune", "--config", "default", "--model.checkpoint", "x.ckpt"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and "Traceback" not in "\n".join(err)
    new = "model.encoder.checkpoint"
    assert err[-1] == f"error: model.checkpoint was moved to {new} in 0.3.0: set {new} instead"


def test_pretraining_keeps_model_and_model_kwargs(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["mae"])
    printed = _printed(capsys, "pretrain", "--model.model", "mae_vit_small_patch16")
    assert printed["model"] == "mae_vit_small_patch16" and "encoder" not in printed


def test_class_path_sources__config_files_yaml_files_inline_yaml_and_plain_values(tmp_path):
    config, callbacks = tmp_path / "run.yaml", tmp_path / "callbacks.yaml"
    config.write_text("data:\n  class_path: mae.data.DigitsDataModule\n")
    callbacks.write_text("- class_path: mae.dense.figures.PredictionFigures\n")
    argv = [
        "--config",
        str(config),
        f"--trainer.callbacks={callbacks}",
        "--data",
        "{class_path: mae.dense.scene_images.DigitSceneImagesDataModule}",
        "--trainer.max_epochs",
        "3",
        "--find_batch_size",
        "--data.class_path=[unclosed",
    ]
    assert class_path_sources(argv) == [
        (f"--config {config}", {"data": {"class_path": "mae.data.DigitsDataModule"}}),
        (f"--trainer.callbacks {callbacks}", [{"class_path": "mae.dense.figures.PredictionFigures"}]),
        ("--data", {"class_path": "mae.dense.scene_images.DigitSceneImagesDataModule"}),
        ("--trainer.max_epochs", "3"),
        ("--data.class_path", None),  # not YAML: jsonargparse says what is wrong with it
    ]
