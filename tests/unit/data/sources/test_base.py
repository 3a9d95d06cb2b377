import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from mae.data import CIFARDataModule, DigitsDataModule, ImageFolderDataModule, pretrain_transform
from mae.data.sources.base import collate_images
from mae.data.views.crop import PretrainCrop
from mae.data.views.normalize import normalize_batch
from tests.helpers import write_cifar, write_image_folder


@pytest.fixture
def imagenet_like(tmp_path):
    classes = ["n001", "n002", "n003", "n004"]
    write_image_folder(tmp_path / "train", classes, per_class=5)
    write_image_folder(tmp_path / "val", classes, per_class=2, seed=1)
    return tmp_path


def _smooth_jpeg(path, size=(500, 375)):
    """A photo-like JPEG (smooth gradients plus texture), so resampling differences stay small."""
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(0)
    pixels = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (w + h) + 64], -1)
    pixels = np.clip(pixels + rng.normal(0, 8, pixels.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=90)
    return path


def _torchvision_pretrain(img_size):
    """The official pretraining transform, in torchvision terms."""
    return T.Compose(
        [
            T.RandomResizedCrop(img_size, scale=(0.2, 1.0), interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )


@pytest.mark.parametrize("fmt", ["jpg", "png"])
@pytest.mark.parametrize("img_size", [64, 320])  # down- and upsampling
def test_pretrain_crop__same_pixels_as_torchvision_recipe(tmp_path, fmt, img_size):
    """The random numbers and (to two intensity levels, 1 % of a level on average) the pixels of
    RandomResizedCrop(0.2-1, bicubic) + flip + ToTensor + Normalize on a PIL image, once normalised."""
    path = _smooth_jpeg(tmp_path / "a.jpg")
    if fmt == "png":
        Image.open(path).save(tmp_path / "a.png")
        path = tmp_path / "a.png"
    ours, reference = pretrain_transform(img_size), _torchvision_pretrain(img_size)
    one_level = 1 / 255 / 0.224  # one intensity step after normalisation (smallest std)
    for seed in range(6):
        torch.manual_seed(seed)
        expected, next_reference = reference(Image.open(path).convert("RGB")), torch.rand(1)
        torch.manual_seed(seed)
        got, next_ours = ours(Image.open(path)), torch.rand(1)
        assert got.dtype == torch.uint8 and got.shape == (3, img_size, img_size)
        diff = (normalize_batch(got[None])[0] - expected).abs()
        assert diff.max() <= 2.0001 * one_level and diff.mean() < 0.02 * one_level
        assert next_ours == next_reference  # the same random numbers consumed


def test_pretrain_crop__modes_and_broken_files(tmp_path):
    rng = np.random.default_rng(0)
    gray = tmp_path / "gray.jpg"
    Image.fromarray(rng.integers(0, 256, (40, 50), dtype=np.uint8)).save(gray)
    cmyk = tmp_path / "cmyk.jpg"
    Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).convert("CMYK").save(cmyk)
    for path in (gray, cmyk):
        torch.manual_seed(0)
        expected = _torchvision_pretrain(16)(Image.open(path).convert("RGB"))
        torch.manual_seed(0)
        got = normalize_batch(pretrain_transform(16)(Image.open(path))[None])[0]
        assert (got - expected).abs().max() < 0.02
    truncated = tmp_path / "truncated.jpg"
    data = gray.read_bytes()
    truncated.write_bytes(data[: len(data) * 2 // 3])  # header intact, scan data cut
    with pytest.raises(OSError, match="truncated.jpg"):
        pretrain_transform(16)(Image.open(truncated))
    with pytest.raises(OSError, match="missing.jpg"):  # e.g. deleted after the folder was listed
        pretrain_transform(16)(str(tmp_path / "missing.jpg"))


@pytest.mark.parametrize("fmt", ["jpg", "png"])
def test_pretrain_crop__file_path_gives_the_crop_of_the_opened_image(tmp_path, fmt):
    """Datasets hand ``PretrainCrop`` file paths (no PIL header parse for JPEGs): same pixels, same
    random numbers as for the opened PIL image."""
    path = _smooth_jpeg(tmp_path / "a.jpg", size=(120, 90))
    if fmt == "png":
        Image.open(path).save(tmp_path / "a.png")
        path = tmp_path / "a.png"
    crop = pretrain_transform(48)
    for seed in range(4):
        torch.manual_seed(seed)
        from_image, after_image = crop(Image.open(path)), torch.rand(1)
        torch.manual_seed(seed)
        from_path, after_path = crop(str(path)), torch.rand(1)
        assert torch.equal(from_path, from_image) and after_path == after_image


def test_collate_images__channels_last_batch_of_crops_normalises_exactly(tmp_path):
    """Crops (stored H x W x C) stack into a channels-last batch without transposing; normalising it
    gives exactly the values of the contiguous batch. Other tensors collate as by default."""
    path = _smooth_jpeg(tmp_path / "a.jpg", size=(120, 90))
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


def test_pretrain_transform__official_recipe():
    crop = pretrain_transform(224)
    assert isinstance(crop, PretrainCrop)
    assert crop.size == (224, 224) and crop.scale == (0.2, 1.0) and crop.ratio == (3 / 4, 4 / 3)


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
