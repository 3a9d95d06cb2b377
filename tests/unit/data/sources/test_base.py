"""The data modules' base (``mae.data.sources.base``): the batch of crops, the loader settings checked at
construction, and the labelled fraction of a split."""

import pytest
import torch

from mae.data import DigitsDataModule, pretrain_transform
from mae.data.sources.base import collate_images
from mae.data.views.normalize import normalize_batch
from tests.helpers import write_smooth_jpeg


def test_collate_images__channels_last_batch_of_crops_normalises_exactly(tmp_path):
    """Crops (stored H x W x C) stack into a channels-last batch without transposing; normalising it
    gives exactly the values of the contiguous batch. Other tensors collate as by default."""
    path = write_smooth_jpeg(tmp_path / "a.jpg", size=(120, 90))
    torch.manual_seed(0)
    crops = [pretrain_transform(32)(str(path)) for _ in range(4)]
    imgs, labels = collate_images([(c, i) for i, c in enumerate(crops)])
    assert imgs.shape == (4, 3, 32, 32) and imgs.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(imgs, torch.stack(crops).contiguous()) and labels.tolist() == [0, 1, 2, 3]
    normalised = normalize_batch(imgs)
    assert normalised.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(normalised, normalize_batch(imgs.contiguous()))
    assert normalize_batch(imgs.contiguous()).is_contiguous()
    floats = [torch.randn(3, 8, 8) for _ in range(3)]
    assert collate_images([(x, 0) for x in floats])[0].is_contiguous()
    # In a loader worker the batch is written straight into shared memory, layout kept.
    pairs = [(c, 0) for c in crops]
    loader = torch.utils.data.DataLoader(pairs, batch_size=4, num_workers=1, collate_fn=collate_images)
    from_worker, _ = next(iter(loader))
    assert torch.equal(from_worker, imgs) and from_worker.stride() == imgs.stride()


def test_datamodule__invalid_loader_settings_fail_at_construction():
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        DigitsDataModule(batch_size=0)
    with pytest.raises(ValueError, match="fewer than data.batch_size"):
        dm = DigitsDataModule(batch_size=5000)
        dm.setup()
        dm.train_dataloader()


def test_labelled_fraction__class_balanced_and_seeded():
    from mae.data.sources.subsets import labelled_fraction

    dm = DigitsDataModule(img_size=16)
    dm.train_fraction, dm.subset_seed = 0.1, 3
    dm.setup()
    labels = [dm.train_set.dataset.targets[i] for i in dm.train_set.indices]
    counts = torch.bincount(torch.tensor(labels), minlength=10)
    assert counts.sum() == len(dm.train_set) and torch.all(
        (counts >= 13) & (counts <= 16)
    )  # ~10% of ~144 each
    again = labelled_fraction(dm.train_set.dataset, 0.1, seed=3)
    assert again.indices == dm.train_set.indices
    assert labelled_fraction(dm.train_set.dataset, 0.1, seed=4).indices != dm.train_set.indices
    with pytest.raises(ValueError, match="fraction"):
        labelled_fraction(dm.train_set.dataset, 0.0)


def test_labelled_fraction__keeps_round_fraction_times_each_class_and_at_least_one():
    """5 images of class 0, 15 of class 1, 1 of class 2: half keeps round(2.5) = 2, round(7.5) = 8 and
    the lone image (never none of a class)."""
    from mae.data.sources.subsets import labelled_fraction

    dataset = torch.utils.data.TensorDataset(torch.zeros(21))
    dataset.targets = [0] * 5 + [1] * 15 + [2]
    kept = [dataset.targets[i] for i in labelled_fraction(dataset, 0.5, seed=0).indices]
    assert [kept.count(c) for c in (0, 1, 2)] == [round(2.5), round(7.5), 1] == [2, 8, 1]
