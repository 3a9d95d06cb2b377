"""The built-in digit scenes (``mae.data.sources.digit_scenes``): written once in COCO format with
semantic masks that agree with the boxes and the run-length encodings, the same bytes for the same
parameters, and bad parameters refused by name. The modules that read them share one set of parameters:
``test_loader_workers.py``."""

import json

import numpy as np
import pytest
from PIL import Image

from mae.data.sources.digit_scenes import rle_counts, write_digit_scenes

SMALL = dict(num_train=3, num_val=2, canvas=32, digit_size=(8, 14), seed=0)


def _decode_rle(counts: list[int], height: int, width: int) -> np.ndarray:
    flat = np.concatenate([np.full(n, i % 2, np.uint8) for i, n in enumerate(counts)])
    return flat.reshape(width, height).T  # column-major


def test_rle_counts__column_major_runs_starting_with_the_zeros():
    mask = np.array([[0, 1, 1], [0, 1, 0]], bool)
    assert rle_counts(mask) == [2, 3, 1]  # columns: 0 0 | 1 1 | 1 0
    assert rle_counts(np.ones((2, 2), bool)) == [0, 4]
    random = np.random.default_rng(0).random((5, 7)) > 0.5
    assert (_decode_rle(rle_counts(random), 5, 7) == random).all()


def test_write_digit_scenes__coco_annotations_agree_with_the_masks_and_the_images(tmp_path):
    root = write_digit_scenes(tmp_path / "scenes", **SMALL)
    coco = json.loads((root / "annotations" / "instances_train.json").read_text())
    assert [c["name"] for c in coco["categories"]] == [str(d) for d in range(10)]
    assert len(coco["images"]) == 3 and coco["annotations"]
    for ann in coco["annotations"]:
        image = next(i for i in coco["images"] if i["id"] == ann["image_id"])
        semantic = np.asarray(Image.open(root / "masks" / "train" / image["file_name"]))
        instance = _decode_rle(ann["segmentation"]["counts"], image["height"], image["width"])
        assert (semantic[instance.astype(bool)] == ann["category_id"]).all()  # digit d is d + 1
        x, y, w, h = ann["bbox"]
        ys, xs = np.nonzero(instance)
        assert (x, y, x + w, y + h) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        assert ann["area"] == instance.sum()
        assert Image.open(root / "images" / "train" / image["file_name"]).size == (32, 32)
    assert len(list((root / "images" / "val").glob("*.png"))) == 2


def test_write_digit_scenes__the_same_parameters_reuse_the_files_other_ones_are_refused(tmp_path):
    root = write_digit_scenes(tmp_path / "scenes", **SMALL)
    again = write_digit_scenes(tmp_path / "again", **SMALL)
    for path in sorted((root / "images" / "train").glob("*.png")):
        assert path.read_bytes() == (again / "images" / "train" / path.name).read_bytes()
    stamp = (root / "scenes.json").stat().st_mtime_ns
    assert write_digit_scenes(root, **SMALL) == root and (root / "scenes.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="scenes"):
        write_digit_scenes(root, **{**SMALL, "seed": 1})


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(num_val=0), "at least one scene per split, got num_train=3, num_val=0"),
        (dict(digit_size=(6, 14)), r"digit_size must be \(low, high\) with 8 <= low <= high <= canvas=32"),
        (dict(digits_per_scene=(2, 1)), r"digits_per_scene must be \(fewest, most\)"),
        (dict(noise=0.5), r"noise must be in \[0, 0.3\)"),
    ],
)
def test_write_digit_scenes__bad_parameters_are_named(tmp_path, bad, message):
    with pytest.raises(ValueError, match=message):
        write_digit_scenes(tmp_path / "scenes", **{**SMALL, **bad})
    assert not (tmp_path / "scenes").exists()
