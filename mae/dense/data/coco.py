"""COCO-format detection data: an instances JSON (``images``, ``annotations``, ``categories``) and a folder
of images, read as torchvision's detectors take them, and checked once, at construction.

Every problem in the data stops the run at start-up with an error that names the JSON file, the entries
(annotation ids, image ids, file names; the first few and the count) and what would be right, instead of
a crash or a silently wrong target hours into training. What COCO practice leaves out is left out by name
in one logged line: crowd annotations (``iscrowd=1``) and images without annotations in the training
split (the validation split keeps both: crowd regions are ignored by the mAP, empty images still count
false positives), boxes of zero width or height (COCO train2017 has two: annotation ids 918 and
2206849) or of under ``MIN_BOX_SIDE`` of their image's (zero once in float32 or after a resize, which
torchvision's detectors refuse mid-run), and polygon parts of fewer than 3 points. A ``file_name`` that leads
out of the image folder (absolute, or out through ``..`` or a symlink) stops the run before any image is read:
a dataset file must not make a run read, and train on, any file the user can read.

With masks, every kept annotation's segmentation is checked before pycocotools sees it, and a bad one
refuses the dataset (it is corrupt data, not a COCO practice; its mask cannot be trusted): RLE counts must
be non-negative integers summing to exactly height x width of an integer ``size`` equal to the image's
(pycocotools fails mid-run on more, and leaves the rest of the mask undefined on fewer; string counts are
decoded here, ``rle_counts``), polygon coordinates finite and within the image extended by its own size on
each side (x in [-width, 2 width], y in [-height, 2 height]; pycocotools crashes the process on ones far
outside, 1e30), and at most ``MAX_POLYGON_POINTS`` points per polygon (pycocotools' memory for drawing one
grows with its points times the image's size). An image with more than ``max_annotations_per_image`` kept
annotations refuses the dataset (leaving it out would drop an image unnoticed): torchvision's box matching
holds (annotations x anchors) arrays, measured 2.2 GB per image for 250 annotations at 1024 px, so 100,000
boxes run out of memory.

Only image headers are read at start-up: decoding every image would catch truncated ones too, but costs
0.3 ms per 32 x 32 PNG and 7 ms per 640 x 480 JPEG (measured), some 10 minutes for COCO train2017's 118k
images in every process. An image that cannot be decoded when it is read stops the run naming the file.

Labels are contiguous: the sorted COCO category ids (1..90 with gaps for COCO itself) become 1..K, 0
being torchvision's background. pycocotools (the ``dense`` extra) decodes masks; it is imported when
masks are asked for.
"""

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from mae.data.decoding.rgb import open_image, read_rgb
from mae.errors import InputError, MissingFileError, UserError

BOX_TOLERANCE = 1.0  # px a box may reach past the image edge (rounding) before it is an error; then clipped
SHOWN = 5  # entries named in an error or in the report of what was left out
# A box narrower (lower) than this fraction of its image's width (height) counts as of zero size: wider ones
# are over 80 float32 steps of the image's coordinates apart, so flips, crops and any
# resize keep them positive.
MIN_BOX_SIDE = 1e-5
MAX_ANNOTATIONS_PER_IMAGE = 1000  # per image, kept ones; COCO's images hold far fewer
# Points (x, y pairs) one polygon may have. pycocotools draws a polygon through temporary arrays of about
# 40 bytes per point per pixel its edges span (measured: 8 GB for 100,000 points zigzagging across a 640 px
# image, 0.8 GB for 10,000), so a polygon of many points is refused before it is ever drawn. Generous for
# drawn outlines: a point at every boundary pixel of an object filling a 1024 x 1024 image is about 4,000.
MAX_POLYGON_POINTS = 10_000
# Characters of one compressed RLE value: 30 bits with the sign, enough for any count of an image under 2^29
# pixels (images over the 89.5-megapixel limit are refused), and no shift overflows pycocotools' int.
RLE_CHARS_PER_COUNT = 6
COCO_LAYOUT = "a COCO instances file is a JSON object with the lists 'images', 'annotations' and 'categories'"


def require_pycocotools() -> Any:
    """``pycocotools.mask``, or an ImportError that says how to install it."""
    try:
        from pycocotools import mask
    except ImportError as err:
        raise ImportError(
            f'COCO masks and the detection mAP need pycocotools: pip install -e ".[dense]" ({err})'
        ) from err
    return mask


@dataclass
class CocoImage:
    """One image and its kept annotations: ``boxes`` (K, 4) float32 xyxy in pixels (clipped to the image),
    ``labels`` (K,) int64 in 1..num_categories, ``iscrowd`` (K,) int64, ``segmentations`` the K COCO
    segmentations (only when masks are read)."""

    id: int
    file_name: str
    width: int
    height: int
    boxes: np.ndarray
    labels: np.ndarray
    iscrowd: np.ndarray
    segmentations: list = field(default_factory=list)


class CocoDetection(Dataset):
    """Images and targets of a COCO instances file, for torchvision's detectors.

    Args:
        annotation_file: the instances JSON.
        image_folder: the folder the JSON's ``file_name`` entries are relative to.
        masks: read instance masks (polygons or RLE, decoded by pycocotools) into ``target["masks"]``.
        transforms: a torchvision ``transforms.v2`` callable of ``(image, target)``: the image a
            ``tv_tensors.Image`` (3, H, W) uint8, the boxes ``tv_tensors.BoundingBoxes`` (XYXY) and the masks
            ``tv_tensors.Mask``, so boxes and masks follow the image.
        train: the training split: crowd annotations and images without (non-crowd) annotations are left
            out; otherwise both are kept (crowds with ``iscrowd`` 1).
        max_annotations_per_image: the most kept annotations an image may have (module docstring).

    Items are ``(image, target)``: image (3, H, W) float32 in [0, 1]; target ``boxes`` (K, 4) float32 xyxy in
    pixels, ``labels`` (K,) int64 in 1..num_categories, ``iscrowd`` (K,) int64, ``masks`` (K, H, W) uint8
    (when ``masks``), ``image_id`` the COCO image id (int).

    Raises:
        FileNotFoundError: the JSON, or images it names, missing (named).
        ValueError: any other problem in the JSON or the images, naming the file and the entries; among
            them ``file_name`` entries that lead out of ``image_folder``. From ``__getitem__``: an image
            that cannot be decoded (truncated, corrupt), naming the file.
    """

    def __init__(
        self,
        annotation_file: str | Path,
        image_folder: str | Path,
        masks: bool = False,
        transforms: Callable | None = None,
        train: bool = False,
        max_annotations_per_image: int = MAX_ANNOTATIONS_PER_IMAGE,
    ) -> None:
        if type(max_annotations_per_image) is not int or max_annotations_per_image < 1:
            raise InputError(
                f"max_annotations_per_image must be at least 1, got {max_annotations_per_image!r}"
            )
        self.annotation_file = Path(annotation_file)
        self.image_folder = Path(image_folder)
        self.masks = masks
        self.transforms = transforms
        self.train = train
        if masks:
            require_pycocotools()
        data = read_coco(self.annotation_file)
        categories = read_categories(data, self.annotation_file)
        self.category_ids = {label: cid for label, (cid, _) in enumerate(categories, start=1)}
        self.category_names = tuple(name for _, name in categories)
        self.images, left_out = _index(
            data, self.annotation_file, categories, masks, train, max_annotations_per_image
        )
        _check_inside(data["images"], self.image_folder, self.annotation_file)  # all listed, served or not
        _check_image_files(self.images, self.image_folder, self.annotation_file)
        kept = sum(len(image.labels) for image in self.images)
        rank_zero_info(
            f"{self.annotation_file}: {len(self.images)} images, {kept} annotations in {self.num_categories} "
            f"categories" + (f"; left out: {'; '.join(left_out)}" if left_out else "")
        )

    @property
    def num_categories(self) -> int:
        """Object categories, background not counted (labels are 1..num_categories)."""
        return len(self.category_names)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        record = self.images[index]
        file = self.image_folder / record.file_name
        try:
            image = tv_tensors.Image(read_rgb(file))
        except (
            OSError,
            ValueError,
            SyntaxError,
            Image.DecompressionBombError,
        ) as err:  # PIL's may not name it
            raise InputError(
                f"cannot read image {file} (image id {record.id} of {self.annotation_file}): {err}; replace "
                "the file with a readable copy, or remove the image and its annotations from the JSON"
            ) from err
        size = (record.height, record.width)
        if image.shape[-2:] != size:  # checked at start-up: the file changed since
            raise InputError(
                f"{file} is now {image.shape[-1]}x{image.shape[-2]} px, {self.annotation_file} says "
                f"{record.width}x{record.height} (image id {record.id})"
            )
        target: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(
                torch.from_numpy(record.boxes), format="XYXY", canvas_size=size
            ),
            "labels": torch.from_numpy(record.labels),
            "iscrowd": torch.from_numpy(record.iscrowd),
            "image_id": record.id,
        }
        if self.masks:
            masks = [decode_segmentation(s, *size) for s in record.segmentations]
            stacked = np.stack(masks) if masks else np.zeros((0, *size), np.uint8)
            target["masks"] = tv_tensors.Mask(torch.from_numpy(stacked))
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        image = F.to_dtype(image, torch.float32, scale=True).as_subclass(torch.Tensor)
        target = {
            k: v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else v for k, v in target.items()
        }
        return image, target


def read_coco(annotation_file: str | Path) -> dict:
    """The parsed JSON, after checking it is an object with lists ``images``, ``annotations`` and
    ``categories`` (their entries are checked by ``CocoDetection``)."""
    path = Path(annotation_file)
    if not path.is_file():
        raise MissingFileError(f"COCO annotation file {path} not found")
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path} is not a JSON file ({err}); {COCO_LAYOUT}") from err
    if not isinstance(data, dict):
        raise InputError(f"{path} is not COCO-format: it holds a JSON {type(data).__name__}; {COCO_LAYOUT}")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            found = "no" if key not in data else f"a {type(data[key]).__name__} as"
            raise InputError(f"{path} is not COCO-format: it has {found} '{key}'; {COCO_LAYOUT}")
        bad = [f"{key}[{i}]" for i, entry in enumerate(data[key]) if not isinstance(entry, dict)]
        _refuse(path, f"'{key}' entries that are not JSON objects", bad, "every entry is an object")
    return data


def read_categories(data: dict, path: Path) -> list[tuple[int, str]]:
    """(COCO id, name) of each category, sorted by id: label ``i`` (1-based) is entry ``i - 1``."""
    entries = data["categories"]
    _check_fields(path, entries, "category", {"id": _INTEGER, "name": _NAME})
    ids = [c["id"] for c in entries]
    _refuse(path, "category ids listed twice", _repeated(ids), "each category has its own id")
    if not entries:
        raise InputError(f"{path} lists no categories: detection needs at least one")
    return sorted((c["id"], c["name"]) for c in entries)


def decode_segmentation(segmentation: list | dict, height: int, width: int) -> np.ndarray:
    """(height, width) uint8 mask of a COCO segmentation: polygons, uncompressed or compressed RLE."""
    mask_utils = require_pycocotools()
    if isinstance(segmentation, list):  # polygons, each [x0, y0, x1, y1, ...]
        if not segmentation:
            return np.zeros((height, width), np.uint8)
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation["counts"], list):  # uncompressed RLE
        rle = mask_utils.frPyObjects(segmentation, height, width)
    else:
        rle = segmentation
    return mask_utils.decode(rle)


def rle_counts(counts: str) -> list[int]:
    """The run lengths of compressed RLE ``counts``, read as pycocotools' ``rleFrString`` reads them: each
    value in 5-bit groups, least significant first, one character per group from '0' (48) up, 0x20 marking
    that another group follows and 0x10 in the last one the sign; from the fourth value on, a value is the
    difference to the count two before. Refused here where C would read past the string's end or overflow.

    Raises:
        ValueError: for a character outside '0'..'o', a string that ends within a count, or a count of more
            than ``RLE_CHARS_PER_COUNT`` characters.
    """
    runs: list[int] = []
    value = shift = start = 0
    for i, char in enumerate(counts):
        group = ord(char) - 48
        if not 0 <= group < 64:
            raise InputError(f"compressed counts hold {char!r} at position {i}, not one of '0'..'o'")
        value |= (group & 0x1F) << shift
        shift += 5
        if group & 0x20:  # more groups follow
            if shift == 5 * RLE_CHARS_PER_COUNT:
                raise InputError(
                    f"compressed counts hold a count of more than {RLE_CHARS_PER_COUNT} characters at "
                    f"position {start}"
                )
            continue
        if group & 0x10:  # negative: sign-extend
            value -= 1 << shift
        runs.append(value + (runs[-2] if len(runs) > 2 else 0))
        value = shift = 0
        start = i + 1
    if shift:
        raise InputError("compressed counts end within a count")
    return runs


# Field checks: (test, what a right value is).
_INTEGER = (lambda v: type(v) is int, "an integer")
_POSITIVE = (lambda v: type(v) is int and v > 0, "a positive integer (pixels)")
_NAME = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
_CROWD = (lambda v: type(v) is int and v in (0, 1), "0 or 1")
_BOX = (
    lambda v: (
        isinstance(v, list) and len(v) == 4 and all(type(x) in (int, float) and math.isfinite(x) for x in v)
    ),
    "[x, y, width, height]: 4 finite numbers, in pixels",
)


def _index(
    data: dict, path: Path, categories: list[tuple[int, str]], masks: bool, train: bool, max_annotations: int
) -> tuple[list[CocoImage], list[str]]:
    """The images to serve with their kept annotations, after checking every entry; and what was left
    out, as phrases for the report."""
    images = _checked_images(path, data["images"])
    label_of = {cid: label for label, (cid, _) in enumerate(categories, start=1)}
    annotations = _checked_annotations(path, data["annotations"], images, label_of)
    # (A, 4) xyxy, clipped; (A, 2) their images' width, height
    boxes, sizes = _boxes(path, annotations, images)
    empty = (boxes[:, 2:] - boxes[:, :2] < MIN_BOX_SIDE * sizes).any(1)
    crowd = np.array([a.get("iscrowd", 0) == 1 for a in annotations], bool)
    keep = ~empty & ~crowd if train else ~empty
    degenerate = (
        _check_segmentations(path, [annotations[i] for i in np.flatnonzero(keep)], images) if masks else []
    )
    rows_of = _rows_of_images(path, images, annotations, keep, max_annotations)
    served = [
        _coco_image(image, [annotations[i] for i in rows], boxes[rows], label_of, masks)
        for image in images.values()
        if (rows := rows_of[image["id"]]) or not train
    ]
    left_out = {
        "crowd annotations (iscrowd=1)": [annotations[i]["id"] for i in np.flatnonzero(crowd & train)],
        f"annotations with a box of zero width or height (or under {MIN_BOX_SIDE:g} of its image's)": [
            annotations[i]["id"] for i in np.flatnonzero(empty)
        ],
        "annotations with polygon parts of fewer than 3 points (those parts)": degenerate,
        "images without annotations (training split)": [
            i for i, rows in rows_of.items() if train and not rows
        ],
    }
    report = [_named(what, ids) for what, ids in left_out.items() if ids]
    if not served:
        raise InputError(
            f"{path}: no image is left to serve" + (f": left out {'; '.join(report)}" if report else "")
        )
    return served, report


def _coco_image(
    image: dict, annotations: list[dict], boxes: np.ndarray, label_of: dict[int, int], masks: bool
) -> CocoImage:
    """``image`` with its kept ``annotations`` and their (K, 4) xyxy ``boxes``; their segmentations when
    ``masks``."""
    return CocoImage(
        image["id"],
        image["file_name"],
        image["width"],
        image["height"],
        boxes.astype(np.float32).reshape(-1, 4),
        np.array([label_of[a["category_id"]] for a in annotations], np.int64),
        np.array([a.get("iscrowd", 0) for a in annotations], np.int64),
        [_usable(a["segmentation"]) for a in annotations] if masks else [],
    )


def _rows_of_images(
    path: Path, images: dict[int, dict], annotations: list[dict], keep: np.ndarray, max_annotations: int
) -> dict[int, list[int]]:
    """Each image's kept annotations (``keep``, (A,) bool), as indices into ``annotations``; more than
    ``max_annotations`` on an image are refused naming the images."""
    rows_of: dict[int, list[int]] = {image_id: [] for image_id in images}
    for i in np.flatnonzero(keep):
        rows_of[annotations[i]["image_id"]].append(int(i))
    _refuse(
        path,
        f"images with more annotations than max_annotations_per_image={max_annotations}",
        [
            f"image id {i} ({len(rows)} annotations)"
            for i, rows in rows_of.items()
            if len(rows) > max_annotations
        ],
        "at most that many per image: torchvision's box matching holds (annotations x anchors) arrays, "
        "2.2 GB per image for 250 annotations at 1024 px; raise data.max_annotations_per_image where "
        "memory allows",
    )
    return rows_of


def _checked_images(path: Path, images: list[dict]) -> dict[int, dict]:
    """The ``images`` entries by id, after checking their fields."""
    _check_fields(
        path, images, "image", {"id": _INTEGER, "file_name": _NAME, "width": _POSITIVE, "height": _POSITIVE}
    )
    _refuse(path, "image ids listed twice", _repeated([i["id"] for i in images]), "each image has its own id")
    return {image["id"]: image for image in images}


def _checked_annotations(path: Path, annotations: list[dict], images: dict, label_of: dict) -> list[dict]:
    """The ``annotations`` entries, after checking their fields and that they name
    listed images and categories."""
    fields = {"id": _INTEGER, "image_id": _INTEGER, "category_id": _INTEGER, "bbox": _BOX}
    _check_fields(path, annotations, "annotation", fields)
    _check_fields(path, [a for a in annotations if "iscrowd" in a], "annotation", {"iscrowd": _CROWD})
    _refuse(
        path,
        "annotations of image ids that are not in 'images'",
        [
            f"annotation id {a['id']} (image_id {a['image_id']})"
            for a in annotations
            if a["image_id"] not in images
        ],
        "every annotation's image_id is the id of an entry of 'images'",
    )
    _refuse(
        path,
        "annotations of category ids that are not in 'categories'",
        [
            f"annotation id {a['id']} (category_id {a['category_id']})"
            for a in annotations
            if a["category_id"] not in label_of
        ],
        f"every category_id is one of the listed ids {sorted(label_of)}",
    )
    return annotations


def _boxes(path: Path, annotations: list[dict], images: dict[int, dict]) -> tuple[np.ndarray, np.ndarray]:
    """(A, 4) float64 xyxy boxes, clipped to their images, and (A, 2) their images' width and height; negative
    sizes and boxes more than ``BOX_TOLERANCE`` px outside their image are refused by name."""
    xywh = np.array([a["bbox"] for a in annotations], np.float64).reshape(-1, 4)
    sizes = np.array(
        [[images[a["image_id"]][k] for k in ("width", "height")] for a in annotations], np.float64
    )
    sizes = sizes.reshape(-1, 2)
    negative = np.flatnonzero((xywh[:, 2:] < 0).any(1))
    _refuse(
        path,
        "boxes of negative width or height",
        [f"annotation id {annotations[i]['id']} bbox {annotations[i]['bbox']}" for i in negative],
        "COCO boxes are [x, y, width, height] with width, height >= 0 (not [x0, y0, x1, y1])",
    )
    xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
    outside = np.flatnonzero(
        (xyxy[:, :2] < -BOX_TOLERANCE).any(1) | (xyxy[:, 2:] > sizes + BOX_TOLERANCE).any(1)
    )
    _refuse(
        path,
        f"boxes more than {BOX_TOLERANCE:g} px outside their image",
        [
            f"annotation id {annotations[i]['id']} bbox {annotations[i]['bbox']} in image id "
            f"{annotations[i]['image_id']} of {sizes[i, 0]:.0f}x{sizes[i, 1]:.0f} px"
            for i in outside
        ],
        "boxes lie inside the image: 0 <= x, x + width <= width and the same for y, height",
    )
    return np.clip(xyxy, 0, np.concatenate([sizes, sizes], axis=1)), sizes


# What ``_check_segmentations`` refuses, in this order: kind -> (the problem, what is right).
_SEGMENTATION_REFUSALS = {
    "missing": (
        "annotations without a 'segmentation' (masks were asked for)",
        "every annotation has polygons or an RLE mask, or read the data without masks",
    ),
    "malformed": (
        "malformed segmentations",
        "a segmentation is a list of polygons [x0, y0, x1, y1, ...] (an even count of numbers) or an RLE "
        "object {'size': [height, width], 'counts': ...}",
    ),
    "crowded": (
        f"polygons of more than {MAX_POLYGON_POINTS:,} points",
        f"at most {MAX_POLYGON_POINTS:,} (x, y) points per polygon: pycocotools' memory for drawing one "
        "grows with its points times the image's size (8 GB for 100,000 points across a 640 px image); "
        "simplify the polygon, split it into parts, or give the mask as RLE",
    ),
    "far": (
        "polygons with coordinates far outside their image, or not finite",
        "polygon coordinates are finite, x in [-width, 2 width] and y in [-height, 2 height] (the image "
        "extended by its size on each side; pycocotools crashes on coordinates far outside)",
    ),
    "wrong_size": (
        "RLE masks whose size is not their image's",
        "an RLE's 'size' is [height, width] of its image, two integers",
    ),
    "uncovered": (
        "RLE masks that cover not exactly their image",
        "an RLE's counts are the lengths of its runs of 0s and 1s, column by column from a run of 0s: "
        "non-negative integers summing to height x width (pycocotools fails on more and leaves the rest "
        "undefined on fewer); string counts are pycocotools' compressed form of them",
    ),
}


def _check_segmentations(path: Path, annotations: list[dict], images: dict[int, dict]) -> list[int]:
    """Refuse missing or malformed segmentations, polygons of too many points or far outside their image,
    RLE of another size than the image or whose counts do not cover it exactly (module docstring); the ids
    of annotations with polygon parts of fewer than 3 points (left out of their masks)."""
    found: dict[str, list] = {kind: [] for kind in (*_SEGMENTATION_REFUSALS, "degenerate")}
    for a in annotations:
        problem = _segmentation_problem(a, images[a["image_id"]])
        if problem is not None:
            found[problem[0]].append(problem[1])
    for kind, (problem, right) in _SEGMENTATION_REFUSALS.items():
        _refuse(path, problem, found[kind], right)
    return found["degenerate"]


def _segmentation_problem(a: dict, image: dict) -> tuple[str, str | int] | None:
    """What is wrong with annotation ``a``'s segmentation in ``image``: (a kind of
    ``_SEGMENTATION_REFUSALS``, the entry naming it), or ("degenerate", its id) for polygon parts of fewer
    than 3 points; None when nothing is."""
    segmentation = a.get("segmentation")
    if segmentation is None:
        return "missing", f"annotation id {a['id']}"
    if isinstance(segmentation, list):
        return _polygon_problem(a, segmentation, image)
    if isinstance(segmentation, dict) and isinstance(segmentation.get("counts"), str | list):
        return _rle_problem_of(a, segmentation, image)
    return "malformed", f"annotation id {a['id']}"


def _polygon_problem(a: dict, polygons: list, image: dict) -> tuple[str, str | int] | None:
    """``_segmentation_problem`` of polygons."""
    if not all(
        isinstance(p, list) and len(p) % 2 == 0 and all(type(x) in (int, float) for x in p) for p in polygons
    ):
        return "malformed", f"annotation id {a['id']}"
    if (points := max((len(p) // 2 for p in polygons), default=0)) > MAX_POLYGON_POINTS:
        return "crowded", (
            f"annotation id {a['id']} in image id {image['id']} ({image['file_name']}): {points:,} points"
        )
    width, height = image["width"], image["height"]
    if outside := _far_coordinate(polygons, width, height):
        return "far", f"annotation id {a['id']} in image id {image['id']} of {width}x{height} px: {outside}"
    if any(len(p) < 6 for p in polygons):
        return "degenerate", a["id"]
    return None


def _rle_problem_of(a: dict, rle: dict, image: dict) -> tuple[str, str] | None:
    """``_segmentation_problem`` of an RLE mask."""
    height, width, size = image["height"], image["width"], rle.get("size")
    if not (isinstance(size, list) and [type(s) for s in size] == [int, int] and size == [height, width]):
        return "wrong_size", (
            f"annotation id {a['id']} RLE size {size} in image id {image['id']} of {height}x{width} "
            "(height x width)"
        )
    if why := _rle_problem(rle["counts"], height, width):
        return "uncovered", f"annotation id {a['id']}: {why}"
    return None


def _far_coordinate(polygons: list[list], width: int, height: int) -> str | None:
    """The first polygon coordinate outside [-width, 2 width] (x) or [-height, 2 height] (y), or not finite,
    as ``"x=1e+30"``; None when there is none."""
    for p in polygons:
        # the fast path: C loops (a NaN or an infinity makes the sum so; an int beyond float's range raises)
        try:
            if not p or (
                math.isfinite(sum(p))
                and -width <= min(p[0::2])
                and max(p[0::2]) <= 2 * width
                and -height <= min(p[1::2])
                and max(p[1::2]) <= 2 * height
            ):
                continue
        except OverflowError:
            pass  # an int past float's range: the exact per-value comparison below names it
        for axis, side, values in (("x", width, p[0::2]), ("y", height, p[1::2])):
            for v in values:
                if not -side <= v <= 2 * side:  # False for NaN
                    shown = repr(v)
                    return f"{axis}={shown if len(shown) <= 20 else shown[:16] + '...'}"
    return None


def _rle_problem(counts: str | list, height: int, width: int) -> str | None:
    """Why RLE ``counts`` (a list, or a compressed string) do not cover a height x width mask exactly; None
    when they do."""
    if isinstance(counts, str):
        try:
            counts = rle_counts(counts)
        except ValueError as err:
            return str(err)
    for i, count in enumerate(counts):
        if type(count) is not int:
            return f"count {count!r} at position {i} is not an integer"
        if count < 0:
            return f"count {count} at position {i} is negative"
    if sum(counts) != height * width:
        return f"counts sum to {sum(counts)}, not {height}x{width} = {height * width}"
    return None


def _usable(segmentation: list | dict) -> list | dict:
    """A segmentation without polygon parts of fewer than 3 points (no area; pycocotools would read a
    4-number part as a box)."""
    return [p for p in segmentation if len(p) >= 6] if isinstance(segmentation, list) else segmentation


def _check_inside(images: list[dict], folder: Path, path: Path) -> None:
    """Refuse ``images`` entries (checked ones, every one listed) whose ``file_name`` leads out of ``folder``:
    absolute ones, and those whose real path (``..`` and symlinks resolved, so a link inside the folder to
    elsewhere counts too) is not in the folder's real path. Checked before any image is opened: the JSON must
    not choose which of the user's files are read."""
    real_folder = Path(os.path.realpath(folder))
    leaving = []
    for image in images:
        name = image["file_name"]
        entry = f"image id {image['id']} file_name {name!r}"
        if os.path.isabs(name):
            leaving.append(f"{entry} is an absolute path")
            continue
        real = Path(os.path.realpath(folder / name))
        if not real.is_relative_to(real_folder):
            lexical = Path(os.path.normpath(real_folder / name))  # where it would be without links
            how = "a symlink" if lexical.is_relative_to(real_folder) else "'..'"
            leaving.append(f"{entry}: {how} leads to {real}")
    _refuse(
        path,
        f"image file_name entries that leave the image folder {folder}",
        leaving,
        f"every file_name is a relative path to a file inside the image folder ({real_folder}, symlinks "
        "followed); copy those images into it, or set the image folder to one that holds them all",
    )


def _check_image_files(images: list[CocoImage], folder: Path, path: Path) -> None:
    """Refuse images missing under ``folder``, unreadable, or of another size than the JSON says; only
    each file's header is read."""
    missing, unreadable, wrong_size = [], [], []
    for image in images:
        file = folder / image.file_name
        try:
            with open_image(file) as img:
                size = img.size
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            missing.append(f"image id {image.id} file_name {image.file_name!r}")
            continue
        except (OSError, ValueError) as err:  # not an image PIL identifies, over the pixel limit
            unreadable.append(f"image id {image.id} file {file} ({err})")
            continue
        if size != (image.width, image.height):
            wrong_size.append(
                f"image id {image.id} file {file} is {size[0]}x{size[1]} px, the JSON says "
                f"{image.width}x{image.height} (width x height)"
            )
    _refuse(
        path,
        f"images missing under {folder}",
        missing,
        "image_folder is the folder the file_name entries are relative to",
        MissingFileError,
    )
    _refuse(path, "unreadable images", unreadable, "every file_name is an image file")
    _refuse(
        path,
        "images of another size than their entry says",
        wrong_size,
        "each entry's width and height are its image file's (annotations are in those pixels)",
    )


def _check_fields(
    path: Path, entries: list[dict], kind: str, fields: dict[str, tuple[Callable, str]]
) -> None:
    for key, (test, right) in fields.items():
        bad = [
            f"{_entry(kind, i, e)} has {key}={e[key]!r}"
            if key in e
            else f"{_entry(kind, i, e)} has no '{key}'"
            for i, e in enumerate(entries)
            if not test(e.get(key))
        ]
        _refuse(path, f"{kind} entries with a wrong '{key}'", bad, f"'{key}' is {right}")


def _entry(kind: str, index: int, entry: dict) -> str:
    """How an entry is named in messages: by its id when it has an integer one, else by its position."""
    return f"{kind} id {entry['id']}" if type(entry.get("id")) is int else f"{kind} #{index} (no integer id)"


def _repeated(values: list) -> list[str]:
    seen, repeated = set(), []
    for v in values:
        if v in seen:
            repeated.append(str(v))
        seen.add(v)
    return repeated


def _named(what: str, ids: list) -> str:
    shown = ", ".join(str(i) for i in ids[:SHOWN]) + (", ..." if len(ids) > SHOWN else "")
    return f"{len(ids)} {what} (ids {shown})"


def _refuse(
    path: Path, problem: str, entries: list[str], right: str, error: type[UserError] = InputError
) -> None:
    """Raise ``error`` naming the file, the problem, the first entries and their count, and what is right:
    the data's mistake, which the ``mae`` command reports in one ``error:`` line (``mae.errors``)."""
    if entries:
        shown = "; ".join(entries[:SHOWN]) + (
            f"; ... ({len(entries)} in all)" if len(entries) > SHOWN else ""
        )
        raise error(f"{path}: {problem}: {shown}. Expected: {right}")
