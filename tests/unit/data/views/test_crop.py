"""The one random crop of every path (``mae.data.views.crop``): the official recipe's pixels and random
numbers, from an opened image or a file path, the same box on the RGB and the array paths, and the float
resize of the GPU path within one level of the CPU kernel."""

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from mae.data import pretrain_transform
from mae.data.views.arrays import ArrayView
from mae.data.views.crop import CROP_RATIO, CROP_SCALE, PretrainCrop, resized_crop
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD, normalize_batch
from tests.helpers import jpeg_bytes, write_smooth_jpeg


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
    path = write_smooth_jpeg(tmp_path / "a.jpg")
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
    path = write_smooth_jpeg(tmp_path / "a.jpg", size=(120, 90))
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


def test_random_crop__the_rgb_and_the_array_paths_crop_the_same_box(tmp_path):
    """Same seed, same 8-bit image: the uint8 crop and the float array view draw one box and one flip
    (``random_crop``), so they agree up to the two paths' rounding."""
    rng = np.random.default_rng(0)
    path = tmp_path / "x.png"
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(path)
    assert PretrainCrop(16).scale == CROP_SCALE["pretrain"] and PretrainCrop.ratio == CROP_RATIO
    for seed in range(5):
        torch.manual_seed(seed)
        uint8_crop = PretrainCrop(16)(str(path)).float() / 255
        torch.manual_seed(seed)
        view = ArrayView("pretrain", 16, 3, tuple(IMAGENET_MEAN), tuple(IMAGENET_STD))(path)
        float_crop = view * torch.tensor(IMAGENET_STD).view(-1, 1, 1) + torch.tensor(IMAGENET_MEAN).view(
            -1, 1, 1
        )
        assert (uint8_crop - float_crop).abs().mean() < 0.01  # a different box would differ by ~0.3


def test_gpu_decode__float_resize_of_cuda_is_within_one_level_of_the_cpu_kernel():
    pixels = torch.from_numpy(np.array(Image.open(io.BytesIO(jpeg_bytes(7, (64, 48)))))).permute(2, 0, 1)
    for box, flip in [((3, 5, 30, 40), False), ((0, 0, 48, 64), True), ((10, 2, 7, 9), False)]:
        cpu = resized_crop(pixels, box, flip, (16, 16))
        float_path = resized_crop(pixels, box, flip, (16, 16), float_math=True)
        assert (cpu.int() - float_path.int()).abs().max() <= 1
