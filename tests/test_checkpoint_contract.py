"""The checkpoint contract (``mae.convert.architecture``): every checkpoint we write records its
architecture and the readers use that record; checkpoints written before the record keep loading."""

from pathlib import Path

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from mae import load_backbone, load_mae
from mae.convert.architecture import ARCHITECTURE_KEY
from mae.convert.sources import read_checkpoint
from mae.data import DigitsDataModule
from mae.training.checkpointing import check_resume_checkpoint
from tests.helpers import LabelledImages, RandomImages, finetune_module, make_trainer, pretrain_module

DATA = Path(__file__).resolve().parent / "data"
# Written by train.py / finetune.py at version 0.1 (commit 2a6ada0): 1 epoch on the digits at 8x8,
# a 16-d 1-block encoder and decoder; the fine-tuned one starts from the pretrained one.
LEGACY_PRETRAIN = DATA / "legacy_pretrain_v0.1.ckpt"
LEGACY_FINETUNE = DATA / "legacy_finetune_v0.1.ckpt"
LEGACY_KWARGS = dict(embed_dim=16, depth=1, num_heads=2, decoder_embed_dim=16, decoder_depth=1, decoder_num_heads=2)


def _saved(tmp_path, module, datamodule) -> dict:
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule)
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    return torch.load(tmp_path / "c.ckpt", map_location="cpu", weights_only=True)


def test_pretraining_checkpoint__records_the_model_config_and_the_reader_needs_nothing_else(tmp_path):
    module = pretrain_module(mask_strategy="grid", warmup_epochs=0)
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
    backbone = load_backbone(tmp_path / "c.ckpt", global_pool="avg", num_classes=3 if mode == "finetune" else 0)
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
    module = pretrain_module(img_size=8, model_kwargs=LEGACY_KWARGS, warmup_epochs=0)
    check_resume_checkpoint(LEGACY_PRETRAIN, module)
    trainer = make_trainer(tmp_path, max_epochs=2, limit_val_batches=0, precision="32-true")
    trainer.fit(module, datamodule=DigitsDataModule(img_size=8, batch_size=256), ckpt_path=LEGACY_PRETRAIN)
    assert trainer.global_step == 10  # 5 steps per epoch, the first epoch from the file
