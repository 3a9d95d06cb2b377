"""The anomaly tests' models and tasks, made once a session: a tiny MAE trained on smooth images, a
tiny MAE after 2 steps, and small digit tasks."""

from pathlib import Path

import pytest
import torch

from mae.apps.anomaly.digits import write_digit_anomalies
from tests.helpers import (
    RandomImages,
    make_trainer,
    pretrain_module,
    tiny_pretraining_checkpoint,
)
from tests.unit.apps.anomaly.trees import normalised, smooth_images


@pytest.fixture(scope="session")
def smooth_checkpoint(tmp_path_factory) -> Path:
    """A tiny pixel-target MAE (16 x 16) trained on smooth images (100 steps) until it continues them from
    context."""
    folder = tmp_path_factory.mktemp("smooth_mae")
    data = RandomImages(n=512, batch_size=64)
    data.data.tensors = (normalised(smooth_images(512, seed=1)), torch.zeros(512, dtype=torch.long))
    module = pretrain_module(target="pixel", optim=dict(warmup_epochs=0, lr=2e-3))
    trainer = make_trainer(folder, max_steps=100, limit_val_batches=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # a model this small trains faster on one thread, and far faster on a busy machine
    try:
        trainer.fit(module, datamodule=data)
    finally:
        torch.set_num_threads(threads)
    trainer.save_checkpoint(folder / "last.ckpt")
    return folder / "last.ckpt"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny MAE after 2 steps: for the command's handling of its inputs, not for the quality of its
    scores."""
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("tiny_mae"))


@pytest.fixture(scope="session")
def task(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny pretraining checkpoint (16 x 16, depth 1) and a small digit task (10 normal, 8 test)."""
    root = tmp_path_factory.mktemp("features")
    checkpoint = tiny_pretraining_checkpoint(root / "mae")
    return checkpoint, write_digit_anomalies(root / "digits", seed=0, num_normal=10, num_test=8)


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> Path:
    """Two small digit tasks (12 normal, 8 test digits each): ``task`` and ``val`` (another seed)."""
    root = tmp_path_factory.mktemp("digits")
    write_digit_anomalies(root / "task", seed=0, num_normal=12, num_test=8)
    write_digit_anomalies(root / "val", seed=1, num_normal=4, num_test=8)
    return root
