"""Our Lightning checkpoints (``mae.convert.formats.lightning``) and the checkpoint contract
(``mae.convert.architecture``): every checkpoint we write records its architecture and the readers use that
record; checkpoints written before the record keep loading."""

from pathlib import Path

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from mae import load_backbone, load_mae
from mae.convert.architecture import ARCHITECTURE_KEY
from mae.convert.formats import lightning
from mae.convert.formats.base import CheckpointPath
from mae.convert.sources import read_checkpoint
from mae.data import DigitsDataModule
from mae.errors import InputError
from mae.training.checkpointing import check_resume_checkpoint
from tests.helpers import (
    LabelledImages,
    RandomImages,
    finetune_module,
    make_trainer,
    pretrain_module,
    untrained_cnn_checkpoint,
)

DATA = Path(__file__).resolve().parents[3] / "data"
# Written by train.py / finetune.py at version 0.1 (commit 2a6ada0): 1 epoch on the digits at 8x8,
# a 16-d 1-block encoder and decoder; the fine-tuned one starts from the pretrained one.
LEGACY_PRETRAIN = DATA / "legacy_pretrain_v0.1.ckpt"
LEGACY_FINETUNE = DATA / "legacy_finetune_v0.1.ckpt"
LEGACY_KWARGS = dict(
    embed_dim=16, depth=1, num_heads=2, decoder_embed_dim=16, decoder_depth=1, decoder_num_heads=2
)


def _saved(tmp_path, module, datamodule) -> dict:
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    return torch.load(tmp_path / "c.ckpt", map_location="cpu", weights_only=True)


def test_pretraining_checkpoint__records_the_model_config_and_the_reader_needs_nothing_else(tmp_path):
    module = pretrain_module(mask_strategy="grid", optim=dict(warmup_epochs=0))
    ckpt = _saved(tmp_path, module, RandomImages())
    record = ckpt[ARCHITECTURE_KEY]
    assert record["class"] == "MaskedAutoencoderViT" and record["state_dict_prefix"] == "model."
    assert {**record["args"], "img_size": tuple(record["args"]["img_size"])} == module.model.config
    # Without the module's hyperparameters the architecture still comes back exactly.
    del ckpt["hyper_parameters"]
    torch.save(ckpt, tmp_path / "bare.ckpt")
    assert read_checkpoint(tmp_path / "bare.ckpt").config == module.model.config
    model, report = load_mae(tmp_path / "bare.ckpt")
    assert report.notes == [] and model.mask_strategy == "grid"
    for key, value in module.model.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value)


@pytest.mark.parametrize("mode", ["finetune", "linprobe"])
def test_finetuning_checkpoint__records_timm_arguments_that_rebuild_the_classifier(tmp_path, mode):
    extra = dict(mixup=0, cutmix=0, drop_path_rate=0) if mode == "linprobe" else {}
    module = finetune_module(mode=mode, **extra)
    ckpt = _saved(tmp_path, module, LabelledImages())
    record = ckpt[ARCHITECTURE_KEY]
    assert record["class"] == "VisionTransformer" and record["state_dict_prefix"] == "vit."
    args = dict(record["args"])
    assert args.pop("head") == ("batchnorm_linear" if mode == "linprobe" else "linear")
    assert args["num_classes"] == 3 and args["global_pool"] == "avg" and record["layer_norm_eps"] == 1e-6
    if mode == "finetune":  # timm alone rebuilds it from the record, strictly
        vit = VisionTransformer(**args)
        vit.load_state_dict({k[4:]: v for k, v in ckpt["state_dict"].items() if k.startswith("vit.")})
    backbone = load_backbone(
        tmp_path / "c.ckpt", global_pool="avg", num_classes=3 if mode == "finetune" else 0
    )
    torch.testing.assert_close(backbone.blocks[0].attn.qkv.weight, module.vit.blocks[0].attn.qkv.weight)


def test_pretraining_checkpoint_written_before_the_record__loads_with_its_tensors():
    saved = torch.load(LEGACY_PRETRAIN, map_location="cpu", weights_only=True)
    assert ARCHITECTURE_KEY not in saved
    model, _ = load_mae(LEGACY_PRETRAIN)
    assert model.config["embed_dim"] == 16 and model.config["img_size"] == (8, 8) and model.norm_pix_loss
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, saved["state_dict"][f"model.{key}"])
    backbone = load_backbone(LEGACY_PRETRAIN)
    torch.testing.assert_close(backbone.cls_token, saved["state_dict"]["model.cls_token"])


def test_finetuning_checkpoint_written_before_the_record__loads_with_its_head():
    saved = torch.load(LEGACY_FINETUNE, map_location="cpu", weights_only=True)["state_dict"]
    vit = load_backbone(LEGACY_FINETUNE, global_pool="avg", num_classes=10)
    assert vit.load_report.missing == []
    torch.testing.assert_close(vit.head.weight, saved["vit.head.weight"])
    torch.testing.assert_close(vit.fc_norm.weight, saved["vit.fc_norm.weight"])


def test_pretraining_checkpoint_written_before_the_record__resumes(tmp_path):
    module = pretrain_module(img_size=8, model_kwargs=LEGACY_KWARGS, optim=dict(warmup_epochs=0))
    check_resume_checkpoint(LEGACY_PRETRAIN, module)
    trainer = make_trainer(tmp_path, max_epochs=2, limit_val_batches=0, precision="32-true")
    trainer.fit(module, datamodule=DigitsDataModule(img_size=8, batch_size=256), ckpt_path=LEGACY_PRETRAIN)
    assert trainer.global_step == 10  # 5 steps per epoch, the first epoch from the file


def _write_as_version_0_2(module, path: Path) -> None:
    """``module``'s checkpoint as version 0.2 wrote it: the encoder's architecture beside the
    hyperparameters, and the input normalisation a dense module resolved in ``mae_data`` only."""
    import lightning

    settings = dict(module.hparams)
    record = settings.pop("encoder_config")
    data = {"in_chans": 3, "img_size": [16, 16], "mean": [0.5] * 3, "std": [0.25] * 3}  # a data module's
    if (
        "mean" in settings
    ):  # a dense module's hyperparameters kept what it was given, mae_data what it resolved
        data.update(mean=settings["mean"], std=settings["std"])
        settings["mean"] = settings["std"] = None
    saved = {
        "state_dict": module.state_dict(),
        "hyper_parameters": settings,
        "mae_encoder_config": record,
        "mae_data": data,
        "pytorch-lightning_version": lightning.__version__,
    }
    torch.save(saved, path)


@pytest.mark.parametrize("kind", ["finetune", "segmentation"])
def test_trained_checkpoint_of_version_0_2__loads_without_its_pretraining_file_given_restore_kwargs(
    tmp_path, kind
):
    """0.2 kept the encoder's architecture beside the hyperparameters: Lightning's load_from_checkpoint then
    needs the pretraining file, or ``restore_kwargs_v0_2``, which reads that record (and a dense module's
    input normalisation) back; a newer checkpoint needs none."""
    import shutil

    from mae.dense.tasks.segmentation import MAESegmentationModule
    from mae.training.finetune import MAEFinetuneModule
    from mae.training.transfer import restore_kwargs_v0_2
    from tests.helpers import tiny_pretraining_checkpoint

    start = tiny_pretraining_checkpoint(tmp_path / "pre")
    pretrained = torch.load(start, map_location="cpu", weights_only=True)
    pretrained["mae_data"] = {
        "in_chans": 3,
        "img_size": [16, 16],
        "mean": [0.2, 0.3, 0.4],
        "std": [0.5, 0.6, 0.7],
    }
    torch.save(pretrained, start)
    module_class = MAEFinetuneModule if kind == "finetune" else MAESegmentationModule
    extra = {"out_channels": 16} if kind == "segmentation" else {}
    module = module_class(encoder=dict(checkpoint=str(start)), img_size=16, num_classes=3, **extra).eval()
    _write_as_version_0_2(module, tmp_path / "v0_2.ckpt")
    shutil.rmtree(tmp_path / "pre")
    with pytest.raises(FileNotFoundError, match="model.encoder.checkpoint"):
        module_class.load_from_checkpoint(tmp_path / "v0_2.ckpt")
    restore = restore_kwargs_v0_2(tmp_path / "v0_2.ckpt")
    assert sorted(restore) == (
        ["encoder_config"] if kind == "finetune" else ["encoder_config", "mean", "std"]
    )
    loaded = module_class.load_from_checkpoint(tmp_path / "v0_2.ckpt", **restore).eval()
    ours, theirs = module.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    images = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(module(images), loaded(images))
    if kind == "segmentation":
        assert list(loaded.mean) == [0.2, 0.3, 0.4] and list(loaded.std) == [0.5, 0.6, 0.7]
    newer = {
        **torch.load(tmp_path / "v0_2.ckpt", weights_only=True),
        "hyper_parameters": dict(loaded.hparams),
    }
    torch.save(newer, tmp_path / "new.ckpt")
    assert restore_kwargs_v0_2(tmp_path / "new.ckpt") == {}


def test_pretraining_checkpoint_of_a_run_started_from_weights__loads_with_init_from_none(tmp_path):
    """model.init_from is read when the module is built: without the file, Lightning's load_from_checkpoint
    of the run's checkpoint says to pass init_from=None (the checkpoint holds every weight)."""
    import shutil

    from mae.training.pretrain import MAEPretrainModule
    from tests.helpers import tiny_pretraining_checkpoint

    module = pretrain_module(
        init_from=str(tiny_pretraining_checkpoint(tmp_path / "init")), optim=dict(warmup_epochs=0)
    )
    _saved(tmp_path, module, RandomImages())
    shutil.rmtree(tmp_path / "init")
    with pytest.raises(FileNotFoundError, match="pass init_from=None"):
        MAEPretrainModule.load_from_checkpoint(tmp_path / "c.ckpt")
    loaded = MAEPretrainModule.load_from_checkpoint(tmp_path / "c.ckpt", init_from=None)
    ours, theirs = module.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_detect__a_lightning_dict_only(tmp_path):
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.6"}, tmp_path / "a.ckpt")
    torch.save({"model": {"cls_token": torch.zeros(1, 1, 4)}}, tmp_path / "official.pth")
    torch.save({"state_dict": {}}, tmp_path / "no_version.ckpt")  # not written by Lightning
    assert lightning.detect(CheckpointPath(tmp_path / "a.ckpt"))
    assert not lightning.detect(CheckpointPath(tmp_path / "official.pth"))
    assert not lightning.detect(CheckpointPath(tmp_path / "no_version.ckpt"))
    assert not lightning.detect(CheckpointPath(tmp_path))
    assert lightning.detect(CheckpointPath(LEGACY_PRETRAIN))


def test_read__a_record_that_disagrees_with_the_tensors_is_refused_by_name(tmp_path):
    module = pretrain_module(optim=dict(warmup_epochs=0))
    ckpt = _saved(tmp_path, module, RandomImages())
    ckpt[ARCHITECTURE_KEY]["args"]["embed_dim"] *= 2
    torch.save(ckpt, tmp_path / "edited.ckpt")
    with pytest.raises(InputError, match=r"edited.ckpt: its mae_architecture record says embed_dim=.*edited"):
        lightning.read(CheckpointPath(tmp_path / "edited.ckpt"))


def _edited_cnn_checkpoint(tmp_path: Path, **args) -> Path:
    """A CNN pretraining checkpoint (resnet10t) whose record's arguments were edited to ``args``."""
    saved = torch.load(untrained_cnn_checkpoint(tmp_path / "cnn.ckpt"), weights_only=False)
    saved[ARCHITECTURE_KEY]["args"].update(args)
    torch.save(saved, tmp_path / "edited.ckpt")
    return tmp_path / "edited.ckpt"


def test_read__a_cnn_checkpoint_as_the_cnn_family_with_its_record_and_tensors(tmp_path):
    ckpt = read_checkpoint(untrained_cnn_checkpoint(tmp_path / "cnn.ckpt"))
    assert ckpt.family == "cnn" and ckpt.format == "lightning"
    assert ckpt.config["encoder"] == "resnet10t" and ckpt.config["img_size"] == (32, 32)
    assert "encoder.conv1.0.weight" in ckpt.state_dict and "decoder.proj.weight" in ckpt.state_dict


@pytest.mark.parametrize(
    "args, message",
    [
        (
            {"encoder": "resnet18"},
            r"record says a resnet18 MaskedAutoencoderCNN .* its tensors differ: .*conv1",
        ),
        ({"decoder_width": 2**20}, r"record says a resnet10t MaskedAutoencoderCNN .* has shape"),
        ({"encoder": "resnet_of_nobody"}, r"names encoder 'resnet_of_nobody', which timm .* does not know"),
        ({"embed_dim": 768}, r"arguments MaskedAutoencoderCNN does not take: \['embed_dim'\]"),
        ({"mask_unit": 5}, r"record builds no model: .*mask_unit 5 must divide"),
    ],
)
def test_read__a_cnn_record_that_disagrees_with_its_tensors_is_refused_naming_the_file(
    tmp_path, args, message
):
    path = _edited_cnn_checkpoint(tmp_path, **args)
    with pytest.raises(InputError, match=message) as err:
        read_checkpoint(path)
    assert str(err.value).startswith(f"{path}: its mae_architecture record")
