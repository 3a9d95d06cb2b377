import pickle

import pytest
import torch

from mae.training.checkpointing import AtomicCheckpointIO


def test_atomic_save__replaces_the_file_and_leaves_no_temporary(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    io.save_checkpoint({"step": 2}, path)
    assert torch.load(path, weights_only=True) == {"step": 2}
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]


def test_atomic_save__a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)
    with pytest.raises((pickle.PicklingError, AttributeError)):
        io.save_checkpoint({"step": 2, "bad": lambda: None}, path)  # lambdas cannot be pickled
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
