"""``mae pretrain --model.target``: the default digits job trains with each target from the command line,
its loss falls, and the reconstruction figures are drawn for pixel targets and skipped, with one note,
for HOG and teacher features; a features run's checkpoint holds no teacher, and its resume with another
teacher is refused naming both hashes."""

from pathlib import Path

import pytest
import torch

from mae.convert.architecture import mae_record
from mae.models import MaskedAutoencoderViT
from mae.training.teacher import checkpoint_sha256
from tests.helpers import cli_trainer, read_metrics, run_mae, write_config

# The digits are served as RGB: a 4-px patch regresses 2 x 2 cells x 3 channels x 9 bins (HOG) or 4 x 4 x 3
# pixels.
WIDTHS = {"hog": 108, "norm_pix": 48}


@pytest.mark.parametrize("target", sorted(WIDTHS))
def test_pretrain__the_default_job_trains_with_the_target_and_its_loss_falls(target, tmp_path):
    overrides = {
        "model": {"optim": {"warmup_epochs": 0.2}},
        "trainer": cli_trainer(
            tmp_path, "targets", max_epochs=2, limit_train_batches=12, limit_val_batches=1
        ),
        "reconstruction": {"every_n_epochs": 1, "num_images": 2},
        "knn": {"every_n_epochs": 0},
    }
    top = write_config(tmp_path, overrides, "top")
    result = run_mae("pretrain", "--config", "default", "--config", str(top), "--model.target", target)
    run = tmp_path / "runs" / "targets" / "version_0"
    losses = [float(r["train/loss_step"]) for r in read_metrics(run) if r.get("train/loss_step")]
    assert len(losses) == 24 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-4:]) < 0.6 * sum(losses[:4]), losses
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["mae_architecture"]["args"]["target"] == target
    assert checkpoint["state_dict"]["model.decoder_pred.weight"].shape[0] == WIDTHS[target]
    output = result.stdout + result.stderr
    figures = sorted(p.name for p in (run / "reconstructions").glob("*.png"))
    if target == "hog":
        assert output.count("reconstruction figures skipped: model.target hog predicts the HOG") == 1
        assert figures == []
    else:
        assert "reconstruction figures skipped" not in output and figures == [
            "epoch_0001.png",
            "epoch_0002.png",
        ]


def _teacher(path: Path, seed: int) -> Path:
    """Our checkpoint layout of a seeded 2-block MAE of width 24 for 16-px RGB images (the digits job's
    32-px images give it an 8x8 grid: its position embeddings are resampled)."""
    torch.manual_seed(seed)
    model = MaskedAutoencoderViT(
        img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2, decoder_embed_dim=16, decoder_depth=1
    )
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    record = mae_record(model.config)
    torch.save({"state_dict": state, "pytorch-lightning_version": "2.6.6", "mae_architecture": record}, path)
    return path


def test_pretrain__features_trains_without_saving_its_teacher_and_a_resume_with_another_is_refused(tmp_path):
    teacher = _teacher(tmp_path / "teacher.ckpt", seed=0)
    overrides = {
        "model": {"optim": {"warmup_epochs": 0.2}, "target": "features", "teacher": {"block": 0}},
        "trainer": cli_trainer(
            tmp_path, "features", max_epochs=1, limit_train_batches=10, limit_val_batches=1
        ),
        "reconstruction": {"every_n_epochs": 1, "num_images": 2},
        "knn": {"every_n_epochs": 0},
    }
    top = write_config(tmp_path, overrides, "top")
    flags = ("--config", "default", "--config", str(top), "--model.teacher.checkpoint", str(teacher))
    result = run_mae("pretrain", *flags)
    run = tmp_path / "runs" / "features" / "version_0"
    losses = [float(r["train/loss_step"]) for r in read_metrics(run) if r.get("train/loss_step")]
    assert len(losses) == 10 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) < 0.6 * sum(losses[:3]), losses
    last = run / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    teacher_state = torch.load(teacher, map_location="cpu", weights_only=True)["state_dict"]
    saved = checkpoint["state_dict"]
    assert not any(k.startswith("model.target") or "teacher" in k for k in saved)
    assert all(
        saved["model.decoder_pred.weight"].shape[0] == 24 for _ in [0]
    )  # D_target = the teacher's width
    assert not any(
        t.shape == v.shape and torch.equal(t, v)
        for t in saved.values()
        for v in teacher_state.values()
        if t.numel() > 24
    )
    options = checkpoint["mae_architecture"]["args"]["target_options"]
    assert options["teacher"]["sha256"] == checkpoint_sha256(teacher) and options["block"] == 0
    output = result.stdout + result.stderr
    assert output.count("reconstruction figures skipped: model.target features predicts") == 1
    assert not list((run / "reconstructions").glob("*.png"))

    old = checkpoint_sha256(teacher)
    _teacher(teacher, seed=1)  # the file now holds other weights
    resumed = run_mae("pretrain", *flags, "--trainer.max_epochs", "2", "--ckpt_path", str(last), check=False)
    assert resumed.returncode == 2, resumed.stderr[-2000:]
    assert (
        f"has sha256 {checkpoint_sha256(teacher)}, but the run being resumed was trained with"
        in resumed.stderr
    )
    assert f"of sha256 {old}" in resumed.stderr
