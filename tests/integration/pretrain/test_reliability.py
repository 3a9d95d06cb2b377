"""Bad input gets a clear error or a named skip; killed runs resume; the same seed gives the same run."""

import csv
import random
import signal
import subprocess
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from PIL import Image

from mae.data import ImageFolderDataModule
from mae.training.callbacks import PREEMPTED_EXIT_CODE, SigtermCheckpoint
from mae.training.checkpointing import check_resume_checkpoint
from tests.forked_commands import ForkedProcess
from tests.helpers import (
    TINY_MODEL,
    RandomImages,
    RecordLR,
    cli_trainer,
    folder_data,
    make_trainer,
    pretrain_module,
    read_metrics,
    run_mae,
    run_mae_process,
    start_mae,
    write_config,
    write_image_folder,
)

# ---------------------------------------------------------------- data


@pytest.fixture
def messy_folder(tmp_path):
    root = tmp_path / "data"
    write_image_folder(root / "train", ["a", "b"], per_class=3)
    rgb = np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8)
    Image.fromarray(rgb[..., 0]).save(root / "train" / "a" / "gray.png")  # L
    Image.fromarray(rgb).convert("P").save(root / "train" / "a" / "palette.png")  # P
    Image.fromarray(np.dstack([rgb, rgb[..., :1]])).save(root / "train" / "b" / "rgba.png")  # RGBA
    Image.fromarray(rgb).convert("CMYK").save(root / "train" / "b" / "cmyk.jpg")  # CMYK
    Image.fromarray(rgb[:5, :5]).save(root / "train" / "b" / "tiny.png")  # smaller than the crop
    (root / "train" / "a" / "not_an_image.jpg").write_bytes(b"definitely not a jpeg")
    good = (root / "train" / "a" / "img_000.jpg").read_bytes()
    (root / "train" / "b" / "truncated.jpg").write_bytes(good[: len(good) // 3])
    return root


def test_data__odd_modes_and_tiny_images_load_as_rgb_and_bad_files_are_skipped_by_name(messy_folder, caplog):
    dm = ImageFolderDataModule(str(messy_folder), img_size=16, batch_size=13, num_workers=0)
    dm.setup()
    with caplog.at_level("WARNING"):
        images = [dm.train_set[i][0] for i in range(len(dm.train_set))]
    assert len(images) == 13 and all(x.shape == (3, 16, 16) for x in images)
    assert {Path(p).name for p in dm.train_set.bad_files} == {"not_an_image.jpg", "truncated.jpg"}
    assert "not_an_image.jpg" in caplog.text and "truncated.jpg" in caplog.text
    warned = [line for line in caplog.text.splitlines() if "skipping unreadable image" in line]
    assert len(warned) == 2  # once per file, not per access
    imgs, _ = next(iter(dm.train_dataloader()))
    assert imgs.shape == (13, 3, 16, 16)
    assert len([line for line in caplog.text.splitlines() if "skipping unreadable image" in line]) == 2


def test_data__fail_fast_names_the_file(messy_folder):
    dm = ImageFolderDataModule(str(messy_folder), img_size=16, num_workers=0, on_bad_image="raise")
    dm.setup()
    with pytest.raises(
        ValueError, match=r"cannot read image .*(not_an_image|truncated)\.jpg.*on_bad_image=skip"
    ):
        for i in range(len(dm.train_set)):
            dm.train_set[i]


def test_data__empty_root_and_class_without_images_are_named(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(FileNotFoundError, match="class folder"):
        ImageFolderDataModule(str(tmp_path)).setup()
    (tmp_path / "train" / "cats").mkdir()
    (tmp_path / "train" / "cats" / "notes.txt").write_text("no images here")
    with pytest.raises(FileNotFoundError, match="cats"):
        ImageFolderDataModule(str(tmp_path)).setup()


# ---------------------------------------------------------------- config (through the real CLI)


def _cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return run_mae(
        "pretrain",
        "--config",
        "configs/pretrain/default.yaml",
        "--trainer.logger",
        "false",
        *args,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--data.img_size", "30"], "img_size 30x30 is not divisible by patch_size 4"),
        (["--model.mask_ratio", "1.0"], r"mask_ratio must be in [0, 1)"),
        (["--data.batch_size", "0"], "batch_size must be >= 1"),
        (["--data.batch_size", "many"], "batch_size"),
        (["--model.model", "mae_vit_gigantic"], "valid names: fcmae, mae_vit_base_patch16"),
        (["--model.mask_strategy", "rows"], "mask_strategy"),
        (["--model.img_size", "64"], "model.img_size is taken from data.img_size"),
    ],
)
def test_config__bad_values_fail_at_start_with_the_key(args, expected):
    result = _cli(*args)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr[-2000:]


# ---------------------------------------------------------------- checkpoints


def test_resume_checkpoint__missing_corrupt_and_foreign_files(tmp_path):
    module = pretrain_module()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_resume_checkpoint(tmp_path / "x.ckpt", module)
    trainer = make_trainer(
        tmp_path,
        max_steps=1,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)],
    )
    trainer.fit(pretrain_module(optim=dict(warmup_epochs=0)), datamodule=RandomImages())
    last = tmp_path / "ck" / "last.ckpt"
    check_resume_checkpoint(last, pretrain_module())  # fits
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(last.read_bytes()[:2000])
    with pytest.raises(ValueError, match="truncated"):
        check_resume_checkpoint(broken, module)
    wider = pretrain_module(model_kwargs={**TINY_MODEL["model_kwargs"], "embed_dim": 64, "num_heads": 4})
    with pytest.raises(
        ValueError,
        match=r"another model architecture.*attn.proj.weight has shape \(32, 32\) in the checkpoint "
        r"but \(64, 64\)",
    ):
        check_resume_checkpoint(last, wider)
    plain = tmp_path / "weights.pth"
    torch.save({"model": {}}, plain)
    with pytest.raises(ValueError, match="model.encoder.checkpoint instead"):
        check_resume_checkpoint(plain, module)


# ---------------------------------------------------------------- training faults


class NaNAfter(RandomImages):
    """Images turn into NaN from the second epoch on."""

    def train_dataloader(self):
        epoch = self.trainer.current_epoch
        data = self.data.tensors[0] * (float("nan") if epoch >= 1 else 1.0)
        ds = torch.utils.data.TensorDataset(data, self.data.tensors[1])
        return torch.utils.data.DataLoader(ds, batch_size=self.batch_size)


def test_training__non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)
    trainer = make_trainer(
        tmp_path,
        max_epochs=3,
        limit_train_batches=4,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[ckpt],
        reload_dataloaders_every_n_epochs=1,
    )
    module = pretrain_module(optim=dict(warmup_epochs=0))
    with pytest.raises(
        FloatingPointError, match=r"non-finite training loss .* at step 4 \(epoch 1\).*last.ckpt"
    ):
        trainer.fit(module, datamodule=NaNAfter())
    saved = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values())


def _five_batch_trainer(tmp_path: Path, max_epochs: int, callbacks: list) -> pl.Trainer:
    """A checkpointing trainer of 5 training batches an epoch and no validation: the resume tests' runs."""
    return make_trainer(
        tmp_path,
        max_epochs=max_epochs,
        limit_train_batches=5,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=callbacks,
    )


def test_resume__lr_continues_exactly_as_the_uninterrupted_run(tmp_path):
    def run(max_epochs, ckpt_path=None, folder="a"):
        record = RecordLR()
        callback = ModelCheckpoint(dirpath=tmp_path / folder, save_last=True)
        trainer = _five_batch_trainer(tmp_path, max_epochs, [record, callback])
        module = pretrain_module(optim=dict(warmup_epochs=1, base_lr=1e-3, min_lr=1e-5))
        trainer.fit(module, datamodule=RandomImages(), ckpt_path=ckpt_path)
        return record.lrs

    full = run(4, folder="full")
    # the interrupted run plans the same 4 epochs but is stopped after 2 (as a kill would)
    first = _StopAfter(2)
    cut = ModelCheckpoint(dirpath=tmp_path / "cut", save_last=True)
    trainer = _five_batch_trainer(tmp_path, 4, [first, cut])
    trainer.fit(
        pretrain_module(optim=dict(warmup_epochs=1, base_lr=1e-3, min_lr=1e-5)), datamodule=RandomImages()
    )
    resumed = run(4, ckpt_path=tmp_path / "cut" / "last.ckpt", folder="resumed")
    assert len(resumed) == 10
    assert resumed == pytest.approx(full[10:], rel=1e-12, abs=0)


def test_resume__with_more_epochs_follows_the_new_run_length_and_says_so(tmp_path):
    """A finished 2-epoch run resumed with max_epochs=4 trains epochs 3-4 on the 4-epoch cosine (as an
    uninterrupted 4-epoch run would), not at min_lr past the end of the old one, and warns."""

    def run(max_epochs, folder, ckpt_path=None):
        record, saver = RecordLR(), ModelCheckpoint(dirpath=tmp_path / folder, save_last=True)
        trainer = _five_batch_trainer(tmp_path, max_epochs, [record, saver])
        trainer.fit(
            pretrain_module(optim=dict(warmup_epochs=1, base_lr=1e-3, min_lr=1e-5)),
            datamodule=RandomImages(),
            ckpt_path=ckpt_path,
        )
        return record.lrs

    full = run(4, "full")
    run(2, "short")
    with pytest.warns(UserWarning, match=r"another schedule .*cosine steps 5 -> 15.* follows this run's"):
        extended = run(4, "extended", ckpt_path=tmp_path / "short" / "last.ckpt")
    assert len(extended) == 10
    assert extended == pytest.approx(full[10:], rel=1e-12, abs=0)
    assert all(lr > 1e-5 for lr in extended)  # the old cosine had ended: its schedule gives min_lr from here


class _StopAfter(pl.Callback):
    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


# ---------------------------------------------------------------- kill, SIGTERM, determinism (real train.py)


def _config(tmp: Path, name: str, max_epochs: int = 6) -> Path:
    write_image_folder(tmp / "data" / "train", ["a", "b"], per_class=16, size=(24, 24))
    config = {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 1}},
        "data": folder_data(tmp / "data"),
        "trainer": cli_trainer(tmp, name, max_epochs=max_epochs, default_root_dir=str(tmp)),
        "checkpoint": {"every_n_epochs": 1, "dirpath": str(tmp / "ckpts")},
        "reconstruction": {"every_n_epochs": 0},
    }
    return write_config(tmp, config, name)


def _start(config: Path, *extra: str) -> ForkedProcess:
    """``train.py`` started as a forked command, to signal it (a signal to one process: SIGKILL, a
    scheduler's SIGTERM); the signals to a whole process group are in ``test_preemption.py``."""
    return start_mae("pretrain", "--config", str(config), *extra)


def _finish(config: Path, *extra: str) -> tuple[int, str]:
    """``train.py`` run to its end with no signal (a resume): a forked command; (exit status, output)."""
    result = run_mae("pretrain", "--config", str(config), *extra, timeout=300, check=False)
    return result.returncode, result.stdout + result.stderr


def _wait_for_training(proc: ForkedProcess) -> None:
    # the schedule line, printed just before the first step
    proc.wait_for_output("effective batch", timeout=120)


def test_faults__sigkill_at_random_moments_then_resume_completes(tmp_path):
    # 320 steps, about 5 s on 2 cores: every kill lands in the run (the three take about 140 steps there),
    # and the resume trains the rest
    config = _config(tmp_path, "kill", max_epochs=40)
    rng = random.Random(0)
    for attempt in range(3):
        last = tmp_path / "ckpts" / "last.ckpt"
        with _start(config, *(["--ckpt_path", str(last)] if last.exists() else [])) as proc:
            _wait_for_training(proc)
            time.sleep(rng.uniform(0.1, 1.0))  # anywhere in a step or a checkpoint save (8 epochs a second)
            proc.send_signal(signal.SIGKILL)
            status = proc.wait(timeout=60)
        if status == 0 and attempt > 0:  # a fast machine finished the 320 steps before this kill came
            break
        assert status == -signal.SIGKILL  # killed, not finished
        for ckpt in (tmp_path / "ckpts").glob("*.ckpt"):  # whatever is on disk loads
            torch.load(ckpt, map_location="cpu", weights_only=True)
    last = tmp_path / "ckpts" / "last.ckpt"
    code, out = _finish(config, *(["--ckpt_path", str(last)] if last.exists() else []))
    assert code == 0, out[-3000:]
    final = torch.load(last, map_location="cpu", weights_only=True)
    assert final["epoch"] == 39 and final["global_step"] == 40 * 8


class _SigtermAt(pl.Callback):
    """Raise Lightning's SIGTERM exception after a given global step, as its signal handler does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise SIGTERMException()


def test_faults__sigterm_in_the_first_epoch_then_resume_keeps_one_last_ckpt(tmp_path):
    """A SIGTERM before the checkpoint callback saved anything: the resumed run must go on writing the
    same last.ckpt (not a last-v1.ckpt beside it, leaving last.ckpt stale for the next resume)."""
    ckpts = tmp_path / "ckpts"

    def trainer(epochs, *callbacks):
        callbacks = [ModelCheckpoint(dirpath=ckpts, save_last=True), SigtermCheckpoint(), *callbacks]
        return make_trainer(
            tmp_path, max_epochs=epochs, limit_val_batches=0, enable_checkpointing=True, callbacks=callbacks
        )

    with pytest.raises(SIGTERMException):
        trainer(2, _SigtermAt(3)).fit(pretrain_module(), datamodule=RandomImages())
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"] == 3
    trainer(2).fit(pretrain_module(), datamodule=RandomImages(), ckpt_path=ckpts / "last.ckpt")
    assert sorted(p.name for p in ckpts.glob("last*")) == ["last.ckpt"]
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"] == 2 * 10


def test_faults__sigterm_saves_a_resumable_checkpoint(tmp_path):
    config = _config(tmp_path, "term", max_epochs=50)
    with _start(config) as proc:
        _wait_for_training(proc)
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        out = "".join(proc.communicate(timeout=120))
    assert "SIGTERM: saved" in out, out[-3000:]
    assert proc.returncode == PREEMPTED_EXIT_CODE == 143  # a preempted run is not a finished one
    last = tmp_path / "ckpts" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert saved["global_step"] > 0
    check_resume_checkpoint(last, pretrain_module(img_size=16))
    epochs = saved["epoch"] + 2  # finish the interrupted epoch and one more
    code, out = _finish(config, "--ckpt_path", str(last), "--trainer.max_epochs", str(epochs))
    assert code == 0, out[-3000:]
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == epochs * 8


def test_faults__sigterm_twice_with_the_same_command_line_completes_in_one_run_folder(tmp_path):
    """A requeue script repeats its command line: `--ckpt_path last` starts fresh, then resumes in the
    same run folder after each preemption, until the run is complete."""
    config = _config(tmp_path, "requeue", max_epochs=12)  # 8 steps per epoch
    recipe = yaml.safe_load(config.read_text())
    del recipe["checkpoint"]["dirpath"]  # checkpoints in the run folder, as by default
    config.write_text(yaml.safe_dump(recipe))
    run = tmp_path / "runs" / "requeue" / "version_0"
    stopped_at = []
    for _ in range(2):
        done = len(list((run / "checkpoints").glob("epoch_*.ckpt")))
        with _start(config, "--ckpt_path", "last") as proc:
            _wait_for_training(proc)
            deadline = time.time() + 120  # preempt as soon as this attempt has finished an epoch
            while len(list((run / "checkpoints").glob("epoch_*.ckpt"))) <= done and time.time() < deadline:
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            out = "".join(proc.communicate(timeout=120))
        assert proc.returncode == PREEMPTED_EXIT_CODE, out[-3000:]
        stopped_at.append(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"])
    orphan = run / "checkpoints" / ".last.ckpt.tmp-999999999"  # a kill during a save left this
    orphan.write_bytes(b"partial")
    code, out = _finish(config, "--ckpt_path", "last")
    assert code == 0, out[-3000:]
    assert 0 < stopped_at[0] < stopped_at[1] < 96
    assert [p.name for p in run.parent.iterdir()] == ["version_0"]  # one run folder
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 96
    assert (
        sorted(p.name for p in (run / "checkpoints").glob("last*")) == ["last.ckpt"] and not orphan.exists()
    )
    assert "removed" in out and orphan.name in out
    steps = [int(r["step"]) for r in read_metrics(run) if r.get("train/loss_step")]
    assert min(steps) == 0 and max(steps) == 95  # the first attempt's rows kept, the last attempt's added
    assert len(steps) == len(set(steps)) == 96  # no step logged twice


def test_determinism__same_seed_same_losses_step_by_step(tmp_path):
    """Two processes, one a fresh interpreter and one forked from the test's preloaded server (another
    hash seed, other import order): the same losses."""
    losses = []
    for name in ("one", "two"):
        config = _config(tmp_path, name, max_epochs=2)
        if name == "one":
            result = run_mae_process("pretrain", "--config", str(config), timeout=300, check=False)
            code, out = result.returncode, result.stdout + result.stderr
        else:
            code, out = _finish(config)
        assert code == 0, out[-3000:]
        with open(tmp_path / "runs" / name / "version_0" / "metrics.csv") as f:
            losses.append([r["train/loss_step"] for r in csv.DictReader(f) if r.get("train/loss_step")])
    assert len(losses[0]) == 16 and losses[0] == losses[1]
