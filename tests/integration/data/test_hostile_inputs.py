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
from mae.data import ImageFolderDataModule
from mae.data.decoding.rgb import jpeg_size, to_rgb
from mae.data.sources.folder import ImageFolderSubset
from mae.data.views.crop import PretrainCrop
from mae.data.views.recipes import eval_transform
from mae.models import create_model
from mae.training.checkpointing import check_resume_checkpoint
from tests.helpers import TINY_KWARGS, RandomImages, make_trainer, pretrain_module, write_image_folder

# ---------------------------------------------------------------- bit depth


def _gray16(path, value: int, size=(24, 20)):
    Image.fromarray(np.full(size[::-1], value, np.uint16)).save(path)
    return path


def test_16bit_png__scaled_by_its_range_not_saturated(tmp_path):
    path = _gray16(tmp_path / "a.png", 128 * 257)  # mid-gray in 16 bits
    assert Image.open(path).mode == "I;16"
    assert np.asarray(to_rgb(Image.open(path))).tolist() == np.full((20, 24, 3), 128).tolist()  # was 255
    crop = PretrainCrop(8)(str(path))  # the pretraining path (reads the file itself)
    assert crop.dtype == torch.uint8 and crop.min() == crop.max() == 128
    evaluated = eval_transform(8, 1.0)(Image.open(path))  # the evaluation / fine-tuning path
    expected = (128 / 255 - 0.485) / 0.229
    torch.testing.assert_close(evaluated[0], torch.full((8, 8), expected), atol=1e-5, rtol=0)


def test_16bit_levels__black_white_and_every_257th_level_map_to_exact_8_bit_levels():
    """65535 / 257 = 255: 16-bit level 257 * v is 8-bit v, white stays white (no wrap past 255)."""
    levels = np.array([[0, 257, 128 * 257, 200 * 257 + 128, 65534, 65535]], np.uint16)
    assert np.asarray(to_rgb(Image.fromarray(levels)))[0, :, 0].tolist() == [0, 1, 128, 200, 255, 255]


def test_16bit_gradient__keeps_its_contrast_through_the_data_module(tmp_path):
    folder = tmp_path / "train" / "a"
    folder.mkdir(parents=True)
    ramp = np.linspace(0, 65535, 32).astype(np.uint16)[None].repeat(32, 0)
    for i in range(2):
        Image.fromarray(ramp).save(folder / f"{i}.png")
    dm = ImageFolderDataModule(str(tmp_path), img_size=32, batch_size=2, num_workers=0, augmentation="none")
    dm.setup()
    img = dm.train_set[0][0]
    pixels = img[0] * 0.229 + 0.485  # back to [0, 1]
    assert pixels[0, 0] < 0.01 and pixels[0, -1] > 0.99 and (pixels[0, 1:] >= pixels[0, :-1] - 1e-6).all()


def test_float_tiff_and_int_images__scaled_or_refused_by_name(tmp_path):
    Image.fromarray(np.full((6, 6), 0.5, np.float32)).save(tmp_path / "f.tiff")
    assert np.asarray(to_rgb(Image.open(tmp_path / "f.tiff")))[0, 0].tolist() == [128, 128, 128]
    Image.fromarray(np.full((6, 6), 1000, np.int32)).save(tmp_path / "i.tiff")
    assert np.asarray(to_rgb(Image.open(tmp_path / "i.tiff")))[0, 0, 0] == round(1000 / 257)
    Image.fromarray(np.full((6, 6), 7.5, np.float32)).save(tmp_path / "big.tiff")
    with pytest.raises(ValueError, match=r"big.tiff of mode F: values 7.5..7.5 are outside the 0..1 range"):
        to_rgb(Image.open(tmp_path / "big.tiff"))
    Image.fromarray(np.full((6, 6), -3, np.int32)).save(tmp_path / "neg.tiff")
    with pytest.raises(ValueError, match=r"neg.tiff of mode I"):
        to_rgb(Image.open(tmp_path / "neg.tiff"))


# ---------------------------------------------------------------- folders


def test_symlink_loop__followed_once_and_reported(tmp_path, caplog):
    write_image_folder(tmp_path / "train", ["cat", "dog"], per_class=4)
    os.symlink("..", tmp_path / "train" / "cat" / "parent")  # cat/parent/cat/parent/... forever
    outside = write_image_folder(tmp_path / "elsewhere", ["more"], per_class=2) / "more"
    os.symlink(outside, tmp_path / "train" / "dog" / "more")  # a link to new images: followed
    with caplog.at_level("WARNING"):
        dataset = ImageFolderSubset(tmp_path / "train")
    labels = [label for _, label in dataset.samples]
    # cat: its 4 images; dog: 4 + 2 linked; the loop through parent/ adds nothing
    assert labels.count(0) == 4 and labels.count(1) == 6 and len(dataset) == 10
    assert "cat/parent" in caplog.text and "skipped" in caplog.text


def test_folder_listing__same_order_as_torchvision_without_links(tmp_path):
    from torchvision.datasets import ImageFolder

    root = write_image_folder(tmp_path / "train", ["b", "a"], per_class=3)
    write_image_folder(root / "a" / "sub", ["deeper"], per_class=2)
    assert ImageFolderSubset(root).samples == ImageFolder(str(root)).samples


# ---------------------------------------------------------------- decompression bombs


def test_jpeg_size__read_from_the_header_as_pil_does(tmp_path):
    for i, (size, progressive) in enumerate([((37, 50), False), ((640, 17), True), ((1, 1), False)]):
        path = tmp_path / f"{i}.jpg"
        Image.new("RGB", size, (10, 20, 30)).save(path, progressive=progressive, quality=80)
        assert jpeg_size(path.read_bytes()) == size


@pytest.mark.parametrize("fmt", ["jpg", "png"])
@pytest.mark.parametrize("augmentation", ["pretrain", "none"])
def test_images_over_the_pixel_limit__skipped_by_name_or_raised(tmp_path, caplog, fmt, augmentation):
    root = tmp_path / "data"
    write_image_folder(root / "train", ["a"], per_class=3, size=(20, 20))
    Image.new("RGB", (60, 50), (200, 0, 0)).save(root / "train" / "a" / f"zz_bomb.{fmt}")  # 3,000 pixels
    common = dict(img_size=16, batch_size=2, num_workers=0, augmentation=augmentation, max_image_pixels=1000)
    dm = ImageFolderDataModule(str(root), **common)
    dm.setup()
    with caplog.at_level("WARNING"):
        dm.train_set[3]  # the bomb's index: the next readable image takes its place
    assert f"zz_bomb.{fmt}" in caplog.text and "max_image_pixels" in caplog.text
    strict = ImageFolderDataModule(str(root), on_bad_image="raise", **common)
    strict.setup()
    with pytest.raises(ValueError, match=rf"zz_bomb.{fmt}.*60x50 = 3,000 pixels"):
        strict.train_set[3]


def test_pixel_limit__must_be_positive():
    with pytest.raises(ValueError, match="data.max_image_pixels"):
        ImageFolderDataModule("x", max_image_pixels=0)


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


def test_float_images__drawn_from_their_minimum_to_their_maximum(tmp_path):
    from mae.inference.images import display_range

    np.save(tmp_path / "reflectance.npy", np.full((4, 4, 2), 1500.0, np.float32))
    Image.fromarray(np.zeros((4, 4), np.uint16)).save(tmp_path / "scan.png")
    assert display_range([tmp_path / "scan.png"]) == (0.0, 1.0)
    assert display_range([tmp_path / "scan.png", tmp_path / "reflectance.npy"]) is None


def test_readers__an_npz_archive_named_npy_is_unreadable_by_name(tmp_path):
    from mae.data.decoding.formats import EncodedImage
    from mae.data.decoding.image import pixel_format

    path = tmp_path / "x.npy"
    with open(path, "wb") as f:
        np.savez(f, a=np.zeros((4, 4)))
    for source in (path, EncodedImage(path.read_bytes(), "s3://b/train:a/x.npy")):
        with pytest.raises(ValueError, match=rf"cannot read {source} as an .npy array: it holds a NpzFile"):
            pixel_format(source)
