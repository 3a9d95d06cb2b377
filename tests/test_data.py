import pytest
import torch
from torchvision import transforms as T

from mae.data import CIFARDataModule, DigitsDataModule, ImageFolderDataModule, pretrain_transform
from tests.helpers import write_cifar, write_image_folder


@pytest.fixture
def imagenet_like(tmp_path):
    classes = ["n001", "n002", "n003", "n004"]
    write_image_folder(tmp_path / "train", classes, per_class=5)
    write_image_folder(tmp_path / "val", classes, per_class=2, seed=1)
    return tmp_path


def test_pretrain_transform__official_recipe():
    ops = pretrain_transform(224).transforms
    crop = next(t for t in ops if isinstance(t, T.RandomResizedCrop))
    assert crop.size == (224, 224) and crop.scale == (0.2, 1.0)
    assert crop.interpolation == T.InterpolationMode.BICUBIC
    assert any(isinstance(t, T.RandomHorizontalFlip) for t in ops)
    norm = next(t for t in ops if isinstance(t, T.Normalize))
    assert tuple(norm.mean) == (0.485, 0.456, 0.406) and tuple(norm.std) == (0.229, 0.224, 0.225)


def test_image_folder__all_classes_batches_and_report(imagenet_like, capsys):
    dm = ImageFolderDataModule(str(imagenet_like), img_size=32, batch_size=4, num_workers=0)
    dm.setup("fit")
    assert len(dm.train_set) == 20 and len(dm.train_set.classes) == 4 and len(dm.val_set) == 8
    imgs, labels = next(iter(dm.train_dataloader()))
    assert imgs.shape == (4, 3, 32, 32) and imgs.dtype == torch.float32 and labels.shape == (4,)
    assert imgs.min() < -0.5  # normalised, not [0, 1]


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
        dm = ImageFolderDataModule(str(imagenet_like), num_classes=2, class_selection="random", subset_seed=seed)
        dm.setup()
        picks.add(tuple(dm.train_set.classes))
        again = ImageFolderDataModule(str(imagenet_like), num_classes=2, class_selection="random", subset_seed=seed)
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


@pytest.mark.parametrize("name, num_classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar__reads_standard_pickle_files(tmp_path, name, num_classes):
    write_cifar(tmp_path, name)
    dm = CIFARDataModule(str(tmp_path), dataset=name, img_size=32, batch_size=8, num_workers=0)
    dm.setup()
    assert len(dm.train_set) == 50 and len(dm.val_set) == 10 and len(dm.train_set.classes) == num_classes
    imgs, labels = next(iter(dm.train_dataloader()))
    assert imgs.shape == (8, 3, 32, 32)


def test_cifar__missing_files_error_names_folder_and_download_option(tmp_path):
    dm = CIFARDataModule(str(tmp_path), dataset="cifar10")
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py.*data.download=true"):
        dm.setup()


def test_digits__offline_builtin_data():
    dm = DigitsDataModule(img_size=32, batch_size=16)
    dm.setup()
    assert len(dm.train_set) == 1437 and len(dm.val_set) == 360
    imgs, labels = next(iter(dm.val_dataloader()))
    assert imgs.shape == (16, 3, 32, 32)
    assert torch.allclose(imgs[:, 0] * 0.229 + 0.485, imgs[:, 1] * 0.224 + 0.456, atol=1e-5)  # grey -> RGB


def test_datamodule__invalid_loader_settings_fail_at_construction():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        DigitsDataModule(batch_size=0)
    with pytest.raises(ValueError, match="fewer than data.batch_size"):
        dm = DigitsDataModule(batch_size=5000)
        dm.setup()
        dm.train_dataloader()


def test_labelled_fraction__class_balanced_and_seeded():
    from mae.data.datasets import labelled_fraction

    dm = DigitsDataModule(img_size=16)
    dm.train_fraction, dm.subset_seed = 0.1, 3
    dm.setup()
    labels = [dm.train_set.dataset.targets[i] for i in dm.train_set.indices]
    counts = torch.bincount(torch.tensor(labels), minlength=10)
    assert counts.sum() == len(dm.train_set) and torch.all((counts >= 13) & (counts <= 16))  # ~10% of ~144 each
    again = labelled_fraction(dm.train_set.dataset, 0.1, seed=3)
    assert again.indices == dm.train_set.indices
    assert labelled_fraction(dm.train_set.dataset, 0.1, seed=4).indices != dm.train_set.indices
    with pytest.raises(ValueError, match="fraction"):
        labelled_fraction(dm.train_set.dataset, 0.0)
