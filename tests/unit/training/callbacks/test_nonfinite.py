"""Non-finite gradients and fp16 at the trainer's depth: a non-finite gradient is captured without a loss
scaler and left to it (and kept out of the run-health median) with one; fp16 clipping and the fused AdamW;
a planted NaN in a fine-tuning module. (``RunHealth`` on its own: ``test_health.py``.)"""

import json

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins import MixedPrecision

from mae.cli.replay import training_modules
from mae.errors import ConfigError
from mae.training.callbacks import NonFiniteCapture, RunHealth
from mae.training.callbacks.nonfinite import NonFiniteError
from mae.training.replay import replay_capture
from tests.helpers import (
    LabelledImages,
    RandomImages,
    finetune_module,
    make_trainer,
    pretrain_module,
    read_metrics,
)
from tests.integration.pretrain.test_nonfinite_capture import PlantNaN
from tests.integration.pretrain.test_run_health import ScaleGradients


def fp16() -> MixedPrecision:
    """fp16 autocast with torch's GradScaler on the CPU."""
    return MixedPrecision("16-mixed", "cpu")


def test_nonfinite_gradient__with_a_finite_loss_is_captured_before_the_step(tmp_path):
    trainer = make_trainer(
        tmp_path,
        max_steps=3,
        limit_val_batches=0,
        callbacks=[ScaleGradients(1, float("nan")), NonFiniteCapture()],
    )
    module = pretrain_module(optim=dict(warmup_epochs=0))
    with pytest.raises(
        NonFiniteError, match=r"non-finite gradient at step 1 \(epoch 0\): every module's output"
    ):
        trainer.fit(module, datamodule=RandomImages())
    folder = tmp_path / "nonfinite" / "step_1"
    record = json.loads((folder / "step.json").read_text())
    assert record["reason"] == "gradient" and "model.cls_token" in record["found"]["parameters"]
    state = torch.load(folder / "state.ckpt", weights_only=False)
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values())  # the step was not applied
    finding, _ = replay_capture(
        folder, training_modules()
    )  # forward and backward: the gradients were made NaN after it
    assert finding.module is None and not finding.parameters and not finding.loss


def test_nonfinite_gradient__under_a_grad_scaler_is_its_skipped_step_not_a_capture(tmp_path):
    health = RunHealth()
    trainer = make_trainer(
        tmp_path,
        max_steps=3,
        limit_val_batches=0,
        plugins=[fp16()],
        callbacks=[ScaleGradients(1, float("inf")), NonFiniteCapture(), health],
        logger=CSVLogger(tmp_path, name="", version=""),
        log_every_n_steps=1,
    )
    trainer.fit(pretrain_module(optim=dict(warmup_epochs=0)), datamodule=RandomImages())
    assert trainer.global_step == 3 and not (tmp_path / "nonfinite").exists()
    assert trainer.precision_plugin.scaler.get_scale() == 2.0**15  # the scaler skipped step 1
    assert list(health.recent) == [r for r in health.recent if r < float("inf")]  # no inf in the median
    assert len(health.recent) == 2


def test_fp16__clipping_uses_the_plain_adamw_and_refuses_an_explicitly_fused_one(tmp_path):
    trainer = make_trainer(
        tmp_path, max_steps=1, limit_val_batches=0, plugins=[fp16()], gradient_clip_val=1.0
    )
    module = pretrain_module(optim=dict(warmup_epochs=0))
    trainer.fit(module, datamodule=RandomImages())  # Lightning refuses to clip for a fused optimizer
    assert trainer.global_step == 1 and not trainer.optimizers[0].defaults["fused"]
    fused = pretrain_module(optim=dict(warmup_epochs=0), kernels=dict(fused_adamw=True))
    trainer = make_trainer(
        tmp_path, max_steps=1, limit_val_batches=0, plugins=[fp16()], gradient_clip_val=1.0
    )
    with pytest.raises(ConfigError, match=r"model.kernels.fused_adamw: true cannot clip gradients"):
        trainer.fit(fused, datamodule=RandomImages())
    assert trainer.global_step == 0
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=0, plugins=[fp16()])
    trainer.fit(pretrain_module(optim=dict(warmup_epochs=0)), datamodule=RandomImages())
    assert trainer.optimizers[0].defaults["fused"]  # without clipping it stays fused


def test_finetuning__health_metrics_and_a_planted_nan_named_and_replayed(tmp_path):
    """The same callbacks on a fine-tuning module (its network is ``vit``)."""
    planted = "vit.blocks.1.mlp.fc2"
    trainer = make_trainer(
        tmp_path,
        max_steps=3,
        limit_val_batches=0,
        callbacks=[RunHealth(), PlantNaN(2, planted), NonFiniteCapture()],
        logger=CSVLogger(tmp_path, name="", version=""),
        log_every_n_steps=1,
    )
    with pytest.raises(
        NonFiniteError, match=rf"at step 2 \(epoch 0\): the first module .* is {planted} \(Linear\)"
    ):
        trainer.fit(finetune_module(), datamodule=LabelledImages())
    rows = read_metrics(tmp_path)
    assert sum(bool(r.get("train/grad_norm")) for r in rows) == 2
    assert sum(bool(r.get("train/update_ratio")) for r in rows) == 2
    finding, record = replay_capture(tmp_path / "nonfinite" / "step_2", training_modules())
    assert finding.module == planted and record["module_class"] == "mae.training.finetune.MAEFinetuneModule"
