"""Semantic segmentation: image/mask folders and their start-up checks, the training and validation
views, UperNet's head over the feature pyramid, and the mIoU / accuracy metrics."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.nn import functional as F

from mae.convert.backbone import build_vit
from mae.dense.data.segmentation import (
    DigitScenesSegmentation,
    SegmentationDataModule,
    SegmentationFolder,
    collate_padded,
)
from mae.dense.metrics.segmentation import SegmentationMetrics
from mae.dense.models.pyramid import SimpleFeaturePyramid
from mae.dense.models.upernet import UperNetHead, upsample_logits
from mae.models import create_model
from tests.helpers import TINY_KWARGS

IGNORE = 255


def _write_mask(path: Path, labels: np.ndarray, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "P":  # indices with a palette whose colours are not the indices
        img = Image.frombytes("P", labels.shape[::-1], labels.astype(np.uint8).tobytes())
        img.putpalette([c for i in range(256) for c in (255 - i, (7 * i) % 256, 128)])
    elif mode == "I;16":
        img = Image.fromarray(labels.astype(np.uint16))
    elif mode == "RGB":
        img = Image.fromarray(np.stack([labels.astype(np.uint8)] * 3, axis=-1))
    else:
        img = Image.fromarray(labels.astype(np.uint8))
    assert img.mode == mode
    img.save(path)


def _encoded_image(labels: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 image whose every channel is 20 * (label + 1): never 0, the padding value."""
    return np.repeat((20 * (np.minimum(labels, 11) + 1)).astype(np.uint8)[..., None], 3, axis=-1)


def _write_pair(
    root: Path, name: str, labels: np.ndarray, mode: str = "L", split: str = "train", ext=".png"
) -> None:
    image = root / "images" / split / f"{name}{ext}"
    image.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(_encoded_image(labels)).save(image)
    _write_mask(root / "masks" / split / f"{name}.png", labels, mode)


def _folder(root: Path, split: str = "train", **kwargs) -> SegmentationFolder:
    kwargs = {"num_classes": 12, **kwargs}
    return SegmentationFolder(root / "images" / split, root / "masks" / split, **kwargs)


def _blocks(height: int, width: int, block: int) -> np.ndarray:
    """(H, W) labels in block x block squares, label = row * 4 + column of the block, mod 12."""
    rows, cols = np.indices((height, width)) // block
    return (rows * 4 + cols) % 12


# --- SegmentationFolder -------------------------------------------------------------------------------------


def test_folder__reads_8bit_palette_and_16bit_masks_as_index_labels(tmp_path):
    labels = np.array([[0, 1, 2, 3], [4, 5, IGNORE, 11], [11, 10, 9, 8]])
    for mode in ("L", "P", "I;16"):
        _write_pair(tmp_path, f"mask_{mode.replace(';', '')}", labels, mode)
    folder = _folder(tmp_path)
    assert len(folder) == 3
    for i in range(3):
        image, mask = folder[i]
        assert image.dtype == torch.float32 and image.shape == (3, 3, 4)
        assert mask.dtype == torch.int64 and type(mask) is torch.Tensor
        torch.testing.assert_close(mask, torch.from_numpy(labels).long(), rtol=0, atol=0)
        expected = torch.from_numpy(_encoded_image(labels)).permute(2, 0, 1) / 255
        torch.testing.assert_close(image, expected)


def test_folder__reduce_zero_label_makes_0_unlabelled_and_shifts_the_classes(tmp_path):
    _write_pair(tmp_path, "a", np.array([[0, 1, 2], [150, IGNORE, 0]]))
    mask = _folder(tmp_path, num_classes=150, reduce_zero_label=True)[0][1]
    assert mask.tolist() == [[IGNORE, 0, 1], [149, IGNORE, IGNORE]]
    mask = _folder(tmp_path, num_classes=151)[0][1]  # without: the values as they are
    assert mask.tolist() == [[0, 1, 2], [150, IGNORE, 0]]


def test_folder__missing_or_empty_folders_are_named(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=rf"image folder {tmp_path / 'images' / 'train'} does not exist"
    ):
        _folder(tmp_path)
    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "images" / "train" / "notes.txt").write_text("not an image")
    with pytest.raises(
        ValueError, match=rf"image folder {tmp_path / 'images' / 'train'} holds no image files"
    ):
        _folder(tmp_path)
    _write_pair(tmp_path, "a", np.zeros((4, 4)))
    (tmp_path / "masks" / "train" / "a.png").unlink()
    with pytest.raises(ValueError, match=rf"mask folder {tmp_path / 'masks' / 'train'} holds no mask files"):
        _folder(tmp_path)


def test_folder__an_image_without_mask_is_named_with_the_expected_mask_path(tmp_path):
    for name in ("a", "b", "c"):
        _write_pair(tmp_path, name, np.zeros((4, 4)), ext=".jpg" if name == "b" else ".png")
    (tmp_path / "masks" / "train" / "b.png").rename(tmp_path / "masks" / "train" / "b.jpg")
    (tmp_path / "masks" / "train" / "c.png").unlink()
    expected = tmp_path / "masks" / "train" / "b.png"
    message = (
        rf"image {tmp_path / 'images' / 'train' / 'b.jpg'} has no mask: expected {expected} \(found b.jpg: "
    )
    with pytest.raises(
        FileNotFoundError, match=message + r"masks are PNG index images\); 1 more images have no mask"
    ):
        _folder(tmp_path)


def test_folder__masks_without_images_are_named(tmp_path):
    _write_pair(tmp_path, "a", np.zeros((4, 4)))
    for i in range(7):
        _write_mask(tmp_path / "masks" / "train" / f"orphan{i}.png", np.zeros((4, 4)))
    first = tmp_path / "masks" / "train" / "orphan0.png"
    with pytest.raises(ValueError, match=rf"7 mask\(s\) in .* have no image .*: {first}, .* and 2 more"):
        _folder(tmp_path)


def test_folder__two_images_of_one_name_are_named(tmp_path):
    _write_pair(tmp_path, "a", np.zeros((4, 4)))
    _write_pair(tmp_path, "a", np.zeros((4, 4)), ext=".jpg")
    with pytest.raises(ValueError, match=r"images .*a\.(jpg|png) and .*a\.(jpg|png) share the name 'a'"):
        _folder(tmp_path)


def test_folder__a_mask_of_another_size_than_its_image_is_named(tmp_path):
    _write_pair(tmp_path, "a", np.zeros((4, 6)))
    _write_mask(tmp_path / "masks" / "train" / "a.png", np.zeros((4, 5)))
    image, mask = tmp_path / "images" / "train" / "a.png", tmp_path / "masks" / "train" / "a.png"
    with pytest.raises(ValueError, match=rf"mask {mask} is 5x4 px but its image {image} is 6x4 px"):
        _folder(tmp_path)


def test_folder__a_colour_mask_is_refused_with_the_index_png_hint(tmp_path):
    _write_pair(tmp_path, "a", np.zeros((4, 4)), mode="RGB")
    mask = tmp_path / "masks" / "train" / "a.png"
    with pytest.raises(
        ValueError, match=rf"mask {mask} has mode RGB \(3 channels\): class masks are single-channel "
    ):
        _folder(tmp_path)


def test_folder__labels_that_are_no_class_are_named_at_startup_with_a_reduce_zero_label_hint(tmp_path):
    _write_pair(tmp_path, "a", np.array([[0, 149, 150, IGNORE]]))
    mask = tmp_path / "masks" / "train" / "a.png"
    hint = r"if the classes are 1 \.\. 150 and 0 is unlabelled \(ADE20K\), set reduce_zero_label=True"
    with pytest.raises(
        ValueError, match=rf"mask {mask} has values 150 that are no class of num_classes=150: .*{hint}"
    ):
        _folder(tmp_path, num_classes=150)
    _write_pair(tmp_path, "a", np.array([[0, 150, 151, 200]]))
    with pytest.raises(
        ValueError, match=r"has values 151, 200 .* 1 \.\. 150 are classes 0 \.\. 149 and 0 is unl"
    ):
        _folder(tmp_path, num_classes=150, reduce_zero_label=True)
    _write_pair(tmp_path, "a", np.array([[0, 300]]), mode="I;16")
    with pytest.raises(
        ValueError, match=rf"mask {mask} has values 300 .*ignore_index=255 marks unlabelled pixels$"
    ):
        _folder(tmp_path, num_classes=150)


def test_folder__a_bad_mask_outside_the_startup_sample_fails_by_name_when_loaded(tmp_path):
    for name, top in (("a", 1), ("b", 12), ("c", 2)):
        _write_pair(tmp_path, name, np.array([[0, top]]))
    folder = _folder(tmp_path, check_labels=2)  # checks the first and the last
    assert folder[0][1].tolist() == [[0, 1]]
    with pytest.raises(ValueError, match=rf"mask {tmp_path / 'masks' / 'train' / 'b.png'} has values 12 "):
        folder[1]
    with pytest.raises(ValueError, match=r"b\.png has values 12 "):
        _folder(tmp_path, check_labels=None)


def _truncate(path: Path) -> None:
    """Cut a file's pixel data, its header intact (PIL still opens it and reads its size)."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 6 // 10])


def test_folder__a_truncated_mask_or_image_is_named(tmp_path):
    # noise: pixel data PNG cannot squeeze to nothing
    labels = np.random.default_rng(0).integers(0, 12, (32, 32))
    for name in ("a", "b"):
        _write_pair(tmp_path, name, labels)
    mask = tmp_path / "masks" / "train" / "b.png"
    _truncate(mask)
    with pytest.raises(ValueError, match=rf"^cannot read mask {mask}: .*truncated.*; replace the file"):
        _folder(tmp_path)  # a mask of the start-up sample
    folder = _folder(tmp_path, check_labels=0)
    with pytest.raises(ValueError, match=rf"^cannot read mask {mask}: .*truncated"):
        folder[1]  # outside it: named when loaded
    _write_mask(mask, labels)
    image = tmp_path / "images" / "train" / "a.png"
    _truncate(image)
    with pytest.raises(ValueError, match=rf"^cannot read image {image}: .*truncated.*; replace the file"):
        _folder(tmp_path)[0]


def test_folder__ignore_index_that_is_a_class_is_refused():
    with pytest.raises(ValueError, match="ignore_index=3 is one of the 12 classes"):
        SegmentationFolder("images", "masks", num_classes=12, ignore_index=3)


# --- SegmentationDataModule ---------------------------------------------------------------------------------


def _aligned(image: torch.Tensor, mask: torch.Tensor) -> int:
    """Assert that (3, H, W) image and (H, W) mask views came from the same pixels: padding (image 0) is
    exactly where the mask is ``IGNORE``, and away from label edges (blurred by the bilinear resize) each
    pixel's value encodes its label. Returns how many pixels were compared."""
    padding = mask == IGNORE
    assert torch.equal((image == 0).all(0), padding)
    labels = torch.where(padding, -1, mask).float()[None, None]
    uniform = (F.max_pool2d(labels, 5, 1, 2) == -F.max_pool2d(-labels, 5, 1, 2))[0, 0] & ~padding
    value = (image[0] * 255).round()
    assert (value[uniform] - 20 * (mask[uniform] + 1)).abs().max() <= 1
    return int(uniform.sum())


def _module(root: Path, **kwargs) -> SegmentationDataModule:
    kwargs = {"num_classes": 12, "img_size": 32, "batch_size": 4, "num_workers": 0, **kwargs}
    return SegmentationDataModule(root, masks="masks/{split}", train_split="train", val_split="val", **kwargs)


def test_data_module__training_views_crop_pad_and_flip_image_and_mask_together(tmp_path):
    for i, (h, w) in enumerate([(48, 64), (64, 48), (40, 40), (48, 56)]):
        _write_pair(tmp_path, f"t{i}", _blocks(h, w, 16))
    _write_pair(tmp_path, "v0", _blocks(32, 32, 16), split="val")
    data = _module(tmp_path)
    data.setup("fit")
    torch.manual_seed(0)
    flipped, padded, compared = set(), 0, 0
    for _ in range(4):
        images, masks = next(iter(data.train_dataloader()))
        assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
        assert masks.shape == (4, 32, 32) and masks.dtype == torch.int64
        for image, mask in zip(images, masks, strict=True):
            compared += _aligned(image, mask)
            padded += bool((mask == IGNORE).any())
            row = mask[mask.ne(IGNORE).sum(1).argmax()]
            row = row[row != IGNORE].unique_consecutive()
            flipped.add(bool(row[0] > row[-1]) if len(row) > 1 else None)
    assert compared > 16 * 32 * 32 * 0.3
    # both orientations seen, and crops of small rescales padded
    assert {True, False} <= flipped and padded > 0


def test_data_module__flip_off_keeps_every_view_in_its_orientation(tmp_path):
    for i in range(4):
        _write_pair(tmp_path, f"t{i}", _blocks(32, 32, 16))
    _write_pair(tmp_path, "v0", _blocks(32, 32, 16), split="val")
    data = _module(tmp_path, flip=False, scale_range=(1.0, 1.0))
    data.setup("fit")
    torch.manual_seed(0)
    for _ in range(8):
        for image, mask in zip(*next(iter(data.train_dataloader())), strict=True):
            # 16 draws: unflipped every time
            assert torch.equal(mask, torch.as_tensor(_blocks(32, 32, 16)).long())
            assert _aligned(image, mask) > 0  # the image unflipped with its mask


def test_digit_scenes__training_views_are_the_written_scenes_unflipped(tmp_path):
    data = DigitScenesSegmentation(root=tmp_path / "scenes", num_train=6, num_val=2, batch_size=6)
    data.setup("fit")
    assert not data.flip  # a mirrored digit is no digit
    torch.manual_seed(0)
    for _ in range(4):
        for index in range(len(data.train_set)):
            image, mask = data.train_set[index]
            name = f"{index:06d}.png"
            written_mask = np.asarray(Image.open(tmp_path / "scenes" / "masks" / "train" / name))
            written_image = np.asarray(Image.open(tmp_path / "scenes" / "images" / "train" / name))
            assert torch.equal(mask, torch.as_tensor(written_mask).long())
            assert torch.equal((image * 255).round().byte(), torch.as_tensor(written_image).permute(2, 0, 1))


def test_data_module__validation_batches_are_resized_and_padded_with_ignore_index(tmp_path):
    _write_pair(tmp_path, "t0", _blocks(32, 32, 16))
    _write_pair(tmp_path, "a", _blocks(48, 64, 16), split="val")  # short side 48 -> 32: 32 x 42
    _write_pair(tmp_path, "b", _blocks(40, 40, 8), split="val")  # -> 32 x 32, padded to 32 x 42
    data = _module(tmp_path, class_names=[f"c{i}" for i in range(12)])
    data.setup("validate")
    assert data.train_set is None and (data.num_classes, data.ignore_index, data.class_names[3]) == (
        12,
        255,
        "c3",
    )
    images, masks = next(iter(data.val_dataloader()))
    assert images.shape == (2, 3, 32, 42) and masks.shape == (2, 32, 42)
    assert (masks[1, :, 32:] == IGNORE).all() and (images[1, :, :, 32:] == 0).all()
    assert not (masks[1, :, :32] == IGNORE).any() and not (masks[0] == IGNORE).any()
    for image, mask in zip(images, masks, strict=True):
        _aligned(image, mask)
    # the collate alone: heights and widths padded separately
    batch = [
        (torch.ones(3, 2, 3), torch.zeros(2, 3, dtype=torch.long)),
        (torch.ones(3, 4, 1), torch.ones(4, 1).long()),
    ]
    images, masks = collate_padded(batch, ignore_index=7)
    assert images.shape == (2, 3, 4, 3) and masks.tolist() == [
        [[0, 0, 0], [0, 0, 0], [7, 7, 7], [7, 7, 7]],
        [[1, 7, 7], [1, 7, 7], [1, 7, 7], [1, 7, 7]],
    ]
    assert images[0, :, 2:].eq(0).all() and images[1, :, :, 1:].eq(0).all()


def test_data_module__bad_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="data.class_names has 2 names for num_classes=12"):
        _module(tmp_path, class_names=["a", "b"])
    with pytest.raises(ValueError, match=r"data.scale_range must be \(low, high\) with 0 < low <= high"):
        _module(tmp_path, scale_range=(2.0, 0.5))
    with pytest.raises(ValueError, match=r"data.images='images/\{set\}': \{split\} is its only placeholder"):
        _module(tmp_path, images="images/{set}").setup("fit")


# --- UperNetHead --------------------------------------------------------------------------------------------


def _pyramid(out_channels: int = 16) -> SimpleFeaturePyramid:
    config = create_model("mae_vit_tiny_patch4", img_size=16, **TINY_KWARGS).config
    return SimpleFeaturePyramid(
        build_vit(config, img_size=16, dynamic_img_size=True), out_channels=out_channels
    )


def test_upernet__logits_at_the_finest_maps_size_and_upsampled_to_the_image():
    torch.manual_seed(0)
    pyramid = _pyramid()
    head = UperNetHead(pyramid.out_channels, num_classes=5, channels=8)
    images = torch.randn(2, 3, 30, 45)  # padded to 32 x 48 (4 px patches); the finest map has stride 1
    logits = head(pyramid(images))
    assert logits.shape == (2, 5, 32, 48)
    full = upsample_logits(logits, images.shape[-2:], pyramid.strides[0])
    torch.testing.assert_close(full, logits[..., :30, :45])  # stride 1: only the padding cropped
    coarse = logits[..., ::4, ::4]  # as if at stride 4: upsampled to 32 x 48, then cropped
    torch.testing.assert_close(
        upsample_logits(coarse, (30, 45), 4.0), upsample_logits(coarse, (32, 48))[..., :30, :45]
    )
    with pytest.raises(ValueError, match="do not cover 40x45 px"):
        upsample_logits(coarse, (40, 45), 4.0)


def test_upernet__cross_entropy_falls_over_a_few_steps_on_a_fixed_batch():
    torch.manual_seed(0)
    pyramid = _pyramid()
    head = UperNetHead(pyramid.out_channels, num_classes=3, channels=16)
    masks = torch.randint(0, 3, (2, 6, 6)).repeat_interleave(4, 1).repeat_interleave(4, 2)  # 4 px squares
    # the label is readable
    images = (masks[:, None] / 2).expand(2, 3, 24, 24) + 0.1 * torch.rand(2, 3, 24, 24)
    masks[:, :4] = IGNORE
    optimizer = torch.optim.AdamW([*pyramid.parameters(), *head.parameters()], lr=1e-2)
    losses = []
    for _ in range(15):
        logits = upsample_logits(head(pyramid(images)), images.shape[-2:], pyramid.strides[0])
        loss = F.cross_entropy(logits, masks, ignore_index=IGNORE)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0], losses  # about 1.1 (ln 3) -> 0.5


# --- SegmentationMetrics ------------------------------------------------------------------------------------


def test_metrics__miou_and_accuracies_match_a_hand_computation():
    target = torch.tensor([[[0, 0, 1, 1], [2, 2, IGNORE, 0]]])
    preds = torch.tensor([[[0, 1, 1, 1], [2, 0, 3, 0]]])  # class 3 predicted only on the ignored pixel
    # Confusion matrix over the 7 labelled pixels (rows target, columns prediction):
    #   target 0: predicted 0 twice, 1 once;  target 1: predicted 1 twice;
    #   target 2: predicted 2 once, 0 once.
    # IoU = TP / (row + column - TP): class 0: 2 / (3 + 3 - 2) = 1/2; class 1: 2 / (2 + 3 - 2) = 2/3;
    # class 2: 1 / (2 + 1 - 1) = 1/2; class 3: 0 / 0, absent from both, left out of the mean.
    # mIoU = (1/2 + 2/3 + 1/2) / 3 = 5/9 (over all four classes with 0 for class 3 it would be 5/12).
    # Pixel accuracy = (2 + 2 + 1) / 7 = 5/7; class accuracy: 2/3, 2/2, 1/2 -> mean 13/18.
    metrics = SegmentationMetrics(4, class_names=["a", "b", "c", "d"], per_class=True)
    metrics.update(preds, target)
    results = metrics.compute()
    expected = {
        "val/miou": 5 / 9,
        "val/acc": 5 / 7,
        "val/macc": 13 / 18,
        "val/iou/a": 1 / 2,
        "val/iou/b": 2 / 3,
    }
    for key, value in expected.items():
        assert results[key].item() == pytest.approx(value), key
    assert torch.isnan(results["val/iou/d"])
    # The same batch again as logits: the matrix doubles, the ratios stay. Then class 3 predicted on a
    # labelled pixel (target 1 there): its IoU is 0 / (0 + 1 + 0) and it counts.
    metrics.update(F.one_hot(preds, 4).permute(0, 3, 1, 2).float(), target)
    assert metrics.compute()["val/miou"].item() == pytest.approx(5 / 9)
    metrics.reset()
    metrics.update(torch.tensor([[3, 1]]), torch.tensor([[1, 1]]))
    # class 1: 1 / (2 + 1 - 1) = 1/2; class 3: 0 / (0 + 1 - 0) = 0; classes 0 and 2 absent -> mIoU 1/4
    assert metrics.compute()["val/miou"].item() == pytest.approx(1 / 4)


def test_metrics__states_of_split_data_sum_to_the_whole():
    generator = torch.Generator().manual_seed(0)
    target = torch.randint(0, 5, (4, 6, 6), generator=generator)
    target[target == 4] = IGNORE
    preds = torch.randint(0, 4, (4, 6, 6), generator=generator)
    whole, first, second = SegmentationMetrics(4), SegmentationMetrics(4), SegmentationMetrics(4)
    whole.update(preds, target)
    first.update(preds[:1], target[:1])
    second.update(preds[1:], target[1:])
    first.merge_state(second)  # what the processes' sync does: the confusion matrices are summed
    for key, value in whole.compute().items():
        torch.testing.assert_close(first.compute()[key], value)


def test_metrics__mismatched_shapes_and_labels_that_are_no_class_are_named():
    metrics = SegmentationMetrics(4)
    with pytest.raises(ValueError, match=r"predictions \(1, 3, 2, 2\) do not match targets \(1, 2, 2\)"):
        metrics.update(torch.zeros(1, 3, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"target labels \[4, 7\] are no class of num_classes=4 \(nor ignore_index"
    ):
        metrics.update(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[4, 7]]))
    with pytest.raises(ValueError, match=r"predicted labels \[9\] are no class of num_classes=4"):
        metrics.update(torch.tensor([[9, 0]]), torch.tensor([[0, IGNORE]]))
