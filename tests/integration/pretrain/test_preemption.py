"""A scheduler's SIGTERM to the whole process group (main process and loader workers alike), at any
moment of a run, through the real ``train.py``: a checkpoint at the current step, exit status 143,
and the same command line resumes to the end."""

import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from mae.training.callbacks import PREEMPTED_EXIT_CODE
from tests.forked_commands import ForkedProcess
from tests.helpers import (
    TINY_MODEL,
    cli_trainer,
    run_mae,
    start_mae,
    write_config,
    write_id_images,
    write_image_folder,
)

STEPS_PER_EPOCH = 6  # 24 training images, batch 4


def _config(tmp: Path, name: str, moment: str, data: dict, max_epochs: int = 3, **trainer) -> Path:
    config = {
        "seed_everything": 0,
        "model": TINY_MODEL,
        "data": data,
        "trainer": cli_trainer(
            tmp,
            name,
            max_epochs=max_epochs,
            precision="32-true",
            callbacks=[{"class_path": "tests.helpers.PauseAt", "init_args": {"moment": moment}}],
            **trainer,
        ),
        "checkpoint": {"every_n_epochs": 1, "dirpath": str(tmp / name / "ckpts")},
        "reconstruction": {"every_n_epochs": 0},
    }
    return write_config(tmp, config, name)


def _folder_data(tmp: Path, workers: int = 2) -> dict:
    root = tmp / "data"
    if not root.exists():
        write_image_folder(root / "train", ["a", "b"], per_class=12, size=(24, 24))
        # 3 validation batches
        write_image_folder(root / "val", ["a", "b"], per_class=6, size=(24, 24), seed=1)
    return {
        "class_path": "mae.data.ImageFolderDataModule",
        "init_args": {"root": str(root), "img_size": 16, "batch_size": 4, "num_workers": workers},
    }


def _start(config: Path, *extra: str) -> ForkedProcess:
    """``train.py`` as a scheduler starts a job: the leader of a process group of its own (a forked
    command in a new session; its loader workers and DDP processes join its group)."""
    return start_mae("pretrain", "--config", str(config), *extra, new_session=True)


def _signal_group_at_pause(proc: ForkedProcess, moment: str) -> tuple[str, int]:
    """Wait for ``PAUSE <moment>``, SIGTERM the whole process group; returns (output, paused step)."""
    line = proc.wait_for_output(f"PAUSE {moment}", timeout=180)
    os.killpg(proc.pid, signal.SIGTERM)
    return "".join(proc.communicate(timeout=180)), int(line.split()[-1])


def _last(tmp: Path, name: str) -> dict:
    return torch.load(tmp / name / "ckpts" / "last.ckpt", map_location="cpu", weights_only=True)


def _preempted(out: str, proc: ForkedProcess) -> None:
    assert "killed by signal" not in out, out[-3000:]
    assert "SIGTERM: saved" in out, out[-3000:]
    assert proc.returncode == PREEMPTED_EXIT_CODE, out[-3000:]


@pytest.mark.parametrize("moment", ["step", "validation", "save", "loader"])
def test_group_sigterm__folder_workers__checkpoint_at_the_current_step_and_exit_143(tmp_path, moment):
    config = _config(tmp_path, moment, moment, _folder_data(tmp_path))
    with _start(config) as proc:
        out, paused_at = _signal_group_at_pause(proc, moment)
    _preempted(out, proc)
    saved = _last(tmp_path, moment)
    # the running step finishes (and a validation or save in progress ends) before the checkpoint
    assert paused_at <= saved["global_step"] <= paused_at + 1
    if moment != "validation":
        return
    # preempted inside validation: the same command line (plus --ckpt_path) completes the run
    last = str(tmp_path / moment / "ckpts" / "last.ckpt")
    run_mae("pretrain", "--config", str(config), "--ckpt_path", last, "--trainer.callbacks", "[]")
    assert _last(tmp_path, moment)["global_step"] == 3 * STEPS_PER_EPOCH


def test_group_sigterm__streaming_workers(tmp_path):
    from tests.integration.streaming.test_streaming import shard

    shards = tmp_path / "shards"
    shard(write_id_images(tmp_path / "images", 24), str(shards))
    data = {
        "class_path": "mae.data.StreamingDataModule",
        "init_args": {
            "root": str(shards),
            "img_size": 16,
            "batch_size": 4,
            "num_workers": 2,
            "cache_dir": str(tmp_path / "cache"),
        },
    }
    config = _config(tmp_path, "stream", "step", data)
    with _start(config) as proc:
        out, paused_at = _signal_group_at_pause(proc, "step")
    _preempted(out, proc)
    assert paused_at <= _last(tmp_path, "stream")["global_step"] <= paused_at + 1


@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_group_sigterm__ddp_two_processes_with_workers(tmp_path):
    config = _config(tmp_path, "ddp", "step", _folder_data(tmp_path), devices=2, strategy="ddp")
    with _start(config) as proc:  # rank 0 forked; rank 1 is a fresh `python -m mae pretrain ...`
        out, paused_at = _signal_group_at_pause(proc, "step")
    _preempted(out, proc)
    saved = _last(tmp_path, "ddp")["global_step"]
    assert paused_at <= saved <= paused_at + 1
    with _start(config, "--ckpt_path", "last", "--trainer.callbacks", "[]") as proc:
        out = "".join(proc.communicate(timeout=300))
    assert proc.returncode == 0, out[-3000:]
    assert _last(tmp_path, "ddp")["global_step"] == 3 * STEPS_PER_EPOCH // 2
    # one run folder per run (rank 0 claims it; rank 1 names the same): the checkpoints live elsewhere
    assert sorted(p.name for p in (tmp_path / "runs" / "ddp").iterdir()) == ["version_0", "version_1"]


# ---------------------------------------------------------------- a full disk during a checkpoint save


@pytest.fixture
def small_device(tmp_path):
    """A 1 MiB tmpfs (a checkpoint of the tiny model is ~0.4 MB): it fills after a few saves."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_disk_full__the_save_names_the_bytes_keeps_the_previous_checkpoint_and_no_temporary(
    tmp_path, small_device
):
    config = _config(tmp_path, "full", "none", _folder_data(tmp_path, workers=0), max_epochs=6)
    result = run_mae(
        "pretrain",
        "--config",
        str(config),
        "--checkpoint.dirpath",
        str(small_device),
        "--checkpoint.save_top_k",
        "-1",
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    assert "no space left on device" in out and "unexpected pos" not in out.splitlines()[-1], out[-3000:]
    last_line = out.strip().splitlines()[-1]
    assert str(small_device) in last_line and "bytes free" in last_line and "needs about" in last_line, (
        last_line
    )
    assert not list(small_device.glob(".*tmp*"))  # no temporary file left behind
    saved = list(small_device.glob("*.ckpt"))
    assert saved
    for ckpt in saved:  # whatever is on the device loads
        torch.load(ckpt, map_location="cpu", weights_only=True)


def test_disk_full__torch_save_without_a_size_hint_is_named_too(small_device):
    """``torch.save`` reports a full device as its own RuntimeError ("unexpected pos"); the error names
    the device's state all the same, and the previous file stays."""
    from mae.io.atomic import NoSpaceError, atomic_write

    target = small_device / "weights.pt"
    atomic_write(target, lambda tmp: torch.save(torch.zeros(1000), tmp))
    with pytest.raises(
        NoSpaceError, match=r"no space left on device: could not write .*weights\.pt \(the previous"
    ):
        atomic_write(target, lambda tmp: torch.save(torch.zeros(2**19), tmp))  # 2 MiB
    assert torch.load(target, weights_only=True).shape == (1000,)
    assert [p.name for p in small_device.iterdir()] == ["weights.pt"]


def test_slurm_requeue_conventions_stay(monkeypatch, tmp_path):
    """Under SLURM with auto-requeue, Lightning's SIGUSR1 requeue handler and its SIGTERM bypass are
    still installed beside ours, and a SIGTERM still stops a single process after its step."""
    import lightning.pytorch as pl

    from mae.compat.lightning import signal_connector
    from mae.training.callbacks import harden_trainer

    slurm = {
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_JOB_NAME": "pretrain",
        "SLURM_JOB_ID": "1234",
        "SLURM_NODELIST": "node1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=tmp_path)
    harden_trainer(trainer)
    signals = signal_connector(trainer)
    signals.register_signal_handlers()
    try:
        requeue = signal.getsignal(signal.SIGUSR1)
        assert signals._slurm_sigusr_handler_fn in getattr(requeue, "signal_handlers", [])
        term = signal.getsignal(signal.SIGTERM)
        assert signals._sigterm_notifier_fn in term.signal_handlers
        # Lightning's "bypassing SIGTERM" under SLURM
        assert signals._sigterm_handler_fn in term.signal_handlers
        os.kill(os.getpid(), signal.SIGTERM)
        assert trainer.received_sigterm and signals.requested
    finally:
        signals.teardown()
