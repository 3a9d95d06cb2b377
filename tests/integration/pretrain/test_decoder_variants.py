"""A decoder variant through the real commands: train.py (a subprocess), its resume, a resume with
another variant refused at start-up, reconstruction and export; low-resolution pretraining probed and
fine-tuned at the full size; the shipped decoder-switch recipes."""

from functools import partial

import pytest
import torch
import yaml
from PIL import Image

from mae.cli.command import USAGE_ERROR_EXIT_CODE, run_command
from mae.cli.lightning import PretrainCLI
from mae.cli.main import invoke
from mae.convert.architecture import ARCHITECTURE_KEY
from mae.data import ImageDataModule
from mae.training.pretrain import MAEPretrainModule
from tests.helpers import (
    REPO,
    TINY_MODEL,
    TWO_BLOCK_KWARGS,
    csv_logger,
    folder_data,
    read_metrics,
    tiny_pretraining_run,
    write_config,
)

SWITCHES = {"decoder_type": "cross", "decoder_keep_ratio": 0.5, "decoder_encoder_layers": [0, 1]}


@pytest.fixture(scope="module")
def variant_run(tmp_path_factory):
    """train.py, as a subprocess, for 1 epoch of the cross decoder with partial reconstruction at 16x16."""
    tmp = tmp_path_factory.mktemp("variant")
    path, run = tiny_pretraining_run(
        tmp,
        "variant",
        model={**TINY_MODEL, "model_kwargs": TWO_BLOCK_KWARGS, "optim": {"warmup_epochs": 0}, **SWITCHES},
        checkpoint={"every_n_epochs": 1},
        reconstruction={"every_n_epochs": 1, "num_images": 2},
    )
    return tmp, path, run


def test_variant__trains_resumes_and_refuses_a_resume_as_another_variant(variant_run, capsys, monkeypatch):
    tmp, config, run = variant_run
    last = run / "checkpoints" / "last.ckpt"
    first = torch.load(last, map_location="cpu", weights_only=True)
    assert first["global_step"] == 3 and {k: first[ARCHITECTURE_KEY]["args"][k] for k in SWITCHES} == SWITCHES
    assert (run / "reconstructions" / "epoch_0001.png").exists()

    invoke("pretrain", ["--config", str(config), "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    resumed = torch.load(last, map_location="cpu", weights_only=True)
    assert resumed["global_step"] == 6 and resumed["epoch"] == 1 and not (run.parent / "version_1").exists()
    steps = {int(r["step"]) for r in read_metrics(run) if r.get("train/loss_step")}
    assert steps == set(range(6))  # both runs' training steps, none twice

    monkeypatch.delenv("MAE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stop:
        other = ["--model.decoder_type", "self", "--model.decoder_encoder_layers", "null"]
        run_command(partial(invoke, "pretrain", ["--config", str(config), *other, "--ckpt_path", str(last)]))
    assert stop.value.code == USAGE_ERROR_EXIT_CODE
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        "model.decoder_type is 'cross' in the checkpoint but 'self' here (allowed: 'self' or 'cross')"
        in message
    )
    assert "model.decoder_encoder_layers is [0, 1] in the checkpoint but None here" in message


def test_variant__reconstructs_and_exports_through_the_commands(variant_run, tmp_path):
    _, _, run = variant_run
    last = run / "checkpoints" / "last.ckpt"
    Image.new("RGB", (20, 20), (200, 30, 30)).save(tmp_path / "red.png")
    figure = invoke(
        "reconstruct",
        ["--checkpoint", str(last), str(tmp_path / "red.png"), "--out", str(tmp_path / "r.png")],
    )
    assert len(figure.losses) == 1 and (tmp_path / "r.png").stat().st_size > 0
    invoke("export", ["--checkpoint", str(last), "--out", str(tmp_path / "encoder.safetensors")])
    exported = yaml.safe_load((tmp_path / "encoder.json").read_text())  # JSON is YAML
    assert exported["model_args"]["depth"] == 2 and exported["mae"]["decoder_type"] == "cross"


def test_low_resolution_pretraining__probed_and_fine_tuned_at_the_full_size(variant_run, capsys):
    tmp, _, run = variant_run
    last = run / "checkpoints" / "last.ckpt"  # pretrained at 16x16
    data = [
        "--data.class_path",
        "mae.data.ImageFolderDataModule",
        "--data.root",
        str(tmp / "data"),
        "--data.img_size",
        "32",
        "--data.num_workers",
        "0",
        "--data.batch_size",
        "8",
    ]
    result = invoke("probe", ["--checkpoint", str(last), *data, "--max-epochs", "3"])
    assert 0 <= result.val_acc1 <= 100 and "on 6 validation images" in capsys.readouterr().out
    config = {
        "seed_everything": 0,
        "model": {"encoder": {"checkpoint": str(last)}, "optim": {"warmup_epochs": 0, "base_lr": 1e-3}},
        "data": folder_data(tmp / "data", 32, augmentation="finetune"),
        "trainer": {
            "max_epochs": 1,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "logger": csv_logger(tmp, "finetune32"),
        },
    }
    cli = invoke("finetune", ["--config", str(write_config(tmp, config, "finetune32"))])
    assert tuple(cli.model.vit.patch_embed.grid_size) == (8, 8)
    assert "position embeddings resampled from (4, 4) to (8, 8) patches" in str(cli.model.vit.load_report)
    assert "validation top-1" in capsys.readouterr().out


def _printed(config: str, capsys, monkeypatch) -> dict:
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit):
        PretrainCLI(
            MAEPretrainModule,
            ImageDataModule,
            subclass_mode_data=True,
            run=False,
            args=["--config", f"configs/pretrain/{config}", "--print_config"],
        )
    return yaml.safe_load(capsys.readouterr().out)


def test_recipes__low_resolution_and_fast_stack_on_the_default_job(capsys, monkeypatch):
    default = _printed("default.yaml", capsys, monkeypatch)
    lowres = _printed("default_lowres.yaml", capsys, monkeypatch)
    fast = _printed("default_fast.yaml", capsys, monkeypatch)
    assert lowres["data"]["init_args"]["img_size"] == 16 and fast["data"]["init_args"]["img_size"] == 24
    assert lowres["model"] == default["model"]  # the same model and recipe, only smaller images
    assert default["model"]["decoder_type"] == "self" and default["model"]["decoder_keep_ratio"] == 1.0
    assert (fast["model"]["decoder_type"], fast["model"]["decoder_keep_ratio"]) == ("cross", 0.5)
    assert fast["model"]["model_kwargs"] == default["model"]["model_kwargs"]
    assert fast["trainer"]["max_epochs"] == default["trainer"]["max_epochs"]


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--model.decoder_type", "crosss"], ["model.decoder_type", "'self', 'cross'", "crosss"]),
        (
            ["--model.decoder_keep_ratio", "0.02"],
            ["decoder_keep_ratio 0.02 reconstructs", "use at least 0.0209"],
        ),
        (["--model.decoder_keep_ratio", "1.5"], ["decoder_keep_ratio must be a number in (0, 1]", "got 1.5"]),
        (
            ["--model.decoder_type", "cross", "--model.decoder_encoder_layers", "[1, 4]"],
            ["names encoder layer 4, which does not exist", "allowed values are 0..3"],
        ),
    ],
)
def test_train__bad_switches_end_at_start_up_with_the_key_and_allowed_values(
    flags, expected, capsys, monkeypatch
):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("MAE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stop:
        run_command(
            partial(
                invoke,
                "pretrain",
                ["--config", "configs/pretrain/default.yaml", *flags, "--trainer.logger", "false"],
            )
        )
    assert stop.value.code == USAGE_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(part in err for part in expected), err[-2000:]
