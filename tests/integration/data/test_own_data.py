"""Your own data and your own starting point: any channel count and bit depth end to end, the
data's own statistics, and pretraining continued from existing MAE weights."""

import json

import numpy as np
import pytest
import tifffile
import timm
import torch
import yaml
from PIL import Image

from mae import create_model, load_backbone
from mae.cli.main import invoke
from mae.convert.export import export_encoder
from mae.data import ImageFolderDataModule
from mae.data.decoding.image import read_array
from mae.inference.reconstruction import reconstruction_grid
from tests.helpers import TINY_KWARGS, RandomImages, csv_logger, make_trainer, pretrain_module, write_config

KINDS = {  # name: (channels, writer of one (H, W, C) image)
    "gray16_png": (
        1,
        lambda path, a: Image.fromarray((a[:, :, 0] * 65535).astype(np.uint16)).save(f"{path}.png"),
    ),
    "4band_tiff": (
        4,
        lambda path, a: tifffile.imwrite(
            f"{path}.tif",
            (a * 65535).astype(np.uint16).transpose(2, 0, 1),
            photometric="minisblack",
            planarconfig="separate",
        ),
    ),
    "5band_npy": (5, lambda path, a: np.save(f"{path}.npy", a.astype(np.float32) * 100.0)),  # physical units
}


def _folder(root, kind: str, per_class: int = 6, size=(20, 24), seed: int = 0):
    channels, write = KINDS[kind]
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", 2)):
        for label, name in enumerate(("a", "b")):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):  # class b brighter, so there is something to learn
                pixels = np.clip(rng.random((*size, channels)) * 0.5 + 0.4 * label, 0, 1)
                write(root / split / name / f"{i}", pixels)
    return root


def _run_config(tmp_path, root, stats: dict, name: str) -> dict:
    return {
        "seed_everything": 0,
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {"root": str(root), "img_size": 16, "batch_size": 4, "num_workers": 0, **stats},
        },
        "trainer": {
            "max_epochs": 1,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            "logger": csv_logger(tmp_path, name),
        },
    }


@pytest.mark.parametrize("kind", KINDS)
def test_own_data__stats_pretrain_finetune_and_export_for_timm(tmp_path, kind, capsys):
    channels = KINDS[kind][0]
    root = _folder(tmp_path / "data", kind)
    invoke("stats", [str(root)])
    stats = yaml.safe_load(capsys.readouterr().out)["data"]["init_args"]
    assert stats["in_chans"] == channels and len(stats["mean"]) == channels

    pretrain = _run_config(tmp_path, root, stats, "pretrain")
    pretrain["model"] = {
        "model": "mae_vit_tiny_patch4",
        "model_kwargs": TINY_KWARGS,
        "optim": {"warmup_epochs": 0},
    }
    pretrain["reconstruction"] = {"every_n_epochs": 1, "num_images": 2}
    cli = invoke("pretrain", ["--config", str(write_config(tmp_path, pretrain, "pretrain"))])
    assert cli.model.model.patch_embed.proj.in_channels == channels and cli.datamodule.array_mode
    run = tmp_path / "runs" / "pretrain" / "version_0"
    assert (run / "reconstructions" / "epoch_0001.png").exists()

    finetune = _run_config(tmp_path, root, {**stats, "augmentation": "finetune"}, "finetune")
    finetune["model"] = {
        "encoder": {"checkpoint": str(run / "checkpoints" / "last.ckpt")},
        "optim": {"warmup_epochs": 0},
        "mixup": 0,
        "cutmix": 0,
    }
    cli = invoke("finetune", ["--config", str(write_config(tmp_path, finetune, "finetune"))])
    assert cli.model.vit.patch_embed.proj.in_channels == channels

    weights, sidecar = export_encoder(run / "checkpoints" / "last.ckpt", tmp_path / "encoder.safetensors")
    args = json.loads(sidecar.read_text())
    assert args["model_args"]["in_chans"] == channels
    vit = timm.create_model(
        args["architecture"],
        pretrained=True,
        pretrained_cfg_overlay={"file": str(weights)},
        **args["model_args"],
    ).eval()
    x = torch.randn(2, channels, 16, 16)
    ours = load_backbone(run / "checkpoints" / "last.ckpt").eval()
    torch.testing.assert_close(vit.forward_features(x), ours.forward_features(x))


def test_stats__exact_over_every_pixel(tmp_path, capsys):
    root = _folder(tmp_path, "4band_tiff")
    pixels = (
        np.concatenate([read_array(p).reshape(-1, 4) for p in sorted((root / "train").rglob("*.tif"))])
        / 65535
    )
    stats = invoke("stats", [str(root)])
    np.testing.assert_allclose(stats.mean, pixels.mean(0), rtol=1e-9)
    np.testing.assert_allclose(stats.std, pixels.std(0), rtol=1e-6)
    assert "in_chans: 4" in capsys.readouterr().out


def test_mixed_bit_depths__refused_at_start_naming_two_files(tmp_path):
    for name, dtype, scale in (("a", np.uint16, 65535), ("b", np.uint8, 255)):
        (tmp_path / "train" / name).mkdir(parents=True)
        Image.fromarray((np.ones((8, 8)) * scale).astype(dtype)).save(tmp_path / "train" / name / "0.png")
    dm = ImageFolderDataModule(str(tmp_path), img_size=8, num_workers=0, in_chans=1, mean=[0.5], std=[0.2])
    with pytest.raises(
        ValueError, match=r"disagree: .*a/0.png has 1 channel\(s\) of uint16, .*b/0.png has 1 of uint8"
    ):
        dm.setup()


def test_file_unlike_the_sample__skipped_by_name_when_loaded(tmp_path, caplog):
    root = _folder(tmp_path, "4band_tiff", per_class=3)
    odd = root / "train" / "b" / "odd.tif"
    tifffile.imwrite(odd, np.zeros((3, 20, 24), np.uint16), photometric="minisblack", planarconfig="separate")
    dm = ImageFolderDataModule(
        str(root), img_size=16, num_workers=0, in_chans=4, mean=[0.5] * 4, std=[0.3] * 4
    )
    dm.setup()
    index = [p for p, _ in dm.train_set.samples].index(str(odd))
    with caplog.at_level("WARNING"):
        assert dm.train_set[index][0].shape == (4, 16, 16)  # the next readable image
    assert "odd.tif has 3 channel(s) of uint16, unlike the rest of the folder (4 of uint16)" in caplog.text


def test_channels_that_do_not_fit__and_missing_statistics__say_what_to_set(tmp_path):
    root = _folder(tmp_path, "4band_tiff", per_class=1)
    with pytest.raises(ValueError, match="has 4 channel.* data.in_chans is 3; set data.in_chans: 4"):
        ImageFolderDataModule(str(root), img_size=16, num_workers=0).setup()
    with pytest.raises(
        ValueError, match=r"data.mean and data.std are needed for 4-channel data.*mae stats ROOT"
    ):
        ImageFolderDataModule(str(root), img_size=16, num_workers=0, in_chans=4)


def test_reconstruction_figure__gray_bands_and_the_data_range():
    views = {
        k: torch.zeros(1, 4, 8, 8) for k in ("original", "masked", "reconstruction", "reconstruction_visible")
    }
    views["original"][0, 2] = 1.0  # band 2 bright
    grid = reconstruction_grid(views, mean=(0.0,) * 4, std=(1.0,) * 4, bands=[2, 1, 0])
    assert grid[0, 2:10, 2:10].min() == 1 and grid[1:, 2:10, 2:10].max() == 0  # band 2 drawn as red
    gray = {k: torch.rand(1, 1, 8, 8) * 50 for k in views}
    picture = reconstruction_grid(gray, mean=(0.0,), std=(1.0,), value_range=None)  # float data, own range
    torch.testing.assert_close(picture[0], picture[1]) and torch.testing.assert_close(picture[1], picture[2])
    assert picture[:, 2:10, 2:10].max() == 1 and picture[:, 2:10, 2:10].min() == 0


# ---------------------------------------------------------------- starting from existing weights


def _official(model, path, encoder_only: bool = False):
    state = {
        k: v
        for k, v in model.state_dict().items()
        if not encoder_only or not (k.startswith("decoder") or k == "mask_token")
    }
    torch.save({"model": state}, path)
    return path


@pytest.mark.parametrize("encoder_only", [False, True])
def test_init_from__official_layout_loads_the_files_tensors_and_trains(tmp_path, encoder_only):
    torch.manual_seed(1)
    source = create_model("mae_vit_tiny_patch4", img_size=32, **TINY_KWARGS)  # another grid than 16x16
    path = _official(source, tmp_path / "mae_pretrain.pth", encoder_only)
    module = pretrain_module(init_from=str(path), optim=dict(warmup_epochs=0))
    loaded, fresh = module.model.state_dict(), pretrain_module(optim=dict(warmup_epochs=0)).model.state_dict()
    for key, value in source.state_dict().items():
        if key in ("pos_embed", "decoder_pos_embed"):
            torch.testing.assert_close(loaded[key], fresh[key])  # rebuilt for 16x16, not copied
        elif encoder_only and (key.startswith("decoder") or key == "mask_token"):
            torch.testing.assert_close(loaded[key], fresh[key])  # left as initialised
        else:
            torch.testing.assert_close(loaded[key], value)
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=RandomImages())
    assert trainer.global_step == 1 and not torch.equal(module.model.cls_token, source.cls_token)
    assert (
        "no decoder" in str(module.init_report)
        if encoder_only
        else "no decoder" not in str(module.init_report)
    )


def test_init_from__rgb_weights_into_one_channel_and_the_report_in_the_run_folder(tmp_path):
    source = create_model("mae_vit_tiny_patch4", img_size=16, **TINY_KWARGS)
    path = _official(source, tmp_path / "rgb.pth")
    module = pretrain_module(init_from=str(path), in_chans=1, optim=dict(warmup_epochs=0))
    summed = source.patch_embed.proj.weight.sum(1, keepdim=True)
    torch.testing.assert_close(module.model.patch_embed.proj.weight, summed)
    assert "adapted from 3 to 1 input channels" in str(module.init_report)
    gray = RandomImages()
    gray.data.tensors = (gray.data.tensors[0][:, :1], gray.data.tensors[1])
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0)
    trainer.fit(module, datamodule=gray)
    assert "adapted from 3 to 1" in (tmp_path / "init_from.txt").read_text()


def test_init_from__classifier_other_patch_size_and_non_checkpoints_refused(tmp_path):
    classifier = create_model("mae_vit_tiny_patch4", img_size=16, **TINY_KWARGS).state_dict()
    torch.save(
        {"model": {**classifier, "head.weight": torch.zeros(10, 32), "head.bias": torch.zeros(10)}},
        tmp_path / "finetuned.pth",
    )
    with pytest.raises(ValueError, match="finetuned.pth is a fine-tuned classifier"):
        pretrain_module(init_from=str(tmp_path / "finetuned.pth"))
    other = create_model("mae_vit_tiny_patch4", img_size=16, patch_size=8, **TINY_KWARGS)
    _official(other, tmp_path / "p8.pth")
    with pytest.raises(
        ValueError, match=r"p8.pth was pretrained with 8x8-pixel patches, but this model has 4x4"
    ):
        pretrain_module(init_from=str(tmp_path / "p8.pth"))
    wider = create_model(
        "mae_vit_tiny_patch4", img_size=16, **{**TINY_KWARGS, "embed_dim": 64, "num_heads": 4}
    )
    _official(wider, tmp_path / "wide.pth")
    with pytest.raises(
        ValueError, match=r"wide.pth does not fit.*cls_token has shape \(1, 1, 64\).*\(1, 1, 32\)"
    ):
        pretrain_module(init_from=str(tmp_path / "wide.pth"))
    (tmp_path / "notes.pth").write_text("https://example.org/weights.pth")
    with pytest.raises(ValueError, match="notes.pth is not a PyTorch/safetensors checkpoint"):
        pretrain_module(init_from=str(tmp_path / "notes.pth"))


def test_freeze_encoder_epochs__only_the_decoder_learns_first(tmp_path):
    module = pretrain_module(optim=dict(warmup_epochs=0), freeze_encoder_epochs=1)
    start = {k: v.clone() for k, v in module.model.state_dict().items()}
    changed = lambda key: not torch.equal(module.model.state_dict()[key], start[key])  # noqa: E731
    trainer = make_trainer(tmp_path, max_epochs=1, limit_train_batches=3, limit_val_batches=0)
    trainer.fit(module, datamodule=RandomImages())
    assert not changed("blocks.0.attn.qkv.weight") and not changed("cls_token") and not changed("norm.weight")
    assert changed("decoder_blocks.0.attn.qkv.weight") and changed("decoder_pred.weight")
    trainer = make_trainer(tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=0)
    trainer.fit(module, datamodule=RandomImages())
    assert changed("blocks.0.attn.qkv.weight")


def test_corrupt_tiff_and_truncated_npy__skipped_by_name_not_a_crash(tmp_path, caplog):
    root = _folder(tmp_path, "4band_tiff", per_class=3)
    (root / "train" / "a" / "0.tif").write_bytes(b"II*\x00 not the rest of a tiff")  # sampled at start-up too
    # truncated (and unlike the rest)
    (root / "train" / "b" / "9.npy").write_bytes(b"\x93NUMPY\x01\x00v\x00{")
    dm = ImageFolderDataModule(
        str(root), img_size=16, num_workers=0, in_chans=4, mean=[0.5] * 4, std=[0.3] * 4
    )
    dm.setup()
    with caplog.at_level("WARNING"):
        images = [dm.train_set[i][0] for i in range(len(dm.train_set))]
    assert all(img.shape == (4, 16, 16) for img in images)
    assert (
        "cannot read" in caplog.text
        and "0.tif as a TIFF" in caplog.text
        and "9.npy as an .npy array" in caplog.text
    )
