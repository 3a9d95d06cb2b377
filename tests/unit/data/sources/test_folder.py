"""Image folders as data (``mae.data.sources.folder``): class selection, the training split, the
listing (links followed once, torchvision's order), 16-bit images through the data module, and images
over the pixel limit skipped by name or raised."""

import os

import numpy as np
import pytest
import torch
from PIL import Image

from mae.data import ImageFolderDataModule
from mae.data.sources.folder import ImageFolderSubset
from mae.data.views.normalize import normalize_batch
from tests.helpers import write_image_folder


@pytest.fixture
def imagenet_like(tmp_path):
    classes = ["n001", "n002", "n003", "n004"]
    write_image_folder(tmp_path / "train", classes, per_class=5)
    write_image_folder(tmp_path / "val", classes, per_class=2, seed=1)
    return tmp_path


def test_image_folder__all_classes_batches_and_report(imagenet_like, capsys):
    dm = ImageFolderDataModule(str(imagenet_like), img_size=32, batch_size=4, num_workers=0)
    dm.setup("fit")
    assert len(dm.train_set) == 20 and len(dm.train_set.classes) == 4 and len(dm.val_set) == 8
    imgs, labels = next(iter(dm.train_dataloader()))
    assert imgs.shape == (4, 3, 32, 32) and imgs.dtype == torch.uint8 and labels.shape == (4,)
    assert imgs.is_contiguous(memory_format=torch.channels_last)  # as the crops are stored
    imgs = normalize_batch(imgs)
    assert imgs.dtype == torch.float32 and imgs.min() < -0.5  # normalised, not [0, 1]


def test_image_folder__class_list_file_and_cap(imagenet_like, tmp_path):
    class_list = tmp_path / "classes.txt"
    class_list.write_text("# my subset\nn003\n\nn001  # trailing comment\n")
    dm = ImageFolderDataModule(
        str(imagenet_like), class_list=str(class_list), max_images_per_class=3, img_size=32, num_workers=0
    )
    dm.setup()
    assert dm.train_set.classes == ["n001", "n003"] and len(dm.train_set) == 6
    assert dm.val_set.classes == ["n001", "n003"] and len(dm.val_set) == 4
    assert sorted(set(dm.train_set.targets)) == [0, 1]


def test_image_folder__first_and_random_k_classes(imagenet_like):
    first = ImageFolderDataModule(str(imagenet_like), num_classes=2, img_size=32)
    first.setup()
    assert first.train_set.classes == ["n001", "n002"]
    picks = set()
    for seed in range(6):
        dm = ImageFolderDataModule(
            str(imagenet_like), num_classes=2, class_selection="random", subset_seed=seed
        )
        dm.setup()
        picks.add(tuple(dm.train_set.classes))
        again = ImageFolderDataModule(
            str(imagenet_like), num_classes=2, class_selection="random", subset_seed=seed
        )
        again.setup()
        assert again.train_set.classes == dm.train_set.classes  # seeded
    assert len(picks) > 1


def test_image_folder__class_list_naming_missing_classes_fails(imagenet_like, tmp_path):
    class_list = tmp_path / "classes.txt"
    class_list.write_text("n001\nn999\n")
    dm = ImageFolderDataModule(str(imagenet_like), class_list=str(class_list))
    with pytest.raises(FileNotFoundError, match="n999"):
        dm.setup()


def test_image_folder__missing_root_says_what_layout_is_expected(tmp_path):
    dm = ImageFolderDataModule(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="<class>/<image>"):
        dm.setup()


def test_image_folder__no_val_split_means_no_validation(tmp_path):
    write_image_folder(tmp_path / "train", ["a", "b"], per_class=3)
    dm = ImageFolderDataModule(str(tmp_path), img_size=32, batch_size=2, num_workers=0)
    dm.setup()
    assert dm.val_set is None and dm.val_dataloader() == []


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
