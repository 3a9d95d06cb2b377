"""Inputs a hostile-but-ordinary user gives: 16-bit and float images, symlink loops, decompression
bombs, files that are not checkpoints, mask ratios that leave nothing visible, empty runs."""

import json
import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from mae import load_backbone
from mae.models import create_model
from mae.training.checkpointing import check_resume_checkpoint
from tests.helpers import TINY_KWARGS, CreatesFolder, RandomImages, make_trainer, pretrain_module

# ---------------------------------------------------------------- bit depth


# ---------------------------------------------------------------- folders


# ---------------------------------------------------------------- decompression bombs


# ---------------------------------------------------------------- files that are not checkpoints


def _not_checkpoints(tmp_path):
    files = {
        "url.pth": b"https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth\n",
        "lfs.pth": b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 343\n",
        "config.ckpt": b"model:\n  model: mae_vit_base_patch16\n",
        "random.pth": bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)),
        "empty.pth": b"",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    Image.new("RGB", (8, 8)).save(tmp_path / "photo.pth", format="JPEG")
    return {
        "url.pth": "a URL",
        "lfs.pth": "Git LFS pointer",
        "config.ckpt": "YAML",
        "random.pth": "binary data",
        "empty.pth": "an empty file",
        "photo.pth": "an image",
    }


def test_not_a_checkpoint__says_what_the_file_looks_like(tmp_path):
    for name, looks_like in _not_checkpoints(tmp_path).items():
        with pytest.raises(ValueError) as err:
            load_backbone(tmp_path / name)
        message = str(err.value)
        assert (
            f"{tmp_path / name} is not a PyTorch/safetensors checkpoint" in message and looks_like in message
        )
        assert "weights_only=False" not in message
        with pytest.raises(ValueError, match="is not a PyTorch/safetensors checkpoint"):
            check_resume_checkpoint(tmp_path / name, pretrain_module())


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_code_in_a_pickle__refused_without_suggesting_to_run_it(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"model": _Exploit()}, path)
    with pytest.raises(ValueError, match="would run code when loaded") as err:
        load_backbone(path)
    assert "weights_only=False" not in str(err.value)
    legacy = tmp_path / "legacy.pth"
    with open(legacy, "wb") as f:
        pickle.dump({"model": _Exploit()}, f, protocol=2)
    with pytest.raises(ValueError, match="legacy.pth"):
        load_backbone(legacy)


def test_not_a_vit_state_dict__names_the_file(tmp_path):
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "resnet.pth")
    with pytest.raises(ValueError, match=r"resnet.pth is not a ViT / MAE state dict"):
        load_backbone(tmp_path / "resnet.pth")


def test_safetensors_weights_under_another_suffix__still_read(tmp_path):
    from safetensors.torch import save_file

    model = create_model("mae_vit_tiny_patch4", **TINY_KWARGS)
    encoder = {
        k: v for k, v in model.state_dict().items() if not k.startswith("decoder") and k != "mask_token"
    }
    save_file(encoder, tmp_path / "weights.bin")
    vit = load_backbone(tmp_path / "weights.bin", num_heads=2)
    torch.testing.assert_close(vit.cls_token, model.cls_token)


def test_hugging_face_config_with_another_activation__refused(tmp_path):
    from mae.convert.huggingface import save_hf_pretrained

    save_hf_pretrained(create_model("mae_vit_tiny_patch4", **TINY_KWARGS), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(ValueError, match=r"config.json: hidden_act is 'relu'"):
        load_backbone(tmp_path)


# ---------------------------------------------------------------- run settings


@pytest.mark.parametrize("strategy", ["random", "block"])
def test_mask_ratio_leaving_no_visible_patch__refused_at_start(strategy):
    with pytest.raises(ValueError, match=r"leaves no visible patch on the 8x8 patch grid.*at most 0.9843"):
        pretrain_module(img_size=32, mask_ratio=0.999, mask_strategy=strategy)
    model = pretrain_module(img_size=32, mask_ratio=0.9843, mask_strategy=strategy).model
    _, mask, _ = model.forward_encoder(torch.randn(1, 3, 32, 32), 0.9843)
    assert int((mask == 0).sum()) == 1


def test_zero_epochs__reported_as_a_run_of_zero_steps(tmp_path):
    with pytest.raises(ValueError, match="this run has 0 optimizer steps"):
        make_trainer(tmp_path, max_epochs=0).fit(pretrain_module(), datamodule=RandomImages())


def test_ckpt_path_last__found_where_lightning_writes_it_without_a_logger_or_with_a_named_version(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from mae.training.resume import continue_in_run_folder, find_last_checkpoint

    bare = make_trainer(
        tmp_path / "bare",
        max_steps=1,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(save_last=True)],
    )
    bare.fit(pretrain_module(optim=dict(warmup_epochs=0)), datamodule=RandomImages())
    assert find_last_checkpoint(bare) == tmp_path / "bare" / "checkpoints" / "last.ckpt"
    logged = lambda: make_trainer(  # noqa: E731
        tmp_path,
        max_steps=1,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(save_last=True)],
        logger=CSVLogger(tmp_path / "runs", name="exp", version="first-try"),
    )
    first = logged()
    first.fit(pretrain_module(optim=dict(warmup_epochs=0)), datamodule=RandomImages())
    again = logged()
    again.logger._version = None  # as a requeued command line that leaves the version to the logger
    found = find_last_checkpoint(again)
    assert found == tmp_path / "runs" / "exp" / "first-try" / "checkpoints" / "last.ckpt"
    continue_in_run_folder(again, str(found), 1)
    assert again.logger.version == "first-try"


def test_short_config_flag__stacked_configs_expand_too(tmp_path):
    from mae.cli.lightning import expand_stacked_configs

    (tmp_path / "base.yaml").write_text("model:\n  mask_ratio: 0.6\n")
    (tmp_path / "top.yaml").write_text("# stacks on: base.yaml\nmodel:\n  mask_ratio: 0.7\n")  # not empty
    top, base = str(tmp_path / "top.yaml"), str(tmp_path / "base.yaml")
    assert expand_stacked_configs(["-c", top]) == ["--config", base, "-c", top]


def test_two_channel_figures__drawn_in_three_colours():
    from mae.inference.reconstruction import reconstruction_grid

    views = {
        k: torch.rand(1, 2, 8, 8) for k in ("original", "masked", "reconstruction", "reconstruction_visible")
    }
    assert reconstruction_grid(views, mean=(0.0, 0.0), std=(1.0, 1.0)).shape[0] == 3


# ---------------------------------------------------------------- CIFAR files


def _cifar_finetune(tmp_path, root) -> dict:
    """A tiny ``mae finetune`` config on the CIFAR-10 files in ``root``: two steps, then validation."""
    from tests.helpers import csv_logger

    return {
        "seed_everything": 0,
        "model": {
            "encoder": {"model": "mae_vit_tiny_patch4", "model_kwargs": TINY_KWARGS},
            "optim": {"warmup_epochs": 0},
            "mixup": 0,
            "cutmix": 0,
        },
        "data": {
            "class_path": "mae.data.CIFARDataModule",
            "init_args": {"root": str(root), "img_size": 32, "batch_size": 4, "num_workers": 0},
        },
        "trainer": {
            "max_steps": 2,
            "max_epochs": 1,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "logger": csv_logger(tmp_path, "cifar"),
        },
    }


@pytest.mark.parametrize("name", ["data_batch_1", "batches.meta"])
def test_cifar_file_that_would_run_code__refused_by_name_before_it_runs(tmp_path, name):
    from tests.helpers import run_mae, write_cifar

    write_cifar(tmp_path / "cifar", "cifar10", train_per_batch=4, test=4)
    file = tmp_path / "cifar" / "cifar-10-batches-py" / name
    target = tmp_path / "created_by_the_cifar_file"
    file.write_bytes(pickle.dumps({"data": CreatesFolder(target), "label_names": []}))
    config = _cifar_finetune(tmp_path, tmp_path / "cifar")
    result = run_mae("finetune", config=config, tmp=tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {file} would run code when loaded (GLOBAL posix.mkdir): CIFAR's python files are pickles, "
        "read here with only the types CIFAR's files hold; take the files from the official "
        "cifar-10-python.tar.gz"
    )
    assert not target.exists()


def test_cifar_labels_beyond_the_classes__named_at_start_up(tmp_path):
    from tests.helpers import run_mae, write_cifar

    write_cifar(tmp_path / "cifar", "cifar10", train_per_batch=4, test=4)
    file = tmp_path / "cifar" / "cifar-10-batches-py" / "test_batch"
    with open(file, "wb") as f:  # a CIFAR-10 layout holding labels 0-19
        rows = np.random.default_rng(0).integers(0, 256, (4, 3072), dtype=np.uint8)
        pickle.dump({"data": rows, "labels": [0, 19, 5, 12]}, f)
    config = _cifar_finetune(tmp_path, tmp_path / "cifar")
    result = run_mae("finetune", config=config, tmp=tmp_path, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {file} holds the label 19, outside CIFAR-10's 10 classes (0-9); set data.dataset to the "
        "dataset these files hold (now cifar10), or replace the file with the one of that name from the "
        "official cifar-10-python.tar.gz"
    )
    assert not list((tmp_path / "runs").rglob("*.ckpt"))  # refused before any training
