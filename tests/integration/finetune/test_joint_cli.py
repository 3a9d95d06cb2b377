"""``mae finetune --config default_joint`` end to end: a short joint run from a tiny pretraining checkpoint
on the built-in digits with the EMA and the kNN and probe monitors on; then its checkpoint read back as an
MAE (``mae reconstruct``), as the trained classifier (its accuracy recomputed from the file, exported with
``mae export --to timm``) and as an encoder (``mae knn``)."""

import pytest
import torch
from safetensors.torch import load_file

from mae.convert.backbone import load_backbone
from mae.data import DigitsDataModule
from tests.helpers import (
    CPU_TRAINER,
    read_metrics,
    run_mae,
    tiny_pretraining_checkpoint,
    write_image_folder,
)

VAL_BATCHES = 2
DIGITS = ["--data.class_path", "mae.data.DigitsDataModule", "--data.img_size", "32"]
# The monitors on small subsets: every one runs, none holds the run up.
MONITORS = [f"--{m}.{key}={n}" for m in ("knn", "probe") for key, n in (("max_train", 200), ("max_val", 64))]


@pytest.fixture(scope="module")
def joint_run(tmp_path_factory):
    """Two short epochs of the recipe from the tiny 16-px pretraining checkpoint (its decoder included);
    returns (the run folder, its command's output)."""
    tmp = tmp_path_factory.mktemp("joint")
    start = tiny_pretraining_checkpoint(tmp / "pre")
    result = run_mae(
        "finetune",
        "--config",
        "default_joint",
        *CPU_TRAINER,
        "--model.encoder.checkpoint",
        str(start),
        "--model.optim.warmup_epochs",
        "0",
        "--model.joint.reconstruction_weight",
        "0.8",
        "--trainer.max_epochs",
        "2",
        "--trainer.limit_train_batches",
        "3",
        "--trainer.limit_val_batches",
        str(VAL_BATCHES),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(tmp / "runs"),
        "--ema.decay",
        "0.9",
        "--knn.every_n_epochs",
        "1",
        "--knn.k",
        "3",
        "--probe.every_n_epochs",
        "2",
        "--probe.max_epochs",
        "2",
        *MONITORS,
    )
    return tmp, tmp / "runs" / "finetune_default_joint" / "version_0", result


def test_joint_run__logs_both_losses_the_accuracy_the_ema_and_the_monitors(joint_run):
    _, run, result = joint_run
    assert "validation top-1" in result.stdout
    assert "not in the checkpoint (left as initialised): decoder_pos_embed, fc_norm.bias" in result.stderr
    rows = read_metrics(run)
    logged = {key for row in rows for key, value in row.items() if value}
    assert {"train/loss_step", "train/cls_loss_step", "train/mae_loss_step", "train/cls_loss_epoch"} <= logged
    assert {"val/acc1", "val/mae_loss", "val/acc1_ema", "val/knn_acc1", "val/probe_acc1"} <= logged
    last = [row for row in rows if row.get("train/loss_epoch")][-1]
    weighted = 0.2 * float(last["train/cls_loss_epoch"]) + 0.8 * float(last["train/mae_loss_epoch"])
    assert float(last["train/loss_epoch"]) == pytest.approx(weighted, rel=1e-5)


def test_joint_checkpoint__reconstructs_with_its_decoder(joint_run):
    tmp, run, _ = joint_run
    images = write_image_folder(tmp / "images", ["a"], per_class=2)
    out = tmp / "reconstruction.png"
    result = run_mae(
        "reconstruct", str(images), "--checkpoint", str(run / "checkpoints" / "last.ckpt"), "--out", str(out)
    )
    assert out.stat().st_size > 0, result.stdout + result.stderr


def test_joint_checkpoint__is_the_trained_classifier_its_accuracy_the_logged_one(joint_run):
    """The classifier load_backbone reads from the last checkpoint scores the validation batches the run
    scored last exactly as logged; the timm export holds it (its head, no final norm, no decoder)."""
    tmp, run, _ = joint_run
    checkpoint = run / "checkpoints" / "last.ckpt"
    classifier = load_backbone(checkpoint, global_pool="avg", num_classes=10).eval()
    data = DigitsDataModule(img_size=32, batch_size=64, num_workers=0, augmentation="finetune")
    data.setup("validate")
    correct = seen = 0
    with torch.no_grad():
        for index, batch in zip(range(VAL_BATCHES), data.val_dataloader(), strict=False):
            imgs, labels = data.on_after_batch_transfer(batch, index)
            correct += int((classifier(imgs).argmax(dim=1) == labels).sum())
            seen += len(labels)
    logged = [float(row["val/acc1"]) for row in read_metrics(run) if row.get("val/acc1")][-1]
    assert correct / seen == pytest.approx(logged, abs=1e-6)
    run_mae("export", "--checkpoint", str(checkpoint), "--to", "timm", "--out", str(tmp / "timm_export"))
    exported = load_file(tmp / "timm_export" / "model.safetensors")
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    torch.testing.assert_close(exported["head.weight"], saved["vit.head.weight"])
    assert "fc_norm.weight" in exported and "norm.weight" not in exported
    assert not any(key.startswith(("decoder", "mask_token")) for key in exported)


def test_joint_checkpoint__its_encoder_serves_knn(joint_run):
    _, run, _ = joint_run
    checkpoint = run / "checkpoints" / "last.ckpt"
    result = run_mae("knn", "--checkpoint", str(checkpoint), "-k", "3", *DIGITS, "--data.num_workers", "0")
    assert "kNN (k=3, T=0.07) on 360 validation images" in result.stdout


def test_joint_config__out_of_range_weight_refused_before_any_work(joint_run):
    tmp, _, _ = joint_run
    result = run_mae(
        "finetune",
        "--config",
        "default_joint",
        "--model.joint.reconstruction_weight",
        "1.5",
        "--trainer.logger.init_args.save_dir",
        str(tmp / "refused"),
        check=False,
    )
    assert result.returncode == 2
    assert "error: model.joint.reconstruction_weight must be in [0, 1]" in result.stderr
    assert "got 1.5" in result.stderr
    assert not (tmp / "refused").exists()
