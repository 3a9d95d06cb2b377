"""Streaming shards: the shard tool, the streaming data module on local disk and on an S3
server started on localhost (moto), mid-epoch resume, two-process DDP, GPU-decode equivalence on the
CPU, and clear start-up errors for bad shard locations."""

import contextlib
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from PIL import Image

from mae.cli.main import invoke
from mae.data import StreamingDataModule
from mae.data.sources.shard_format import read_metadata
from mae.data.sources.subsets import fixed_subset
from mae.io.storage import StorageError
from mae.training.callbacks import SigtermCheckpoint
from tests.forked_commands import ForkedProcess
from tests.helpers import (
    ID_SIDE,
    REPO,
    TINY_KWARGS,
    RecordIds,
    free_port,
    image_ids,
    make_trainer,
    pretrain_module,
    read_metrics,
    run_mae,
    slurm_task_env,
    write_id_images,
    write_image_folder,
)


class StopAfter(pl.Callback):
    """Saves a checkpoint after global step ``step`` and stops the run there, as a preempted job does."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def shard(src: Path, out: str, *extra: str) -> dict:
    """``mae shard`` in this process (fork workers: no re-import per worker)."""
    return invoke(
        "shard",
        [str(src), "--out", out, "--workers", "1", "--chunk-bytes", "2KB", "--start-method", "fork", *extra],
    )


def streaming_data(root: str, tmp: Path, **kwargs) -> StreamingDataModule:
    settings = dict(
        img_size=ID_SIDE, batch_size=4, num_workers=1, cache_dir=str(tmp / "cache"), shuffle_seed=3
    )
    return StreamingDataModule(root, **{**settings, **kwargs})


# ---------------------------------------------------------------- the shard tool


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """3 classes x 5 JPEGs of several sizes, a corrupt one, and a 2-image validation split."""
    root = tmp_path_factory.mktemp("folder")
    write_image_folder(root / "train", ["a", "b", "c"], per_class=5, size=(40, 30))
    write_image_folder(root / "val", ["a", "b", "c"], per_class=1, size=(30, 40), seed=1)
    (root / "train" / "b" / "zz_truncated.jpg").write_bytes(
        (root / "train" / "b" / "img_000.jpg").read_bytes()[:200]
    )
    return root


@pytest.fixture(scope="module")
def local_shards(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards") / "out"
    shard(folder, str(out))
    return out


def test_shard__stores_original_bytes_labels_and_a_summary(folder, local_shards, capsys):
    metadata = json.loads((local_shards / "mae_shards.json").read_text())
    assert metadata["format"] == "mae-shards" and metadata["version"] == 1
    assert metadata["classes"] == ["a", "b", "c"]
    assert metadata["splits"]["train"]["images"] == 15 and metadata["splits"]["train"]["skipped"] == 1
    assert metadata["splits"]["val"]["images"] == 3
    from litdata import StreamingDataset

    samples = [StreamingDataset(str(local_shards / "train"))[i] for i in range(15)]
    indices = [s["index"] for s in samples]  # positions in the sorted listing of 16 files (one unreadable)
    assert len(set(indices)) == 15 and max(indices) <= 15
    assert indices != sorted(indices)  # stored in a seeded random order
    by_name = {s["name"]: s for s in samples}
    assert "b/zz_truncated.jpg" not in by_name
    for name, sample in by_name.items():  # byte-identical to the files: nothing re-encoded
        assert bytes(sample["image"]) == (folder / "train" / name).read_bytes()
        assert sample["label"] == ["a", "b", "c"].index(name.split("/")[0])


def test_shard__skips_corrupt_files_by_name_and_selects_classes(folder, tmp_path, capfd):
    metadata = shard(folder, str(tmp_path / "out"), "--num-classes", "2", "--max-images-per-class", "3")
    err = capfd.readouterr()
    assert "zz_truncated.jpg" not in err.err  # class b's first 3 files are fine: the broken one is not listed
    assert metadata["classes"] == ["a", "b"] and metadata["splits"]["train"]["images"] == 6
    assert metadata["splits"]["val"]["images"] == 2
    shard(folder, str(tmp_path / "all"))
    out = capfd.readouterr()
    assert "skipping unreadable image" in out.err and "zz_truncated.jpg" in out.err
    assert "train: 15 images in 3 classes" in out.out and "1 unreadable file(s) skipped" in out.out


def test_shard__overwrite_removes_the_old_metadata_first_so_a_failed_rewrite_reads_as_unfinished(
    folder, tmp_path, monkeypatch
):
    import mae.data.tools.shard as shard_module

    out = tmp_path / "out"
    shard(folder, str(out))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # killed halfway through rewriting the shards

    monkeypatch.setattr(shard_module, "write_split", crash)
    with pytest.raises(KeyboardInterrupt):
        shard(folder, str(out), "--overwrite")
    with pytest.raises(FileNotFoundError, match="unfinished conversion"):
        read_metadata(str(out))


def test_shard__records_mixed_8_bit_kinds_so_other_in_chans_are_refused_at_start_up(tmp_path):
    """One grayscale JPEG among RGB ones, where the start-up sample does not see it: the RGB path takes
    the shards; reading them with in_chans 1 is refused at start, naming a file of each kind."""
    write_image_folder(tmp_path / "data" / "train", ["a", "b"], per_class=3, size=(20, 20))
    Image.fromarray(np.zeros((20, 20), np.uint8)).save(tmp_path / "data" / "train" / "b" / "zz_gray.jpg")
    metadata = shard(tmp_path / "data", str(tmp_path / "shards"))
    assert metadata["pixels"] is None and sorted(k[:2] for k in metadata["kinds"]) == [
        [1, "uint8"],
        [3, "uint8"],
    ]
    settings = dict(cache_dir=str(tmp_path / "cache"), img_size=16, batch_size=2, num_workers=0)
    StreamingDataModule(str(tmp_path / "shards"), **settings).setup("fit")
    with pytest.raises(ValueError, match=r"differ in channels or bit depth \(.*zz_gray.jpg has 1 channel"):
        StreamingDataModule(str(tmp_path / "shards"), in_chans=1, mean=[0.5], std=[0.2], **settings).setup(
            "fit"
        )


def test_shard__skips_images_over_the_pixel_limit_by_name_and_refuses_an_empty_result(
    folder, tmp_path, capfd
):
    """A 1,500-pixel limit skips the 80x60 PNG by name (and the truncated JPEG), keeping the 40x30
    images; a 1,000-pixel limit skips every training image: an error naming the folder, no metadata."""
    huge = tmp_path / "data"
    shutil.copytree(folder, huge)
    Image.fromarray(np.zeros((60, 80, 3), np.uint8)).save(huge / "train" / "a" / "zz_big.png")
    metadata = shard(huge, str(tmp_path / "ok"), "--max-image-pixels", "1500")
    assert metadata["splits"]["train"]["images"] == 15 and metadata["splits"]["train"]["skipped"] == 2
    assert re.search(r"skipping unreadable image .*zz_big\.png .*4,800 pixels, over", capfd.readouterr().err)
    with pytest.raises(ValueError, match=r"no readable image in .*train: all 17 files were skipped"):
        shard(huge, str(tmp_path / "none"), "--max-image-pixels", "1000")
    with pytest.raises(FileNotFoundError, match="unfinished conversion"):
        read_metadata(str(tmp_path / "none"))


def test_shard__refuses_a_non_empty_output_and_mixed_bit_depths(folder, local_shards, tmp_path):
    with pytest.raises(FileExistsError, match="not empty.*--overwrite"):
        shard(folder, str(local_shards))
    deep = tmp_path / "deep" / "train" / "a"
    deep.mkdir(parents=True)
    Image.fromarray(np.full((8, 8), 40000, np.uint16)).save(deep / "x.png")
    (deep.parent / "b").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(deep.parent / "b" / "z.png")
    with pytest.raises(
        ValueError, match=r"disagree: .*x\.png has 1 channel\(s\) of uint16, .*z\.png has 3 of uint8"
    ):
        shard(tmp_path / "deep", str(tmp_path / "o"))


@pytest.mark.parametrize("kind", ["gray16_png", "4band_tiff"])
def test_shard__16_bit_and_multi_band_data_streams_as_its_folder_reads(kind, tmp_path):
    """The array path from shards: the evaluation view of every sample equals the folder module's view
    of the same file, a corrupt file is skipped by name, and pretraining runs on the stream."""
    import tifffile
    from litdata import StreamingDataset

    from mae.data import ImageFolderDataModule

    rng = np.random.default_rng(0)
    channels = 1 if kind == "gray16_png" else 4
    for split, count in (("train", 8), ("val", 2)):
        for c in ("a", "b"):
            (tmp_path / "data" / split / c).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 65536, (20, 24, channels), dtype=np.uint16)
                name = tmp_path / "data" / split / c / f"{i}"
                if kind == "gray16_png":
                    Image.fromarray(pixels[..., 0]).save(f"{name}.png")
                else:
                    tifffile.imwrite(f"{name}.tif", pixels.transpose(2, 0, 1), photometric="minisblack")
    suffix = ".png" if kind == "gray16_png" else ".tif"
    (tmp_path / "data" / "train" / "b" / f"zz{suffix}").write_bytes(b"II*\x00broken")
    metadata = shard(tmp_path / "data", str(tmp_path / "shards"))
    assert metadata["array"] is True and metadata["pixels"] == [channels, "uint16"]
    assert metadata["splits"]["train"]["images"] == 16 and metadata["splits"]["train"]["skipped"] == 1
    settings = dict(
        img_size=16,
        in_chans=channels,
        mean=[0.5] * channels,
        std=[0.25] * channels,
        batch_size=4,
        num_workers=0,
    )
    folder = ImageFolderDataModule(str(tmp_path / "data"), **settings)
    folder.setup("fit")
    streamed = StreamingDataModule(str(tmp_path / "shards"), cache_dir=str(tmp_path / "cache"), **settings)
    train, _ = streamed.feature_datasets()
    eval_view = folder.eval_transform()
    raw = StreamingDataset(str(tmp_path / "shards" / "train"))
    for i in range(len(train)):
        view, label = train[i]
        assert view.shape == (channels, 16, 16)
        torch.testing.assert_close(
            view, eval_view(tmp_path / "data" / "train" / raw[i]["name"]), rtol=0, atol=0
        )
        assert label == ["a", "b"].index(raw[i]["name"][0])
    module = pretrain_module(in_chans=channels, optim=dict(warmup_epochs=0))
    make_trainer(tmp_path, max_epochs=1, limit_val_batches=1).fit(module, datamodule=streamed)
    assert torch.isfinite(torch.tensor(module.trainer.callback_metrics["train/loss"].item()))
    if channels == 4:  # (grayscale would repeat to RGB, as with folders)
        with pytest.raises(
            ValueError, match=r"has 4 channel\(s\) but data.in_chans is 3; set data.in_chans: 4"
        ):
            StreamingDataModule(
                str(tmp_path / "shards"), **{**settings, "in_chans": 3, "mean": None, "std": None}
            ).setup("fit")


# ---------------------------------------------------------------- bad shard locations


def test_streaming__bad_local_locations_are_named_at_start_up(local_shards, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no shard folder at data.root=.*missing.*mae shard"):
        read_metadata(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="missing or empty"):
        read_metadata(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="litdata folder without mae_shards.json"):
        read_metadata(str(local_shards / "train"))
    unfinished = tmp_path / "unfinished"
    (unfinished / "train").mkdir(parents=True)
    (unfinished / "train" / "chunk-0-0.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="unfinished conversion"):
        read_metadata(str(unfinished))
    old = tmp_path / "old"
    old.mkdir()
    (old / "mae_shards.json").write_text(json.dumps({"format": "mae-shards", "version": 0}))
    with pytest.raises(ValueError, match="version 0; this code reads 'mae-shards' version 1: reshard"):
        read_metadata(str(old))
    data = streaming_data(str(local_shards), tmp_path, train_split="training")
    with pytest.raises(FileNotFoundError, match="no split 'training'.*train, val"):
        data.setup("fit")


# ---------------------------------------------------------------- mid-epoch resume


def run_ids(
    root: str, tmp: Path, name: str, stop_at: int | None = None, resume: Path | None = None, **data_kwargs
):
    """(epoch, id) pairs a 3-epoch run sees; stopped after step ``stop_at`` or resumed from ``resume``."""
    module = RecordIds()
    callbacks = [StopAfter(stop_at, tmp / f"{name}.ckpt")] if stop_at else []
    trainer = make_trainer(tmp / name, max_epochs=3, callbacks=callbacks, limit_val_batches=0)
    trainer.fit(module, datamodule=streaming_data(root, tmp, **data_kwargs), ckpt_path=resume)
    return module.seen


def check_resume(root: str, tmp: Path, workers: int) -> None:
    full = run_ids(root, tmp, "full", num_workers=workers)
    assert len(full) == 3 * 24 and Counter(i for _, i in full) == Counter({i: 3 for i in range(24)})
    assert [i for e, i in full if e == 0] != [i for e, i in full if e == 1]  # reshuffled each epoch
    first = run_ids(root, tmp, "first", stop_at=8, num_workers=workers)  # epoch 1, batch 2 of 6
    second = run_ids(root, tmp, "second", resume=tmp / "first.ckpt", num_workers=workers)
    assert len(first) == 8 * 4
    assert Counter(first + second) == Counter(full)  # same (epoch, id) multiset: nothing repeated or lost
    assert first + second == full  # and, with the same seed, the same order


@pytest.fixture(scope="module")
def id_shards(tmp_path_factory) -> Path:
    """24 training images (ids 0-23) and 7 validation images (ids 100-106)."""
    tmp = tmp_path_factory.mktemp("ids")
    out = tmp / "shards"
    write_id_images(tmp / "images", 7, split="val", first=100)
    shard(write_id_images(tmp / "images", 24), str(out))
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_streaming__mid_epoch_resume_continues_the_stream(id_shards, tmp_path, workers):
    check_resume(str(id_shards), tmp_path, workers)


def test_streaming__resume_after_the_shards_and_cache_moved_but_not_with_another_seed(id_shards, tmp_path):
    """A requeued job may find the shards copied to another disk and its cache on another node: the
    stream continues. A different shuffle seed would repeat and skip images: refused, naming both."""
    full = run_ids(str(id_shards), tmp_path, "full")
    first = run_ids(str(id_shards), tmp_path, "first", stop_at=8)
    moved = tmp_path / "moved"
    shutil.copytree(id_shards, moved)
    module = RecordIds()
    trainer = make_trainer(tmp_path / "second", max_epochs=3, limit_val_batches=0)
    data = streaming_data(str(moved), tmp_path, cache_dir=str(tmp_path / "other_cache"))
    trainer.fit(module, datamodule=data, ckpt_path=tmp_path / "first.ckpt")
    assert first + module.seen == full
    trainer = make_trainer(tmp_path / "third", max_epochs=3, limit_val_batches=0)
    with pytest.raises(
        ValueError, match="data.shuffle_seed is 4 but the checkpoint's epoch was streamed with 3"
    ):
        trainer.fit(
            RecordIds(),
            datamodule=streaming_data(str(id_shards), tmp_path, shuffle_seed=4),
            ckpt_path=tmp_path / "first.ckpt",
        )
    # evaluating the checkpoint reads no stream: any seed will do
    make_trainer(tmp_path / "eval").validate(
        RecordIds(),
        datamodule=streaming_data(str(id_shards), tmp_path, shuffle_seed=4),
        ckpt_path=tmp_path / "first.ckpt",
    )
    resharded = tmp_path / "resharded"  # the same images converted again: another order
    shutil.copytree(id_shards.parent / "images", tmp_path / "images")
    shard(tmp_path / "images", str(resharded), "--seed", "1")
    trainer = make_trainer(tmp_path / "fourth", max_epochs=3, limit_val_batches=0)
    with pytest.raises(
        ValueError, match=r"streamed the shards \w+ \(24 training images\).*another conversion"
    ):
        trainer.fit(
            RecordIds(),
            datamodule=streaming_data(str(resharded), tmp_path),
            ckpt_path=tmp_path / "first.ckpt",
        )


def test_streaming__a_checkpoint_at_an_epoch_end_resumes_into_the_next_epochs(id_shards, tmp_path):
    """The same sequence as an uninterrupted run (the next epoch's shuffle, not the first's again), and
    whole epochs with another worker count."""
    full = run_ids(str(id_shards), tmp_path, "full")
    first = run_ids(str(id_shards), tmp_path, "first", stop_at=6)  # the end of epoch 0
    assert len(first) == 24
    assert first + run_ids(str(id_shards), tmp_path, "same", resume=tmp_path / "first.ckpt") == full
    second = run_ids(str(id_shards), tmp_path, "second", resume=tmp_path / "first.ckpt", num_workers=2)
    for epoch in (1, 2):
        assert sorted(i for e, i in second if e == epoch) == list(range(24))


# ---------------------------------------------------------------- two-process DDP

DDP_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
import lightning.pytorch as pl
from mae.data import StreamingDataModule
from tests.helpers import ID_SIDE, RecordIds, image_ids

tmp = Path({tmp!r})
module = RecordIds()
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, default_root_dir=tmp)
data = StreamingDataModule({root!r}, img_size=ID_SIDE, batch_size=4, num_workers=1,
                           cache_dir=str(tmp / "cache"))
trainer.fit(module, datamodule=data)
features = [[image_ids(ds[i][0][None])[0] for i in range(len(ds))] for ds in data.feature_datasets()]
record = {{"train": module.seen, "val": module.val_seen, "features": features}}
(tmp / f"ids_{{trainer.global_rank}}.json").write_text(json.dumps(record))
"""


@pytest.mark.ddp
def test_streaming__ddp_ranks_see_disjoint_parts_that_cover_each_epoch(id_shards, tmp_path):
    """Training: each rank half of every epoch, disjoint, together all. Validation: every image exactly
    once across the ranks (7 images: uneven). kNN / probe feature sets: the whole split on each rank."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(repo=str(REPO), tmp=str(tmp_path), root=str(id_shards)))
    # the two tasks of a one-node SLURM job, forked (no fresh interpreter for either rank; Lightning's own
    # launcher: tests/integration/pretrain/test_preemption.py)
    port, env = free_port(), {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on two cores
    with contextlib.ExitStack() as stack:
        tasks = [
            stack.enter_context(
                ForkedProcess(
                    [str(script)], REPO, {**env, **slurm_task_env(rank, 2, 1, port)}, new_session=True
                )
            )
            for rank in (0, 1)
        ]
        outputs = ["".join(task.communicate(timeout=400)) for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    ranks = [json.loads((tmp_path / f"ids_{r}.json").read_text()) for r in (0, 1)]
    for epoch in (0, 1):
        parts = [[i for e, i in rank["train"] if e == epoch] for rank in ranks]
        assert len(parts[0]) == len(parts[1]) == 12
        assert not set(parts[0]) & set(parts[1])
        assert sorted(parts[0] + parts[1]) == list(range(24))
        val = [[i for e, i in rank["val"] if e == epoch] for rank in ranks]
        assert sorted(val[0] + val[1]) == list(range(100, 107))  # each once: none dropped, none repeated
    for rank in ranks:
        assert sorted(rank["features"][0]) == list(range(24)) and sorted(rank["features"][1]) == list(
            range(100, 107)
        )


# ---------------------------------------------------------------- object storage (a local S3 server)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on localhost with bucket ``shards``; credentials and endpoint in the environment,
    as a user sets them for a real bucket."""
    pytest.importorskip("moto")
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3").create_bucket(Bucket="shards")
    yield env["AWS_ENDPOINT_URL"]
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_s3__shard_stream_and_resume_from_a_bucket(s3, tmp_path):
    import boto3

    metadata = shard(write_id_images(tmp_path / "images", 24), "s3://shards/ids")
    assert metadata["splits"]["train"]["images"] == 24
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="shards", Prefix="ids/")["Contents"]}
    assert {"ids/mae_shards.json", "ids/train/index.json"} <= keys and any(k.endswith(".bin") for k in keys)
    check_resume("s3://shards/ids", tmp_path, workers=1)


def default_pretrain_from(root: str) -> tuple[str, ...]:
    """``mae pretrain`` of the default recipe, streaming the shards at ``root``."""
    return (
        "pretrain",
        "--config",
        "configs/pretrain/default.yaml",
        "--data",
        "mae.data.StreamingDataModule",
        "--data.root",
        root,
    )


@pytest.fixture(scope="module")
def bucket_shards(s3, tmp_path_factory) -> str:
    """``mae shard`` of 24 training and 7 validation id images into the bucket, once for the module (the
    runs below only read it, each with a cache folder of its own): its ``s3://`` root."""
    images = write_id_images(tmp_path_factory.mktemp("bucket") / "images", 24)
    write_id_images(images, 7, split="val", first=100)
    root = "s3://shards/train_py"
    run_mae("shard", str(images), "--out", root, "--workers", "1", "--start-method", "fork")
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_s3__train_py_pretrains_from_a_bucket_with_validation_and_knn(bucket_shards, tmp_path, workers):
    """What a user runs: the shard command writes to the bucket, then ``train.py`` pretrains from it with
    validation and the kNN monitor on (both read the validation split by index, which litdata's ranged
    reads got wrong: its Arrow-batched chunks gave empty samples)."""
    root = bucket_shards
    run_mae(
        *default_pretrain_from(root),
        "--data.img_size",
        "16",
        "--data.batch_size",
        "8",
        "--data.num_workers",
        str(workers),
        "--data.cache_dir",
        str(tmp_path / "cache"),
        "--trainer.max_epochs",
        "2",
        "--model.optim.warmup_epochs",
        "0",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
    )
    rows = read_metrics(tmp_path / "runs" / "pretrain_default" / "version_0")
    val_losses = [float(r["val/loss"]) for r in rows if r["val/loss"]]
    assert len(val_losses) == 2 and np.isfinite(val_losses).all()
    knn = [float(r["val/knn_acc1"]) for r in rows if r["val/knn_acc1"]]
    assert knn and all(
        abs(a * 7 / 100 - round(a * 7 / 100)) < 1e-4 for a in knn
    )  # over the 7 validation images


def test_s3__a_missing_bucket_ends_the_command_with_its_error_alone(s3, tmp_path):
    result = run_mae(
        *default_pretrain_from("s3://nobucket/ids"),
        "--trainer.logger",
        "false",
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: bucket 'nobucket'")


def test_s3__bad_locations_fail_fast_with_the_url_and_the_fix(s3, tmp_path, monkeypatch):
    with pytest.raises(
        FileNotFoundError, match=r"nothing is stored at data.root=s3://shards/none.*mae shard"
    ):
        read_metadata("s3://shards/none")
    import boto3

    boto3.session.Session().client("s3").put_object(Bucket="shards", Key="stray.txt", Body=b"x")
    with pytest.raises(
        FileNotFoundError, match="data.root=s3://shards has no mae_shards.json"
    ):  # a bucket root
        read_metadata("s3://shards")
    with pytest.raises(
        StorageError, match=r"bucket 'nobucket' \(of s3://nobucket/x/mae_shards.json\) does not exist"
    ):
        read_metadata("s3://nobucket/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(
        StorageError, match=r"cannot reach the S3 endpoint http://127.0.0.1:9 for s3://shards/x.*AWS_"
    ):
        read_metadata("s3://shards/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(
        StorageError, match="no S3 credentials to read s3://shards/x/mae_shards.json: set AWS_"
    ):
        read_metadata("s3://shards/x")


# ---------------------------------------------------------------- decoding on the GPU, checked on the CPU


def test_gpu_decode__auto_falls_back_to_workers_without_cuda(id_shards, tmp_path):
    """auto on this CPU machine: the workers decode and crop, and a run goes through (the rule itself:
    tests/unit/data/views/test_gpu.py)."""
    module = RecordIds()
    make_trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(
        module, datamodule=streaming_data(str(id_shards), tmp_path)
    )
    assert sorted(i for _, i in module.seen) == list(range(24))


def test_gpu_decode__encoded_batches_decode_in_the_batch_hook(id_shards, tmp_path):
    data = streaming_data(str(id_shards), tmp_path, num_workers=0)
    data.setup("fit")
    data._gpu_decode = True  # what "auto" picks on CUDA; decoded here on the CPU
    data.train_set, data.val_set = data.build_datasets(None, data.eval_transform())
    encoded = next(iter(data.train_dataloader()))
    imgs, labels = data.on_before_batch_transfer(encoded, 0)
    assert imgs.shape == (4, 3, ID_SIDE, ID_SIDE) and imgs.dtype == torch.uint8
    assert image_ids(data.normalize(imgs)) == [int(Path(n).stem) for n in encoded.names]
    assert labels.tolist() == [int(Path(n).stem) % 2 for n in encoded.names]


# ---------------------------------------------------------------- the entry points on shards


@pytest.mark.slow
def test_streaming__pretrain_finetune_and_knn_entry_points(local_shards, tmp_path):
    data = {
        "class_path": "mae.data.StreamingDataModule",
        "init_args": {
            "root": str(local_shards),
            "img_size": 16,
            "batch_size": 4,
            "num_workers": 1,
            "cache_dir": str(tmp_path / "cache"),
        },
    }
    config = {
        "seed_everything": 0,
        "model": {
            "model": "mae_vit_tiny_patch4",
            "optim": {"warmup_epochs": 0},
            "model_kwargs": TINY_KWARGS,
        },
        "data": data,
        "trainer": {
            "max_epochs": 1,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "logger": False,
            "default_root_dir": str(tmp_path / "pretrain"),
        },
        "checkpoint": {"dirpath": str(tmp_path / "ckpt"), "monitor": None},
    }
    result = run_mae("pretrain", config=config, tmp=tmp_path)
    assert (
        "StreamingDataModule: 15 training images in 3 classes, 3 validation images"
        in result.stdout + result.stderr
    )
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    knn = [
        "--data",
        "mae.data.StreamingDataModule",
        "--data.root",
        str(local_shards),
        "--data.num_workers",
        "0",
    ]
    result = run_mae("knn", "--checkpoint", str(ckpt), *knn, "--data.img_size", "16")
    assert "on 3 validation images" in result.stdout
    finetune = {
        "seed_everything": 0,
        "model": {
            "encoder": {
                "model": "vit_tiny_patch4",
                "checkpoint": str(ckpt),
                "model_kwargs": {"embed_dim": 32, "depth": 1, "num_heads": 2},
            },
            "optim": {"warmup_epochs": 0},
        },
        "data": {**data, "init_args": {**data["init_args"], "augmentation": "finetune"}},
        "trainer": {
            "max_epochs": 1,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "logger": False,
            "default_root_dir": str(tmp_path / "finetune"),
        },
        "checkpoint": {"dirpath": str(tmp_path / "finetuned")},
    }
    result = run_mae("finetune", config=finetune, tmp=tmp_path)
    assert "val/acc1" in result.stdout + result.stderr


def test_streaming__feature_sets_are_whole_splits_and_a_capped_bank_reads_the_first_shards(
    id_shards, tmp_path
):
    train, val = streaming_data(str(id_shards), tmp_path).feature_datasets()
    assert len(train) == 24 and len(val) == 7
    bank = fixed_subset(train, 5)  # what kNN / the probe monitor take with max_train=5
    assert list(bank.indices) == [0, 1, 2, 3, 4]  # the first samples: the fewest shards to read
    ids = [image_ids(bank[i][0][None])[0] for i in range(5)]
    assert len(set(ids)) == 5 and ids != [0, 1, 2, 3, 4]  # ... and, as stored shuffled, a random five
    with pytest.raises(IndexError, match="index 7 out of range for 7 samples"):
        val[7]


class RecordBatches(pl.Callback):
    """(epoch, image id) of every training batch, as the module receives it; raises Lightning's SIGTERM
    exception (what its signal handler raises) after global step ``sigterm_at``."""

    def __init__(self, sigterm_at: int | None = None) -> None:
        self.seen: list[tuple[int, int]] = []
        self.sigterm_at = sigterm_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen += [(trainer.current_epoch, i) for i in image_ids(batch[0])]

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.sigterm_at:
            raise SIGTERMException()


def test_streaming__sigterm_mid_epoch_then_resume_pretrains_on_the_rest_of_the_stream(id_shards, tmp_path):
    """The preemption path of a real pretraining run: SIGTERM after step 3 of 6 saves last.ckpt with the
    stream's position, and resuming from it trains on exactly the images the uninterrupted run does."""
    ckpts = tmp_path / "ckpts"

    def fit(record: RecordBatches, name: str, ckpt_path: Path | None = None) -> None:
        callbacks = [ModelCheckpoint(dirpath=ckpts / name, save_last=True), SigtermCheckpoint(), record]
        trainer = make_trainer(
            tmp_path / name, max_epochs=2, limit_val_batches=0, enable_checkpointing=True, callbacks=callbacks
        )
        trainer.fit(
            pretrain_module(),
            datamodule=streaming_data(str(id_shards), tmp_path, img_size=16),
            ckpt_path=ckpt_path,
        )

    full = RecordBatches()
    fit(full, "full")
    first = RecordBatches(sigterm_at=3)
    with pytest.raises(SIGTERMException):
        fit(first, "preempted")
    saved = torch.load(ckpts / "preempted" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 3
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["num_samples_yielded"] == 3 * 4
    second = RecordBatches()
    fit(second, "preempted", ckpts / "preempted" / "last.ckpt")
    assert first.seen + second.seen == full.seen
    assert torch.load(ckpts / "preempted" / "last.ckpt", weights_only=True)["global_step"] == 2 * 6
