"""The data layer's rules, each written once: which endings are images, the RGB-or-array rule, the one
random crop of every path, the training-split check, and normalisation in one place."""

import numpy as np
import pytest
import torch
from PIL import Image

from mae.data import ImageFolderDataModule
from mae.data.decoding.formats import READERS, dataset_extensions, reader_of
from mae.data.decoding.image import pixel_format, read_pixels
from mae.data.decoding.route import PixelFormat, reads_as_rgb
from mae.data.sources.layout import sample_pixels
from mae.data.views.arrays import ArrayView
from mae.data.views.crop import CROP_RATIO, CROP_SCALE, PretrainCrop
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD
from tests.helpers import finetune_module, pretrain_module, write_image_folder


def test_extensions__one_table_for_datasets_and_own_images():
    from torchvision.datasets.folder import IMG_EXTENSIONS

    assert dataset_extensions(arrays=False) == IMG_EXTENSIONS  # the ImageFolder convention, in its order
    assert dataset_extensions(arrays=True) == (*dataset_extensions(arrays=False), ".npy")
    assert ".gif" in READERS and ".gif" not in dataset_extensions(arrays=True)  # given by name it is read
    assert [reader_of(name) for name in ("a.JPG", "b.TIF", "c.npy", "d.unknown")] == [
        "pil",
        "tiff",
        "npy",
        "pil",
    ]


@pytest.mark.parametrize(
    ("pixels", "in_chans", "rgb"),
    [
        (PixelFormat(3, "uint8"), 3, True),  # 8-bit RGB JPEG / PNG
        (PixelFormat(1, "uint8"), 3, True),  # grayscale, converted to RGB
        (PixelFormat(4, "uint8"), 3, True),  # RGBA, converted as PIL does
        (PixelFormat(1, "uint8"), 1, False),  # a 1-channel model keeps one band
        (PixelFormat(1, "uint16"), 3, False),  # 16-bit keeps its depth
        (PixelFormat(3, "uint8", array_file=True), 3, False),  # TIFF and .npy: the array reader
        (PixelFormat(1, "float32"), 3, False),
    ],
)
def test_reading_path__one_rule(pixels, in_chans, rgb):
    assert reads_as_rgb(in_chans, pixels.rgb_readable) is rgb


def test_reading_path__the_folder_sample_applies_the_rule(tmp_path):
    write_image_folder(tmp_path / "rgb", ["a", "b"], 2)
    sample = sample_pixels(tmp_path / "rgb", ["a", "b"])
    assert sample.rgb_readable and not sample.array_path(3) and sample.array_path(1) is True
    assert sample.expected(3) is None  # the RGB path converts any 8-bit mode
    with pytest.raises(ValueError, match="has 3 channel\\(s\\) but data.in_chans is 2"):
        sample.expected(2)
    (tmp_path / "scan" / "a").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint16)).save(tmp_path / "scan" / "a" / "x.png")
    sample = sample_pixels(tmp_path / "scan", ["a"])
    assert (
        sample.array_path(3) and sample.expected(1) == (1, "uint16") and sample.expected(3) == (1, "uint16")
    )


def test_read_pixels__the_array_entry_point_checks_scales_and_adapts(tmp_path):
    path = tmp_path / "x.png"
    Image.fromarray(np.full((4, 6), 65535, np.uint16)).save(path)
    assert pixel_format(path) == PixelFormat(1, "uint16", False)
    gray = read_pixels(path)
    assert gray.shape == (4, 6, 1) and gray.dtype == np.float32 and np.all(gray == 1.0)
    assert read_pixels(path, in_chans=3).shape == (4, 6, 3)
    with pytest.raises(
        ValueError, match="x.png has 1 channel\\(s\\) of uint16, unlike the rest of the folder"
    ):
        read_pixels(path, expected=(1, "uint8"))


def test_random_crop__the_rgb_and_the_array_paths_crop_the_same_box(tmp_path):
    """Same seed, same 8-bit image: the uint8 crop and the float array view draw one box and one flip
    (``random_crop``), so they agree up to the two paths' rounding."""
    rng = np.random.default_rng(0)
    path = tmp_path / "x.png"
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(path)
    assert PretrainCrop(16).scale == CROP_SCALE["pretrain"] and PretrainCrop.ratio == CROP_RATIO
    for seed in range(5):
        torch.manual_seed(seed)
        uint8_crop = PretrainCrop(16)(str(path)).float() / 255
        torch.manual_seed(seed)
        view = ArrayView("pretrain", 16, 3, tuple(IMAGENET_MEAN), tuple(IMAGENET_STD))(path)
        float_crop = view * torch.tensor(IMAGENET_STD).view(-1, 1, 1) + torch.tensor(IMAGENET_MEAN).view(
            -1, 1, 1
        )
        assert (uint8_crop - float_crop).abs().mean() < 0.01  # a different box would differ by ~0.3


def test_training_split__one_message_for_folders(tmp_path):
    write_image_folder(tmp_path / "images" / "training", ["a"], 1)
    data = ImageFolderDataModule(str(tmp_path / "images"), num_workers=0)
    expected = (
        r"has no split 'train': training folder .*/train does not exist; expected the ImageNet layout .* "
        r"\(set data.root / data.train_split\); it has training"
    )
    with pytest.raises(FileNotFoundError, match=expected):
        data.selected_classes()


def test_training_split__a_nested_split_path_is_a_folder_like_any(tmp_path):
    write_image_folder(tmp_path / "images" / "2024" / "train", ["a", "b", "c"], 1)
    assert (
        ImageFolderDataModule(str(tmp_path / "images"), train_split="2024/train", num_workers=0).num_labels
        == 3
    )


def test_normalisation__pretraining_refuses_a_batch_no_data_module_normalised():
    module = pretrain_module()
    batch = (torch.zeros(2, 3, 16, 16, dtype=torch.uint8), torch.zeros(2))
    with pytest.raises(
        TypeError, match="got a uint8 batch: a data module derived from mae.data.ImageDataModule"
    ):
        module.training_step(batch, 0)


def test_schedule_settings__both_modules_refuse_them_at_build():
    for build in (pretrain_module, finetune_module):
        with pytest.raises(ValueError, match="need warmup_epochs >= 0, min_lr >= 0 and a positive lr"):
            build(optim=dict(warmup_epochs=-1))
        with pytest.raises(ValueError, match="need warmup_epochs >= 0"):
            build(optim=dict(lr=0.0))
