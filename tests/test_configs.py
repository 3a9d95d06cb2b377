"""Every shipped config parses and builds its model and data module."""

from pathlib import Path

import pytest

from mae.cli import PretrainCLI
from mae.data import ImageDataModule
from mae.pretrain import MAEPretrainModule

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs" / "pretrain").glob("*.yaml"))
# Keep the big models light and the trainer on this machine's CPU.
LIGHT = [
    "--trainer.accelerator",
    "cpu",
    "--trainer.devices",
    "1",
    "--trainer.num_nodes",
    "1",
    "--trainer.strategy",
    "auto",
    "--trainer.precision",
    "32-true",
    "--trainer.logger",
    "false",
]


def test_configs__the_required_recipes_exist():
    names = {p.name for p in CONFIGS}
    assert {"default.yaml", "imagenet_vit_base.yaml", "imagenet100_vit_small.yaml", "cifar10_vit_tiny.yaml"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_config__parses_and_builds(config, monkeypatch):
    monkeypatch.chdir(config.parents[2])
    monkeypatch.setattr("sys.argv", ["train.py"])
    overrides = ["--model.model_kwargs", '{"depth": 1, "decoder_depth": 1}'] if "imagenet" in config.name else []
    cli = PretrainCLI(
        MAEPretrainModule,
        ImageDataModule,
        subclass_mode_data=True,
        run=False,
        args=["--config", str(config), *LIGHT, *overrides],
    )
    assert isinstance(cli.model, MAEPretrainModule) and isinstance(cli.datamodule, ImageDataModule)
    assert cli.model.hparams.img_size == cli.datamodule.img_size  # one input size for data and model
    assert cli.model.model.patch_embed.img_size == tuple([cli.datamodule.img_size] * 2)


@pytest.mark.parametrize("name", ["imagenet_vit_base.yaml", "imagenet_vit_base_1gpu.yaml"])
def test_config__paper_recipe_values_on_64_gpus_and_on_one(name):
    import yaml

    from mae.optim import effective_batch_size, scaled_lr

    recipe = yaml.safe_load((CONFIGS[0].parent / name).read_text())
    model, trainer, data = recipe["model"], recipe["trainer"], recipe["data"]["init_args"]
    assert model["model"] == "mae_vit_base_patch16" and model["mask_ratio"] == 0.75 and model["norm_pix_loss"]
    assert model["base_lr"] == 1.5e-4 and model["warmup_epochs"] == 40 and trainer["max_epochs"] == 800
    effective = effective_batch_size(
        data["batch_size"], trainer["devices"], trainer["num_nodes"], trainer["accumulate_grad_batches"]
    )
    assert effective == 4096 and scaled_lr(model["base_lr"], effective) == pytest.approx(2.4e-3)
