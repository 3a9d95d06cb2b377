"""Two-process DDP (gloo, CPU) through the real entry points, against one process
with the same global batch. The two processes are the tasks of a one-node SLURM job, forked
(``tests.helpers.run_slurm_tasks``); Lightning's own launcher, which starts rank 1 as a new interpreter, is
run by ``test_preemption.py`` and the dense and streaming DDP tests."""

import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from mae.convert.backbone import load_backbone
from tests.helpers import (
    TINY_MODEL,
    csv_logger,
    read_metrics,
    run_mae,
    run_slurm_tasks,
    tensorboard_events,
    tensorboard_tracker,
    write_config,
    write_image_folder,
)

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(900)]  # the module fixture runs two 400 s-limited commands


def _run(command: str, config: dict, tmp: Path, name: str, devices: int, *extra: str) -> str:
    """Global batch 8 either way: 8 per device on 1 process or 4 per device on 2."""
    config = yaml.safe_load(yaml.safe_dump(config))
    config["data"]["init_args"]["batch_size"] = 8 // devices
    # fp32: these tests compare 1 and 2 processes to 1e-6, which bf16 rounding of differently split
    # batches would exceed; bf16 itself is covered elsewhere
    config["trainer"].update(devices=devices, strategy="ddp" if devices > 1 else "auto", precision="32-true")
    config["trainer"]["logger"]["init_args"]["name"] = name
    config["checkpoint"] = {
        "dirpath": str(tmp / name / "ckpts"),
        "every_n_epochs": 1,
        "save_top_k": -1,
        "monitor": None,
    }
    args = ("--config", str(write_config(tmp, config, name)), *extra)
    if devices > 1:  # the tasks of a one-node SLURM job, forked (Lightning's launcher: test_preemption.py)
        return run_slurm_tasks(command, *args, tasks=devices, env={**os.environ, "OMP_NUM_THREADS": "1"})[1]
    result = run_mae(command, *args, timeout=400)
    return result.stdout + result.stderr


def _schedule(output: str) -> tuple[str, str]:
    m = re.search(r"effective batch (\d+) = .*?; lr ([\d.e-]+)", output)
    assert m, output[-2000:]
    return m.group(1), m.group(2)


def _state(tmp: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(tmp / name / "ckpts" / "last.ckpt", map_location="cpu", weights_only=True)


def _val_loss(tmp: Path, name: str) -> float:
    rows = read_metrics(tmp / "runs" / name / "version_0")
    return [float(r["val/loss"]) for r in rows if r.get("val/loss")][-1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    write_image_folder(tmp / "data" / "train", ["a", "b"], per_class=4, size=(20, 20))
    write_image_folder(tmp / "data" / "val", ["a", "b"], per_class=2, size=(20, 20), seed=1)
    (tmp / "data" / "val" / "a" / "img_001.jpg").unlink()  # 3 validation images: uneven shards
    base = {
        "seed_everything": 0,
        # grid masks and no augmentation: nothing random differs between 1 and 2 processes
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}, "mask_strategy": "grid"},
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {
                "root": str(tmp / "data"),
                "img_size": 16,
                "num_workers": 0,
                "augmentation": "none",
            },
        },
        "trainer": {
            "max_epochs": 1,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "log_every_n_steps": 1,
            "logger": csv_logger(tmp, "unnamed"),
        },
        "reconstruction": {"every_n_epochs": 1, "num_images": 2},
        "tracker": tensorboard_tracker(tmp / "tb"),
    }
    # the DDP run with activation checkpointing: the same update as the single process without it
    checkpointed = ("--model.grad_checkpointing", "true")
    outputs = {
        name: _run("pretrain", base, tmp, name, devices, *extra)
        for name, devices, extra in (("ddp", 2, checkpointed), ("single", 1, ()))
    }
    return tmp, base, outputs


def test_ddp_pretraining__same_update_lr_and_validation_as_one_process(setup):
    tmp, _, outputs = setup
    assert _schedule(outputs["ddp"]) == _schedule(outputs["single"]) == ("8", _schedule(outputs["single"])[1])
    ddp, single = _state(tmp, "ddp"), _state(tmp, "single")
    assert ddp["global_step"] == single["global_step"] == 1
    for key, value in single["state_dict"].items():  # gradients really averaged across the processes
        torch.testing.assert_close(ddp["state_dict"][key], value, rtol=1e-5, atol=1e-6)
    assert _val_loss(tmp, "ddp") == pytest.approx(_val_loss(tmp, "single"), rel=1e-5)  # 3 images on 2 ranks
    # written once (rank 0): the same files as the single-process run
    assert sorted(p.name for p in (tmp / "ddp" / "ckpts").iterdir()) == sorted(
        p.name for p in (tmp / "single" / "ckpts").iterdir()
    )
    assert len(list((tmp / "runs" / "ddp" / "version_0" / "reconstructions").glob("*.png"))) == 1
    # one process (rank 0) wrote the tracker's events, and the other waited on nothing of it
    assert [p.name for p in (tmp / "tb" / "ddp").iterdir()] == ["version_0"]
    assert len(list((tmp / "tb" / "ddp" / "version_0").glob("events.out.tfevents.*"))) == 1
    tracked = tensorboard_events(tmp / "tb" / "ddp" / "version_0")
    assert len(tracked.Scalars("train/loss_step")) == 1 and len(tracked.Images("reconstructions")) == 1


def test_ddp_checkpoints__resume_across_process_counts_and_load_as_backbone(setup):
    tmp, base, _ = setup
    more = {**base, "trainer": {**base["trainer"], "max_epochs": 2}}
    _run("pretrain", more, tmp, "ddp_then_single", 1, "--ckpt_path", str(tmp / "ddp" / "ckpts" / "last.ckpt"))
    _run(
        "pretrain",
        more,
        tmp,
        "single_then_ddp",
        2,
        "--ckpt_path",
        str(tmp / "single" / "ckpts" / "last.ckpt"),
    )
    a, b = _state(tmp, "ddp_then_single"), _state(tmp, "single_then_ddp")
    assert a["global_step"] == b["global_step"] == 2
    for key, value in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][key], value, rtol=1e-5, atol=1e-6)
    backbone = load_backbone(tmp / "ddp" / "ckpts" / "last.ckpt")
    assert backbone.load_report.format == "lightning"


def test_ddp_finetuning__same_update_and_accuracy_as_one_process(setup):
    tmp, base, _ = setup
    config = {
        "seed_everything": 0,
        "model": {
            "encoder": {"checkpoint": str(tmp / "ddp" / "ckpts" / "last.ckpt")},
            "optim": {"warmup_epochs": 0},
            "mixup": 0,
            "cutmix": 0,
            "drop_path_rate": 0.0,
        },
        "data": base["data"],
        "trainer": base["trainer"],
    }
    outputs = {
        name: _run("finetune", config, tmp, name, devices) for name, devices in (("ft_ddp", 2), ("ft", 1))
    }
    assert _schedule(outputs["ft_ddp"]) == _schedule(outputs["ft"])
    ddp, single = _state(tmp, "ft_ddp"), _state(tmp, "ft")
    for key, value in single["state_dict"].items():
        torch.testing.assert_close(ddp["state_dict"][key], value, rtol=1e-5, atol=1e-6)
    top1 = [re.search(r"validation top-1 ([\d.]+)%", outputs[n]).group(1) for n in ("ft_ddp", "ft")]
    assert top1[0] == top1[1]
