"""FSDP2 (``--config strategy/fsdp``) with two CPU processes (gloo) through the real ``mae pretrain``, against
two-process DDP with the same global batch: the same per-step losses (fp32, rtol 1e-5), a SIGTERM to both
processes' groups mid-run then the same command line continuing step-exact, a sharded checkpoint resumed by
one process and read by ``mae export``, ``load_backbone`` and ``mae finetune`` as it is.

The two processes are the tasks of a one-node SLURM job (``tests.helpers.start_slurm_tasks``: forked, no
fresh interpreter), the strategies the same as under Lightning's own launcher (which
``tests/integration/pretrain/test_distributed.py`` and ``test_preemption.py`` run)."""

import contextlib
import os
import re
import signal
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from safetensors.torch import load_file

from mae.convert.backbone import load_backbone
from mae.convert.sharded_checkpoint import is_sharded_checkpoint, read_training_checkpoint
from mae.training.callbacks import PREEMPTED_EXIT_CODE
from tests.helpers import (
    TINY_MODEL,
    csv_logger,
    read_metrics,
    run_mae,
    run_slurm_tasks,
    start_slurm_tasks,
    write_config,
    write_image_folder,
)

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(900)]

# 8 training images, 4 per process on 2 processes (8 on 1): one step per epoch, so a stop after any step is at
# an epoch's end (an image folder has no loader position: a run stopped mid-epoch restarts that epoch's order)
STEPS = 4
# fp32 on both sides; the shards' gradients are reduced in another order than DDP's buckets
RTOL, ATOL = 1e-5, 1e-6
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on two cores


def _config(tmp: Path, name: str, devices: int, strategy: str | None, callbacks: list | None = None) -> Path:
    config = {
        "seed_everything": 0,
        # grid masks, no augmentation: nothing random differs between 1 and 2 processes. Progressive
        # resolution (8 px, then 16) runs under the sharding too.
        "model": {
            **TINY_MODEL,
            "optim": {"warmup_epochs": 1},
            "mask_strategy": "grid",
            "resolution_schedule": [[0, 8], [0.5, 16]],
        },
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {
                "root": str(tmp / "data"),
                "img_size": 16,
                "batch_size": 8 // devices,
                "num_workers": 0,
                "augmentation": "none",
            },
        },
        "trainer": {
            "max_epochs": STEPS,
            "accelerator": "cpu",
            "devices": devices,
            "precision": "32-true",
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            "logger": csv_logger(tmp, name),
            **({"strategy": strategy} if strategy else {}),
            **({"callbacks": callbacks} if callbacks else {}),
        },
        "checkpoint": {"every_n_epochs": 1},
        # the monitors on the last epoch: every process takes part in their forwards under FSDP2
        "reconstruction": {"every_n_epochs": STEPS, "num_images": 2},
        "knn": {"every_n_epochs": STEPS},
    }
    return write_config(tmp, config, name)


def _run(tmp: Path, name: str) -> Path:
    return tmp / "runs" / name / "version_0"


def _losses(run: Path) -> dict[int, float]:
    rows = [r for r in read_metrics(run) if r.get("train/loss_step")]
    steps = [int(r["step"]) for r in rows]
    assert len(steps) == len(set(steps)), steps  # each step once, the interrupted run's rows kept
    return {int(r["step"]): float(r["train/loss_step"]) for r in rows}


def _preempted(*args: str, stop_at: str) -> tuple[list[int], str]:
    """``mae pretrain ARGS`` as 2 SLURM tasks, both process groups SIGTERM-ed once rank 0 prints
    ``stop_at``. Returns the exit statuses and both outputs."""
    with contextlib.ExitStack() as stack:
        tasks = [stack.enter_context(t) for t in start_slurm_tasks("pretrain", *args, env=ENV)]
        tasks[0].wait_for_output(stop_at, timeout=300)
        for task in tasks:
            os.killpg(task.pid, signal.SIGTERM)
        outputs = ["".join(task.communicate(timeout=300)) for task in tasks]
    return [task.returncode for task in tasks], "\n".join(outputs)


def _knn(run: Path) -> float:
    return [float(r["val/knn_acc1"]) for r in read_metrics(run) if r.get("val/knn_acc1")][-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp")
    write_image_folder(tmp / "data" / "train", ["a", "b"], per_class=4, size=(20, 20))
    write_image_folder(tmp / "data" / "val", ["a", "b"], per_class=2, size=(20, 20), seed=1)
    _, ddp = run_slurm_tasks("pretrain", "--config", str(_config(tmp, "ddp", 2, "ddp")), env=ENV)

    # FSDP2, SIGTERM to the whole process group before step 2 (both processes), then the same command line
    pause = {"class_path": "tests.helpers.PauseAt", "init_args": {"moment": "step", "step": 2}}
    fsdp = _config(tmp, "fsdp", 2, None, [pause])
    command = ("--config", str(fsdp), "--config", "strategy/fsdp", "--ckpt_path", "last")
    codes, first = _preempted(*command, stop_at="PAUSE step")
    stopped = torch.load(_run(tmp, "fsdp") / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=True)
    _, resumed = run_slurm_tasks("pretrain", *command, env=ENV)
    return tmp, codes, first, stopped["global_step"], resumed, ddp


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def test_fsdp2__same_losses_as_ddp_and_a_group_sigterm_resumes_step_exact(runs):
    tmp, code, first, stopped_at, resumed, ddp = runs
    assert code == [PREEMPTED_EXIT_CODE] * 2 and "SIGTERM: saved" in first, first[-3000:]
    assert 2 <= stopped_at <= 3
    # the lr rule counts every process: the effective batch and lr DDP's run printed
    schedule = re.compile(
        r"effective batch 8 = 4 per device x 2 device\(s\) x 1 node\(s\) .*?; lr ([\d.e-]+)"
    )
    assert schedule.search(first).group(1) == schedule.search(ddp).group(1), first[-3000:]
    assert "resuming in the run folder" in resumed, resumed[-3000:]
    reference, fsdp = _losses(_run(tmp, "ddp")), _losses(_run(tmp, "fsdp"))
    assert sorted(reference) == sorted(fsdp) == list(range(STEPS))  # before and after the SIGTERM
    for step, loss in reference.items():
        assert fsdp[step] == pytest.approx(loss, rel=RTOL), step
    assert "returned a view tensor" not in first + resumed  # FSDP2's per-step note, quieted
    assert "resolution phases run: 16x16 px" in resumed  # 8 px before the stop: the same losses as DDP
    # the monitors ran on every process, rank 0 logged and drew them
    assert _knn(_run(tmp, "fsdp")) == pytest.approx(_knn(_run(tmp, "ddp")))
    assert resumed.count("note: k=20 neighbours") == 1, resumed[-3000:]  # rank 0's, not each process's
    figures = sorted(p.name for p in (_run(tmp, "fsdp") / "reconstructions").iterdir())
    assert figures == ["epoch_0004.png"]
    assert sorted(p.name for p in (tmp / "runs" / "fsdp").iterdir()) == ["version_0"]
    # every checkpoint a folder of two processes' shards, none half-written
    folder = _run(tmp, "fsdp") / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [
        "epoch_0000.ckpt",
        "epoch_0001.ckpt",
        "epoch_0002.ckpt",
        "epoch_0003.ckpt",
        "last.ckpt",
    ]
    assert all(is_sharded_checkpoint(p) for p in folder.iterdir())
    assert sorted(p.name for p in (folder / "last.ckpt").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_fsdp2__sharded_checkpoint_exports_and_loads_as_the_unsharded_runs(runs, tmp_path):
    tmp = runs[0]
    sharded = _run(tmp, "fsdp") / "checkpoints" / "last.ckpt"
    plain = _run(tmp, "ddp") / "checkpoints" / "last.ckpt"
    for name, checkpoint in (("fsdp", sharded), ("ddp", plain)):
        run_mae("export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / f"{name}.safetensors"))
    exported = {name: load_file(tmp_path / f"{name}.safetensors") for name in ("fsdp", "ddp")}
    assert sorted(exported["fsdp"]) == sorted(exported["ddp"])
    for key, value in exported["ddp"].items():
        torch.testing.assert_close(exported["fsdp"][key], value, rtol=RTOL, atol=ATOL)
    backbone, reference = load_backbone(sharded), load_backbone(plain)
    assert backbone.load_report.format == "lightning"
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(backbone.state_dict()[key], value, rtol=RTOL, atol=ATOL)


def test_fsdp2__sharded_checkpoint_resumes_on_one_process_and_finetunes(runs):
    tmp = runs[0]
    epoch_2 = _run(tmp, "fsdp") / "checkpoints" / "epoch_0001.ckpt"  # step 2, written by 2 processes
    single = _config(tmp, "single", 1, None)
    run_mae("pretrain", "--config", str(single), "--ckpt_path", str(epoch_2), timeout=400)
    ddp = torch.load(_run(tmp, "ddp") / "checkpoints" / "last.ckpt", weights_only=True)
    one = torch.load(_run(tmp, "single") / "checkpoints" / "last.ckpt", weights_only=True)
    assert one["global_step"] == ddp["global_step"] == STEPS
    for key, value in ddp["state_dict"].items():  # the weights and AdamW moments came back whole
        torch.testing.assert_close(one["state_dict"][key], value, rtol=RTOL, atol=ATOL)

    finetune = {
        "seed_everything": 0,
        "model": {
            "encoder": {"checkpoint": str(_run(tmp, "fsdp") / "checkpoints" / "last.ckpt")},
            "optim": {"warmup_epochs": 0},
        },
        "data": _yaml(single)["data"],
        "trainer": {**_yaml(single)["trainer"], "max_epochs": 1, "logger": csv_logger(tmp, "ft")},
    }
    out = run_mae("finetune", "--config", str(write_config(tmp, finetune, "ft")), timeout=400)
    assert "validation top-1" in out.stdout, out.stdout[-2000:]


class StopAfterEpoch(pl.Callback):
    """Stops the run at the end of epoch ``epoch`` (its ``last.ckpt`` written), as a job out of time does."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


def test_fsdp2__last_ckpt_through_two_processes_one_then_two_again_is_always_the_newest_state(runs):
    """``--ckpt_path last`` on FSDP2 (``last.ckpt`` a folder of shards), then on one process (a file written
    over the folder), then on FSDP2 again (a folder over the file): each run continues from the one
    before, and the three together make the same steps as the uninterrupted DDP run."""
    tmp = runs[0]
    folder = _run(tmp, "cycle") / "checkpoints"
    steps, sharded = [], []
    for devices, stop in ((2, 0), (1, 1), (2, None)):
        stopping = [{"class_path": f"{__name__}.StopAfterEpoch", "init_args": {"epoch": stop}}]
        config = _config(tmp, "cycle", devices, None, stopping if stop is not None else None)
        command = ("--config", str(config), "--ckpt_path", "last")
        if devices == 2:
            _, out = run_slurm_tasks("pretrain", *command, "--config", "strategy/fsdp", env=ENV)
        else:
            result = run_mae("pretrain", *command, env=ENV, timeout=400)
            out = result.stdout + result.stderr
        if steps:
            assert f"--ckpt_path last: resuming from {folder / 'last.ckpt'}" in out, out[-3000:]
        steps.append(read_training_checkpoint(folder / "last.ckpt")["global_step"])
        sharded.append(is_sharded_checkpoint(folder / "last.ckpt"))
    assert steps == [1, 2, STEPS] and sharded == [True, False, True]
    reference, cycle = _losses(_run(tmp, "ddp")), _losses(_run(tmp, "cycle"))
    assert sorted(cycle) == list(range(STEPS))  # each step once: none lost, none repeated
    for step in (0, 2, 3):  # on 2 processes: rank 0 logs its half of the batch, one process all of it
        assert cycle[step] == pytest.approx(reference[step], rel=RTOL), step
    newest = read_training_checkpoint(folder / "last.ckpt")["state_dict"]
    for key, value in torch.load(_run(tmp, "ddp") / "checkpoints" / "last.ckpt", weights_only=True)[
        "state_dict"
    ].items():
        torch.testing.assert_close(newest[key], value, rtol=RTOL, atol=ATOL)
    # one checkpoint per epoch, whichever wrote it, and no temporary or set-aside copy left beside them
    names = [f"epoch_000{epoch}.ckpt" for epoch in range(STEPS)]
    assert sorted(p.name for p in folder.iterdir()) == [*names, "last.ckpt"]


class PoisonBatch(pl.Callback):
    """Before step ``step``, a NaN in the first image of process ``rank``'s batch (bad data on one node)."""

    def __init__(self, step: int, rank: int) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            batch[0][0, 0, 0, 0] = float("nan")


def test_fsdp2__a_nan_on_one_process_stops_both_and_its_whole_state_replays(tmp_path):
    write_image_folder(tmp_path / "data" / "train", ["a", "b"], per_class=4, size=(20, 20))
    write_image_folder(tmp_path / "data" / "val", ["a", "b"], per_class=2, size=(20, 20), seed=1)
    poison = {"class_path": f"{__name__}.PoisonBatch", "init_args": {"step": 1, "rank": 1}}
    config = _config(tmp_path, "nan", 2, None, [poison])
    codes, out = run_slurm_tasks(
        "pretrain", "--config", str(config), "--config", "strategy/fsdp", check=False
    )
    assert codes == [2, 2], out[-3000:]  # both processes stopped at the step: nothing hangs
    folder = _run(tmp_path, "nan") / "nonfinite" / "step_1_rank1"
    assert f"The step is kept in {folder}; replay it with: mae replay {folder}." in out, out[-3000:]
    assert "under FSDP2 no process holds the whole model to replay the step" in out
    assert "the training loss of another process is non-finite at step 1" in out  # rank 0's own error
    assert [p.name for p in (_run(tmp_path, "nan") / "nonfinite").iterdir()] == ["step_1_rank1"]
    state = torch.load(folder / "state.ckpt", weights_only=True)
    reference = torch.load(_run(tmp_path, "nan") / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=True)
    assert state["global_step"] == reference["global_step"] == 1  # the state before the step, whole
    assert all(type(v) is torch.Tensor for v in state["state_dict"].values())
    assert state["optimizer_states"][0]["state"]
    replay = run_mae("replay", str(folder))
    assert "the first module whose output is non-finite is model.patch_embed" in replay.stdout, replay.stdout


def test_fsdp2__finetuning_with_layer_decay_updates_as_one_unsharded_process(runs):
    """Weight decay and layer-wise lr decay are chosen by parameter name, before FSDP2 shards (and renames
    nothing of) the network: one sharded process makes the same update as one plain process."""
    tmp = runs[0]
    base = _yaml(_config(tmp, "ft_base", 1, None))
    config = {
        "seed_everything": 0,
        "model": {
            "encoder": {"checkpoint": str(_run(tmp, "ddp") / "checkpoints" / "last.ckpt")},
            "optim": {"warmup_epochs": 0},
            "layer_decay": 0.5,
            "mixup": 0,
            "cutmix": 0,
            "drop_path_rate": 0.0,
        },
        "data": base["data"],
        "trainer": {**base["trainer"], "max_epochs": 1},
        "checkpoint": {"save_top_k": 0},
    }
    states = {}
    for name, extra in (("ft_plain", ()), ("ft_fsdp", ("--config", "strategy/fsdp"))):
        trainer = {**config["trainer"], "logger": csv_logger(tmp, name)}
        path = write_config(tmp, {**config, "trainer": trainer}, name)
        run_mae("finetune", "--config", str(path), *extra, timeout=400)
        states[name] = read_training_checkpoint(_run(tmp, name) / "checkpoints" / "last.ckpt")
    assert is_sharded_checkpoint(_run(tmp, "ft_fsdp") / "checkpoints" / "last.ckpt")
    plain, sharded = states["ft_plain"], states["ft_fsdp"]
    assert [g["lr"] for g in sharded["optimizer_states"][0]["param_groups"]] == [
        g["lr"] for g in plain["optimizer_states"][0]["param_groups"]
    ]
    for key, value in plain["state_dict"].items():
        torch.testing.assert_close(sharded["state_dict"][key], value, rtol=RTOL, atol=ATOL)
