"""The built-in data (``mae.data.sources.builtin``): CIFAR's standard pickle files, read offline, and the
digits that ship with scikit-learn."""

import pytest
import torch

from mae.data import CIFARDataModule, DigitsDataModule
from tests.helpers import write_cifar


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
