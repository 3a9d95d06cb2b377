"""finetune.py end to end, as a subprocess, from a checkpoint that a tiny train.py run produced."""

import csv
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (
    cli_trainer,
    folder_data,
    run_mae,
    tensorboard_events,
    tensorboard_tracker,
    tiny_pretraining_run,
)


def _run(command: str, config: dict, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_mae(command, *extra, config=config, tmp=tmp)


def _trainer(tmp: Path, name: str) -> dict:
    return cli_trainer(tmp, name, max_epochs=1)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    _, run = tiny_pretraining_run(
        tmp,
        "pretrain",
        reconstruction={"every_n_epochs": 0},
        knn={"every_n_epochs": 1, "k": 3},
        tracker=tensorboard_tracker(tmp / "tb"),
    )
    with open(run / "metrics.csv") as f:
        assert any(r.get("val/knn_acc1") for r in csv.DictReader(f))  # the kNN monitor during pretraining
    return tmp, run / "checkpoints" / "last.ckpt"


def _finetune_config(tmp: Path, ckpt: Path, mode: str) -> dict:
    model = {
        "encoder": {"checkpoint": str(ckpt)},
        "mode": mode,
        "optim": {"warmup_epochs": 0, "base_lr": 1e-3},
    }
    if mode == "linprobe":
        model.update(global_pool="token", mixup=0, cutmix=0, drop_path_rate=0, label_smoothing=0)
        model["optim"]["weight_decay"] = 0
    return {
        "seed_everything": 0,
        "model": model,
        "data": folder_data(tmp / "data", augmentation=mode),
        "trainer": _trainer(tmp, mode),
        "tracker": tensorboard_tracker(tmp / "tb"),
    }


@pytest.fixture(scope="module")
def finetuned(pretrained):
    tmp, ckpt = pretrained
    config = _finetune_config(tmp, ckpt, "finetune")
    result = _run("finetune", config, tmp)
    return tmp, config, result, tmp / "runs" / "finetune" / "version_0" / "checkpoints" / "last.ckpt"


def test_finetune__from_pretraining_checkpoint_then_evaluate_only(finetuned):
    tmp, config, result, checkpoint = finetuned
    out = result.stdout + result.stderr
    assert "validation top-1" in result.stdout
    assert (
        "not in the checkpoint (left as initialised): fc_norm.bias, fc_norm.weight, head.bias, head.weight"
        in out
    )
    assert checkpoint.exists()
    run = checkpoint.parent.parent
    metrics, saved = (run / "metrics.csv").read_text(), checkpoint.read_bytes()
    evaluated = _run("finetune", config, tmp, "--validate_only", "true", "--ckpt_path", str(checkpoint))
    assert "validation top-1" in evaluated.stdout
    # an evaluation logs into a folder of its own: the training run's metrics and checkpoint stay
    assert (run / "metrics.csv").read_text() == metrics and checkpoint.read_bytes() == saved
    assert (run.parent / "version_1").is_dir()
    # the tracker saw both runs' accuracies: the pretraining's kNN monitor, the fine-tuning's validation
    assert len(tensorboard_events(tmp / "tb" / "pretrain" / "version_0").Scalars("val/knn_acc1")) == 1
    assert len(tensorboard_events(tmp / "tb" / "finetune" / "version_0").Scalars("val/acc1")) == 1


def test_linprobe__from_pretraining_checkpoint(pretrained):
    tmp, ckpt = pretrained
    result = _run("finetune", _finetune_config(tmp, ckpt, "linprobe"), tmp)
    assert "validation top-1" in result.stdout
    with open(tmp / "runs" / "linprobe" / "version_0" / "metrics.csv") as f:
        assert any(r.get("val/acc1") for r in csv.DictReader(f))


def _knn_data(tmp: Path) -> tuple[str, ...]:
    """The kNN command's data options: the pretraining's image folder, at 16x16, in the main process."""
    return (
        "--data.class_path",
        "mae.data.ImageFolderDataModule",
        "--data.root",
        str(tmp / "data"),
        "--data.img_size",
        "16",
        "--data.num_workers",
        "0",
    )


def test_knn__command_line(pretrained):
    tmp, ckpt = pretrained
    result = run_mae(
        "knn",
        "--checkpoint",
        str(ckpt),
        "-k",
        "3",
        *_knn_data(tmp),
    )
    assert "kNN (k=3, T=0.07) on 6 validation images, block 1 of 1: top-1" in result.stdout


def test_finetuned_checkpoint__loads_back_as_a_backbone(finetuned):
    import torch

    from mae.convert.backbone import load_backbone

    checkpoint = finetuned[3]
    model = load_backbone(checkpoint, global_pool="avg", num_classes=3)
    assert model.load_report.format == "lightning" and model.load_report.missing == []
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    torch.testing.assert_close(model.head.weight, state["vit.head.weight"])


def test_knn__command_line_evaluates_with_the_given_k_and_temperature(pretrained, monkeypatch, capsys):
    """The printed numbers are those of ``knn_evaluate`` with the command line's k and temperature."""
    import mae.cli.knn as knn_command

    calls = []
    evaluate = knn_command.knn_evaluate

    def recorded(encoder, data, k, temperature, device, blocks):
        calls.append((k, temperature, blocks))
        return evaluate(encoder, data, k, temperature, device, blocks=blocks)

    monkeypatch.setattr(knn_command, "knn_evaluate", recorded)
    tmp, ckpt = pretrained
    knn_command.main(
        [
            "--checkpoint",
            str(ckpt),
            "-k",
            "5",
            "--temperature",
            "0.5",
            "--feature-blocks",
            "-1",
            *_knn_data(tmp),
        ]
    )
    assert calls == [(5, 0.5, [-1])] and "kNN (k=5, T=0.5) on 6 validation images, block 1 of 1" in (
        capsys.readouterr().out
    )
