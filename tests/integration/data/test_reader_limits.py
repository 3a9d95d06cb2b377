"""Files that would crash a run or ask for gigabytes: malformed ``.npy`` headers, images over the
pixel limit on the array path, many-band images, narrow images whose evaluation view explodes, and
no-data fills. Each is the file's problem: every command skips it by name and goes on."""

import re

import numpy as np
import pytest
import tifffile
from PIL import Image

from mae.cli.main import invoke
from mae.data import ImageFolderDataModule
from mae.data.decoding.image import read_array
from tests.helpers import (
    TINY_KWARGS,
    csv_logger,
    read_metrics,
    tiny_pretraining_checkpoint,
    write_config,
    write_npy_header,
)

GOOD = (20, 24, 1)  # the good images' (H, W, C), float32


def _sparse_npy(path, shape, dtype="<f4"):
    """A real ``.npy`` of zeros of ``shape``, as a sparse file: gigabytes long, a few KB on disk."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": dtype, "fortran_order": False, "shape": tuple(shape)}
        )
        f.truncate(f.tell() + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return path


def _no_data_fill(path):
    pixels = np.full(GOOD, 0.5, np.float32)
    pixels[:4, :4] = -3.4028235e38  # GeoTIFF's no-data value: finite, so no NaN check sees it
    np.save(path, pixels)
    return path


# name: writer of a file that must be skipped by name, never crash a run or be trained on
BAD_NPY = {
    "zero_d.npy": lambda p: np.save(p, np.array(3.0, np.float32)),  # was IndexError
    "empty.npy": lambda p: np.save(p, np.zeros((0, 32, 1), np.float32)),  # was ZeroDivisionError
    # was MemoryError 74.5 GiB
    "claims_huge.npy": lambda p: write_npy_header(p, (200000, 200000), "<u2", b"\0" * 1024),
    "negative.npy": lambda p: write_npy_header(
        p, (-5, 32), "<f4", b"\0" * 1024
    ),  # was OverflowError at start-up
    "over_limit.npy": lambda p: _sparse_npy(p, (10240, 10240, 1)),  # 104.9 megapixels
    "many_bands.npy": lambda p: _sparse_npy(p, (4096, 4096, 64), "<u2"),  # 16.8 megapixels, 4 GiB as float32
    "no_data.npy": _no_data_fill,  # -3.4e38 fills
}


@pytest.fixture(scope="module")
def hostile_npy(tmp_path_factory):
    """train/{a,b}: 4 good float32 (20, 24, 1) arrays each and the bad files; val/a: 2 good ones and a
    1 x 1,000,000 array whose evaluation view (short side 18) would be 18 x 18,000,000."""
    root = tmp_path_factory.mktemp("npy")
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 2)):
        for label in ("a", "b"):
            (root / split / label).mkdir(parents=True)
            for i in range(count):
                np.save(
                    root / split / label / f"{i}.npy",
                    (rng.random(GOOD) * 0.5 + 0.4 * (label == "b")).astype("f4"),
                )
    for i, (name, write) in enumerate(BAD_NPY.items()):
        write(root / "train" / "ab"[i % 2] / name)
    _sparse_npy(root / "val" / "a" / "narrow.npy", (1, 1_000_000, 1))
    return root


def _good_train_pixels(root):
    return np.concatenate(
        [np.load(root / "train" / c / f"{i}.npy").reshape(-1) for c in "ab" for i in range(4)]
    )


def test_train__malformed_oversized_and_no_data_npy_files_are_skipped_by_name(hostile_npy, tmp_path, caplog):
    config = {
        "seed_everything": 0,
        "model": {"model": "mae_vit_tiny_patch4", "model_kwargs": TINY_KWARGS, "optim": {"warmup_epochs": 0}},
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {
                "root": str(hostile_npy),
                "img_size": 16,
                "batch_size": 5,
                "num_workers": 0,
                "in_chans": 1,
                "mean": [0.45],
                "std": [0.3],
            },
        },  # 15 training files: 3 whole batches
        "trainer": {
            "max_epochs": 1,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            "logger": csv_logger(tmp_path, "hostile"),
        },
    }
    with caplog.at_level("WARNING"):
        invoke("pretrain", ["--config", str(write_config(tmp_path, config, "pretrain"))])
    metrics = read_metrics(tmp_path / "runs" / "hostile" / "version_0")
    assert any(row.get("train/loss_epoch") for row in metrics) and any(row.get("val/loss") for row in metrics)
    for name in [*BAD_NPY, "narrow.npy"]:
        assert re.search(
            rf"skipping unreadable image {re.escape(str(hostile_npy))}\S*/{name} \(", caplog.text
        ), name
    assert (
        "max_image_pixels" in caplog.text
        and "no-data fills" in caplog.text
        and "evaluation view" in caplog.text
    )


def test_stats__skips_malformed_oversized_and_no_data_files_by_name(hostile_npy, capsys):
    stats = invoke("stats", [str(hostile_npy), "--in-chans", "1"])
    err = capsys.readouterr().err
    for name in BAD_NPY:
        assert f"{name} (" in err, name
    assert stats.images == 8 and len(stats.skipped) == len(BAD_NPY)
    good = _good_train_pixels(hostile_npy).astype(np.float64)
    np.testing.assert_allclose(stats.mean, [good.mean()], rtol=1e-9)  # was -8.9e35 with the no-data fills


def test_stats__a_105_megapixel_zlib_tiff_is_skipped_not_averaged_in(tmp_path, capsys):
    rng = np.random.default_rng(0)
    (tmp_path / "train" / "a").mkdir(parents=True)
    small = [rng.integers(0, 256, (16, 16), dtype=np.uint8) for _ in range(3)]
    for i, pixels in enumerate(small):
        tifffile.imwrite(tmp_path / "train" / "a" / f"{i}.tif", pixels)
    tile = np.zeros((1024, 1024), np.uint8)  # 10240 x 10240 zeros in about 100 KB
    tifffile.imwrite(
        tmp_path / "train" / "a" / "zz_bomb.tif",
        (tile for _ in range(100)),
        shape=(10240, 10240),
        dtype=np.uint8,
        tile=(1024, 1024),
        compression="zlib",
    )
    stats = invoke("stats", [str(tmp_path)])
    assert "zz_bomb.tif" in capsys.readouterr().err and stats.images == 3
    np.testing.assert_allclose(stats.mean, [np.mean(small) / 255], rtol=1e-6)  # was 0.0001: the zeros counted

    dm = ImageFolderDataModule(
        str(tmp_path),
        img_size=8,
        batch_size=2,
        num_workers=0,
        in_chans=1,
        mean=[0.5],
        std=[0.3],
        on_bad_image="raise",
    )
    dm.setup()
    with pytest.raises(
        ValueError, match=r"zz_bomb.tif is 10240x10240 = 104,857,600 pixels, over data.max_image_pix"
    ):
        dm.train_set[3]


@pytest.mark.slow  # the shard tool's worker process and litdata's polling: about 12 s
def test_shard__malformed_and_oversized_npy_files_are_skipped_not_stored(hostile_npy, tmp_path, capfd):
    metadata = invoke(
        "shard",
        [
            str(hostile_npy),
            "--out",
            str(tmp_path / "shards"),
            "--workers",
            "1",
            "--chunk-bytes",
            "2KB",
            "--start-method",
            "fork",
            "--val-split",
            "",
        ],
    )
    err = capfd.readouterr().err
    for name in BAD_NPY:
        assert re.search(rf"skipping unreadable image {re.escape(str(hostile_npy))}\S*/{name} \(", err), name
    assert metadata["splits"]["train"]["images"] == 8 and metadata["splits"]["train"]["skipped"] == len(
        BAD_NPY
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("ckpt"))  # RGB, 16x16 inputs


def test_reconstruct__bad_huge_and_narrow_files_skipped_by_name_and_the_rest_drawn(
    checkpoint, tmp_path, capsys, tmp_path_factory
):
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(
        tmp_path / "ok.png"
    )
    Image.new("RGB", (1_000_000, 1)).save(tmp_path / "narrow.png")  # 1 KB, its view 16 x 16,000,000 (12.3 GB)
    tifffile.imwrite(
        tmp_path / "bands.tif",
        shape=(64, 4096, 4096),
        dtype="uint16",
        photometric="minisblack",
        planarconfig="separate",
    )  # 4 GiB as float32, sparse on disk
    for name in ("zero_d.npy", "empty.npy", "claims_huge.npy", "negative.npy", "no_data.npy"):
        BAD_NPY[name](tmp_path / name)
    out = tmp_path_factory.mktemp("figure") / "fig.png"  # outside the input folder
    figure = invoke("reconstruct", ["--checkpoint", str(checkpoint), str(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    for name in (
        "narrow.png",
        "bands.tif",
        "zero_d.npy",
        "empty.npy",
        "claims_huge.npy",
        "negative.npy",
        "no_data.npy",
    ):
        assert f"skipped {tmp_path / name}: " in err, name
    assert "evaluation view" in err and "max_image_pixels" in err and "4.00 GiB" in err
    assert len(figure.losses) == 1 and out.exists()


@pytest.mark.parametrize("error", [MemoryError, RuntimeError, OverflowError])
def test_reconstruct__anything_a_reader_raises_is_that_files_problem(
    checkpoint, tmp_path, capsys, monkeypatch, error, tmp_path_factory
):
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "ok.png")
    tifffile.imwrite(tmp_path / "odd.tif", np.zeros((20, 20, 3), np.uint8), photometric="rgb")

    def failing_read(*args, **kwargs):
        raise error("the reader library gave up")

    monkeypatch.setattr(tifffile.TiffFile, "asarray", failing_read)
    odd = re.escape(str(tmp_path / "odd.tif"))
    with pytest.raises(
        ValueError, match=rf"cannot read {odd} as a TIFF: {error.__name__}: the reader library"
    ):
        read_array(tmp_path / "odd.tif")
    out = tmp_path_factory.mktemp("figure") / "fig.png"  # outside the input folder
    figure = invoke("reconstruct", ["--checkpoint", str(checkpoint), str(tmp_path), "--out", str(out)])
    assert (
        f"skipped {tmp_path / 'odd.tif'}: cannot read" in capsys.readouterr().err and len(figure.losses) == 1
    )


def test_validation__a_1_by_1000000_png_is_skipped_by_name_before_it_is_resized(tmp_path, caplog):
    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
        for i in range(2):
            Image.fromarray(np.full((20, 20, 3), 100, np.uint8)).save(tmp_path / split / "a" / f"{i}.png")
    # view 18 x 18,000,000: 5.2 GB
    Image.new("RGB", (1_000_000, 1)).save(tmp_path / "val" / "a" / "narrow.png")
    dm = ImageFolderDataModule(str(tmp_path), img_size=16, batch_size=2, num_workers=0)
    dm.setup()
    with caplog.at_level("WARNING"):
        assert dm.val_set[2][0].shape == (3, 16, 16)  # the next readable image
    assert "narrow.png" in caplog.text and "1000000x1: resized to short side 18" in caplog.text
