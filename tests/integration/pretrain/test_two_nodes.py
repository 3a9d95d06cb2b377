"""Two "nodes" of one process each on this machine, started as a cluster starts them: two ``torchrun``
agents (``--nnodes 2 --node-rank 0/1``, static rendezvous on 127.0.0.1), and two ``mae pretrain``
processes with the environment ``srun`` gives each task of a 2-node job (no SLURM installed). The nodes
share one filesystem, as a cluster's do. Each run is preempted (a SIGTERM to both nodes' process groups)
and resumed by the same two command lines; its per-step losses are compared with one uninterrupted
single-node two-process DDP run of the same global batch."""

import contextlib
import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from mae.training.callbacks import PREEMPTED_EXIT_CODE
from tests.forked_commands import ForkedProcess
from tests.helpers import (
    REPO,
    TINY_MODEL,
    csv_logger,
    free_port,
    read_metrics,
    run_mae,
    run_slurm_tasks,
    slurm_task_env,
    tensorboard_tracker,
    write_config,
    write_id_images,
)

pytestmark = [pytest.mark.two_nodes, pytest.mark.timeout(600)]

IMAGES = 16  # training ids 0-15: 4 per device on 2 processes, 2 steps per epoch
EPOCHS = 3
STEPS = EPOCHS * IMAGES // 8
# The SIGTERM comes before step 3, epoch 1's last: both nodes stop after it, at step 4, an epoch's end,
# from which a folder of images resumes exactly (Lightning restarts a map-style loader's epoch).
PAUSE_STEP = 3
ENV = {"OMP_NUM_THREADS": "1"}  # two processes on this machine's cores


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("two_nodes") / "data"
    write_id_images(root, IMAGES)
    write_id_images(root, 4, split="val", first=100)
    return root


def _config(tmp: Path, data: Path, name: str, **trainer) -> Path:
    """4 images per device, 3 epochs; ``tmp/runs/<name>`` (CSV), ``tmp/tb/<name>`` (TensorBoard),
    ``tmp/<name>/ckpts``; each training batch's ids printed (``PrintIds``) and a pause before
    ``PAUSE_STEP``."""
    # grid masks, no augmentation, fp32: nothing random or rounded differs between the runs
    config = {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}, "mask_strategy": "grid"},
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {
                "root": str(data),
                "img_size": 16,
                "batch_size": 4,
                "num_workers": 0,
                "augmentation": "none",
            },
        },
        "trainer": {
            "max_epochs": EPOCHS,
            "accelerator": "cpu",
            "precision": "32-true",
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            "logger": csv_logger(tmp, name),
            "callbacks": [
                {"class_path": "tests.helpers.PrintIds"},
                {"class_path": "tests.helpers.PauseAt", "init_args": {"moment": "step", "step": PAUSE_STEP}},
            ],
            **trainer,
        },
        "checkpoint": {"dirpath": str(tmp / name / "ckpts")},
        "reconstruction": {"every_n_epochs": 1, "num_images": 2},
        "tracker": tensorboard_tracker(tmp / "tb"),
    }
    return write_config(tmp, config, name)


def _losses(tmp: Path, name: str, version: int) -> dict[int, float]:
    """Step -> training loss of one run of ``name``."""
    rows = read_metrics(tmp / "runs" / name / f"version_{version}")
    return {int(r["step"]): float(r["train/loss_step"]) for r in rows if r.get("train/loss_step")}


@pytest.fixture(scope="module")
def reference(data) -> dict[int, float]:
    """Per-step losses of the uninterrupted run: one node, two DDP processes (the tasks of a one-node SLURM
    job, forked)."""
    tmp = data.parent
    config = _config(tmp, data, "reference", devices=2, strategy="ddp")
    run_slurm_tasks("pretrain", "--config", str(config), env={**os.environ, **ENV})
    losses = _losses(tmp, "reference", 0)
    assert sorted(losses) == list(range(STEPS)), losses
    return losses


# Node 1 creates what it creates with this umask, node 0 with the default 022: a file or folder without
# "others may read" is node 1's.
NODE_1_UMASK = 0o027
# Runs ``-m MODULE ARGS`` with the umask given first: ``python umask.py 027 MODULE ARGS``.
UMASK_WRAPPER = """import os, runpy, sys
os.umask(int(sys.argv[1], 8))
sys.argv = sys.argv[2:]
sys.modules.pop(sys.argv[0], None)  # as tests.forked_commands runs a module: as __main__ only
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _start(tmp: Path, node: int, module: str, args: list[str], env: dict[str, str]) -> ForkedProcess:
    """``python -m module args`` as a scheduler starts it on ``node`` (a process group of its own), with
    ``NODE_1_UMASK`` on node 1."""
    if node == 0:
        return ForkedProcess(["-m", module, *args], REPO, env, new_session=True)
    wrapper = tmp / "umask.py"
    wrapper.write_text(UMASK_WRAPPER)
    return ForkedProcess([str(wrapper), f"{NODE_1_UMASK:o}", module, *args], REPO, env, new_session=True)


def _slurm_node(tmp: Path, node: int, port: int, args: list[str]) -> ForkedProcess:
    """Task ``node`` of a 2-node job of one task per node, with the environment ``srun`` gives it."""
    env = {**os.environ, **ENV, **slurm_task_env(node, tasks=2, nodes=2, port=port)}
    return _start(tmp, node, "mae", ["pretrain", *args], env)


def _torchrun_node(tmp: Path, node: int, port: int, args: list[str]) -> ForkedProcess:
    """``torchrun`` on node ``node`` of 2, one process per node, static rendezvous at 127.0.0.1:``port``."""
    rendezvous = ["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1"]
    rendezvous += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    env = {**os.environ, **ENV}
    return _start(tmp, node, "torch.distributed.run", [*rendezvous, "-m", "mae", "pretrain", *args], env)


STARTERS = {"slurm": _slurm_node, "torchrun": _torchrun_node}


def _run_nodes(
    launcher: str, config: Path, *extra: str, preempt: bool = False
) -> tuple[list[int], list[str]]:
    """Start both nodes (``--trainer.num_nodes 2 --trainer.devices 1``); with ``preempt``, SIGTERM both
    process groups once node 0 pauses before ``PAUSE_STEP``. Returns each node's exit status and output."""
    port = free_port()
    args = ["--config", str(config), "--trainer.num_nodes", "2", "--trainer.devices", "1", *extra]
    with contextlib.ExitStack() as stack:
        nodes = [stack.enter_context(STARTERS[launcher](config.parent, n, port, args)) for n in (0, 1)]
        stack.callback(_stop, nodes)
        if preempt:
            nodes[0].wait_for_output(f"PAUSE step step {PAUSE_STEP}", timeout=240)
            for node in nodes:
                os.killpg(node.pid, signal.SIGTERM)
        outputs = ["".join(node.communicate(timeout=240)) for node in nodes]
        return [node.returncode for node in nodes], outputs


def _stop(nodes: list[ForkedProcess]) -> None:
    """After a failure: SIGTERM the nodes still running (a torchrun agent passes it on to its worker, which
    runs in a session of its own, and kills that after 30 s), then wait for them."""
    running = [node for node in nodes if node.poll() is None]
    for node in running:
        with contextlib.suppress(ProcessLookupError):  # ended since
            os.killpg(node.pid, signal.SIGTERM)
    for node in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(60)


def _seen(outputs: list[str]) -> Counter:
    """(epoch, image id) -> times trained on, over both nodes' ``PrintIds`` lines."""
    seen = Counter()
    for out in outputs:
        for epoch, ids in re.findall(r"^IDS rank \d epoch (\d+): ([\d ]+)$", out, re.MULTILINE):
            seen.update((int(epoch), int(i)) for i in ids.split())
    return seen


def _written_by_node_1(*folders: Path) -> list[str]:
    """What node 1 created under ``folders`` (``NODE_1_UMASK``)."""
    paths = [p for folder in folders for p in [folder, *folder.rglob("*")]]
    return [str(p) for p in paths if not p.stat().st_mode & 0o004]


# torch's elastic agent forwards the SIGTERM to its worker, waits for it (``--shutdown-timeout``, 30 s),
# then raises: torchrun exits 1 whatever its worker's status (143 here)
PREEMPTED = {"slurm": [PREEMPTED_EXIT_CODE] * 2, "torchrun": [1, 1]}


@pytest.mark.parametrize("launcher", ["torchrun", "slurm"])
def test_two_nodes__one_process_each__preempted_and_resumed_step_exact(data, reference, launcher):
    tmp = data.parent
    config = _config(tmp, data, launcher)
    codes, first = _run_nodes(launcher, config, "--ckpt_path", "last", preempt=True)
    assert codes == PREEMPTED[launcher], first[0][-3000:] + first[1][-3000:]
    assert "effective batch 8 = 4 per device x 1 device(s) x 2 node(s)" in first[0], first[0][-3000:]
    assert f"SIGTERM: saved {tmp / launcher / 'ckpts' / 'last.ckpt'} at step {PAUSE_STEP + 1}" in first[0]
    assert "effective batch" not in first[1] and "SIGTERM: saved" not in first[1]  # printed by rank 0
    # one checkpoint, written once, at the step both nodes stopped after
    ckpts = tmp / launcher / "ckpts"
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt"]
    saved = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == PAUSE_STEP + 1
    codes, second = _run_nodes(launcher, config, "--ckpt_path", "last")
    assert codes == [0, 0], second[0][-3000:] + second[1][-3000:]
    # every training image once per epoch, over both nodes and both runs
    assert _seen(first + second) == Counter({(e, i): 1 for e in range(EPOCHS) for i in range(IMAGES)})
    # the preempted then resumed run's losses: those of the uninterrupted one, step for step
    assert {**_losses(tmp, launcher, 0), **_losses(tmp, launcher, 1)} == reference
    # node 0 (global rank 0) alone wrote the run folders, figures, tracker and checkpoint
    runs, tracked = tmp / "runs" / launcher, tmp / "tb" / launcher
    assert _written_by_node_1(runs, tracked, tmp / launcher) == []
    assert sorted(p.name for p in runs.iterdir()) == ["version_0", "version_1"]
    figures = [len(list((runs / v / "reconstructions").glob("*.png"))) for v in ("version_0", "version_1")]
    assert figures == [2, 1]  # epochs 1-2, then 3
    # one tracker writer per run: a second would add a second events file (named by its process)
    events = [len(list((tracked / v).glob("events.out.tfevents.*"))) for v in ("version_0", "version_1")]
    assert events == [1, 1]


def test_torchrun_without_num_nodes__refused_at_start_up_naming_the_settings(data, tmp_path):
    """What torchrun gives node 0's worker of ``--nnodes 2 --nproc-per-node 1``, and a command line without
    ``--trainer.num_nodes 2``: one device on one node would train alone, as would node 1, both writing the
    same run folder."""
    torchrun = {"RANK": "0", "GROUP_RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "2"}
    torchrun |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TORCHELASTIC_RUN_ID": "none"}
    config = _config(tmp_path, data, "alone")
    result = run_mae("pretrain", "--config", str(config), env={**os.environ, **ENV, **torchrun}, check=False)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: torchrun started 2 processes (2 node(s) x 1) but trainer.num_nodes x trainer.devices is "
        "1 x 1: set --trainer.num_nodes 2 --trainer.devices 1"
    )
    assert not (tmp_path / "runs").exists()
