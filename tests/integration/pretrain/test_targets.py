"""``mae pretrain --model.target``: the default digits job trains with each target from the command line,
its loss falls, and the reconstruction figures are drawn for pixel targets and skipped, with one note,
for HOG."""

import pytest
import torch

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
