"""The training-loss guard of the modules' base (``mae.training.base``): a non-finite loss stops the run
before the update, handed first to an enabled ``LossCapture`` callback (the interface the guard knows, in
place of the capture callback itself)."""

import lightning.pytorch as pl
import pytest
import torch

from mae.training.base import LossCapture
from tests.helpers import RandomImages, make_trainer, pretrain_module
from tests.integration.pretrain.test_nonfinite_capture import PlantNaN


class Recording(LossCapture, pl.Callback):
    """A capture that records the steps it is handed and stops the run with its own error."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.steps: list[tuple[int, bool]] = []

    def capture(self, trainer, module, loss=None):
        self.steps.append((trainer.global_step, bool(torch.isfinite(loss))))
        return RuntimeError("kept by the recording capture")


def _fit(tmp_path, capture: Recording) -> pl.Trainer:
    callbacks = [PlantNaN(1, "model.blocks.0.mlp.fc2"), capture]
    trainer = make_trainer(tmp_path, max_steps=3, limit_val_batches=0, callbacks=callbacks)
    trainer.fit(pretrain_module(optim=dict(warmup_epochs=0)), datamodule=RandomImages())
    return trainer


def test_check_finite_loss__hands_a_non_finite_loss_to_the_enabled_capture(tmp_path):
    capture = Recording()
    with pytest.raises(RuntimeError, match="kept by the recording capture"):
        _fit(tmp_path, capture)
    assert capture.steps == [(1, False)]  # at the step of the planted NaN, before its update


def test_check_finite_loss__without_an_enabled_capture_stops_naming_the_step(tmp_path):
    capture = Recording(enabled=False)
    with pytest.raises(FloatingPointError, match=r"non-finite training loss \(nan\) at step 1 \(epoch 0\)"):
        _fit(tmp_path, capture)
    assert capture.steps == []
