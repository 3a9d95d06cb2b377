"""COCO-format detection data (reading, the start-up checks, the data modules), the built-in digit scenes
and the detection mAP (against pycocotools' COCOeval run directly, and by hand)."""

import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from sklearn.datasets import load_digits
from torch.nn import functional as F
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.transform import resize_boxes
from torchvision.transforms import v2

from mae.convert.backbone import build_vit
from mae.data.sources import digit_scenes as scenes_module
from mae.data.sources.digit_scenes import THRESHOLD, write_digit_scenes
from mae.dense.data import coco as coco_module
from mae.dense.data.coco import CocoDetection
from mae.dense.data.detection import DetectionDataModule, DigitScenesDataModule
from mae.dense.metrics.detection import DetectionMetrics
from mae.dense.models.pyramid import SimpleFeaturePyramid
from mae.models import create_model
from tests.helpers import TINY_KWARGS

SCENES = dict(num_train=12, num_val=6)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    return write_digit_scenes(tmp_path_factory.mktemp("dense") / "scenes", **SCENES)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- the digit scenes ---


def test_scenes__written_and_read_back_with_consistent_boxes_masks_and_semantic_maps(scenes):
    assert json.loads((scenes / "scenes.json").read_text())["num_train"] == 12
    for split, count in (("train", 12), ("val", 6)):
        data = CocoDetection(
            scenes / f"annotations/instances_{split}.json", scenes / f"images/{split}", masks=True
        )
        assert len(data) == count and data.category_names == tuple("0123456789") and data.num_categories == 10
        assert data.category_ids == {d: d for d in range(1, 11)}
        for i in range(count):
            image, target = data[i]
            assert (
                image.shape == (3, 64, 64)
                and image.dtype == torch.float32
                and 0 <= image.min() <= image.max() <= 1
            )
            boxes, masks, labels = target["boxes"], target["masks"], target["labels"]
            assert 1 <= len(boxes) <= 3 and masks.shape == (len(boxes), 64, 64)
            assert (boxes >= 0).all() and (boxes <= 64).all()
            for box, mask in zip(boxes, masks, strict=True):  # the box is the mask's tight box
                rows, cols = mask.nonzero(as_tuple=True)
                assert box.tolist() == [cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]
            assert (masks.sum(0) <= 1).all()  # the digits do not overlap
            semantic = torch.from_numpy(np.array(Image.open(scenes / f"masks/{split}/{i:06d}.png")))
            assert semantic.dtype == torch.uint8 and semantic.shape == (64, 64)
            # label = digit + 1, as the semantic map's
            expected = (masks.long() * labels[:, None, None]).sum(0)
            assert torch.equal(semantic.long(), expected)


def test_scenes__train_and_val_draw_on_disjoint_digit_scans(scenes):
    digits = load_digits()
    used = {}
    for split in ("train", "val"):
        data = json.loads((scenes / f"annotations/instances_{split}.json").read_text())
        used[split] = {a["digit_index"] for a in data["annotations"]}
        for a in data["annotations"]:
            index = a["digit_index"]
            assert digits.target[index] == a["category_id"] - 1
            mask = mask_utils.decode(mask_utils.frPyObjects(a["segmentation"], 64, 64)).astype(bool)
            x, y, w, h = a["bbox"]
            scan = torch.from_numpy(digits.images[index] / 16.0).float()[None, None]
            # the mask is the scan's, at one of the allowed sides (an independent redraw of it)
            redrawn = [
                F.interpolate(scan, size=(s, s), mode="bilinear")[0, 0].numpy() > THRESHOLD
                for s in range(20, 33)
            ]
            tight = [m[np.ix_(m.any(1), m.any(0))] for m in redrawn]
            assert any(t.shape == (h, w) and (t == mask[y : y + h, x : x + w]).all() for t in tight), a["id"]
    assert all(i % 5 != 0 for i in used["train"]) and all(i % 5 == 0 for i in used["val"])
    assert not used["train"] & used["val"]


def test_scenes__the_same_bytes_for_a_seed(tmp_path):
    small = dict(num_train=3, num_val=2)
    a, b = write_digit_scenes(tmp_path / "a", **small), write_digit_scenes(tmp_path / "b", **small)
    assert _files(a) == _files(b)
    other = _files(write_digit_scenes(tmp_path / "c", **small, seed=1))
    assert other.keys() == _files(a).keys() and other != _files(a)


def test_scenes__reused_when_the_same_refused_when_not_and_never_half_written(tmp_path, monkeypatch):
    root = write_digit_scenes(tmp_path / "s", num_train=2, num_val=1)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    assert write_digit_scenes(root, num_train=2, num_val=1) == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before  # reused, not rewritten
    with pytest.raises(
        ValueError, match=rf"{root} holds digit scenes written with other parameters.*num_train"
    ):
        write_digit_scenes(root, num_train=3, num_val=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'other'} is not empty and holds no digit scenes"):
        write_digit_scenes(tmp_path / "other")
    saved = []

    def fail_on_third(image, path):
        if len(saved) == 2:
            raise OSError("disk full")
        saved.append(path)
        image.save(path.parent.mkdir(parents=True, exist_ok=True) or path, format="PNG")

    monkeypatch.setattr(scenes_module, "_save_png", fail_on_third)
    with pytest.raises(OSError, match="disk full"):
        write_digit_scenes(tmp_path / "killed", num_train=2, num_val=1)
    assert saved and not (tmp_path / "killed").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "s"]  # no temporary folder left either


# --- COCO files: reading and the start-up checks ---


def _coco(tmp_path: Path, edit=None, sizes=((20, 16), (24, 18), (20, 16))) -> tuple[Path, Path]:
    """A small valid COCO task (images of ``sizes`` (width, height), 3 annotations, categories 2, 5 and
    90), after ``edit(data)``; returns (JSON file, image folder)."""
    folder = tmp_path / "images"
    folder.mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes, start=1):
        Image.new("RGB", size, (i * 40, 0, 0)).save(folder / f"{i}.png")
    compressed = mask_utils.encode(np.asfortranarray(_box_mask(16, 20, 2, 3, 6, 5)))["counts"].decode()
    square = {"size": [16, 20], "counts": compressed}
    data = {
        "images": [
            {"id": i, "file_name": f"{i}.png", "width": w, "height": h} for i, (w, h) in enumerate(sizes, 1)
        ],
        "annotations": [
            {
                "id": 11,
                "image_id": 1,
                "category_id": 5,
                "bbox": [2, 3, 4, 2],
                "iscrowd": 0,
                "segmentation": square,
            },
            {
                "id": 12,
                "image_id": 2,
                "category_id": 90,
                "bbox": [1.0, 1.0, 10.0, 8.0],
                "iscrowd": 0,
                "segmentation": [[1, 1, 11, 1, 11, 9, 1, 9]],
            },
            {
                "id": 13,
                "image_id": 2,
                "category_id": 2,
                "bbox": [12, 2, 5, 5],
                "iscrowd": 0,
                "segmentation": {
                    "size": [18, 24],
                    "counts": [2 + 12 * 18, 5, 13, 5, 13, 5, 13, 5, 13, 5, 137],
                },
            },
        ],
        "categories": [
            {"id": 90, "name": "toaster"},
            {"id": 2, "name": "bicycle"},
            {"id": 5, "name": "airplane"},
        ],
    }
    if edit is not None:
        edit(data)
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    return path, folder


def _box_mask(height: int, width: int, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    mask = np.zeros((height, width), np.uint8)
    mask[y0:y1, x0:x1] = 1
    return mask


def test_coco__contiguous_labels_masks_of_every_format_and_transforms_that_move_them(tmp_path):
    data = CocoDetection(*_coco(tmp_path), masks=True)
    assert data.category_names == ("bicycle", "airplane", "toaster")  # sorted by COCO id 2, 5, 90
    assert data.category_ids == {1: 2, 2: 5, 3: 90} and data.num_categories == 3 and len(data) == 3
    image, target = data[1]
    assert image.shape == (3, 18, 24) and target["image_id"] == 2 and target["labels"].tolist() == [3, 1]
    assert target["boxes"].tolist() == [[1, 1, 11, 9], [12, 2, 17, 7]] and target["iscrowd"].tolist() == [
        0,
        0,
    ]
    polygon, rle = target["masks"]
    assert polygon.sum() > 0 and polygon[1:9, 1:11].sum() == polygon.sum()  # the polygon's square
    assert torch.equal(rle, torch.from_numpy(_box_mask(18, 24, 12, 2, 17, 7)))  # uncompressed RLE
    # compressed RLE
    assert torch.equal(data[0][1]["masks"][0], torch.from_numpy(_box_mask(16, 20, 2, 3, 6, 5)))
    # kept for validation
    assert data[2][1]["boxes"].shape == (0, 4) and data[2][1]["masks"].shape == (0, 16, 20)
    flipped = CocoDetection(*_coco(tmp_path), masks=True, transforms=v2.RandomHorizontalFlip(p=1.0))
    _, target = flipped[0]
    assert target["boxes"].tolist() == [[14, 3, 18, 5]]
    assert torch.equal(target["masks"][0], torch.from_numpy(_box_mask(16, 20, 14, 3, 18, 5)))


def test_coco__crowds_empty_images_and_zero_size_boxes_left_out_by_name(tmp_path, monkeypatch):
    def edit(data):
        data["annotations"] += [
            {"id": 14, "image_id": 3, "category_id": 2, "bbox": [1, 1, 5, 5], "iscrowd": 1},
            {"id": 15, "image_id": 1, "category_id": 2, "bbox": [4, 4, 3, 0.0]},  # COCO train2017 has two
            {"id": 16, "image_id": 1, "category_id": 2, "bbox": [15.5, 10, 5.3, 6.8]},  # 0.8 px past: clipped
        ]

    messages = []
    monkeypatch.setattr(coco_module, "rank_zero_info", messages.append)
    train = CocoDetection(*_coco(tmp_path, edit), train=True)
    assert [train[i][1]["image_id"] for i in range(len(train))] == [1, 2]  # image 3 holds only a crowd
    assert train[0][1]["boxes"].tolist() == [[2, 3, 6, 5], [15.5, 10, 20, 16]]
    (report,) = messages
    assert str(tmp_path / "instances.json") in report and "2 images, 4 annotations in 3 categories" in report
    assert "1 crowd annotations (iscrowd=1) (ids 14)" in report
    assert (
        "1 annotations with a box of zero width or height (or under 1e-05 of its image's) (ids 15)" in report
    )
    assert "1 images without annotations (training split) (ids 3)" in report
    val = CocoDetection(*_coco(tmp_path, edit))
    assert len(val) == 3 and val[2][1]["iscrowd"].tolist() == [1]  # the crowd kept, marked, for the mAP
    assert "crowd annotations" not in messages[-1] and "zero width" in messages[-1]


def _compressed(mask: np.ndarray) -> str:
    """pycocotools' compressed RLE counts of a (H, W) mask."""
    return mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode()


def _set(path: str, value):
    """An edit that sets ``data[k1][k2]... = value`` (``path`` "k1.k2..."; integers index lists)."""

    def edit(data):
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        for key in parents:
            data = data[key]
        data[last] = value

    return edit


BAD_INPUTS = {
    "not COCO": (lambda d: d.pop("images"), ValueError, ["is not COCO-format: it has no 'images'"]),
    "wrong type": (
        _set("images.0.width", "20"),
        ValueError,
        ["image id 1 has width='20'", "a positive integer"],
    ),
    "unknown image": (
        _set("annotations.1.image_id", 99),
        ValueError,
        ["not in 'images'", "annotation id 12 (image_id 99)"],
    ),
    "unknown category": (
        _set("annotations.0.category_id", 7),
        ValueError,
        ["not in 'categories'", "annotation id 11 (category_id 7)", "[2, 5, 90]"],
    ),
    "negative size": (
        _set("annotations.0.bbox", [6, 3, -4, 2]),
        ValueError,
        ["negative width or height", "annotation id 11 bbox [6, 3, -4, 2]", "not [x0, y0, x1, y1]"],
    ),
    "box outside": (
        _set("annotations.1.bbox", [1, 1, 30, 8]),
        ValueError,
        ["more than 1 px outside", "annotation id 12 bbox [1, 1, 30, 8] in image id 2 of 24x18 px"],
    ),
    "malformed box": (
        _set("annotations.1.bbox", [1, 1, 3]),
        ValueError,
        ["annotation id 12 has bbox=[1, 1, 3]"],
    ),
    "missing file": (
        _set("images.2.file_name", "gone.png"),
        FileNotFoundError,
        ["images missing under", "image id 3 file_name 'gone.png'"],
    ),
    "wrong size": (
        _set("images.2.width", 32),
        ValueError,
        ["image id 3 file", "is 20x16 px, the JSON says 32x16"],
    ),
    "RLE size": (
        _set("annotations.0.segmentation.size", [20, 16]),
        ValueError,
        ["annotation id 11 RLE size [20, 16] in image id 1 of 16x20"],
    ),
    "no segmentation": (
        lambda d: d["annotations"][2].pop("segmentation"),
        ValueError,
        ["without a 'segmentation'", "annotation id 13"],
    ),
    "repeated image id": (_set("images.2.id", 1), ValueError, ["image ids listed twice: 1"]),
    # RLE pycocotools would refuse mid-run ("Invalid RLE mask representation") or
    # decode into an undefined mask
    "RLE over the image": (
        _set("annotations.2.segmentation.counts", [218, 5, 13, 5, 13, 5, 13, 5, 13, 5, 191]),
        ValueError,
        ["RLE masks that cover", "id 13: counts sum to 486, not 18x24 = 432"],
    ),
    "RLE of 10 pixels": (
        _set("annotations.2.segmentation.counts", [10]),
        ValueError,
        ["annotation id 13: counts sum to 10, not 18x24 = 432"],
    ),
    "negative RLE count": (
        _set("annotations.2.segmentation.counts", [219, -1, 5, 13, 5, 13, 5, 13, 5, 13, 5, 137]),
        ValueError,
        ["annotation id 13: count -1 at position 1 is negative"],
    ),
    "RLE count not an integer": (
        _set("annotations.2.segmentation.counts", [218.0, 214]),
        ValueError,
        ["annotation id 13: count 218.0 at position 0 is not an integer"],
    ),
    "RLE size not integers": (
        _set("annotations.2.segmentation.size", [18.0, 24.0]),
        ValueError,
        ["annotation id 13 RLE size [18.0, 24.0] in image id 2 of 18x24"],
    ),
    "compressed RLE of half the image": (
        _set("annotations.0.segmentation.counts", _compressed(np.zeros((8, 20)))),
        ValueError,
        ["annotation id 11: counts sum to 160, not 16x20 = 320"],
    ),
    "compressed RLE cut within a count": (
        _set("annotations.0.segmentation.counts", "PP"),
        ValueError,
        ["annotation id 11: compressed counts end within a count"],
    ),
    "compressed RLE bad character": (
        _set("annotations.0.segmentation.counts", "5 6"),
        ValueError,
        ["id 11: compressed counts hold ' ' at position 1, not one of '0'..'o'"],
    ),
    "compressed RLE count too long": (
        _set("annotations.0.segmentation.counts", "PPPPPP0"),
        ValueError,  # 35 bits
        ["id 11: compressed counts hold a count of more than 6 characters at"],
    ),
    # a polygon coordinate of 1e30 crashes pycocotools (signal 11): refused before it is ever decoded
    "polygon far outside": (
        _set("annotations.1.segmentation", [[1, 1, 1e30, 1, 11, 9, 1, 9]]),
        ValueError,
        [
            "polygon coordinates",
            "annotation id 12 in image id 2 of 24x18 px: x=1e+30",
            "x in [-width, 2 width]",
        ],
    ),
    "polygon NaN": (
        _set("annotations.1.segmentation", [[1, 1, 11, 1, 11, float("nan"), 1, 9]]),
        ValueError,
        ["annotation id 12 in image id 2 of 24x18 px: y=nan"],
    ),
    "polygon huge integer": (
        _set("annotations.1.segmentation", [[1, 1, 11, 1, 11, 9, 1, 10**400]]),
        ValueError,
        ["annotation id 12 in image id 2 of 24x18 px: y=1000"],
    ),
    # inside the image, but pycocotools' memory for drawing it grows with points x image size
    "polygon of too many points": (
        _set(
            "annotations.1.segmentation",
            [[1, 1, 11, 1, 11, 9], [v for i in range(10_001) for v in (i % 2, 9)]],
        ),
        ValueError,
        ["polygons of more than 10,000 points: annotation id 12 in image id 2 (2.png): 10,001 points"],
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_coco__bad_input_refused_at_construction_naming_the_file_and_entry(tmp_path, case):
    edit, error, fragments = BAD_INPUTS[case]
    path, folder = _coco(tmp_path, edit)
    with pytest.raises(error) as raised:
        CocoDetection(path, folder, masks=True)
    message = str(raised.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_coco__compressed_rle_counts_are_read_as_pycocotools_reads_them():
    rng = np.random.default_rng(0)
    masks = [
        np.zeros((7, 5)),
        np.ones((7, 5)),
        rng.random((40, 30)) < 0.5,
        np.pad(np.ones((3, 3)), ((600, 0), (0, 900))),
    ]
    for (
        mask
    ) in masks:  # short and long runs, counts and differences of either sign, values of up to 5 characters
        flat = mask.astype(np.uint8).flatten(order="F")  # column by column, from a run of 0s
        # where the value changes
        edges = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
        assert coco_module.rle_counts(_compressed(mask)) == np.diff(np.concatenate([[0], edges])).tolist()


def test_coco__boxes_zero_in_float32_are_left_out_and_the_kept_ones_stay_positive_through_flips_and_resizes(
    tmp_path, monkeypatch
):
    def edit(data):
        data["annotations"] += [
            {"id": 15, "image_id": 1, "category_id": 2, "bbox": [4, 4, 1e-9, 3]},  # zero once in float32
            {"id": 16, "image_id": 1, "category_id": 2, "bbox": [1, 2, 3, 1e-9]},
            # just kept
            {"id": 17, "image_id": 1, "category_id": 2, "bbox": [19.9997, 15.9997, 2.5e-4, 2e-4]},
        ]

    messages = []
    monkeypatch.setattr(coco_module, "rank_zero_info", messages.append)
    data = CocoDetection(*_coco(tmp_path, edit), transforms=v2.RandomHorizontalFlip(p=1.0))
    assert (
        "2 annotations with a box of zero width or height (or under 1e-05 of its image's) (ids 15, 16)"
        in messages[0]
    )
    boxes = data[0][1]["boxes"]
    assert len(boxes) == 2 and (boxes[:, 2:] > boxes[:, :2]).all()  # torchvision's check, after the flip
    for side in (1, 7, 1024, 100_000):  # the detector's resize of the longer side, down or up
        resized = resize_boxes(boxes, (16, 20), (round(side * 16 / 20), side))
        assert (resized[:, 2:] > resized[:, :2]).all(), side


def test_coco__images_with_more_annotations_than_the_setting_are_refused_naming_them(tmp_path):
    def edit(data):
        data["annotations"] += [
            {"id": 100 + i, "image_id": 2, "category_id": 2, "bbox": [1, 1, 2, 2], "iscrowd": i % 2}
            for i in range(6)
        ]  # image 2: 8 annotations, 5 of them kept in training

    path, folder = _coco(tmp_path, edit)
    assert len(CocoDetection(path, folder, train=True, max_annotations_per_image=5)) == 2
    for load, limit, count in (
        (lambda: CocoDetection(path, folder, max_annotations_per_image=5), 5, 8),
        (
            lambda: DetectionDataModule(
                str(tmp_path), str(path), None, str(folder), max_annotations_per_image=4
            ).setup(),
            4,
            5,
        ),
    ):
        with pytest.raises(ValueError) as raised:
            load()
        message = str(raised.value)
        assert message.startswith(
            f"{path}: images with more annotations than max_annotations_per_image={limit}: "
        )
        assert (
            f"image id 2 ({count} annotations)" in message and "data.max_annotations_per_image" in message
        ), message
    with pytest.raises(ValueError, match="max_annotations_per_image must be at least 1, got 0"):
        CocoDetection(path, folder, max_annotations_per_image=0)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_coco__a_truncated_image_is_named_when_read(tmp_path, fmt):
    path, folder = _coco(tmp_path)
    image = folder / "2.png"  # its name says PNG; what it holds decides how it is read
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (18, 24, 3), np.uint8)).save(image, format=fmt)
    encoded = image.read_bytes()
    image.write_bytes(encoded[: len(encoded) * 8 // 10])  # the header intact, the pixels cut
    data = CocoDetection(path, folder)  # only headers are read at start-up
    with pytest.raises(ValueError) as raised:
        data[1]
    message = str(raised.value)
    assert message.startswith(f"cannot read image {image} (image id 2 of {path}): "), message
    assert "truncated" in message.lower() and "replace the file" in message, message
    image.write_bytes(encoded[:20])  # the header cut: refused at start-up
    with pytest.raises(ValueError, match=rf"^{path}: unreadable images: image id 2 file {image} \("):
        CocoDetection(path, folder)


ESCAPES = {  # how an entry's file_name leads out of the image folder -> (file_name, why it is named)
    "dot-dot": ("../../../outside_the_root/private.png", "'..' leads to"),
    "absolute": ("{outside}", "is an absolute path"),
    "symlink": ("link.png", "a symlink leads to"),
}


@pytest.mark.parametrize("case", ESCAPES)
def test_coco__file_names_that_leave_the_image_folder_are_refused_before_any_image_is_read(tmp_path, case):
    outside = tmp_path / "outside_the_root" / "private.png"
    outside.parent.mkdir()
    # a readable image of the right size: only where it lies is wrong
    Image.new("RGB", (20, 16)).save(outside)
    file_name, why = ESCAPES[case]
    root = tmp_path / "a" / "b"  # the image folder is tmp_path/a/b/images: three levels below tmp_path
    path, folder = _coco(root, _set("images.2.file_name", file_name.format(outside=outside)))
    (folder / "link.png").symlink_to(outside)
    for load in (
        lambda: CocoDetection(path, folder),
        lambda: DetectionDataModule(str(root), str(path), None, str(folder)).setup("fit"),
    ):
        with pytest.raises(ValueError) as raised:
            load()
        message = str(raised.value)
        assert message.startswith(f"{path}: image file_name entries that leave the image folder {folder}"), (
            message
        )
        assert f"image id 3 file_name {file_name.format(outside=outside)!r}" in message and why in message, (
            message
        )
        assert "relative path" in message, message


def test_coco__nested_file_names_and_links_within_the_image_folder_are_read(tmp_path):
    def edit(data):
        data["images"][1]["file_name"] = "same.png"  # a symlink to 2.png beside it
        data["images"][2]["file_name"] = "sub/deeper/../3.png"

    path, folder = _coco(tmp_path / "real", edit)
    (folder / "sub" / "deeper").mkdir(parents=True)
    (folder / "3.png").rename(folder / "sub" / "3.png")
    (folder / "same.png").symlink_to("2.png")
    (tmp_path / "images").symlink_to(folder)  # the image folder itself may be a link
    data = CocoDetection(path, tmp_path / "images")
    assert [data[i][0].shape for i in range(3)] == [(3, 16, 20), (3, 18, 24), (3, 16, 20)]


def test_coco__a_file_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text("{'images': []")
    with pytest.raises(
        ValueError, match=rf"{path} is not a JSON file .*'images', 'annotations' and 'categories'"
    ):
        CocoDetection(path, tmp_path)
    with pytest.raises(FileNotFoundError, match=f"COCO annotation file {tmp_path / 'nope.json'} not found"):
        CocoDetection(tmp_path / "nope.json", tmp_path)


# --- the data modules ---


@pytest.mark.parametrize("augmentation", ["none", "flip", "lsj"])
def test_detection_data__list_batches_in_each_augmentation(scenes, augmentation):
    torch.manual_seed(0)
    data = DetectionDataModule(
        str(scenes), masks=True, augmentation=augmentation, img_size=48, batch_size=4, num_workers=0
    )
    assert data.num_classes == 11 and data.category_names == tuple("0123456789")
    data.setup("fit")
    side = 48 if augmentation == "lsj" else 64
    for _ in range(3 if augmentation == "lsj" else 1):  # LSJ's small and large scales, crops and pads
        for images, targets in data.train_dataloader():
            assert isinstance(images, list) and isinstance(targets, list) and len(images) == len(targets) == 4
            for image, target in zip(images, targets, strict=True):
                assert image.shape == (3, side, side) and image.dtype == torch.float32
                k = len(target["labels"])
                assert target["boxes"].shape == (k, 4) and target["masks"].shape == (k, side, side)
                assert target["iscrowd"].shape == (k,) and target["labels"].dtype == torch.int64
                boxes = target["boxes"]
                assert (boxes >= 0).all() and (boxes <= side).all()  # inside the image after the crop
                assert (boxes[:, 2:] - boxes[:, :2] >= 1).all()  # objects cut to nothing are dropped
    images, targets = next(iter(data.val_dataloader()))
    assert [t["image_id"] for t in targets] == [1, 2, 3, 4] and images[0].shape == (3, 64, 64)  # as they are


def test_detection_data__splits_with_other_categories_are_refused_naming_both(tmp_path):
    path, folder = _coco(tmp_path)
    val_path, _ = _coco(tmp_path / "v", _set("categories.0.name", "kettle"))
    data = DetectionDataModule(
        str(tmp_path), str(path), str(val_path), str(folder), str(folder), batch_size=1
    )
    assert data.num_classes == 4
    with pytest.raises(ValueError, match=rf"{val_path} and {path} list different categories .*90: 'kettle'"):
        data.setup("fit")


def test_digit_scenes_data__written_on_first_use_and_one_step_of_mask_rcnn_over_the_pyramid(tmp_path):
    data = DigitScenesDataModule(
        root=str(tmp_path / "scenes"), **SCENES, masks=True, augmentation="lsj", batch_size=4
    )
    assert data.num_classes == 11 and not (tmp_path / "scenes").exists()  # known before anything is written
    data.setup("fit")
    assert (tmp_path / "scenes" / "scenes.json").is_file()
    images, targets = next(iter(data.train_dataloader()))
    torch.manual_seed(0)
    vit = build_vit(
        create_model("mae_vit_tiny_patch4", img_size=16, **TINY_KWARGS).config,
        img_size=16,
        dynamic_img_size=True,
    )
    model = MaskRCNN(
        SimpleFeaturePyramid(vit, out_channels=16), num_classes=data.num_classes, min_size=64, max_size=64
    ).train()
    losses = model(images, targets)
    assert {"loss_classifier", "loss_box_reg", "loss_mask"} <= set(losses)
    loss = sum(losses.values())
    loss.backward()
    assert torch.isfinite(loss) and vit.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


# --- the mAP ---


def _fixture() -> tuple[list[dict], list[dict]]:
    """3 images of 40x48 px: ground truth of 2 categories (one crowd region) and noisy detections."""
    generator = torch.Generator().manual_seed(0)
    preds, targets = [], []
    for i in range(3):
        gt = torch.tensor([[4.0, 5, 20, 25], [22, 8, 44, 30], [10, 26, 30, 38]]) + i
        labels = torch.tensor([1, 2, 1 + i % 2])
        found = gt[:2] + torch.randn(2, 4, generator=generator) * 2
        spurious = torch.tensor([[0.0, 0, 12, 12], [30, 20, 47, 39]])
        boxes = torch.cat([found, spurious])
        targets.append(
            dict(
                boxes=gt,
                labels=labels,
                iscrowd=torch.tensor([0, 0, int(i == 1)]),
                masks=torch.stack([_box(b) for b in gt]).to(torch.uint8),
            )
        )
        preds.append(
            dict(
                boxes=boxes,
                labels=torch.tensor([1, 2, 1, 2]),
                scores=torch.rand(4, generator=generator),
                masks=torch.stack([_box(b).float()[None] * 0.9 for b in boxes]),
            )
        )
    return preds, targets


def _box(box: torch.Tensor, size=(40, 48)) -> torch.Tensor:
    x0, y0, x1, y1 = box.round().int().tolist()
    mask = torch.zeros(size, dtype=torch.bool)
    mask[max(y0, 0) : y1, max(x0, 0) : x1] = True
    return mask


def _cocoeval(preds: list[dict], targets: list[dict], iou_type: str) -> list[float]:
    """COCOeval's (AP, AP50, AP75) run on the same detections: the independent reference."""

    def region(box, mask):
        x0, y0, x1, y1 = box.tolist()
        rle = mask_utils.encode(np.asfortranarray(mask.numpy().astype(np.uint8)))
        extra = (
            {"segmentation": rle, "area": float(mask.sum())}
            if iou_type == "segm"
            else {"area": (x1 - x0) * (y1 - y0)}
        )
        return {"bbox": [x0, y0, x1 - x0, y1 - y0], **extra}

    gt = {
        "images": [{"id": i, "width": 48, "height": 40} for i in range(len(targets))],
        "annotations": [],
        "categories": [{"id": 1}, {"id": 2}],
    }
    for i, t in enumerate(targets):
        for box, label, crowd, mask in zip(t["boxes"], t["labels"], t["iscrowd"], t["masks"], strict=True):
            gt["annotations"].append(
                {
                    "id": len(gt["annotations"]) + 1,
                    "image_id": i,
                    "category_id": int(label),
                    "iscrowd": int(crowd),
                    **region(box, mask),
                }
            )
    detections = [
        {"image_id": i, "category_id": int(label), "score": float(score), **region(box, mask[0] > 0.5)}
        for i, p in enumerate(preds)
        for box, label, score, mask in zip(p["boxes"], p["labels"], p["scores"], p["masks"], strict=True)
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO()
        truth.dataset = gt
        truth.createIndex()
        evaluation = COCOeval(truth, truth.loadRes(detections), iou_type)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation.stats[:3].tolist()


def test_metrics__equal_cocoeval_run_directly_on_the_same_detections():
    preds, targets = _fixture()
    metrics = DetectionMetrics(masks=True)
    metrics.update(preds[:2], targets[:2])
    metrics.update(preds[2:], targets[2:])
    result = metrics.compute()
    assert set(result) == {
        "val/map",
        "val/map_50",
        "val/map_75",
        "val/mask_map",
        "val/mask_map_50",
        "val/mask_map_75",
    }
    boxes, masks = _cocoeval(preds, targets, "bbox"), _cocoeval(preds, targets, "segm")
    assert 0.1 < boxes[0] < 0.9 and boxes[0] != masks[0]  # a fixture that tells the numbers apart
    ours = [
        result[f"val/{n}"].item()
        for n in ("map", "map_50", "map_75", "mask_map", "mask_map_50", "mask_map_75")
    ]
    assert ours == pytest.approx(boxes + masks, abs=1e-6)


def test_metrics__by_hand_perfect_is_one_and_one_of_two_missed_is_51_of_101():
    box = torch.tensor([[2.0, 3, 20, 30]])
    targets = [dict(boxes=box, labels=torch.tensor([1])), dict(boxes=box + 5, labels=torch.tensor([1]))]
    metrics = DetectionMetrics(prefix="test/")
    metrics.update(
        [dict(boxes=t["boxes"], labels=t["labels"], scores=torch.tensor([0.8])) for t in targets], targets
    )
    assert {k: v.item() for k, v in metrics.compute().items()} == {
        "test/map": 1.0,
        "test/map_50": 1.0,
        "test/map_75": 1.0,
    }
    metrics.reset()
    none = dict(boxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long), scores=torch.zeros(0))
    metrics.update([dict(boxes=box, labels=torch.tensor([1]), scores=torch.tensor([0.8])), none], targets)
    # precision 1 up to recall 1/2, none beyond: 51 of COCO's 101 recall points, at every IoU threshold
    assert metrics.compute()["test/map"].item() == pytest.approx(51 / 101)


def _ddp_worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    preds, targets = _fixture()
    shard = slice(0, 2) if rank == 0 else slice(2, 3)  # uneven: 2 images and 1
    metrics = DetectionMetrics(masks=True)
    metrics.update(preds[shard], targets[shard])
    torch.save(metrics.compute(), f"{out}/{rank}.pt")
    dist.destroy_process_group()


def test_metrics__two_processes_with_uneven_shards_give_the_single_process_values(tmp_path):
    preds, targets = _fixture()
    single = DetectionMetrics(masks=True)
    single.update(preds, targets)
    expected = single.compute()
    # forked, not spawned: the workers start in a second instead of importing everything again
    mp.start_processes(
        _ddp_worker, args=(f"file://{tmp_path / 'init'}", str(tmp_path)), nprocs=2, start_method="fork"
    )
    for rank in range(2):
        result = torch.load(tmp_path / f"{rank}.pt")
        assert {k: v.item() for k, v in result.items()} == pytest.approx(
            {k: v.item() for k, v in expected.items()}
        )


def test_metrics__need_pycocotools_and_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycocotools", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[dense\]"'):
        DetectionMetrics()


def test_digit_scene_images__pretraining_crops_of_the_training_scenes_only(scenes):
    from mae.data.sources.scene_images import DigitSceneImagesDataModule

    data = DigitSceneImagesDataModule(root=str(scenes), **SCENES, img_size=32, batch_size=4)
    data.setup("fit")
    assert [p.parent for p in data.train_set.paths] == [scenes / "images" / "train"] * SCENES["num_train"]
    assert [p.parent for p in data.val_set.paths] == [scenes / "images" / "val"] * SCENES["num_val"]
    torch.manual_seed(0)
    crops, labels = data.on_after_batch_transfer(next(iter(data.train_dataloader())), 0)
    assert crops.shape == (4, 3, 32, 32) and crops.dtype == torch.float32 and labels.tolist() == [0] * 4
    # the validation view is the whole 64 px scene resized to 32 px, normalised with ImageNet's statistics
    image, _ = data.val_set[0]
    scene = v2.functional.to_image(Image.open(scenes / "images" / "val" / "000000.png")).float() / 255
    expected = F.interpolate(scene[None], size=(32, 32), mode="bicubic", align_corners=False, antialias=True)[
        0
    ]
    mean, std = torch.tensor(data.mean).view(3, 1, 1), torch.tensor(data.std).view(3, 1, 1)
    assert torch.allclose(image * std + mean, expected.clamp(0, 1), atol=0.02)


def test_digit_scene_images__refuses_other_channel_counts_and_different_scenes(scenes):
    from mae.data.sources.scene_images import DigitSceneImagesDataModule

    with pytest.raises(ValueError, match="in_chans must be 3"):
        DigitSceneImagesDataModule(root=str(scenes), **SCENES, in_chans=1, mean=[0.5], std=[0.5]).setup("fit")
    with pytest.raises(ValueError, match=str(scenes)):  # the folder holds scenes of other parameters
        DigitSceneImagesDataModule(root=str(scenes), num_train=5, num_val=6).setup("fit")
