"""The MVTec AD folder layout, read: the normal images, the test images with their labels, and their
ground-truth masks at the model's input size.

    <category>/train/good/*.png             normal images (``--normal``: any folder of images)
    <category>/test/good/*.png              normal test images
    <category>/test/<defect>/*.png          defective test images, one folder per kind of defect
    <category>/ground_truth/<defect>/<name>_mask.png   the defect's pixels (non-zero), the size of <name>

A test folder without class folders (images only) is scored without labels: no metrics.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from mae.data.decoding.formats import READERS
from mae.data.decoding.image import read_header
from mae.errors import InputError, MissingFileError
from mae.inference.images import image_paths

GOOD = "good"
GROUND_TRUTH = "ground_truth"
MASK_SUFFIX = "_mask.png"


@dataclass(frozen=True)
class TestImage:
    """One test image: ``path``, its class folder (``"good"``, a defect's name, or None when the test
    folder has no class folders) and its ground-truth mask file (defects with ground truth only)."""

    path: Path
    kind: str | None = None
    mask: Path | None = None

    @property
    def label(self) -> int | None:
        """1 = defective, 0 = good, None = unlabelled."""
        return None if self.kind is None else int(self.kind != GOOD)


@dataclass
class TestSet:
    """The test images, sorted by class folder then path; ``has_masks``: ground truth for every defect;
    ``ground_truth``: the masks' folder, if any; ``unused_masks``: its image files that are no test image's
    mask (an image removed, a defect folder renamed), sorted, so a command can name them."""

    root: Path
    images: list[TestImage]
    has_masks: bool
    ground_truth: Path | None = None
    unused_masks: list[Path] = field(default_factory=list)

    @property
    def labelled(self) -> bool:
        return self.images[0].kind is not None

    @property
    def kinds(self) -> list[str]:
        """The class folders, ``good`` first."""
        return sorted({i.kind for i in self.images if i.kind}, key=lambda k: (k != GOOD, k))


def normal_images(root: str | os.PathLike) -> list[Path]:
    """The image files under ``root`` (recursively, sorted).

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ValueError: it holds no image file.
    """
    root = Path(root)
    if not root.is_dir():
        raise MissingFileError(
            f"normal-image folder {root} does not exist: give a folder of defect-free images "
            f"(in the MVTec AD layout, <category>/train/good)"
        )
    paths = image_paths([root])
    if not paths:
        raise InputError(
            f"normal-image folder {root} holds no image file: give a folder of defect-free images"
        )
    return paths


def read_test_set(root: str | os.PathLike, ground_truth: str | os.PathLike | None = None) -> TestSet:
    """The test images under ``root``: its class folders (``good`` and one per defect) or, with none, its
    images unlabelled; each defect image's mask from ``ground_truth`` (default: ``root/../ground_truth``,
    when that folder exists).

    Raises:
        FileNotFoundError: ``root``, or a ``ground_truth`` given, does not exist.
        ValueError: class folders without ``good``; images beside class folders; an empty folder; a defect
            image without its mask (naming the file expected). A mask without its image is no error (the
            images there are scored right): it is listed in ``unused_masks``.
    """
    root = Path(root)
    if not root.is_dir():
        raise MissingFileError(
            f"test folder {root} does not exist: give the test images' folder "
            f"(in the MVTec AD layout, <category>/test)"
        )
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        images = [TestImage(path) for path in image_paths([root])]
        if not images:
            raise InputError(f"test folder {root} holds no image file and no class folder")
        return TestSet(root, images, has_masks=False)
    _check_class_folders(root, folders)
    gt_root = _ground_truth_root(root, ground_truth)
    images = [image for folder in folders for image in _class_images(folder, gt_root)]
    images.sort(key=lambda i: (i.kind != GOOD, i.kind, i.path))
    has_masks = gt_root is not None and any(i.label for i in images)
    used = {i.mask for i in images}
    unused = [p for p in image_paths([gt_root]) if p not in used] if gt_root is not None else []
    return TestSet(root, images, has_masks, gt_root, unused)


def _check_class_folders(root: Path, folders: list[Path]) -> None:
    """Refuse class folders without ``good``, and images beside class folders."""
    names = [f.name for f in folders]
    if GOOD not in names:
        hint = f" (did you mean {root / 'test'}?)" if (root / "test").is_dir() else ""
        raise InputError(
            f"test folder {root} has class folders {names} but no {GOOD!r}{hint}: put the defect-free test "
            f"images in {root / GOOD} and each kind of defect in a folder of its own (MVTec AD layout), or "
            "give a folder of images without class folders to score them without labels"
        )
    loose = sorted(p.name for p in root.iterdir() if p.is_file() and p.suffix.lower() in READERS)
    if loose:
        raise InputError(
            f"test folder {root} has images beside its class folders ({loose[:3]}): move them into "
            f"{root / GOOD} or a defect's folder"
        )


def _class_images(folder: Path, gt_root: Path | None) -> list[TestImage]:
    """The images of one class folder, each defect image with its mask from ``gt_root`` (when there)."""
    paths = image_paths([folder])
    if not paths:
        raise InputError(f"class folder {folder} holds no image file: add its images or remove the folder")
    images = []
    for path in paths:
        mask = None
        if gt_root is not None and folder.name != GOOD:
            mask = gt_root / folder.name / path.relative_to(folder).with_name(path.stem + MASK_SUFFIX)
            if not mask.is_file():
                raise InputError(
                    f"{path} has no ground-truth mask: expected {mask} (non-zero = defect, the image's "
                    "size); add it, or point --ground-truth at the right folder"
                )
        images.append(TestImage(path, folder.name, mask))
    return images


def _ground_truth_root(root: Path, ground_truth: str | os.PathLike | None) -> Path | None:
    if ground_truth is not None:
        if not Path(ground_truth).is_dir():
            raise MissingFileError(f"ground-truth folder {ground_truth} does not exist")
        return Path(ground_truth)
    default = root.parent / GROUND_TRUTH
    return default if default.is_dir() else None


def read_mask(path: Path, image: Path) -> torch.Tensor:
    """(H, W) bool ground truth of ``image`` (non-zero = defect), refused unless it has the image's size.

    Raises:
        ValueError: naming the mask: unreadable, or of another size than its image (with both sizes).
    """
    try:
        with Image.open(path) as file:
            pixels = np.asarray(file.convert("L"))
    except (OSError, SyntaxError, ValueError) as err:
        raise InputError(
            f"cannot read ground-truth mask {path}: {err}; replace it with a PNG (non-zero = defect)"
        ) from err
    header = read_header(image)
    if pixels.shape != (header.height, header.width):
        raise InputError(
            f"ground-truth mask {path} is {pixels.shape[1]}x{pixels.shape[0]} but its image {image} is "
            f"{header.width}x{header.height}: a mask must have its image's size (width x height); write it "
            f"at {header.width}x{header.height}"
        )
    return torch.from_numpy(pixels > 0)


def mask_view(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(H, W) bool -> (size) bool: resized (short side, bilinear) and centre-cropped as ``load_image``
    views its image, then thresholded at one half."""
    pixels = TF.resize(
        mask[None].float(), int(max(size)), interpolation=TF.InterpolationMode.BILINEAR, antialias=True
    )
    return TF.center_crop(pixels, list(size))[0] > 0.5
