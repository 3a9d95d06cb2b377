"""The settings groups (``mae.training.settings``): each task's defaults, dicts taken over those defaults,
plain hyperparameters, and checkpoints written before the groups (flat keys) still loading and resuming."""

from pathlib import Path

import pytest
import torch
import yaml

from mae.cli.main import invoke
from mae.errors import ConfigError
from mae.training.settings import (
    RENAMED_IN,
    RENAMED_KEYS,
    RENAMES,
    KernelChoices,
    OptimSettings,
    PretrainOptimSettings,
    as_group,
    renamed_for,
    renamed_key_error,
    upgrade_hparams,
)
from tests.helpers import finetune_module, pretrain_module

DATA = Path(__file__).resolve().parents[2] / "data"
LEGACY_PRETRAIN = DATA / "legacy_pretrain_v0.1.ckpt"  # written by 0.1: flat keys, no architecture record
LEGACY_FINETUNE = DATA / "legacy_finetune_v0.1.ckpt"
LEGACY_KWARGS = dict(
    embed_dim=16, depth=1, num_heads=2, decoder_embed_dim=16, decoder_depth=1, decoder_num_heads=2
)


def _modules() -> dict[str, type]:
    from mae.dense.tasks.detection import MAEDetectionModule
    from mae.dense.tasks.segmentation import MAESegmentationModule
    from mae.training.finetune import MAEFinetuneModule
    from mae.training.pretrain import MAEPretrainModule

    modules = (MAEPretrainModule, MAEFinetuneModule, MAEDetectionModule, MAESegmentationModule)
    return dict(zip(("pretrain", "finetune", "detect", "segment"), modules, strict=True))


def test_groups__each_task_keeps_its_defaults():
    import inspect

    def default(module_class, name):
        for cls in module_class.__mro__:
            parameter = inspect.signature(cls.__init__).parameters.get(name)
            if parameter is not None and parameter.default is not inspect.Parameter.empty:
                return parameter.default

    modules = _modules()
    expected = {  # base_lr, min_lr, warmup_epochs, weight_decay: the paper's, ViTDet's and MAE's ADE20K
        "pretrain": (1.5e-4, 0.0, 40.0, 0.05),
        "finetune": (5e-4, 1e-6, 5.0, 0.05),
        "detect": (4e-4, 0.0, 1.0, 0.1),
        "segment": (1.6e-3, 0.0, 1.0, 0.05),
    }
    for name, values in expected.items():
        optim = default(modules[name], "optim")
        assert (optim.base_lr, optim.min_lr, optim.warmup_epochs, optim.weight_decay) == values, name
        assert default(modules[name], "kernels").compile == ("auto" if name == "pretrain" else False)
    assert default(modules["pretrain"], "optim").betas == (0.9, 0.95)


def test_as_group__a_dict_over_the_modules_defaults_and_an_unknown_key_named():
    detection = OptimSettings(base_lr=4e-4, min_lr=0.0, warmup_epochs=1.0, weight_decay=0.1)
    assert as_group({"lr": 0.5}, detection) == OptimSettings(4e-4, 0.5, 0.0, 1.0, 0.1)
    assert as_group(detection, OptimSettings()) is detection
    assert as_group({"betas": [0.9, 0.99]}, PretrainOptimSettings()).betas == (0.9, 0.99)
    with pytest.raises(
        ConfigError, match="OptimSettings takes base_lr, lr, min_lr, warmup_epochs, weight_decay; got"
    ):
        as_group({"base_lr": 1e-3, "momentum": 0.9}, OptimSettings())
    with pytest.raises(ConfigError, match="model.kernels.attention must be one of auto, sdpa, explicit"):
        as_group({"attention": "flash"}, KernelChoices())


def test_hyperparameters__record_each_group_as_a_plain_dict():
    module = finetune_module(optim={"base_lr": 1e-3}, kernels={"attention": "sdpa"})
    assert module.hparams.optim == {
        "base_lr": 1e-3,
        "lr": None,
        "min_lr": 1e-6,
        "warmup_epochs": 0,
        "weight_decay": 0.05,
    }
    assert module.hparams.kernels == {"attention": "sdpa", "compile": False, "fused_adamw": "auto"}
    assert (
        module.hparams.encoder["model"] == "mae_vit_tiny_patch4"
        and module.hparams_initial.optim["base_lr"] == 1e-3
    )
    assert module.optim.base_lr == 1e-3 and module.kernels.attention == "sdpa"


def test_renamed_keys__pretraining_keeps_its_own_model_keys():
    modules = _modules()
    encoder_keys = {"model.checkpoint", "model.checkpoint_format", "model.model", "model.model_kwargs"}
    assert set(renamed_for(modules["pretrain"])) == set(RENAMED_KEYS) - encoder_keys
    for name in ("finetune", "detect", "segment"):
        # pretraining's own keys: AdamW's betas and its target
        assert set(renamed_for(modules[name])) == set(RENAMED_KEYS) - {
            "model.betas",
            "model.norm_pix_loss",
        }, name
    flat = {"base_lr": 1e-3, "attention": "sdpa", "checkpoint": "a.ckpt", "mode": "finetune"}
    grouped = {
        "optim": {"base_lr": 1e-3},
        "kernels": {"attention": "sdpa"},
        "encoder": {"checkpoint": "a.ckpt"},
    }
    assert upgrade_hparams(flat, renamed_for(modules["finetune"])) == {**grouped, "mode": "finetune"}


def test_renamed_in_0_4_0__activation_checkpointing_is_refused_in_a_python_call_naming_its_new_name():
    from mae.dense.tasks.segmentation import MAESegmentationModule

    assert RENAMED_IN["model.activation_checkpointing"] == "0.4.0"
    with pytest.raises(ConfigError, match=r"^model.activation_checkpointing was moved to model.grad_che"):
        MAESegmentationModule(img_size=16, num_classes=3, activation_checkpointing=True)
    with pytest.raises(ConfigError, match=r"^model.base_lr was moved to model.optim.base_lr in 0.3.0"):
        MAESegmentationModule(img_size=16, num_classes=3, base_lr=0.1)
    renamed = RENAMES["0.4.0"]
    assert upgrade_hparams({"activation_checkpointing": True}, renamed) == {"grad_checkpointing": True}
    # 0.3.0 wrote both names and checkpointed when either was true
    both = {"activation_checkpointing": True, "grad_checkpointing": False}
    assert upgrade_hparams(both, renamed) == {"grad_checkpointing": True}
    neither = {"activation_checkpointing": False, "grad_checkpointing": False}
    assert upgrade_hparams(neither, renamed) == {"grad_checkpointing": False}
    assert upgrade_hparams({"activation_checkpointing": False, "grad_checkpointing": True}, renamed) == {
        "grad_checkpointing": True
    }


def test_renamed_in_0_5_0__norm_pix_loss_is_refused_naming_the_target_of_each_value():
    from mae.training.pretrain import MAEPretrainModule

    assert RENAMED_IN["model.norm_pix_loss"] == "0.5.0"
    assert renamed_for(MAEPretrainModule)["model.norm_pix_loss"] == "model.target"
    assert str(renamed_key_error("model.norm_pix_loss")) == (
        "model.norm_pix_loss was moved to model.target in 0.5.0: set model.target instead (norm_pix_loss "
        "true is target norm_pix, norm_pix_loss false is target pixel)"
    )
    renamed = RENAMES["0.5.0"]
    hparams = {"model": "mae_vit_tiny_patch4", "norm_pix_loss": True, "mask_ratio": 0.75}
    assert upgrade_hparams(hparams, renamed) == {
        "model": "mae_vit_tiny_patch4",
        "target": "norm_pix",
        "mask_ratio": 0.75,
    }
    assert upgrade_hparams({"norm_pix_loss": False}, renamed) == {"target": "pixel"}
    assert upgrade_hparams({"norm_pix_loss": False, "target": "hog"}, renamed) == {"target": "hog"}


def test_dense_checkpoint_of_version_0_3_0__loads_with_restore_kwargs_its_checkpointing_renamed(tmp_path):
    """A segmentation checkpoint as 0.3.0 wrote it: ``activation_checkpointing`` beside ``grad_checkpointing``
    (false) among its hyperparameters; 0.3.0 checkpointed when either was true, and so does the loaded one."""
    from mae.dense.tasks.segmentation import MAESegmentationModule
    from mae.training.transfer import restore_kwargs_v0_2

    encoder = {"model": "mae_vit_tiny_patch4", "model_kwargs": LEGACY_KWARGS}
    module = MAESegmentationModule(encoder=encoder, img_size=16, num_classes=3, out_channels=16).eval()
    hparams = dict(module.hparams)
    assert hparams["grad_checkpointing"] is False
    hparams.update(activation_checkpointing=True, _instantiator="lightning.pytorch.cli.instantiate_module")
    path = tmp_path / "v0_3_0.ckpt"
    saved = {"state_dict": module.state_dict(), "hyper_parameters": hparams}
    torch.save({**saved, "pytorch-lightning_version": "2.6.6"}, path)
    loaded = MAESegmentationModule.load_from_checkpoint(path, **restore_kwargs_v0_2(path)).eval()
    assert loaded.grad_checkpointing and loaded.pyramid.grad_checkpointing
    assert "activation_checkpointing" not in loaded.hparams
    images = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(module(images), loaded(images))


def test_checkpoint_of_version_0_1__loads_with_restore_kwargs_its_settings_in_their_groups():
    from mae.training.finetune import MAEFinetuneModule
    from mae.training.pretrain import MAEPretrainModule
    from mae.training.transfer import restore_kwargs_v0_2

    for path, module_class in ((LEGACY_PRETRAIN, MAEPretrainModule), (LEGACY_FINETUNE, MAEFinetuneModule)):
        saved = torch.load(path, map_location="cpu", weights_only=True)
        assert "base_lr" in saved["hyper_parameters"]  # flat keys, as every checkpoint before 0.3.0
        loaded = module_class.load_from_checkpoint(path, **restore_kwargs_v0_2(path))
        assert loaded.optim.base_lr == saved["hyper_parameters"]["base_lr"] == loaded.hparams.optim["base_lr"]
        assert loaded.optim.warmup_epochs == 0.0 and "base_lr" not in loaded.hparams
        theirs = saved["state_dict"]
        assert all(torch.equal(value, theirs[name]) for name, value in loaded.state_dict().items())
    # a path of 0.1's machine
    assert loaded.encoder_source.checkpoint == saved["hyper_parameters"]["checkpoint"]


def test_checkpoint_with_flat_keys__of_a_transfer_built_by_the_cli_loads_with_restore_kwargs(tmp_path):
    """A checkpoint of a development version between 0.2 and 0.3.0: the encoder's record in its
    hyperparameters, with the settings as flat keys, and LightningCLI's instantiator."""
    from mae.dense.tasks.segmentation import MAESegmentationModule
    from mae.training.transfer import restore_kwargs_v0_2

    encoder = {"model": "mae_vit_tiny_patch4", "model_kwargs": LEGACY_KWARGS}
    module = MAESegmentationModule(
        encoder=encoder, img_size=16, num_classes=3, out_channels=16, optim={"lr": 0.25}
    )
    module.eval()
    flat = {key: value for key, value in module.hparams.items() if key not in ("optim", "kernels", "encoder")}
    for group in ("optim", "kernels", "encoder"):
        flat.update(module.hparams[group])
    flat["_instantiator"] = "lightning.pytorch.cli.instantiate_module"
    path = tmp_path / "flat.ckpt"
    torch.save(
        {"state_dict": module.state_dict(), "hyper_parameters": flat, "pytorch-lightning_version": "2.6.6"},
        path,
    )
    loaded = MAESegmentationModule.load_from_checkpoint(path, **restore_kwargs_v0_2(path)).eval()
    assert loaded.optim == module.optim and loaded.encoder_source == module.encoder_source
    images = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(module(images), loaded(images))
    assert restore_kwargs_v0_2(path).keys() >= {"optim", "kernels"}


def test_checkpoint_of_version_0_1__resumes_with_ckpt_path(tmp_path, monkeypatch):
    """``mae pretrain --ckpt_path`` of a checkpoint whose hyperparameters hold the old keys: the run's
    settings come from the command line, under the new keys; the checkpoint's epoch is not repeated."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["mae"])
    config = {
        "model": {
            "model": "mae_vit_tiny_patch4",
            "model_kwargs": LEGACY_KWARGS,
            "optim": {"warmup_epochs": 0},
        },
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 8, "batch_size": 256}},
        "trainer": {"max_epochs": 2, "accelerator": "cpu", "logger": False, "enable_progress_bar": False},
        "checkpoint": {"dirpath": str(tmp_path / "ckpts")},
        "reconstruction": {"every_n_epochs": 0},
    }
    (tmp_path / "resume.yaml").write_text(yaml.safe_dump(config))
    cli = invoke("pretrain", ["--config", "resume.yaml", "--ckpt_path", str(LEGACY_PRETRAIN)])
    assert cli.trainer.current_epoch == 2 and len(cli.model.epoch_losses) == 1  # epoch 0 was the checkpoint's
    resumed = torch.load(tmp_path / "ckpts" / "last.ckpt", map_location="cpu", weights_only=True)
    assert (
        resumed["hyper_parameters"]["optim"]["warmup_epochs"] == 0
        and "base_lr" not in resumed["hyper_parameters"]
    )


def test_pretrain_module__takes_groups_as_dicts():
    module = pretrain_module(optim={"base_lr": 1e-3, "betas": [0.9, 0.99]}, kernels={"compile": False})
    assert module.optim == PretrainOptimSettings(base_lr=1e-3, warmup_epochs=1, betas=(0.9, 0.99))
    assert module.kernels == KernelChoices(compile=False)
