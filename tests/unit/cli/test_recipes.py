"""Every shipped config parses and builds its model and data module."""

from pathlib import Path

import pytest
import yaml

from mae.cli.commands import BY_NAME
from mae.cli.lightning import PretrainCLI, expand_stacked_configs
from mae.cli.main import invoke
from mae.cli.recipes import all_recipes
from mae.data import ImageDataModule
from mae.training.config_files import merge_configs
from mae.training.optim import effective_batch_size, scaled_lr
from mae.training.pretrain import MAEPretrainModule

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs" / "pretrain").glob("*.yaml"))
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
    assert {
        "default.yaml",
        "imagenet_vit_base.yaml",
        "imagenet100_vit_small.yaml",
        "cifar10_vit_tiny.yaml",
    } <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_config__parses_and_builds(config, monkeypatch):
    monkeypatch.chdir(config.parents[2])
    monkeypatch.setattr("sys.argv", ["train.py"])
    light = '{"depth": 1, "decoder_depth": 1}' if "vit" in config.name else '{"encoder": "resnet10t"}'
    overrides = ["--model.model_kwargs", light] if "imagenet" in config.name else []
    cli = PretrainCLI(
        MAEPretrainModule,
        ImageDataModule,
        subclass_mode_data=True,
        run=False,
        args=["--config", str(config), *LIGHT, *overrides],
    )
    assert isinstance(cli.model, MAEPretrainModule) and isinstance(cli.datamodule, ImageDataModule)
    assert cli.model.hparams.img_size == cli.datamodule.img_size  # one input size for data and model
    assert cli.model.img_size == tuple([cli.datamodule.img_size] * 2)  # the model's own input size


def _cli(*args: str) -> PretrainCLI:
    """``train.py``'s CLI in this process, from the repository root, building nothing yet."""
    return PretrainCLI(
        MAEPretrainModule, ImageDataModule, subclass_mode_data=True, run=False, args=list(args)
    )


def _printed(capsys, monkeypatch, *configs: str) -> dict:
    """The config ``train.py --print_config`` resolves from ``configs`` (file names in configs/pretrain/)."""
    monkeypatch.chdir(CONFIGS[0].parents[2])
    with pytest.raises(SystemExit) as stop:
        _cli(*[a for name in configs for a in ("--config", f"configs/pretrain/{name}")], "--print_config")
    assert stop.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


STACKS = {
    "64gpu": ["imagenet_vit_base.yaml"],
    "1gpu-stacked": ["imagenet_vit_base.yaml", "imagenet_vit_base_1gpu.yaml"],
    "1gpu-alone": ["imagenet_vit_base_1gpu.yaml"],
}


@pytest.mark.parametrize("stack", STACKS.values(), ids=STACKS.keys())
def test_config__paper_recipe_values_on_64_gpus_and_on_one(stack, capsys, monkeypatch):
    recipe = _printed(capsys, monkeypatch, *stack)
    model, trainer, data = recipe["model"], recipe["trainer"], recipe["data"]["init_args"]
    assert model["model"] == "mae_vit_base_patch16" and model["mask_ratio"] == 0.75
    assert model["target"] == "norm_pix"
    optim = model["optim"]
    assert optim["base_lr"] == 1.5e-4 and optim["warmup_epochs"] == 40 and trainer["max_epochs"] == 800
    assert data["root"] == "/path/to/imagenet" and data["img_size"] == 224  # from the base file
    effective = effective_batch_size(
        data["batch_size"], trainer["devices"], trainer["num_nodes"], trainer["accumulate_grad_batches"]
    )
    assert effective == 4096 and scaled_lr(optim["base_lr"], effective) == pytest.approx(2.4e-3)
    assert (trainer["devices"] == 1) == ("1gpu" in stack[-1])


@pytest.mark.parametrize(
    "size, model", [("large", "mae_vit_large_patch16"), ("huge", "mae_vit_huge_patch14")]
)
def test_config__vit_large_and_huge_recipes_stack_on_the_base_recipe(size, model, capsys, monkeypatch):
    recipe = _printed(capsys, monkeypatch, "imagenet_vit_base.yaml", f"imagenet_vit_{size}.yaml")
    assert recipe["model"]["model"] == model and recipe["model"]["optim"]["base_lr"] == 1.5e-4
    assert recipe["trainer"]["max_epochs"] == 800 and recipe["trainer"]["logger"]["init_args"][
        "name"
    ].endswith(size)


def test_expand_stacked_configs__inserts_the_base_once(tmp_path):
    (tmp_path / "base.yaml").write_text("model:\n  mask_ratio: 0.6\n")
    (tmp_path / "top.yaml").write_text("# stacks on: base.yaml\nmodel:\n  optim:\n    base_lr: 0.002\n")
    base, top = str(tmp_path / "base.yaml"), str(tmp_path / "top.yaml")
    assert expand_stacked_configs(["--config", top, "--x", "1"]) == [
        "--config",
        base,
        "--config",
        top,
        "--x",
        "1",
    ]
    assert expand_stacked_configs([f"--config={top}"]) == ["--config", base, f"--config={top}"]
    assert expand_stacked_configs(["--config", base, "--config", top]) == ["--config", base, "--config", top]


def test_expand_stacked_configs__a_chain_of_bases_in_order_each_once(tmp_path):
    """A base that stacks on another brings it too; a base two configs share comes once, before the first."""
    files = {
        "a": "model:\n  mask_ratio: 0.6\n",
        "b": "# stacks on: a.yaml\nmodel:\n  mask_ratio: 0.7\n",
        "c": "# stacks on: b.yaml\nmodel:\n  mask_ratio: 0.8\n",
        "d": "# stacks on: a.yaml\ntrainer:\n  max_epochs: 1\n",
    }
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    a, b, c, d = (str(tmp_path / f"{name}.yaml") for name in files)
    expanded = expand_stacked_configs(["--config", c, "--config", d])
    assert expanded == ["--config", a, "--config", b, "--config", c, "--config", d]


def test_merge_configs__as_jsonargparse_merges_config_files():
    base = {
        "model": {"optim": {"base_lr": 1e-3, "warmup_epochs": 2}, "schedule": [[0, 16]]},
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 32, "batch_size": 64}},
        "trainer": {"logger": {"class_path": "CSVLogger", "init_args": {"save_dir": "runs", "name": "a"}}},
    }
    top = {
        "model": {"optim": {"base_lr": 2e-3}, "schedule": [[0, 24]]},
        "data": {"class_path": "mae.data.CIFARDataModule", "init_args": {"img_size": 24}},
        "trainer": {"logger": {"class_path": "CSVLogger", "init_args": {"name": "b"}}},
    }
    assert merge_configs(base, top) == {
        "model": {"optim": {"base_lr": 2e-3, "warmup_epochs": 2}, "schedule": [[0, 24]]},
        "data": {"class_path": "mae.data.CIFARDataModule", "init_args": {"img_size": 24}},
        "trainer": {"logger": {"class_path": "CSVLogger", "init_args": {"save_dir": "runs", "name": "b"}}},
    }


@pytest.mark.parametrize("form", ["--config PATH", "--config=PATH"])
def test_linked_model_img_size_in_a_yaml_is_refused(tmp_path, form, capsys, monkeypatch):
    monkeypatch.chdir(CONFIGS[0].parents[2])
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  img_size: 64\n")
    args = ["--config", str(path)] if form == "--config PATH" else [f"--config={path}"]
    with pytest.raises(SystemExit) as stop:
        _cli("--config", "configs/pretrain/default.yaml", *args, "--trainer.logger", "false")
    assert stop.value.code != 0 and "model.img_size is taken from data.img_size" in capsys.readouterr().err


# The command that runs each recipe folder's recipes.
RUN_BY = {
    "pretrain": "pretrain",
    "distill": "distill",
    "finetune": "finetune",
    "linprobe": "finetune",
    "detect": "detect",
    "segment": "segment",
}


def _without_config_paths(config) -> dict:
    parsed = config.as_dict()
    parsed.pop("config", None)
    return parsed


def test_every_recipe_shown__parses_to_the_recipe_as_run(tmp_path, capsys, monkeypatch):
    """What ``mae recipes --show NAME`` prints, saved and given alone to ``--config``, is the config
    ``--config NAME`` runs (a stacked recipe with its bases merged in)."""
    monkeypatch.chdir(tmp_path)
    parsers = {command: BY_NAME[command].build_parser() for command in set(RUN_BY.values())}
    stacked = 0
    for recipe in all_recipes(tuple(RUN_BY)):
        shown = tmp_path / f"{recipe.folder}_{recipe.path.name}"
        shown.write_text("\n".join(invoke("recipes", ["--show", recipe.name])) + "\n")
        as_run = expand_stacked_configs(["--config", str(recipe.path)])
        stacked += len(as_run) > 2
        parser = parsers[RUN_BY[recipe.folder]]
        assert _without_config_paths(parser.parse_args(["--config", str(shown)])) == _without_config_paths(
            parser.parse_args(as_run)
        ), recipe.name
        assert "# stacks on:" not in shown.read_text()
    assert stacked >= 9  # the check covers the recipes that stack on others
    capsys.readouterr()
