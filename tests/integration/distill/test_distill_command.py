"""``mae distill`` end to end (forked ``mae`` commands): a student trained from a tiny pretraining
checkpoint, resumed with ``--ckpt_path last`` in its run folder, read by ``load_backbone`` and, exported
with ``mae export --to timm``, by timm's ``local-dir:`` loader with the same outputs; a missing teacher
refused before any work."""

import pytest
import timm
import torch

from mae.cli.command import USAGE_ERROR_EXIT_CODE
from mae.convert.backbone import load_backbone
from tests.helpers import read_metrics, run_mae, tiny_pretraining_checkpoint


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return str(tiny_pretraining_checkpoint(tmp_path_factory.mktemp("distill_teacher")))


def _flags(tmp_path, teacher: str, epochs: int) -> list[str]:
    """The default recipe at 16 px with a small student: two steps an epoch, CSV metrics under tmp_path."""
    return [
        "--config",
        "default",
        "--model.teacher.checkpoint",
        teacher,
        "--model.student_kwargs",
        "{patch_size: 4, embed_dim: 32, depth: 2, num_heads: 2}",
        "--data.init_args.img_size",
        "16",
        "--data.init_args.batch_size",
        "8",
        "--trainer.max_epochs",
        str(epochs),
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.precision",
        "32-true",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
        "--model.optim.warmup_epochs",
        "0",
        "--trainer.log_every_n_steps",
        "1",
    ]


def test_distill__trains_resumes_and_the_student_loads_in_timm(teacher, tmp_path):
    first = run_mae("distill", *_flags(tmp_path, teacher, 1))
    run = tmp_path / "runs" / "distill_default" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    assert "model.teacher: " in first.stdout + first.stderr and last.is_file()
    assert torch.load(last, weights_only=False)["global_step"] == 2

    resumed = run_mae("distill", *_flags(tmp_path, teacher, 2), "--ckpt_path", "last")
    assert f"--ckpt_path last: resuming from {last}" in resumed.stdout + resumed.stderr
    assert not (run.parent / "version_1").exists()
    saved = torch.load(last, weights_only=False)
    assert saved["global_step"] == 4 and saved["hyper_parameters"]["teacher_identity"]["path"] == teacher
    rows = read_metrics(run)
    assert any(r.get("train/loss_qk_step") for r in rows) and any(r.get("val/loss") for r in rows)

    run_mae("export", "--checkpoint", str(last), "--to", "timm", "--out", str(tmp_path / "student"))
    card = (tmp_path / "student" / "README.md").read_text()
    assert f"sha256 `{saved['hyper_parameters']['teacher_identity']['sha256']}`" in card  # the teacher named
    assert "distilled from a frozen teacher's attention relations" in card  # not called an MAE
    assert "pretrained as a Masked Autoencoder" not in card
    exported = timm.create_model(f"local-dir:{tmp_path / 'student'}", pretrained=True).eval()
    student = load_backbone(last).eval()
    imgs = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(
        exported.forward_features(imgs), student.forward_features(imgs), rtol=0, atol=0
    )


def test_distill__a_missing_teacher_is_refused_before_any_work(tmp_path):
    result = run_mae("distill", *_flags(tmp_path, str(tmp_path / "none.ckpt"), 1), check=False)
    assert result.returncode == USAGE_ERROR_EXIT_CODE
    last = result.stderr.strip().splitlines()[-1]
    assert f"model.teacher.checkpoint {tmp_path / 'none.ckpt'} does not exist" in last
    assert not (tmp_path / "runs").exists()
