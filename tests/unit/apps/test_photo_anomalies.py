"""The photo anomaly task's writer (``benchmarks/photo_anomalies.py``): the MVTec AD layout the reader
accepts, defects that change exactly their ground-truth region and visibly, the same bytes for the same
seed, and a folder it did not write refused."""

import json

import numpy as np
import photo_anomalies
import pytest
from PIL import Image

from mae.apps.anomaly.layout import read_test_set
from mae.errors import ConfigError, InputError


def photos(count: int = 48) -> tuple[np.ndarray, list[str], list[str]]:
    """(count, 32, 32, 3) uint8 textured images: cats and dogs alternating, the first half train."""
    rng = np.random.default_rng(7)
    coarse = rng.integers(0, 256, (count, 8, 8, 3), dtype=np.uint8)
    images = np.stack([np.asarray(Image.fromarray(c).resize((32, 32), Image.BICUBIC)) for c in coarse])
    return images, ["cat", "dog"] * (count // 2), ["train"] * (count // 2) + ["val"] * (count // 2)


def read(path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_photo_anomalies__each_defect_changes_exactly_its_region_and_visibly(tmp_path):
    images, labels, splits = photos()
    root = photo_anomalies.write_photo_anomalies(tmp_path / "task", images, labels, splits, seed=3)
    train = sorted((root / "train" / "good").iterdir())
    assert [p.name for p in train] == [f"{i:04d}.png" for i in range(0, 24, 2)]
    assert all((read(p) == images[int(p.stem)]).all() for p in train)
    test_set = read_test_set(root / "test")
    assert test_set.has_masks and set(test_set.kinds) == {"good", *photo_anomalies.DEFECTS}
    assert sorted(int(i.path.stem) for i in test_set.images) == list(range(24, 48, 2))
    for image in test_set.images:
        seen, clean = read(image.path).astype(int), images[int(image.path.stem)].astype(int)
        if image.kind == "good":
            assert (seen == clean).all()
            continue
        region = read(image.mask) > 0
        assert region.sum() >= 9 and (seen[~region] == clean[~region]).all(), image.path
        assert np.abs(seen - clean)[region].mean() >= photo_anomalies.VISIBLE * 255, image.path
    assert json.loads((root / "anomalies.json").read_text())["seed"] == 3


def test_photo_anomalies__the_same_seed_writes_the_same_bytes_and_another_seed_other_defects(tmp_path):
    images, labels, splits = photos()

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    first = files(photo_anomalies.write_photo_anomalies(tmp_path / "a", images, labels, splits, seed=1))
    again = files(photo_anomalies.write_photo_anomalies(tmp_path / "b", images, labels, splits, seed=1))
    other = files(photo_anomalies.write_photo_anomalies(tmp_path / "c", images, labels, splits, seed=2))
    assert first == again
    assert {p for p in first if p.parts[0] == "test"} != {p for p in other if p.parts[0] == "test"}


def test_photo_anomalies__refuses_a_folder_it_did_not_write_and_other_photos(tmp_path):
    images, labels, splits = photos()
    write = photo_anomalies.write_photo_anomalies
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="holds no photo anomaly tasks"):
        write(tmp_path / "mine", images, labels, splits)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    root = write(tmp_path / "task", images, labels, splits, seed=0)
    assert write(root, images, labels, splits, seed=0) == root  # the same task: reused
    changed = images.copy()
    changed[0, 0, 0] ^= 1
    with pytest.raises(InputError, match="photos_sha256"):
        write(root, changed, labels, splits, seed=0)
    with pytest.raises(InputError, match="'seed': \\(0, 1\\)"):
        write(root, images, labels, splits, seed=1)
    with pytest.raises(ConfigError, match="uint8"):
        write(tmp_path / "new", images.astype(np.float32), labels, splits)
