"""Run folders and interruptions through the real ``mae pretrain``: runs started together never share a
run folder, and a user's Ctrl-C ends a run as a scheduler's SIGTERM does (a checkpoint at that step,
exit status 130; a second Ctrl-C stops at once)."""

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from mae.cli.command import INTERRUPTED_EXIT_CODE
from mae.data import DigitsDataModule
from tests.forked_commands import ForkedProcess
from tests.helpers import (
    TINY_MODEL,
    PauseAt,
    csv_logger,
    read_metrics,
    start_mae,
    tensorboard_tracker,
    write_config,
)
from tests.integration.pretrain.test_preemption import STEPS_PER_EPOCH, _config, _folder_data, _last


class MeetingDigits(DigitsDataModule):
    """The built-in digits, whose ``prepare_data`` (after Lightning has read the run's version, before its
    logger makes the run folder) waits until ``runs`` processes have come there: runs started at the same
    moment, whatever their start-up times."""

    def __init__(self, meet: str, runs: int = 2, img_size: int = 16, batch_size: int = 16) -> None:
        super().__init__(img_size=img_size, batch_size=batch_size)
        self.meet, self.runs = Path(meet), runs

    def prepare_data(self) -> None:
        self.meet.mkdir(exist_ok=True)
        (self.meet / str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(self.meet.iterdir())) < self.runs and time.monotonic() < deadline:
            time.sleep(0.01)


def _digits_config(tmp: Path, name: str, data: dict | None = None, **trainer) -> Path:
    """A 2-step pretraining run on the built-in digits, logging into ``tmp/runs/<name>``."""
    config = {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}},
        "data": data
        or {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}},
        "trainer": {
            "max_steps": 2,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "log_every_n_steps": 1,
            "limit_val_batches": 1,
            "logger": csv_logger(tmp, name),
            **trainer,
        },
        "checkpoint": {"every_n_epochs": 1},
        "reconstruction": {"every_n_epochs": 0},
    }
    return write_config(tmp, config, name)


# ---------------------------------------------------------------- run folders


def test_two_runs_started_together_claim_their_own_run_folders(tmp_path):
    data = {"class_path": f"{__name__}.MeetingDigits", "init_args": {"meet": str(tmp_path / "meet")}}
    config = _digits_config(tmp_path, "together", data)
    # with a tracker, whose start-up check looks at the run folder before the run claims it
    config.write_text(
        yaml.safe_dump(
            {**yaml.safe_load(config.read_text()), "tracker": tensorboard_tracker(tmp_path / "tb")}
        )
    )
    procs = [start_mae("pretrain", "--config", str(config)) for _ in range(2)]
    try:
        outputs = ["".join(proc.communicate(timeout=300)) for proc in procs]
    finally:
        for proc in procs:
            proc.close()
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
        assert "will be deleted" not in out, out[-3000:]
    runs = tmp_path / "runs" / "together"
    assert sorted(p.name for p in runs.iterdir()) == ["version_0", "version_1"]
    for run in runs.iterdir():
        assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
        steps = [int(r["step"]) for r in read_metrics(run) if r.get("train/loss_step")]
        assert steps == [0, 1]  # each run's own rows, none of the other's
    assert sorted(p.name for p in (tmp_path / "tb" / "together").iterdir()) == ["version_0", "version_1"]
    said = {out.split("Run folder: ", 1)[1].split()[0] for out in outputs}
    assert said == {str(runs / "version_0"), str(runs / "version_1")}


# ---------------------------------------------------------------- Ctrl-C


class PauseMore(PauseAt):
    """``PauseAt`` with two more moments: ``setup`` (Lightning's setup, before its signal handlers are
    set) and ``sanity`` (the sanity check's first validation batch: no training step yet)."""

    def setup(self, trainer, pl_module, stage):
        self._pause(trainer, "setup")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.sanity_checking:
            self._pause(trainer, "sanity")
        super().on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)


class PausingDigits(DigitsDataModule):
    """The built-in digits, pausing while the command builds them (``PAUSE build``)."""

    def __init__(self, img_size: int = 16, batch_size: int = 16) -> None:
        print("PAUSE build", flush=True)
        time.sleep(1.5)
        super().__init__(img_size=img_size, batch_size=batch_size)


def _ctrl_c_config(tmp: Path, moment: str, seconds: float = 1.5, **trainer) -> Path:
    """``test_preemption``'s run (24 images in folders, 2 loader workers, 3 epochs of 6 steps, the
    checkpoints in ``tmp/<moment>/ckpts``) with the pause at ``moment`` (``PauseMore``)."""
    path = _config(tmp, moment, moment, _folder_data(tmp), **trainer)
    config = yaml.safe_load(path.read_text())
    config["trainer"]["callbacks"] = [
        {"class_path": f"{__name__}.PauseMore", "init_args": {"moment": moment, "seconds": seconds}}
    ]
    path.write_text(yaml.safe_dump(config))
    return path


def _ctrl_c(proc: ForkedProcess, moment: str) -> str:
    """Wait for ``PAUSE <moment>``, then Ctrl-C: SIGINT to the whole process group, as a terminal sends
    it (loader workers included). Returns the pause's line (``PAUSE <moment> step <n>``)."""
    line = proc.wait_for_output(f"PAUSE {moment}", timeout=180)
    os.killpg(proc.pid, signal.SIGINT)
    return line


@pytest.mark.parametrize("moment", ["step", "validation"])
def test_ctrl_c__checkpoint_at_the_current_step_exit_130_and_the_same_command_resumes(tmp_path, moment):
    config = _ctrl_c_config(tmp_path, moment)
    with start_mae("pretrain", "--config", str(config), new_session=True) as proc:
        paused_at = int(_ctrl_c(proc, moment).split()[-1])
        out = "".join(proc.communicate(timeout=180))
    assert proc.returncode == INTERRUPTED_EXIT_CODE == 130, out[-3000:]
    assert "Ctrl-C: stopping after the running step" in out, out[-3000:]
    assert "SIGINT: saved" in out and "resume with --ckpt_path" in out, out[-3000:]
    assert "killed by signal" not in out and "Traceback" not in out, out[-3000:]
    saved = _last(tmp_path, moment)["global_step"]
    assert paused_at <= saved <= paused_at + 1
    if moment != "step":
        return
    with start_mae("pretrain", "--config", str(config), "--ckpt_path", "last", new_session=True) as proc:
        out = "".join(proc.communicate(timeout=180))
    assert proc.returncode == 0, out[-3000:]
    assert f"--ckpt_path last: resuming from {tmp_path / moment / 'ckpts' / 'last.ckpt'}" in out
    assert _last(tmp_path, moment)["global_step"] == 3 * STEPS_PER_EPOCH


def _group_ended(pgid: int, timeout: float = 30) -> bool:
    """Whether every process of group ``pgid`` has ended (within ``timeout`` seconds: zombies are reaped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.ddp
@pytest.mark.timeout(600)
def test_ctrl_c__ddp_two_processes__both_stop_at_one_step_exit_130_and_the_same_command_resumes(tmp_path):
    """A terminal's Ctrl-C reaches both DDP processes and their loader workers at once (rank 1 is started by
    Lightning's launcher in rank 0's process group): one checkpoint at the step they stopped after, exit
    status 130, no process left behind, and the same command line continues to the end."""
    config = _ctrl_c_config(tmp_path, "step", devices=2, strategy="ddp")
    args = ("pretrain", "--config", str(config), "--ckpt_path", "last")  # a fresh start when there is none
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on two cores
    with start_mae(*args, env=env, new_session=True) as proc:  # rank 0 forked, rank 1 a fresh interpreter
        paused_at = int(_ctrl_c(proc, "step").split()[-1])
        out = "".join(proc.communicate(timeout=180))
    assert proc.returncode == INTERRUPTED_EXIT_CODE, out[-3000:]
    assert _group_ended(proc.pid), "processes of the run are left after it exited"
    assert out.count("Ctrl-C: stopping after the running step") == 1, out[-3000:]  # rank 0 says it, once
    assert "SIGINT: saved" in out and "resume with --ckpt_path" in out, out[-3000:]
    assert "Traceback" not in out and "killed by signal" not in out, out[-3000:]
    assert "`weights_only` was not set" not in out, out[
        -3000:
    ]  # Lightning's note on the save, from each rank
    saved = _last(tmp_path, "step")["global_step"]
    assert paused_at <= saved <= paused_at + 1
    with start_mae(*args, env=env, new_session=True) as proc:
        out = "".join(proc.communicate(timeout=300))
    assert proc.returncode == 0, out[-3000:]
    assert f"--ckpt_path last: resuming from {tmp_path / 'step' / 'ckpts' / 'last.ckpt'}" in out, out[-3000:]
    assert _last(tmp_path, "step")["global_step"] == 3 * STEPS_PER_EPOCH // 2  # 2 processes: half the steps
    assert _group_ended(proc.pid)


def test_ctrl_c_twice__stops_at_once_without_saving(tmp_path):
    config = _ctrl_c_config(tmp_path, "step", seconds=120)
    with start_mae("pretrain", "--config", str(config), new_session=True) as proc:
        _ctrl_c(proc, "step")
        proc.wait_for_output("Ctrl-C: stopping after the running step", timeout=30)
        os.killpg(proc.pid, signal.SIGINT)  # the running step would pause for two minutes more
        out = "".join(proc.communicate(timeout=60))
    assert proc.returncode == INTERRUPTED_EXIT_CODE, out[-3000:]
    assert "Ctrl-C: stopped at step 2 without saving a checkpoint" in out, out[-3000:]
    assert not (tmp_path / "step" / "ckpts").exists()


@pytest.mark.parametrize("moment", ["build", "setup", "sanity"])
def test_ctrl_c_before_the_first_step__exit_130_and_no_run_folder(tmp_path, moment):
    data = {"class_path": f"{__name__}.PausingDigits"} if moment == "build" else None
    pause = {"class_path": f"{__name__}.PauseMore", "init_args": {"moment": moment}}
    config = _digits_config(tmp_path, moment, data, limit_val_batches=2, callbacks=[pause])
    with start_mae("pretrain", "--config", str(config), new_session=True) as proc:
        _ctrl_c(proc, moment)
        out = "".join(proc.communicate(timeout=120))
    assert proc.returncode == INTERRUPTED_EXIT_CODE, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not (tmp_path / "runs").exists()  # no run folder, nor the folders above it this run made
